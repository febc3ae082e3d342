"""A run owns its devices from its first step to its last (issue #41 item 5).

A second admin's command on a device a replace-ssd run owns is refused (exit 3) at every
moment of the run: while the run records what it restores at its end (its plan: preflight
and remember), in every thread it runs, and until the last of them is done. On copies of lab
captures (scsi-ssd-in-use: a bcache set on a scsi_debug SSD); the run's steps after its plan
are not run here (tests/kernel/test_gate_kernel.py runs them).

Each test here failed on the code before its fix."""

from __future__ import annotations

import contextvars
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import state
from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import replace as replace_ops
from cachemgr.procedures import replace
from tests.unit.test_parity import cli, plant
from tests.unit.tui_helpers import copy_capture, kernel_writes


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    return d


def second_admin(root: Path, *argv: str) -> tuple[int, str]:
    """A command of another admin, in a thread of its own (another owner of locks, as
    another process would be): its exit code and stderr."""
    box: list[tuple[int, str, str]] = []
    t = threading.Thread(target=lambda: box.append(cli(root, list(argv))))
    t.start()
    t.join()
    rc, _, err = box[0]
    return rc, err


def steps_stubbed(monkeypatch: pytest.MonkeyPatch) -> list[replace.Journal]:
    """The run's steps replaced by a record of the journal they would run on."""
    ran: list[replace.Journal] = []

    def execute(sysfs: Sysfs, j: replace.Journal, **_kw: Any) -> replace.Journal:
        ran.append(replace.Journal(**{f: getattr(j, f) for f in j.__dataclass_fields__}))
        return j

    monkeypatch.setattr(replace, "execute", execute)
    return ran


def ssd_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Sysfs, Any, str]:
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    sysfs = Sysfs(str(root))
    snap = snapshot.take(sysfs)
    return root, sysfs, snap.backings[0], snap.cache_sets[0].caches[0].identity.node


# ------------------------------------------------------------ the run's plan, under its locks


def test_the_plan_a_run_records_is_read_while_it_holds_its_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """replace-ssd planned (preflight, remember: the modes and tunables it puts back at its
    end) before it took its devices' locks. In the lab a second admin's ``tune`` during
    those seconds exited 0 and was then undone by the run's restore, which put back what the
    plan had read before it. The plan the run journals is made while a second admin is
    refused (exit 3)."""
    root, sysfs, b, ssd = ssd_setup(tmp_path, monkeypatch)
    ran = steps_stubbed(monkeypatch)
    real = replace_ops._plan
    seen: list[tuple[int, str, replace.Journal]] = []

    def plan(*a: Any, **kw: Any) -> replace.Journal:
        j = real(*a, **kw)
        # a second admin's tune at the moment the plan has read everything it records
        rc, err = second_admin(root, "tune", b.device, "writeback_percent=40")
        seen.append((rc, err, j))
        return j

    monkeypatch.setattr(replace_ops, "_plan", plan)
    j = replace_ops.plan(sysfs, ssd, replace_ops.Options(yes=True), for_run=True)
    replace_ops.run(sysfs, j)
    (journaled,) = ran
    rc, err, recorded = seen[-1]
    assert rc == 3 and "held by replace-ssd run" in err, (rc, err)
    assert recorded.created == journaled.created and journaled.id == j.id


def test_a_change_between_the_plan_shown_and_the_run_is_what_the_run_restores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan shown (or printed) before the run starts is a forecast: a tune accepted
    after it (exit 0: no run held the device yet) was lost, the run putting back at its end
    the value the forecast had read. The run records what the device holds when it takes
    it, and says what changed."""
    root, sysfs, b, ssd = ssd_setup(tmp_path, monkeypatch)
    ran = steps_stubbed(monkeypatch)
    j = replace_ops.plan(sysfs, ssd, replace_ops.Options(yes=True), for_run=True)
    (entry,) = [e for e in j.backings if e["uuid"] == b.uuid]
    assert entry["tunables"]["writeback_percent"] == 10
    rc, err = second_admin(root, "tune", b.device, "writeback_percent=40")
    assert rc == 0, err
    said: list[str] = []
    from cachemgr.ops.control import Control

    replace_ops.run(sysfs, j, ctl=Control(what="test", say=said.append))
    (journaled,) = ran
    (entry,) = [e for e in journaled.backings if e["uuid"] == b.uuid]
    assert entry["tunables"]["writeback_percent"] == 40
    assert any(f"{b.device}: changed since the plan" in s and "writeback_percent 10 -> 40"
               in s for s in said), said


def test_a_fresh_run_does_not_take_over_a_drain_interrupted_after_its_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain killed between the plan and the run leaves writeback_percent=0 (its journal
    keeps the originals). The run's gate took over any interrupted drain ("its own, on a
    resume"), so a fresh run recorded the drain's interim values as the ones to restore. A
    fresh run takes over nothing: refused, naming the drain's --resume."""
    root, sysfs, b, ssd = ssd_setup(tmp_path, monkeypatch)
    ran = steps_stubbed(monkeypatch)
    j = replace_ops.plan(sysfs, ssd, replace_ops.Options(yes=True), for_run=True)
    plant(root, f"drain:{b.device}")
    with pytest.raises(UnsafeError) as exc:
        replace_ops.run(sysfs, j)
    assert "owned by drain" in exc.value.message and exc.value.exit_code == 3
    assert f"cachemgr drain {b.device} --resume" in (exc.value.hint or "")
    assert ran == []


