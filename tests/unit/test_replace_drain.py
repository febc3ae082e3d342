"""replace-ssd's drain step: every attached device drains at the same time, and a failure or
a cancel stops the others (each restoring its tunables) before the step fails."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.errors import CacheMgrError, StallError
from cachemgr.core.model import BcacheBacking, CacheState, DrainProgress
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain, replace
from cachemgr.procedures.replace import bcache as replace_bcache

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "scsi-ssd-in-use-uml" / "sys"


def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        say: Any = None) -> tuple[replace.Ctx, list[str]]:
    """A run on the captured set, with a second backing device attached to it."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    sysfs = Sysfs(ROOT)
    snap = snapshot.take(sysfs)
    b0 = snap.backings[0]
    b1 = dataclasses.replace(b0, uuid="11111111-2222-3333-4444-555555555555")
    two = dataclasses.replace(snap, backings=(b0, b1))
    monkeypatch.setattr(replace.Ctx, "snap", lambda self: two)
    j = replace.plan(sysfs, snap.cache_sets[0].caches[0].identity.node,
                     replace.Options(yes=True))
    j.backings = [{**j.backings[0]}, {**j.backings[0], "uuid": b1.uuid}]
    said: list[str] = []
    c = replace.Ctx(sysfs, j, replace.Options(**j.options), say or said.append,
                    lambda text: None)
    return c, said


def report(b: BcacheBacking) -> DrainProgress:
    return DrainProgress("drain", str(b.uuid), 4096, 8192, None, None, 0.0, CacheState.DIRTY)


def endless(stopped: list[str]) -> Any:
    """A drain that never ends, reporting progress as drain.drain does; when it is stopped
    it records its device where drain.drain would restore the tunables."""

    def fake(sysfs: Sysfs, b: BcacheBacking, *, progress: Any, **kw: Any) -> drain.DrainResult:
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 20:
                progress(report(b))
                time.sleep(0.01)
            raise AssertionError(f"drain of {b.uuid} was never stopped")
        finally:
            stopped.append(str(b.uuid))

    return fake


def test_devices_drain_at_the_same_time(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    c, said = ctx(tmp_path, monkeypatch)
    both = threading.Barrier(2, timeout=10)  # broken if the drains ran one after the other

    def fake(sysfs: Sysfs, b: BcacheBacking, **kw: Any) -> drain.DrainResult:
        both.wait()
        return drain.DrainResult(str(b.uuid), 8192, 1.0)

    monkeypatch.setattr(drain, "drain", fake)
    replace_bcache.s_drain(c)
    assert sum("clean after" in line for line in said) == 2


def test_a_failed_drain_stops_the_other_and_fails_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = ctx(tmp_path, monkeypatch)
    stopped: list[str] = []

    long = endless(stopped)

    def fake(sysfs: Sysfs, b: BcacheBacking, *, progress: Any, **kw: Any) -> drain.DrainResult:
        if b.uuid == c.j.backings[1]["uuid"]:
            time.sleep(0.05)
            raise StallError("no progress")
        return long(sysfs, b, progress=progress, **kw)

    monkeypatch.setattr(drain, "drain", fake)
    with pytest.raises(StallError):
        replace_bcache.s_drain(c)
    assert stopped == [c.j.backings[0]["uuid"]]


def test_a_cancel_in_say_stops_every_drain(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    class Cancelled(CacheMgrError):
        pass

    def say(line: str) -> None:
        raise Cancelled("cancelled by the operator")

    c, _ = ctx(tmp_path, monkeypatch, say=say)
    stopped: list[str] = []
    monkeypatch.setattr(drain, "drain", endless(stopped))
    with pytest.raises(Cancelled):
        replace_bcache.s_drain(c)
    assert sorted(stopped) == sorted(e["uuid"] for e in c.j.backings)


def test_ctrl_c_stops_every_drain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = ctx(tmp_path, monkeypatch)
    stopped: list[str] = []
    monkeypatch.setattr(drain, "drain", endless(stopped))
    # a shell starting the suite in the background leaves SIGINT ignored, and Python then
    # raises no KeyboardInterrupt: what Ctrl-C does at a terminal is what is tested here
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            replace_bcache.s_drain(c)
    finally:
        signal.signal(signal.SIGINT, old)
    assert sorted(stopped) == sorted(e["uuid"] for e in c.j.backings)


def test_stall_hint_names_the_writeback_pause_only_when_it_can_explain_the_stall() -> None:
    h = drain.stall_hint({"writeback_delay": 30}, 10, progressed=False)
    assert "writeback_delay pause (30 s" in h and "--stall-timeout above 30" in h
    for hint in (drain.stall_hint({"writeback_delay": 30}, 10, progressed=True),
                 drain.stall_hint({"writeback_delay": 30}, 60, progressed=False),
                 drain.stall_hint({}, 10, progressed=False)):
        assert "pause" not in hint and "dmesg" in hint
