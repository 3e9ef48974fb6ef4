"""virtme-run (virtme-ng 1.42, Tests/VM/requirements-vm.txt) with the
guest's root mounted with 9p's cache=loose. Run with the vm venv's Python,
with virtme-run's own arguments.

The guest's root is the host's own, read-only over 9p (there is no
virtiofsd that virtme-ng will use on Debian 12). virtme-ng mounts it with
no cache option, so 9p's default, cache=none, which also mounts it
sync,dirsync: every open, stat and read in the guest is a round trip to
QEMU, and the guest's work is Python programs, the daemon and bluetoothd
starting again and again. Measured here, one guest importing Bumble twice
and starting /usr/bin/python3 20 times: the 20 starts took 60-69 s of
the guest's clock against 7 s, and QEMU 131 CPU-seconds on the host
against 46 (`/usr/bin/time` around virtme-run, the same kernel, TCG, 1
vCPU).

cache=loose lets the guest keep what it read: right for this root, which
the guest only reads and whose files it uses (this tree, the built
programs, the venvs, the kernel's modules) are made before it boots and
not changed while it runs. The directory the guest writes its results to
(--rwdir) is a mount of its own and keeps virtme-ng's options, so the host
sees every line as it is written (the quiet guard watches them).

virtme-ng has no option for this; its init script's mount command is a
template string in virtme.mkinitramfs. A virtme-ng whose template differs
stops here with a message rather than booting a guest without the cache."""

from __future__ import annotations

import sys

import virtme.mkinitramfs as mkinitramfs
from virtme.commands.run import main

NINE_P = "msize=524288 /dev/root"
"""The end of the root's 9p mount options in virtme-ng 1.42's template."""

if NINE_P not in mkinitramfs._MOUNT_ROOT_HOST:
    sys.exit("Tests/VM/virtme_run.py: virtme-ng's 9p root mount is not the one 1.42 has;"
             " make the cache option fit the installed version")
mkinitramfs._MOUNT_ROOT_HOST = mkinitramfs._MOUNT_ROOT_HOST.replace(
    NINE_P, NINE_P.replace(" /dev/root", ",cache=loose /dev/root"))

if __name__ == "__main__":
    sys.exit(main())
