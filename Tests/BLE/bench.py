#!/usr/bin/env python3
"""The BLE benchmark natively on BlueZoo (no VM, no emulated CPU): a Bleak
central on hci1 writes SERVO_VAL frames to FFE1 of a server on hci0 and
times each write until the server reports the new pulse, through the same
cheap control-socket poll for both servers:

- blecontrold (the simulator board), and
- the peer: a GATT server in Python on bluez-peripheral doing the same
  decode and PCA9685 arithmetic (Tests/VM/ble_bench.py's peer-server).

The daemon runs the simulator board with an instant emulated bus (the peer
has no bus either), and samples are paced at about 40 a second, so both
measure the BLE path to "applied", not bus time or flush pacing.

Usage: bench.py NAME CONTROL_SOCKET LABEL. Prints one JSON row per figure.
"""
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from bleak import BleakClient, BleakScanner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
from rig.board import ControlSocket, enable_frame, percentile, servo_frame  # noqa: E402 - scripts/lib: the rigs' one board client

SERVICE = "0000ffe0-0000-1000-8000-00805f9b34fb"
CHAR = "0000ffe1-0000-1000-8000-00805f9b34fb"
ADAPTER = os.environ.get("BLECONTROL_BLE_CENTRAL_ADAPTER", "hci1")
CHANNEL = 2
SAMPLES = int(os.environ.get("BLECONTROL_BLE_BENCH_SAMPLES", "200"))


class Poll(ControlSocket):
    def __call__(self):
        return self.poll()


async def find(name, timeout=20.0):
    found = asyncio.Event()
    hit = {}

    def seen(device, adv):
        if adv.local_name == name:
            hit["device"] = device
            found.set()

    async with BleakScanner(detection_callback=seen, bluez={"adapter": ADAPTER}):
        await asyncio.wait_for(found.wait(), timeout)
    return hit["device"]


async def main(name, control_path, label):
    poll = Poll(control_path)
    device = await find(name)
    t_connect = time.monotonic()
    async with BleakClient(device, bluez={"adapter": ADAPTER}) as client:
        connected = time.monotonic() - t_connect
        await client.write_gatt_char(CHAR, enable_frame(CHANNEL), response=True)
        trips = []
        for _ in range(100):
            t0 = time.monotonic()
            poll()
            trips.append((time.monotonic() - t0) * 1e6)
        rows = [("poll round trip p50 µs", "%.0f" % percentile(trips, 0.5))]
        for response in (False, True):
            samples = []
            for i in range(SAMPLES):
                value = 100 + (i % 2) * 500 + i % 100
                target = 1000 + value
                t0 = time.monotonic()
                await client.write_gatt_char(CHAR, servo_frame(CHANNEL, value), response=response)
                deadline = t0 + 5
                while time.monotonic() < deadline:
                    pulses = poll()["pulses_us"]
                    if len(pulses) > CHANNEL and abs(pulses[CHANNEL] - target) < 3:
                        samples.append((time.monotonic() - t0) * 1e6)
                        break
                # Paced like a slider (about 40 writes/s): each sample starts
                # with the servo path idle, as the peer always is.
                await asyncio.sleep(0.025)
            kind = "write req" if response else "write cmd"
            rows.append(("%s → applied p50 / p99 µs (%d/%d)" % (kind, len(samples), SAMPLES),
                         "%.0f / %.0f" % (percentile(samples, 0.5), percentile(samples, 0.99))))
        rows.append(("scan found → connected ms", "%.0f" % (connected * 1000)))
    for metric, value in rows:
        print(json.dumps({"server": label, "metric": metric, "value": value}), flush=True)


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    servers = list(dict.fromkeys(r["server"] for r in rows))
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    print("  " + "".ljust(44) + "".join(s.ljust(22) for s in servers))
    for m in metrics:
        print("  " + m.ljust(44) + "".join(next((r["value"] for r in rows if r["server"] == s and r["metric"] == m), "-").ljust(22) for s in servers))


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