# ------------------------------------------------- every thread of a run, until the last one


def test_a_lock_is_held_until_the_last_thread_acting_for_its_owner_is_done(
        tmp_path: Path) -> None:
    """replace-ssd's drains run in worker threads acting for the run (state.acting_as).
    The lock went when the block that took it ended, even with a worker still inside its
    own block of the same lock (the run leaving on a second Ctrl-C while its drains put
    their tunables back): a second admin got in while the worker still wrote the device.
    The lock goes when the last of its owner's blocks ends."""
    inside, leave = threading.Event(), threading.Event()

    def worker() -> None:
        with state.locked("dev-a", "/dev/bcache0"):
            inside.set()
            leave.wait(10)

    def other() -> BaseException | None:
        box: list[BaseException | None] = []

        def attempt() -> None:
            try:
                with state.locked("dev-a", "/dev/bcache0"):
                    box.append(None)
            except state.BusyError as exc:
                box.append(exc)

        t = threading.Thread(target=attempt)
        t.start()
        t.join()
        return box[0]

    with state.acting_as(("replace-ssd", "r1")):
        with state.locked("dev-a", "/dev/bcache0", holder={"procedure": "replace-ssd"}):
            t = threading.Thread(target=contextvars.copy_context().run, args=(worker,))
            t.start()
            assert inside.wait(10)
        # the run's own block is over; its worker is still in its block
        refused = other()
        assert isinstance(refused, state.BusyError), refused
        assert "replace-ssd" in str(refused.message)
        assert state.current_holder("dev-a") is not None
        leave.set()
        t.join()
    assert other() is None
    assert state.current_holder("dev-a") is None


# ------------------------------------------------------- a holder's record, rewritten in place


def test_a_held_lock_is_never_read_as_free_while_its_record_is_rewritten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run rewrites its lock files' record at each step and with its drains' progress
    (every few seconds): the file was emptied, then written. A reader between the two (a
    command's check before its question, status, a monitor) saw nobody holding the device a
    run held. Read at every moment of the rewrite, it is held, by the run."""
    seen: list[dict[str, Any] | None] = []
    real_truncate, real_pwrite = os.ftruncate, os.pwrite

    def look() -> None:
        seen.append(state.current_holder("dev-b"))

    def ftruncate(fd: int, n: int) -> None:
        if watching:
            look()
        real_truncate(fd, n)
        if watching:
            look()

    def pwrite(fd: int, data: bytes, off: int) -> int:
        if watching:
            look()
        return real_pwrite(fd, data, off)

    watching = False
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with state.locked("dev-b", "/dev/bcache1",
                      holder={"procedure": "replace-ssd", "run": "r2",
                              "step": "a-long-step-name-first"}):
        watching = True
        state.update_holder(step="drain")  # shorter: the old record's tail is left over
        state.update_holder(step="detach", progress_at=1.0, progress_dirty=4096)
        watching = False
    assert len(seen) >= 6
    assert all(h is not None and h.get("run") == "r2" for h in seen), seen


def test_a_refusal_names_the_run_that_has_just_taken_the_lock(state_dir: Path) -> None:
    """A run writes who it is into the lock file right after its flock: a second admin
    refused in between read an empty file and was told "another cachemgr run is acting on
    /dev/bcache1 (pid unknown)" (seen in the lab, test_gate_kernel). The refusal waits for
    the record (a few ms) and names the run."""
    import fcntl

    path = state_dir / "locks" / "dev-c.lock"
    state.state_dir()
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the run's flock; its record follows 50 ms later
        record = json.dumps({"procedure": "replace-ssd", "run": "r3", "pid": os.getpid(),
                             "key": "dev-c"}).encode()
        t = threading.Timer(0.05, lambda: os.pwrite(fd, record, 0))
        t.start()
        with pytest.raises(state.BusyError) as exc, state.locked("dev-c", "/dev/bcache1"):
            pass
        t.join()
        assert "held by replace-ssd run r3" in exc.value.message, exc.value.message
    finally:
        os.close(fd)
