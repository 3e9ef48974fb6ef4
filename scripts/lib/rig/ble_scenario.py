"""The BLE scenario, written once for every central stack.

The BLE tier drives the daemon with Bleak through BlueZoo (Tests/BLE/central.py)
and the VM tier with Bumble through the real bluetoothd and btvirt
(Tests/VM/ble_central.py). What a central does and what the board must show
for it is the same there, so it is written here, against two small
interfaces that each stack's script implements:

- a *central* (one controller of one stack): `label`, `await find()` (the
  board's advertisement: a dict with "name" and "services", a set of 16-bit
  UUIDs; None when it is not seen), `await connect(found)` (a *link*, or None
  when FFE1 inside FFE0 never showed up);
- a *link* (one connection, FFE1 subscribed): `notifications` (a list of the
  values notified, appended as they come), `properties` (FFE1's, as names:
  "write", "write-without-response", "notify"), `address` (the central's own
  address, as the daemon names it in a failsafe's reason), `await
  write(data, response)` and `await close()`.

The checks' outcome goes through a `Checks` (the tier's own way of printing a
PASS/FAIL line, its status reader and its bounded wait), so a check's id and
text read the same in both tiers' logs. Standard library only.
"""

from __future__ import annotations

import asyncio

from .board import ble_sessions, ble_state, channel, enable_frame, init_frame, lcd_text_frame, pwm_frame, servo_frame

UNKNOWN = bytes([0x09, 0x00])
ERROR_UNKNOWN = bytes([0xFF, 0x01, 0x09])


class Checks:
    """How a tier records a check, reads the board and waits.

    `record(ok, ident, what, why="")` prints the check and returns ok;
    `status()` is the board's status report; `wait_for(predicate)` is the
    predicate's first true value, or None after a bounded number of tries
    (never a clock: a busy host stretches a wait, it does not fail it)."""

    def __init__(self, record, status, wait_for) -> None:
        self.record = record
        self.status = status
        self.wait_for = wait_for

    def failsafe(self):
        return self.status()["servo"].get("failsafe")

    def explained(self, detail) -> dict:
        """A FAIL's detail with what else can hold an output where it is
        (a failsafe that engaged, with its reason; the centrals still
        connected), so one failed run says which it was."""
        report = self.status()
        # The detail last: a long one is cut when printed.
        return {"failsafe": report["servo"].get("failsafe"), "failsafes": report["servo"].get("failsafes"),
                "sessions": ble_sessions(report), "detail": detail}

    async def pulse_at(self, number: int, pulse_us: float) -> bool:
        """Channel `number` at `pulse_us` within 5 µs: 12-bit PCA9685 counts
        at 50 Hz are about 4.9 µs apart."""
        return await self.wait_for(lambda: abs(channel(self.status(), number).get("pulse_us", 0) - pulse_us) < 5) is not None

    async def duty_at(self, number: int, duty: float) -> bool:
        return await self.wait_for(lambda: abs(channel(self.status(), number).get("duty", -1) - duty) < 0.001) is not None

    async def lcd_line_starts(self, line: int, text: str) -> bool:
        return await self.wait_for(lambda: self.status()["lcd"]["lines"][line].startswith(text)) is not None

    async def sessions(self, count: int) -> bool:
        return await self.wait_for(lambda: len(ble_sessions(self.status())) == count) is not None

    async def status_when(self, predicate) -> dict:
        """The first status report `predicate` accepts, polled as `wait_for`
        polls; when none did, the last one read, so the check records what
        was there. The caller judges the report it gets with `predicate`."""
        last = []

        def attempt():
            last[:] = [self.status()]
            return last[0] if predicate(last[0]) else None
        found = await self.wait_for(attempt)
        return found if found is not None else last[0] if last else self.status()


def device_name(address: str) -> str:
    """How the daemon names a central in a failsafe's reason."""
    return "dev_" + (address or "?").replace(":", "_").upper()


