#!/bin/bash
# TEST ONLY: the checks of Tests/Image/run, inside the booted image (a copy
# of its root file system, its own kernel and initrd, systemd as PID 1), run
# by blecontrol-image-test.service once the system is up. Only the guest's
# own tools: systemctl, journalctl, busctl, i2cget/i2cset, blecontrol.
# Each check writes `PASS id: what` or `FAIL id: what: why` to the
# virtio-serial port the host reads; INFO lines carry figures (measured,
# never asserted). Every wait is bounded by an iteration count, a guard
# against a hang only: TCG on a busy machine is slow, and nothing here
# asserts a duration.
set -u
dir=/usr/local/lib/blecontrol-test
# shellcheck source=/dev/null
. "$dir/test.env"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec 3>/dev/virtio-ports/blecontrol.results
work=/run/blecontrol-test
mkdir -p "$work"

record() { echo "$*" >&3; echo "$*"; }
pass() { record "PASS $1: $2"; }
fail() { record "FAIL $1: $2${3:+: $3}"; }
info() { record "INFO $*"; }
# check ID WHAT COMMAND...: PASS when COMMAND succeeds; its output is the why.
check() {
    local id=$1 what=$2
    shift 2
    if "$@" >"$work/why" 2>&1; then pass "$id" "$what"; else fail "$id" "$what" "$(tail -n 3 "$work/why" | tr '\n' ' ')"; fi
}
# until_true TRIES COMMAND...: COMMAND succeeds within TRIES tries, half a
# second apart.
until_true() {
    local tries=$1 i
    shift
    for ((i = 0; i < tries; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    "$@"
}

BUS=$(cat /run/blecontrol-test-bus 2>/dev/null)
prop() { systemctl show -P "$1" blecontrold.service; }
cursor() { journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p'; }
unit_log_since() { journalctl -u blecontrold.service --after-cursor="$1" --no-pager -q -o cat; }
cli() { blecontrol "$@" >>"$work/cli.log" 2>&1; }

# PCA9685 registers on the stub bus (SMBus byte data; 0xNN). NXP PCA9685
# datasheet §7.3: MODE1 0x00 (bit 4 SLEEP), LED0_ON_L/H 0x06/0x07,
# LED0_OFF_L/H 0x08/0x09, ALL_LED_OFF_H 0xFD (bit 4: every output fully off,
# §7.3.3-7.3.4), PRE_SCALE 0xFE (§7.3.5).
reg() { i2cget -y "$BUS" "$1" "$2" b 2>&1; }
poke() { i2cset -y "$BUS" "$1" "$2" "$3" b; }
expect_reg() { # ADDR REG VALUE
    local got
    got=$(reg "$1" "$2")
    [ $((got)) -eq $(($3)) ] 2>/dev/null || { echo "register $2 of $1 reads $got, want $3"; return 1; }
}
all_off() { expect_reg 0x40 0xfd 0x10; }
# 1500 µs at 50 Hz with PRE_SCALE 121 on a 25 MHz oscillator: 307 counts
# (0x133) after a 0 ON count.
servo_lands() {
    until_true 40 expect_reg 0x40 0x08 0x33 && expect_reg 0x40 0x09 0x01 \
        && expect_reg 0x40 0x06 0x00 && expect_reg 0x40 0x07 0x00
}
move_servo() { cli enable 0 on && cli servo 0 500 && servo_lands; }
is_active() { [ "$(prop ActiveState)" = active ]; }
restarted_since() { # NRESTARTS OLDPID: systemd restarted it and the new one is active
    [ "$(prop NRestarts)" -gt "$1" ] && is_active && [ "$(prop MainPID)" != "$2" ] && [ "$(prop MainPID)" != 0 ]
}

info "guest: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1024 " MB"}' /proc/meminfo)"
active_us=$(prop ActiveEnterTimestampMonotonic)
info "boot: blecontrold active ${active_us} µs after the kernel started ($(awk -v us="$active_us" 'BEGIN { printf "%.1f", us / 1e6 }') s); NRestarts $(prop NRestarts)"

# --- (i) the image's first boot ----------------------------------------------------
grown() {
    local now
    now=$(df -B1 --output=size / | tail -n 1 | tr -d ' ')
    [ "$now" -gt "$ROOT_BYTES" ] || { echo "root file system $now bytes, was $ROOT_BYTES in the image"; return 1; }
    journalctl -b -u blecontrol-firstboot.service -o cat | grep -q 'grown from' || { echo "no 'grown from' line"; return 1; }
    echo "root $ROOT_BYTES -> $now bytes"
}
check i1 "first boot grew the root partition and file system to the disk" grown
info "root: $(tail -n 1 "$work/why")"
check i2 "host name from the boot partition's hostname file" \
    sh -c "[ \"\$(hostname)\" = '$EXPECT_HOSTNAME' ] && [ \"\$(cat /etc/hostname)\" = '$EXPECT_HOSTNAME' ] || { echo \"hostname \$(hostname)\"; exit 1; }"
check i3 "machine-id made on this boot (the image's is 'uninitialized')" \
    sh -c 'grep -Eq "^[0-9a-f]{32}$" /etc/machine-id || { cat /etc/machine-id; exit 1; }'
check i4 "SSH host keys made on the device, sshd running" \
    sh -c 'ls /etc/ssh/ssh_host_ed25519_key >/dev/null && systemctl is-active ssh.service'
admin_ok() { # USER: in the groups, with the test's key
    local groups
    groups=" $(id -nG "$1") "
    for group in sudo blecontrol i2c gpio bluetooth; do
        case $groups in *" $group "*) ;; *) echo "$1 is not in $group ($groups)"; return 1 ;; esac
    done
}
key_admin_ok() {
    admin_ok "$ADMIN_USER" || return 1
    grep -qF "$ADMIN_KEY" "/home/$ADMIN_USER/.ssh/authorized_keys" || { echo "key not installed"; return 1; }
    [ "$(getent shadow "$ADMIN_USER" | cut -d: -f2)" = '*' ] || { echo "$ADMIN_USER has a password"; return 1; }
    # No password, so sudo without one (or nobody could administer the board).
    sudo -l -U "$ADMIN_USER" | grep -q 'NOPASSWD: ALL' || { echo "no password-less sudo"; return 1; }
}
check i5 "administrator '$ADMIN_USER' from authorized_keys: groups, key, no password, sudo without one" key_admin_ok
# The other way in: userconf.txt (NAME:HASH), applied the way a boot applies it.
password_admin_ok() {
    echo "$SECOND_USER:$SECOND_HASH" >/boot/firmware/userconf.txt
    /usr/lib/blecontrol-image/firstboot administrator || return 1
    admin_ok "$SECOND_USER" || return 1
    [ "$(getent shadow "$SECOND_USER" | cut -d: -f2)" = "$SECOND_HASH" ] || { echo "password hash is not userconf.txt's"; return 1; }
    ! sudo -l -U "$SECOND_USER" | grep -q NOPASSWD || { echo "password-less sudo for a user with a password"; return 1; }
    sudo -l -U "$ADMIN_USER" | grep -q 'NOPASSWD: ALL' || { echo "$ADMIN_USER lost its sudo"; return 1; }
    [ ! -e /boot/firmware/userconf.txt ] || { echo "userconf.txt left on the boot partition"; return 1; }
}
check i6 "userconf.txt: administrator '$SECOND_USER' with that password hash, sudo with a password, file removed" password_admin_ok
check i7 "authorized_keys removed from the boot partition, hostname kept" \
    sh -c '[ ! -e /boot/firmware/authorized_keys ] && [ -e /boot/firmware/hostname ] || ls /boot/firmware'
check i8 "root cannot log in: no password, PermitRootLogin no" \
    sh -c 'getent shadow root | cut -d: -f2 | grep -q "^[*!]" && sshd -T 2>/dev/null | grep -qx "permitrootlogin no"'
check i9 "config.txt: I2C, the overlay, the UART; cmdline.txt: root by label" \
    sh -c 'grep -qx "dtparam=i2c_arm=on" /boot/firmware/config.txt && grep -qx "dtoverlay=blecontrol" /boot/firmware/config.txt &&
           grep -qx "enable_uart=1" /boot/firmware/config.txt && [ -s /boot/firmware/overlays/blecontrol.dtbo ] &&
           grep -q "root=LABEL=RASPIROOT" /boot/firmware/cmdline.txt'
check i10 "boot partition mounted root-only (umask 0077)" \
    sh -c 'findmnt -n -o OPTIONS /boot/firmware | grep -q "fmask=0077" && [ "$(stat -c %a /boot/firmware)" = 700 ]'
check i11 "no failed units" sh -c 'out=$(systemctl --failed --no-legend --plain); [ -z "$out" ] || { echo "$out"; exit 1; }'

# --- (s) the shipped service -------------------------------------------------------------
service_shipped() {
    [ "$(prop FragmentPath)" = /usr/lib/systemd/system/blecontrold.service ] || { echo "unit from $(prop FragmentPath)"; return 1; }
    [ "$(prop DropInPaths)" = /etc/systemd/system/blecontrold.service.d/test.conf ] || { echo "drop-ins: $(prop DropInPaths)"; return 1; }
    # The package's files as shipped, but for the board file the test pointed at the stub.
    local changed
    changed=$(dpkg --verify blecontrol | grep -v ' /etc/blecontrol/board.yaml$')
    [ -z "$changed" ] || { echo "changed: $changed"; return 1; }
}
check s1 "unit as shipped (package files verified), only the test's ordering drop-in" service_shipped
check s2 "blecontrold.service active through READY=1 (Type=notify, NotifyAccess=main, WatchdogSec=5s)" \
    sh -c '[ "$(systemctl show -P Type blecontrold)" = notify ] && [ "$(systemctl show -P NotifyAccess blecontrold)" = main ] &&
           [ "$(systemctl show -P WatchdogUSec blecontrold)" = 5s ] && [ "$(systemctl show -P ActiveState blecontrold)" = active ] &&
           [ "$(systemctl show -P SubState blecontrold)" = running ] || systemctl status blecontrold --no-pager'
exposure() {
    systemd-analyze security blecontrold.service --no-pager >"$work/security.txt" 2>&1
    local level
    level=$(sed -n 's/.*Overall exposure level for blecontrold.service: \([0-9.]*\).*/\1/p' "$work/security.txt")
    [ -n "$level" ] || { tail -n 2 "$work/security.txt"; return 1; }
    echo "$level"
    awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }'
}
check s3 "systemd-analyze security on the live system: exposure <= 2.0" exposure
info "security: exposure $(head -n 1 "$work/why")"

