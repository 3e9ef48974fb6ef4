#!/bin/bash
# Runs inside the VM that Tests/VM/run boots (as root, on the host's root
# filesystem mounted read-only; only $OUT is writable, plus the guest's own
# tmpfs /run; /tmp is the host's, read-only). Sets up a real /dev/i2c-N (i2c-stub + i2c-dev) and a
# real GPIO chip (gpio-sim through configfs), then runs the checks. Each check
# appends one line to $OUT/results.txt: `PASS id: what` or `FAIL id: what: why`.
#
# Usage: guest.sh OUT   (OUT/guest.env is written by Tests/VM/run)
set -u
OUT=$1
# shellcheck source=/dev/null
. "$OUT/guest.env"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
results=$OUT/results.txt
: > "$results"
work=/run/blecontrol-vm
mkdir -p "$work"

say() { echo "[guest $(date +%T)] $*"; }
record() { echo "$*" >> "$results"; echo "$*"; }
pass() { record "PASS $1: $2"; }
fail() { record "FAIL $1: $2${3:+: $3}"; }
# check ID WHAT COMMAND...: PASS when COMMAND succeeds; its output is the why.
# COMMAND runs in this shell (setup functions set variables).
check() {
    local id=$1 what=$2
    shift 2
    if "$@" > "$work/why" 2>&1; then pass "$id" "$what"; else fail "$id" "$what" "$(tail -3 "$work/why" | tr '\n' ' ')"; fi
}

# --- The Raspberry Pi board file where its devices are missing ------------------
# Before any I2C module is loaded there is no /dev/i2c-1 and no line GPIO17:
# the daemon must refuse with a message and an exit status, not crash or hang.
rpi_board_fails_clearly() {
    local status
    timeout 30 "$DAEMON" --board "$REPO/board/raspberry-pi.yaml" --socket "$work/rpi.sock" \
        > "$OUT/daemon-rpi.log" 2>&1
    status=$?
    [ "$status" -ge 1 ] && [ "$status" -lt 124 ] || { echo "exit status $status: $(tail -2 "$OUT/daemon-rpi.log")"; return 1; }
    grep -Eq 'i2c-1|GPIO17|gpiochip0' "$OUT/daemon-rpi.log" || { echo "no word of the missing device: $(tail -2 "$OUT/daemon-rpi.log")"; return 1; }
}
check r1 "board/raspberry-pi.yaml without its devices: clear refusal, exit status 1-123" rpi_board_fails_clearly

