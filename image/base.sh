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
    # shellcheck disable=SC2046
    mmdebstrap --mode=root --variant=minbase --architectures=arm64 \
        --include="$(image_base_packages)" \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --aptopt='APT::Install-Recommends "false"' \
        "$suite" "$1" "$(image_sources | sed -n 1p)" "$(image_sources | sed -n 2p)" "$(image_sources | sed -n 3p)"
}
