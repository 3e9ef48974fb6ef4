"""What the phone-like central does to a link, for the VM tier (issue 19):
the link lost mid-stream and the app coming back from a new private address
(`reconnect` phase), and pairing with `ble.security: authenticated`
(`pair` phase): the passkey typed from the board's LCD, the bond kept across
a daemon restart, a bluetoothd restart and board reloads, the board's GATT
handles cached by the phone, `ble.allow` by the phone's identity address,
a wrong passkey, and `blecontrol forget-bonds`.

Run by ble_central.py (`central` is that module: record, status,
connect, ...), on the same Bumble device and the same iPhone-like GATT
server (phone.py) as the `phone` phase.

How a lost link is made: the phone's controller sends HCI Disconnect with
reason 0x08 (Connection Timeout). btvirt's controllers hand the reason to
the other side (emulator/btdev.c, cmd_disconnect_complete), so the board's
kernel and bluetoothd see exactly what a supervision timeout gives them, a
Disconnection Complete with reason 0x08, and no LL_TERMINATE_IND. On the
air that event comes the supervision timeout after the last packet (iOS
asks for 2 to 6 s; here it comes at once).
"""
import asyncio
import os
import re
import time

from bumble import hci
from bumble.core import UUID, BaseError
from bumble.pairing import PairingConfig, PairingDelegate
from rig.board import enable_frame, pwm_frame, servo_frame, switch_frame  # scripts/lib, on the path ble_central.py set

CONNECTION_TIMEOUT = 0x08  # HCI error code: Connection Timeout (Core 5.3 Vol 1 Part F 1.3)
DATABASE_HASH = UUID.from_16_bits(0x2B2A)


def told(error):
    """An error as a reader wants it: Bumble's protocol errors say their
    code and name only in str() (repr() gives "ProtocolError()")."""
    return str(error) if isinstance(error, BaseError) else repr(error)


def enable_frames():
    return enable_frame(0)


def pulse(central, number):
    return round(central.channel(central.status(), number).get("pulse_us", 0))


def near(us, target):
    """Within one PCA9685 count (4.9 us at 50 Hz)."""
    return abs(us - target) < 5


async def link_loss(device, central, phone):
    """The app streams SERVO_VAL at the phone's connection interval, the link
    times out, the phone comes back from a new private address."""
    address = await phone.rotate_address()
    result = await central.connect(device)
    if not central.record(result is not None, "l1", "iPhone-like central (%s) connects, FFE1 found" % address):
        return
    connection, peer, char, notifications, entry = result
    await peer.request_mtu(185)
    # Whether the board stays on the air while connected (a figure: the
    # kernel takes the advertising set off when a central connects, and
    # puts it back on disconnection, hci_event.c; the HM-10 did the same).
    still = await central.scan(device, 5)
    central.say("FIGURE a 5 s scan while the phone is connected %s the board" % ("finds" if still else "does not find"))
    for ch in range(8):
        await char.write_value(enable_frame(ch), with_response=True)
    await char.write_value(switch_frame(0, True), with_response=False)
    await char.write_value(pwm_frame(4, 500), with_response=False)  # PWM ch4 50 %
    for step in range(40):
        await char.write_value(servo_frame(3, 100 + step * 10), with_response=False)
        await asyncio.sleep(0.015)
    # The last value the stream sent is on the chip before the link goes.
    streamed = await central.wait_for(lambda: near(pulse(central, 3), 1490))
    central.record(streamed, "l2", "streaming SERVO_VAL at 15 ms: the last value applied (ch3 1490 us)", pulse(central, 3))
    await device.disconnect(connection, CONNECTION_TIMEOUT)

    def safe(report):
        # The reason is set at once; the chip's pulses and the switches
        # follow on the servo thread and the loop: wait for all of it.
        return (report["servo"].get("failsafe") is not None and near(round(central.channel(report, 3).get("pulse_us", 0)), 1500)
                and central.channel(report, 4).get("duty", 1) == 0 and not any(s.get("on") for s in report.get("switches", []))
                and not central.ble_sessions(report))
    report = await central.CHECKS.status_when(safe)
    ok = safe(report)
    failsafe = report["servo"].get("failsafe")
    switches = [s.get("on") for s in report.get("switches", [])]
    duty = central.channel(report, 4).get("duty", 0)
    central.record(ok, "l3", "link lost (Disconnection Complete, reason 0x08 Connection Timeout) -> session ended, failsafe engaged (%s): "
                   "ch3 at its failsafe pulse 1500 us, PWM off, switches off" % failsafe,
                   (failsafe, pulse(central, 3), duty, switches, central.ble_sessions(report)))
    # The app comes back from a new private address.
    returning = await phone.rotate_address()
    result = await central.connect(device)
    if not central.record(result is not None, "l4", "the phone returns from a new private address (%s), FFE1 found" % returning):
        return
    connection, peer, char, notifications, entry = result
    still = central.status()["servo"].get("failsafe")
    central.record(still is not None, "l5", "connected again but no frame yet: the failsafe still holds", still)
    await char.write_value(servo_frame(3, 200), with_response=False)
    await char.write_value(enable_frames(), with_response=True)
    cleared = await central.wait_for(lambda: central.status()["servo"].get("failsafe") is None and near(pulse(central, 3), 1200))
    central.record(cleared, "l6", "the returning phone's first frames clear the failsafe (ch3 1200 us)",
                   (central.status()["servo"].get("failsafe"), pulse(central, 3)))
    await central.disconnect(device, connection)
    await central.wait_for(lambda: len(central.ble_sessions(central.status())) == 0)