# --- I2C: i2c-stub answers at the PCA9685's and the LCD backpack's addresses --
BUS=""
setup_i2c() {
    modprobe i2c-stub chip_addr=0x40,0x41,0x27 || return 1
    modprobe i2c-dev || return 1
    local dev
    # Found by name: QEMU's own SMBus controller may take i2c-0.
    for dev in /sys/bus/i2c/devices/i2c-*; do
        if [ "$(cat "$dev/name")" = "SMBus stub driver" ]; then BUS=${dev##*/i2c-}; fi
    done
    [ -n "$BUS" ] || { echo "no adapter named 'SMBus stub driver'"; return 1; }
    for _ in $(seq 50); do [ -c "/dev/i2c-$BUS" ] && return 0; sleep 0.1; done
    echo "/dev/i2c-$BUS did not appear"; return 1
}
check setup-i2c "i2c-stub (0x40, 0x41, 0x27) and i2c-dev loaded, stub bus found by name" setup_i2c
say "stub bus: i2c-$BUS"

# Register helpers on the stub bus (SMBus byte data; prints 0xNN).
reg() { i2cget -y "$BUS" "$1" "$2" b 2>&1; }
poke() { i2cset -y "$BUS" "$1" "$2" "$3" b; }
# expect_reg ADDR REG VALUE: the register reads VALUE (both as numbers).
expect_reg() {
    local got; got=$(reg "$1" "$2")
    [ $((got)) -eq $(($3)) ] 2>/dev/null || { echo "register $2 of $1 reads $got, want $3"; return 1; }
}
# wait_reg ADDR REG VALUE SECONDS: as expect_reg, polled (the servo thread
# flushes on its own schedule).
wait_reg() {
    local deadline=$(( $(date +%s) + $4 ))
    while ! expect_reg "$1" "$2" "$3" >/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || { expect_reg "$1" "$2" "$3"; return 1; }
        sleep 0.1
    done
}

# --- GPIO: a gpio-sim chip with one bank of 8 lines ---------------------------
CHIP=""; SIMDEV=""
setup_gpio() {
    modprobe configfs || return 1
    mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || return 1
    [ -f "$GPIO_SIM_KO" ] || { echo "$GPIO_SIM_KO is not visible in the guest (virtme covers /var/cache, /var/tmp, /var/log with tmpfs)"; return 1; }
    insmod "$GPIO_SIM_KO" || return 1
    local cfg=/sys/kernel/config/gpio-sim/blecontrol
    mkdir "$cfg" "$cfg/bank0" "$cfg/bank0/line0" || return 1
    echo 8 > "$cfg/bank0/num_lines"
    echo status-led > "$cfg/bank0/line0/name"
    echo 1 > "$cfg/live" || return 1
    SIMDEV=$(cat "$cfg/dev_name"); CHIP=$(cat "$cfg/bank0/chip_name")
    [ -c "/dev/$CHIP" ] || { echo "/dev/$CHIP missing"; return 1; }
    [ -r "/sys/devices/platform/$SIMDEV/$CHIP/sim_gpio0/value" ] || { echo "sim_gpio0/value missing"; return 1; }
}
check setup-gpio "gpio-sim built for this kernel loads; chip with 8 lines created through configfs" setup_gpio
say "gpio-sim: $SIMDEV/$CHIP"
LEDVALUE=/sys/devices/platform/$SIMDEV/$CHIP/sim_gpio0/value
# debugfs names each requested line's consumer.
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug 2>/dev/null

# --- (a) i2c-stub sanity through i2c-tools -------------------------------------
if [ -n "$BUS" ]; then
    check a1 "byte write then read back at 0x40" sh -c "i2cset -y $BUS 0x40 0x10 0xa5 b && [ \$((\$(i2cget -y $BUS 0x40 0x10 b))) -eq $((0xa5)) ]"
    check a2 "word write then read back at 0x27" sh -c "i2cset -y $BUS 0x27 0x20 0x1234 w && [ \$((\$(i2cget -y $BUS 0x27 0x20 w))) -eq $((0x1234)) ]"
    check a3 "I2C block write lands in consecutive registers" sh -c "i2cset -y $BUS 0x40 0x30 0x01 0x02 0x03 i && [ \$((\$(i2cget -y $BUS 0x40 0x32 b))) -eq 3 ]"
    check a4 "absent address 0x26 does not acknowledge" sh -c "! i2cget -y $BUS 0x26 0x00 b"
    i2cdetect -F "$BUS" > "$OUT/i2c-funcs.txt" 2>&1
    # The stub is SMBus only: our backend must fall back from I2C_RDWR.
    check a5 "stub adapter lacks plain I2C (the daemon must use its SMBus fallback)" grep -Eq '^I2C +no' "$OUT/i2c-funcs.txt"
    for r in 0x10 0x20 0x21 0x30 0x31 0x32; do poke 0x40 $r 0; poke 0x27 $r 0; done
else
    fail a "i2c-stub sanity" "no stub bus"
fi

# --- (g) gpio-sim sanity through libgpiod's tools (lines 1 and 2; 0 is the LED) --
gpio_output_seen() { # a line held high by gpioset reads 1 on the sim side; released, 0
    local pid value
    if gpioset --help 2>&1 | grep -q -- '--mode'; then
        gpioset --mode=signal "$CHIP" 1=1 & pid=$!          # libgpiod 1.x
    else
        gpioset -c "$CHIP" 1=1 & pid=$!                      # libgpiod 2.x holds by default
    fi
    for _ in $(seq 50); do
        value=$(cat "/sys/devices/platform/$SIMDEV/$CHIP/sim_gpio1/value")
        [ "$value" = 1 ] && break
        sleep 0.1
    done
    kill "$pid"; wait "$pid" 2>/dev/null
    [ "$value" = 1 ] || { echo "held high, sim_gpio1/value reads $value"; return 1; }
    value=$(cat "/sys/devices/platform/$SIMDEV/$CHIP/sim_gpio1/value")
    [ "$value" = 0 ] || { echo "released, sim_gpio1/value reads $value (want its pull-down)"; return 1; }
}
gpio_input_seen() { # the sim side's pull is what a reader of the line sees
    local pull=/sys/devices/platform/$SIMDEV/$CHIP/sim_gpio2/pull up down
    if gpioget --help 2>&1 | grep -q -- '--chip'; then
        read_line() { gpioget --numeric -c "$CHIP" 2; }      # libgpiod 2.x
    else
        read_line() { gpioget "$CHIP" 2; }                   # libgpiod 1.x
    fi
    echo pull-up > "$pull"; up=$(read_line)
    echo pull-down > "$pull"; down=$(read_line)
    [ "$up" = 1 ] && [ "$down" = 0 ] || { echo "pull-up read $up, pull-down read $down"; return 1; }
}
if [ -n "$CHIP" ]; then
    check g1 "gpio-sim output: a held line reads 1, released 0" gpio_output_seen
    check g2 "gpio-sim input: the simulated pull reaches the reader" gpio_input_seen
else
    fail g "gpio-sim sanity" "no gpio-sim chip"
fi

# --- (b) the daemon's Linux backends against the stub and the simulated chip ---
SOCKET=$work/control.sock
write_board() { # write_board FILE LCD-ADDRESS
    cat > "$1" <<EOF
# Generated by Tests/VM/guest.sh: i2c-stub bus, gpio-sim LED.
name: vm-stub
buses:
  stub:
    device: /dev/i2c-$BUS
servo:
  bus: stub
  address: 0x40
  frequency_hz: 50
  oscillator_hz: 25000000
  output_drive: totem-pole
  channels:
    - { channel: 0, output: 0, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 2, output: 2, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 3, output: 3, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 4, output: 4, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 5, output: 5, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 6, output: 6, role: servo, min_us: 1000, max_us: 2000 }
    - { channel: 7, output: 7, role: servo, min_us: 1000, max_us: 2000 }
lcd:
  bus: stub
  address: $2
  columns: 16
  rows: 2
  pins: { rs: 0, rw: 1, e: 2, backlight: 3, d4: 4, d5: 5, d6: 6, d7: 7 }
  chars_per_transaction: 4
led:
  chip: $CHIP
  line: 0
switches:
  - { switch: 0, chip: $CHIP, line: 1 }
  - { switch: 1, chip: $CHIP, line: 2 }
  - { switch: 2, chip: $CHIP, line: 3, safe: on }
  - { switch: 3, chip: $CHIP, line: 4 }
ble:
  enabled: false
transports:
  tcp:
    enabled: true
    listen: 127.0.0.1:0
control:
  socket: $SOCKET
EOF
}

DPID=""
# start_daemon BOARD LOG: starts it and waits until the control socket answers.
start_daemon() {
    rm -f "$SOCKET"
    "$DAEMON" --board "$1" --socket "$SOCKET" --tcp 127.0.0.1:0 > "$2" 2>&1 &
    DPID=$!
    for _ in $(seq 300); do
        kill -0 "$DPID" 2>/dev/null || { wait "$DPID"; echo "exited with status $? at start: $(tail -2 "$2" | tr '\n' ' ')"; DPID=""; return 1; }
        "$CLI" status --socket "$SOCKET" --json > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "control socket did not answer within 30 s: $(tail -2 "$2" | tr '\n' ' ')"; return 1
}
stop_daemon() { # SIGTERM; the daemon must exit 0 within 15 s
    [ -n "$DPID" ] || { echo "not running"; return 1; }
    kill -TERM "$DPID"
    local status
    for _ in $(seq 150); do
        if ! kill -0 "$DPID" 2>/dev/null; then wait "$DPID"; status=$?; DPID=""; [ "$status" = 0 ] || { echo "exit status $status"; return 1; }; return 0; fi
        sleep 0.1
    done
    kill -KILL "$DPID"; DPID=""; echo "still running 15 s after SIGTERM"; return 1
}
cli() { "$CLI" "$@" --socket "$SOCKET"; }
# The LED line must change while the daemon holds it (slow blink).
led_toggles() {
    local seen0=0 seen1=0 value
    for _ in $(seq 40); do
        value=$(cat "$LEDVALUE")
        [ "$value" = 0 ] && seen0=1
        [ "$value" = 1 ] && seen1=1
        [ $seen0 = 1 ] && [ $seen1 = 1 ] && return 0
        sleep 0.1
    done
    echo "sampled only: $( [ $seen0 = 1 ] && echo 0) $( [ $seen1 = 1 ] && echo 1) over 4 s"
    return 1
}
consumer_is() { # the LED line's consumer as debugfs shows it
    if [ "$1" = none ]; then ! grep -q blecontrold /sys/kernel/debug/gpio
    else grep -q "$1" /sys/kernel/debug/gpio || { cat /sys/kernel/debug/gpio; return 1; }
    fi
}
poison_led0() { for r in 0x06 0x07 0x08 0x09; do poke 0x40 $r 0xee; done; }
servo_lands() { # LED0_ON = 0, LED0_OFF = 307 (1500 µs of a 50 Hz frame, 25 MHz, prescale 121)
    wait_reg 0x40 0x08 0x33 5 && expect_reg 0x40 0x09 0x01 && expect_reg 0x40 0x06 0x00 && expect_reg 0x40 0x07 0x00
}

# status_holds EXPR [SECONDS]: the Python expression EXPR over the status
# object `s` (blecontrol status --json) becomes true within SECONDS (default 0).
status_holds() {
    local deadline=$(( $(date +%s) + ${2:-0} ))
    while :; do
        if "$CLI" status --socket "$SOCKET" --json > "$work/status.json" 2>&1 \
            && /usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[2])); sys.exit(0 if eval(sys.argv[1]) else 1)' "$1" "$work/status.json" 2>/dev/null; then
            return 0
        fi
        [ "$(date +%s)" -lt "$deadline" ] || break
        sleep 0.2
    done
    echo "not true: $1; status: $(/usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(json.dumps({k: s.get(k) for k in ("lcd", "led", "servo")}))' "$work/status.json" 2>/dev/null || cat "$work/status.json")"
    return 1
}
mode1_awake() { # PCA9685 MODE1 bit 4 (SLEEP) clear: the oscillator runs (datasheet 7.3.1)
    local mode1; mode1=$(reg 0x40 0x00)
    [ $(( mode1 & 0x10 )) -eq 0 ] || { echo "MODE1 = $mode1"; return 1; }
}
servo_command_lands() { cli enable 0 on && cli servo 0 500 && servo_lands; }

