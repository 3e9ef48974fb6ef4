#!/usr/bin/env python3
"""The flood of issue 28 on BlueZoo (Tests/BLE/run --flood, and after the
benchmark of --bench): one sender (four for ble-cmd-4) floods the daemon with `09 00` (an unknown command: every two bytes would
draw an ERROR reply) while two centrals measure their own ERROR round trip,
at most 16 a second each (a central's reply budget is a burst of 8, then 20
a second): a BLE central on hci2 (writes `09 00` with response, waits for
the FF 01 09 notification) and a TCP central on the daemon's TCP port.

Printed per run: the daemon's resident memory when the centrals are
connected and idle, and its peak during the flood (VmHWM, reset when the
flood starts: proc(5), clear_refs); each probe's round trips before the
flood (p50) and during it (p50 / p99 / max); what the flood sent, in how
long, and when the daemon had dealt with it (a marker written after the
flood, SERVO_VAL on channel 1, shows in the daemon's status). Figures, not
checks: the goal is a peak within 16 MB of idle and no round trip over
100 ms. Each probe and each flooder is a process of its own, so the
flooder's Python does not stall the probes' clocks.

  flood.py run KIND DAEMON_PID CONTROL_SOCKET [MQTT_PORT]   # one run, one JSON row
  flood.py --table ROWS.jsonl                             # the rows as a table

KIND: ble-cmd / ble-req (one central on hci1, 512-byte writes without /
with response), ble-cmd-4 (four centrals, hci1 and hci3-hci5, a quarter
each), acquire:ble-cmd (ble-cmd on a board offering AcquireWrite; no BLE
probe: BlueZoo 1.0.2 hands an acquired write socket to one central only and
silently drops the other centrals' writes), mqtt-1 (one 8 MiB message on
…/frames: the broker drops it, larger than the board's Maximum Packet
Size), mqtt-16k (the same bytes in messages just under it).
Not measured: a flooder subscribed to its ERRORs and never reading them.
BlueZoo subscribes one central only (a second StartNotify is ignored once
NotifyAcquired is true), and the reply budget (8, then 20 a second) caps
what such a central can leave unread at a few hundred bytes anyway.
Environment: BLECONTROL_BLE_FLOOD_MIB (default 8), BLECONTROL_BLE_FLOOD_SECONDS (how long a BLE
flooder may write, default 120: BlueZoo is a Python process), BLECONTROL_BLE_FLOOD_WINDOW
(writes in flight per BLE flooder, default 32), BLECONTROL_BLE_NAME.
"""
import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

# The BLE tier's one control-socket client and percentile (cli_central.py reads
# BLECONTROL_BIN, which Tests/BLE/run exports).
from cli_central import Control, percentile
from rig.board import enable_frame, init_frame, servo_frame  # scripts/lib, on the path cli_central set

SERVICE = "0000ffe0-0000-1000-8000-00805f9b34fb"
CHAR = "0000ffe1-0000-1000-8000-00805f9b34fb"
NAME = os.environ.get("BLECONTROL_BLE_NAME", "BLEControl-Sim")
MIB = int(os.environ.get("BLECONTROL_BLE_FLOOD_MIB", "8"))
SECONDS = float(os.environ.get("BLECONTROL_BLE_FLOOD_SECONDS", "120"))
WINDOW = int(os.environ.get("BLECONTROL_BLE_FLOOD_WINDOW", "32"))
ERROR_9 = bytes([0x09, 0x00])
REPLY_9 = bytes([0xFF, 0x01, 0x09])
# 16 a second: within a central's reply budget, so every ERROR asked for comes back.
PROBE_PAUSE = 0.0625
# The longest ATT value (Core 5.3 Vol 3 Part F 3.2.9), and what BlueZoo's MTU allows.
WRITE = ERROR_9 * 256


def emit(**row):
    print(json.dumps(row), flush=True)


# --- helpers -----------------------------------------------------------------

def pulse_of(control, channel):
    pulses = control.request("poll")["pulses_us"]
    return pulses[channel] if len(pulses) > channel else None


