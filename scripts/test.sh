#!/bin/bash
# cachemgr test suite: README's second command (and exactly what .ci/run calls).
#
#   scripts/test.sh
#
# Makes sure the set-up is in place (scripts/setup.sh --no-demo), then runs: ruff, mypy,
# the unit tests and, beside them, the Debian package's build (scripts/build-deb.sh), the
# Ansible collection's unit tests and the kernel smoke set on qemu with Debian 12's own
# kernel (the package installed and purged there), then, once the package is built, the
# kernel tests on User-Mode Linux (each boots its own guest; the Ansible role installs the
# package in one). Fails if any of them fails.
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
# The unit tests (two workers) and, beside them, the package lane: the Debian package's
# build, the Ansible collection's unit tests (ansible-test, ansible-lint, plays on captures:
# ~70 CPU-s, mostly subprocesses), then the kernel smoke set on qemu (one TCG guest at a
# time, about 0.7 of a CPU). The UML kernel tests start when the unit tests end, three
# guests at a time, beside what is left of the package lane. On 2 CPUs the suite is bound by
# CPU: one unit process beside one qemu guest left ~0.4 CPU idle for the unit phase's 600 s
# (2026-11-28: ~520 CPU-s in 597 s beside 0.72 CPU of qemu); two workers take that idle CPU
# (~70 CPU-s more for a second interpreter) so that the UML phase, the critical path's
# second half, starts sooner; the Ansible unit tests leave that path for the lane, which
# is not on it. docs/benchmarks.md, "Test suite time".
step "unit tests (two workers), with the package's build, the Ansible unit tests and the kernel smoke set on qemu (Debian 12 kernel) beside them"
qemu_log=$(mktemp /tmp/cachemgr-qemu-smoke.XXXXXX)
deb_rc=$(mktemp /tmp/cachemgr-deb-rc.XXXXXX)
ansible_units=(tests/unit/test_ansible_*.py)
# the Debian package first (one to two minutes), which the qemu set installs and purges and
# the UML set's Ansible test installs with the role; its exit code goes to $deb_rc. The
# lane's own exit code is 0 only if the build, the Ansible unit tests and the qemu set passed.
{ rc=0; scripts/build-deb.sh || rc=$?; echo "$rc" >"$deb_rc"
  ans=0; "$py" -m pytest -p no:cacheprovider "${ansible_units[@]}" --timeout=300 \
      --durations=5 || ans=$?
  q="not run (no package)"
  [ "$rc" = 0 ] && { q=0; "$py" -m pytest -p no:cacheprovider tests -m qemu_smoke \
      --lab-backend=qemu --durations=15 || q=$?; }
  echo "package lane: build-deb exit $rc, Ansible unit tests exit $ans, qemu set exit $q"
  [ "$rc" = 0 ] && [ "$ans" = 0 ] && [ "$q" = 0 ]; } >"$qemu_log" 2>&1 &
qemu_pid=$!
trap 'kill "$qemu_pid" 2>/dev/null || true; rm -f "$qemu_log" "$deb_rc"' EXIT
unit_rc=0
# a hung test (a Textual pilot waiting forever) fails after 5 minutes instead of holding CI
"$py" -m pytest -p no:cacheprovider tests/unit -n 2 --timeout=300 --durations=15 \
    "${ansible_units[@]/#/--ignore=}" || unit_rc=$?
step "kernel tests (UML kernel; each test boots its own guest, three at a time), beside the rest of the qemu set"
# the package's build has ended long before the unit tests as a rule; if not, wait for it
# (test_ansible_kernel installs it; without a package it would be skipped)
until [ -s "$deb_rc" ] || ! kill -0 "$qemu_pid" 2>/dev/null; do sleep 1; done
if [ "$(cat "$deb_rc")" != 0 ]; then
    echo "test.sh: the Debian package's build failed (its output follows the kernel tests)" >&2
fi
uml_rc=0
# longest first (tests/labplugin.py orders them by tests/kernel/durations.json); worksteal:
# a worker that runs dry takes queued tests from the tail of the others' queues, so the tests
# queued behind the long ones do not wait for them (xdist's "load" keeps what it first sent)
"$py" -m pytest -p no:cacheprovider tests/kernel --lab-backend=uml -n 3 --dist worksteal \
    --durations=25 || uml_rc=$?
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
step "the package lane (the build, the Ansible unit tests, the kernel smoke set on qemu): its output"
cat "$qemu_log"
if [ "$unit_rc" != 0 ] || [ "$qemu_rc" != 0 ] || [ "$uml_rc" != 0 ]; then
    echo "test.sh: unit tests exit $unit_rc, package lane exit $qemu_rc," \
         "UML kernel tests exit $uml_rc" >&2
    exit 1
fi
