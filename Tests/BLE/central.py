#!/usr/bin/env python3
"""The central side of the D-Bus tier: Bleak on hci1 drives the daemon's
GATT application (registered on hci0 of the same BlueZoo) with the original
iOS library's byte sequences and checks what the emulated board did through
`blecontrol status --json`.

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
from rig.board import ble_sessions, channel, cli_status  # noqa: E402

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


async def find(timeout=120.0, adapter=ADAPTER):
    """Scan for the board by local name or by service (find_device_by_name is
    unreliable against BlueZoo; a filter on either is not). The scan ends as
    soon as the board is seen; the timeout only bounds a board that never is."""
    found = asyncio.Event()
    hit = {}

    def seen(device, adv):
        if adv.local_name == NAME or SERVICE in [u.lower() for u in adv.service_uuids]:
            hit["device"] = device
            hit["name"] = adv.local_name
            hit["services"] = [u.lower() for u in adv.service_uuids]
            found.set()

    async with BleakScanner(detection_callback=seen, bluez={"adapter": adapter}):
        try:
            await asyncio.wait_for(found.wait(), timeout)
        except asyncio.TimeoutError:
            return None
    return hit


async def scenario():
    report = status()
    check("advertising" in report["transports"].get("ble", ""), "daemon registered on hci0", report["transports"].get("ble"))

    hit = await find()
    if not check(hit is not None, "scan finds the board by name or service FFE0"):
        return
    check(hit["name"] == NAME, "advertised local name is the board's", hit.get("name"))
    check(SERVICE in hit["services"], "advertisement lists service FFE0", hit.get("services"))

    notifications = []
    async with BleakClient(hit["device"], bluez={"adapter": ADAPTER}) as client:
        check(client.is_connected, "connected")
        services = client.services
        char = services.get_characteristic(CHAR)
        check(char is not None and char.service_uuid == SERVICE, "FFE1 inside FFE0")
        if char is not None:
            props = sorted(char.properties)
            check({"write", "write-without-response", "notify"} <= set(props), "FFE1 is write, write-without-response, notify", props)
        dis = [s for s in services if s.uuid.startswith("0000180a")]
        if check(len(dis) == 1, "Device Information service present"):
            model = await client.read_gatt_char("00002a24-0000-1000-8000-00805f9b34fb")
            check(len(model) > 0, "DIS model string readable", model)

        await client.start_notify(CHAR, lambda _, data: notifications.append(bytes(data)))

        # The original library: ANALOG_OUT_EN with response, SERVO_VAL and
        # PWM_VAL without, LCD_TEXT and LCD_CLEAR with.
        await client.write_gatt_char(CHAR, bytes([0x01, 0x02, 0x00, 0x01]), response=True)
        await client.write_gatt_char(CHAR, bytes([0x02, 0x03, 0x00, 0x01, 0xF4]), response=False)  # ch0 500 → 1500 µs
        await client.write_gatt_char(CHAR, bytes([0x01, 0x02, 0x06, 0x01]), response=True)
        await client.write_gatt_char(CHAR, bytes([0x03, 0x03, 0x06, 0x01, 0xF4]), response=False)  # ch6 50 %
        # This scenario runs with AcquireWrite offered: once the write socket
        # is acquired, writes with response go through it too and are
        # acknowledged at once (as bluetoothd does, docs/protocol.md), so the
        # text is waited for here; after_restart checks the acknowledgement
        # on the default WriteValue path.
        await client.write_gatt_char(CHAR, bytes([0x04, 0x07, 0x00]) + b"Hello" + bytes([0x00]), response=True)
        shown = await wait_for(lambda: status()["lcd"]["lines"][0].startswith("Hello"))
        check(shown, "LCD_TEXT with response → the LCD shows Hello", status()["lcd"]["lines"])
        # 12-bit PCA9685 counts at 50 Hz are ~4.9 µs apart: compare within 5 µs.
        report = await wait_for(lambda: (lambda r: r if abs(channel(r, 0).get("pulse_us", 0) - 1500) < 5 else None)(status()))
        check(report is not None, "SERVO_VAL without response → ch0 1500 µs", channel(status(), 0))
        report = await wait_for(lambda: (lambda r: r if abs(channel(r, 6).get("duty", 0) - 0.5) < 0.01 else None)(status()))
        check(report is not None, "PWM_VAL without response → ch6 50 % duty", channel(status(), 6))

        # A frame split over two writes, and two frames in one write.
        await client.write_gatt_char(CHAR, bytes([0x02, 0x03, 0x00]), response=False)
        await client.write_gatt_char(CHAR, bytes([0x03, 0xE8]), response=False)  # ch0 1000 → 2000 µs
        ok = await wait_for(lambda: abs(channel(status(), 0).get("pulse_us", 0) - 2000) < 5)
        check(ok, "fragmented SERVO_VAL reassembled → ch0 2000 µs", channel(status(), 0))
        await client.write_gatt_char(CHAR, bytes([0x02, 0x03, 0x01, 0x00, 0x00, 0x05, 0x00]), response=True)
        # Acknowledged at once through the acquired socket (see above): the
        # LCD thread clears the display when it gets to it.
        cleared = await wait_for(lambda: all(l.strip() == "" for l in status()["lcd"]["lines"]))
        check(cleared, "SERVO_VAL + LCD_CLEAR in one write", status()["lcd"]["lines"])

        # 200 writes without response, as a slider would.
        await client.write_gatt_char(CHAR, bytes([0x01, 0x02, 0x02, 0x01]), response=True)
        start = time.monotonic()
        for i in range(200):
            await client.write_gatt_char(CHAR, bytes([0x02, 0x03, 0x02, (i * 5) >> 8, (i * 5) & 0xFF]), response=False)
        elapsed = time.monotonic() - start
        ok = await wait_for(lambda: abs(channel(status(), 2).get("pulse_us", 0) - (1000 + 199 * 5)) < 5)
        check(ok, "200 writes without response, last value applied (%.2f s)" % elapsed, channel(status(), 2))

        # Unknown command 9 → ERROR notification FF 01 09.
        await client.write_gatt_char(CHAR, bytes([0x09, 0x00]), response=True)
        ok = await wait_for(lambda: bytes([0xFF, 0x01, 0x09]) in notifications)
        check(ok, "unknown command 9 → notification FF 01 09", [n.hex() for n in notifications])

        report = status()
        sessions = ble_sessions(report)
        check(len(sessions) == 1 and sessions[0]["frames"] >= 200, "one BLE session with the frames counted", sessions)
        check(report["servo"].get("failsafe") is None, "no failsafe while connected", report["servo"].get("failsafe"))

    # Disconnect: the session ends and the failsafe engages.
    ok = await wait_for(lambda: len(ble_sessions(status())) == 0)
    check(ok, "disconnect → BLE session ended", ble_sessions(status()))
    failsafe = status()["servo"].get("failsafe")
    check(failsafe is not None and failsafe.startswith("central left: ble"), "disconnect of the central in control → failsafe engaged", failsafe)

    # Advertising goes on: BlueZoo still holds our advertisement. (A second
    # scan would not report a device BlueZoo already knows, and BlueZoo 1.0.2
    # fails a second connection to the same device with EEXIST from sd-bus,
    # so reconnecting is checked after the BlueZoo restart instead.)
    check(await advertising_instances("hci0") == 1, "still advertising after the central left")


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


async def after_restart():
    hit = await find()
    if not check(hit is not None, "after BlueZoo restart: found again by scan"):
        return
    async with BleakClient(hit["device"], bluez={"adapter": ADAPTER}) as client:
        notifications = []
        await client.start_notify(CHAR, lambda _, data: notifications.append(bytes(data)))
        await client.write_gatt_char(CHAR, bytes([0x01, 0x02, 0x01, 0x01, 0x02, 0x03, 0x01, 0x03, 0xE8]), response=True)
        ok = await wait_for(lambda: abs(channel(status(), 1).get("pulse_us", 0) - 2000) < 5)
        check(ok, "after BlueZoo restart: write applied → ch1 2000 µs", channel(status(), 1))
        await client.write_gatt_char(CHAR, bytes([0x09, 0x00]), response=True)
        ok = await wait_for(lambda: bytes([0xFF, 0x01, 0x09]) in notifications)
        check(ok, "after BlueZoo restart: notifications work", [n.hex() for n in notifications])
        if os.environ.get("BLECONTROL_BLE_ACK_AFTER_APPLY") == "1":
            # Through WriteValue (the default board) a write with response is
            # answered once applied: a status read after the answer shows the
            # whole text.
            await client.write_gatt_char(CHAR, bytes([0x04, 0x09, 0x01]) + b"Applied" + bytes([0x00]), response=True)
            lines = status()["lcd"]["lines"]
            check(lines[1].startswith("Applied"), "LCD_TEXT with response applied before the write is acknowledged", lines)


async def adapter_alias(adapter):
    return await adapter_property(adapter, "org.bluez.Adapter1", "Alias")


async def demo_app():
    """The original demo app's whole session, with its write types: enable
    0-7 on connect (with response), servo sliders 0-3 and PWM sliders 4-7
    (without, resending every set value of the kind on each change, one PWM
    negative), switches 0-3 (without), two LCD lines (with), and leaving the
    control screen (every channel disabled, with response)."""
    check(await adapter_alias("hci0") == NAME, "the adapter's alias is the board's name (what iOS lists)", await adapter_alias("hci0"))
    hit = await find()
    if not check(hit is not None, "demo app: finds the board"):
        return
    async with BleakClient(hit["device"], bluez={"adapter": ADAPTER}) as client:
        notifications = []
        await client.start_notify(CHAR, lambda _, data: notifications.append(bytes(data)))
        for number in range(8):
            await client.write_gatt_char(CHAR, bytes([0x01, 0x02, number, 0x01]), response=True)
        servos = [100, 400, 700, 1000]
        for moved in range(4):
            for number in range(moved + 1):
                value = servos[number]
                await client.write_gatt_char(CHAR, bytes([0x02, 0x03, number, value >> 8, value & 0xFF]), response=False)
        pwm = [250, 500, 1000, -500]
        for offset, value in enumerate(pwm):
            raw = value & 0xFFFF
            await client.write_gatt_char(CHAR, bytes([0x03, 0x03, 4 + offset, raw >> 8, raw & 0xFF]), response=False)
        for index, on in enumerate([1, 0, 1, 1]):
            await client.write_gatt_char(CHAR, bytes([0x06, 0x02, index, on]), response=False)
        await client.write_gatt_char(CHAR, bytes([0x04, 0x0C, 0x00]) + b"BLEControl" + bytes([0x00]), response=True)
        await client.write_gatt_char(CHAR, bytes([0x04, 0x0A, 0x01]) + b"Demo app" + bytes([0x00]), response=True)

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
        await client.write_gatt_char(CHAR, bytes([0x09, 0x00]), response=True)
        await wait_for(lambda: len(notifications) > 0)
        check(notifications[:1] == [bytes([0xFF, 0x01, 0x09])], "demo app: no ERROR notification for anything the app sent", [n.hex() for n in notifications])
        for channel_number in range(8):
            await client.write_gatt_char(CHAR, bytes([0x01, 0x02, channel_number, 0x00]), response=True)
        report = status()
        check(all(channel(report, c).get("pulse_us") == 0 for c in range(8)), "demo app: leaving the screen stops every channel (acknowledged once applied)",
              [channel(report, c).get("pulse_us") for c in range(8)])


# Issue 28: the failsafe follows the central in control (docs/protocol.md,
# "Failsafe"). PWM 4 at 50 % from the commander; what else stays connected
# must not keep it running once the commander leaves.
ENABLE_4 = bytes([0x01, 0x02, 0x04, 0x01])
PWM_4_HALF = bytes([0x03, 0x03, 0x04, 0x01, 0xF4])  # 500 → 50 %
PWM_4_QUARTER = bytes([0x03, 0x03, 0x04, 0x00, 0xFA])  # 250 → 25 %


def duty_4(report):
    return channel(report, 4).get("duty", -1)


def failsafe_of(report):
    return report["servo"].get("failsafe")


async def pwm_4_at_half(client, what):
    await client.write_gatt_char(CHAR, ENABLE_4 + PWM_4_HALF, response=True)
    ok = await wait_for(lambda: abs(duty_4(status()) - 0.5) < 0.001)
    return check(ok, what + ": enable 4 + PWM_VAL 4 = 500 → channel 4 at 50 %", channel(status(), 4))


async def commander_left(label, commander_address):
    """After the commander's link is gone: the failsafe names it, channel 4 off."""
    failsafe = await wait_for(lambda: failsafe_of(status()))
    device = "dev_" + (commander_address or "?").replace(":", "_")
    check(failsafe is not None and failsafe.startswith("central left: ble") and device in failsafe and "channel 4" in failsafe,
          label + ": failsafe engaged, naming the commander (%s) and channel 4 (%s)" % (device, failsafe), failsafe)
    ok = await wait_for(lambda: duty_4(status()) == 0)
    check(ok, label + ": channel 4 at duty 0", channel(status(), 4))