def memory(pid):
    """(VmRSS, VmHWM) of `pid` in kB."""
    fields = {}
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.split()[0] if value.split() else "0"
    return int(fields.get("VmRSS", 0)), int(fields.get("VmHWM", 0))


def reset_peak(pid):
    with open("/proc/%d/clear_refs" % pid, "w") as clear:
        clear.write("5")


def marker(value):
    """ANALOG_OUT_EN 1 + SERVO_VAL 1 = value: 1000 + value µs on channel 1."""
    return enable_frame(1) + servo_frame(1, value)


async def find(adapter, timeout=120.0):
    from bleak import BleakScanner
    found = asyncio.Event()
    hit = {}

    def seen(device, adv):
        if adv.local_name == NAME or SERVICE in [u.lower() for u in adv.service_uuids]:
            hit["device"] = device
            found.set()

    async with BleakScanner(detection_callback=seen, bluez={"adapter": adapter}):
        await asyncio.wait_for(found.wait(), timeout)
    return hit["device"]


async def stdin_line():
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


# --- the probes (processes of their own) -------------------------------------

async def probe_ble(adapter):
    """Writes 09 00 with response and times each until FF 01 09 is notified;
    prints `ready`, then one line per round trip: `start_monotonic ms`."""
    from bleak import BleakClient
    device = await find(adapter)
    async with BleakClient(device, bluez={"adapter": adapter}) as client:
        replies = asyncio.Queue()
        await client.start_notify(CHAR, lambda _, data: replies.put_nowait(bytes(data)))
        print("ready", flush=True)
        while True:
            start = time.monotonic()
            await client.write_gatt_char(CHAR, ERROR_9, response=True)
            while (await asyncio.wait_for(replies.get(), 600)) != REPLY_9:
                pass
            print("%.6f %.3f" % (start, (time.monotonic() - start) * 1000), flush=True)
            await asyncio.sleep(PROBE_PAUSE)


def probe_tcp(port):
    central = socket.create_connection(("127.0.0.1", port))
    central.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # INIT first: a connection whose first bytes are no frame is closed.
    central.sendall(init_frame())
    print("ready", flush=True)
    while True:
        start = time.monotonic()
        central.sendall(ERROR_9)
        reply = b""
        while len(reply) < 3:
            chunk = central.recv(3 - len(reply))
            if not chunk:
                raise RuntimeError("the daemon closed the probe's connection")
            reply += chunk
        if reply != REPLY_9:
            raise RuntimeError("the probe got %s" % reply.hex())
        print("%.6f %.3f" % (start, (time.monotonic() - start) * 1000), flush=True)
        time.sleep(PROBE_PAUSE)


# --- the flooders (processes of their own) -----------------------------------

async def flood_ble(adapter, share, response, value):
    """Connects on `adapter`, prints `ready`, waits for `go` on stdin, then
    writes `share` bytes of 09 00 in 512-byte writes, WINDOW of them in
    flight, for at most SECONDS, and prints a JSON summary; then, when told
    `marker`, writes the marker with response. Leaves at the end of stdin."""
    from bleak import BleakClient
    device = await find(adapter)
    async with BleakClient(device, bluez={"adapter": adapter}) as client:
        print("ready", flush=True)
        if (await stdin_line()).strip() != "go":
            return
        writes = (share + len(WRITE) - 1) // len(WRITE)
        counts = {"sent": 0, "writes": 0, "refused": 0}
        failures = {}
        deadline = time.monotonic() + SECONDS
        next_write = iter(range(writes))
        start = time.monotonic()

        async def writer():
            for _ in next_write:
                if time.monotonic() > deadline:
                    return
                try:
                    await client.write_gatt_char(CHAR, WRITE, response=response)
                    counts["writes"] += 1
                    counts["sent"] += len(WRITE)
                except Exception as error:  # a refused write is a figure, not a crash
                    counts["refused"] += 1
                    key = str(error)[:100]
                    failures[key] = failures.get(key, 0) + 1

        await asyncio.gather(*(writer() for _ in range(WINDOW)))
        counts.update(seconds=time.monotonic() - start, failures=failures)
        print(json.dumps(counts), flush=True)
        if (await stdin_line()).strip() == "marker":
            await client.write_gatt_char(CHAR, marker(value), response=True)
            print("marker written", flush=True)
        await stdin_line()


