#!/bin/bash
# The load rehearsal (issue #43): run chosen tests again and again under CPU and IO pressure,
# to shake out what fails only on a loaded machine (a full scripts/test.sh run, a busy
# hypervisor) before a landing does.
#
#   scripts/rehearse.sh [--runs N] [--cpu N] [--cpu-load PCT] [--io N] [--hdd N]
#                       [--until-fail] [--backend uml|qemu] [--keep DIR]
#                       TEST... [-- PYTEST_ARGS...]
#
# e.g.  scripts/rehearse.sh --runs 20 --cpu 1 --io 1 \
#           tests/kernel/test_warm_kernel.py::test_warm_dmcache_admits_the_hot_set \
#           tests/kernel/test_paced_drain_kernel.py
#
# Starts stress-ng (Debian's package; scripts/setup.sh installs it) with N CPU workers (each
# busy PCT percent of the time, 100 by default), N sync() workers (--io) and N disk writers
# (--hdd, files under the run's directory), then runs each TEST (a pytest node id or file,
# with PYTEST_ARGS, e.g. -k NAME) on its own, one pytest at a time, RUNS times (5 by
# default) in rounds: each TEST once, then each again, so that the tests share the changes
# of the machine's load. --until-fail stops rehearsing a TEST at its first failure (the
# others go on). Kernel tests run on the --backend's kernel (uml by default). Each run's
# output is kept in a file; a line a run as it ends, then a table (Markdown): test, runs,
# failures, wall time a run and in all, the load average seen at the runs' starts, and each
# failure's first error line. The pressure and a run still going stop on any exit (the end,
# Ctrl-C, SIGTERM: the table so far is printed; stress-ng also when this script is killed
# outright). Exit 0: every run passed; 1: some failed (their logs are kept: --keep DIR, or
# the directory printed); 2: bad usage. A run that skipped its tests counts as a failure: a
# rehearsal that ran nothing proves nothing. docs/benchmarks.md, "Test suite time".
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5 cpu=2 cpu_load=100 io=1 hdd=0 keep="" until_fail=0 backend=uml
usage() { sed -n '6,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
num() { [[ $2 =~ ^[0-9]+$ ]] || { echo "rehearse.sh: $1 takes a number, not '$2'" >&2; exit 2; }; }
tests=()
while [ $# -gt 0 ]; do
    case $1 in
        -n|--runs) num "$1" "${2-}"; runs=$2; shift 2 ;;
        --cpu) num "$1" "${2-}"; cpu=$2; shift 2 ;;
        --cpu-load) num "$1" "${2-}"; cpu_load=$2; shift 2 ;;
        --io) num "$1" "${2-}"; io=$2; shift 2 ;;
        --hdd) num "$1" "${2-}"; hdd=$2; shift 2 ;;
        --until-fail) until_fail=1; shift ;;
        --backend) case ${2-} in uml|qemu) backend=$2 ;;
                   *) echo "rehearse.sh: --backend is uml or qemu, not '${2-}'" >&2; exit 2 ;;
                   esac; shift 2 ;;
        --keep) keep=${2-}; [ -n "$keep" ] || usage; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        -*) echo "rehearse.sh: unknown option '$1' (pytest's own go after --)" >&2; usage ;;
        *) tests+=("$1"); shift ;;
    esac
