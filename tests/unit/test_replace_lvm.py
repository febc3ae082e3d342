"""replace-ssd for LVM caches (procedures/replace/lvm.py): the plan's refusals on a lab
capture of lvm2's own caches (tests/fixtures/lvm-caches-*), and the journal of the lvm kind.
The steps themselves are proven in tests/kernel/test_replace_lvm_kernel.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachemgr.core import state
from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace
from cachemgr.procedures.replace import lvm as replace_lvm
from tests.unit.guards import mutations_refused
from tests.unit.test_replace_plan import _refused_before_any_step

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CAPTURES = sorted(FIXTURES.glob("lvm-caches-*"))


@pytest.fixture(params=CAPTURES, ids=lambda p: p.name)
def root(request: pytest.FixtureRequest) -> Path:
    p: Path = request.param
    return p / "sys"


@pytest.mark.parametrize("argv,code,says", [
    # the lab capture's cache PVs are UML ubd disks: nothing to SCSI-remove
    (["vg0/vm1", "--yes"], 2, "is neither a SCSI disk nor an NVMe namespace"),
    (["/dev/mapper/vg0-vm2", "--yes"], 2, "is neither a SCSI disk nor an NVMe namespace"),
    (["/dev/vg0/vm3", "--dry-run"], 2, "is neither a SCSI disk nor an NVMe namespace"),
    (["vg0/nosuch", "--yes"], 2, "vg0/nosuch is not a cached LV"),
    (["vg0/vm1", "--interim-mode", "writethrough", "--yes"], 2,
     "does not apply to an LVM cache"),
    (["vg0/vm1", "--keep-old-signature", "--yes"], 2, "does not apply to an LVM cache"),
    (["vg0/bad name", "--yes"], 2, "not a cached LV"),
])
def test_plan_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: Path,
                       argv: list[str], code: int, says: str) -> None:
    rc, err = _refused_before_any_step(tmp_path, monkeypatch, root, argv)
    assert rc == code and says in err, (rc, err)


def _journal(kind: str = "lvm", done: list[str] | None = None) -> dict[str, object]:
    return {"id": "20261123-000000-vg0-vm1", "cset": "vg0/vm1", "options": {"new": "same"},
            "old": {"name": "sda", "node": "/dev/sda", "hctl": "0:0:0:0", "host": "host0",
                    "wwid": "naa.1", "serial": "S1", "size_bytes": 167772160, "bucket": None},
            "backings": [], "done": done or ["preflight", "remember"], "kind": kind,
            "created": 1795000000.0,
            "lvm": {"vg": "vg0", "lv": "vm1", "segtype": "cache", "pool_kind": "cachepool",
                    "pool": "pool", "data_bytes": 67108864, "meta_bytes": 8388608,
                    "chunk_bytes": 65536, "mode": "writeback", "policy": "smq",
                    "settings": [["migration_threshold", "4096"]], "pv": "/dev/sda",
                    "need_bytes": 100663296}}


def _write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, object]) -> Path:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    path = state.journal_path("replace", str(data["id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_an_lvm_journal_reads_back_with_its_own_steps(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, monkeypatch, _journal(done=["preflight", "remember", "drain", "split"]))
    j = replace.Journal.load("20261123-000000-vg0-vm1")
    assert j.kind == "lvm" and j.steps == replace_lvm.STEPS
    plan = replace.describe(j)
    assert plan[0].startswith("replace the cache SSD /dev/sda (SCSI host0 [0:0:0:0]")
    assert "of lvmcache (cachepool) vg0/vm1" in plan[0]
    assert "chunk 64.0 KiB" in plan[1] and "migration_threshold=4096" in plan[1], plan
    steps = [line.split()[1] for line in plan if line[:2].strip().isdigit()]
    assert steps == [n for n, _ in replace_lvm.STEPS]


@pytest.mark.parametrize("kind,done,says", [
    ("zfs", ["preflight"], "unknown kind 'zfs'"),
    ("bcache", ["preflight", "vgreduce"], "unknown steps"),  # an lvm step in a bcache run
    ("lvm", ["preflight", "unregister"], "unknown steps"),  # and the other way round
])
def test_a_journal_of_the_wrong_kind_is_refused(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, kind: str,
                                                done: list[str], says: str) -> None:
    path = _write(tmp_path, monkeypatch, _journal(kind, done))
    with pytest.raises(state.StateFileError, match=says):
        replace.Journal.read(path)


def test_no_rollback_past_the_old_cache_deletion(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, monkeypatch, _journal(done=["preflight", "remember", "drain", "split",
                                                 "remove-old-cache"]))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    refused = mutations_refused(monkeypatch)
    j = replace.Journal.load("20261123-000000-vg0-vm1")
    with pytest.raises(UnsafeError, match="past 'remove-old-cache'"):
        replace.rollback(Sysfs(CAPTURES[0] / "sys"), j)
    assert refused == [] and replace.Journal.load(j.id).status == "running"


def test_a_run_over_several_lvs_on_one_ssd_owns_and_names_them_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #35 item 4: the other LVs cached on the same SSD PV ride in ``lvm["caches"]``;
    each step works on every cache (procedures/replace/lvm.caches), the plan lists them, and
    the run owns each LV (the gate's keys) and is named by each."""
    from cachemgr.procedures import owners

    data = _journal()
    lvm = data["lvm"]
    assert isinstance(lvm, dict)
    lvm["caches"] = [{"lv": "vm2", "segtype": "cache", "pool_kind": "cachepool",
                      "pool": "pool2", "data_bytes": 16777216, "meta_bytes": 8388608,
                      "chunk_bytes": 131072, "mode": "writethrough", "policy": "smq",
                      "settings": [], "need_bytes": 50331648}]
    _write(tmp_path, monkeypatch, data)
    j = replace.Journal.load("20261123-000000-vg0-vm1")
    assert j.lvs() == ["vg0/vm1", "vg0/vm2"]
    recs = replace_lvm.caches(j)
    assert [(m["vg"], m["lv"], m["pool"], m["pv"]) for m in recs] == [
        ("vg0", "vm1", "pool", "/dev/sda"), ("vg0", "vm2", "pool2", "/dev/sda")]
    plan = replace.describe(j)
    assert any("and of vg0/vm2 (cached on the same SSD PV /dev/sda): cache vg0/pool2" in x
               and "mode writethrough" in x for x in plan), plan
    assert replace.named_by(j, "vg0/vm2") and replace.named_by(j, "/dev/mapper/vg0-vm2")
    assert not replace.named_by(j, "vg0/vm3")
    keys = owners.replace_keys(j.kind, j.cset, j.backings, j.lvs())
    assert owners.lvm_key("vg0/vm2") in keys and owners.lvm_key("vg0/vm1") in keys
    assert "vg0/vm2 cached by vg0/pool2" in replace_lvm.done_line(j)
    # a journal of a run before this has no "caches": its own LV alone
    del lvm["caches"]
    _write(tmp_path, monkeypatch, data)
    j = replace.Journal.load("20261123-000000-vg0-vm1")
    assert j.lvs() == ["vg0/vm1"] and len(replace_lvm.caches(j)) == 1
