"""The BLE benchmark of the VM tier (issue 4, item 10), run by ble_central.py
(`bench` phase) on its Bumble central, against blecontrold behind the real
bluetoothd, all under QEMU/TCG (so absolute numbers are those of an emulated
CPU; compare rows, not machines).

What is measured, and how:
- frames/s without response: N SERVO_VAL frames written as write commands
  as fast as Bumble's host sends them, in bursts of BURST_CHUNK whose last
  frame is a write request; the clock stops when the daemon's status shows
  the LAST frame's value on the emulated PCA9685 (so it counts delivery and
  application, not just queueing in the central), and the BLE session's
  frame counter must have grown by N (nothing dropped).
  Why the bursts: an ATT bearer is an L2CAP fixed channel in basic mode,
  which has no flow control, so the board's kernel queues what the link
  delivers on bluetoothd's ATT socket until the socket's receive buffer is
  full (net.core.rmem_default, 212992 bytes; a one-frame ACL buffer is about
  750 bytes of it, so about 280 frames) and then drops (l2cap_sock_recv_cb:
  __sock_queue_rcv_skb fails, nothing is retried). The emulated link
  delivers 300 frames in 0.06 s while bluetoothd under TCG reads about 170
  a second: two runs in twenty delivered 287 and 275 of 300. A phone cannot
  outrun bluetoothd like that (a few frames per 15 ms connection event), so
  the benchmark flow-controls as a link would: the write request closes a
  burst only when bluetoothd has read everything before it.
- frames/s with response: N write requests, each awaited (one ATT round trip,
  one WriteValue D-Bus call each).
- write -> emulated bus latency: one frame at a time, paced; the central
  takes CLOCK_MONOTONIC before the write and polls the daemon's control
  socket with `{"op":"poll"}` (frames and pulses only, a few hundred bytes,
  no status assembly) until the channel's pulse shows the new value, which
  the daemon reports only after the servo thread wrote it to the emulated
  chip. Each sample is an upper bound that includes up to one poll round
  trip (measured separately, printed), the same cheap poll for the daemon
  and the peer, so the comparison is of the two servers, not of their
  status code (a full status cost 12.8 ms under TCG, the peer's 1.1 ms).
- the daemon's own servo histogram (status servo.latency_p50_us/p99): frame
  received in the daemon -> bus write complete, over the whole run.

Which path carried the write commands (WriteValue, or the socket from
AcquireWrite) is read from the daemon's log and BlueZ's debug log, not
assumed.
"""
import asyncio
import json
import os
import sys
import statistics
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig  # noqa: E402 - scripts/lib: progress marks for the VM's quiet guard
from rig.board import enable_frame, percentile, servo_frame, socket_status  # noqa: E402

N_BURST = int(os.environ.get("BLECONTROL_BLE_BENCH_FRAMES", "300"))
N_REQUEST = int(os.environ.get("BLECONTROL_BLE_BENCH_REQUESTS", "60"))
N_LATENCY = int(os.environ.get("BLECONTROL_BLE_BENCH_SAMPLES", "40"))
BURST_CHUNK = int(os.environ.get("BLECONTROL_BLE_BENCH_CHUNK", "100"))
BENCH_CHANNEL = 2  # a servo channel of the simulator board (hold on failsafe)


def pulse_for(value):
    return 1000 + value  # the simulator's channels: min 1000 us, 1 us per unit


# How many polls a wait for a pulse makes before it gives up: the burst's
# last frame, and one latency sample. Bounded by polls, not by a clock: each
# poll is a round trip to the daemon (4 ms on a quiet machine under TCG, 20 ms
# under load), so a loaded machine stretches the wait instead of failing the
# benchmark. A burst's last frame took 15 s of a 20 s clock bound under
# scripts/test --under-load.
BURST_POLLS = 20000
SAMPLE_POLLS = 1500


async def wait_pulse(control, value, polls):
    """When BENCH_CHANNEL showed VALUE's pulse, or None after POLLS polls."""
    target = pulse_for(value)
    for _ in range(polls):
        pulses = control.poll()["pulses_us"]
        if len(pulses) > BENCH_CHANNEL and abs(pulses[BENCH_CHANNEL] - target) < 3:
            return time.monotonic()
        rig.progress()
        # Yield: Bumble sends queued write commands from the event loop.
        await asyncio.sleep(0)
    return None


def session_frames(control):
    return control.poll()["frames"]