run_daemon_checks() {
    local board=$work/board-vm.yaml board_absent=$work/board-vm-lcd-absent.yaml
    write_board "$board" 0x27
    write_board "$board_absent" 0x26
    cp "$board" "$board_absent" "$OUT/"
    check b0 "board file for the VM is valid" "$DAEMON" --board "$board" --check-board

    # Poison what the daemon must write, so a pass proves it wrote it.
    poke 0x40 0xfd 0x00; poke 0x40 0xfe 0x00; poke 0x40 0x00 0x00; poison_led0
    if ! start_daemon "$board" "$OUT/daemon-1.log" > "$work/why" 2>&1; then why=$(cat "$work/why")
        fail b1 "daemon starts on /dev/i2c-$BUS and $CHIP" "$why"
        fail b "remaining daemon checks" "not run: the daemon did not start"
        return
    fi
    pass b1 "daemon starts on /dev/i2c-$BUS and $CHIP"
    check b2 "startup all-off: ALL_LED_OFF_H (0xFD) = 0x10" wait_reg 0x40 0xfd 0x10 5
    check b3 "PRE_SCALE (0xFE) = 121 (50 Hz at 25 MHz)" expect_reg 0x40 0xfe 0x79
    check b4 "MODE1 awake (SLEEP bit clear)" mode1_awake
    check b5 "enable 0 on + servo 0 500: LED0_ON = 0, LED0_OFF = 307 (0x133)" servo_command_lands
    check b6 "status: channel 0 enabled, pulse about 1500 µs" \
        status_holds 's["channels"][0]["enabled"] and 1490 <= s["channels"][0]["pulse_us"] <= 1510'
    check b7 "status: LCD at 0x27 online" status_holds 's["lcd"]["online"] is True'
    cli lcd 0 Hello > /dev/null 2>&1
    check b8 "lcd 0 Hello reaches the framebuffer" status_holds 's["lcd"]["lines"][0].startswith("Hello")' 3
    check b9 "LED line held by consumer blecontrold" consumer_is blecontrold
    check b10 "LED line toggles (both 0 and 1 seen on sim_gpio0)" led_toggles
    cli status --json > "$OUT/status-1.json" 2>&1
    poke 0x40 0xfd 0x00
    check b11 "SIGTERM: daemon exits 0" stop_daemon
    check b12 "shutdown: all outputs off again (0xFD = 0x10)" expect_reg 0x40 0xfd 0x10
    check b13 "shutdown: chip not put to sleep (MODE1 SLEEP clear)" mode1_awake
    check b14 "LED line released after exit" consumer_is none

    # The LCD at an address nothing answers at: the daemon keeps going.
    poison_led0
    if ! start_daemon "$board_absent" "$OUT/daemon-2.log" > "$work/why" 2>&1; then why=$(cat "$work/why")
        fail b20 "daemon starts with the LCD at absent 0x26" "$why"
        return
    fi
    pass b20 "daemon starts with the LCD at absent 0x26"
    sleep 3
    check b21 "daemon still running 3 s later" kill -0 "$DPID"
    check b22 "status: LCD offline with an error" status_holds 's["lcd"]["online"] is False and bool(s["lcd"].get("error"))' 
    poison_led0
    check b23 "servo write still lands with the LCD offline" servo_command_lands
    cli status --json > "$OUT/status-2.json" 2>&1
    check b24 "SIGTERM: daemon exits 0" stop_daemon
    # Probed about once a second all along, but reported once.
    check b25 "the LCD's failure logged once, not per probe" \
        sh -c "n=\$(grep -ci 'lcd.*offline' '$OUT/daemon-2.log'); [ \"\$n\" = 1 ] || { echo \"\$n lines about the LCD offline\"; exit 1; }"
}
# --- (d) a crash and safe-outputs (issue #5), doctor (issue #6), and the
# Linux backends' own tests against the real kernel interfaces (issue #3) ---
run_recovery_checks() {
    local board=$work/board-vm.yaml
    poison_led0
    if ! start_daemon "$board" "$OUT/daemon-3.log" > "$work/why" 2>&1; then
        fail d1 "daemon starts for the crash test" "$(cat "$work/why")"; return
    fi
    check d1 "servo 0 500 lands before the crash" servo_command_lands
    kill -KILL "$DPID"; wait "$DPID" 2>/dev/null; DPID=""
    # After kill -9 nothing switched the chip off: the motor would keep going.
    check d2 "kill -9: the chip keeps producing the last pulse (LED0_OFF_L = 0x33)" expect_reg 0x40 0x08 0x33
    poke 0x40 0xfd 0x00
    check d3 "safe-outputs after the crash exits 0" "$DAEMON" safe-outputs --board "$board"
    check d4 "safe-outputs: every output off with one write (0xFD = 0x10)" expect_reg 0x40 0xfd 0x10
    check d5 "safe-outputs does not sleep the chip (MODE1 SLEEP clear)" mode1_awake

    if start_daemon "$board" "$OUT/daemon-4.log" > "$work/why" 2>&1; then
        "$CLI" doctor --board "$board" --socket "$SOCKET" > "$OUT/doctor.txt" 2>&1
        check d6 "doctor: the bus, the PCA9685 and the LCD backpack answer" sh -c "
            grep -Eq '^ *OK +bus ' '$OUT/doctor.txt' && grep -Eq '^ *OK +PCA9685 0x40' '$OUT/doctor.txt' &&
            grep -Eq '^ *OK +LCD backpack 0x27' '$OUT/doctor.txt' || { grep -E 'FAIL|WARN' '$OUT/doctor.txt' | head -3; exit 1; }"
        check d7 "doctor: the daemon and its servo path are reported online" sh -c "grep -Eq '^ *OK +servo path: PCA9685 online' '$OUT/doctor.txt'"
        stop_daemon > /dev/null 2>&1
    else
        fail d6 "doctor against a running daemon" "$(cat "$work/why")"
    fi

    local bundle
    bundle=$(dirname "$DAEMON")/BLEControlPackageTests.xctest
    if [ -x "$bundle" ]; then
        BLC_TEST_I2C_BUS=/dev/i2c-$BUS BLC_TEST_GPIOSIM_CHIP=/dev/$CHIP \
            BLC_TEST_GPIOSIM_SYSFS=/sys/devices/platform/$SIMDEV/$CHIP \
            BLC_TEST_GPIOSIM_LINE_NAME=status-led BLC_TEST_GPIOSIM_LINE_OFFSET=0 TMPDIR=$work \
            "$bundle" --testing-library swift-testing --filter LinuxHardwareTests > "$OUT/linux-hardware-tests.log" 2>&1
        check d8 "LinuxHardwareTests against i2c-stub and gpio-sim: none skipped, all pass" sh -c "
            grep -q 'Test run with .* passed' '$OUT/linux-hardware-tests.log' && ! grep -q 'skipped' '$OUT/linux-hardware-tests.log' ||
            { grep -E 'failed|skipped|error' '$OUT/linux-hardware-tests.log' | head -3; exit 1; }"
    else
        fail d8 "LinuxHardwareTests in the VM" "no test bundle at $bundle (build with --build-tests)"
    fi
}

