"""A check of rig.group_members against what the kernel really shows of a
dying multithreaded process (run by scripts/test; standard library only).

QEMU is such a process. When it is killed, its first thread can be a zombie
("Z" in /proc/PID/stat) while its other threads still hold its files: a
disk image's lock among them, which the next boot of that disk needs. The
rigs wait on group_members before they start that next boot, so it must
count such a process as live until its last thread is gone.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import rig  # noqa: E402 (scripts/lib)

# A child whose first thread ends (pthread_exit, as a killed QEMU's first
# thread can end before its vCPU threads) while a second thread holds an
# OFD lock on the file named by argv[1], as QEMU locks its images.
CHILD = r"""
import ctypes, fcntl, os, struct, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 100, 1, 0))
threading.Thread(target=lambda: [time.sleep(1) for _ in iter(int, 1)]).start()
print("locked", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def locked(path: str) -> bool:
    """Whether anyone holds a lock on any byte of the file (F_GETLK reports
    OFD locks too, with l_pid -1)."""
    fd = os.open(path, os.O_RDWR)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        return struct.unpack("hhqqi", answer)[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def state(pid: int) -> str:
    """The process's state as /proc/PID/stat shows it (its first thread's)."""
    return (rig.proc_stat(f"/proc/{pid}/stat") or ("gone", 0))[0]


def check() -> None:
    with tempfile.NamedTemporaryFile(prefix="rig-processes-") as image:
        child = subprocess.Popen([sys.executable, "-c", CHILD, image.name], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            if child.stdout is None or child.stdout.readline().strip() != "locked":
                raise AssertionError("the child did not take its lock")
            if not rig.wait_until(lambda: state(child.pid) == "Z", interval=0.05):
                raise AssertionError(f"the child's first thread did not end: /proc/{child.pid}/stat says "
                                     f"{state(child.pid)!r}")
            if not locked(image.name):
                raise AssertionError("the child's second thread does not hold the lock")
            if rig.group_members(child.pid) != [child.pid]:
                raise AssertionError(f"a process shown as Z whose second thread holds a lock is not counted live: "
                                     f"group_members says {rig.group_members(child.pid)}")
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        if not rig.wait_until(lambda: not rig.group_members(child.pid), interval=0.05):
            raise AssertionError(f"the killed child is still counted: {rig.group_members(child.pid)}")
        if locked(image.name):
            raise AssertionError("group_members says the child is gone, but its lock is still held")


if __name__ == "__main__":
    try:
        check()
    except AssertionError as error:
        print(f"rig.processes: FAIL: {error}", file=sys.stderr)
        sys.exit(1)
    print("rig.processes: group_members counts a killed process live until its last thread has let go of its lock")