done
pytest_args=("$@")
# without a TEST before --, the pytest arguments are one selection, run as a whole
[ ${#tests[@]} -gt 0 ] || { [ ${#pytest_args[@]} -gt 0 ] && tests=(""); } || {
    echo "rehearse.sh: no tests given" >&2; usage; }
[ "$runs" -ge 1 ] || { echo "rehearse.sh: --runs is at least 1" >&2; exit 2; }
[ "$cpu_load" -le 100 ] || { echo "rehearse.sh: --cpu-load is a percentage" >&2; exit 2; }
[ $((cpu + io + hdd)) = 0 ] || command -v stress-ng >/dev/null || {
    echo "rehearse.sh: stress-ng is not installed (scripts/setup.sh installs it)" >&2; exit 2; }

dir=${keep:-$(mktemp -d /tmp/cachemgr-rehearse.XXXXXX)}
mkdir -p "$dir"
results=$dir/results.tsv  # a line a run: test index, run, exit, seconds, load, first error
: >"$results"
pressure="stress-ng --cpu $cpu --cpu-load $cpu_load --io $io --hdd $hdd"
t_start=$SECONDS
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+changes"
stress_pid="" test_pid="" reported=0

name() { local n="${tests[$1]} ${pytest_args[*]}"; n=${n# }; echo "${n% }"; }

table() {  # the Markdown table of what ran, from $results
    [ "$reported" = 0 ] || return 0
    reported=1
    echo
    echo "rehearse: $(date -u '+%Y-%m-%d %H:%M UTC'), $pressure, backend $backend," \
         "$((SECONDS - t_start)) s in all, commit $commit; logs in $dir"
    echo
    echo "| test | runs | failed | wall a run | wall in all | load (1 min) | first error line of each failure |"
    echo "|---|---|---|---|---|---|---|"
    local i
    for i in "${!tests[@]}"; do
        awk -F'\t' -v i="$i" -v t="$(name "$i")" '
            $1 == i { n++; s += $4; if (n == 1 || $4 < lo) lo = $4; if ($4 > hi) hi = $4
                      if (n == 1 || $5 < llo) llo = $5; if ($5 > lhi) lhi = $5
                      if ($3 != 0) { f++; e = e (e == "" ? "" : "; ") "run " $2 ": " $6 } }
            END { if (n == 0) { printf "| `%s` | 0 | 0 | | | | |\n", t; exit }
                  printf "| `%s` | %d | %d | %d-%d s | %d s | %s-%s | %s |\n",
                         t, n, f, lo, hi, s, llo, lhi, e }' "$results"
    done
}

stop() {
    if [ -n "$test_pid" ]; then  # a run still going: interrupted first, as by Ctrl-C (the
        # lab plugin then stops its guest: cachemgr/lab/core.py)
        # a run just started ignores SIGINT until its python sets the handler (bash ignores
        # SIGINT in a background job): wait for that (its SigIgn bit), then one SIGINT
        local n ign
        for n in $(seq 1 300); do
            ign=$(awk '/^SigIgn:/ {print $2}' "/proc/$test_pid/status" 2>/dev/null || true)
            [ -n "$ign" ] && (( (16#$ign & 2) != 0 )) || break
            sleep 0.1
        done
        kill -INT "$test_pid" 2>/dev/null || true
        wait "$test_pid" 2>/dev/null || true
        test_pid=""
    fi
    if [ -n "$stress_pid" ]; then
        kill -TERM "$stress_pid" 2>/dev/null || true  # stress-ng stops its own workers
        wait "$stress_pid" 2>/dev/null || true
        stress_pid=""
    fi
    table
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
    echo "$stress_pid" >"$dir/stress-ng.pid"
    sleep 1
    kill -0 "$stress_pid" 2>/dev/null || {
        echo "rehearse.sh: stress-ng did not start:" >&2; cat "$dir/stress-ng.log" >&2; exit 1; }
else
    pressure="no added pressure"
fi
echo "rehearse: ${#tests[@]} test(s), $runs runs each, one at a time, under $pressure;" \
     "logs in $dir"

# the first line that says why a run failed: its first "E " line (the exception, whole),
# else pytest's short summary ("FAILED id - why", cut to the terminal's width), else why it
# skipped (-ra), else its last line
first_error() {
    local line
    line=$(grep -m1 -E '^E ' "$1" | sed 's/^E  *//' || true)
    [ -n "$line" ] || line=$(grep -m1 -E '^(FAILED|ERROR) ' "$1" || true)
    [ -n "$line" ] || line=$(grep -m1 -E '^SKIPPED ' "$1" || true)
    [ -n "$line" ] || line=$(tail -n1 "$1")
    # one table cell: no tab, no pipe, no backquote, at most 160 characters
    line=${line//$'\t'/ }; line=${line//|/\\|}; line=${line//\`/\'}
    echo "${line:0:160}"
}

failed=0
declare -A dropped=()
for r in $(seq 1 "$runs"); do
    for i in "${!tests[@]}"; do
        [ -z "${dropped[$i]-}" ] || continue
        log="$dir/test-$((i + 1))-run-$r.log"
        load=$(cut -d' ' -f1 /proc/loadavg)
        t0=$SECONDS
        rc=0
        sel=(); [ -z "${tests[$i]}" ] || sel=("${tests[$i]}")
        # in the background and waited for: a signal to this script is handled at once (bash
        # runs a trap only after a foreground command ends); SIGINT made a KeyboardInterrupt
        # again in it, which a background job (or a script started as one) would ignore
        CACHEMGR_LAB_BACKEND=$backend .venv/bin/python -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(sys.argv[1:]))' -p no:cacheprovider -ra "${sel[@]}" "${pytest_args[@]}" \
            >"$log" 2>&1 </dev/null &
        test_pid=$!
        wait "$test_pid" || rc=$?
        test_pid=""
        secs=$((SECONDS - t0))
        summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)' "$log" \
                  | tail -1 || true)
        summary=${summary//=/}
        if [ "$rc" = 0 ] && { grep -q ' skipped' <<<"$summary" \
                              || ! grep -q ' passed' <<<"$summary"; }; then
            rc=skipped  # a run that proved nothing
        fi
        if [ "$rc" != 0 ]; then
            failed=$((failed + 1))
            err=$(first_error "$log")
            echo "$(name "$i") run $r: FAILED (exit $rc, $secs s, load $load)${summary}; log $log"
            echo "    $err"
            [ "$until_fail" = 0 ] || dropped[$i]=1
        else
            err=""
            echo "$(name "$i") run $r: passed ($secs s, load $load)${summary}"
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "$r" "$rc" "$secs" "$load" "$err" >>"$results"
    done
done
stop
[ "$failed" = 0 ]
