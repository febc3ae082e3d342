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
# The UML tests run three guests at a time: much of a kernel test is waiting (dm-delay,
# drains, udev), so a third guest fills the gaps (1422 s with two, 1110 s with three on a
# 2-CPU machine). The qemu smoke set runs after them, one guest at a time: a TCG guest needs
# a CPU of its own (two qemu guests at once, or qemu beside the UML tests, made it 2-2.5x
# slower). docs/benchmarks.md, "Test suite time".
step "kernel tests (UML kernel; each test boots its own guest, three at a time)"
"$py" -m pytest -p no:cacheprovider tests/kernel --lab-backend=uml -n 3 --durations=15
step "kernel smoke set (qemu, Debian 12 kernel)"
"$py" -m pytest -p no:cacheprovider tests -m qemu_smoke --lab-backend=qemu --durations=15
