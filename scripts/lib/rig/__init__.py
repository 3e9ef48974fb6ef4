"""The test rigs' shared helpers: one place for what every rig program does.

Used by the programs that build and boot things (scripts/build-image,
scripts/check-swift-6.0, Tests/Image/run) and by the checks that run inside
the VM (Tests/VM/guest.py, on the host's root file system). Standard library
only: the rigs run on a bare Debian 12 with python3 and nothing else, and
inside guests that have no virtual environment.

A program imports it with

    sys.path.insert(0, str(Path(__file__).resolve().parents[N] / "scripts/lib"))
    import rig

and runs its main through `rig.main("name", fn)`, so that a `rig.Failure`
anywhere ends the program with "name: FAIL: why" and exit status 1, and
nothing else is printed but the steps.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, NoReturn, Sequence

REPO = Path(__file__).resolve().parents[3]
"""The repository's top directory."""

Command = Sequence["str | os.PathLike[str]"]


class Failure(Exception):
    """Ends the program (through `main`) or fails one check (through
    `Results.check`), with its message as the reason."""


# --- Steps, and the program's end --------------------------------------------

class Steps:
    """Prints `name: [   12s] what` lines: the elapsed time since the program
    started, measured and printed, never asserted."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, what: str) -> None:
        print(f"{self.name}: [{int(self.elapsed()):5d}s] {what}", flush=True)

    def say(self, what: str) -> None:
        """A line with the program's name and no time."""
        print(f"{self.name}: {what}", flush=True)


def die(why: str) -> NoReturn:
    raise Failure(why)


