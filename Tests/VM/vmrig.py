"""The VM tier's helpers, shared by Tests/VM/guest.py and Tests/VM/ble_guest.py.

What the VM's checks need beyond scripts/lib/rig (which they use too):
  - read_env_file: a shell file of KEY='value' lines, read without a shell
  - tail, command_why: the end of a log or of a command's output as a check's why
  - alive, signal_pid: processes known by pid only
  - I2CBus: registers through i2c-tools (i2cget/i2cset), polled with a bound
  - GpioSim: a gpio-sim chip made through configfs, its lines read and pulled
The rest (Daemon) is about blecontrold and its CLI.

Standard library only: it runs inside the VM on the host's /usr/bin/python3.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig  # noqa: E402
import rig.board  # noqa: E402 - the control socket, for status polls

# The guest runs with virtme's environment: a plain system PATH, so that the
# host's own tools are found and nothing of a developer's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# --- The guest's machine: files, processes, the stub bus, gpio-sim -------------

def read_env_file(path: "str | os.PathLike[str]") -> dict[str, str]:
    """The KEY='value' lines of a shell file (Tests/VM/run's guest.env), read
    the way `.` would for such plain assignments: quotes removed, blank lines
    and comments skipped. A line that is not an assignment is an error."""
    values: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) != 1 or "=" not in words[0]:
            raise rig.Failure(f"{path}:{number}: not a KEY=value line: {line}")
        key, value = words[0].split("=", 1)
        values[key] = value
    return values


def tail(path: "str | os.PathLike[str]", lines: int = 3) -> str:
    """The last lines of a file on one line (the why of a failed check)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as error:
        return f"({path}: {error.strerror})"
    return rig.last_lines(text, lines)


def command_why(cmd: rig.Command, *, env: "dict[str, str] | None" = None,
                log: "str | os.PathLike[str] | None" = None) -> "str | None":
    """Runs cmd: None when it exits 0, else the end of its output (or of
    log, where its output went) as the why."""
    if log is not None:
        status = rig.run_logged(cmd, log, env=env)
        output = Path(log).read_text(errors="replace")
    else:
        result = rig.run(cmd, check=False, capture=True, env=env)
        status, output = result.returncode, (result.stdout or "") + (result.stderr or "")
    if status == 0:
        return None
    return f"exit status {status}: {rig.last_lines(output)}"


def alive(pid: int) -> bool:
    """Whether pid runs: it exists and is neither a zombie nor dead (a child
    not yet waited for is a zombie, and not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # pid (comm) STATE ...: comm may hold spaces and parentheses.
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def signal_pid(pid: "int | None", sig: int) -> None:
    """kill -SIG pid, where the process may be gone already."""
    if not pid:
        return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def ended(process: subprocess.Popen, *, tries: "int | None" = None, interval: float = 0.1) -> bool:
    """Whether process exits within `tries` polls (default: rig.PATIENCE's;
    a bound on a hang)."""
    return rig.wait_until(lambda: process.poll() is not None, tries=tries, interval=interval)


class I2CBus:
    """One /dev/i2c-N through i2c-tools: SMBus byte-data reads and writes,
    the same transfers a reader of the datasheet would make by hand."""

    def __init__(self, number: str) -> None:
        self.number = number

    def acknowledges(self, address: int, register: int) -> bool:
        """Whether a read at address succeeds (an absent address does not ACK)."""
        return rig.succeeds(["i2cget", "-y", self.number, hex(address), hex(register), "b"])

    def get(self, address: int, register: int, mode: str = "b") -> str:
        """i2cget's answer (0xNN), or its error message."""
        result = rig.run(["i2cget", "-y", self.number, hex(address), hex(register), mode],
                         check=False, capture=True)
        return (result.stdout + result.stderr).strip()

    def value(self, address: int, register: int, mode: str = "b") -> "int | None":
        """The register as a number, None when the read failed."""
        try:
            return int(self.get(address, register, mode), 0)
        except ValueError:
            return None

    def set(self, address: int, register: int, *values: int, mode: str = "b") -> bool:
        return rig.succeeds(["i2cset", "-y", self.number, hex(address), hex(register),
                             *(hex(value) for value in values), mode])

    def expect(self, address: int, register: int, want: int) -> "str | None":
        """None when the register reads want, else the why."""
        got = self.get(address, register)
        try:
            if int(got, 0) == want:
                return None
        except ValueError:
            pass
        return f"register {register:#04x} of {address:#04x} reads {got}, want {want:#04x}"

    def wait_for(self, address: int, register: int, want: int, *, tries: "int | None" = None) -> "str | None":
        """As expect, polled every 0.1 s up to `tries` times (default:
        rig.PATIENCE's; a bound, not a time limit: the servo thread flushes
        on its own schedule)."""
        return rig.poll(lambda: self.expect(address, register, want), tries=tries, interval=0.1)


class GpioSim:
    """A gpio-sim chip made live through configfs (Documentation/admin-guide/
    gpio/gpio-sim.rst): one bank, named lines; its sysfs side reads what a
    consumer drives and sets the pull a reader sees."""

    CONFIGFS = Path("/sys/kernel/config")

    def __init__(self, name: str) -> None:
        self.config = self.CONFIGFS / "gpio-sim" / name
        self.device = ""  # gpio-sim.N
        self.chip = ""    # gpiochipN

    def create(self, lines: int, names: "dict[int, str]") -> None:
        """Makes the chip live (gpio-sim must be loaded, configfs mounted)."""
        bank = self.config / "bank0"
        for directory in (self.config, bank, *(bank / f"line{line}" for line in names)):
            directory.mkdir()
        (bank / "num_lines").write_text(f"{lines}\n")
        for line, name in names.items():
            (bank / f"line{line}" / "name").write_text(f"{name}\n")
        (self.config / "live").write_text("1\n")
        self.device = (self.config / "dev_name").read_text().strip()
        self.chip = (bank / "chip_name").read_text().strip()

    def sysfs(self) -> Path:
        return Path(f"/sys/devices/platform/{self.device}/{self.chip}")

    def value_file(self, line: int) -> Path:
        return self.sysfs() / f"sim_gpio{line}" / "value"

    def value(self, line: int) -> str:
        """What the consumer drives on line: "0" or "1"."""
        return self.value_file(line).read_text().strip()

    def pull(self, line: int, pull: str) -> None:
        """pull-up or pull-down: what a reader of an input line sees."""
        (self.sysfs() / f"sim_gpio{line}" / "pull").write_text(f"{pull}\n")


def busy_core_seconds() -> float:
    """Core-seconds this kernel's CPUs have spent busy since boot (/proc/stat's
    first line, all but idle and iowait). Under TCG a guest's busy time is
    host CPU its vCPU threads used: what the VM tier costs the run."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def make_work_dir(work: Path) -> None:
    """Creates `work` for a daemon's socket and instance lock: the daemon
    refuses a directory others may write, whatever the guest's umask, so
    it and its parents up to /run are made 0755."""
    work.mkdir(parents=True, exist_ok=True)
    for directory in (work, *work.parents):
        if directory == Path("/run"):
            break
        directory.chmod(0o755)


def mount(kind: str, target: str, source: str = "none") -> bool:
    """mount -t kind source target unless target is a mount point already."""
    return os.path.ismount(target) or rig.succeeds(["mount", "-t", kind, source, target])


# --- blecontrold and its CLI ------------------------------------------------------

class Daemon:
    """One blecontrold at a time, on one control socket, with its CLI."""

    def __init__(self, daemon: str, cli: str, socket: str) -> None:
        self.daemon = daemon
        self.cli_path = cli
        self.socket = socket
        self.process: "subprocess.Popen | None" = None
        self.log: "Path | None" = None

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """blecontrol ARGS --socket SOCKET (its output captured)."""
        return rig.run([self.cli_path, *args, "--socket", self.socket], check=False, capture=True)

    def status(self) -> "dict | None":
        """The status report from the control socket (rig.board.socket_status);
        None when it did not answer."""
        try:
            return rig.board.socket_status(self.socket)
        except (OSError, RuntimeError, ValueError):
            return None

    def answers(self) -> bool:
        return self.status() is not None

    def start(self, board: "str | None", log: "str | os.PathLike[str]", *,
              env: "dict[str, str] | None" = None) -> "str | None":
        """Starts it (with --board unless None) and waits until the control
        socket answers: polled every 0.1 s, rig.PATIENCE's tries. None when
        it does, else the why."""
        Path(self.socket).unlink(missing_ok=True)
        self.log = Path(log)
        args = [self.daemon] + (["--board", board] if board else [])
        with open(log, "wb") as output:
            self.process = subprocess.Popen(
                args + ["--socket", self.socket, "--tcp", "127.0.0.1:0"],
                stdout=output, stderr=subprocess.STDOUT, env=env)
        for _ in range(rig.patient_tries(0.1)):
            if self.process.poll() is not None:
                status = self.process.returncode
                self.process = None
                return f"exited with status {status} at start: {tail(log, 2)}"
            if self.answers():
                return None
            time.sleep(0.1)
        # Not left running: it would hold the board's lock, and every later
        # start would fail as "already runs this board" instead of its own way.
        self.kill()
        return f"control socket never answered: {tail(log, 2)}"

    @property
    def pid(self) -> "int | None":
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> "str | None":
        """Sends sig; the daemon must exit 0 within rig.PATIENCE's polls 0.1 s
        apart, else it is killed. None when it did."""
        if self.process is None:
            return "not running"
        process, self.process = self.process, None
        process.send_signal(sig)
        if not ended(process):
            process.kill()
            process.wait()
            return f"still running after {signal.Signals(sig).name}"
        if process.returncode != 0:
            status = rig.shell_status(process.returncode)
            return f"exit status {status}" + (
                "" if sig == signal.SIGTERM else f" after {signal.Signals(sig).name}")
        return None

    def kill(self) -> None:
        """kill -9, waited for: nothing of the daemon's own shutdown runs."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def tcp_port(self) -> int:
        """The TCP transport's port (the daemon listens on 127.0.0.1:0)."""
        status = self.status()
        if status is None:
            raise rig.Failure("no status")
        return int(status["transports"]["tcp"].rsplit(":", 1)[1])


def status_holds(daemon: Daemon, expression: str, *, tries: "int | None" = None,
                 interval: float = 0.2) -> "str | None":
    """The Python expression over the status report `s` (Daemon.status)
    becomes true within `tries` polls `interval` apart (default:
    rig.PATIENCE's). None when it does, else the why (with the status's lcd,
    led and servo)."""
    def holds() -> "str | None":
        status = daemon.status()
        if status is None:
            return f"not true: {expression}; status: no status"
        try:
            if eval(expression, {}, {"s": status}):  # noqa: S307 - our own expressions
                return None
        except (NameError, SyntaxError):
            raise  # a typo in the check, not a status: the check fails, named
        except Exception:  # noqa: BLE001 - a missing key: not true (yet)
            pass
        shown = json.dumps({k: status.get(k) for k in ("lcd", "led", "servo")})
        return f"not true: {expression}; status: {shown}"

    return rig.poll(holds, tries=tries, interval=interval)