# --- (h) the outputs, through the stub's registers ------------------------------------------
if [ -z "$BUS" ]; then
    fail h "hardware checks" "no stub bus (blecontrol-test-setup failed)"
else
    # The stub's registers start at 0: these values are the daemon's writes.
    check h1 "start-up all-off: ALL_LED_OFF_H (0xFD) = 0x10, MODE1 awake, PRE_SCALE 121" \
        sh -c "[ \$((\$(i2cget -y $BUS 0x40 0xfd b))) -eq 16 ] && [ \$((\$(i2cget -y $BUS 0x40 0x00 b) & 0x10)) -eq 0 ] &&
               [ \$((\$(i2cget -y $BUS 0x40 0xfe b))) -eq 121 ]"
    check h2 "blecontrol enable 0 on + servo 0 500: LED0_ON 0, LED0_OFF 0x133 (0x08/0x09)" move_servo

    poke 0x40 0xfd 0x00
    stop_all_off() {
        systemctl stop blecontrold.service || return 1
        [ "$(prop ActiveState)" = inactive ] && [ "$(prop Result)" = success ] || { echo "$(prop ActiveState) $(prop Result)"; return 1; }
        all_off
    }
    check h3 "systemctl stop: clean stop, every output off (0xFD = 0x10)" stop_all_off
    systemctl start blecontrold.service
    until_true 600 is_active

    # kill -9: nothing in the daemon runs; ExecStopPost= (safe-outputs) must
    # switch the outputs off before systemd restarts it.
    kill_nine() {
        move_servo || return 1
        poke 0x40 0xfd 0x00
        local n pid at
        n=$(prop NRestarts); pid=$(prop MainPID); at=$(cursor)
        kill -KILL "$pid"
        until_true 1200 restarted_since "$n" "$pid" || { echo "not restarted: $(prop ActiveState) $(prop NRestarts)"; return 1; }
        unit_log_since "$at" >"$work/kill9.log"
        grep -q 'status=9/KILL' "$work/kill9.log" || { echo "no SIGKILL exit in the journal"; return 1; }
        # safe-outputs' line comes before the restarted daemon's first line.
        awk '/PCA9685 .* every output off/ && !off { off = NR } /running$/ && !run { run = NR } END { exit !(off && run && off < run) }' "$work/kill9.log" \
            || { echo "no safe-outputs line before the restart: $(tail -n 4 "$work/kill9.log" | tr '\n' '|')"; return 1; }
        all_off
    }
    check h4 "kill -9: ExecStopPost safe-outputs switched every output off, systemd restarted it" kill_nine

    # A stuck servo thread: SIGSTOP to the thread the daemon names (which,
    # being SIGSTOP, stops the whole process): the watchdog pings stop.
    watchdog_kill() {
        move_servo || return 1
        poke 0x40 0xfd 0x00
        local n pid tid="" task at
        n=$(prop NRestarts); pid=$(prop MainPID); at=$(cursor)
        # The kernel keeps 15 characters of a thread's name (TASK_COMM_LEN):
        # the daemon's "blecontrol-servo" shows as "blecontrol-serv".
        for task in /proc/"$pid"/task/*; do
            case $(cat "$task/comm") in blecontrol-serv*) tid=${task##*/} ;; esac
        done
        [ -n "$tid" ] || { echo "no servo thread: $(cat /proc/"$pid"/task/*/comm | tr '\n' ' ')"; return 1; }
        local stopped_at
        stopped_at=$(cut -d' ' -f1 /proc/uptime)
        kill -STOP "$tid"
        until_true 1200 restarted_since "$n" "$pid" || { echo "not restarted: $(prop ActiveState) $(prop NRestarts)"; return 1; }
        unit_log_since "$at" >"$work/watchdog.log"
        # How long systemd took to act (a figure, never asserted): the
        # journal's monotonic time of its "Watchdog timeout" line against
        # the uptime at SIGSTOP (both since boot).
        journalctl -u blecontrold.service --after-cursor="$at" -o json --no-pager \
            | sed -n '/Watchdog timeout/s/.*"__MONOTONIC_TIMESTAMP" *: *"\([0-9]*\)".*/\1/p' | head -n 1 \
            | awk -v at="$stopped_at" '{ printf "%.1f", $1 / 1e6 - at }' >"$work/watchdog-seconds"
        grep -q 'Watchdog timeout' "$work/watchdog.log" || { echo "no watchdog timeout in the journal"; return 1; }
        grep -q "Failed with result 'watchdog'" "$work/watchdog.log" || { echo "result was not 'watchdog'"; return 1; }
        awk '/Watchdog timeout/ && !w { w = NR } /PCA9685 .* every output off/ && w && !off { off = NR } /running$/ && off && !run { run = NR }
             END { exit !(w && off && run) }' "$work/watchdog.log" \
            || { echo "watchdog, safe-outputs, restart not in that order: $(tail -n 4 "$work/watchdog.log" | tr '\n' '|')"; return 1; }
        all_off
    }
    check h5 "servo thread stopped: the watchdog killed it (Result watchdog), safe-outputs, restart" watchdog_kill
    info "watchdog: systemd's timeout $(cat "$work/watchdog-seconds" 2>/dev/null) s after the servo thread stopped (WatchdogSec=$(prop WatchdogUSec)); then Result=$(prop Result) NRestarts=$(prop NRestarts)"

    # The daemon's errors at error priority: a reload of a broken board file.
    error_priority() {
        local at pid
        at=$(cursor); pid=$(prop MainPID)
        cp /etc/blecontrol/board.yaml "$work/board.good"
        printf 'servo:\n  address: [\n' >>/etc/blecontrol/board.yaml
        kill -HUP "$pid"
        until_true 120 sh -c "journalctl -u blecontrold.service -p err --after-cursor='$at' -q -o cat | grep -q 'reload refused'"
        local status=$?
        journalctl -u blecontrold.service -p err --after-cursor="$at" -q -o cat >"$work/err.log"
        cp "$work/board.good" /etc/blecontrol/board.yaml
        kill -HUP "$pid"
        [ "$status" = 0 ] || { echo "no 'reload refused' at -p err: $(journalctl -u blecontrold.service --after-cursor="$at" -q -o cat | tail -n 3 | tr '\n' '|')"; return 1; }
        # The notice-level line about the SIGHUP is in the journal, not at -p err.
        ! grep -q 'reloading' "$work/err.log" || { echo "a notice line shows at -p err"; return 1; }
        journalctl -u blecontrold.service --after-cursor="$at" -q -o cat | grep -q 'reloading' || { echo "no notice line at all"; return 1; }
        # Back to the good file; h7 checks the daemon carries on.
        until_true 120 sh -c "journalctl -u blecontrold.service --after-cursor='$at' -q -o cat | grep -q 'reload applied'" || true
    }
    check h6 "journalctl -u blecontrold -p err shows the daemon's error (a broken board file on SIGHUP), not its notices" error_priority
    check h7 "daemon still active after the reloads" is_active

    # (u) An upgrade while the board runs: dpkg restarts the service, the
    # old daemon stops with every output off (its journal line comes before
    # the new daemon's), the new version runs the administrator's board
    # file, which dpkg kept without asking (stdin is closed).
    next=$dir/blecontrol-next.deb
    if [ -f "$next" ]; then
        upgrade() {
            move_servo || return 1
            local pid at sum want
            pid=$(prop MainPID); at=$(cursor); sum=$(md5sum </etc/blecontrol/board.yaml)
            want=$(dpkg-deb -f "$next" Version)
            # The checks above started the unit several times within the
            # unit's StartLimitIntervalSec=: forget those starts, so the
            # upgrade's restart is not refused by the start limit.
            systemctl reset-failed blecontrold.service
            DEBIAN_FRONTEND=noninteractive dpkg -i "$next" </dev/null >"$work/upgrade.log" 2>&1 || { tail -n 3 "$work/upgrade.log"; return 1; }
            [ "$(dpkg-query -W -f='${Version}' blecontrol)" = "$want" ] || { echo "installed: $(dpkg-query -W -f='${Version}' blecontrol)"; return 1; }
            until_true 600 is_active || return 1
            [ "$(prop MainPID)" != "$pid" ] || { echo "not restarted (MainPID $pid)"; return 1; }
            [ "$(md5sum </etc/blecontrol/board.yaml)" = "$sum" ] && [ ! -e /etc/blecontrol/board.yaml.dpkg-dist ] || { echo "board.yaml changed"; return 1; }
            unit_log_since "$at" >"$work/upgrade-journal.log"
            awk '/stopped; every output off/ && !off { off = NR } /running$/ && off && !run { run = NR } END { exit !(off && run) }' "$work/upgrade-journal.log" \
                || { echo "no 'every output off' stop before the new daemon ran: $(tail -n 4 "$work/upgrade-journal.log" | tr '\n' '|')"; return 1; }
            all_off
        }
        check u1 "upgrade while running: old daemon stopped with every output off, the new version started, board.yaml kept, no prompt" upgrade

        # A board file the (new) daemon refuses: the unit fails once, with
        # the reason in the journal, and is not restarted (exit status 2,
        # RestartPreventExitStatus=): no loop of starts hammering the bus.
        refused_board() {
            local at n
            at=$(cursor); n=$(prop NRestarts)
            cp /etc/blecontrol/board.yaml "$work/board.good"
            printf 'servo:\n  address: [\n' >>/etc/blecontrol/board.yaml
            # As in u1: the earlier starts must not count against this one.
            systemctl reset-failed blecontrold.service
            systemctl restart blecontrold.service
            until_true 600 sh -c '[ "$(systemctl show -P ActiveState blecontrold)" = failed ]'
            local state result status restarts
            state=$(prop ActiveState); result=$(prop Result); status=$(prop ExecMainStatus); restarts=$(prop NRestarts)
            journalctl -u blecontrold.service -p err --after-cursor="$at" -q -o cat >"$work/refused.log"
            cp "$work/board.good" /etc/blecontrol/board.yaml
            systemctl reset-failed blecontrold.service
            systemctl start blecontrold.service
            until_true 600 is_active
            [ "$state" = failed ] && [ "$result" = exit-code ] && [ "$status" = 2 ] || { echo "state $state, result $result, status $status"; return 1; }
            [ "$restarts" = "$n" ] || { echo "restarted: NRestarts $n -> $restarts"; return 1; }
            grep -q 'board.yaml:[0-9]*:' "$work/refused.log" || { echo "no file:line reason at -p err: $(tail -n 2 "$work/refused.log" | tr '\n' '|')"; return 1; }
        }
        check u2 "a board file the daemon refuses: unit failed (status 2) with file:line in the journal, not restarted" refused_board
        check u3 "daemon active again with the good board file" is_active
    else
        info "upgrade checks skipped: no next package in the test copy"
    fi