# --- (e) switches on gpio-sim, one instance per board, signals (issues 12, 13) --
simline() { cat "/sys/devices/platform/$SIMDEV/$CHIP/sim_gpio$1/value"; }
switch_lines_are() { # switch_lines_are V1 V2 V3 V4: sim lines 1-4 read these
    local want="$*" got
    for _ in $(seq 50); do
        got="$(simline 1) $(simline 2) $(simline 3) $(simline 4)"
        [ "$got" = "$want" ] && return 0
        sleep 0.1
    done
    echo "lines 1-4 read $got, want $want"; return 1
}
central_leaves() { # a TCP central sends one frame and goes away: the last central left
    local port
    port=$("$CLI" status --socket "$SOCKET" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["transports"]["tcp"].rsplit(":", 1)[1])')
    /usr/bin/python3 -c 'import socket,sys; s=socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.sendall(bytes([0, 0])); s.close()' "$port"
}
second_instance_refused() {
    local out status
    out=$(timeout 30 "$DAEMON" --board "$1" --socket "$work/second.sock" 2>&1); status=$?
    [ "$status" = 1 ] || { echo "second daemon exit status $status: $out"; return 1; }
    echo "$out" | grep -q "already runs this board" || { echo "no word of the lock: $out"; return 1; }
}
signal_stops_all_off() { # signal_stops_all_off SIGNAL: exits 0 with every output off
    poke 0x40 0xfd 0x00
    kill -"$1" "$DPID"
    local status
    for _ in $(seq 150); do
        if ! kill -0 "$DPID" 2>/dev/null; then wait "$DPID"; status=$?; DPID=""; break; fi
        sleep 0.1
    done
    [ -z "$DPID" ] || { kill -KILL "$DPID"; DPID=""; echo "still running 15 s after SIG$1"; return 1; }
    [ "$status" = 0 ] || { echo "exit status $status after SIG$1"; return 1; }
    expect_reg 0x40 0xfd 0x10
}
run_safety_checks() {
    local board=$work/board-vm.yaml
    if ! start_daemon "$board" "$OUT/daemon-5.log" > "$work/why" 2>&1; then
        fail e1 "daemon starts for the switch and safety checks" "$(cat "$work/why")"; return
    fi
    cli switch 0 on > /dev/null; cli switch 1 off > /dev/null; cli switch 2 on > /dev/null; cli switch 3 on > /dev/null
    check e1 "SWITCH_VAL through libgpiod: gpio-sim lines 1-4 read 1 0 1 1" switch_lines_are 1 0 1 1
    check e2 "switch 9 is not on this board: ERROR 06, exit status 1" sh -c "out=\$('$CLI' switch 9 on --socket '$SOCKET'); [ \$? = 1 ] && echo \"\$out\" | grep -q 'ERROR for command 6'"
    check e3 "status lists the four switches with their lines" status_holds '[w["on"] for w in s["switches"]] == [True, False, True, True] and s["switches"][0]["output"].endswith(":1")'
    central_leaves
    check e4 "the last central leaves: failsafe, every switch to its safe state (2 stays on)" switch_lines_are 0 0 1 0

    # A second daemon for the same board: refused before it opens the bus.
    poke 0x40 0xfd 0x00; poison_led0
    check e5 "a second blecontrold for the same board exits 1 naming the lock" second_instance_refused "$board"
    check e6 "… without writing to the bus (ALL_LED_OFF_H and LED0 untouched)" sh -c "[ \$((\$(i2cget -y $BUS 0x40 0xfd b))) -eq 0 ] && [ \$((\$(i2cget -y $BUS 0x40 0x08 b))) -eq $((0xee)) ]"

    # SIGHUP with the same file: reloaded, nothing changes; the daemon runs on.
    cli enable 0 on > /dev/null; cli servo 0 500 > /dev/null
    kill -HUP "$DPID"
    check e7 "SIGHUP reloads the board file and the daemon runs on" status_holds 's["configuration"]["reloads"] == 1 and s["configuration"]["last_reload"].startswith("applied")' 10
    check e8 "… the servo output kept its pulse (LED0_OFF = 307)" expect_reg 0x40 0x08 0x33
    # SIGUSR1 would end a daemon by default: here it stops it, outputs off.
    check e9 "SIGUSR1: exit 0 through the all-off path (0xFD = 0x10)" signal_stops_all_off USR1
}

