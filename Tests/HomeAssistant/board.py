"""The tier's board file: board/simulator.yaml with the names of
expected.TIER_BOARD added, BLE off (the tier has no Bluetooth; the daemon
would only say so), and a transports.mqtt section for the tier's broker.
Each edit must apply exactly once: a board/simulator.yaml that changed
shape stops the tier with a clear reason instead of testing another
board."""

from __future__ import annotations

import re
from pathlib import Path

import expected

NEW_KEYS = ("name", "line_names", "configuration_url")
"""The board-file keys the tier relies on that an older daemon refuses
("unknown key"): without them the rest of the tier still runs."""


class BoardFileError(Exception):
    pass


def edit(text: str, pattern: str, replacement: str, what: str) -> str:
    changed, count = re.subn(pattern, replacement, text, flags=re.M)
    if count != 1:
        raise BoardFileError(f"board/simulator.yaml: {what}: expected one match of {pattern!r}, found {count}")
    return changed


def quoted(name: str) -> str:
    """A YAML flow scalar: quoted when it has anything but plain words."""
    return name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 _-]*", name) else '"' + name.replace('"', '\\"') + '"'


def board_file(source: Path, *, broker_port: int, password_file: Path, names: bool = True,
               board: expected.Board = expected.TIER_BOARD, without_channel: "int | None" = None) -> str:
    text = source.read_text()
    for channel in board.channels:
        if channel.name and names:
            text = edit(text, rf"^(    - \{{ channel: {channel.channel},.*?) \}}$",
                        rf"\1, name: {quoted(channel.name)} }}", f"channel {channel.channel}")
    for switch in board.switches:
        if switch.name and names:
            text = edit(text, rf"^(  - \{{ switch: {switch.switch},.*?) \}}$",
                        rf"\1, name: {quoted(switch.name)} }}", f"switch {switch.switch}")
    if board.lcd and board.lcd.line_names and names:
        line_names = ", ".join(quoted(name) for name in board.lcd.line_names)
        text = edit(text, r"^(  rows: [0-9]+)$", rf"\1\n  line_names: [{line_names}]", "lcd rows")
    if without_channel is not None:
        text = edit(text, rf"^    - \{{ channel: {without_channel},.*\n", "", f"channel {without_channel}")
    text = edit(text, r"^(ble:\n  enabled:) true$", r"\1 false", "ble.enabled")
    mqtt = (f"  mqtt:\n    broker: 127.0.0.1:{broker_port}\n    username: board\n"
            f"    password_file: {password_file}\n")
    if names:
        mqtt += f"    configuration_url: {expected.CONFIGURATION_URL}\n"
    return edit(text, r"^transports:\n", "transports:\n" + mqtt, "transports")


def refused_new_keys(log: str) -> list[str]:
    """The daemon's "unknown key" refusals when every one is of a key in
    NEW_KEYS (then an older daemon is running: the tier goes on without
    them); empty when it refused something else too, or nothing."""
    refusals = [line for line in log.splitlines() if ": unknown key" in line]
    if refusals and all(re.search(rf"\.({'|'.join(NEW_KEYS)}): unknown key", line) for line in refusals):
        return refusals
    return []