fi

# --- (b) BLE: the real bluetoothd on btvirt's controllers ------------------------------------
advertising_logged() { journalctl -u blecontrold.service -b -q -o cat | grep -q 'BLE: advertising as BLEControl on hci0 (GATT application and advertisement registered)'; }
check b1 "bluetoothd active, hci0 from btvirt" sh -c 'systemctl is-active bluetooth.service && [ -e /sys/class/bluetooth/hci0 ]'
check b2 "the GATT application and advertisement registered with bluetoothd (daemon's journal line)" until_true 240 advertising_logged
bluez_sees() {
    local instances alias
    instances=$(busctl get-property org.bluez /org/bluez/hci0 org.bluez.LEAdvertisingManager1 ActiveInstances)
    alias=$(busctl get-property org.bluez /org/bluez/hci0 org.bluez.Adapter1 Alias)
    [ "$instances" = "y 1" ] && [ "$alias" = 's "BLEControl"' ] || { echo "ActiveInstances $instances, Alias $alias"; return 1; }
}
check b3 "bluetoothd's own view (busctl): one active advertisement on hci0, Alias BLEControl" until_true 60 bluez_sees
# The package's drop-in for bluetooth.service under the real systemd:
# bluetoothd without its battery plugin (no pairing pop-up on iPhones),
# and the doctor sees it.
no_battery_plugin() {
    local pid
    pid=$(systemctl show -P MainPID bluetooth.service)
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- ' -P battery' || { tr '\0' ' ' <"/proc/$pid/cmdline"; return 1; }
    [ "$(systemctl show -P DropInPaths bluetooth.service)" = /usr/lib/systemd/system/bluetooth.service.d/blecontrol.conf ] \
        || { echo "drop-ins: $(systemctl show -P DropInPaths bluetooth.service)"; return 1; }
    blecontrol doctor 2>&1 | grep -q 'OK    iPhone pairing pop-up: prevented' || { blecontrol doctor 2>&1 | grep -A1 'pop-up'; return 1; }
}
check b5 "bluetoothd runs with the package's drop-in (-P battery: no iPhone pairing pop-up), doctor says so" no_battery_plugin
check b4 "blecontrol status: BLE advertising (after two restarts)" \
    until_true 120 sh -c 'blecontrol status | grep -i "ble" | grep -qi "advertising"'
