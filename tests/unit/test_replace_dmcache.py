"""replace-ssd's plan for a plain dm-cache device (procedures/replace/dmcache.py) on captured
lab trees: dmcache-states-uml (caches over dm-linear cache and metadata areas on ubd disks)
and dmcache-writeback-uml (vmcache over whole ubd disks). The lab's ubd disks cannot be
pulled, so these plans are refused, with nothing written, run or journaled; the plan on a
scsi_debug SSD and every step are proven on the lab kernel
(tests/kernel/test_replace_dmcache_kernel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import replace as ops_replace
from cachemgr.procedures import replace
from cachemgr.procedures.replace import dmcache as replace_dmcache
from cachemgr.procedures.replace import lvm as replace_lvm
from tests.unit.test_replace_plan import _refused_before_any_step
from tests.unit.tui_helpers import copy_capture, fx


@pytest.mark.parametrize("capture,argv,rc,says", [
    ("dmcache-states", ["wt", "--yes"], 2,
     "/dev/ubdb (the SSD under /dev/mapper/wt) is neither a SCSI disk nor an NVMe namespace"),
    ("dmcache-states", ["/dev/mapper/pt", "--dry-run"], 2,
     "(the SSD under /dev/mapper/pt) is neither"),
    ("dmcache-writeback", ["vmcache", "--dry-run"], 2,
     "/dev/ubdb (the SSD under /dev/mapper/vmcache) is neither"),
    ("dmcache-states", ["wt", "--interim-mode", "writearound", "--yes"], 2,
     "--interim-mode writearound does not apply to a dm-cache device"),
    ("dmcache-states", ["wt", "--keep-old-signature", "--yes"], 2,
     "--keep-old-signature does not apply to a dm-cache device"),
    ("dmcache-states", ["flushing", "--yes"], 2, "neither a SCSI disk"),
])
def test_plans_the_lab_captures_cannot_run_are_refused(
        capture: str, argv: list[str], rc: int, says: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, capture)
    got, err = _refused_before_any_step(tmp_path, monkeypatch, root, argv)
    assert got == rc and says in err, err


def test_which_devices_are_dm_caches_for_the_replacement() -> None:
    sysfs = Sysfs(fx("dmcache-states"))
    assert replace_dmcache.names_dm(sysfs, "wt") is not None
    assert replace_dmcache.names_dm(sysfs, "/dev/mapper/wt") is not None
    assert replace_dmcache.names_dm(sysfs, "vg0-lv0") is None  # LVM's: replace_lvm
    assert replace_dmcache.names_dm(sysfs, "c0") is None  # linear, not a cache
    assert replace_dmcache.names_dm(sysfs, "nosuch") is None
    assert ops_replace.steps_for("wt", sysfs) == replace_dmcache.STEPS
    assert ops_replace.steps_for("vg0/lv0", sysfs) == replace_lvm.STEPS
    assert ops_replace.steps_for("/dev/sda") == replace.STEPS
    assert replace.kind_of("dmcache").point_of_no_return == "release-old"
