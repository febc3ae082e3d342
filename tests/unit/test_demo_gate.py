"""The lab demos (``cachemgr lab demo``, ``cachemgr bench demo``) make their bcache device
with the create command, through the gate (issue #44 item 3): a disk another command holds
is refused (exit 3, naming the holder) before anything is formatted, and the format runs
with the disks locked as ``create bcache``. Before, both demos called bcache's functions
(make-bcache, register, the mode) directly: no lock, no capability, no journal trail.

On a copy of the bcache-writeback-dirty capture (its backing disk /dev/ubda, its SSD
/dev/ubdb); bcache's create is replaced by a record of its call."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import bcache
from cachemgr.core import state
from cachemgr.core.change import Change
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.lab import demo
from cachemgr.ops import gate
from tests.unit.tui_helpers import copy_capture


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """bcache.create's calls, each with who held the SSD's lock while it ran."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    calls: list[dict[str, Any]] = []

    def create(sysfs: Sysfs, **kw: Any) -> list[Change]:
        calls.append({**kw, "held": state.current_holder("disk-ubdb")})
        return []

    monkeypatch.setattr(bcache, "create", create)
    return calls


def test_the_demo_creates_its_cache_through_the_gate(
        tmp_path: Path, made: list[dict[str, Any]]) -> None:
    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))
    assert demo.writeback_bcache(sysfs, "/dev/ubda", "/dev/ubdb") == "/dev/bcache0"
    (call,) = made
    assert call["backings"] == ["/dev/ubda"] and call["cache"] == "/dev/ubdb"
    assert call["mode"] == CacheMode.WRITEBACK and call["force"] is True
    assert call["held"] is not None and call["held"]["procedure"] == "create bcache"


def test_the_demo_is_refused_a_disk_another_command_holds(
        tmp_path: Path, made: list[dict[str, Any]]) -> None:
    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))
    holding, done = threading.Event(), threading.Event()

    def other() -> None:  # another admin's command on the SSD, in a thread of its own
        with gate.gate(gate.of_disks(["/dev/ubdb"]), "scheduler"):
            holding.set()
            done.wait(30)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert holding.wait(30)
        with pytest.raises(state.BusyError) as exc:
            demo.writeback_bcache(sysfs, "/dev/ubda", "/dev/ubdb")
    finally:
        done.set()
        t.join()
    assert exc.value.exit_code == 3 and "scheduler" in str(exc.value), str(exc.value)
    assert made == []