class Keyboard(PairingDelegate):
    """The phone's side of passkey entry: it types what the board shows
    (the LCD's "PIN nnnnnn" line, read from status), or a wrong number."""

    def __init__(self, central, wrong=False, not_this=None):
        super().__init__(io_capability=PairingDelegate.IoCapability.KEYBOARD_INPUT_ONLY)
        self.central = central
        self.wrong = wrong
        # A passkey an earlier try showed: wait for another.
        self.not_this = not_this
        self.shown = None

    async def get_number(self):
        def shown():
            # The LCD's thread draws a line a character at a time, so a
            # read can catch "PIN " with the old characters still after it
            # (blanks, or the digits of an earlier passkey). A person reads
            # the number once it is drawn: take the line when it shows the
            # passkey the daemon's own status names.
            report = self.central.status()
            named = re.search(r"passkey (\d{6})\b", self.central.ble_state(report))
            for line in report["lcd"]["lines"]:
                if named and line.startswith("PIN ") and line[4:10] == named.group(1) != self.not_this:
                    return line[4:10], report
            return None
        found = await self.central.wait_for(shown, 0.2)
        if not found:
            return None
        self.shown = found
        number = int(found[0])
        return (number + 1) % 1000000 if self.wrong else number


async def pair_typing(device, connection, keyboard):
    """The phone pairs (LE Secure Connections, MITM, bonding, its identity
    address public) and types what `keyboard` types; the error if it
    failed, else None."""
    device.pairing_config_factory = lambda _: PairingConfig(sc=True, mitm=True, bonding=True, delegate=keyboard,
                                                            identity_address_type=PairingConfig.AddressType.PUBLIC)
    try:
        await asyncio.wait_for(connection.pair(), 60)
    except (Exception, asyncio.CancelledError) as error:
        # A link dropped mid-pairing cancels it (Bumble), as in
        # reconnect_bonded: a failed check, not a broken phase.
        return error
    return None


def board_with(base, path, **ble):
    """A copy of the simulator board with some `ble:` keys replaced."""
    lines = []
    for line in open(base):
        key = line.strip().split(":")[0]
        if line.startswith("  ") and not line.startswith("   ") and key in ble:
            line = "  %s: %s\n" % (key, ble[key])
        lines.append(line)
    with open(path, "w") as f:
        f.writelines(lines)
    return path


async def reload_board(central, path, **ble):
    """Rewrites the daemon's board file and sends SIGHUP; waits until the
    reload is applied and the daemon advertises with the new name (each
    reload here gives a new one: the BLE side restarts on its own thread
    after the reload is counted, so only the new name proves the new
    settings are on the air)."""
    board_with(os.environ["BOARD_BASE"], path, **ble)
    before = central.status()["configuration"]["reloads"]
    os.kill(int(open(os.environ["DAEMON_PIDFILE"]).read().strip()), 1)

    def done():
        report = central.status()
        return (report["configuration"]["reloads"] > before and (report["configuration"].get("last_reload") or "").startswith("applied")
                and ("advertising as %s " % ble["name"]) in central.ble_state(report))
    return await central.wait_for(done, 0.3)


