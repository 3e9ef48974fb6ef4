#!/usr/bin/env python3
"""The VM tier's BLE central: a Bumble host on hci1 (HCI user channel) drives
blecontrold's GATT application, registered through the real bluetoothd on
hci0 (both controllers come from `btvirt`, on one virtual link).

The scenario and the two-centrals phase are the D-Bus tier's, written once
in scripts/lib/rig/ble_scenario.py (this file is their Bumble adapter), on
real BlueZ: scan by name, connect, discover FFE0/FFE1, subscribe, the
original iOS library's frames with and without response (checked through
`blecontrol status --json`), an unknown command -> notification FF 01 09,
disconnect -> session ended + failsafe; then what only real BlueZ shows:
a second connection, bluetoothd killed and restarted -> the daemon
registers again within 2 s and a new connection works, and the phases below. With --bench the
benchmark (Tests/VM/ble_bench.py) follows on the same controller, so Bumble
is imported once (~17 s under TCG).

Bumble is imported before bluetoothd starts: the HCI user channel can only
be bound while the kernel has not powered the controller up, and bluetoothd
powers every adapter it sees. The script writes $BLECONTROL_BLE_READY once it holds hci1.

One `PASS id: what` / `FAIL id: what: why` line per check on stdout.
Environment: CLI (blecontrol), SOCKET (its control socket), BLECONTROL_BLE_NAME,
BLECONTROL_BLE_HCI (default 1), BLECONTROL_BLE_OBSERVER_HCI and BLECONTROL_BLE_SPACER_HCI (a second central
and a spacer for the two-centrals phase, unset: none), BLECONTROL_BLE_READY (file to
create once the controllers are held),
BLUETOOTHD_PIDFILE + BLUETOOTHD_LOG (for the restart), BLECONTROL_BLE_OUT (logs).
"""
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig  # noqa: E402 - scripts/lib: progress marks for the VM's quiet guard
import rig.board  # noqa: E402
from rig import ble_scenario  # noqa: E402 - the scenario both BLE tiers run
from rig.board import ble_sessions, ble_state, channel  # noqa: E402,F401 - the rigs' one copy; phone_links reads them here

started = time.monotonic()
from bumble import core as bumble_core  # noqa: E402
from bumble.core import UUID  # noqa: E402
from bumble.device import Device, Peer  # noqa: E402
from bumble.hci import Address  # noqa: E402
from bumble.transport import open_transport  # noqa: E402

IMPORT_SECONDS = time.monotonic() - started
NAME = os.environ.get("BLECONTROL_BLE_NAME", "BLEControl-Sim")
HCI = os.environ.get("BLECONTROL_BLE_HCI", "1")
OBSERVER_HCI = os.environ.get("BLECONTROL_BLE_OBSERVER_HCI", "")
SPACER_HCI = os.environ.get("BLECONTROL_BLE_SPACER_HCI", "")
CLI = os.environ.get("CLI", "blecontrol")
SOCKET = os.environ.get("SOCKET", "/run/blecontrol-vm/ble.sock")
FFE0 = UUID.from_16_bits(0xFFE0)
FFE1 = UUID.from_16_bits(0xFFE1)
failures = 0
# The bluetoothd the phases start (phase "bluez-5.82" switches to Debian
# 13's, chrooted in $TRIXIE_ROOT), its version, and the suffix its checks'
# ids carry ("@5.82": the same checks, the other bluetoothd).
BLUETOOTHD = ["/usr/libexec/bluetooth/bluetoothd"]
BLUEZ_VERSION = "5.66"
TAG = ""


def record(ok, ident, what, why=""):
    global failures
    ident += TAG
    if ok:
        print("PASS %s: %s" % (ident, what), flush=True)
    else:
        failures += 1
        print("FAIL %s: %s%s" % (ident, what, (": " + str(why)[:300]) if why != "" else ""), flush=True)
    return ok


def say(text):
    print("[central %.1fs] %s" % (time.monotonic() - started, text), file=sys.stderr, flush=True)


def status():
    """The daemon's status report from its control socket (the phases poll
    thousands of times); the CLI's own reading is status_cli()."""
    return rig.board.socket_status(SOCKET)


