from __future__ import annotations

import pytest

from cachemgr.core import runner
from cachemgr.core.errors import CommandError, CommandNotFound, CommandTimeout


def test_ok_and_lc_all() -> None:
    r = runner.run(["sh", "-c", "echo $LC_ALL; echo e >&2"])
    assert r.stdout == "C\n" and r.stderr == "e\n" and r.returncode == 0


def test_failure_carries_argv_code_stderr() -> None:
    with pytest.raises(CommandError) as exc:
        runner.run(["sh", "-c", "echo boom >&2; exit 3"])
    e = exc.value
    assert e.argv == ["sh", "-c", "echo boom >&2; exit 3"]
    assert e.returncode == 3 and "boom" in e.stderr and "boom" in str(e)


def test_unchecked_returns_code() -> None:
    assert runner.run(["sh", "-c", "exit 4"], check=False).returncode == 4


def test_missing_program() -> None:
    with pytest.raises(CommandNotFound):
        runner.run(["cachemgr-no-such-program"])


def test_timeout_kills() -> None:
    with pytest.raises(CommandTimeout) as exc:
        runner.run(["sleep", "10"], timeout=0.3)
    assert exc.value.timeout == 0.3
