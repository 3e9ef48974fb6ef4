# shellcheck shell=sh disable=SC2154
# Sourced by scripts/build-image: how the cached base root is made. The base
# is every Debian package of the image (image/packages), installed by
# mmdebstrap with their maintainer scripts run under qemu-user, and nothing of
# this project. Its cache key is a hash of this file, image/packages, the
# mirror and the suite; scripts/build-image also remakes it when the archive
# has a newer version of anything in it.
#
# Needs: $mirror, $suite, $image_dir; mmdebstrap, qemu-user-static + binfmt.

# The components: non-free-firmware holds raspi-firmware, firmware-brcm80211
# and bluez-firmware. -updates and -security: the image is as current as the
# archive on the day it is built, and apt on the Pi keeps it so.
image_sources() {
    echo "deb $mirror $suite main non-free-firmware"
    echo "deb $mirror $suite-updates main non-free-firmware"
    echo "deb ${mirror%/debian}/debian-security $suite-security main non-free-firmware"
}

image_base_packages() {
    sed 's/#.*//' "$image_dir/packages" | tr -s ' \t' '\n' | grep -v '^$' | sort -u | paste -sd, -
}

image_base_build() { # OUT.tar
    # --variant=minbase: Essential and apt, plus the list; no "important"
    # extras a headless board does not need. Recommends are not installed
    # (the list names what is wanted). Check-Valid-Until: a mirror or proxy
    # may serve a Release file past its Valid-Until.
    #
    # The initramfs is made once, at the end. Left to the packages it is made
    # twice: the kernel's postinst hook creates it as soon as the kernel is
    # configured, and the update-initramfs trigger that initramfs-tools,
    # udev, kmod and raspi-firmware activated earlier makes it again when
    # dpkg runs its triggers; each took three minutes of a core here under
    # qemu-user (QEMU's default core: the whole base took 740 CPU-seconds
    # made this way against 980 the old way). INITRD=No is the kernel
    # hook's own switch for "no initramfs" (/etc/kernel/postinst.d/
    # initramfs-tools), and the trigger's `update-initramfs -u` then finds
    # none to update. The customize hook
    # creates it with everything configured; its post-update hook
    # (raspi-firmware's) copies the kernel, the initramfs and the device
    # trees to /boot/firmware and writes config.txt and cmdline.txt, as the
    # trigger's run did. linux-update-symlinks left out /initrd.img and
    # /initrd.img.old under INITRD=No; run again, it finds the initramfs.
    # (Checked against a base made the old way from the same archive: the
    # same files, and the same initramfs entry for entry.)
    # shellcheck disable=SC2046
    INITRD=No mmdebstrap --mode=root --variant=minbase --architectures=arm64 \
        --include="$(image_base_packages)" \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --aptopt='APT::Install-Recommends "false"' \
        --customize-hook='env -u INITRD chroot "$1" sh -euc "update-initramfs -c -k all
            for v in \$(linux-version list); do linux-update-symlinks install \"\$v\" \"/boot/vmlinuz-\$v\"; done"' \
        "$suite" "$1" "$(image_sources | sed -n 1p)" "$(image_sources | sed -n 2p)" "$(image_sources | sed -n 3p)"
}