def acquired(out):
    """Whether the daemon of this phase logged an AcquireWrite from bluetoothd."""
    try:
        return "AcquireWrite from" in open(os.path.join(out, "daemon-ble-acquire.log"), errors="replace").read()
    except OSError:
        return False


async def measure(central, char, control, label_wo, label_w):
    rows = []
    # Throughput without response.
    base = session_frames(control) or 0
    values = [(i * 7) % 900 for i in range(N_BURST - 1)] + [999]
    start = time.monotonic()
    for index, value in enumerate(values):
        closes_burst = index % BURST_CHUNK == BURST_CHUNK - 1 and index < len(values) - 1
        await char.write_value(servo_frame(BENCH_CHANNEL, value), with_response=closes_burst)
    sent = time.monotonic()
    seen = await wait_pulse(control, 999, BURST_POLLS)
    delivered = (session_frames(control) or 0) - base
    if seen is not None:
        rows.append((label_wo, "frames/s (write → applied)", "%.0f" % (N_BURST / (seen - start)),
                     "%d frames in bursts of %d, %d delivered; central queued them in %.2f s"
                     % (N_BURST, BURST_CHUNK, delivered, sent - start)))
    else:
        rows.append((label_wo, "frames/s", "FAILED", "last value never applied; %d of %d delivered" % (delivered, N_BURST)))
        # The rest would wait out every budget on a channel that does not
        # move (22 minutes in ci32): one clear failure instead.
        return rows
    # Throughput with response.
    start = time.monotonic()
    for i in range(N_REQUEST):
        await char.write_value(servo_frame(BENCH_CHANNEL, (i * 11) % 900), with_response=True)
    rows.append((label_w, "frames/s (acknowledged)", "%.0f" % (N_REQUEST / (time.monotonic() - start)), "%d requests" % N_REQUEST))
    # Latency, paced, each path.
    for label, with_response in ((label_wo, False), (label_w, True)):
        rows.append(await latency(char, control, label, with_response))
    return rows


async def latency(char, control, label, with_response):
    """One frame at a time: write -> the pulse on the emulated chip; a row."""
    samples = []
    for i in range(N_LATENCY):
        value = 100 + (i % 2) * 500 + i
        t0 = time.monotonic()
        await char.write_value(servo_frame(BENCH_CHANNEL, value), with_response=with_response)
        seen = await wait_pulse(control, value, SAMPLE_POLLS)
        if seen is not None:
            samples.append((seen - t0) * 1000)
    if not samples:
        return (label, "write → emulated bus", "FAILED", "no sample applied")
    return (label, "write → emulated bus p50 / p99 ms", "%.1f / %.1f" % (percentile(samples, 0.5), percentile(samples, 0.99)),
            "%d of %d samples" % (len(samples), N_LATENCY))


async def run_phone(device, central):
    """The same latency from the iPhone-like central (phone.py: a new private
    address, its own GATT server busy with bluetoothd's client) at ATT MTU
    185 and at 23 (old iPhones), beside the plain Bumble central's rows of
    the writevalue phase, same daemon, same run."""
    import phone as iphone
    p = iphone.shared(device)
    control = central.ControlSocket()
    rows = []
    try:
        for mtu in (185, 23):
            await p.rotate_address()
            result = await central.connect(device)
            if result is None:
                rows.append(("iPhone-like central, MTU %d" % mtu, "write → emulated bus", "FAILED", "board not found or FFE1 missing"))
                continue
            connection, peer, char, notifications, entry = result
            try:
                negotiated = await peer.request_mtu(mtu) if mtu > 23 else 23
                await char.write_value(enable_frame(BENCH_CHANNEL), with_response=True)
                for kind, with_response in (("write cmd", False), ("write req", True)):
                    rows.append(await latency(char, control, "iPhone-like central, MTU %d, %s" % (negotiated, kind), with_response))
            finally:
                await central.disconnect(device, connection)
    finally:
        control.close()
    publish(rows, central, "phone")


