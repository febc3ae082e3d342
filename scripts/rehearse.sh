#!/bin/bash
# The load rehearsal (issue #43): run chosen tests again and again under CPU and IO pressure,
# to shake out what fails only on a loaded machine (a full scripts/test.sh run, a busy
# hypervisor) before a landing does.
#
#   scripts/rehearse.sh [-n RUNS] [--cpu N] [--cpu-load PCT] [--io N] [--hdd N]
#                       [--keep DIR] -- PYTEST_ARGS...
#
# e.g.  scripts/rehearse.sh -n 20 --cpu 2 --io 1 -- \
#           tests/kernel/test_warm_kernel.py --lab-backend=uml -k dmcache
#
# Starts stress-ng (Debian's package; scripts/setup.sh installs it) with N CPU workers (each
# busy PCT percent of the time, 100 by default), N sync() workers (--io) and N disk writers
# (--hdd, files under the run's directory), then runs `pytest PYTEST_ARGS` RUNS times (5 by
# default) one after the other, each run's output kept in a file, and prints one line a run
# and the count. The pressure and a run still going stop on any exit (the end, a failure,
# Ctrl-C, SIGTERM; stress-ng also when this script is killed outright).
# Exit 0: every run passed; 1: some failed (their logs are kept: --keep DIR, or the
# directory printed); 2: bad usage. A run that skipped its tests counts as a failure: a
# rehearsal that ran nothing proves nothing. docs/benchmarks.md, "Test suite time".
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5 cpu=2 cpu_load=100 io=1 hdd=0 keep=""
usage() { sed -n '5,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
num() { [[ $2 =~ ^[0-9]+$ ]] || { echo "rehearse.sh: $1 takes a number, not '$2'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case $1 in
        -n) num "$1" "${2-}"; runs=$2; shift 2 ;;
        --cpu) num "$1" "${2-}"; cpu=$2; shift 2 ;;
        --cpu-load) num "$1" "${2-}"; cpu_load=$2; shift 2 ;;
        --io) num "$1" "${2-}"; io=$2; shift 2 ;;
        --hdd) num "$1" "${2-}"; hdd=$2; shift 2 ;;
        --keep) keep=${2-}; [ -n "$keep" ] || usage; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "rehearse.sh: unknown option '$1' (the pytest arguments go after --)" >&2
           usage ;;
    esac
done
[ $# -gt 0 ] || { echo "rehearse.sh: no tests given after --" >&2; usage; }
[ "$runs" -ge 1 ] || { echo "rehearse.sh: -n is at least 1" >&2; exit 2; }
command -v stress-ng >/dev/null || {
    echo "rehearse.sh: stress-ng is not installed (scripts/setup.sh installs it)" >&2; exit 2; }

dir=${keep:-$(mktemp -d /tmp/cachemgr-rehearse.XXXXXX)}
mkdir -p "$dir"
stress_pid="" test_pid=""
stop() {
    if [ -n "$test_pid" ]; then  # a run still going: interrupted first, as by Ctrl-C (the
        # lab plugin then stops its guest: cachemgr/lab/core.py)
        kill -INT "$test_pid" 2>/dev/null || true
        wait "$test_pid" 2>/dev/null || true
        test_pid=""
    fi
    if [ -n "$stress_pid" ]; then
        kill -TERM "$stress_pid" 2>/dev/null || true  # stress-ng stops its own workers
        wait "$stress_pid" 2>/dev/null || true
        stress_pid=""
    fi
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM

args=(--timeout 0 --quiet)
[ "$cpu" -gt 0 ] && args+=(--cpu "$cpu" --cpu-load "$cpu_load")
[ "$io" -gt 0 ] && args+=(--io "$io")
[ "$hdd" -gt 0 ] && args+=(--hdd "$hdd" --hdd-bytes 256M --temp-path "$dir")
if [ "$cpu" -gt 0 ] || [ "$io" -gt 0 ] || [ "$hdd" -gt 0 ]; then
    # its parent's death (this script killed outright) stops it too: setpriv --pdeathsig
    setpriv --pdeathsig TERM stress-ng "${args[@]}" >"$dir/stress-ng.log" 2>&1 &
    stress_pid=$!
    sleep 1
    kill -0 "$stress_pid" 2>/dev/null || {
        echo "rehearse.sh: stress-ng did not start:" >&2; cat "$dir/stress-ng.log" >&2; exit 1; }
fi
echo "rehearse: $runs runs of pytest $* under stress-ng --cpu $cpu --cpu-load $cpu_load" \
     "--io $io --hdd $hdd; logs in $dir"

failed=0
for i in $(seq 1 "$runs"); do
    log="$dir/run-$i.log"
    t0=$SECONDS
    rc=0
    # in the background and waited for: a signal to this script is handled at once (bash
    # runs a trap only after a foreground command ends); SIGINT made a KeyboardInterrupt
    # again in it, which a background job (or a script started as one) would ignore
    .venv/bin/python -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(sys.argv[1:]))' -p no:cacheprovider "$@" >"$log" 2>&1 </dev/null &
    test_pid=$!
    wait "$test_pid" || rc=$?
    test_pid=""
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 || true)
    if [ "$rc" != 0 ] || grep -q ' skipped' <<<"$summary" || ! grep -q ' passed' <<<"$summary"
    then
        failed=$((failed + 1))
        echo "run $i: FAILED (exit $rc, $((SECONDS - t0)) s) ${summary//=/}; log $log"
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' || true
    else
        echo "run $i: passed ($((SECONDS - t0)) s) ${summary//=/}"
    fi
done
echo "rehearse: $runs runs, $failed failed (stress-ng --cpu $cpu --cpu-load $cpu_load" \
     "--io $io --hdd $hdd; load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
[ "$failed" = 0 ]