def mqtt_packet(kind, body):
    """An MQTT 3.1.1 packet: fixed header (type, remaining length), body."""
    length = len(body)
    encoded = bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([kind]) + bytes(encoded) + body


def mqtt_string(text):
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def mqtt_publish(port, topic, messages):
    """Publishes `messages` (QoS 0) on `topic` from a client of our own: a
    few lines of MQTT 3.1.1, no library needed. Returns the seconds taken."""
    broker = socket.create_connection(("127.0.0.1", port))
    broker.sendall(mqtt_packet(0x10, mqtt_string("MQTT") + bytes([4, 0x02]) + struct.pack(">H", 60) + mqtt_string("flood-bench")))
    connack = broker.recv(4)
    if len(connack) < 4 or connack[0] != 0x20 or connack[3] != 0:
        raise RuntimeError("the broker refused the flooder: %s" % connack.hex())
    start = time.monotonic()
    for message in messages:
        broker.sendall(mqtt_packet(0x30, mqtt_string(topic) + message))
    # A round trip (PINGREQ → PINGRESP): the broker has read every PUBLISH.
    broker.sendall(bytes([0xC0, 0]))
    while broker.recv(2)[:1] != bytes([0xD0]):
        pass
    elapsed = time.monotonic() - start
    broker.sendall(bytes([0xE0, 0]))
    broker.close()
    return elapsed


# --- one run -----------------------------------------------------------------

class Probe:
    """A probe process and its samples."""

    def __init__(self, argv, label):
        self.label = label
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        self.samples = []
        self.failure = None

    def wait_ready(self):
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("%s probe did not start (%r)" % (self.label, line))
        os.set_blocking(self.process.stdout.fileno(), False)

    def collect(self):
        try:
            for line in self.process.stdout:
                start, ms = line.split()
                self.samples.append((float(start), float(ms)))
        except (TypeError, ValueError):
            pass
        if self.process.poll() is not None and self.failure is None:
            self.failure = "exited %s" % self.process.returncode

    def between(self, start, end):
        self.collect()
        return [ms for at, ms in self.samples if start <= at <= end]

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def figures(values):
    if not values:
        return "none"
    return "p50 %.1f p99 %.1f max %.1f ms (%d)" % (percentile(values, 0.5), percentile(values, 0.99), max(values), len(values))


