#!/bin/bash
# cachemgr test suite: README's second command (and exactly what .ci/run calls).
#
#   scripts/test.sh
#
# Makes sure the set-up is in place (scripts/setup.sh --no-demo), then runs: ruff, mypy,
# the unit tests and, beside them, the Debian package's build (scripts/build-deb.sh) and the
# kernel smoke set on qemu with Debian 12's own kernel (the package installed and purged
# there), then, once the package is built, the kernel tests on User-Mode Linux (each boots
# its own guest; the Ansible role installs the package in one). Fails if any of them fails.
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
# The unit tests (one process) and the qemu smoke set (one TCG guest at a time) start side
# by side: each keeps about one CPU busy (the qemu set used 0.7 CPU on average, 7.4
# CPU-minutes in 611 s, measured 2026-11-24), so on a 2-CPU machine neither waits for the
# other. The UML kernel tests start when the unit tests end, three guests at a time, beside
# what is left of the qemu set (~7 of its ~12 minutes on 2026-11-26): much of a kernel test
# is waiting (dm-delay, drains, udev), so the CPU the unit tests leave is enough. (qemu
# beside the UML tests made both 2-2.5x slower when the UML phase took 30 CPU-minutes,
# 2026-11-23; it takes ~13 now.) docs/benchmarks.md, "Test suite time".
step "unit tests, with the kernel smoke set on qemu (Debian 12 kernel) beside them"
qemu_log=$(mktemp /tmp/cachemgr-qemu-smoke.XXXXXX)
deb_rc=$(mktemp /tmp/cachemgr-deb-rc.XXXXXX)
# the Debian package first (one to two minutes), which the qemu set installs and purges and
# the UML set's Ansible test installs with the role; its exit code goes to $deb_rc
{ rc=0; scripts/build-deb.sh || rc=$?; echo "$rc" >"$deb_rc"
  [ "$rc" = 0 ] && "$py" -m pytest -p no:cacheprovider tests -m qemu_smoke \
      --lab-backend=qemu --durations=15; } >"$qemu_log" 2>&1 &
qemu_pid=$!
trap 'kill "$qemu_pid" 2>/dev/null || true; rm -f "$qemu_log" "$deb_rc"' EXIT
unit_rc=0
# a hung test (a Textual pilot waiting forever) fails after 5 minutes instead of holding CI
"$py" -m pytest -p no:cacheprovider tests/unit --timeout=300 --durations=15 || unit_rc=$?
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
step "kernel smoke set (qemu, Debian 12 kernel): its output"
cat "$qemu_log"
if [ "$unit_rc" != 0 ] || [ "$qemu_rc" != 0 ] || [ "$uml_rc" != 0 ]; then
    echo "test.sh: unit tests exit $unit_rc, qemu smoke set exit $qemu_rc," \
         "UML kernel tests exit $uml_rc" >&2
    exit 1
fi
