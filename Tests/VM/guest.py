#!/usr/bin/python3
"""The checks inside the VM that Tests/VM/run boots (as root, on the host's
root file system mounted read-only; only OUT is writable, plus the guest's
own tmpfs /run; /tmp is the host's, read-only). Sets up a real /dev/i2c-N
(i2c-stub + i2c-dev) and a real GPIO chip (gpio-sim through configfs), then
runs the checks. Each check appends one line to OUT/results.txt:
`PASS id: what` or `FAIL id: what: why`. Then, when asked, the peer
comparison (Tests/VM/peers.sh) and the BLE checks (Tests/VM/ble_guest.py),
which append their own lines; OUT/guest-done at the end says it got there.

Usage: /usr/bin/python3 guest.py OUT   (OUT/guest.env is written by Tests/VM/run)

Every wait is a bounded count of polls, a guard against a hang, never a
time limit: TCG on a busy machine is slow.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.dont_write_bytecode = True  # the root file system is read-only here
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vmrig import (Daemon, GpioSim, I2CBus, SYSTEM_PATH, busy_core_seconds, command_why, make_work_dir, mount,  # noqa: E402
                   read_env_file, rig, signal_pid, status_holds, tail)

WORK = Path("/run/blecontrol-vm")


def say(what: str) -> None:
    print(f"[guest {time.strftime('%H:%M:%S')}] {what}", flush=True)


class Guest:
    def __init__(self, out: Path) -> None:
        self.out = out
        env = read_env_file(out / "guest.env")
        self.repo = Path(env["REPO"])
        self.daemon_bin = env["DAEMON"]
        self.cli_bin = env["CLI"]
        self.gpio_sim_ko = env["GPIO_SIM_KO"]
        self.peers = env.get("PEERS", "0") == "1"
        self.ble = env.get("BLE", "0") == "1"
        self.results_path = out / "results.txt"
        # ble_guest.py, a process of its own, appends to it too.
        self.results = rig.Results(self.results_path)
        self.bus: "I2CBus | None" = None
        self.sim = GpioSim("blecontrol")
        self.socket = str(WORK / "control.sock")
        self.daemon = Daemon(self.daemon_bin, self.cli_bin, self.socket)
        self.board = WORK / "board-vm.yaml"

    def check(self, check_id: str, what: str, fn, *args, **kwargs) -> bool:
        return self.results.check(check_id, what, fn, *args, **kwargs)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return self.daemon.cli(*args)

    # --- The Raspberry Pi board file where its devices are missing --------------
    # Before any I2C module is loaded there is no /dev/i2c-1 and no line
    # GPIO17: the daemon must refuse with a message and an exit status, not
    # crash or hang.
    def rpi_board_fails_clearly(self) -> "str | None":
        log = self.out / "daemon-rpi.log"
        status = rig.run_logged(["timeout", "30", self.daemon_bin, "--board", self.repo / "board/raspberry-pi.yaml",
                             "--socket", WORK / "rpi.sock"], log)
        if not 1 <= status < 124:
            return f"exit status {status}: {tail(log, 2)}"
        if not re.search(r"i2c-1|GPIO17|gpiochip0", log.read_text(errors="replace")):
            return f"no word of the missing device: {tail(log, 2)}"
        return None

    # --- I2C: i2c-stub answers at the PCA9685's and the LCD backpack's addresses --
    def setup_i2c(self) -> "str | None":
        for module in (["i2c-stub", "chip_addr=0x40,0x41,0x27"], ["i2c-dev"]):
            if why := command_why(["modprobe", *module]):
                return why
        # Found by name: QEMU's own SMBus controller may take i2c-0.
        number = ""
        for device in sorted(Path("/sys/bus/i2c/devices").glob("i2c-*")):
            if (device / "name").read_text().strip() == "SMBus stub driver":
                number = device.name.removeprefix("i2c-")
        if not number:
            return "no adapter named 'SMBus stub driver'"
        self.bus = I2CBus(number)
        if not rig.wait_until(lambda: Path(f"/dev/i2c-{number}").is_char_device(), interval=0.1):
            return f"/dev/i2c-{number} did not appear"
        return None

    # --- GPIO: a gpio-sim chip with one bank of 8 lines ---------------------------
    def setup_gpio(self) -> "str | None":
        if why := command_why(["modprobe", "configfs"]):
            return why
        if not mount("configfs", "/sys/kernel/config"):
            return "configfs cannot be mounted on /sys/kernel/config"
        if not Path(self.gpio_sim_ko).is_file():
            return (f"{self.gpio_sim_ko} is not visible in the guest "
                    "(virtme covers /var/cache, /var/tmp, /var/log with tmpfs)")
        if why := command_why(["insmod", self.gpio_sim_ko]):
            return why
        self.sim.create(8, {0: "status-led"})
        if not Path(f"/dev/{self.sim.chip}").is_char_device():
            return f"/dev/{self.sim.chip} missing"
        if not os.access(self.sim.value_file(0), os.R_OK):
            return "sim_gpio0/value missing"
        return None

    # --- (a) i2c-stub sanity through i2c-tools -------------------------------------
    def i2c_sanity(self) -> None:
        bus = self.bus
        self.check("a1", "byte write then read back at 0x40",
                   lambda: bus.set(0x40, 0x10, 0xa5) and bus.value(0x40, 0x10) == 0xa5)
        self.check("a2", "word write then read back at 0x27",
                   lambda: bus.set(0x27, 0x20, 0x1234, mode="w") and bus.value(0x27, 0x20, "w") == 0x1234)
        self.check("a3", "I2C block write lands in consecutive registers",
                   lambda: bus.set(0x40, 0x30, 0x01, 0x02, 0x03, mode="i") and bus.value(0x40, 0x32) == 3)
        self.check("a4", "absent address 0x26 does not acknowledge", lambda: not bus.acknowledges(0x26, 0x00))
        funcs = self.out / "i2c-funcs.txt"
        rig.run_logged(["i2cdetect", "-F", bus.number], funcs)
        # The stub is SMBus only: our backend must fall back from I2C_RDWR.
        self.check("a5", "stub adapter lacks plain I2C (the daemon must use its SMBus fallback)",
                   lambda: re.search(r"^I2C +no", funcs.read_text(), re.M) is not None)
        for register in (0x10, 0x20, 0x21, 0x30, 0x31, 0x32):
            bus.set(0x40, register, 0)
            bus.set(0x27, register, 0)

    # --- (g) gpio-sim sanity through libgpiod's tools (lines 1 and 2; 0 is the LED) --
    def gpio_output_seen(self) -> "str | None":
        """A line held high by gpioset reads 1 on the sim side; released, 0."""
        help_text = rig.run(["gpioset", "--help"], check=False, capture=True)
        if "--mode" in help_text.stdout + help_text.stderr:
            holder = ["gpioset", "--mode=signal", self.sim.chip, "1=1"]   # libgpiod 1.x
        else:
            holder = ["gpioset", "-c", self.sim.chip, "1=1"]              # libgpiod 2.x holds by default
        process = subprocess.Popen(holder)
        try:
            def high() -> "str | None":
                value = self.sim.value(1)
                return None if value == "1" else f"held high, sim_gpio1/value reads {value}"
            if why := rig.poll(high, interval=0.1):
                return why
        finally:
            process.terminate()
            process.wait()
        value = self.sim.value(1)
        if value != "0":
            return f"released, sim_gpio1/value reads {value} (want its pull-down)"
        return None

    def gpio_input_seen(self) -> "str | None":
        """The sim side's pull is what a reader of the line sees."""
        help_text = rig.run(["gpioget", "--help"], check=False, capture=True)
        if "--chip" in help_text.stdout + help_text.stderr:
            reader = ["gpioget", "--numeric", "-c", self.sim.chip, "2"]   # libgpiod 2.x
        else:
            reader = ["gpioget", self.sim.chip, "2"]                      # libgpiod 1.x

        def read_line() -> str:
            return rig.run(reader, check=False, capture=True).stdout.strip()
        self.sim.pull(2, "pull-up")
        up = read_line()
        self.sim.pull(2, "pull-down")
        down = read_line()
        if up != "1" or down != "0":
            return f"pull-up read {up}, pull-down read {down}"
        return None

    # --- (b) the daemon's Linux backends against the stub and the simulated chip ---
    def write_board(self, path: Path, lcd_address: str) -> None:
        chip = self.sim.chip
        channels = "".join(f"    - {{ channel: {n}, output: {n}, role: servo, min_us: 1000, max_us: 2000 }}\n"
                           for n in range(8))
        path.write_text(f"""\
# Generated by Tests/VM/guest.py: i2c-stub bus, gpio-sim LED.
name: vm-stub
buses:
  stub:
    device: /dev/i2c-{self.bus.number}
servo:
  bus: stub
  address: 0x40
  frequency_hz: 50
  oscillator_hz: 25000000
  output_drive: totem-pole
  channels:
{channels}lcd:
  bus: stub
  address: {lcd_address}
  columns: 16
  rows: 2
  pins: {{ rs: 0, rw: 1, e: 2, backlight: 3, d4: 4, d5: 5, d6: 6, d7: 7 }}
  chars_per_transaction: 4
led:
  chip: {chip}
  line: 0
switches:
  - {{ switch: 0, chip: {chip}, line: 1 }}
  - {{ switch: 1, chip: {chip}, line: 2 }}
  - {{ switch: 2, chip: {chip}, line: 3, safe: on }}
  - {{ switch: 3, chip: {chip}, line: 4 }}
ble:
  enabled: false
transports:
  tcp:
    enabled: true
    listen: 127.0.0.1:0
control:
  socket: {self.socket}
""")

    def led_toggles(self) -> "str | None":
        """The LED line must change while the daemon holds it (slow blink)."""
        seen: set[str] = set()

        def both() -> bool:
            seen.add(self.sim.value(0))
            return {"0", "1"} <= seen
        if rig.wait_until(both, interval=0.1):
            return None
        return f"sampled only: {' '.join(sorted(seen & {'0', '1'}))}"

    @staticmethod
    def consumer_is(consumer: "str | None") -> "str | None":
        """The LED line's consumer as debugfs shows it (None: no blecontrold)."""
        table = Path("/sys/kernel/debug/gpio").read_text()
        if consumer is None:
            return "blecontrold still holds a line" if "blecontrold" in table else None
        return None if consumer in table else table

    def poison_led0(self) -> None:
        for register in (0x06, 0x07, 0x08, 0x09):
            self.bus.set(0x40, register, 0xee)

    def servo_lands(self) -> "str | None":
        """LED0_ON = 0, LED0_OFF = 307 (1500 µs of a 50 Hz frame, 25 MHz, prescale 121)."""
        bus = self.bus
        return (bus.wait_for(0x40, 0x08, 0x33) or bus.expect(0x40, 0x09, 0x01)
                or bus.expect(0x40, 0x06, 0x00) or bus.expect(0x40, 0x07, 0x00))

    def mode1_awake(self) -> "str | None":
        """PCA9685 MODE1 bit 4 (SLEEP) clear: the oscillator runs (datasheet 7.3.1)."""
        mode1 = self.bus.value(0x40, 0x00)
        if mode1 is None or mode1 & 0x10:
            return f"MODE1 = {self.bus.get(0x40, 0x00)}"
        return None

    def cli_ok(self, *args: str) -> "str | None":
        result = self.cli(*args)
        return None if result.returncode == 0 else f"blecontrol {' '.join(args)}: {(result.stdout + result.stderr).strip()}"

    def servo_command_lands(self) -> "str | None":
        return self.cli_ok("enable", "0", "on") or self.cli_ok("servo", "0", "500") or self.servo_lands()

    def status_holds(self, expression: str) -> "str | None":
        """The expression over the status `s` becomes true (the outputs and
        the LCD are the daemon's threads' to write: polled, never looked at
        once)."""
        return status_holds(self.daemon, expression)

    def save_status(self, name: str) -> None:
        result = self.cli("status", "--json")
        (self.out / name).write_text(result.stdout + result.stderr)

    def start_or_why(self, board: Path, log: str, **kwargs) -> "str | None":
        return self.daemon.start(str(board), self.out / log, **kwargs)

    def run_daemon_checks(self) -> None:
        bus = self.bus
        board, board_absent = self.board, WORK / "board-vm-lcd-absent.yaml"
        self.write_board(board, "0x27")
        self.write_board(board_absent, "0x26")
        for path in (board, board_absent):
            (self.out / path.name).write_bytes(path.read_bytes())
        self.check("b0", "board file for the VM is valid",
                   command_why, [self.daemon_bin, "--board", board, "--check-board"])

        # Poison what the daemon must write, so a pass proves it wrote it.
        bus.set(0x40, 0xfd, 0x00)
        bus.set(0x40, 0xfe, 0x00)
        bus.set(0x40, 0x00, 0x00)
        self.poison_led0()
        started = f"daemon starts on /dev/i2c-{bus.number} and {self.sim.chip}"
        if why := self.start_or_why(board, "daemon-1.log"):
            self.results.fails("b1", started, why)
            self.results.fails("b", "remaining daemon checks", "not run: the daemon did not start")
            return
        self.results.passes("b1", started)
        self.check("b2", "startup all-off: ALL_LED_OFF_H (0xFD) = 0x10", bus.wait_for, 0x40, 0xfd, 0x10)
        self.check("b3", "PRE_SCALE (0xFE) = 121 (50 Hz at 25 MHz)", bus.expect, 0x40, 0xfe, 0x79)
        self.check("b4", "MODE1 awake (SLEEP bit clear)", self.mode1_awake)
        self.check("b5", "enable 0 on + servo 0 500: LED0_ON = 0, LED0_OFF = 307 (0x133)", self.servo_command_lands)
        self.check("b6", "status: channel 0 enabled, pulse about 1500 µs", self.status_holds,
                   's["channels"][0]["enabled"] and 1490 <= s["channels"][0]["pulse_us"] <= 1510')
        self.check("b7", "status: LCD at 0x27 online", self.status_holds, 's["lcd"]["online"] is True')
        self.cli("lcd", "0", "Hello")
        self.check("b8", "lcd 0 Hello reaches the framebuffer", self.status_holds,
                   's["lcd"]["lines"][0].startswith("Hello")')
        self.check("b9", "LED line held by consumer blecontrold", self.consumer_is, "blecontrold")
        self.check("b10", "LED line toggles (both 0 and 1 seen on sim_gpio0)", self.led_toggles)
        self.save_status("status-1.json")
        bus.set(0x40, 0xfd, 0x00)
        self.check("b11", "SIGTERM: daemon exits 0", self.daemon.stop)
        self.check("b12", "shutdown: all outputs off again (0xFD = 0x10)", bus.expect, 0x40, 0xfd, 0x10)
        self.check("b13", "shutdown: chip not put to sleep (MODE1 SLEEP clear)", self.mode1_awake)
        self.check("b14", "LED line released after exit", self.consumer_is, None)

        # The LCD at an address nothing answers at: the daemon keeps going.
        self.poison_led0()
        if why := self.start_or_why(board_absent, "daemon-2.log"):
            self.results.fails("b20", "daemon starts with the LCD at absent 0x26", why)
            return
        self.results.passes("b20", "daemon starts with the LCD at absent 0x26")
        # Synchronised on the daemon's own report that the LCD failed, not on a
        # pause: once status says so, the failure was met, and the daemon must
        # have lived through it.
        self.check("b22", "status: LCD offline with an error", self.status_holds,
                   's["lcd"]["online"] is False and bool(s["lcd"].get("error"))')
        self.check("b21", "daemon still running after it reported the LCD's failure", self.daemon.running)
        self.poison_led0()
        self.check("b23", "servo write still lands with the LCD offline", self.servo_command_lands)
        self.save_status("status-2.json")
        self.check("b24", "SIGTERM: daemon exits 0", self.daemon.stop)

        # Probed about once a second all along, but reported once.
        def logged_once() -> "str | None":
            lines = (self.out / "daemon-2.log").read_text(errors="replace").splitlines()
            count = sum(1 for line in lines if re.search(r"lcd.*offline", line, re.I))
            return None if count == 1 else f"{count} lines about the LCD offline"
        self.check("b25", "the LCD's failure logged once, not per probe", logged_once)

    # --- (d) a crash and safe-outputs (issue #5), doctor (issue #6), and the
    # Linux backends' own tests against the real kernel interfaces (issue #3) ---
    def run_recovery_checks(self) -> None:
        bus, board = self.bus, self.board
        self.poison_led0()
        if why := self.start_or_why(board, "daemon-3.log"):
            self.results.fails("d1", "daemon starts for the crash test", why)
            return
        self.check("d1", "servo 0 500 lands before the crash", self.servo_command_lands)
        self.daemon.kill()
        # After kill -9 nothing switched the chip off: the motor would keep going.
        self.check("d2", "kill -9: the chip keeps producing the last pulse (LED0_OFF_L = 0x33)",
                   bus.expect, 0x40, 0x08, 0x33)
        bus.set(0x40, 0xfd, 0x00)
        self.check("d3", "safe-outputs after the crash exits 0",
                   command_why, [self.daemon_bin, "safe-outputs", "--board", board])
        self.check("d4", "safe-outputs: every output off with one write (0xFD = 0x10)", bus.expect, 0x40, 0xfd, 0x10)
        self.check("d5", "safe-outputs does not sleep the chip (MODE1 SLEEP clear)", self.mode1_awake)

        if why := self.start_or_why(board, "daemon-4.log"):
            self.results.fails("d6", "doctor against a running daemon", why)
        else:
            doctor = self.out / "doctor.txt"
            rig.run_logged([self.cli_bin, "doctor", "--board", board, "--socket", self.socket], doctor)

            def doctor_sees_devices() -> "str | None":
                text = doctor.read_text(errors="replace")
                if all(re.search(pattern, text, re.M) for pattern in
                       (r"^ *OK +bus ", r"^ *OK +PCA9685 0x40", r"^ *OK +LCD backpack 0x27")):
                    return None
                return " ".join([line for line in text.splitlines() if re.search("FAIL|WARN", line)][:3]) or False
            self.check("d6", "doctor: the bus, the PCA9685 and the LCD backpack answer", doctor_sees_devices)
            self.check("d7", "doctor: the daemon and its servo path are reported online",
                       lambda: re.search(r"^ *OK +servo path: PCA9685 online", doctor.read_text(), re.M) is not None)
            self.daemon.stop()

        bundle = Path(self.daemon_bin).parent / "BLEControlPackageTests.xctest"
        if os.access(bundle, os.X_OK):
            log = self.out / "linux-hardware-tests.log"
            sysfs = self.sim.sysfs()
            rig.run_logged([bundle, "--testing-library", "swift-testing", "--filter", "LinuxHardwareTests"],
                       log, env={
                        **os.environ, "BLC_TEST_I2C_BUS": f"/dev/i2c-{bus.number}",
                        "BLC_TEST_GPIOSIM_CHIP": f"/dev/{self.sim.chip}", "BLC_TEST_GPIOSIM_SYSFS": str(sysfs),
                        "BLC_TEST_GPIOSIM_LINE_NAME": "status-led", "BLC_TEST_GPIOSIM_LINE_OFFSET": "0",
                        "TMPDIR": str(WORK)})

            def all_ran_and_passed() -> "str | None":
                text = log.read_text(errors="replace")
                if re.search(r"Test run with .* passed", text) and "skipped" not in text:
                    return None
                return " ".join([line for line in text.splitlines() if re.search("failed|skipped|error", line)][:3]) or False
            self.check("d8", "LinuxHardwareTests against i2c-stub and gpio-sim: none skipped, all pass", all_ran_and_passed)
        else:
            self.results.fails("d8", "LinuxHardwareTests in the VM", f"no test bundle at {bundle} (build with --build-tests)")

    # --- (e) switches on gpio-sim, one instance per board, signals (issues 12, 13) --
    def switch_lines_are(self, *want: str) -> "str | None":
        """gpio-sim lines 1-4 read these (polled: the daemon writes them on its own thread)."""
        def equal() -> "str | None":
            got = tuple(self.sim.value(line) for line in (1, 2, 3, 4))
            return None if got == want else f"lines 1-4 read {' '.join(got)}, want {' '.join(want)}"
        return rig.poll(equal, interval=0.1)

    def central_leaves(self) -> None:
        """A TCP central commands switch 3 (on, as it is) and goes away: the
        central in control of an output left (one that only observed would
        not take the failsafe with it)."""
        with socket.create_connection(("127.0.0.1", self.daemon.tcp_port())) as central:
            central.sendall(bytes([6, 2, 3, 1]))

    def second_instance_refused(self) -> "str | None":
        result = rig.run(["timeout", "30", self.daemon_bin, "--board", self.board,
                          "--socket", WORK / "second.sock"], check=False, capture=True)
        out = (result.stdout + result.stderr).strip()
        if result.returncode != 1:
            return f"second daemon exit status {result.returncode}: {out}"
        if "already runs this board" not in out:
            return f"no word of the lock: {out}"
        return None

    def unknown_switch_refused(self) -> "str | None":
        result = self.cli("switch", "9", "on")
        if result.returncode == 1 and "ERROR for command 6" in result.stdout:
            return None
        return f"exit status {result.returncode}: {result.stdout} {result.stderr}"

    def signal_stops_all_off(self, sig: int) -> "str | None":
        """The daemon exits 0 on sig with every output off."""
        self.bus.set(0x40, 0xfd, 0x00)
        return self.daemon.stop(sig) or self.bus.expect(0x40, 0xfd, 0x10)

    def run_safety_checks(self) -> None:
        bus, board = self.bus, self.board
        if why := self.start_or_why(board, "daemon-5.log"):
            self.results.fails("e1", "daemon starts for the switch and safety checks", why)
            return
        for switch, state in (("0", "on"), ("1", "off"), ("2", "on"), ("3", "on")):
            self.cli("switch", switch, state)
        self.check("e1", "SWITCH_VAL through libgpiod: gpio-sim lines 1-4 read 1 0 1 1",
                   self.switch_lines_are, "1", "0", "1", "1")
        self.check("e2", "switch 9 is not on this board: ERROR 06, exit status 1", self.unknown_switch_refused)
        self.check("e3", "status lists the four switches with their lines", self.status_holds,
                   '[w["on"] for w in s["switches"]] == [True, False, True, True] and s["switches"][0]["output"].endswith(":1")')
        try:
            self.central_leaves()
        except (OSError, rig.Failure) as error:
            say(f"the TCP central could not connect: {error}")
        self.check("e4", "the central in control of switch 3 leaves: failsafe, every switch to its safe state (2 stays on)",
                   self.switch_lines_are, "0", "0", "1", "0")

        # A second daemon for the same board: refused before it opens the bus.
        bus.set(0x40, 0xfd, 0x00)
        self.poison_led0()
        self.check("e5", "a second blecontrold for the same board exits 1 naming the lock", self.second_instance_refused)
        self.check("e6", "… without writing to the bus (ALL_LED_OFF_H and LED0 untouched)",
                   lambda: bus.value(0x40, 0xfd) == 0 and bus.value(0x40, 0x08) == 0xee)

        # SIGHUP with the same file: reloaded, nothing changes; the daemon runs on.
        self.cli("enable", "0", "on")
        self.cli("servo", "0", "500")
        signal_pid(self.daemon.pid, signal.SIGHUP)
        self.check("e7", "SIGHUP reloads the board file and the daemon runs on", self.status_holds,
                   's["configuration"]["reloads"] == 1 and s["configuration"]["last_reload"].startswith("applied")')
        self.check("e8", "… the servo output kept its pulse (LED0_OFF = 307)", bus.expect, 0x40, 0x08, 0x33)
        # SIGUSR1 would end a daemon by default: here it stops it, outputs off.
        self.check("e9", "SIGUSR1: exit 0 through the all-off path (0xFD = 0x10)", self.signal_stops_all_off, signal.SIGUSR1)

    # --- (e) the wall clock steps back an hour (issue 12): a Pi has no RTC and --
    # NTP steps its clock. Every wait in the daemon is on the monotonic clock, so
    # the watchdog pings and the silence failsafe carry on as if nothing
    # happened; a wait on CLOCK_REALTIME would sleep the extra hour. Only this
    # VM's clock is stepped, and its loops count iterations, not wall seconds.
    def run_clock_checks(self) -> None:
        board = WORK / "board-clock.yaml"
        board.write_text(self.board.read_text() + "failsafe:\n  silence_timeout_ms: 3000\n")
        notify = WORK / "notify.sock"
        notify.unlink(missing_ok=True)
        # systemd's side of sd_notify: a datagram socket, one message a datagram.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.bind(str(notify))
        listener.settimeout(0.5)  # so that the thread sees `done` (a close does not wake a recv)
        messages: list[str] = []
        done = threading.Event()

        def listen() -> None:
            with open(WORK / "notify.log", "a") as log:
                while not done.is_set():
                    try:
                        datagram = listener.recv(4096)
                    except TimeoutError:
                        continue
                    for line in datagram.decode(errors="replace").splitlines():
                        messages.append(line)
                        log.write(line + "\n")
                        log.flush()
        thread = threading.Thread(target=listen, daemon=True)
        thread.start()

        def pings() -> int:
            return sum(1 for line in list(messages) if line.startswith("WATCHDOG=1"))

        def pings_after(count: int) -> "str | None":
            """More than count WATCHDOG=1 arrive (bound: rig.PATIENCE's polls)."""
            if rig.wait_until(lambda: pings() > count, interval=0.1):
                return None
            return f"{pings()} pings, wanted more than {count}"

        def failsafe_engaged(word: str) -> "str | None":
            """Status names a failsafe whose reason has word (bound: rig.PATIENCE's polls)."""
            def engaged() -> "str | None":
                last = self.daemon.status()
                try:
                    failsafe = last["servo"]["failsafe"] if last else None
                except (KeyError, TypeError):
                    failsafe = None
                return None if failsafe and word in failsafe else f"no {word} failsafe: {last}"
            return rig.poll(engaged, interval=0.2)

        env = {**os.environ, "NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "400000"}
        try:
            if why := self.start_or_why(board, "daemon-clock.log", env=env):
                self.results.fails("e10", "daemon starts for the clock checks", why)
                return
            # A central that enables channel 0, sends one value, then stays connected and silent.
            central = socket.create_connection(("127.0.0.1", self.daemon.tcp_port()))
            central.sendall(bytes([1, 2, 0, 1, 2, 3, 0, 1, 244]))
            pings_after(2)
            before = pings()
            time.clock_settime(time.CLOCK_REALTIME, time.time() - 3600)
            self.check("e10", "the wall clock steps back an hour: the watchdog pings go on", pings_after, before + 4)
            self.check("e11", "… and the silence timeout still engages the failsafe (the silent central's own)", failsafe_engaged, "central silent")
            time.clock_settime(time.CLOCK_REALTIME, time.time() + 3600)
            central.close()
            self.check("e12", "… and the daemon stops on SIGTERM, exit 0", self.daemon.stop)
        finally:
            done.set()
            thread.join()
            listener.close()

    # --- (f) two PCA9685s on the stub bus (issue 15): 0x40 and 0x41 -------------
    def run_multichip_checks(self) -> None:
        bus = self.bus
        board = WORK / "board-two-chips.yaml"
        # The VM board with the servo section replaced by two chips (board/hexapod.yaml's shape).
        servo = """servo:
  chips:
    - { bus: stub, address: 0x40 }
    - { bus: stub, address: 0x41 }
  channels:
    - { channel: 0, output: "0:0", role: servo }
    - { channel: 17, output: "1:8", role: servo }
"""
        text = re.sub(r"servo:\n(  .*\n)+", lambda _: servo, self.board.read_text())
        board.write_text(re.sub(r"switches:\n(  .*\n)+", "", text))
        bus.set(0x41, 0xfd, 0x00)
        bus.set(0x41, 0x28, 0xee)
        if why := self.start_or_why(board, "daemon-two-chips.log"):
            self.results.fails("f1", "daemon starts with two PCA9685s", why)
            return

        def both_all_off() -> bool:
            return bus.value(0x40, 0xfd) == 16 and bus.value(0x41, 0xfd) == 16
        self.check("f1", "two chips: both initialised all off at start (0xFD = 0x10 at 0x40 and 0x41)", both_all_off)
        before = bus.value(0x40, 0x08)
        self.cli("enable", "17", "on")
        self.cli("servo", "17", "500")
        # Channel 17 is the second chip's output 8: LED8_OFF at 0x06 + 4 × 8 + 2 = 0x28.
        self.check("f2", "channel 17 drives output 8 of the chip at 0x41 (LED8_OFF_L = 0x33)",
                   bus.wait_for, 0x41, 0x28, 0x33)
        self.check("f3", "… and leaves the chip at 0x40 alone (LED0_OFF_L unchanged)",
                   lambda: bus.expect(0x40, 0x08, before) if before is not None else "LED0_OFF_L unreadable before")
        doctor = self.out / "doctor-two-chips.txt"
        rig.run_logged([self.cli_bin, "doctor", "--board", board, "--socket", self.socket], doctor)
        self.check("f4", "doctor probes both chips", lambda: all(
            re.search(pattern, doctor.read_text(), re.M) for pattern in (r"^ *OK +PCA9685 0x40", r"^ *OK +PCA9685 0x41")))
        self.daemon.kill()
        bus.set(0x40, 0xfd, 0x00)
        bus.set(0x41, 0xfd, 0x00)
        safe = WORK / "safe.txt"
        rig.run_logged([self.daemon_bin, "safe-outputs", "--board", board], safe)
        self.check("f5", "safe-outputs after kill -9 switches both chips off (0xFD = 0x10 at 0x40 and 0x41)",
                   lambda: None if both_all_off() else (tail(safe) or False))

    # --- (c) the peer comparison (item 6), when asked for --------------------------
    def run_peers(self) -> None:
        say("peer comparison")
        log = self.out / "peers.log"
        board = str(self.board) if self.board.is_file() else ""
        env = {**os.environ, "BUS": self.bus.number if self.bus else "", "BOARD": board}
        status = rig.run_logged([self.repo / "Tests/VM/peers.sh", self.out], log, env=env)
        if status == 0:
            self.results.passes("c", "peer comparison ran (table in peers-table.txt)")
        else:
            self.results.fails("c", "peer comparison", f"exit {status}, see peers.log: {tail(log, 2)}")

    # --- (v) BLE: hci_vhci + btvirt + the real bluetoothd + a Bumble central -------
    # (issue 4, item 9; Tests/VM/ble_guest.py appends its own PASS/FAIL lines)
    def run_ble(self) -> None:
        say("BLE checks")
        log = self.out / "ble-guest.log"
        status = rig.run_logged([sys.executable, self.repo / "Tests/VM/ble_guest.py", self.out], log)
        if status != 0:
            self.results.fails("ble", "BLE checks ran to their end", f"exit {status}, see ble-guest.log: {tail(log, 2)}")

    def section(self, section_id: str, what: str, fn) -> None:
        """Runs a group of checks; one that breaks (a bug of the rig, not a
        failed check) is a failure of its own and the next group still runs."""
        try:
            fn()
        except Exception as error:  # noqa: BLE001
            self.results.fails(section_id, f"{what} ran to their end", f"{type(error).__name__}: {error}")
            self.daemon.kill()

    def lap(self, what: str) -> None:
        """Notes the wall time and the guest's busy CPU since the last lap
        (the first: since boot) as `what`."""
        now, busy = time.monotonic(), busy_core_seconds()
        self.cpu.append(f"{what} {now - self.mark[0]:.0f} s, busy {busy - self.mark[1]:.0f} core-s")
        self.mark = (now, busy)

    def run(self) -> int:
        make_work_dir(WORK)
        # Where the VM's CPU goes (the run is CPU-bound: what the guest spends
        # the tiers beside it wait for), printed as one INFO line at the end.
        self.cpu: list[str] = []
        self.mark = (time.monotonic() - float(Path("/proc/uptime").read_text().split()[0]), 0.0)
        self.lap("boot")
        self.check("r1", "board/raspberry-pi.yaml without its devices: clear refusal, exit status 1-123",
                   self.rpi_board_fails_clearly)
        self.check("setup-i2c", "i2c-stub (0x40, 0x41, 0x27) and i2c-dev loaded, stub bus found by name",
                   self.setup_i2c)
        say(f"stub bus: i2c-{self.bus.number if self.bus else ''}")
        self.check("setup-gpio", "gpio-sim built for this kernel loads; chip with 8 lines created through configfs",
                   self.setup_gpio)
        say(f"gpio-sim: {self.sim.device}/{self.sim.chip}")
        # debugfs names each requested line's consumer.
        mount("debugfs", "/sys/kernel/debug")

        if self.bus:
            self.i2c_sanity()
        else:
            self.results.fails("a", "i2c-stub sanity", "no stub bus")
        if self.sim.chip:
            self.check("g1", "gpio-sim output: a held line reads 1, released 0", self.gpio_output_seen)
            self.check("g2", "gpio-sim input: the simulated pull reaches the reader", self.gpio_input_seen)
        else:
            self.results.fails("g", "gpio-sim sanity", "no gpio-sim chip")

        self.lap("set-up")
        if self.bus and self.sim.chip:
            self.section("b", "daemon checks", self.run_daemon_checks)
            self.section("d", "recovery checks", self.run_recovery_checks)
            self.section("e", "switch and safety checks", self.run_safety_checks)
            self.section("e-clock", "clock checks", self.run_clock_checks)
            self.section("f", "two-chip checks", self.run_multichip_checks)
            self.daemon.kill()
        else:
            self.results.fails("b", "daemon checks", "not run: no stub bus or no gpio-sim chip")

        self.lap("hardware checks")
        if self.peers:
            self.run_peers()
            self.lap("peer comparison")
        if self.ble:
            self.run_ble()
            self.lap("BLE")
        self.results.info("guest CPU: " + "; ".join(self.cpu) + (
            "; the BLE central's own share: " + (self.out / "ble-central-cpu.txt").read_text().strip()
            if (self.out / "ble-central-cpu.txt").is_file() else ""))

        rig.run_logged(["dmesg"], self.out / "dmesg.txt")
        (self.out / "guest-done").touch()
        os.sync()
        _, failed = rig.read_results(self.results_path)
        return 1 if failed else 0


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: guest.py OUT   (OUT/guest.env is written by Tests/VM/run)", file=sys.stderr)
        return 2
    os.environ["PATH"] = SYSTEM_PATH
    # The guard outside (scripts/lib/quiet-guard over OUT) counts a bounded
    # wait's tries as life; ble_guest.py inherits it.
    os.environ[rig.PROGRESS_ENV] = str(Path(sys.argv[1]) / "progress")
    return Guest(Path(sys.argv[1])).run()


if __name__ == "__main__":
    rig.main("guest", main)