async def reconnect_bonded(device, central, phone, handle, value, name=None):
    """A bonded phone comes back: a new private address, encryption with its
    stored key, then a write to the FFE1 handle it cached, with no discovery.
    Returns (connection, why-not)."""
    await phone.rotate_address()
    phone.security_event.clear()
    linked = await central.link(device, 30, name=name)
    if linked is None:
        return None, "board not found"
    connection = linked[0]
    # The phone encrypts once the board asks: bluetoothd sends a Security
    # Request when it holds the phone's key ("Elevating security level since
    # LTK is available", src/device.c). Encrypting before that request
    # races bluetoothd: if the link is encrypted between its reading the
    # security level and its raising it, the kernel answers the raise with
    # EINVAL (l2cap_sock_setsockopt: smp_conn_security() says "already
    # sufficient") and bluetoothd drops the ATT channel, and with it the
    # link (seen here with 5.66; the code is the same in 5.82).
    try:
        await asyncio.wait_for(phone.security_event.wait(), 5)
    except asyncio.TimeoutError:
        pass
    try:
        await asyncio.wait_for(connection.encrypt(), 20)
    except (Exception, asyncio.CancelledError) as error:
        return connection, "encryption: %s" % told(error)
    try:
        await connection.gatt_client.write_value(handle, enable_frames(), with_response=True)
        await connection.gatt_client.write_value(handle, servo_frame(0, value), with_response=True)
    except (Exception, asyncio.CancelledError) as error:
        # A link dropped mid-write cancels the request (Bumble).
        return connection, "write to cached handle 0x%04X: %s" % (handle, told(error))
    return connection, None


def refused_writes(central):
    """The writes the daemon refused by ble.allow since its BLE side started
    (its status says ", N writes refused (ble.allow)" once N > 0)."""
    found = re.search(r"(\d+) writes refused \(ble\.allow\)", central.ble_state(central.status()))
    return int(found.group(1)) if found else 0


async def database_hash(connection):
    try:
        values = await connection.gatt_client.read_characteristics_by_uuid(DATABASE_HASH, None)
        return values[0].hex() if values else None
    except Exception as error:
        return "unreadable (%s)" % told(error)


async def pairing(device, central, phone):
    try:
        await pairing_steps(device, central, phone)
    finally:
        device.pairing_config_factory = lambda _: PairingConfig()
        # The default daemon again for the phases after this one.
        await central.restart_daemon(None, "daemon-ble-after-pair.log")