async def run(device, central, phase="bench-writevalue", control_path=None, name=None):
    out = os.environ.get("BLECONTROL_BLE_OUT", ".")
    acquire = phase == "bench-acquire"
    is_peer = phase == "bench-peer"
    result = await central.connect(device, name=name) if name else await central.connect(device)
    if result is None:
        central.record(False, "bench", "benchmark connection", "board not found or FFE1 missing")
        return
    connection, peer, char, notifications, entry = result
    control = central.ControlSocket(control_path) if control_path else central.ControlSocket()
    rows = []
    try:
        if acquire:
            await central.acquiring_write(char)
        await char.write_value(enable_frame(BENCH_CHANNEL), with_response=True)
        if is_peer:
            label_wo = "bluez-peripheral (Python), write cmd, WriteValue"
            label_w = "bluez-peripheral (Python), write req, WriteValue"
        elif acquire:
            label_wo = "write cmd, AcquireWrite socket"
            # Once acquired, bluetoothd answers requests itself and sends them through the socket too.
            label_w = "write req, AcquireWrite socket (acked by BlueZ)"
        else:
            label_wo = "write cmd, WriteValue"
            label_w = "write req, WriteValue (acked when applied)"
        trips = []
        for _ in range(30):
            t0 = time.monotonic()
            control.poll()
            trips.append((time.monotonic() - t0) * 1000)
        rows += await measure(central, char, control, label_wo, label_w)
        if acquire and not acquired(out):
            rows = [(r[0].replace("AcquireWrite socket", "NOT acquired"),) + tuple(r[1:]) for r in rows]
        servo = control.status().get("servo", {})
        if not is_peer:
          rows.append(("servo thread (%s daemon)" % ("AcquireWrite" if acquire else "WriteValue"), "receive → bus p50 / p99 µs",
                     "%s / %s" % (servo.get("latency_p50_us"), servo.get("latency_p99_us")),
                     "daemon's own histogram since its start"))
        rows.append(("(poll, %s run)" % ("peer" if is_peer else "AcquireWrite" if acquire else "WriteValue"), "control-socket poll round trip p50 ms",
                     "%.1f" % statistics.median(trips), "included in each latency sample"))
    finally:
        control.close()
        await central.disconnect(device, connection)
    publish(rows, central, "peer" if is_peer else "acquire" if acquire else "writevalue")


def publish(rows, central, kind):
    """Adds ROWS to the run's table (ble-bench.json, ble-bench.txt), prints
    it, and records whether any row failed."""
    out = os.environ.get("BLECONTROL_BLE_OUT", ".")
    store = os.path.join(out, "ble-bench.json")
    try:
        previous = json.load(open(store))
    except (OSError, ValueError):
        previous = []
    everything = previous + [dict(zip(("path", "metric", "value", "notes"), r)) for r in rows]
    with open(store, "w") as f:
        json.dump(everything, f, indent=1)
    table_rows = [tuple(d[k] for k in ("path", "metric", "value", "notes")) for d in everything]
    if kind == "acquire" and os.environ.get("BLECONTROL_BLE_PEER", "0") != "1":
        table_rows.append(("bluez-peripheral (Python)", "-", "-", "not measured (BLECONTROL_VM_BLE_PEER=0)"))
    header = ("path", "metric", "value", "notes")
    widths = [max(len(str(r[i])) for r in table_rows + [header]) for i in range(4)]
    lines = ["BLE benchmark: blecontrold behind bluetoothd 5.66, Bumble central, btvirt link, QEMU/TCG (%d frames burst, %d requests, %d latency samples)"
             % (N_BURST, N_REQUEST, N_LATENCY)]
    for r in [header] + table_rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    table = "\n".join(lines)
    print(table, file=sys.stderr, flush=True)
    with open(os.path.join(out, "ble-bench.txt"), "w") as f:
        f.write(table + "\n")
    failed = [r for r in rows if r[2] == "FAILED"]
    central.record(not failed, "bench-" + kind, "BLE benchmark through %s ran (table in ble-bench.txt)"
                   % {"peer": "a bluez-peripheral server", "acquire": "AcquireWrite", "writevalue": "WriteValue",
                      "phone": "the iPhone-like central at MTU 185 and 23"}[kind], failed)


# --- The peer: the same workload through a bluez-peripheral GATT server -------
# `python ble_bench.py peer-server SOCKET NAME` serves FFE0/FFE1 through
# bluez-peripheral (dbus-next) on the first adapter and does the daemon's
# decode work in Python: reassemble BLEControl frames, turn SERVO_VAL into
# PCA9685 counts and write them into an emulated register file. It answers
# the daemon's control-socket status request (channels, sessions), so the
# central measures both with the same code and the same status-poll cost.