def status_cli():
    """The status as the CLI prints it (what an operator sees)."""
    out = subprocess.run([CLI, "status", "--socket", SOCKET, "--json"], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise RuntimeError("blecontrol status failed: " + out.stderr.strip())
    return json.loads(out.stdout)


class ControlSocket(rig.board.ControlSocket):
    """The daemon's control socket (rig.board), this guest's by default: a
    status poll without starting a process, for the benchmark's latency."""

    def __init__(self, path=None):
        super().__init__(path or SOCKET)



async def wait_for(predicate, interval=0.1, patience=120.0):
    """predicate's first true value, polled `interval` apart; None after as
    many tries as `patience` seconds of pauses make (two minutes and more by
    default). Bounded by tries, not a clock: a busy host stretches the wait,
    and only an outcome that never comes fails a check. Each try marks
    progress (rig.progress), so the VM's quiet guard lets a slow wait reach
    its FAIL line rather than ending the guest first."""
    return await rig.board.wait_for(predicate, tries=int(patience / interval), interval=interval, each_try=rig.progress)


# The shared scenario's view of this tier (rig.ble_scenario).
CHECKS = ble_scenario.Checks(record, status, wait_for)


def ad_fields(advertisement):
    """(local name, 16-bit service UUIDs) from the raw AD structures, so the
    check does not depend on how this Bumble version types them."""
    name, uuids = None, set()
    data = advertisement.data
    for ad_type, value in getattr(data, "ad_structures", []):
        value = bytes(value)
        if ad_type in (0x08, 0x09):
            name = value.decode("utf-8", "replace")
        elif ad_type in (0x02, 0x03):
            for i in range(0, len(value) - 1, 2):
                uuids.add(value[i] | value[i + 1] << 8)
    return name, uuids


async def scan(device, timeout=30.0, name=None):
    """The board's address, name and services, by local name (BlueZ may put
    the name in the scan response and FFE0 in the advertisement: both kept)."""
    seen = {}
    found = asyncio.get_running_loop().create_future()

    def on_advertisement(advertisement):
        name, uuids = ad_fields(advertisement)
        key = str(advertisement.address)
        entry = seen.setdefault(key, {"address": advertisement.address, "name": None, "uuids": set()})
        if name:
            entry["name"] = name
        entry["uuids"] |= uuids
        if entry["name"] == (name or NAME) and not found.done():
            found.set_result(entry)

    device.on("advertisement", on_advertisement)
    await device.start_scanning(legacy=True, active=True, filter_duplicates=False)
    try:
        return await asyncio.wait_for(found, timeout)
    except asyncio.TimeoutError:
        return None
    finally:
        device.remove_listener("advertisement", on_advertisement)
        await device.stop_scanning()


async def discovery(device, scans=100):
    """Discovery every time (issue 19, item 5): SCANS consecutive scans, each
    started afresh; the time from asking for the scan to the first report
    from the board. Every scan must find the board (a 60 s guard bounds a
    miss: under the emulators of old a whole scan could see nothing); the
    times are figures (p50, p99, max, and how many within 2 s), not pass
    marks: this runs under TCG on a shared machine."""
    phase_started = time.monotonic()
    await wait_for(lambda: "advertising" in ble_state(status()), 0.5, patience=180)
    entry = await scan(device)
    if not record(entry is not None, "s1", "the board is found by name to learn its address"):
        return
    board = str(entry["address"])
    times = []
    for _ in range(scans):
        found = asyncio.get_running_loop().create_future()

        def on_advertisement(advertisement):
            if str(advertisement.address) == board and not found.done():
                found.set_result(time.monotonic())
        device.on("advertisement", on_advertisement)
        started = time.monotonic()
        await device.start_scanning(legacy=True, active=True, filter_duplicates=False)
        try:
            times.append(await asyncio.wait_for(found, 60) - started)
        except asyncio.TimeoutError:
            times.append(None)
        finally:
            device.remove_listener("advertisement", on_advertisement)
            await device.stop_scanning()
    seen = sorted(t for t in times if t is not None)
    missed = len(times) - len(seen)

    def ms(q):
        return rig.board.percentile(seen, q) * 1000
    figure = ("scan start -> first report from the board over %d scans: p50 %.0f ms, p99 %.0f ms, max %.0f ms; "
              "%d within 2 s; %d missed" % (len(times), ms(0.5), ms(0.99), seen[-1] * 1000 if seen else float("nan"),
                                            sum(1 for t in seen if t <= 2.0), missed))
    say("FIGURE discovery: " + figure)
    with open(os.path.join(os.environ.get("BLECONTROL_BLE_OUT", "."), "discovery.txt"), "w") as f:
        f.write(figure + "\n" + " ".join("-" if t is None else "%.3f" % t for t in times) + "\n")
    record(missed == 0, "s2", "every one of %d consecutive scans finds the board (%s)" % (len(times), figure), missed)
    # How often the board advertises now (a figure: its interval, as the
    # emulated controller repeats it; the daemon went slow after 30 s on
    # the air, where bluetoothd honours the advertisement's intervals).
    reports = []

    def count(advertisement):
        if str(advertisement.address) == board:
            reports.append(time.monotonic())
    device.on("advertisement", count)
    await device.start_scanning(legacy=True, active=False, filter_duplicates=False)
    await asyncio.sleep(3.0)
    await device.stop_scanning()
    device.remove_listener("advertisement", count)
    say("FIGURE advertising reports from the board during a 3 s passive scan, %.0f s into this phase: %d (%.1f/s)"
        % (time.monotonic() - phase_started, len(reports), len(reports) / 3.0))


async def link(device, timeout=30.0, attempts=3, name=None, entry=None, **connect_options):
    """Scan (unless `entry`, a scan's result, is given) and connect: returns
    (connection, advertisement entry), None when the board is not found.

    Retried on 0x3E, Connection Failed to be Established: the link layer
    gave up before the first exchange (btvirt's emulated radio, its timing
    slipping under TCG). A phone tries again; so does this central."""
    for attempt in range(attempts):
        entry = entry if attempt == 0 and entry is not None else await scan(device, timeout, name)
        if entry is None:
            return None
        try:
            return await device.connect(entry["address"], timeout=20, **connect_options), entry
        except bumble_core.ConnectionError as error:
            if error.error_code != 0x3E or attempt + 1 == attempts:
                raise
            say("attempt %d: %r (%s)" % (attempt + 1, error, error))
            await asyncio.sleep(1.0)
    return None


async def connect(device, timeout=30.0, attempts=3, name=None, subscribe=True, entry=None, **connect_options):
    """Link (`link`), then discover FFE0/FFE1 by their 16-bit forms and
    subscribe (unless `subscribe` is false: with ble.security authenticated
    the CCC write needs a paired link). Returns (connection, peer,
    characteristic, notifications, advertisement entry), None when the
    board is not found or FFE0/FFE1 never showed up.

    Retried: right after a bluetoothd restart the controller may still carry
    the old advertisement, so a central can connect before the GATT
    application is in BlueZ's database and discover only GAP/GATT."""
    for attempt in range(attempts):
        # link() retries 0x3E itself, from what is left of the budget.
        linked = await link(device, timeout, attempts - attempt, name, entry if attempt == 0 else None, **connect_options)
        if linked is None:
            return None
        connection, entry = linked
        try:
            peer = Peer(connection)
            await peer.discover_services()
            services = peer.get_services_by_uuid(FFE0)
            chars = []
            if services:
                await services[0].discover_characteristics()
                chars = services[0].get_characteristics_by_uuid(FFE1)
            if chars:
                notifications = []
                if subscribe:
                    await chars[0].subscribe(lambda value: notifications.append(bytes(value)))
                return connection, peer, chars[0], notifications, entry
            say("attempt %d: FFE0/FFE1 not in the discovered database" % (attempt + 1))
        except Exception as error:
            say("attempt %d: %r" % (attempt + 1, error))
        await disconnect(device, connection)
        await asyncio.sleep(1.0)
    return None


async def disconnect(device, connection):
    if connection is None:
        return
    try:
        # Bounded: a link the other side already dropped never answers.
        await asyncio.wait_for(connection.disconnect(), 15)
    except Exception as error:
        say("disconnect: %r" % error)


class BumbleLink:
    """One Bumble connection with FFE1 subscribed (rig.ble_scenario's link)."""

    # Characteristic properties (Core 5.3 Vol 3 Part G 3.3.1.1).
    PROPERTIES = ((0x02, "read"), (0x04, "write-without-response"), (0x08, "write"), (0x10, "notify"), (0x20, "indicate"))

    def __init__(self, device, connection, char, notifications):
        self.device, self.connection, self.char = device, connection, char
        self.notifications = notifications
        self.properties = {name for bit, name in self.PROPERTIES if int(char.properties) & bit}
        self.address = connection.self_address.to_string(False)

    async def write(self, data, response):
        await self.char.write_value(data, with_response=response)

    async def close(self):
        await disconnect(self.device, self.connection)


class BumbleCentral:
    """A Bumble host on one btvirt controller (rig.ble_scenario's central)."""

    def __init__(self, device, hci):
        self.device = device
        self.label = "the Bumble central on hci%s" % hci

    async def find(self):
        entry = await scan(self.device)
        return None if entry is None else {"name": entry["name"], "services": entry["uuids"], "entry": entry}

    async def connect(self, found):
        result = await connect(self.device, entry=found["entry"])
        return None if result is None else BumbleLink(self.device, result[0], result[2], result[3])


async def scenario(device):
    """The BLE tier's scenario (rig.ble_scenario) on real BlueZ, then what
    BlueZoo cannot do: a second connection to the same board."""
    async def keep_status(link):
        """The status while connected, kept in the logs; no frame sent."""
        with open(os.path.join(os.environ.get("BLECONTROL_BLE_OUT", "."), "status-ble-connected.json"), "w") as f:
            json.dump(status_cli(), f, indent=1)
        return 0
    if await ble_scenario.scenario(CHECKS, BumbleCentral(device, HCI), NAME, keep_status) is None:
        return
    # Advertising resumes and a second connection works (real BlueZ, unlike
    # BlueZoo, supports reconnecting to the same device).
    result = await connect(device)
    ok = result is not None
    if ok:
        await result[2].write_value(rig.board.enable_frame(1) + rig.board.servo_frame(1, 1000), with_response=True)
        ok = await wait_for(lambda: abs(channel(status(), 1).get("pulse_us", 0) - 2000) < 5)
        await disconnect(device, result[0])
    record(ok, "v14", "advertising resumed: reconnected, two frames in one write -> ch1 2000 us",
           channel(status(), 1) if result else "not found, or FFE1 missing")
    await wait_for(lambda: len(ble_sessions(status())) == 0)


async def two_centrals(device, observer, spacer):
    """Two phones (issue 28), as in the BLE tier (rig.ble_scenario): the
    observer on hci2, the commander on hci1.

    btvirt (emulator/btdev.c, 5.66 and 5.82 alike) numbers the two ends of a
    link apart, each its controller's lowest free handle from 42, then tells
    both hosts the central's number and forwards ACL data under the
    sender's: a link works only where both ends got the same number. The
    board's controller gives its second link 43, so the commander's
    controller must hold 42 already: a link to a third Bumble host (hci3,
    the spacer) that carries nothing. (A real controller has no such limit.)"""
    if not record(observer is not None and spacer is not None, "m1",
                  "Bumble hosts on hci%s (observer) and hci%s (spacer) for the two-centrals phase" % (OBSERVER_HCI, SPACER_HCI)):
        return
    # The scenario's central left channel 0 in failsafe, and only a command
    # for channel 0 from a central, or the operator, ends it (issue 36): the
    # operator does, so this phase starts from a board in no failsafe and
    # its LCD shows the centrals' text, not the failsafe's.
    cleared = subprocess.run([CLI, "failsafe", "clear", "--socket", SOCKET], capture_output=True, text=True, timeout=20)
    ok = cleared.returncode == 0 and await wait_for(lambda: status()["servo"].get("failsafe") is None)
    if not record(ok, "m0", "the scenario's failsafe ended by the operator (blecontrol failsafe clear)",
                  (cleared.returncode, cleared.stdout.strip(), cleared.stderr.strip(), status()["servo"].get("failsafe"))):
        return
    await spacer.start_advertising(auto_restart=False)
    spacing = await device.connect(spacer.random_address, timeout=20)
    try:
        await ble_scenario.two_centrals(CHECKS, BumbleCentral(device, HCI), BumbleCentral(observer, OBSERVER_HCI))
    finally:
        await disconnect(device, spacing)
        await wait_for(lambda: len(ble_sessions(status())) == 0)


def bluez_on_bus():
    out = subprocess.run(["dbus-send", "--system", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
                          "org.freedesktop.DBus.NameHasOwner", "string:org.bluez"], capture_output=True, text=True, timeout=5)
    return "boolean true" in out.stdout


async def restart_bluetoothd(device):
    pidfile = os.environ["BLUETOOTHD_PIDFILE"]
    with open(pidfile) as f:
        pid = int(f.read().strip())
    os.kill(pid, 9)
    ok = await wait_for(lambda: "advertising" not in ble_state(status()), 0.2)
    record(ok, "v15", "bluetoothd killed (SIGKILL): the daemon notices", ble_state(status()))
    log = open(os.environ["BLUETOOTHD_LOG"], "a")
    process = subprocess.Popen(BLUETOOTHD + ["-n", "-d"], stdout=log, stderr=log)
    with open(pidfile, "w") as f:
        f.write(str(process.pid))
    spawned = time.monotonic()
    named = await wait_for(bluez_on_bus, 0.05)
    named_at = time.monotonic()
    if not record(named, "v16", "bluetoothd restarted and owns org.bluez (%.1f s after start)" % (named_at - spawned)):
        return
    control = ControlSocket()
    try:
        # How long it took is a figure, not a pass mark (a loaded machine
        # may take longer); the check is that it registers again.
        ok = await wait_for(lambda: "advertising" in ble_state(control.status()), 0.02)
        took = time.monotonic() - named_at
        record(ok, "v17", "daemon registered again (%.2f s after bluetoothd took org.bluez)" % took,
               ble_state(control.status()))
    finally:
        control.close()
    result = await connect(device)
    ok = result is not None
    if ok:
        connection, peer, char, notifications, entry = result
        await char.write_value(rig.board.enable_frame(3), with_response=True)
        await char.write_value(rig.board.servo_frame(3, 0), with_response=False)
        ok = await wait_for(lambda: abs(channel(status(), 3).get("pulse_us", 0) - 1000) < 5)
        await char.write_value(bytes([0x09, 0x00]), with_response=True)
        ok2 = await wait_for(lambda: bytes([0xFF, 0x01, 0x09]) in notifications)
        ok = ok and ok2
        await disconnect(device, connection)
    record(ok, "v18", "after the bluetoothd restart: new connection, write applied (ch3 1000 us), FF 01 09 notified",
           channel(status(), 3) if result else "not found, or FFE1 missing")


async def start_bluetoothd(args, log_name):
    """Stops bluetoothd (SIGTERM) and starts it with ARGS (besides -n -d);
    waits until the daemon has noticed, then until it advertises again."""
    pidfile = os.environ["BLUETOOTHD_PIDFILE"]
    with open(pidfile) as f:
        pid = int(f.read().strip())
    os.kill(pid, 15)
    await wait_for(lambda: "advertising" not in ble_state(status()), 0.2)
    # Each bluetoothd's log of its own (the 5.82 pass repeats the names).
    log = open(daemon_log(log_name.replace(".log", TAG + ".log")), "w")
    process = subprocess.Popen(BLUETOOTHD + ["-n", "-d"] + args, stdout=log, stderr=log)
    with open(pidfile, "w") as f:
        f.write(str(process.pid))
    return await wait_for(bluez_on_bus, 0.05) and await wait_for(lambda: "advertising" in ble_state(status()), 0.3)


async def switch_bluetoothd(trixie):
    """Debian 13's bluetoothd (5.82, chrooted in $TRIXIE_ROOT, which
    ble_guest.py has mounted /proc, /sys, /dev, a /run with the VM's system
    bus and an empty /var/lib/bluetooth into) in place of Debian 12's, or
    back; started with the package's drop-in arguments."""
    global BLUETOOTHD, BLUEZ_VERSION, TAG
    if trixie:
        BLUETOOTHD = ["chroot", os.environ["TRIXIE_ROOT"], "/usr/libexec/bluetooth/bluetoothd"]
    else:
        BLUETOOTHD = ["/usr/libexec/bluetooth/bluetoothd"]
    BLUEZ_VERSION = subprocess.run(BLUETOOTHD + ["-v"], capture_output=True, text=True, timeout=30).stdout.strip()
    TAG = "@" + BLUEZ_VERSION if trixie else ""
    fixed = os.environ.get("BLUETOOTHD_BLECONTROL_ARGS", "").split()
    if int(open(os.environ["DAEMON_PIDFILE"]).read().strip() or 0) == 0:
        # The peer benchmark stopped the daemon: the default one again.
        await restart_daemon(None, "daemon-ble-%s.log" % BLUEZ_VERSION)
    ok = await start_bluetoothd(fixed, "bluetoothd-%s.log" % BLUEZ_VERSION)
    record(ok, "z1", "bluetoothd %s (%s) started with the drop-in's arguments; the daemon advertises through it"
           % (BLUEZ_VERSION, " ".join(BLUETOOTHD)), ble_state(status()))


def btmon_start(name):
    path = daemon_log("btmon-%s-%s.snoop" % (name, BLUEZ_VERSION))
    try:
        return path, subprocess.Popen(["btmon", "-i", "hci0", "-w", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as error:
        say("btmon: %r" % error)
        return None


def btmon_stop(monitor):
    """Ends the capture; keeps its decoded text and, in the central's log,
    the lines around each SMP Security Request and ATT error."""
    if monitor is None:
        return
    path, process = monitor
    process.terminate()
    process.wait(10)
    text = subprocess.run(["btmon", "-r", path], capture_output=True, text=True, timeout=60).stdout
    with open(path[:-len(".snoop")] + ".txt", "w") as f:
        f.write(text)
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if "Security Request" in line or "Insufficient Authentication" in line]
    for i in marks[:4]:
        say("btmon %s:\n%s" % (os.path.basename(path), "\n".join(lines[max(0, i - 6):i + 4])))


async def phone(device):
    """The iPhone-like central (Tests/VM/phone.py) runs the demo app's
    session against bluetoothd as Debian starts it, where the pop-up must
    show (so the check can see it), then with the package's drop-in for
    bluetooth.service, where nothing may ask the phone for security."""
    import phone as iphone
    p = iphone.shared(device)
    fixed = os.environ.get("BLUETOOTHD_BLECONTROL_ARGS", "").split()
    cases = (("p1", "as Debian starts it", []),
             ("p2", "with the package's drop-in (bluetoothd %s)" % " ".join(fixed), fixed))
    for ident, case, args in cases:
        ok = await start_bluetoothd(args, "bluetoothd-%s.log" % ident)
        if not record(ok, ident + "a", "bluetoothd %s %s; the daemon advertises again" % (BLUEZ_VERSION, case), ble_state(status())):
            continue
        p.reset()
        # The board's HCI traffic, as btmon sees it (the excerpt for the note).
        monitor = btmon_start("p1") if ident == "p1" else None
        address = await p.rotate_address()
        result = await connect(device)
        if not record(result is not None, ident + "b", "iPhone-like central from a new resolvable private address (%s) connects, FFE1 found" % address):
            btmon_stop(monitor)
            continue
        connection, peer, char, notifications, entry = result
        mtu = await peer.request_mtu(185)
        # iOS sets the link's parameters itself (it is the central): a 15 ms
        # interval while an app streams, a 2 s supervision timeout.
        try:
            await asyncio.wait_for(connection.update_parameters(15, 15, 0, 2000), 120)
            updated = "updated"
        except Exception as error:
            updated = repr(error)
        record(mtu == 185 and updated == "updated", ident + "c",
               "ATT MTU 185 negotiated; connection parameters updated to a 15 ms interval, 2 s supervision timeout", (mtu, updated))
        if ident == "p1":
            # The pop-up: bluetoothd reads Battery Level, the phone refuses
            # it (Insufficient Authentication), bluetoothd raises security.
            try:
                await asyncio.wait_for(p.security_event.wait(), 120)
            except asyncio.TimeoutError:
                pass
            record(p.battery.reads > 0 and len(p.security_requests) > 0, ident + "d",
                   "without our settings bluetoothd reads the phone's Battery Level (refused: Insufficient Authentication) "
                   "and sends an SMP Security Request: an iPhone's pairing pop-up (%d reads, %d requests)" % (p.battery.reads, len(p.security_requests)))
            # What a phone that does not answer it sees next (a figure, not
            # a check): its writes with response.
            started = time.monotonic()
            try:
                await asyncio.wait_for(char.write_value(rig.board.enable_frame(0), with_response=True), 10)
                say("FIGURE without the drop-in: a write with response answered %.0f ms after the Security Request went unanswered"
                    % ((time.monotonic() - started) * 1000))
            except Exception as error:
                say("FIGURE without the drop-in: a write with response not answered (%r) while the Security Request goes unanswered" % error)
            await disconnect(device, connection)
            await wait_for(lambda: len(ble_sessions(status())) == 0)
            btmon_stop(monitor)
            continue
        # bluetoothd's plugins read the phone's characteristics in handle
        # order once its discovery is done: Battery Level before PnP ID.
        try:
            await asyncio.wait_for(p.pnp_id.read_event.wait(), 60)
        except asyncio.TimeoutError:
            pass
        record(p.pnp_id.reads > 0, ident + "d", "bluetoothd's GATT client discovered the phone and read its PnP ID "
               "(by then a Battery Level read would have come: none did, %d)" % p.battery.reads, p.pnp_id.reads)
        started = time.monotonic()
        try:
            answered = await iphone.run_session(char, 0.015)
            error = ""
        except Exception as failure:
            answered, error = -1, repr(failure)
        took = time.monotonic() - started

        def applied(report):
            servos = [round(channel(report, ch).get("pulse_us", 0)) for ch in range(4)]
            duties = [channel(report, ch).get("duty", 0) for ch in range(4, 8)]
            switches = [s.get("on") for s in report.get("switches", [])]
            lines = report["lcd"]["lines"]
            # 12-bit PCA9685 counts at 50 Hz are ~4.9 us apart: within 5 us.
            return (all(abs(us - 1600) < 5 for us in servos) and all(d >= 0.999 for d in duties) and switches == [True] * 4
                    and lines[0].startswith("iPhone-like") and lines[1].startswith("central")), servos, duties, switches, lines
        # bluetoothd answers a write request before the daemon has it
        # (docs/protocol.md, "Acknowledgements"): the last LCD line may
        # still be on its way when the answer comes. Wait for it.
        report = await CHECKS.status_when(lambda r: applied(r)[0]) if answered == 10 else status()
        done, servos, duties, switches, lines = applied(report)
        ok = answered == 10 and done
        record(ok, ident + "e", "the demo app's session (writes without response paced at 15 ms, %d answered with response, %.1f s): "
               "servos 1600 us, PWM -500 -> 100 %%, switches on, both LCD lines" % (answered, took),
               CHECKS.explained((error, servos, duties, switches, lines)))
        record(not p.security_requests and p.battery.reads == 0, ident + "f",
               "with the package's drop-in: no Battery Level read and no SMP Security Request in the whole session (no pop-up)",
               (p.battery.reads, len(p.security_requests)))
        await disconnect(device, connection)
        await wait_for(lambda: len(ble_sessions(status())) == 0)
    record(len(set(p.addresses)) == len(p.addresses), "p3", "a different private address for each connection", p.addresses)

    # The same session from an Android-like phone (its public address, MTU
    # 517, a Battery Level anyone may read) and from an old iPhone that
    # never raises the ATT MTU (23: 20 bytes a write, the longest frame of
    # the session fits), through the same bluetoothd with the drop-in.
    from bumble import hci as bumble_hci
    from bumble.gatt import Characteristic
    for ident, what, mtu, options, android in (
            ("p4", "Android-like central (public address, MTU 517, an open Battery Level)", 517,
             {"own_address_type": bumble_hci.OwnAddressType.PUBLIC}, True),
            ("p5", "old iPhone-like central (private address, ATT MTU 23)", None, {}, False)):
        p.reset()
        if android:
            p.battery.permissions = Characteristic.READABLE
        else:
            p.battery.permissions = Characteristic.READ_REQUIRES_AUTHENTICATION
            await p.rotate_address()
        result = await connect(device, **options)
        if not record(result is not None, ident + "a", what + " connects, FFE1 found"):
            continue
        connection, peer, char, notifications, entry = result
        negotiated = await peer.request_mtu(mtu) if mtu else 23
        try:
            answered = await iphone.run_session(char, 0.0075 if mtu else 0.03, ident.encode())
            error = ""
        except Exception as failure:
            answered, error = -1, repr(failure)

        def applied(report):
            servos = [round(channel(report, ch).get("pulse_us", 0)) for ch in range(4)]
            lines = report["lcd"]["lines"]
            return all(abs(us - 1600) < 5 for us in servos) and lines[1].startswith(ident), servos, lines
        # As in p2e: the answer may come before the last line is shown.
        report = await CHECKS.status_when(lambda r: applied(r)[0]) if answered == 10 else status()
        done, servos, lines = applied(report)
        ok = answered == 10 and done and not p.security_requests
        record(ok and negotiated >= (247 if mtu else 23), ident + "b",
               "%s: the demo app's session at ATT MTU %d, %d writes answered, servos 1600 us, the LCD lines, no Security Request"
               % (what, negotiated, answered), CHECKS.explained((error, servos, lines, len(p.security_requests))))
        await disconnect(device, connection)
        await wait_for(lambda: len(ble_sessions(status())) == 0)



def daemon_log(name):
    return os.path.join(os.environ.get("BLECONTROL_BLE_OUT", "."), name)


async def restart_daemon(board, log_name):
    """Stops the daemon (SIGTERM) and starts it again with BOARD; waits until
    it advertises. The pid goes to $DAEMON_PIDFILE for ble_guest.py."""
    pidfile = os.environ["DAEMON_PIDFILE"]
    pid = int(open(pidfile).read().strip())
    # 0: the peer benchmark stopped it already (and kill(0) would signal
    # this whole process group).
    if pid > 0:
        os.kill(pid, 15)

    def gone():
        try:
            return open("/proc/%d/stat" % pid).read().split(") ")[1][0] in "ZX"
        except OSError:
            return True
    await wait_for(gone, 0.1)
    log = open(daemon_log(log_name.replace(".log", TAG + ".log")), "w")
    args = [os.environ["DAEMON"], "--socket", SOCKET, "--tcp", "127.0.0.1:0"] + (["--board", board] if board else [])
    process = subprocess.Popen(args, stdout=log, stderr=log)
    with open(pidfile, "w") as f:
        f.write(str(process.pid))
    return await wait_for(lambda: "advertising" in ble_state(status()), 0.3)


async def acquiring_write(char):
    """The write that makes bluetoothd acquire the socket, and what became of it.

    bluetoothd 5.66 passes that write on once the board has answered, from
    its ATT receive buffer (its pending write keeps a pointer, not a copy:
    docs/protocol.md, ble.acquire_write). If bluetoothd read another ATT
    packet meanwhile, as it does on a busy machine while discovering this
    central's services, the board gets that packet's bytes. So the first
    write is INIT, whose loss costs nothing, and this returns once the board
    has dealt with it (decoded, refused, or dropped as partial): the frames
    after it start clean. (The AcquireWrite benchmark once sent its enable
    frame first and lost it: its channel never moved, ci32.)"""
    def handled(counters):
        return counters["frames"] + counters["errors"] + counters["discarded_partials"]
    before = status()["counters"]
    await char.write_value(rig.board.init_frame(), with_response=True)
    def counters_once_handled():
        counters = status()["counters"]
        return counters if handled(counters) > handled(before) else None
    after = await wait_for(counters_once_handled)
    if after is None:
        return "not dealt with by the board within the wait (counters before %s)" % before
    if after["frames"] == before["frames"] + 1 and handled(after) == handled(before) + 1:
        return "arrived intact"
    return "replaced by other bytes (counters before %s, after %s)" % (before, after)


async def acquire(device):
    """The daemon with ble.acquire_write: true (the WriteAcquired property):
    bluetoothd acquires the write socket on the first write command and
    sends every later write to FFE1 through it."""
    board = os.environ.get("BOARD_ACQUIRE")
    ok = await restart_daemon(board, "daemon-ble-acquire.log")
    if not record(ok, "v20", "daemon restarted with ble.acquire_write: true, advertising", ble_state(status())):
        return
    result = await connect(device)
    if not record(result is not None, "v21", "connected to the AcquireWrite daemon, FFE1 subscribed"):
        return
    connection, peer, char, notifications, entry = result
    outcome = await acquiring_write(char)
    say("FIGURE the write that made bluetoothd acquire the socket (INIT 00 00): " + outcome)
    notifications.clear()
    await char.write_value(rig.board.enable_frame(0), with_response=True)
    await char.write_value(rig.board.servo_frame(0, 200), with_response=False)  # ch0 200 -> 1200 us
    ok = await wait_for(lambda: abs(channel(status(), 0).get("pulse_us", 0) - 1200) < 5)
    text = open(daemon_log("daemon-ble-acquire.log"), errors="replace").read()
    report = status()
    record(ok and "AcquireWrite from" in text, "v22",
           "write command -> bluetoothd called AcquireWrite (daemon log) and the frame came through the socket -> ch0 1200 us",
           (channel(report, 0), ble_sessions(report), [l for l in text.splitlines() if "Acquire" in l][:2]))
    # A frame split over two write commands, through the socket.
    split = rig.board.servo_frame(0, 1000)  # ch0 1000 -> 2000 us
    await char.write_value(split[:3], with_response=False)
    await char.write_value(split[3:], with_response=False)
    ok = await wait_for(lambda: abs(channel(status(), 0).get("pulse_us", 0) - 2000) < 5)
    record(ok, "v23", "SERVO_VAL split over two write commands reassembled -> ch0 2000 us", channel(status(), 0))
    await char.write_value(bytes([0x09, 0x00]), with_response=False)
    ok = await wait_for(lambda: bytes([0xFF, 0x01, 0x09]) in notifications)
    record(ok, "v24", "unknown command 09 00 through the acquired socket -> notification FF 01 09", [n.hex() for n in notifications])
    await disconnect(device, connection)
    ok = await wait_for(lambda: len(ble_sessions(status())) == 0)
    record(ok, "v25", "disconnect (acquired socket closed) -> session ended", ble_sessions(status()))


async def acknowledgements(device):
    """Is a write *with* response acknowledged before or after it is applied,
    through bluetoothd 5.66? The daemon runs a board whose emulated bus
    takes 10 ms a byte (the most a board file allows). The central writes
    both LCD lines in one write with response and reads the status the
    moment the acknowledgement arrives: the second line shows only once
    the first one has been drawn, well over a second after the write
    reached the daemon, the margin an early acknowledgement has on a busy
    host.

    BlueZ's src/gatt-database.c (chrc_write_cb): for a characteristic that
    also has write-without-response, the WriteValue call goes out with no
    pending-write queue, so the ATT write response is sent at once; without
    that property bluetoothd waits for our reply. So: early with the HM-10
    layout (the default), after "applied" with ble.acknowledged_writes."""
    text = b"Applied yet?"
    for board, case, early, ident in ((os.environ.get("BOARD_SLOW"), "FFE1 with write-without-response (default)", True, "v26"),
                                      (os.environ.get("BOARD_SLOW_STRICT"), "ble.acknowledged_writes: true", False, "v28")):
        if not record(bool(board) and await restart_daemon(board, "daemon-ble-ack-%s.log" % ident), ident,
                      "daemon restarted on a slow emulated bus (%s), advertising" % case, ble_state(status())):
            continue
        result = await connect(device)
        if not record(result is not None, ident + "a", "connected (%s)" % case):
            continue
        connection, peer, char, notifications, entry = result
        # As an iPhone: the two frames (35 bytes) then go in one Write
        # Request, not a long write (Prepare/Execute) that bluetoothd
        # acknowledges by another path.
        mtu = await peer.request_mtu(185)
        props = int(char.properties)
        if not early:
            record(props & 0x04 == 0 and props & 0x08, ident + "b", "FFE1 offers write but not write-without-response", hex(props))
        # The LCD is read through a control socket opened beforehand: one
        # JSON line each way, a few milliseconds, where starting
        # `blecontrol status` takes longer under TCG than the slow bus
        # takes to show the line (which made the early case pass or fail by
        # the machine's load).
        control = ControlSocket()
        control.status()
        started = time.monotonic()
        await char.write_value(rig.board.lcd_text_frame(0, b"Written, then..") + rig.board.lcd_text_frame(1, text), with_response=True)
        acked = time.monotonic() - started
        shown = control.status()["lcd"]["lines"][1].startswith(text.decode())
        control.sock.close()
        # 38 bytes of ATT MTU: the 35 bytes went in one Write Request.
        if early:
            record(not shown and mtu >= 38, ident + "c", "bluetoothd acknowledged the write request BEFORE it was applied (%.0f ms, ATT MTU %d; the text was not on the LCD yet)"
                   % (acked * 1000, mtu), "shown at acknowledgement" if shown else "")
        else:
            record(shown and mtu >= 38, ident + "c", "bluetoothd acknowledged the write request only once applied (%.0f ms, ATT MTU %d; the text was on the LCD)"
                   % (acked * 1000, mtu), status()["lcd"]["lines"])
        await wait_for(lambda: status()["lcd"]["lines"][1].startswith(text.decode()))
        await disconnect(device, connection)
        await wait_for(lambda: len(ble_sessions(status())) == 0)


async def open_central(stack, hci, name, address):
    """A Bumble host on hciHCI through the HCI user channel, powered on."""
    source, sink = await stack.enter_async_context(await open_transport("hci-socket:" + hci))
    device = Device.with_hci(name, Address(address), source, sink)
    await device.power_on()
    return device


async def main():
    say("bumble imported in %.1f s" % IMPORT_SECONDS)
    async with contextlib.AsyncExitStack() as stack:
        device = await open_central(stack, HCI, "blecontrol-vm-central", "F0:F1:F2:F3:F4:F5")
        observer = await open_central(stack, OBSERVER_HCI, "blecontrol-vm-observer", "F0:F1:F2:F3:F4:F6") if OBSERVER_HCI else None
        spacer = await open_central(stack, SPACER_HCI, "blecontrol-vm-spacer", "F0:F1:F2:F3:F4:F7") if SPACER_HCI else None
        ready = os.environ.get("BLECONTROL_BLE_READY")
        if ready:
            open(ready, "w").close()
        say("%s held; waiting for the daemon" % ", ".join("hci" + n for n in (HCI, OBSERVER_HCI, SPACER_HCI) if n))
        phases = sys.argv[1:] or ["scenario", "restart"]
        # ble_guest.py starts the bus, bluetoothd and the daemon once hci1 is
        # held: every phase starts with them there. Bounded at 180 s (a guard
        # against a hang: on a busy machine the daemon may wait that long for
        # bluetoothd to list hci0).
        await wait_for(lambda: os.path.exists(os.environ.get("DAEMON_PIDFILE", "/")) and os.path.exists(os.environ.get("BLUETOOTHD_PIDFILE", "/"))
                       and "advertising" in ble_state(status()), 0.5, patience=180)
        for phase in phases:
            say("phase " + phase)
            try:
                if phase == "scenario":
                    await scenario(device)
                elif phase == "two-centrals":
                    await two_centrals(device, observer, spacer)
                elif phase == "restart":
                    await restart_bluetoothd(device)
                elif phase == "acquire":
                    await acquire(device)
                elif phase == "ack":
                    await acknowledgements(device)
                elif phase == "phone":
                    await phone(device)
                elif phase == "discovery":
                    await discovery(device)
                elif phase in ("bluez-5.82", "bluez-5.66"):
                    await switch_bluetoothd(phase == "bluez-5.82")
                elif phase in ("reconnect", "pair"):
                    import phone as iphone
                    import phone_links
                    run = phone_links.link_loss if phase == "reconnect" else phone_links.pairing
                    await run(device, sys.modules[__name__], iphone.shared(device))
                elif phase == "bench-phone":
                    import ble_bench
                    await ble_bench.run_phone(device, sys.modules[__name__])
                elif phase == "bench-peer":
                    import ble_bench
                    await ble_bench.run_peer(device, sys.modules[__name__])
                elif phase.startswith("bench"):
                    import ble_bench
                    await ble_bench.run(device, sys.modules[__name__], phase)
            except (Exception, asyncio.CancelledError) as error:
                # CancelledError too: Bumble cancels a request whose link
                # dropped, and one phase's failure must not end the others.
                import traceback
                traceback.print_exc()
                # Bumble's errors carry their HCI or ATT name in str, not repr.
                record(False, "v-" + phase, "central phase '%s' ran to its end" % phase, "%r: %s" % (error, error))
    return failures


def note_cpu() -> None:
    """Its own CPU (Python and Bumble, not the commands it starts) for the
    guest's INFO line: the part that a central on the host would not spend
    under TCG."""
    import resource
    own = resource.getrusage(resource.RUSAGE_SELF)
    out = os.environ.get("BLECONTROL_BLE_OUT")
    if out:
        Path(out, "ble-central-cpu.txt").write_text("%.0f core-s in %.0f s (Bumble imported in %.0f s)\n"
                                                  % (own.ru_utime + own.ru_stime, time.monotonic() - started, IMPORT_SECONDS))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        sys.exit(1 if asyncio.run(main()) else 0)
    finally:
        note_cpu()
