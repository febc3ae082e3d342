"""replace-ssd's plan and the gate (ops/replace.py plan: gate.check): what an interrupted
procedure left must not become what the run restores.

Each test here failed on the code before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs
from tests.unit.test_parity import plant
from tests.unit.tui_helpers import copy_capture


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    return d


# ------------------------------------------------- replace-ssd's plan and an interrupted drain


def test_a_replacement_plan_refuses_a_device_an_interrupted_drain_left(
        tmp_path: Path) -> None:
    """A drain killed mid-way leaves writeback_percent=0, writeback_delay=1 (its journal
    keeps the originals). The plan passed it ("a drain takes over a drain") and recorded
    those interim values as the ones the run restores at its end; the run's drain step then
    consumed the drain's journal: the originals were lost for good. The plan refuses, naming
    the drain's --resume."""
    from cachemgr.backends import snapshot
    from cachemgr.ops import replace as replace_ops

    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    sysfs = Sysfs(str(root))
    snap = snapshot.take(sysfs)
    b = snap.backings[0]
    ssd = snap.cache_sets[0].caches[0].identity.node
    replace_ops.plan(sysfs, ssd, replace_ops.Options(yes=True))  # plans without the journal
    plant(root, f"drain:{b.device}")
    with pytest.raises(UnsafeError) as exc:
        replace_ops.plan(sysfs, ssd, replace_ops.Options(yes=True))
    assert "owned by drain" in exc.value.message and exc.value.exit_code == 3
    assert f"cachemgr drain {b.device} --resume" in (exc.value.hint or "")


