"""state.locked's owners: one acting_as block is one owner (core/state.py), so that the
TUI's worker threads never enter each other's locks, whatever run they act for.

Each test here failed on the code before its fix."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cachemgr.core import state
from cachemgr.core.errors import UnsafeError


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    return d


def _in_thread(fn: object) -> BaseException | None:
    """Run ``fn`` in another thread (as the TUI runs each operation); what it raised."""
    got: list[BaseException] = []

    def body() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    return got[0] if got else None


# ------------------------------------------------------------ acting_as: one run, one owner


def test_another_thread_acting_for_the_same_run_does_not_enter_its_locks() -> None:
    """A replace-ssd run acts as ("replace-ssd", ID) so that its drain threads share its
    locks. Another operation of the same process (the TUI: r or u on the run list while the
    run drains in a worker) that acts for the same run ID entered them too (the tokens were
    equal), and a rollback or a second execute ran beside the run."""
    token = ("replace-ssd", "20261122-040812-c2958027")
    with state.acting_as(token), state.locked("replace-c2958027", "cache set c2958027"):

        def second() -> None:
            with state.acting_as(token), state.locked("replace-c2958027", "cache set"):
                pass

        err = _in_thread(second)
    assert isinstance(err, state.BusyError), err
    assert "another operation of this process" in str(err.holder)


def test_a_runs_own_worker_threads_still_share_its_locks() -> None:
    """What acting_as is for: a drain thread started with the run's context re-enters."""
    import contextvars

    with state.acting_as(("replace-ssd", "r1")), state.locked("k", "k"):
        ctx = contextvars.copy_context()
        assert _in_thread(lambda: ctx.run(lambda: state.locked("k", "k").__enter__())) is None


def test_the_tui_cannot_roll_back_a_run_it_is_running(tmp_path: Path) -> None:
    """ops.replace: the run holds its cache and devices (_owning) in one worker; a rollback
    of the same run in another worker of the same process is refused (exit 3)."""
    from cachemgr.ops import replace as replace_ops

    j = replace_ops.Journal(id="r-tui", cset="c2958027-0000-0000-0000-000000000000",
                            options={}, old={},
                            backings=[{"uuid": "0d6d0a6c-0000-0000-0000-000000000000",
                                       "name": "sdb", "node": "/dev/sdb",
                                       "device": "/dev/bcache0", "mode": "writeback"}])
    with replace_ops._owning(j):
        err = _in_thread(lambda: replace_ops._owning(j, "replace-ssd rollback").__enter__())
    assert isinstance(err, UnsafeError) and err.exit_code == 3, err


