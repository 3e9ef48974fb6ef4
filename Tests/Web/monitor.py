#!/usr/bin/env python3
"""Records every GattCharacteristic1.WriteValue call on the bus, as the bus
daemon sees it (a D-Bus monitor, BecomeMonitor), one JSON object a line:
{"sender", "destination", "path", "bytes" (hex), "type" (the write type
option, "request" or "command", or null)}. Both hops show: the browser
calling BlueZ's device object, and BlueZ calling the board's application.

Usage: monitor.py OUTPUT  (the bus: DBUS_SYSTEM_BUS_ADDRESS). Runs until
killed; prints "ready" on stdout once it is monitoring.
"""
import asyncio
import json
import os
import sys

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

RULE = "type='method_call',interface='org.bluez.GattCharacteristic1',member='WriteValue'"


async def main(path):
    bus = await MessageBus(bus_address=os.environ["DBUS_SYSTEM_BUS_ADDRESS"]).connect()
    out = open(path, "a", buffering=1)

    def seen(message):
        if message.message_type == MessageType.METHOD_CALL and message.member == "WriteValue":
            value, options = message.body[0], message.body[1]
            kind = options.get("type")
            out.write(json.dumps({
                "sender": message.sender, "destination": message.destination, "path": message.path,
                "bytes": bytes(value).hex(), "type": kind.value if kind is not None else None,
            }) + "\n")
        # A call counts as handled, so that the library sends no error reply:
        # a monitor must never answer (the bus would drop it). Anything else
        # (the reply to BecomeMonitor itself) takes its usual path.
        return message.message_type == MessageType.METHOD_CALL

    bus.add_message_handler(seen)
    await bus.call(Message(
        destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
        interface="org.freedesktop.DBus.Monitoring", member="BecomeMonitor",
        signature="asu", body=[[RULE], 0]))
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
