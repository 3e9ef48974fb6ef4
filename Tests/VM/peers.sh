#!/bin/bash
# Runs inside the VM, after guest.py has set up the i2c-stub bus (item 6 of
# issue 3): the same servo and LCD workload through Adafruit's CircuitPython
# PCA9685 library (Blinka), RPLCD (smbus2) and our daemon, counted with the
# kernel's i2c/smbus tracepoints. Writes OUT/peers-table.txt and
# OUT/peers.json (see peers.py).
#
# Usage: BUS=N [BOARD=FILE] peers.sh OUT   (OUT/guest.env is written by Tests/VM/run)
set -u
OUT=$1
# shellcheck source=/dev/null
. "$OUT/guest.env"
: "${BUS:?the stub bus number}"
[ -x "$PEERS_VENV/bin/python" ] || { echo "no peers venv (run Tests/VM/run --peers)"; exit 1; }
mountpoint -q /sys/kernel/tracing || mount -t tracefs none /sys/kernel/tracing || exit 1
[ -d /sys/kernel/tracing/events/smbus ] || { echo "this kernel has no smbus tracepoints"; exit 1; }
# Blinka's board detection has no board on a generic x86 VM: name the chip,
# the bus is chosen by number (adafruit-extended-bus).
export BLINKA_FORCECHIP=GENERIC_X86 BLINKA_FORCEBOARD=GENERIC_LINUX_PC
# The root filesystem is read-only here.
export PYTHONDONTWRITEBYTECODE=1
daemon_args=()
[ -n "${BOARD:-}" ] && daemon_args=(--daemon "$DAEMON" --cli "$CLI" --board "$BOARD")
exec "$PEERS_VENV/bin/python" "$REPO/Tests/VM/peers.py" --bus "$BUS" --out "$OUT" "${daemon_args[@]}"
