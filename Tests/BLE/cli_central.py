#!/usr/bin/env python3
"""`blecontrol` as the BLE central (issue 15): the CLI on hci1 drives the
board on hci0 through the bus's BlueZ (BlueZoo here, bluetoothd in the VM),
and the board's control socket says what arrived. Prints PASS/FAIL lines
and FIGURE lines (scan-to-connected, write → applied), never asserting a
duration.

Usage: cli_central.py scan|session|single BOARD_NAME BOARD_ADDRESS CONTROL_SOCKET
Environment: BLECONTROL_BIN, BLECONTROL_BLE_CENTRAL_ADAPTER (default hci1),
BLECONTROL_BLE_CLI_SCAN_SECONDS (how long `scan` listens, default 4) and
BLECONTROL_BLE_CLI_FIND_SECONDS (`--timeout`: how long `--ble NAME` looks at the most,
and then connects, default 120: it stops once it has found the board and
learnt its services): bounds on a search, not performance marks;
BLECONTROL_BLE_CLI_SCAN_TRIES (scans before the scan check fails, default 3: a busy
machine may let a scan window pass without a report).
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig  # noqa: E402 - scripts/lib, beside this repository's tests
from rig.board import ControlSocket, percentile  # noqa: E402,F401 - percentile: flood.py takes it from here

CLI = os.environ["BLECONTROL_BIN"]
ADAPTER = os.environ.get("BLECONTROL_BLE_CENTRAL_ADAPTER", "hci1")
SAMPLES = int(os.environ.get("BLECONTROL_BLE_CLI_SAMPLES", "50"))
SCAN_SECONDS = os.environ.get("BLECONTROL_BLE_CLI_SCAN_SECONDS", "4")
FIND_SECONDS = os.environ.get("BLECONTROL_BLE_CLI_FIND_SECONDS", "120")
# A hang guard for one CLI run: finding, then connecting, each within
# --timeout, and the writes.
CLI_GUARD = 2 * int(FIND_SECONDS) + 120


def result(ok, text):
    print(("PASS: " if ok else "FAIL: ") + text, flush=True)


def figure(text):
    print("FIGURE: " + text, flush=True)


class Control(ControlSocket):
    """The board's control socket (rig.board), with a bounded wait."""

    def __init__(self, path):
        super().__init__(path)
        self.path = path

    def request(self, op):
        return super().request(op)[op]

    def until(self, what, condition, tries=6000, cli=None):
        """Polls status until `condition(status)`, at most `tries` times
        0.02 s apart (two minutes and more): bounded by tries, not a clock,
        so a busy machine stretches the wait and only a missing outcome fails.
        With `cli` (the CLI's process), it gives up as soon as the CLI has
        ended, since nothing more will arrive."""
        for _ in range(tries):
            status = self.request("status")
            if condition(status):
                return status
            if cli is not None and cli.poll() is not None:
                raise RuntimeError(f"{what}: not seen, and blecontrol ended (exit {cli.returncode}); status {json.dumps(status)[:400]}")
            rig.progress()
            time.sleep(0.02)
        raise RuntimeError(f"{what}: not seen; status {json.dumps(status)[:400]}")


def scan(name, address, control):
    # Up to BLECONTROL_BLE_CLI_SCAN_TRIES scans (default 1): on btvirt's emulated link
    # under TCG a whole discovery window sometimes passes without one
    # advertising report (bluetoothd's log shows the window, no report), as
    # a scan near a real board can miss it, and so can a busy machine.
    tries = int(os.environ.get("BLECONTROL_BLE_CLI_SCAN_TRIES", "3"))
    for attempt in range(1, tries + 1):
        run = subprocess.run([CLI, "scan", "--adapter", ADAPTER, "--seconds", SCAN_SECONDS], capture_output=True, text=True,
                             timeout=60 + float(SCAN_SECONDS))
        line = next((l for l in run.stdout.splitlines() if name in l), "")
        if run.returncode == 0 and address.lower() in line.lower():
            break
    result(run.returncode == 0 and address.lower() in line.lower(),
           f"blecontrol scan lists {name} at {address} (scan {attempt} of at most {tries}: {line.strip() or run.stdout.strip() or run.stderr.strip()})")
    match = re.search(r"\(after (\d+) ms\)", line)
    if match:
        figure(f"scan: {name} reported {match.group(1)} ms after discovery started")


