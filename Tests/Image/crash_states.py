#!/usr/bin/env python3
"""TEST ONLY: the image's SD card after a power cut at every flush.

Tests/Image/run boots the test copy of the image through QEMU's
blklogwrites block driver, which records every write the guest makes to
its disk, and every flush, in the dm-log-writes format (QEMU
block/blklogwrites.c; the Linux target is Documentation/admin-guide/
device-mapper/log-writes.rst). What a card holds after its power is cut
is, at worst, what had reached it at the last flush the guest asked for:
this replays the log onto the copy as it was before the first boot, entry
by entry, and at each flush point (every one, or --max-states of them
spread evenly) checks that state as the next boot would find it:

  - the root file system (ext4) is repaired without a human:
    `e2fsck -p` ends with 0-3 (never 4 "left uncorrected"), and a forced
    read-only check afterwards finds nothing;
  - the boot partition (FAT), when it was written since the last check:
    `fsck.fat -a` repairs a copy, and `fsck.fat -n` then finds nothing;
  - /etc/blecontrol/board.yaml is one whole version of the file (one of
    those the guest wrote, or the image's), never a half-written one;
  - the first boot is done or not started for each of its parts: no
    account with an empty password field in /etc/shadow, every SSH host
    key present is a whole key (ssh-keygen reads it), and an administrator
    the first boot made has their key, unless the boot partition still
    holds authorized_keys for the next boot to finish with.

Each state is checked on its own copy of each partition, so the repairs
never reach the replay. As root, with a loop device and mkfs.xfs, the
replay and the states live on an XFS with reflinks in memory (a sparse
file in /dev/shm on a loop device, in a mount namespace of this program's
own): a state's copy shares every block with the replay until one side
writes it (4 ms against 450 ms for a full copy of the root partition's
~600 MB, which was three quarters of the replay's time). Otherwise each
copy is a sparse copy of the data blocks in /dev/shm.
(Linux's dm-log-writes and dm-thin snapshots need a device mapper; this
host's kernel has none, so the log comes from QEMU and the snapshots are
copies. e2fsck's own undo files cannot stand in: e2fsck re-opens the file
system after replaying its journal and then refuses its own undo file.)

Prints one line per state checked, then a summary; exits 1 when any state
fails a check. Standard library only.
"""

import argparse
import collections
import concurrent.futures
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig  # noqa: E402

MAGIC = 0x6A736677736872
FLUSH, FUA, DISCARD, MARK = 1, 2, 4, 8
SUPER = struct.Struct("<QQQI")
ENTRY = struct.Struct("<QQQQ")


def entries(log):
    """(sector, sectors, flags, data offset in the log or None) of each logged request, in order."""
    with open(log, "rb") as f:
        magic, version, count, sectorsize = SUPER.unpack(f.read(SUPER.size))
        if magic != MAGIC or version != 1:
            raise SystemExit("crash-states: %s is not a dm-log-writes log (magic %x, version %d)" % (log, magic, version))
        position = sectorsize
        for _ in range(count):
            f.seek(position)
            sector, sectors, flags, _length = ENTRY.unpack(f.read(ENTRY.size))
            position += sectorsize
            if flags & (FLUSH | DISCARD | MARK):
                yield sector * sectorsize, sectors * sectorsize, flags, None
            else:
                yield sector * sectorsize, sectors * sectorsize, flags, position
                position += sectors * sectorsize


def run(*command, stdin=None):
    result = subprocess.run(command, input=stdin, capture_output=True)
    return result.returncode, result.stdout, result.stderr