async def scenario(checks: Checks, central, name: str, connected=None) -> "dict | None":
    """What the original iOS library does, on one connection: scan by name,
    connect, discover FFE1 inside FFE0, subscribe; enable and drive a servo and
    a PWM channel (enable with response, values without, as the library
    writes them), LCD text with response; an unknown command draws an ERROR
    notification; the disconnect ends the session and the failsafe engages.

    `connected(link)`, when given, runs the stack's own checks while the link
    is up and returns how many valid frames it sent. Returns the advertisement found
    (None when the scenario could not get that far)."""
    record = checks.record
    report = await checks.status_when(lambda r: "advertising" in ble_state(r))
    if not record("advertising" in ble_state(report), "v1", "the daemon registered its GATT application and advertisement",
                  ble_state(report)):
        return None
    found = await central.find()
    if not record(found is not None and found["name"] == name, "v2", "%s finds the board by its name '%s'" % (central.label, name),
                  found and found["name"]):
        return None
    record(0xFFE0 in found["services"], "v3", "the advertisement lists service FFE0", sorted(found["services"]))
    link = await central.connect(found)
    if not record(link is not None, "v4", "%s connects, finds FFE1 inside FFE0 and subscribes" % central.label):
        return None
    try:
        record({"write", "write-without-response", "notify"} <= link.properties, "v5",
               "FFE1 is write, write-without-response, notify", sorted(link.properties))
        # The original library: ANALOG_OUT_EN with response, SERVO_VAL and
        # PWM_VAL without, LCD_TEXT with.
        await link.write(enable_frame(0), True)
        await link.write(servo_frame(0, 500), False)  # 500 -> 1500 µs
        await link.write(enable_frame(6), True)
        await link.write(pwm_frame(6, 500), False)  # 500 -> 50 %
        # Whether the answer waited for the text is the acknowledgement
        # phases' question (with an acquired socket bluetoothd answers at
        # once); here the text only has to arrive.
        await link.write(lcd_text_frame(0, b"Hello"), True)
        sent = 5
        record(await checks.lcd_line_starts(0, "Hello"), "v6", "LCD_TEXT 04 07 00 'Hello' 00 with response -> the LCD shows Hello",
               checks.status()["lcd"]["lines"])
        record(await checks.pulse_at(0, 1500), "v7", "enable 01 02 00 01 (with response) + SERVO_VAL 02 03 00 01 F4 (without) "
               "-> channel 0 at 1500 µs", checks.explained(channel(checks.status(), 0)))
        record(await checks.duty_at(6, 0.5), "v8", "enable 01 02 06 01 + PWM_VAL 03 03 06 01 F4 (without) -> channel 6 at 50 %",
               checks.explained(channel(checks.status(), 6)))
        if connected is not None:
            sent += await connected(link)
        await link.write(UNKNOWN, True)  # an ERROR, not a frame: not counted
        ok = await checks.wait_for(lambda: ERROR_UNKNOWN in link.notifications)
        record(ok is not None, "v9", "unknown command 09 00 -> notification FF 01 09", [n.hex() for n in link.notifications])
        report = checks.status()
        sessions = ble_sessions(report)
        record(len(sessions) == 1 and sessions[0].get("frames", 0) >= sent, "v10",
               "one BLE session with its %d frames counted" % sent, sessions)
        record(report["servo"].get("failsafe") is None, "v11", "no failsafe while connected", report["servo"].get("failsafe"))
    finally:
        await link.close()
    record(await checks.sessions(0), "v12", "disconnect -> the BLE session ended", ble_sessions(checks.status()))
    failsafe = checks.failsafe()
    record(failsafe is not None and failsafe.startswith("central left: ble"), "v13",
           "the central in control left -> failsafe engaged (%s)" % failsafe, failsafe)
    return found


async def pwm_4_at_half(checks: Checks, link, ident: str, who: str) -> bool:
    """`who` enables PWM channel 4 and sets it to 50 % in one write with response."""
    await link.write(enable_frame(4) + pwm_frame(4, 500), True)
    return checks.record(await checks.duty_at(4, 0.5), ident,
                         "%s: enable 01 02 04 01 + PWM_VAL 03 03 04 01 F4 -> channel 4 at 50 %%" % who, checks.explained(channel(checks.status(), 4)))


