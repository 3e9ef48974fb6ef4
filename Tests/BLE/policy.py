#!/usr/bin/env python3
"""Calls the daemon's FFE1 WriteValue as someone who is not bluetoothd, on a
bus configured like Debian's system bus (Tests/BLE/run, the policy step).

Usage: policy.py UID          calls it (as whoever runs this); prints the
                              D-Bus error name the call got, or "accepted"
       policy.py --name UID   prints the daemon's unique name
"""
import asyncio
import sys
from pathlib import Path

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
from rig.board import enable_frame  # noqa: E402 - scripts/lib: the rigs' frames

CHARACTERISTIC = "/org/blecontrol/gatt/service0/char0"


async def main(uid, name_only):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    names = await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                   interface="org.freedesktop.DBus", member="ListNames"))
    daemon = None
    for name in names.body[0]:
        if not name.startswith(":"):
            continue
        reply = await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                       interface="org.freedesktop.DBus", member="GetConnectionUnixUser",
                                       signature="s", body=[name]))
        if reply.message_type == MessageType.METHOD_RETURN and reply.body[0] == uid:
            daemon = name
    if daemon is None:
        print("no connection of uid %d on the bus" % uid)
        return
    if name_only:
        print(daemon)
        return
    reply = await bus.call(Message(destination=daemon, path=CHARACTERISTIC, interface="org.bluez.GattCharacteristic1",
                                   member="WriteValue", signature="aya{sv}",
                                   body=[enable_frame(0),
                                         {"device": Variant("o", "/org/bluez/hci0/dev_00_00_00_02_00_01")}]))
    print(reply.error_name if reply.message_type == MessageType.ERROR else "accepted")
    bus.disconnect()


if sys.argv[1] == "--name":
    asyncio.run(main(int(sys.argv[2]), True))
else:
    asyncio.run(main(int(sys.argv[1]), False))