# --- (e) the wall clock steps back an hour (issue 12): a Pi has no RTC and --
# NTP steps its clock. Every wait in the daemon is on the monotonic clock, so
# the watchdog pings and the silence failsafe carry on as if nothing
# happened; a wait on CLOCK_REALTIME would sleep the extra hour. Only this
# VM's clock is stepped, and its loops count iterations, not wall seconds.
count_pings() { grep -c '^WATCHDOG=1' "$work/notify.log" 2>/dev/null || echo 0; }
pings_after() { # pings_after N: more than N WATCHDOG=1 arrive (bound: 60 s)
    for _ in $(seq 600); do [ "$(count_pings)" -gt "$1" ] && return 0; sleep 0.1; done
    echo "$(count_pings) pings, wanted more than $1"; return 1
}
failsafe_engaged() { # failsafe_engaged WORD: status names a failsafe whose reason has WORD (bound: 60 s)
    for _ in $(seq 300); do
        "$CLI" status --socket "$SOCKET" --json > "$work/status.json" 2>/dev/null \
            && /usr/bin/python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["servo"]["failsafe"]; sys.exit(0 if f and sys.argv[2] in f else 1)' "$work/status.json" "$1" && return 0
        sleep 0.2
    done
    echo "no $1 failsafe: $(cat "$work/status.json")"; return 1
}
run_clock_checks() {
    local board=$work/board-clock.yaml port before
    { cat "$work/board-vm.yaml"; printf 'failsafe:\n  silence_timeout_ms: 3000\n'; } > "$board"
    rm -f "$work/notify.sock" "$work/notify.log"
    /usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a") as log:
    while True:
        for line in s.recv(4096).decode().splitlines():
            log.write(line + "\n"); log.flush()
' "$work/notify.sock" "$work/notify.log" &
    local listener=$!
    if ! NOTIFY_SOCKET=$work/notify.sock WATCHDOG_USEC=400000 start_daemon "$board" "$OUT/daemon-clock.log" > "$work/why" 2>&1; then
        fail e10 "daemon starts for the clock checks" "$(cat "$work/why")"; kill "$listener"; return
    fi
    # A central that enables channel 0, sends one value, then stays connected and silent.
    port=$("$CLI" status --socket "$SOCKET" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["transports"]["tcp"].rsplit(":", 1)[1])')
    /usr/bin/python3 -c 'import socket,sys,time; s=socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.sendall(bytes([1,2,0,1, 2,3,0,1,244])); time.sleep(120)' "$port" &
    local central=$!
    pings_after 2 > /dev/null
    before=$(count_pings)
    date -s "@$(( $(date +%s) - 3600 ))" > /dev/null
    check e10 "the wall clock steps back an hour: the watchdog pings go on" pings_after $((before + 4))
    check e11 "… and the silence timeout still engages the failsafe" failsafe_engaged "no frame"
    date -s "@$(( $(date +%s) + 3600 ))" > /dev/null
    kill "$central" 2>/dev/null
    check e12 "… and the daemon stops on SIGTERM, exit 0" stop_daemon
    kill "$listener" 2>/dev/null
}

