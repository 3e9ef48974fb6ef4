#!/bin/sh
# TEST ONLY, in the test copy of the image (blecontrol-test-setup.service),
# before blecontrold and bluetoothd start: stand-ins for the Pi's hardware.
#   - i2c-stub (built for this kernel by Tests/Image/run: Debian's arm64
#     kernel is configured without it) at 0x40 (PCA9685) and 0x27 (LCD
#     backpack); its bus number is whatever the kernel gave it, found by
#     the adapter's name;
#   - /etc/blecontrol/board.yaml: the shipped one (board/raspberry-pi.yaml)
#     with /dev/i2c-1 replaced by the stub's bus and the LED and switches
#     emulated (the kernel has no gpio-sim either, and QEMU's GPIO chip has
#     no GPIO17);
#   - hci_vhci (also built here) for btvirt, which blecontrol-test-btvirt
#     starts next.
set -eu
dir=/usr/local/lib/blecontrol-test
say() { echo "blecontrol-test-setup: $*"; }

# `setup.sh btvirt` (blecontrol-test-btvirt's main process, Type=notify):
# btvirt's two controllers, ready once both finished the kernel's set-up.
# btvirt opens hci0, then hci1, and only then answers either: under TCG on
# a busy machine the kernel's HCI Reset can time out meanwhile ("Opcode
# 0x0c03 failed: -110"). Such a controller stays in sysfs but never enters
# the management interface's index list (its HCI_SETUP flag is only
# cleared by a set-up that succeeds), so bluetoothd would never see it, and
# bringing it up by hand (HCIDEVUP) does not put it back. The sign of a
# failed set-up: no BD address (Read BD_ADDR comes right after the reset).
# Then a new btvirt, whose controllers are new devices with a new set-up.
# The kernel says so at once ("hciN: Opcode 0x0c03 failed: -110", the
# command's timeout): the next attempt starts then, not after the wait for
# an address (which cost four minutes of every boot under TCG, the first
# attempt after the modules load failing nearly always).
# Bounded by iteration counts: a guard against a hang only.
if [ "${1:-}" = btvirt ]; then
    addressed() { # HCI: the set-up got as far as reading the controller's address
        address=$(hciconfig "$1" 2>/dev/null | sed -n 's/.*BD Address: \([0-9A-F:]*\).*/\1/p')
        [ -n "$address" ] && [ "$address" != 00:00:00:00:00:00 ]
    }
    timeouts() { # the HCI commands that timed out so far, in the kernel's log
        dmesg 2>/dev/null | grep -c 'hci[0-9]*: Opcode 0x[0-9a-f]* failed: -110' || true
    }
    pid=""
    for attempt in 1 2 3 4 5; do
        if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
        for _ in $(seq 1200); do [ -e /sys/class/bluetooth/hci0 ] || break; sleep 0.1; done
        before=$(timeouts)
        "$dir/btvirt" -L -l2 &
        pid=$!
        ok=no
        # Bounded by tries (two minutes and more): a slow set-up on a busy
        # host is not a failed one; a timed-out command is.
        for _ in $(seq 240); do
            if addressed hci0 && addressed hci1; then ok=yes; break; fi
            kill -0 "$pid" 2>/dev/null || break
            [ "$(timeouts)" -le "$before" ] || break
            sleep 0.5
        done
        if [ "$ok" = yes ]; then
            say "controllers hci0 and hci1 set up (btvirt attempt $attempt)"
            systemd-notify --ready
            status=0
            wait "$pid" || status=$?
            say "btvirt exited (status $status) after its controllers were set up"
            # Ended at all while the unit runs is the rig failing (systemd
            # stops the shell as well), so never 0: Restart=on-failure.
            [ "$status" -ne 0 ] || status=1
            exit "$status"
        fi
        say "btvirt attempt $attempt: a controller's set-up failed ($(hciconfig 2>&1 | grep -c '00:00:00:00:00:00') without an address); again"
    done
    say "btvirt's controllers did not finish their set-up in 5 attempts"
    # 3: not restarted (RestartPreventExitStatus= in the unit): the unit
    # fails, and the boot's checks say so, rather than retrying for ever.
    exit 3
fi

insmod "$dir/i2c-stub.ko" chip_addr=0x40,0x27
bus=""
for _ in $(seq 1200); do
    for adapter in /sys/bus/i2c/devices/i2c-*; do
        [ "$(cat "$adapter/name" 2>/dev/null)" = "SMBus stub driver" ] && bus=${adapter##*/i2c-}
    done
    [ -n "$bus" ] && [ -c "/dev/i2c-$bus" ] && break
    sleep 0.1
done
[ -n "$bus" ] && [ -c "/dev/i2c-$bus" ] || { say "no i2c-stub bus with a /dev node"; exit 1; }
udevadm settle || true
say "i2c-stub is /dev/i2c-$bus ($(stat -c '%G %a' "/dev/i2c-$bus"))"
echo "$bus" >/run/blecontrol-test-bus

# After the watchdog reset of guest.sh's section w: a real PCA9685 keeps
# its registers (and its outputs) through a reset of the Pi, the stub is
# new; put back what the chip held at the hang (i2cdump's table: a row
# "X0:" then 16 bytes), before blecontrol-safe-outputs runs.
held=/var/lib/blecontrol-test/held-registers
if [ -e /var/lib/blecontrol-test/hung ] && [ -f "$held" ]; then
    awk 'function hex(h,  i, n) { for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1; return n }
         /^[0-9a-f]0:/ { row = hex(substr($1, 1, 2)); for (i = 0; i < 16; i++) if ($(i + 2) != "00" && $(i + 2) != "XX") printf "0x%02x 0x%s\n", row + i, $(i + 2) }' "$held" \
        | while read -r register value; do i2cset -y "$bus" 0x40 "$register" "$value" b; done
    say "the chip's held registers back in the stub: LED0_OFF $(i2cget -y "$bus" 0x40 0x09 b)$(i2cget -y "$bus" 0x40 0x08 b | cut -c3-), ALL_LED_OFF_H $(i2cget -y "$bus" 0x40 0xfd b)"
    mv "$held" "$held.restored"
fi

board=/etc/blecontrol/board.yaml
# Whole or not at all (the power-cut boots of Tests/Image/run cut this
# too: a copy cut short left an empty board behind once).
if [ ! -f "$board.shipped" ]; then
    cp -p "$board" "$board.shipped.new"
    sync "$board.shipped.new"
    mv "$board.shipped.new" "$board.shipped"
    sync /etc/blecontrol
fi
awk -v device="/dev/i2c-$bus" '
    /^led:/ { print "led:"; print "  emulated: true          # TEST: no gpio-sim in this kernel"; skip = 1; next }
    skip && /^[^ ]/ { skip = 0 }
    skip { next }
    { gsub("/dev/i2c-1", device); sub(/(chip: [^,]+, )?line_name: GPIO[0-9]+/, "emulated: true"); print }
' "$board.shipped" >"$board.new"
sync "$board.new"
mv "$board.new" "$board"
sync /etc/blecontrol
/usr/bin/blecontrold --check-board --board "$board"

modprobe bluetooth
insmod "$dir/hci_vhci.ko"
[ -c /dev/vhci ] || { for _ in $(seq 1200); do [ -c /dev/vhci ] && break; sleep 0.1; done; }
[ -c /dev/vhci ] || { say "no /dev/vhci"; exit 1; }
say "hci_vhci loaded"
