# shellcheck shell=sh
# Sourced by what runs arm64 programs on the amd64 host through qemu-user
# (scripts/build-arm64, scripts/check-packages, scripts/build-image through
# rig.qemu_user_ready): the one place that says how.
#
# QEMU_CPU, the core qemu-user emulates. QEMU's default for arm64, "max",
# has pointer authentication with the architected QARMA5 algorithm, which
# TCG computes in software at every signed call and return. Debian's trixie
# and sid packages are built with branch protection (PACIASP/AUTIASP in
# every function), so under "max" they ran about three times slower:
# deb-systemd-helper --help in the trixie arm64 root 3.1 s against 0.9 s,
# the protocol suites under qemu-user 22.9 s of CPU against 15.4 s. A
# Cortex-A72 is a Raspberry Pi 4's core; like the Pi 3's A53 and the Pi 5's
# A76 it has no pointer authentication, and runs those instructions as the
# no-ops (hint space) they are on every Pi. It is exported: mmdebstrap and
# binfmt_misc's interpreter read it from the environment; a chroot that
# clears its environment (env -i) must pass it on.
# BLECONTROL_QEMU_CPU=max measures the difference (QEMU's own default).
QEMU_CPU=${BLECONTROL_QEMU_CPU:-cortex-a72}
export QEMU_CPU

# arm64 programs run through the kernel's binfmt_misc handler for qemu; its
# F flag keeps that working inside a chroot or another mount namespace.
# Containers often lack the binfmt_misc file system.
qemu_user_ready() {
    [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || {
        echo "no qemu-aarch64 binfmt handler (update-binfmts --enable qemu-aarch64 made none)" >&2; return 1; }
    grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 || {
        echo "the qemu-aarch64 binfmt handler is disabled" >&2; return 1; }
}
