"""replace.plan on a captured lab tree (a bcache set whose SSD is a scsi_debug disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "scsi-ssd-in-use-uml" / "sys"


def test_two_runs_in_one_second_get_their_own_journal(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(replace.time, "strftime", lambda fmt, *a: "20261122-040812")
    sysfs = Sysfs(ROOT)
    ssd = snapshot.take(sysfs).cache_sets[0].caches[0].identity.node
    first = replace.plan(sysfs, ssd, replace.Options(yes=True))
    path = state.journal_path("replace", first.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")  # the first run's journal exists
    second = replace.plan(sysfs, ssd, replace.Options(yes=True))
    assert first.id == "20261122-040812-c2958027"
    assert second.id == first.id + "-2"
