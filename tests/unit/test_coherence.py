"""``cachemgr invalidate`` and the records of procedures/coherence.py on captures: the
refusals come before any change and record nothing; a pending invalidation owns its device
until it is finished. The kernel behaviour (each kind's way of dropping its copies, the stale
blocks counted) is tests/kernel/test_coherence_kernel.py's."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import coherence, kinds, owners
from tests.unit.guards import mutations_refused
from tests.unit.tui_helpers import copy_capture


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def cli(root: Path, argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["--sysfs-root", str(root), *argv])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


def test_a_dirty_writeback_cache_is_refused_before_anything(
        tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    ran = mutations_refused(monkeypatch)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    rc, _, err = cli(root, ["invalidate", "/dev/bcache0", "--yes"])
    assert rc == 3, err
    assert "/dev/bcache0 is in writeback with 4.4 MiB of dirty data" in err, err
    assert "cachemgr mode /dev/bcache0 writethrough --drain && cachemgr invalidate" in err
    assert ran == []
    assert not (state_dir / coherence.PENDING).exists()  # nothing recorded
    assert {p: p.read_bytes() for p in before} == before  # nothing written to the tree


def test_a_pending_invalidation_owns_its_device(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    mutations_refused(monkeypatch)
    dev = kinds.resolve(snapshot.take(Sysfs(str(root))), "/dev/bcache0", Sysfs(str(root)))
    coherence.pending(dev.locks[0][0], "/dev/bcache0", mode="writethrough")
    (o,) = [o for o in owners.interrupted() if o.procedure == "invalidation"]
    assert o.keys == {dev.locks[0][0]} and o.resume == "cachemgr invalidate /dev/bcache0 --yes"
    rc, _, err = cli(root, ["mode", "/dev/bcache0", "writethrough"])
    assert rc == 3, err
    assert "owned by invalidation" in err and "cachemgr invalidate /dev/bcache0 --yes" in err
    rc, out, _ = cli(root, ["check"])
    assert rc == 1 and "invalidation" in out, out


def test_records_come_and_go(tmp_path: Path) -> None:
    coherence.left("k1", "/dev/bcache0", "vm1", "vda")
    coherence.pending("k2", "/dev/mapper/vc", mode="writethrough")
    found = {m.key: m for m in coherence.marks()}
    assert set(found) == {"k1", "k2"}
    assert "VM 'vm1' left this host" in found["k1"].words()
    assert "did not finish" in found["k2"].words()
    assert [m.key for m in coherence.marked({"k2"})] == ["k2"]
    coherence.done("k1")
    coherence.done("k2")
    assert coherence.marks() == []


def test_only_the_kinds_that_can_drop_their_copies_declare_it() -> None:
    can = {k.name for k in kinds.REGISTRY if "invalidate" in k.actions}
    # a writecache holds what was written, dirty or written back, and serves reads from it;
    # it has no way to drop its blocks but its removal (docs/admin-guide.md)
    assert can == {"bcache", "dm-cache", "lvmcache"}