class Disk:
    """The replay target: the boot and root partitions of the disk before the
    first boot, as two sparse files, and what they hold now."""

    def __init__(self, path, root, boot, boot_size, work, scratch, reflink):
        """The partitions are copied into `work`; the states' copies go
        under `scratch`, as reflinks of them when `reflink` (both on one
        file system that has them)."""
        self.boot, self.boot_size, self.root, self.work, self.scratch = boot, boot_size, root, work, scratch
        self.reflink = reflink
        size = os.path.getsize(path)
        self.root_size = size - root
        self.boot_path = os.path.join(work, "boot-partition.img")
        self.root_path = os.path.join(work, "root-partition.img")
        copy_range(path, boot, boot_size, self.boot_path)
        copy_range(path, root, self.root_size, self.root_path)
        self.boot_fd = os.open(self.boot_path, os.O_RDWR)
        self.root_fd = os.open(self.root_path, os.O_RDWR)

    def close(self):
        os.close(self.boot_fd)
        os.close(self.root_fd)

    def apply(self, log, offset, length, flags, data_at):
        """Applies one logged request; says which partitions it touched."""
        if data_at is None and not flags & DISCARD:
            return set()
        if data_at is None:
            # A discarded range may read back as anything: zeros, the
            # worst case for what was there.
            data = bytes(length)
        else:
            log.seek(data_at)
            data = log.read(length)
        touched = set()
        for name, fd, start, size in (("boot", self.boot_fd, self.boot, self.boot_size), ("root", self.root_fd, self.root, self.root_size)):
            first, last = max(offset, start), min(offset + length, start + size)
            if first < last:
                os.pwrite(fd, data[first - offset:last - offset], first - start)
                touched.add(name)
        return touched

    def boot_names(self):
        """The names in the boot partition's top directory, as it is now."""
        code, out, _ = run("mdir", "-b", "-i", self.boot_path, "::/")
        return {line.rsplit("/", 1)[-1].lower() for line in out.decode(errors="replace").splitlines()} if code == 0 else set()


class State:
    """One flush point as the next boot would find it: copies of the root
    partition, and of the boot partition when it was written since the last
    state, taken as the replay reaches the point (in their own directory
    under the scratch space), then checked on a worker while the replay
    goes on."""

    def __init__(self, disk, number, request, writes, boot_written, boot_names):
        self.number, self.request, self.writes, self.boot_names = number, request, writes, boot_names
        self.dir = tempfile.mkdtemp(prefix="state-%d-" % number, dir=disk.scratch)
        copy = ["cp", "--reflink=always" if disk.reflink else "--sparse=always"]
        self.root = os.path.join(self.dir, "root.img")
        subprocess.run([*copy, disk.root_path, self.root], check=True)
        self.boot = None
        if boot_written:
            self.boot = os.path.join(self.dir, "boot.img")
            subprocess.run([*copy, disk.boot_path, self.boot], check=True)

    def check(self, versions, work):
        """The state's problems (empty: none); its copies are gone after."""
        try:
            problems = check_root(self, versions, work)
            if self.boot is not None:
                problems += check_boot(self.boot)
            return problems
        finally:
            rig.remove(self.dir)


PRIVATE_ENV = "CRASH_STATES_PRIVATE_MOUNTS"


def reflink_space(scratch, size):
    """A directory on an XFS with reflinks, made on a loop device over a
    sparse file of `size` bytes in `scratch` (memory only for the blocks
    written), and why not when it cannot be (then None)."""
    if os.environ.get(PRIVATE_ENV) != "1":
        return None, "not in a private mount namespace (not root, or no unshare or mkfs.xfs)"
    backing, mount = os.path.join(scratch, "reflink.xfs"), os.path.join(scratch, "reflink")
    with open(backing, "wb") as f:
        f.truncate(size)
    os.mkdir(mount)
    for command in (["mkfs.xfs", "-q", "-m", "reflink=1", backing], ["mount", "-o", "loop", backing, mount]):
        code, out, err = run(*command)
        if code != 0:
            rig.remove(backing, mount)
            return None, "%s: %s" % (" ".join(command[:2]), rig.last_lines((out + err).decode(errors="replace"), 1))
    return mount, ""


def drop_reflink_space(scratch, mount):
    """Unmounts what reflink_space made (the loop device goes with it) and removes its file."""
    code, out, err = run("umount", mount)
    if code != 0:
        raise SystemExit("crash-states: umount %s: %s" % (mount, (out + err).decode(errors="replace").strip()))
    rig.remove(mount, os.path.join(scratch, "reflink.xfs"))


def copy_range(source, offset, length, target):
    """Bytes [offset, offset + length) of source into a new sparse file."""
    with open(source, "rb") as f, open(target, "wb") as t:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            if chunk.count(0) == len(chunk):
                t.seek(len(chunk), os.SEEK_CUR)
            else:
                t.write(chunk)
            left -= len(chunk)
        t.truncate(length)


