"""The board as every rig sees it: its control socket, its status report and
the protocol's frames. Standard library only (the rigs run on a bare Debian
and inside guests without a virtual environment).

One copy for Tests/BLE, Tests/VM and Tests/Web, so that a change of the
control protocol, the status report or the frames is made once. The frame
encoders are checked against the Swift FrameEncoder through the same table
(Tests/BLEControlProtocolTests/Fixtures/frames.json): FrameVectorTests reads
it in Swift, `python3 scripts/lib/rig/board.py` here.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
from pathlib import Path

# --- The control socket --------------------------------------------------------


class ControlSocket:
    """The daemon's control socket spoken directly: one JSON object per line
    each way (docs/protocol.md, "Control socket"). One connection for many
    requests; the daemon closes one that sends no request within 10 s."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = b""

    def request(self, op: str, **fields) -> dict:
        """The reply to `op` (with `fields`), raising on `"ok": false`."""
        self.sock.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("control socket closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"control socket: {op}: {reply.get('error')}")
        return reply

    def status(self) -> dict:
        return self.request("status")["status"]

    def poll(self) -> dict:
        """The cheap snapshot: frames and every configured channel's pulse,
        in channel order (what a latency sample needs, without a status)."""
        return self.request("poll")["poll"]

    def close(self) -> None:
        self.sock.close()


def socket_status(path: str) -> dict:
    """The status report read from the control socket at `path` on a
    connection of its own: the report `blecontrol status --json` prints,
    without a process per poll (one costs about a second under TCG)."""
    control = ControlSocket(path)
    try:
        return control.status()
    finally:
        control.close()


def cli_status(cli: str, socket_path: str | None = None) -> dict:
    """The status as `blecontrol status --json` prints it (what an operator
    sees). The timeout only ends a hang."""
    command = [cli, "status", "--json"] + (["--socket", socket_path] if socket_path else [])
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError("blecontrol status failed: " + out.stderr.strip())
    return json.loads(out.stdout)


# --- The status report ---------------------------------------------------------


def channel(report: dict, number: int) -> dict:
    """One channel's entry of a status report ({} when it has none)."""
    return next((c for c in report.get("channels", []) if c.get("channel") == number), {})


def ble_sessions(report: dict) -> list:
    return [s for s in report.get("sessions", []) if s.get("transport") == "ble"]


def ble_state(report: dict) -> str:
    return report.get("transports", {}).get("ble", "")


# --- Frames (docs/protocol.md) -------------------------------------------------


def init_frame() -> bytes:
    return bytes([0x00, 0x00])


def enable_frame(channel: int, on: bool = True) -> bytes:
    return bytes([0x01, 0x02, channel, 1 if on else 0])


def servo_frame(channel: int, value: int) -> bytes:
    return bytes([0x02, 0x03, channel, (value >> 8) & 0xFF, value & 0xFF])


def pwm_frame(channel: int, value: int) -> bytes:
    return bytes([0x03, 0x03, channel, (value >> 8) & 0xFF, value & 0xFF])


def lcd_text_frame(line: int, text: bytes) -> bytes:
    """LCD_TEXT as the original library writes it: length = text + 2 (the
    line and the terminating NUL)."""
    return bytes([0x04, len(text) + 2, line]) + text + b"\x00"


def lcd_clear_frame() -> bytes:
    return bytes([0x05, 0x00])


def switch_frame(index: int, on: bool) -> bytes:
    return bytes([0x06, 0x02, index, 1 if on else 0])


# --- Waiting ---------------------------------------------------------------------


async def wait_for(predicate, tries: int = 1200, interval: float = 0.1, each_try=None):
    """Polls `predicate` until it gives something true, at most `tries`
    times `interval` apart (two minutes and more by default), and once more
    at the end. Bounded by tries, not a clock: a busy machine stretches the
    wait, and only an outcome that never comes fails a check. A predicate
    that raises counts as not yet. `each_try` runs after every try (the VM's
    progress marks). The predicate's value, or None."""
    for _ in range(tries):
        try:
            value = predicate()
            if value:
                return value
        except Exception:  # noqa: BLE001 - a status not there yet
            pass
        if each_try is not None:
            each_try()
        await asyncio.sleep(interval)
    try:
        return predicate() or None
    except Exception:  # noqa: BLE001
        return None


# --- Figures --------------------------------------------------------------------


def percentile(values, q: float) -> float:
    """The nearest-rank percentile (q in 0…1): the smallest value with at
    least q of the values at or below it; NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


# --- The shared table, checked -------------------------------------------------

VECTORS = Path(__file__).resolve().parents[3] / "Tests/BLEControlProtocolTests/Fixtures/frames.json"


def encode(message: dict) -> bytes:
    """A message of the shared table, by this module's encoders."""
    kind = message["message"]
    if kind == "init":
        return init_frame()
    if kind == "enable":
        return enable_frame(message["channel"], message["on"])
    if kind == "servo":
        return servo_frame(message["channel"], message["value"])
    if kind == "pwm":
        return pwm_frame(message["channel"], message["value"])
    if kind == "lcd_text":
        return lcd_text_frame(message["line"], message["text"].encode())
    if kind == "lcd_clear":
        return lcd_clear_frame()
    if kind == "switch":
        return switch_frame(message["index"], message["on"])
    raise ValueError(f"unknown message {kind}")


def check_vectors() -> int:
    """Every row of the shared table encodes to its bytes; the count."""
    rows = json.loads(VECTORS.read_text())
    for row in rows:
        got = encode(row).hex()
        if got != row["hex"]:
            raise AssertionError(f"{row}: the rigs' encoder gives {got}")
    return len(rows)


if __name__ == "__main__":
    try:
        print(f"rig.board: the rigs' frame encoders agree with {VECTORS.name}: {check_vectors()} frames")
    except (AssertionError, ValueError, KeyError) as error:
        print(f"rig.board: FAIL: {error}", file=sys.stderr)
        sys.exit(1)