def session(name, address, control):
    status = Control(control)
    process = subprocess.Popen([CLI, "session", "--ble", name, "--adapter", ADAPTER, "--timeout", FIND_SECONDS, "--verbose"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def send(line):
        process.stdin.write(line + "\n")
        process.stdin.flush()

    try:
        send("enable 0 on")
        send("enable 2 on")
        send("sync")
        # Finding and connecting come first, each within --timeout: this
        # wait outlasts both, and ends early if the CLI gives up.
        status.until("channel 2 enabled", lambda s: s["channels"][2]["enabled"], tries=50 * CLI_GUARD, cli=process)
        result(True, "session: ANALOG_OUT_EN over BLE reached the board (one connection)")
        # Write → applied: each SERVO_VAL written without response, as the
        # app's sliders, timed until the board's poll shows the pulse (polled
        # back to back at first, for the figure; then as `until` does, so a
        # busy machine only stretches the wait).
        samples = []
        for index in range(SAMPLES):
            value = 100 + (index % 2) * 700
            t0 = time.monotonic()
            send(f"servo 2 {value}")
            for attempt in range(1000 + 6000):
                pulses = status.request("poll")["pulses_us"]
                if abs(pulses[2] - (1000 + value)) < 5:
                    break
                if attempt >= 1000:
                    time.sleep(0.02)
            else:
                raise RuntimeError(f"servo 2 {value}: pulse {pulses[2]}, never {1000 + value}")
            samples.append((time.monotonic() - t0) * 1e3)
        figure(f"write → applied (blecontrol session, without response, {len(samples)} samples): "
               f"p50 {percentile(samples, 0.5):.1f} ms, p99 {percentile(samples, 0.99):.1f} ms")
        result(True, f"session: {len(samples)} SERVO_VAL writes without response each reached the board")
        send("lcd 0 Hello  BLE")
        send("switch 1 on")
        send("servo 0 700")
        send("send 09 00")
        send("sync")
        status.until("the LCD, the switch and channel 0",
                     lambda s: s["lcd"]["lines"][0].startswith("Hello  BLE") and s["switches"][1]["on"]
                     and abs(s["channels"][0]["pulse_us"] - 1700) < 5)
        result(True, "session: LCD_TEXT (spaces kept), SWITCH_VAL and SERVO_VAL over BLE reached the board")
        # End of input: the session sends nothing more and disconnects.
        out, err = process.communicate(timeout=CLI_GUARD)
    except Exception as error:  # noqa: BLE001 - every failure is a FAIL line
        process.kill()
        process.wait()
        result(False, f"session: {error} (stderr: {process.stderr.read().strip()[-300:]})")
        return
    result("board replied ERROR for command 9" in out, f"session: the ERROR notification for 09 00 printed ({out.strip()!r})")
    result(process.returncode == 1, f"session: exit status 1 after an ERROR (got {process.returncode})")
    match = re.search(r"found .* in (\d+) ms, connected and subscribed in (\d+) ms", err)
    if match:
        figure(f"find {match.group(1)} ms, connect + services + notifications {match.group(2)} ms")
    else:
        result(False, f"session --verbose said how long connecting took ({err.strip()!r})")


def single(name, address, control):
    run = subprocess.run([CLI, "send", "09", "00", "--ble", address, "--adapter", ADAPTER, "--timeout", FIND_SECONDS, "--sync"],
                         capture_output=True, text=True, timeout=CLI_GUARD)
    result(run.returncode == 1 and "board replied ERROR for command 9" in run.stdout,
           f"blecontrol send 09 00 --ble ADDRESS --sync: ERROR printed, exit 1 (exit {run.returncode}: {run.stdout.strip()!r} {run.stderr.strip()!r})")
    missing = subprocess.run([CLI, "init", "--ble", "no-such-board", "--adapter", ADAPTER, "--timeout", "3"], capture_output=True, text=True, timeout=120)
    result(missing.returncode == 1 and "no-such-board" in missing.stderr,
           f"a board that is not there: a clear message, exit 1 ({missing.returncode}: {missing.stderr.strip()!r})")


if __name__ == "__main__":
    phase, board_name, board_address, control_socket = sys.argv[1:5]
    {"scan": scan, "session": session, "single": single}[phase](board_name, board_address, control_socket)
