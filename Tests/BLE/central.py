#!/usr/bin/env python3
"""The central side of the D-Bus tier: Bleak on hci1 drives the daemon's
GATT application (registered on hci0 of the same BlueZoo) with the original
iOS library's byte sequences and checks what the emulated board did through
`blecontrol status --json`.

The scenario and the two-centrals phase are the VM tier's too
(scripts/lib/rig/ble_scenario.py); this file is their Bleak adapter, plus
what only this tier checks (the Device Information service, frames split and
joined across writes, a slider's 200 writes, BlueZoo's restart, the demo
app's session, an idle broker, silence per commander).

Prints one PASS/FAIL line per check; exit status 1 when any failed.
Environment: DBUS_SYSTEM_BUS_ADDRESS (the private bus), BLECONTROL_BIN,
BLECONTROL_SOCKET, BLECONTROL_BLE_NAME, BLECONTROL_BLE_CENTRAL_ADAPTER (default hci1) and, for
the two-centrals phase, BLECONTROL_BLE_OBSERVER_ADAPTER (default hci2).
"""
import asyncio
import os
import socket
import sys
import time
from pathlib import Path

from bleak import BleakClient, BleakScanner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig.board as board  # noqa: E402 - scripts/lib: the rigs' one board client
from rig import ble_scenario  # noqa: E402 - the scenario both BLE tiers run
from rig.board import ble_sessions, channel, cli_status, enable_frame, lcd_clear_frame, lcd_text_frame, pwm_frame, servo_frame, switch_frame  # noqa: E402

SERVICE = "0000ffe0-0000-1000-8000-00805f9b34fb"
CHAR = "0000ffe1-0000-1000-8000-00805f9b34fb"
NAME = os.environ.get("BLECONTROL_BLE_NAME", "BLEControl-Sim")
ADAPTER = os.environ.get("BLECONTROL_BLE_CENTRAL_ADAPTER", "hci1")
OBSERVER_ADAPTER = os.environ.get("BLECONTROL_BLE_OBSERVER_ADAPTER", "hci2")
failures = 0


def check(ok, what, detail=""):
    global failures
    print(("PASS" if ok else "FAIL") + ": " + what + ("" if ok or not detail else " (" + str(detail) + ")"), flush=True)
    if not ok:
        failures += 1
    return ok


def status():
    return cli_status(os.environ["BLECONTROL_BIN"])


async def wait_for(predicate, tries=1200):
    """rig.board.wait_for: 0.1 s apart, two minutes and more."""
    return await board.wait_for(predicate, tries=tries)


# This tier's lines carry no ids: the text says which check it is.
CHECKS = ble_scenario.Checks(lambda ok, ident, what, why="": check(ok, what, why), status, wait_for)


class BleakLink:
    """One Bleak connection with FFE1 subscribed (ble_scenario's link)."""

    def __init__(self, client, address, properties):
        self.client = client
        self.address = address
        self.properties = properties
        self.notifications = []

    async def write(self, data, response):
        await self.client.write_gatt_char(CHAR, data, response=response)

    async def close(self):
        await self.client.disconnect()


