"""Shared guards for tests that run commands as root on this host: nothing the library tries
may change a disk here, and a lock can be held by another process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError

REPO = Path(__file__).resolve().parents[2]

# the probes that only read (none reaches a disk of this host: the captures' devices do not
# exist here)
READ_ONLY_COMMANDS = (("bcache-super-show",), ("blkid",), ("wipefs", "--no-act"))


def mutations_refused(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Commands the library tries to run that could change something (anything but the
    read-only probes): refused with a CacheMgrError (so the faces show it) and listed."""
    refused: list[tuple[str, ...]] = []
    real = runner.run

    def run(argv: Sequence[str], **kw: object) -> runner.Completed:
        args = tuple(str(a) for a in argv)
        if any(args[:len(ro)] == ro for ro in READ_ONLY_COMMANDS):
            return real(argv, **kw)  # type: ignore[arg-type]
        refused.append(args)
        raise CacheMgrError(f"test: refused to run {' '.join(args)}")

    monkeypatch.setattr(runner, "run", run)
    return refused


@contextlib.contextmanager
def held_elsewhere(key: str, state_dir: Path, holder: str = "{}") -> Iterator[None]:
    """Another process holds the lock ``key`` (in ``state_dir``) until the end of the
    block; ``holder``: what it says of itself (JSON: procedure, run, step)."""
    code = ("import json, sys\nfrom cachemgr.core import state\n"
            "with state.locked(sys.argv[1], 'test', holder=json.loads(sys.argv[2])):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, key, holder], cwd=REPO, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env={**os.environ, "CACHEMGR_STATE_DIR": str(state_dir),
                              "PYTHONPATH": str(REPO)})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        yield
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)
