# shellcheck shell=sh
# Sourced by Tests/BLE/run, Tests/Web/run and scripts/check-deploy: the
# shell rigs' one bounded wait, as rig.wait_until is the Python rigs' and
# `eventually` the Swift suites'.

# wait_until COMMAND…
#   runs COMMAND until it succeeds, at most 1200 times, 0.1 s apart (two
#   minutes and more); 1 if it never did. Bounded by tries, not a clock: a
#   busy machine stretches the wait, and only a missing outcome fails.
wait_until() {
    _try=0
    while [ "$_try" -lt 1200 ]; do
        "$@" && return 0
        sleep 0.1
        _try=$((_try + 1))
    done
    return 1
}