def main(name: str, fn: Callable[[], "int | None"]) -> NoReturn:
    """Runs fn and exits with its status (0 for None); a Failure becomes
    `name: FAIL: why` on standard error and status 1. SIGTERM is taken as
    Ctrl-C (KeyboardInterrupt): CI's timeout or a kill ends a rig through its
    `finally` blocks and `with` statements, so it leaves no QEMU running and
    nothing mounted, and exits 130 with `name: interrupted`."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        status = fn()
    except Failure as failure:
        print(f"{name}: FAIL: {failure}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    sys.exit(status or 0)


def require_root() -> None:
    """Runs the program again through `sudo -E` unless it is root already."""
    if os.geteuid() != 0:
        os.execvp("sudo", ["sudo", "-E", sys.executable, *sys.argv])


# --- Commands ------------------------------------------------------------------

def last_lines(text: str, count: int = 3, sep: str = " ") -> str:
    """The last `count` lines of text, joined by sep: on one line (a
    check's why) by default."""
    return sep.join(text.rstrip().splitlines()[-count:])


def env(name: str, default: str) -> str:
    """The variable's value, or default when it is unset or empty (the
    shell's ${NAME:-default})."""
    return os.environ.get(name) or default


def remove(*paths: "str | os.PathLike[str]") -> None:
    """rm -rf: files, links (never followed) and trees; missing is fine."""
    for path in map(Path, paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def quote(cmd: Command) -> str:
    return " ".join(shlex.quote(str(part)) for part in cmd)


def run(cmd: Command, *, check: bool = True, capture: bool = False,
        input: "str | bytes | None" = None, env: "dict[str, str] | None" = None,
        cwd: "str | os.PathLike[str] | None" = None, timeout: "float | None" = None,
        log: "str | os.PathLike[str] | None" = None) -> subprocess.CompletedProcess:
    """Runs cmd (no shell). capture: standard output (text) in .stdout,
    standard error in .stderr. log: both appended to that file instead.
    check: a non-zero status raises Failure with the command and the end of
    its output (or of the log). timeout is a guard against a hang only."""
    kwargs: dict = {"env": env, "cwd": cwd, "timeout": timeout}
    if isinstance(input, str):
        kwargs["text"] = True
    if input is not None:
        kwargs["input"] = input
    logfile = None
    if log is not None:
        logfile = open(log, "ab")
        kwargs["stdout"] = logfile
        kwargs["stderr"] = subprocess.STDOUT
    elif capture:
        kwargs["capture_output"] = True
        kwargs["text"] = True
        kwargs["errors"] = "replace"
    try:
        result = subprocess.run([str(part) for part in cmd], **kwargs)
    except OSError as error:  # missing, not executable, no memory to fork...
        raise Failure(f"{quote(cmd)}: {error.strerror}" + (f": {error.filename}" if error.filename else "")) from None
    except subprocess.TimeoutExpired:
        raise Failure(f"{quote(cmd)}: still running after {timeout} s") from None
    finally:
        if logfile is not None:
            logfile.close()
    if check and result.returncode != 0:
        if log is not None:
            detail = last_lines(Path(log).read_text(errors="replace"), 30, "\n")
        elif capture:
            detail = last_lines((result.stderr or "") + (result.stdout or ""), 30, "\n")
        else:
            detail = ""
        raise Failure(f"{quote(cmd)} exited with status {result.returncode}"
                      + (f":\n{detail}" if detail else ""))
    return result


def shell_status(returncode: int) -> int:
    """An exit status as a shell reports it: 128+N for a process killed by
    signal N (subprocess says -N)."""
    return 128 - returncode if returncode < 0 else returncode


def run_logged(cmd: Command, log: "str | os.PathLike[str]", **kwargs) -> int:
    """`cmd > log 2>&1`: the log made anew; returns the exit status (shell
    style), never raises for a failing command."""
    Path(log).write_bytes(b"")
    return shell_status(run(cmd, check=False, log=log, **kwargs).returncode)


def output(cmd: Command, **kwargs) -> str:
    """Standard output of cmd, stripped; a failure raises Failure."""
    return run(cmd, capture=True, **kwargs).stdout.strip()


def succeeds(cmd: Command, **kwargs) -> bool:
    """Whether cmd exits 0 (its output discarded)."""
    try:
        return subprocess.run([str(p) for p in cmd], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, **kwargs).returncode == 0
    except FileNotFoundError:
        return False


def sh(script: str, *args: "str | os.PathLike[str]", **kwargs) -> subprocess.CompletedProcess:
    """A piece of shell, with args as $1...: for pipelines that are glue."""
    return run(["sh", "-ec", script, "sh", *args], **kwargs)


# What the pauses of a wait add up to unless its caller has a reason for
# another bound: two minutes. Still a count of tries, not a clock: on a busy
# host, or in an emulated machine, each try takes longer and the wait
# stretches with it.
PATIENCE = 120.0


def patient_tries(interval: float) -> int:
    """The tries, `interval` seconds apart, whose pauses add up to PATIENCE."""
    return int(PATIENCE / interval) + 1


def wait_until(predicate: Callable[[], bool], *, tries: "int | None" = None, interval: float = 0.5) -> bool:
    """Whether predicate holds within `tries` tries (default: PATIENCE's),
    `interval` seconds apart. The bound is a count, a guard against a hang:
    nothing here asserts a duration (emulated machines on busy hosts are
    slow)."""
    return poll(lambda: None if predicate() else "not yet", tries=tries, interval=interval) is None


def poll(check: Callable[[], "str | None"], *, tries: "int | None" = None, interval: float = 0.5) -> "str | None":
    """wait_until for a check: check returns None when what it wants holds,
    else why not. None as soon as it holds within `tries` tries (default:
    PATIENCE's); else the last why, for the FAIL line. Each try marks
    progress (see `progress`)."""
    tries = patient_tries(interval) if tries is None else tries
    why: "str | None" = "never checked"
    for attempt in range(tries):
        why = check()
        if why is None:
            return None
        progress()
        if attempt + 1 < tries:
            time.sleep(interval)
    return why


def group_members(group: int) -> list[int]:
    """The live processes of process group `group`, found by walking /proc:
    a group whose leader is gone cannot be waited for any other way. A
    zombie is left out (its files are closed), but only once every thread
    of it is: a process whose first thread has exited shows "Z" in
    /proc/PID/stat while its other threads live on and keep its files
    open: a killed QEMU's lock on the power cuts' disk outlived its first
    thread, and the boot after the cuts could not take it ("Failed to get
    "write" lock", QEMU's exit 1: cold6, and stop 52's CI by the same
    words). scripts/lib/rig/processes.py checks this against the kernel."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        state_and_group = proc_stat(f"/proc/{entry}/stat")
        if state_and_group is None or state_and_group[1] != group:
            continue
        if state_and_group[0] != "Z" or _any_thread_live(entry):
            members.append(int(entry))
    return members


def proc_stat(stat_path: str) -> "tuple[str, int] | None":
    """proc(5)'s field 3 (the state) and field 5 (the pgrp) of a stat file
    (/proc/PID/stat or /proc/PID/task/TID/stat); None when it is gone."""
    try:
        with open(stat_path) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _any_thread_live(pid: str) -> bool:
    """Whether a thread of process `pid` is not a zombie."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return any((proc_stat(f"/proc/{pid}/task/{task}/stat") or ("Z", 0))[0] != "Z" for task in tasks)


PROGRESS_ENV = "RIG_PROGRESS"
"""Names the file `progress` touches; unset, it does nothing."""

_PROGRESS_EVERY = 10.0
_last_progress = 0.0


def progress() -> None:
    """Marks that a bounded wait is still trying: touches the file that
    $RIG_PROGRESS names, at most every 10 s. A guard that ends a guest once
    its logs have gone quiet (scripts/lib/quiet-guard, Tests/VM/run) then
    tells a slow wait from a hang. A wait whose tries go on is bounded by
    their count, so it ends; a try that hangs stops the touches. Without
    this, a wait that writes nothing could outlast the guard under load: the
    VM tier's btvirt set-up, ten minutes without a line in a
    scripts/test --under-load run beside another VM."""
    global _last_progress
    path = os.environ.get(PROGRESS_ENV)
    now = time.monotonic()
    if not path or now - _last_progress < _PROGRESS_EVERY:
        return
    _last_progress = now
    with contextlib.suppress(OSError):
        Path(path).touch()


# --- Dependencies and caches -----------------------------------------------------

def install_deps(*tasks: str) -> None:
    """scripts/install-deps TASK...: the Debian packages those tasks need
    (scripts/lib/packages), installed when missing."""
    run([REPO / "scripts/install-deps", *tasks])


def digest(*parts: "str | bytes", files: Iterable["str | os.PathLike[str]"] = (),
           length: int = 16) -> str:
    """The first `length` hex digits of a SHA-256 over the parts and the
    files' contents, in order: the key of a cache entry."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
    for name in files:
        with open(name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(block)
    return hasher.hexdigest()[:length]


def file_sha256(path: "str | os.PathLike[str]") -> str:
    """The whole SHA-256 of one file."""
    return digest(files=[path], length=64)


@contextlib.contextmanager
def locked(path: "str | os.PathLike[str]", *, tries: int = 3600,
           holder: str = "another run") -> Iterator[None]:
    """Holds an exclusive flock on path (made if missing) for the block; a
    second run of the same rig waits its turn (tries: one a second)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        def take() -> bool:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
        if not wait_until(take, tries=tries, interval=1.0):
            die(f"{holder} holds {path}")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def private_apt(directory: "str | os.PathLike[str]", native: str, architectures: str,
                sources: str) -> dict[str, str]:
    """An apt configuration apart from the host's (scripts/lib/private-apt.sh,
    the one implementation, shared with scripts/arm64/sdk.sh), updated;
    returns the environment that uses it (APT_CONFIG)."""
    sh('. "$1/scripts/lib/private-apt.sh"; private_apt "$2" "$3" "$4"',
       REPO, directory, native, architectures, input=sources)
    return {**os.environ, "APT_CONFIG": str(Path(directory) / "apt.conf")}


def qemu_user_ready() -> None:
    """Makes arm64 programs runnable here through qemu-user and exports the
    core it emulates (QEMU_CPU) to this process and its children:
    scripts/lib/qemu-user.sh, the one implementation, says which and why. A
    chroot that clears its environment must pass QEMU_CPU on."""
    cpu = sh('. "$1/scripts/lib/qemu-user.sh"; qemu_user_ready >&2 && printf %s "$QEMU_CPU"',
             REPO, capture=True).stdout.strip()
    os.environ["QEMU_CPU"] = cpu


def candidate_versions(env: dict[str, str], packages: Iterable[str]) -> "str | None":
    """`package version` lines, the candidate of each package in the
    archive that env's apt configuration reads (private_apt): what keys a
    cached root. None when one has no candidate."""
    names = list(packages)
    policy = run(["apt-cache", "policy", *names], capture=True, check=False, env=env).stdout
    found: dict[str, str] = {}
    name = ""
    for line in policy.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            name = line[:-1]
        fields = line.split()
        if fields[:1] == ["Candidate:"] and len(fields) > 1 and fields[1] != "(none)":
            found[name] = fields[1]
    if any(name not in found for name in names):
        return None
    return "".join(f"{name} {found[name]}\n" for name in names)


# --- Checks ----------------------------------------------------------------------

class Results:
    """Check results, one line each, in the rigs' one format:

        PASS id: what
        FAIL id: what: why
        INFO figures (measured, never asserted)

    written to `path` (and, when given, to `also`, e.g. a virtio port) as
    they happen, and echoed to standard output (unless echo is False: a rig
    that prints every result in one list at its end). Beside `path`,
    `path`.times gets each line's id after the monotonic clock's reading
    when it was recorded: where a long rig's time goes, check by check
    (the clock is the machine's, so the lines of two processes that append
    to one file line up)."""

    def __init__(self, path: "str | os.PathLike[str] | None" = None, *,
                 append: bool = False, also: "str | os.PathLike[str] | None" = None,
                 echo: bool = True) -> None:
        self.echo = echo
        self.passed = 0
        self.failed: list[str] = []
        self._files = []
        self._times = None
        if path is not None:
            times = Path(f"{os.fspath(path)}.times")
            if not append:
                Path(path).write_text("")
                times.write_text("")
            # Always O_APPEND: a child that appends to the same file (the VM's
            # BLE checks) never has its lines overwritten from a stale offset.
            self._files.append(open(path, "a", buffering=1))
            self._times = open(times, "a", buffering=1)
        if also is not None:
            self._files.append(open(also, "w", buffering=1))

    def record(self, line: str) -> None:
        for handle in self._files:
            handle.write(line + "\n")
        if self._times is not None:
            self._times.write(f"{time.monotonic():.1f} {' '.join(line.split()[:2])}\n")
        if self.echo:
            print(line, flush=True)

    def passes(self, check_id: str, what: str) -> None:
        self.passed += 1
        self.record(f"PASS {check_id}: {what}")

    def fails(self, check_id: str, what: str, why: str = "") -> None:
        self.failed.append(check_id)
        why = " ".join(why.split())
        self.record(f"FAIL {check_id}: {what}" + (f": {why}" if why else ""))

    def info(self, text: str) -> None:
        self.record(f"INFO {text}")

    def check(self, check_id: str, what: str, fn: Callable[..., object], *args, **kwargs) -> bool:
        """Runs fn: it passes when it returns None or True, fails when it
        returns False or a string (the why) or raises Failure (its message is
        the why). Any other exception fails the check too, with its type:
        one broken check never ends the rest."""
        try:
            outcome = fn(*args, **kwargs)
        except Failure as failure:
            outcome = str(failure) or "failed"
        except Exception as error:  # noqa: BLE001 - a check's bug is its failure
            outcome = f"{type(error).__name__}: {error}"
        if outcome is None or outcome is True:
            self.passes(check_id, what)
            return True
        self.fails(check_id, what, "" if outcome is False else str(outcome))
        return False

    def close(self) -> None:
        for handle in self._files:
            handle.close()
        self._files = []
        if self._times is not None:
            self._times.close()
            self._times = None


def read_results(path: "str | os.PathLike[str]") -> tuple[list[str], list[str]]:
    """The PASS and FAIL lines of a results file (missing: none; carriage
    returns of a guest's console dropped). A line a power cut left as just
    "FAIL" counts as a failure."""
    try:
        lines = Path(path).read_text(errors="replace").replace("\r", "").splitlines()
    except FileNotFoundError:
        return [], []
    return ([line for line in lines if line.startswith("PASS ")],
            [line for line in lines if line.startswith("FAIL")])
