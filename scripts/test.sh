#!/bin/bash
# cachemgr test suite: README's second command (and exactly what .ci/run calls).
#
#   scripts/test.sh
#
# Makes sure the set-up is in place (scripts/setup.sh --no-demo), then runs: ruff, mypy,
# the unit tests, the kernel tests on User-Mode Linux (each boots its own guest), and the
# kernel smoke set on qemu with Debian 12's own kernel. Fails if any of them fails.
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
step "unit tests"
# a hung test (a Textual pilot waiting forever) fails after 5 minutes instead of holding CI
"$py" -m pytest -p no:cacheprovider tests/unit --timeout=300
# The kernel phases run side by side: the UML tests three guests at a time (much of a kernel
# test is waiting on dm-delay, drains and udev, so a third guest fills the gaps), the qemu
# smoke set one guest at a time beside them (a TCG guest keeps one CPU busy; two at once were
# slower than one after the other). Measured on a 2-CPU machine: docs/benchmarks.md, "Test
# suite time".
qlog=$(mktemp /tmp/cachemgr-qemu-smoke.XXXXXX)
step "kernel smoke set (qemu, Debian 12 kernel): started, its output follows the UML tests"
"$py" -m pytest -p no:cacheprovider tests -m qemu_smoke --lab-backend=qemu \
    --durations=15 >"$qlog" 2>&1 &
qpid=$!
trap 'kill $qpid 2>/dev/null || true' EXIT
step "kernel tests (UML kernel; each test boots its own guest, three at a time)"
urc=0
"$py" -m pytest -p no:cacheprovider tests/kernel --lab-backend=uml -n 3 --durations=15 || urc=$?
qrc=0
wait $qpid || qrc=$?
trap - EXIT
step "kernel smoke set (qemu, Debian 12 kernel)"
cat "$qlog"
rm -f "$qlog"
if [ $urc -ne 0 ] || [ $qrc -ne 0 ]; then
    echo "kernel tests failed: UML exit $urc, qemu smoke set exit $qrc" >&2
    exit 1
fi