def files_of(image, work):
    """The files the checks read, out of an ext4 image, in one debugfs run."""
    out = os.path.join(work, "files")
    rig.remove(out)
    os.makedirs(out)
    commands = os.path.join(work, "debugfs.cmd")
    with open(commands, "w") as f:
        for directory in ("/etc/blecontrol", "/etc/ssh", "/home"):
            f.write("rdump %s %s\n" % (directory, out))
        for name in ("shadow", "passwd"):
            f.write("dump /etc/%s %s/%s\n" % (name, out, name))
    run("debugfs", "-f", commands, image)
    return out


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def check_root(state, versions, work):
    """Problems of the state's root file system as the next boot finds it
    (empty: none), checked on its copy (e2fsck repairs the copy)."""
    problems = []
    image = state.root
    code, out, err = run("e2fsck", "-fp", image)
    if code >= 4:
        problems.append("e2fsck -p left errors (exit %d): %s" % (code, rig.last_lines((out + err).decode(errors="replace"), 2)))
        return problems
    again, out, _ = run("e2fsck", "-fn", image)
    if again != 0:
        problems.append("not clean after e2fsck -p (e2fsck -fn exit %d): %s" % (again, rig.last_lines(out.decode(errors="replace"), 2)))
    files = files_of(image, state.dir)
    board = read(os.path.join(files, "blecontrol", "board.yaml"))
    if board is None or hashlib.sha256(board).hexdigest() not in versions:
        name = os.path.join(work, "board-%s.yaml" % hashlib.sha256(board or b"").hexdigest()[:12])
        with open(name, "wb") as f:
            f.write(board or b"")
        problems.append("board.yaml is no whole version (%s, kept as %s)" % ("missing" if board is None else "%d bytes" % len(board), name))
    shadow = (read(os.path.join(files, "shadow")) or b"").decode(errors="replace")
    for line in shadow.splitlines():
        fields = line.split(":")
        if len(fields) > 1 and fields[1] == "":
            problems.append("account %s has an empty password field" % fields[0])
    if not shadow.strip():
        problems.append("/etc/shadow is empty or missing")
    ssh = os.path.join(files, "ssh")
    for name in sorted(os.listdir(ssh)) if os.path.isdir(ssh) else []:
        if name.startswith("ssh_host_") and name.endswith("_key"):
            key = os.path.join(ssh, name)
            os.chmod(key, 0o600)
            code, _, _ = run("ssh-keygen", "-y", "-f", key)
            if code != 0:
                problems.append("SSH host key %s is not a whole key (%d bytes)" % (name, os.path.getsize(key)))
    # An administrator logs in with a key or a password hash; one the
    # first boot made without either is only fine while the boot
    # partition still has the files the next boot finishes from.
    passwords = {fields[0]: fields[1] for fields in (line.split(":") for line in shadow.splitlines()) if len(fields) > 1}
    passwd = (read(os.path.join(files, "passwd")) or b"").decode(errors="replace")
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 7 and fields[4] == "BLEControl administrator" and fields[5].startswith("/home/"):
            keys = read(os.path.join(files, "home", fields[5][len("/home/"):], ".ssh", "authorized_keys"))
            if not (keys or b"").strip() and not passwords.get(fields[0], "").startswith("$") \
                    and not state.boot_names & {"authorized_keys", "userconf.txt"}:
                problems.append("administrator %s has neither a key nor a password, and the boot partition no longer has the files for the next boot" % fields[0])
    return problems


def check_boot(copy):
    """Problems of the FAT boot partition, repaired on its copy."""
    problems = []
    code, out, err = run("fsck.fat", "-a", "-w", copy)
    if code not in (0, 1):
        problems.append("fsck.fat -a failed (exit %d): %s" % (code, rig.last_lines((out + err).decode(errors="replace"), 2)))
    else:
        code, out, _ = run("fsck.fat", "-n", copy)
        if code != 0:
            problems.append("boot partition not clean after fsck.fat -a: %s" % rig.last_lines(out.decode(errors="replace"), 2))
    return problems


