#!/usr/bin/env python3
"""The README's first steps, run as written against the tier's daemon: each
`$B/blecontrol …` line of its simulator walkthrough, then `blecontrol web`
and the page's way in (the bridge, with the token from the address it
prints). Prints PASS/FAIL lines; exit status 1 on any failure.

Usage: readme_walkthrough.py README   (BLECONTROL_BIN, BLECONTROL_SOCKET set)
Two lines are not run to their end: `watch` (a live view until Ctrl-C) runs
for a few seconds, and `web` listens on a free port instead of 8000 (the
machine's port 8000 may be anyone's)."""
import json
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from bridge_client import Bridge  # noqa: E402

CLI = os.environ["BLECONTROL_BIN"]
failures = 0


def check(ok, what, detail=""):
    global failures
    print(("PASS" if ok else "FAIL") + ": " + what + ("" if ok or detail == "" else " (" + str(detail)[:400] + ")"), flush=True)
    if not ok:
        failures += 1


def status():
    return json.loads(subprocess.run([CLI, "status", "--json"], capture_output=True, text=True, timeout=60).stdout)


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    lines = re.findall(r"^\$B/blecontrol (.*?)\s+#", text, re.M)
    check(len(lines) >= 10, "the README's walkthrough has its blecontrol lines", lines)
    for line in lines:
        arguments = shlex.split(line)
        if arguments[0] == "watch":
            try:
                out = subprocess.run([CLI] + arguments, capture_output=True, text=True, timeout=3).stdout
            except subprocess.TimeoutExpired as stopped:
                out = (stopped.stdout or b"").decode(errors="replace") if isinstance(stopped.stdout, bytes) else (stopped.stdout or "")
            check("Hello" in out, "README: blecontrol %s shows the LCD's Hello (a live view, stopped after 3 s)" % line, out[-200:])
            continue
        if arguments[0] == "web":
            check_cli_outcome()
            web = subprocess.Popen([CLI] + arguments + ["--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
            try:
                address = None
                for output in web.stdout:
                    match = re.search(r"open (http://127\.0\.0\.1:(\d+)/\?token=([0-9a-f]+))$", output.strip())
                    if match:
                        address = match
                        break
                check(address is not None, "README: blecontrol web prints the address to open, with the token")
                if address:
                    page = Bridge(int(address.group(2)), address.group(3))
                    replies, answer = page.write(bytes.fromhex("0102020102030201F4"))
                    page.close()
                    report = status()
                    ch2 = next(c for c in report["channels"] if c["channel"] == 2)
                    check(answer == {"applied": True} and abs(ch2["pulse_us"] - 1500) < 5,
                          "README: through that address the page's way in (the bridge) drives channel 2 to 1500 µs", (answer, ch2))
            finally:
                web.terminate()
                web.wait(timeout=30)
            continue
        run = subprocess.run([CLI] + arguments, capture_output=True, text=True, timeout=60)
        if arguments[:1] == ["send"] and arguments[1:] == ["09", "00"]:
            check(run.returncode == 1 and "ERROR" in run.stdout + run.stderr, "README: blecontrol %s prints the ERROR reply" % line,
                  (run.returncode, run.stdout, run.stderr))
        else:
            check(run.returncode == 0, "README: blecontrol %s exits 0" % line, (run.returncode, run.stdout[-200:], run.stderr[-200:]))
    return 1 if failures else 0


def check_cli_outcome():
    """What the CLI lines did, before the page's way in (whose central, once
    it leaves, engages the failsafe)."""
    report = status()
    ch0 = next(c for c in report["channels"] if c["channel"] == 0)
    check(ch0["enabled"] and abs(ch0["pulse_us"] - 1750) < 5 and report["lcd"]["lines"][0].startswith("Hello")
          and report["switches"][1]["on"], "after the CLI lines: channel 0 at 1750 µs, Hello on the LCD, switch 1 on",
          (ch0, report["lcd"]["lines"], report["switches"]))


if __name__ == "__main__":
    sys.exit(main())