def run(label, pid, control_path, mqtt_port=None):
    """One run: `label` is a KIND, `acquire:` before it when the board offers AcquireWrite."""
    kind = label.rpartition(":")[2]
    me = [sys.executable, os.path.abspath(__file__)]
    control = Control(control_path)
    status = control.request("status")
    tcp_port = int(status["transports"]["tcp"].rsplit(":", 1)[1])
    value = 300 + (sum(map(ord, label)) % 600)
    probes = [Probe(me + ["probe-tcp", str(tcp_port)], "TCP")]
    if not label.startswith("acquire:"):
        probes.insert(0, Probe(me + ["probe-ble", "hci2"], "BLE"))
    flooders = []
    try:
        for probe in probes:
            probe.wait_ready()
        total = MIB << 20
        if kind.startswith("ble"):
            adapters = ["hci1", "hci3", "hci4", "hci5"] if kind == "ble-cmd-4" else ["hci1"]
            response = kind == "ble-req"
            for adapter in adapters:
                flooders.append(subprocess.Popen(me + ["flooder", adapter, str(total // len(adapters)), "1" if response else "0",
                                                       str(value)],
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            for flooder in flooders:
                line = flooder.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError("a flooder did not connect (%r)" % line)
        time.sleep(1.0)
        idle = memory(pid)[0]
        quiet_start = time.monotonic()
        time.sleep(1.5)
        quiet_end = time.monotonic()
        reset_peak(pid)
        start = time.monotonic()
        if kind.startswith("ble"):
            for flooder in flooders:
                flooder.stdin.write("go\n")
                flooder.stdin.flush()
            results = [json.loads(flooder.stdout.readline()) for flooder in flooders]
            sent = sum(r["sent"] for r in results)
            refused = sum(r["refused"] for r in results)
            flood_seconds = max(r["seconds"] for r in results)
            failures = {}
            for r in results:
                for key, count in r["failures"].items():
                    failures[key] = failures.get(key, 0) + count
            flooders[0].stdin.write("marker\n")
            flooders[0].stdin.flush()
            flooders[0].stdout.readline()
            what = "%d central%s, %d writes of %d B %s, %d in flight each: %.2f MiB sent in %.1f s%s" % (
                len(flooders), "" if len(flooders) == 1 else "s", sent // len(WRITE), len(WRITE),
                "with response" if kind == "ble-req" else "without response", WINDOW, sent / (1 << 20), flood_seconds,
                ", %d refused %s" % (refused, failures) if refused else "")
        else:
            topic = status["transports"]["mqtt"].split(" as ", 1)[1].split(",")[0].strip() + "/frames"
            garbage = ERROR_9 * (total // 2)
            piece = 16 * 1024 - 64
            messages = [garbage] if kind == "mqtt-1" else [garbage[i:i + piece] for i in range(0, len(garbage), piece)]
            flood_seconds = mqtt_publish(mqtt_port, topic, messages + [marker(value)])
            what = "%d message%s on %s: %.2f MiB published in %.1f s%s" % (
                len(messages), "" if len(messages) == 1 else "s", topic, total / (1 << 20), flood_seconds,
                " (larger than the board's Maximum Packet Size: the broker drops it)" if kind == "mqtt-1" else "")
        applied = None
        # Generous: the daemon has usually dealt with the flood when the
        # last write is answered; a lost marker ends the wait, not the run.
        limit = time.monotonic() + 180
        while time.monotonic() < limit:
            pulse = pulse_of(control, 1)
            if pulse is not None and abs(pulse - 1000 - value) < 5:
                applied = time.monotonic() - start
                break
            time.sleep(0.05)
        time.sleep(0.5)
        end = time.monotonic()
        peak = memory(pid)[1]
        rows = {"kind": label, "idle_kb": idle, "peak_kb": peak, "flood": what,
                "dealt_with": "marker applied %.1f s after the flood began" % applied if applied is not None else "MARKER NOT APPLIED"}
        for probe in probes:
            quiet = probe.between(quiet_start, quiet_end)
            rows[probe.label] = "quiet p50 %.1f ms; during %s%s" % (
                percentile(quiet, 0.5), figures(probe.between(start, end)), "; PROBE FAILED: " + probe.failure if probe.failure else "")
        report = control.request("status")
        rows["ble_state"] = report["transports"].get("ble", "")
        if "mqtt" in report["transports"]:
            rows["mqtt_state"] = report["transports"]["mqtt"]
        emit(**rows)
    finally:
        # End of input: a flooder waiting for `marker` (all but the first)
        # or for the end leaves at once.
        for flooder in flooders:
            try:
                flooder.stdin.close()
            except BrokenPipeError:
                pass
        for flooder in flooders:
            try:
                flooder.wait(30)
            except subprocess.TimeoutExpired:
                flooder.kill()
        for probe in probes:
            probe.stop()


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for row in rows:
        idle, peak = row["idle_kb"] / 1024, row["peak_kb"] / 1024
        print("  %s: idle %.1f MiB, peak %.1f MiB (+%.1f); %s; %s" % (row["kind"], idle, peak, peak - idle, row["flood"], row["dealt_with"]))
        print("    BLE probe (hci2): %s" % row.get("BLE", "none (BlueZoo gives AcquireWrite's socket to one central only)"))
        print("    TCP probe:        %s" % row["TCP"])
        print("    BLE status: %s" % row["ble_state"])


def main():
    command = sys.argv[1]
    if command == "--table":
        table(sys.argv[2])
    elif command == "run":
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else None)
    elif command == "probe-ble":
        asyncio.run(probe_ble(sys.argv[2]))
    elif command == "probe-tcp":
        probe_tcp(int(sys.argv[2]))
    elif command == "flooder":
        adapter, share, response, value = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
        asyncio.run(flood_ble(adapter, share, response, value))
    else:
        sys.exit("unknown command %s" % command)


if __name__ == "__main__":
    main()
