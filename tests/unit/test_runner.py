from __future__ import annotations

import pytest

from cachemgr.core import cancel, runner
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


def test_a_cancellable_program_stops_when_its_operation_is_cancelled() -> None:
    """A TUI operation cancelled (Cancel, q, a closed terminal) stops the fio it runs at
    once instead of waiting out its run; a program not marked cancellable is left alone."""
    import threading
    import time

    from cachemgr.core.errors import Cancelled

    ev = threading.Event()
    threading.Timer(0.3, ev.set).start()
    t0 = time.monotonic()
    with cancel.scope(ev), pytest.raises(Cancelled, match="sleep stopped"):
        runner.run(["sleep", "30"], cancellable=True)
    assert time.monotonic() - t0 < 6
    # not cancellable: it runs to its end even with the event set
    with cancel.scope(ev):
        assert runner.run(["sh", "-c", "sleep 0.5; echo done"]).stdout == "done\n"
    # the output and exit code of one that finishes, its input passed
    with cancel.scope(threading.Event()):
        r = runner.run(["cat"], input="abc", cancellable=True)
        assert (r.stdout, r.returncode) == ("abc", 0)
        with pytest.raises(Exception, match="exit"):
            runner.run(["sh", "-c", "exit 3"], cancellable=True)