def main():
    # The reflink space's mount (and with it the loop device, freed on its
    # last unmount) ends with this program however it ends: in a mount
    # namespace of its own, entered by exec'ing itself under unshare (the
    # same process: whoever started it can still signal and wait for it).
    if os.environ.get(PRIVATE_ENV) is None:
        os.environ[PRIVATE_ENV] = "0"
        if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("mkfs.xfs"):
            os.environ[PRIVATE_ENV] = "1"
            os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--",
                                  sys.executable, os.path.abspath(__file__), *sys.argv[1:]])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disk", required=True, help="the disk before the first boot (read once: its partitions are copied into --work and replayed onto there)")
    parser.add_argument("--log", required=True, help="the blklogwrites log of the boots")
    parser.add_argument("--root-offset", type=int, required=True)
    parser.add_argument("--boot-offset", type=int, required=True)
    parser.add_argument("--boot-size", type=int, required=True)
    parser.add_argument("--versions", required=True, help="directory of every board.yaml version the guest wrote")
    parser.add_argument("--work", required=True)
    parser.add_argument("--scratch", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where each state's copies are checked (default /dev/shm: in memory, fast)")
    parser.add_argument("--max-states", type=int, default=0, help="check at most this many flush points, spread evenly (0: all)")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="states checked at once (default: one per CPU, at most 4: each holds a copy of the root partition in the scratch space, or with reflinks the blocks it changed)")
    arguments = parser.parse_args()

    versions = set()
    for name in os.listdir(arguments.versions):
        versions.add(rig.file_sha256(os.path.join(arguments.versions, name)))
    os.makedirs(arguments.work, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="crash-states-", dir=arguments.scratch or arguments.work)
    # Room for both partitions twice over: the replay's and the states'
    # own blocks (e2fsck's repairs) come out of the same file system.
    shared, why_not = reflink_space(scratch, 2 * (os.path.getsize(arguments.disk) + (1 << 30)))
    print("crash-states: states as %s" % ("reflinks on an XFS in memory" if shared else
                                          "full sparse copies (no reflinks: %s)" % why_not), flush=True)
    disk = Disk(arguments.disk, arguments.root_offset, arguments.boot_offset, arguments.boot_size,
                shared or arguments.work, shared or scratch, shared is not None)
    versions.add(hashlib.sha256(read(os.path.join(files_of(disk.root_path, arguments.work), "blecontrol", "board.yaml")) or b"").hexdigest())

    # The flush points worth a look: a flush with writes before it.
    requests = list(entries(arguments.log))
    points, written = [], False
    for index, (_, _, flags, _) in enumerate(requests):
        if flags & FLUSH and written:
            points.append(index)
            written = False
        elif not flags & FLUSH:
            written = True
    chosen = points
    if arguments.max_states and len(points) > arguments.max_states:
        step = len(points) / arguments.max_states
        chosen = sorted({points[min(len(points) - 1, int(i * step + step / 2))] for i in range(arguments.max_states)})
    print("crash-states: %d requests logged, %d flush points after writes, checking %d" % (len(requests), len(points), len(chosen)), flush=True)

    # The checks of each state (e2fsck twice, debugfs, fsck.fat) are most
    # of the time, and the states are independent once copied: --jobs
    # workers check them while the replay goes on to the next one (so at
    # most jobs + 1 states' copies in the scratch space). Lines in state
    # order.
    failed = 0
    boot_written = False
    boot_names = disk.boot_names()
    writes = 0
    targets = {index: number for number, index in enumerate(chosen, start=1)}
    pending = collections.deque()

    def report(state, problems):
        nonlocal failed
        failed += bool(problems)
        print("crash-states: state %d (flush at request %d, %d writes before it): %s%s%s" % (
            state.number, state.request, state.writes, "FAIL" if problems else "ok",
            " (boot partition checked)" if state.boot is not None else "",
            "".join("\n  - " + problem for problem in problems)), flush=True)

    with open(arguments.log, "rb") as log, concurrent.futures.ThreadPoolExecutor(arguments.jobs) as workers:
        for index, (offset, length, flags, data_at) in enumerate(requests):
            touched = disk.apply(log, offset, length, flags, data_at)
            if touched:
                writes += 1
                boot_written = boot_written or "boot" in touched
            if index not in targets:
                continue
            if boot_written:
                boot_names = disk.boot_names()
            state = State(disk, targets[index], index, writes, boot_written, boot_names)
            boot_written = False
            pending.append((state, workers.submit(state.check, versions, arguments.work)))
            while len(pending) > arguments.jobs or (pending and pending[0][1].done()):
                state, future = pending.popleft()
                report(state, future.result())
        for state, future in pending:
            report(state, future.result())
    disk.close()
    if shared:
        drop_reflink_space(scratch, shared)
    os.rmdir(scratch)
    print("crash-states: %d states checked, %d failed" % (len(chosen), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