async def pairing_steps(device, central, phone):
    board = os.path.join(os.environ.get("BLECONTROL_BLE_WORK", "/tmp"), "board-pair.yaml")
    identity = device.public_address.to_string(False)
    board_with(os.environ["BOARD_BASE"], board, security="authenticated", allow="[%s]" % identity)
    # The phone's key material, as a real one has: a random IRK it gives
    # the board when bonding, so the board can resolve its later addresses.
    device.irk = os.urandom(16)
    ok = await central.restart_daemon(board, "daemon-ble-pair.log")
    if not central.record(ok, "q1", "daemon restarted with ble.security: authenticated, ble.allow: [%s] (the phone's identity), advertising" % identity,
                          central.ble_state(central.status())):
        return

    # An unbonded phone: refused, nothing moves. ch0 first set through the
    # control socket (its failsafe holds the value once that session ends).
    central.subprocess.run([central.CLI, "send", "01020001", "0203000064", "--socket", central.SOCKET], capture_output=True, timeout=30)
    before = pulse(central, 0)
    await phone.rotate_address()
    result = await central.connect(device, subscribe=False)
    if not central.record(result is not None, "q2", "unbonded iPhone-like central connects from a private address, FFE1 found"):
        return
    connection, peer, char, notifications, entry = result
    await peer.request_mtu(185)
    await char.write_value(servo_frame(0, 900), with_response=False)
    refused = None
    try:
        await char.write_value(enable_frames(), with_response=True)
    except Exception as error:
        refused = error
    code = getattr(refused, "error_code", None)
    central.record(refused is not None and near(before, 1100) and near(pulse(central, 0), before), "q3",
                   "unbonded: the write with response is refused (ATT error 0x%02X) and the write without response "
                   "before it moved nothing (ch0 %d us)" % (code or 0, pulse(central, 0)), told(refused))
    handle = char.handle

    # A wrong passkey: pairing fails, the board keeps advertising.
    keyboard = Keyboard(central, wrong=True)
    failed = await pair_typing(device, connection, keyboard)
    central.record(failed is not None and keyboard.shown is not None, "q4",
                   "a wrong passkey (the LCD showed %s, the phone typed another): pairing fails (%s)"
                   % (keyboard.shown[0] if keyboard.shown else "nothing", told(failed)))
    # The phone tries again on the same link, as an iPhone does at the next
    # write that needs encryption: the kernel makes a new passkey, and the
    # LCD must show it (bluetoothd cancels nothing at a display, so a board
    # that kept the first passkey on screen could never be paired on this
    # link). Wrong again, so that the phone first bonds in q7.
    first = keyboard.shown[0] if keyboard.shown else None
    keyboard = Keyboard(central, wrong=True, not_this=first)
    failed = await pair_typing(device, connection, keyboard)
    central.record(failed is not None and first is not None and keyboard.shown is not None, "q4b",
                   "the phone tries again on the same link: the LCD shows the new passkey (%s, the first was %s); "
                   "a wrong one fails again (%s)" % (keyboard.shown[0] if keyboard.shown else "never shown", first, told(failed)))
    await central.disconnect(device, connection)
    cleared = await central.wait_for(lambda: not any(l.startswith("PIN ") for l in central.status()["lcd"]["lines"])
                                     and not central.ble_sessions(central.status()))
    central.record(cleared, "q5", "after the failed pairing the passkey is off the LCD", central.status()["lcd"]["lines"])

    # The same phone seen unbonded from its identity address just before it
    # pairs (an Android phone's public address; any phone that used the
    # board before ble.security was set): bluetoothd 5.66 to 5.82 keep that
    # device object for 30 s, merge it with the pairing one when the phone
    # gives its identity, then delete its storage directory, which is the
    # new bond's, so the bond is gone at the next bluetoothd start (q12)
    # unless the daemon removed the stale object first.
    result = await central.connect(device, subscribe=False, own_address_type=hci.OwnAddressType.PUBLIC)
    central.record(result is not None, "q5b", "the phone connects unbonded from its identity address %s, then leaves" % identity)
    if result is not None:
        await central.disconnect(device, result[0])
    await central.wait_for(lambda: not central.ble_sessions(central.status()))

    # The right passkey: bonded, writes accepted.
    await phone.rotate_address()
    result = await central.connect(device, subscribe=False)
    if not central.record(result is not None, "q6", "the board still advertises after the failed pairing: found and connected again"):
        return
    connection, peer, char, notifications, entry = result
    keyboard = Keyboard(central)
    started = time.monotonic()
    error = await pair_typing(device, connection, keyboard)
    took = time.monotonic() - started
    shown = keyboard.shown[1] if keyboard.shown else {}
    central.record(error is None and keyboard.shown is not None and "passkey %s" % keyboard.shown[0] in central.ble_state(shown),
                   "q7", "LE Secure Connections, passkey entry: the phone typed the passkey the LCD showed (%s; in status: '%s'); "
                   "bonded in %.2f s" % (keyboard.shown[0] if keyboard.shown else "none", central.ble_state(shown), took), told(error))
    central.say("FIGURE pairing (passkey shown -> typed -> bonded, under TCG): %.2f s" % took)
    # The passkey leaves the status at once, the LCD when its thread has
    # redrawn the lines: wait for both.

    def cleared(report):
        return "passkey" not in central.ble_state(report) and not any(l.startswith("PIN ") for l in report["lcd"]["lines"])
    report = await central.CHECKS.status_when(cleared)
    central.record(cleared(report), "q8", "once bonded the passkey leaves the LCD and the status", central.ble_state(report))
    try:
        answered = await phone_session(char)
        error = None
    except Exception as failure:
        answered, error = -1, failure

    def pulses(report):
        return [round(central.channel(report, ch).get("pulse_us", 0)) for ch in range(4)]
    # bluetoothd answers a write request before the daemon has it: wait
    # for the session's last servo values rather than read them at once.
    report = (await central.CHECKS.status_when(lambda r: all(abs(us - 1600) < 5 for us in pulses(r)))
              if answered == 10 else central.status())
    servos = pulses(report)
    central.record(answered == 10 and all(abs(us - 1600) < 5 for us in servos), "q9",
                   "bonded and encrypted, from a private address, allowed by its identity address: the demo app's session applied "
                   "(%d writes answered, servos %s)" % (answered, servos), told(error))
    hash_before = await database_hash(connection)
    await central.disconnect(device, connection)
    await central.wait_for(lambda: not central.ble_sessions(central.status()))

    # The bond and the cached handle across a new address, a daemon restart,
    # a bluetoothd restart and board reloads.
    cases = [("q10", "a new private address", None, None),
             ("q11", "a daemon restart", "daemon", None),
             ("q12", "a bluetoothd restart", "bluetoothd", None),
             ("q13", "a board reload (SIGHUP) that renames the board", "reload", {"name": "BLEControl-R1"}),
             ("q14", "a board reload that changes ble.security to encrypted", "reload", {"name": "BLEControl-R2", "security": "encrypted"})]
    value = 300
    for ident, what, change, ble in cases:
        name = None
        if change == "daemon":
            ok = await central.restart_daemon(board, "daemon-ble-pair2.log")
        elif change == "bluetoothd":
            ok = await central.start_bluetoothd(os.environ.get("BLUETOOTHD_BLECONTROL_ARGS", "").split(), "bluetoothd-pair.log")
        elif change == "reload":
            ble = dict(ble, allow="[%s]" % identity)
            ble.setdefault("security", "authenticated")
            name = ble["name"]
            ok = await reload_board(central, board, **ble)
        else:
            ok = True
        if not central.record(ok, ident + "a", "after %s the daemon advertises" % what, central.ble_state(central.status())):
            continue
        value += 50
        connection, why = await reconnect_bonded(device, central, phone, handle, value, name)
        applied = why is None and await central.wait_for(lambda: near(pulse(central, 0), 1000 + value))
        hash_now = await database_hash(connection) if connection else None
        central.record(applied and hash_now == hash_before, ident,
                       "after %s: the bonded phone encrypts with its stored key and writes to the FFE1 handle it cached (0x%04X) "
                       "without discovery -> ch0 %d us; Database Hash unchanged (%s)" % (what, handle, 1000 + value, hash_now),
                       (why, pulse(central, 0), hash_before, hash_now))
        if connection:
            await central.disconnect(device, connection)
        await central.wait_for(lambda: not central.ble_sessions(central.status()))

    # ble.allow: the same bonded phone, not on the list, is refused.
    ok = await reload_board(central, board, name="BLEControl-R3", security="authenticated", allow="[00:11:22:33:44:55]")
    before = refused_writes(central)
    connection, why = await reconnect_bonded(device, central, phone, handle, 777, "BLEControl-R3")
    # With the HM-10 layout (FFE1 also write-without-response) bluetoothd
    # answers a write request before the daemon has (see the "ack" phase),
    # so the phone is not told: the refusal shows in status, and nothing
    # moves. The count of refusals is the event to wait for (both writes,
    # or the one that went before the link failed), then the pulse is read.
    sent = why is None or "write to cached handle" in why
    if sent:
        await central.wait_for(lambda: refused_writes(central) >= before + (2 if why is None else 1))
    state = central.ble_state(central.status())
    central.record(ok and sent and not near(pulse(central, 0), 1777) and refused_writes(central) > before,
                   "q15", "ble.allow without the phone's identity: the bonded, encrypted phone's writes are refused (counted in status), nothing moves",
                   (why, pulse(central, 0), state))
    if connection:
        await central.disconnect(device, connection)
    await central.wait_for(lambda: not central.ble_sessions(central.status()))
    await reload_board(central, board, name="BLEControl-R4", security="authenticated", allow="[%s]" % identity)

    # forget-bonds: the board drops the keys; the phone's old key no longer
    # encrypts, and its writes are refused again.
    out = central.subprocess.run([central.CLI, "forget-bonds", "--socket", central.SOCKET], capture_output=True, text=True, timeout=30)
    central.record(out.returncode == 0 and identity in out.stdout, "q16", "blecontrol forget-bonds forgets the phone by its identity address ('%s')"
                   % out.stdout.strip(), out.stderr.strip())
    connection, why = await reconnect_bonded(device, central, phone, handle, 888, "BLEControl-R4")
    central.record(why is not None and not near(pulse(central, 0), 1888), "q17",
                   "after forget-bonds the phone's stored key is refused (%s) and nothing moves" % why, pulse(central, 0))
    if connection:
        await central.disconnect(device, connection)
    await central.wait_for(lambda: not central.ble_sessions(central.status()))
    out = central.subprocess.run([central.CLI, "forget-bonds", "--socket", central.SOCKET], capture_output=True, text=True, timeout=30)
    central.record(out.returncode == 0 and "no bonds" in out.stdout, "q18", "forget-bonds again: nothing left to forget", out.stdout + out.stderr)


async def phone_session(char):
    import phone as iphone
    return await iphone.run_session(char, 0.015, b"bonded")
