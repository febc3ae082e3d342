"""The restore at the end of a failed drain, when the device goes away under it.

Seen in the UML lab (CI, test_drain_stops_on_backing_errors_keeping_dirty_data): the backing
device fails every write, the drain stops on the IO errors, and bcache stops the device (after
io_error_limit errors) between the restore's re-read and its first tunable write. The restore's
"not a registered bcache device" (exit 2, a usage error) replaced the drain's own message, the
one that says where the dirty data is. These tests run the drain on a copy of a lab capture
and take the device's bcache directory away at that moment."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core.errors import StallError, SysfsError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain
from tests.unit.tui_helpers import copy_capture, kernel_writes

TUNABLES = ("writeback_percent", "writeback_delay", "writeback_running")


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sysfs, Any, str]:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    kernel_writes(monkeypatch)
    b = snapshot.take(sysfs).backings[0]
    return sysfs, b, f"block/{b.identity.name}/bcache"


def vanish_on_restore(monkeypatch: pytest.MonkeyPatch, sysfs: Sysfs, rel: str,
                      fail: BaseException | None = None) -> list[str]:
    """From the restore's first write (the drain's three are done), the bcache directory is
    gone; or, with ``fail``, that write raises it and the device stays."""
    real = bcache.set_tunable
    calls: list[str] = []

    def set_tunable(s: Sysfs, b: Any, name: str, value: int) -> Any:
        calls.append(f"{name}={value}")
        if len(calls) == 4:
            if fail is not None:
                raise fail
            shutil.rmtree(sysfs.path(rel))
        return real(s, b, name, value)

    monkeypatch.setattr(bcache, "set_tunable", set_tunable)
    return calls


def test_device_stopped_during_the_restore_keeps_the_drains_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    sysfs, b, rel = setup(tmp_path, monkeypatch)
    calls = vanish_on_restore(monkeypatch, sysfs, rel)
    # the capture's dirty data never goes down: the drain stalls
    with pytest.raises(StallError, match="no progress"):
        drain.drain(sysfs, b, stall_timeout=0.3, interval=0.05, confirm=0.1)
    assert calls[:3] == ["writeback_percent=0", "writeback_delay=1", "writeback_running=1"]
    assert len(calls) == 4  # the restore began, then the device went
    assert not sysfs.exists(rel)
    # nothing left to restore on a stopped device: the journal is dropped, and it is said
    assert not list((tmp_path / "state").rglob("*.json"))
    assert any("is gone; dropped its saved drain tunables" in r.getMessage()
               for r in caplog.records)


def test_a_restore_that_fails_keeps_the_drains_error_and_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A write refused while the device is still there: the tunables are not back, so the
    journal stays for --resume, the drain's error is the one raised and the failure is
    logged as an error naming the journal."""
    sysfs, b, rel = setup(tmp_path, monkeypatch)
    err = SysfsError(str(sysfs.path(f"{rel}/writeback_percent")), "write", 5, "Input/output error")
    vanish_on_restore(monkeypatch, sysfs, rel, fail=err)
    with caplog.at_level(logging.ERROR), pytest.raises(StallError, match="no progress"):
        drain.drain(sysfs, b, stall_timeout=0.3, interval=0.05, confirm=0.1)
    journals = list((tmp_path / "state").rglob("*.json"))
    assert len(journals) == 1
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(msgs) == 1 and "were not put back" in msgs[0] and str(journals[0]) in msgs[0]
    assert "--resume" in msgs[0]
    assert sysfs.read(f"{rel}/writeback_percent") == "0"  # what the drain set, as said
    # --resume (no failure now) puts them back and drops the journal
    monkeypatch.undo()
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    kernel_writes(monkeypatch)
    restored = drain.restore_saved(sysfs, snapshot.take(sysfs).backings[0])
    assert set(restored) == set(TUNABLES)
    assert sysfs.read(f"{rel}/writeback_percent") == str(restored["writeback_percent"])
    assert not list((tmp_path / "state").rglob("*.json"))