async def two_centrals():
    """Two phones: an observer on BLECONTROL_BLE_OBSERVER_ADAPTER (notifications on, INIT
    and LCD text only) and the commander on BLECONTROL_BLE_CENTRAL_ADAPTER. The
    commander leaves: failsafe, though the observer stays; the observer's
    first command ends it and applies."""
    label = "two BLE centrals"
    commander_address = await adapter_property(ADAPTER, "org.bluez.Adapter1", "Address")
    observer_hit = await find(adapter=OBSERVER_ADAPTER)
    commander_hit = await find(adapter=ADAPTER)
    if not check(observer_hit is not None and commander_hit is not None,
                 label + ": both find the board (%s and %s)" % (OBSERVER_ADAPTER, ADAPTER), (observer_hit, commander_hit)):
        return
    async with BleakClient(observer_hit["device"], bluez={"adapter": OBSERVER_ADAPTER}) as observer:
        notifications = []
        await observer.start_notify(CHAR, lambda _, data: notifications.append(bytes(data)))
        await observer.write_gatt_char(CHAR, bytes([0x00, 0x00]) + bytes([0x04, 0x0A, 0x00]) + b"watching" + bytes([0x00]), response=True)
        shown = await wait_for(lambda: status()["lcd"]["lines"][0].startswith("watching"))
        check(shown, label + ": the observer (%s) sent INIT and LCD text" % OBSERVER_ADAPTER, status()["lcd"]["lines"])
        async with BleakClient(commander_hit["device"], bluez={"adapter": ADAPTER}) as commander:
            if not await pwm_4_at_half(commander, label + ": the commander (%s)" % ADAPTER):
                return
            sessions = ble_sessions(status())
            check(len(sessions) == 2, label + ": two BLE sessions", sessions)
        ok = await wait_for(lambda: len(ble_sessions(status())) == 1)
        check(ok, label + ": the commander disconnected, the observer's session stays", ble_sessions(status()))
        await commander_left(label + ", the commander left while the observer stays", commander_address)
        await observer.write_gatt_char(CHAR, PWM_4_QUARTER, response=True)
        ok = await wait_for(lambda: failsafe_of(status()) is None)
        check(ok, label + ": the observer's first command (PWM_VAL 4 = 250) ends the failsafe", failsafe_of(status()))
        ok = await wait_for(lambda: abs(duty_4(status()) - 0.25) < 0.001)
        check(ok, label + ": and applies: channel 4 at 25 %", channel(status(), 4))
        check(not any(n.startswith(bytes([0xFF])) for n in notifications), label + ": no ERROR notification to the observer",
              [n.hex() for n in notifications])


