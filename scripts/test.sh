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
step "kernel tests (UML kernel; each test boots its own guest, two at a time)"
"$py" -m pytest -p no:cacheprovider tests/kernel --lab-backend=uml -n 2 --durations=15
step "kernel smoke set (qemu, Debian 12 kernel)"
"$py" -m pytest -p no:cacheprovider tests -m qemu_smoke --lab-backend=qemu --durations=15
