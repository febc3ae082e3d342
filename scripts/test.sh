#!/bin/bash
# cachemgr test suite: README's second command (and exactly what .ci/run calls).
#
#   scripts/test.sh
#
# Makes sure the set-up is in place (scripts/setup.sh --no-demo), then runs: ruff, mypy,
# then three lanes at once: the Debian package's build (scripts/build-deb.sh), the Ansible
# collection's unit tests and the kernel smoke set on qemu with Debian 12's own kernel (the
# package installed and purged there); the unit tests; and, once the package is built, the
# kernel tests on User-Mode Linux (each boots its own guest; the Ansible role installs the
# package in one). The UML set prints as it runs, the other two lanes' output follows. Fails
# if any of them fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-demo
py=.venv/bin/python
# Byte-compile once up front: lab guests import cachemgr from this checkout, and a qemu (TCG)
# guest compiling every module again in each process costs seconds per cachemgr call.
"$py" -m compileall -q cachemgr tui tests >/dev/null
export PYTHONDONTWRITEBYTECODE=1
step() { echo; echo "=== $*"; }

step "ruff"
.venv/bin/ruff check cachemgr tui tests
step "mypy"
.venv/bin/mypy
# Three lanes at once, each in its own log, printed when all have ended:
# - the package lane: the Debian package's build (the qemu set installs and purges it, the
#   UML set's Ansible test installs it with the role), the Ansible collection's unit tests
#   (ansible-test, ansible-lint, plays on captures: ~70 CPU-s, mostly subprocesses), then the
#   kernel smoke set on qemu (one TCG guest at a time, about 0.7 of a CPU);
# - the unit tests, on two workers (one process, beside six other busy ones, would be the
#   last lane to end);
# - the UML kernel tests, four guests at a time, started as soon as the package is built.
# On 2 CPUs the suite is bound by CPU, and by nothing else only if something is always ready
# to run: a kernel test spends much of its wall time waiting (on its guest's disks, on a
# dm-delay disk, on a window it measures), and with the UML set waiting for the unit tests to
# end, and then three guests alone after the qemu set ended, the full run of 2026-11-28 used
# 1.38 of the 2 CPUs on average (3498 CPU-s in 2528 s). docs/benchmarks.md, "Test suite time".
step "three lanes at once: the package lane (the .deb, the Ansible unit tests, the kernel smoke set on qemu with Debian 12's kernel), the unit tests, the UML kernel tests"
qemu_log=$(mktemp /tmp/cachemgr-qemu-smoke.XXXXXX)
unit_log=$(mktemp /tmp/cachemgr-unit.XXXXXX)
deb_rc=$(mktemp /tmp/cachemgr-deb-rc.XXXXXX)
ansible_units=(tests/unit/test_ansible_*.py)
# the lane's own exit code is 0 only if the build, the Ansible unit tests and the qemu set
# passed; the build's exit code goes to $deb_rc as soon as it is known
{ rc=0; scripts/build-deb.sh || rc=$?; echo "$rc" >"$deb_rc"
  ans=0; "$py" -m pytest -p no:cacheprovider "${ansible_units[@]}" --timeout=300 \
      --durations=5 || ans=$?
  q="not run (no package)"
  [ "$rc" = 0 ] && { q=0; "$py" -m pytest -p no:cacheprovider tests -m qemu_smoke \
      --lab-backend=qemu --durations=15 || q=$?; }
  echo "package lane: build-deb exit $rc, Ansible unit tests exit $ans, qemu set exit $q"
  [ "$rc" = 0 ] && [ "$ans" = 0 ] && [ "$q" = 0 ]; } >"$qemu_log" 2>&1 &
qemu_pid=$!
# a hung test (a Textual pilot waiting forever) fails after 5 minutes instead of holding CI
"$py" -m pytest -p no:cacheprovider tests/unit -n 2 --timeout=300 --durations=15 \
    "${ansible_units[@]/#/--ignore=}" >"$unit_log" 2>&1 &
unit_pid=$!
trap 'kill "$qemu_pid" "$unit_pid" 2>/dev/null || true; rm -f "$qemu_log" "$unit_log" "$deb_rc"' EXIT
# the UML set's Ansible test installs the package: wait for its build (a minute or two)
until [ -s "$deb_rc" ] || ! kill -0 "$qemu_pid" 2>/dev/null; do sleep 1; done
if [ "$(cat "$deb_rc" 2>/dev/null)" != 0 ]; then
    echo "test.sh: the Debian package's build failed (its output follows the kernel tests)" >&2
fi
step "UML kernel tests (each test boots its own guest, four at a time)"
uml_rc=0
# longest first (tests/labplugin.py orders them by tests/kernel/durations.json); worksteal:
# a worker that runs dry takes queued tests from the tail of the others' queues, so the tests
# queued behind the long ones do not wait for them (xdist's "load" keeps what it first sent)
"$py" -m pytest -p no:cacheprovider tests/kernel --lab-backend=uml -n 4 --dist worksteal \
    --durations=25 || uml_rc=$?
unit_rc=0
wait "$unit_pid" || unit_rc=$?
step "the unit tests: their output"
cat "$unit_log"
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
step "the package lane (the build, the Ansible unit tests, the kernel smoke set on qemu): its output"
cat "$qemu_log"
if [ "$unit_rc" != 0 ] || [ "$qemu_rc" != 0 ] || [ "$uml_rc" != 0 ]; then
    echo "test.sh: unit tests exit $unit_rc, package lane exit $qemu_rc," \
         "UML kernel tests exit $uml_rc" >&2
    exit 1
fi