# --- (f) two PCA9685s on the stub bus (issue 15): 0x40 and 0x41 -------------
run_multichip_checks() {
    local board=$work/board-two-chips.yaml before
    # The VM board with the servo section replaced by two chips (board/hexapod.yaml's shape).
    /usr/bin/python3 - "$work/board-vm.yaml" "$board" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
servo = """servo:
  chips:
    - { bus: stub, address: 0x40 }
    - { bus: stub, address: 0x41 }
  channels:
    - { channel: 0, output: "0:0", role: servo }
    - { channel: 17, output: "1:8", role: servo }
"""
text = re.sub(r"servo:\n(  .*\n)+", servo, text)
text = re.sub(r"switches:\n(  .*\n)+", "", text)
open(sys.argv[2], "w").write(text)
PY
    poke 0x41 0xfd 0x00; poke 0x41 0x28 0xee
    if ! start_daemon "$board" "$OUT/daemon-two-chips.log" > "$work/why" 2>&1; then
        fail f1 "daemon starts with two PCA9685s" "$(cat "$work/why")"; return
    fi
    check f1 "two chips: both initialised all off at start (0xFD = 0x10 at 0x40 and 0x41)" sh -c "[ \$((\$(i2cget -y $BUS 0x40 0xfd b))) -eq 16 ] && [ \$((\$(i2cget -y $BUS 0x41 0xfd b))) -eq 16 ]"
    before=$(reg 0x40 0x08)
    cli enable 17 on > /dev/null; cli servo 17 500 > /dev/null
    # Channel 17 is the second chip's output 8: LED8_OFF at 0x06 + 4 × 8 + 2 = 0x28.
    check f2 "channel 17 drives output 8 of the chip at 0x41 (LED8_OFF_L = 0x33)" wait_reg 0x41 0x28 0x33 30
    check f3 "… and leaves the chip at 0x40 alone (LED0_OFF_L unchanged)" expect_reg 0x40 0x08 "$before"
    "$CLI" doctor --board "$board" --socket "$SOCKET" > "$OUT/doctor-two-chips.txt" 2>&1
    check f4 "doctor probes both chips" sh -c "grep -Eq '^ *OK +PCA9685 0x40' '$OUT/doctor-two-chips.txt' && grep -Eq '^ *OK +PCA9685 0x41' '$OUT/doctor-two-chips.txt'"
    kill -KILL "$DPID"; wait "$DPID" 2>/dev/null; DPID=""
    poke 0x40 0xfd 0x00; poke 0x41 0xfd 0x00
    "$DAEMON" safe-outputs --board "$board" > "$work/safe.txt" 2>&1
    check f5 "safe-outputs after kill -9 switches both chips off (0xFD = 0x10 at 0x40 and 0x41)" sh -c "[ \$((\$(i2cget -y $BUS 0x40 0xfd b))) -eq 16 ] && [ \$((\$(i2cget -y $BUS 0x41 0xfd b))) -eq 16 ] || cat '$work/safe.txt'"
}