blecontrol status >"$work/status.txt" 2>&1

# --- (x) SSH from the host with the boot partition's key --------------------------------------
rm -f "/home/$ADMIN_USER/ssh-was-here"
record "SSH-READY $ADMIN_USER"
check x1 "the host logged in over SSH as $ADMIN_USER with the key" \
    until_true 1200 test -e "/home/$ADMIN_USER/ssh-was-here"

# --- logs for the host ------------------------------------------------------------------------
{
    echo "=== blecontrol status"; cat "$work/status.txt"
    echo "=== systemd-analyze security"; cat "$work/security.txt"
    echo "=== /etc/blecontrol/board.yaml (test)"; cat /etc/blecontrol/board.yaml
    echo "=== config.txt"; cat /boot/firmware/config.txt
    echo "=== cmdline.txt"; cat /boot/firmware/cmdline.txt
    echo "=== systemctl show blecontrold (ExecStopPost)"; systemctl show -p ExecStopPost blecontrold
    echo "=== journal"; journalctl -b --no-pager -o short-monotonic
} >/dev/virtio-ports/blecontrol.logs 2>&1
# KEEP=1 (BLECONTROL_IMAGE_KEEP=1): the guest stays up for a look over SSH.
[ "${KEEP:-0}" != 1 ] || touch "$work/keep"
record "DONE"
