"""cachemgr.ops.tuning (behind `cachemgr tune` and the TUI's tune) on a captured lab tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.errors import UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import tuning
from tests.unit.tui_helpers import copy_capture, kernel_writes


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sysfs, list[tuple[str, str]]]:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    return Sysfs(root), writes


def test_changes_and_already_so(tree: tuple[Sysfs, list[tuple[str, str]]]) -> None:
    sysfs, writes = tree
    snap = snapshot.take(sysfs)
    res = tuning.tune(sysfs, snap, "/dev/bcache0", ["writeback_percent=5", "writeback_delay=30"])
    changes, already = res.changes, res.notes
    assert [w[0] for w in writes] == ["block/ubda/bcache/writeback_percent"]
    assert len(changes) == 1 and "writeback_percent" in str(changes[0])
    assert len(already) == 1 and "writeback_delay" in already[0]
    assert sysfs.read("block/ubda/bcache/writeback_percent") == "5"


@pytest.mark.parametrize("settings,words", [
    (["writeback_percent"], "bad setting"),
    (["writeback_percent=ten"], "not an integer"),
    (["writeback_percent=5", "nosuch=1"], "nosuch"),
])
def test_bad_settings_write_nothing(tree: tuple[Sysfs, list[tuple[str, str]]],
                                    settings: list[str], words: str) -> None:
    sysfs, writes = tree
    with pytest.raises(UsageError, match=words):
        tuning.tune(sysfs, snapshot.take(sysfs), "/dev/bcache0", settings)
    assert writes == []


def test_not_root_writes_nothing(tree: tuple[Sysfs, list[tuple[str, str]]],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, writes = tree
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(UsageError, match="needs root"):
        tuning.tune(sysfs, snapshot.take(sysfs), "/dev/bcache0", ["writeback_percent=5"])
    assert writes == []


def test_out_of_bounds_writes_nothing(tree: tuple[Sysfs, list[tuple[str, str]]]) -> None:
    sysfs, writes = tree
    with pytest.raises(UsageError, match="between"):
        tuning.tune(sysfs, snapshot.take(sysfs), "/dev/bcache0",
                    ["writeback_delay=5", "writeback_percent=101"])
    assert writes == []