async def commander_left(checks: Checks, address: str, idents: "tuple[str, str]", why: str) -> None:
    """Once the commander's link is gone: the failsafe engages, naming it and
    channel 4, and channel 4 is off."""
    failsafe = await checks.wait_for(checks.failsafe)
    device = device_name(address)
    checks.record(failsafe is not None and failsafe.startswith("central left: ble") and device in failsafe and "channel 4" in failsafe,
                  idents[0], "%s -> failsafe engaged, naming the commander (%s) and channel 4 (%s)" % (why, device, failsafe), failsafe)
    ok = await checks.wait_for(lambda: channel(checks.status(), 4).get("duty") == 0)
    checks.record(ok is not None, idents[1], "%s -> channel 4 at duty 0" % why, channel(checks.status(), 4))


async def two_centrals(checks: Checks, commander, observer) -> None:
    """Two phones (issue 28): the failsafe follows the central in control
    (docs/protocol.md, "Failsafe"). The observer connects, subscribes and
    sends INIT and LCD text only; the commander connects while it stays,
    runs PWM 4 at 50 % and leaves. The failsafe engages though the observer
    is still connected, naming the commander; the observer's first command
    ends it and applies."""
    record = checks.record
    await checks.wait_for(lambda: "advertising" in ble_state(checks.status()))
    found = await observer.find()
    watching = await observer.connect(found) if found is not None else None
    if not record(watching is not None, "m2", "the observer (%s) finds the board, connects, subscribes to FFE1" % observer.label):
        return
    try:
        # Bounded: a write whose answer never comes is a FAIL with the
        # board's state, not a rig that hangs.
        try:
            await asyncio.wait_for(watching.write(init_frame() + lcd_text_frame(0, b"watching"), True), 120)
        except asyncio.TimeoutError:
            report = checks.status()
            record(False, "m3", "the observer's INIT + LCD_TEXT with response was answered", {
                "lcd": report.get("lcd"), "failsafe": report["servo"].get("failsafe"), "sessions": ble_sessions(report)})
            return
        record(await checks.lcd_line_starts(0, "watching"), "m3", "the observer sends INIT and LCD_TEXT only -> the LCD shows 'watching'",
               checks.status()["lcd"]["lines"])
        # Advertising goes on while one central is connected, or no second phone could join.
        found = await commander.find()
        commanding = await commander.connect(found) if found is not None else None
        if not record(commanding is not None, "m4", "while the observer stays, the commander (%s) finds the board, connects, subscribes"
                      % commander.label, ble_sessions(checks.status())):
            return
        try:
            if not await pwm_4_at_half(checks, commanding, "m5", "the commander"):
                return
            record(len(ble_sessions(checks.status())) == 2, "m5b", "two BLE sessions", ble_sessions(checks.status()))
        finally:
            await commanding.close()
        record(await checks.sessions(1), "m6", "the commander disconnects; the observer's session stays", ble_sessions(checks.status()))
        await commander_left(checks, commanding.address, ("m7", "m8"), "the commander left while the observer stays connected")
        await watching.write(pwm_frame(4, 250), True)  # 250 -> 25 %
        ended = await checks.wait_for(lambda: checks.failsafe() is None)
        applied = await checks.duty_at(4, 0.25)
        record(ended is not None and applied, "m9", "the observer's first command (PWM_VAL 4 = 250) ends the failsafe and applies: "
               "channel 4 at 25 %", checks.explained(channel(checks.status(), 4)))
        # An ERROR is sent when its frame is decoded, and travels through
        # bluetoothd: one still on its way would be missed by a look now.
        # The ERROR a deliberately unknown command draws comes after any
        # earlier one on the same link, so wait for it, then look.
        await watching.write(UNKNOWN, True)
        barrier = await checks.wait_for(lambda: ERROR_UNKNOWN in watching.notifications)
        errors = [n for n in watching.notifications if n.startswith(bytes([0xFF]))]
        record(barrier is not None and errors == [ERROR_UNKNOWN], "m10",
               "no ERROR notification to the observer (the one an unknown command draws came alone)", [n.hex() for n in watching.notifications])
    finally:
        await watching.close()


__all__ = ["Checks", "scenario", "two_centrals", "pwm_4_at_half", "commander_left", "device_name", "UNKNOWN", "ERROR_UNKNOWN"]
