"""The bench locks every disk its hygiene changes (issue #44 item 3): the whole disks whose
IO scheduler it sets (DEVICE@SCHEDULER: the disks under a bcache device) and, with --fresh,
the cache SSD it formats again; so `cachemgr scheduler` on one of them is refused while the
bench runs. On a copied capture (bcache-writeback-dirty-uml: bcache0 on ubda, its cache set
on ubdb)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import bench as bench_ops
from cachemgr.ops import gate
from cachemgr.ops import scheduler as scheduler_ops
from tests.unit.tui_helpers import copy_capture, kernel_writes


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def sysfs_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sysfs:
    kernel_writes(monkeypatch)
    return Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))


@pytest.mark.parametrize("targets, fresh, disks", [
    (["/dev/bcache0"], False, set()),
    (["/dev/bcache0"], True, {"disk-ubdb"}),  # the cache SSD, formatted again
    (["/dev/bcache0@none"], False, {"disk-ubda", "disk-ubdb"}),  # the disks under bcache0
])
def test_the_bench_subject_holds_the_disks_its_hygiene_touches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, targets: list[str], fresh: bool,
        disks: set[str]) -> None:
    sysfs = sysfs_of(tmp_path, monkeypatch)
    keys = bench_ops._bench_subject(sysfs, targets, fresh=fresh).keys
    assert {k for k in keys if k.startswith("disk-")} == disks, keys


@pytest.mark.skipif(os.geteuid() != 0, reason="the gate takes locks as root only")
def test_scheduler_on_a_disk_the_bench_set_is_refused_while_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs = sysfs_of(tmp_path, monkeypatch)
    subject = bench_ops._bench_subject(sysfs, ["/dev/bcache0@none"])
    box: list[BaseException | None] = []

    def other() -> None:
        try:
            scheduler_ops.set_scheduler(sysfs, "/dev/ubda", "none")
            box.append(None)
        except BaseException as exc:  # the refusal is what is checked
            box.append(exc)

    with gate.gate(subject, "bench", check_kind=False):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    (err,) = box
    assert isinstance(err, state.BusyError), err
    assert "bench" in str(err), err