async def mqtt_idle():
    """An MQTT broker connected and idle (Home Assistant watching) beside a BLE
    central that commands PWM 4 and leaves: the failsafe engages."""
    label = "MQTT idle beside BLE"
    mqtt_state = lambda: status()["transports"].get("mqtt") or ""  # noqa: E731
    ok = await wait_for(lambda: mqtt_state().startswith("connected"))
    if not check(ok, label + ": the board is connected to the broker (%s)" % mqtt_state(), mqtt_state()):
        return
    commander_address = await adapter_property(ADAPTER, "org.bluez.Adapter1", "Address")
    hit = await find()
    if not check(hit is not None, label + ": the BLE central finds the board"):
        return
    async with BleakClient(hit["device"], bluez={"adapter": ADAPTER}) as client:
        if not await pwm_4_at_half(client, label):
            return
    ok = await wait_for(lambda: len(ble_sessions(status())) == 0)
    check(ok, label + ": the BLE central disconnected, its session ended", ble_sessions(status()))
    await commander_left(label + ", the BLE commander left", commander_address)
    check(mqtt_state().startswith("connected"), label + ": the broker is still connected (%s)" % mqtt_state(), mqtt_state())


async def silence():
    """Issue 36: silence is per commander. The BLE central commands channel 4
    and then stays connected and silent; a TCP central sends SWITCH_VAL every
    300 ms (the review's case) meanwhile. On a board with a 2 s silence
    timeout the BLE central's channel fails safe, naming it, although the
    TCP central never paused; the TCP central's own switch stays its own."""
    label = "silence per commander (BLE frozen, TCP busy)"
    hit = await find()
    if not check(hit is not None, label + ": the board is found", hit):
        return
    port = int(status()["transports"]["tcp"].rsplit(":", 1)[1])
    async with BleakClient(hit["device"], bluez={"adapter": ADAPTER}) as client:
        if not await pwm_4_at_half(client, label + ": the BLE central"):
            return
        tcp = socket.create_connection(("127.0.0.1", port))
        try:
            tcp.sendall(bytes([0x00, 0x00]))  # INIT: a central, not a stray connection
            sent = 0

            def engaged():
                nonlocal sent
                tcp.sendall(bytes([0x06, 0x02, 0x00, sent % 2]))
                sent += 1
                time.sleep(0.3)
                return failsafe_of(status())
            failsafe = await wait_for(engaged, tries=200)
            check(failsafe is not None and failsafe.startswith("central silent: ble") and "channel 4" in failsafe,
                  label + ": the frozen BLE central's channel 4 failed safe while the TCP central wrote every 300 ms "
                  "(%d switch frames): %s" % (sent, failsafe), failsafe)
            ok = await wait_for(lambda: duty_4(status()) == 0)
            check(ok, label + ": channel 4 at duty 0, the BLE central still connected", (channel(status(), 4), ble_sessions(status())))
            check(len(ble_sessions(status())) == 1, label + ": its connection stayed open", ble_sessions(status()))
        finally:
            tcp.close()


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