def _peer_server(path, name):
    import asyncio as aio
    from bluez_peripheral.advert import Advertisement
    from bluez_peripheral.gatt.characteristic import CharacteristicFlags as Flags
    from bluez_peripheral.gatt.characteristic import characteristic
    from bluez_peripheral.gatt.service import Service
    from bluez_peripheral.util import Adapter, get_message_bus

    registers = bytearray(256)  # the emulated PCA9685
    state = {"frames": 0, "pulse": {}, "enabled": set(), "buffer": b"", "advertising": False}

    def apply(cmd, payload):
        state["frames"] += 1
        if cmd == 0x01 and len(payload) == 2:
            (state["enabled"].add if payload[1] else state["enabled"].discard)(payload[0])
        elif cmd == 0x02 and len(payload) == 3 and payload[0] in state["enabled"]:
            channel, value = payload[0], min(1000, payload[1] << 8 | payload[2])
            pulse = 1000 + value
            counts = round(pulse * 4096 * 50 / 1e6)  # 12-bit, 50 Hz frame (PCA9685 datasheet 7.3.3)
            base = 0x06 + 4 * channel
            registers[base:base + 4] = bytes([0, 0, counts & 0xFF, counts >> 8])
            state["pulse"][channel] = round(counts * 1e6 / (4096 * 50), 1)

    def decode(data):
        buffer = state["buffer"] + bytes(data)
        while len(buffer) >= 2 and len(buffer) >= 2 + buffer[1]:
            apply(buffer[0], buffer[2:2 + buffer[1]])
            buffer = buffer[2 + buffer[1]:]
        state["buffer"] = buffer

    class BLEControl(Service):
        def __init__(self):
            super().__init__("FFE0", True)

        @characteristic("FFE1", Flags.WRITE | Flags.WRITE_WITHOUT_RESPONSE | Flags.NOTIFY)
        def ffe1(self, options):
            return bytes()

        @ffe1.setter
        def ffe1(self, value, options):
            decode(value)

    async def control(reader, writer):
        while True:
            line = await reader.readline()
            if not line:
                break
            if json.loads(line).get("op") == "poll":
                pulses = [state["pulse"].get(c, 0) for c in range(8)]
                writer.write((json.dumps({"ok": True, "poll": {"frames": state["frames"], "pulses_us": pulses}}) + "\n").encode())
            else:
                status = {"channels": [{"channel": c, "pulse_us": p} for c, p in state["pulse"].items()],
                          "sessions": [{"transport": "ble", "frames": state["frames"]}],
                          "transports": {"ble": "advertising" if state["advertising"] else "starting"}, "servo": {}}
                writer.write((json.dumps({"ok": True, "status": status}) + "\n").encode())
            await writer.drain()

    async def main():
        bus = await get_message_bus()
        # The first adapter in bluetoothd's order, or the one named (BlueZoo
        # lists its adapters in no fixed order; the central is on the other).
        wanted = os.environ.get("BLECONTROL_BLE_PEER_ADAPTER")
        adapters = await Adapter.get_all(bus)
        adapter = next((a for a in adapters if wanted and a._proxy.path.endswith("/" + wanted)), None) or await Adapter.get_first(bus)
        service = BLEControl()
        await service.register(bus, adapter=adapter)
        advert = Advertisement(name, ["FFE0"], 0, 0)
        await advert.register(bus, adapter)
        state["advertising"] = True
        server = await aio.start_unix_server(control, path)
        async with server:
            await bus.wait_for_disconnect()

    aio.run(main())


async def run_peer(device, central):
    """Stops blecontrold, starts the bluez-peripheral server, measures."""
    import subprocess
    out = os.environ.get("BLECONTROL_BLE_OUT", ".")
    pidfile = os.environ["DAEMON_PIDFILE"]
    pid = int(open(pidfile).read().strip())
    os.kill(pid, 15)
    stopped = await central.wait_for(lambda: not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split(") ")[1][0] in "ZX")
    central.record(bool(stopped), "v19", "daemon stops on SIGTERM within 15 s (before the peer's turn)")
    with open(pidfile, "w") as f:
        f.write("0")  # nothing left for ble_guest.py to stop
    path = "/run/blecontrol-vm/ble/peer.sock"
    log = open(os.path.join(out, "ble-peer.log"), "w")
    name = "BLEControl-Peer"
    peer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "peer-server", path, name], stdout=log, stderr=log)
    try:
        def up():
            return "advertising" in socket_status(path)["transports"]["ble"]
        if not central.record(await central.wait_for(up, 0.3), "bench-peer-up", "bluez-peripheral GATT server registered and advertising"):
            return
        await run(device, central, "bench-peer", control_path=path, name=name)
    finally:
        peer.terminate()
        try:
            peer.wait(5)
        except Exception:
            peer.kill()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "peer-server":
    _peer_server(sys.argv[2], sys.argv[3])