class BleakCentral:
    """Bleak on one BlueZoo adapter (ble_scenario's central)."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.label = "Bleak on " + adapter

    async def find(self, timeout=120.0):
        """Scan for the board by local name or by service (find_device_by_name
        is unreliable against BlueZoo; a filter on either is not). The scan
        ends as soon as the board is seen; the timeout only bounds a board
        that never is."""
        found = asyncio.Event()
        hit = {}

        def seen(device, adv):
            uuids = [u.lower() for u in adv.service_uuids]
            if adv.local_name == NAME or SERVICE in uuids:
                hit.update(device=device, name=adv.local_name,
                           services={int(u[4:8], 16) for u in uuids if u.endswith("-0000-1000-8000-00805f9b34fb")})
                found.set()

        async with BleakScanner(detection_callback=seen, bluez={"adapter": self.adapter}):
            try:
                await asyncio.wait_for(found.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return hit

    async def connect(self, found):
        client = BleakClient(found["device"], bluez={"adapter": self.adapter})
        await client.connect()
        char = client.services.get_characteristic(CHAR)
        if char is None or char.service_uuid != SERVICE:
            await client.disconnect()
            return None
        address = await adapter_property(self.adapter, "org.bluez.Adapter1", "Address")
        link = BleakLink(client, address, set(char.properties))
        await client.start_notify(CHAR, lambda _, data: link.notifications.append(bytes(data)))
        return link


async def adapter_property(adapter, interface, name):
    """A property of /org/bluez/ADAPTER, as the bus reports it."""
    from dbus_fast import BusType, Message
    from dbus_fast.aio import MessageBus
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    try:
        reply = await bus.call(Message(
            destination="org.bluez", path="/org/bluez/" + adapter, interface="org.freedesktop.DBus.Properties",
            member="Get", signature="ss", body=[interface, name]))
        return reply.body[0].value if reply.body else None
    finally:
        bus.disconnect()


async def advertising_instances(adapter):
    return await adapter_property(adapter, "org.bluez.LEAdvertisingManager1", "ActiveInstances")


async def connected(link):
    """This tier's own checks on the scenario's link; how many frames they sent."""
    dis = [s for s in link.client.services if s.uuid.startswith("0000180a")]
    if check(len(dis) == 1, "Device Information service present"):
        model = await link.client.read_gatt_char("00002a24-0000-1000-8000-00805f9b34fb")
        check(len(model) > 0, "DIS model string readable", model)
    # A frame split over two writes, and two frames in one write. (Over the
    # VM's real bluetoothd a new central's halves may be held apart for
    # longer than idle_timeout_ms: that tier checks them with a longer one.)
    split = servo_frame(0, 1000)  # 1000 -> 2000 µs
    await link.write(split[:3], False)
    await link.write(split[3:], False)
    check(await CHECKS.pulse_at(0, 2000), "fragmented SERVO_VAL reassembled → ch0 2000 µs", channel(status(), 0))
    await link.write(servo_frame(1, 0) + lcd_clear_frame(), True)
    # Acknowledged at once through the acquired socket: the LCD thread
    # clears the display when it gets to it.
    cleared = await wait_for(lambda: all(line.strip() == "" for line in status()["lcd"]["lines"]))
    check(cleared, "SERVO_VAL + LCD_CLEAR in one write", status()["lcd"]["lines"])
    # 200 writes without response, as a slider would.
    await link.write(enable_frame(2), True)
    start = time.monotonic()
    for i in range(200):
        await link.write(servo_frame(2, i * 5), False)
    elapsed = time.monotonic() - start
    check(await CHECKS.pulse_at(2, 1000 + 199 * 5), "200 writes without response, last value applied (%.2f s)" % elapsed,
          channel(status(), 2))
    return 1 + 2 + 1 + 200  # the split SERVO_VAL, SERVO_VAL + LCD_CLEAR, the enable, the slider


async def scenario():
    if await ble_scenario.scenario(CHECKS, BleakCentral(ADAPTER), NAME, connected) is None:
        return
    # Advertising goes on: BlueZoo still holds our advertisement. (A second
    # scan would not report a device BlueZoo already knows, and BlueZoo 1.0.2
    # fails a second connection to the same device with EEXIST from sd-bus,
    # so reconnecting is checked after the BlueZoo restart instead.)
    check(await advertising_instances("hci0") == 1, "still advertising after the central left")


async def connect(what):
    """Scan and connect on the central adapter; None (and a FAIL) when the
    board is not found or FFE1 is missing."""
    central = BleakCentral(ADAPTER)
    found = await central.find()
    link = await central.connect(found) if found is not None else None
    check(link is not None, what + ": finds the board and connects")
    return link


async def after_restart():
    link = await connect("after BlueZoo restart")
    if link is None:
        return
    try:
        await link.write(enable_frame(1) + servo_frame(1, 1000), True)
        check(await CHECKS.pulse_at(1, 2000), "after BlueZoo restart: write applied → ch1 2000 µs", channel(status(), 1))
        await link.write(ble_scenario.UNKNOWN, True)
        ok = await wait_for(lambda: ble_scenario.ERROR_UNKNOWN in link.notifications)
        check(ok, "after BlueZoo restart: notifications work", [n.hex() for n in link.notifications])
        if os.environ.get("BLECONTROL_BLE_ACK_AFTER_APPLY") == "1":
            # Through WriteValue (the default board) a write with response is
            # answered once applied: a status read after the answer shows the
            # whole text.
            await link.write(lcd_text_frame(1, b"Applied"), True)
            lines = status()["lcd"]["lines"]
            check(lines[1].startswith("Applied"), "LCD_TEXT with response applied before the write is acknowledged", lines)
    finally:
        await link.close()


async def adapter_alias(adapter):
    return await adapter_property(adapter, "org.bluez.Adapter1", "Alias")


async def demo_app():
    """The original demo app's whole session, with its write types: enable
    0-7 on connect (with response), servo sliders 0-3 and PWM sliders 4-7
    (without, resending every set value of the kind on each change, one PWM
    negative), switches 0-3 (without), two LCD lines (with), and leaving the
    control screen (every channel disabled, with response)."""
    check(await adapter_alias("hci0") == NAME, "the adapter's alias is the board's name (what iOS lists)", await adapter_alias("hci0"))
    link = await connect("demo app")
    if link is None:
        return
    try:
        for number in range(8):
            await link.write(enable_frame(number), True)
        servos = [100, 400, 700, 1000]
        for moved in range(4):
            for number in range(moved + 1):
                await link.write(servo_frame(number, servos[number]), False)
        pwm = [250, 500, 1000, -500]
        for offset, value in enumerate(pwm):
            await link.write(pwm_frame(4 + offset, value & 0xFFFF), False)
        for index, on in enumerate([1, 0, 1, 1]):
            await link.write(switch_frame(index, on), False)
        await link.write(lcd_text_frame(0, b"BLEControl"), True)
        await link.write(lcd_text_frame(1, b"Demo app"), True)

        def outputs_match(report):
            servo_ok = all(abs(channel(report, c).get("pulse_us", 0) - (1000 + servos[c])) < 5 for c in range(4))
            duties = [channel(report, c).get("duty", -1) for c in range(4, 8)]
            duty_ok = abs(duties[0] - 0.25) < 0.001 and abs(duties[1] - 0.5) < 0.001 and duties[2] == 1 and duties[3] == 1
            switches = [s.get("on") for s in report.get("switches", [])]
            return servo_ok and duty_ok and switches == [True, False, True, True]
        ok = await wait_for(lambda: outputs_match(status()))
        report = status()
        check(ok, "demo app: servos 0-3, PWM 4-7 (a negative one at 100 %), switches 0-3 as set",
              [(c, channel(report, c).get("pulse_us"), channel(report, c).get("duty")) for c in range(8)] + [report.get("switches")])
        check(report["lcd"]["lines"] == ["BLEControl      ", "Demo app        "], "demo app: both LCD lines", report["lcd"]["lines"])
        # Nothing the app sent drew an ERROR: the first notification is the
        # one this deliberately unknown command draws.
        await link.write(ble_scenario.UNKNOWN, True)
        await wait_for(lambda: len(link.notifications) > 0)
        check(link.notifications[:1] == [ble_scenario.ERROR_UNKNOWN], "demo app: no ERROR notification for anything the app sent",
              [n.hex() for n in link.notifications])
        for number in range(8):
            await link.write(enable_frame(number, False), True)
        report = status()
        check(all(channel(report, c).get("pulse_us") == 0 for c in range(8)), "demo app: leaving the screen stops every channel (acknowledged once applied)",
              [channel(report, c).get("pulse_us") for c in range(8)])
    finally:
        await link.close()


async def two_centrals():
    """Two phones: an observer on BLECONTROL_BLE_OBSERVER_ADAPTER (notifications
    on, INIT and LCD text only) and the commander on
    BLECONTROL_BLE_CENTRAL_ADAPTER (ble_scenario.two_centrals)."""
    await ble_scenario.two_centrals(CHECKS, BleakCentral(ADAPTER), BleakCentral(OBSERVER_ADAPTER))


async def mqtt_idle():
    """An MQTT broker connected and idle (Home Assistant watching) beside a BLE
    central that commands PWM 4 and leaves: the failsafe engages."""
    label = "MQTT idle beside BLE"
    mqtt_state = lambda: status()["transports"].get("mqtt") or ""  # noqa: E731
    ok = await wait_for(lambda: mqtt_state().startswith("connected"))
    if not check(ok, label + ": the board is connected to the broker (%s)" % mqtt_state(), mqtt_state()):
        return
    link = await connect(label + ": the BLE central")
    if link is None:
        return
    try:
        if not await ble_scenario.pwm_4_at_half(CHECKS, link, "", label):
            return
    finally:
        await link.close()
    ok = await wait_for(lambda: len(ble_sessions(status())) == 0)
    check(ok, label + ": the BLE central disconnected, its session ended", ble_sessions(status()))
    await ble_scenario.commander_left(CHECKS, link.address, ("", ""), label + ", the BLE commander left")
    check(mqtt_state().startswith("connected"), label + ": the broker is still connected (%s)" % mqtt_state(), mqtt_state())


async def silence():
    """Issue 36: silence is per commander. The BLE central commands channel 4
    and then stays connected and silent; a TCP central sends SWITCH_VAL every
    300 ms (the review's case) meanwhile. On a board with a 2 s silence
    timeout the BLE central's channel fails safe, naming it, although the
    TCP central never paused; the TCP central's own switch stays its own."""
    label = "silence per commander (BLE frozen, TCP busy)"
    port = int(status()["transports"]["tcp"].rsplit(":", 1)[1])
    link = await connect(label)
    if link is None:
        return
    try:
        if not await ble_scenario.pwm_4_at_half(CHECKS, link, "", label + ": the BLE central"):
            return
        tcp = socket.create_connection(("127.0.0.1", port))
        try:
            tcp.sendall(board.init_frame())  # a central, not a stray connection
            sent = 0

            def engaged():
                nonlocal sent
                tcp.sendall(switch_frame(0, sent % 2))
                sent += 1
                time.sleep(0.3)
                return CHECKS.failsafe()
            failsafe = await wait_for(engaged, tries=200)
            check(failsafe is not None and failsafe.startswith("central silent: ble") and "channel 4" in failsafe,
                  label + ": the frozen BLE central's channel 4 failed safe while the TCP central wrote every 300 ms "
                  "(%d switch frames): %s" % (sent, failsafe), failsafe)
            ok = await wait_for(lambda: channel(status(), 4).get("duty", -1) == 0)
            check(ok, label + ": channel 4 at duty 0, the BLE central still connected", (channel(status(), 4), ble_sessions(status())))
            check(len(ble_sessions(status())) == 1, label + ": its connection stayed open", ble_sessions(status()))
        finally:
            tcp.close()
    finally:
        await link.close()


PHASES = {"scenario": scenario, "demo-app": demo_app, "after-restart": after_restart,
          "two-centrals": two_centrals, "mqtt-idle": mqtt_idle, "silence": silence}


def main():
    phase = sys.argv[1] if len(sys.argv) > 1 else "scenario"
    try:
        asyncio.run(PHASES.get(phase, after_restart)())
    except Exception as error:  # a crash is a failure, not a traceback-only exit
        check(False, "central script (" + phase + ") ran to the end", repr(error))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