if [ -n "$BUS" ] && [ -n "$CHIP" ]; then
    run_daemon_checks
    run_recovery_checks
    run_safety_checks
    run_clock_checks
    run_multichip_checks
else
    fail b "daemon checks" "not run: no stub bus or no gpio-sim chip"
fi
[ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null

# --- (c) the peer comparison (item 6), when asked for --------------------------
if [ "$PEERS" = 1 ]; then
    board=""; [ -f "$work/board-vm.yaml" ] && board=$work/board-vm.yaml
    say "peer comparison"
    BUS=$BUS BOARD=$board "$REPO/Tests/VM/peers.sh" "$OUT" > "$OUT/peers.log" 2>&1
    status=$?
    if [ $status = 0 ]; then pass c "peer comparison ran (table in peers-table.txt)"; else fail c "peer comparison" "exit $status, see peers.log: $(tail -2 "$OUT/peers.log" | tr '\n' ' ')"; fi
fi

# --- (v) BLE: hci_vhci + btvirt + the real bluetoothd + a Bumble central -------
# (issue 4, item 9; Tests/VM/ble-guest.sh appends its own PASS/FAIL lines)
if [ "${BLE:-0}" = 1 ]; then
    say "BLE checks"
    "$REPO/Tests/VM/ble-guest.sh" "$OUT" > "$OUT/ble-guest.log" 2>&1
    status=$?
    [ $status = 0 ] || fail ble "BLE checks ran to their end" "exit $status, see ble-guest.log: $(tail -2 "$OUT/ble-guest.log" | tr '\n' ' ')"
fi

dmesg > "$OUT/dmesg.txt" 2>&1
touch "$OUT/guest-done"
sync
grep -q '^FAIL' "$results" && exit 1
exit 0
