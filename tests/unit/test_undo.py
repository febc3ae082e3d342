"""Nothing left changed by a lost session (issue #32 item 1): what bench's hygiene changes
is journaled before each change (core/undo.py); a run that ends puts it back and the
journal goes; one killed outright leaves it, status and check show the device owned by the
interrupted bench, and the next command on the device (or cachemgr restore) puts the
settings back first. On a copied capture (bcache-writeback-dirty-uml: bcache0 writeback on
cache set fb5bd09d), its sysfs files written as the kernel's would read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import state, undo
from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import kinds, owners
from cachemgr.procedures.bench.hygiene import Hygiene
from tests.unit.test_parity import cli
from tests.unit.tui_helpers import copy_capture, kernel_writes

CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Sysfs, set[str]]:
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    snap = snapshot.take(sysfs)
    k = kinds.resolve(snap, "/dev/bcache0", sysfs)
    return root, sysfs, {key for key, _ in k.locks}


def bench_changes(sysfs: Sysfs, keys: set[str], *, restore: bool) -> None:
    """What a bench's hygiene does to bcache0 for a writethrough run (comparison.run_one):
    the mode and the congestion thresholds; ``restore`` False: killed before its end."""
    with undo.recording("bench", "/dev/bcache0:writethrough", keys, sysfs):
        hyg = Hygiene(sysfs)
        hyg.set("/dev/bcache0 cache_mode", "block/bcache0/bcache/cache_mode", "writethrough")
        for k in ("congested_read_threshold_us", "congested_write_threshold_us"):
            hyg.set(f"cache set {CSET[:8]} {k}", f"fs/bcache/{CSET}/{k}", "0")
        if restore:
            hyg.restore()


def settings(sysfs: Sysfs) -> tuple[str, str, str]:
    return (sysfs.read("block/bcache0/bcache/cache_mode").strip(),
            sysfs.read(f"fs/bcache/{CSET}/congested_read_threshold_us").strip(),
            sysfs.read(f"fs/bcache/{CSET}/congested_write_threshold_us").strip())


def test_a_bench_that_ends_leaves_no_journal(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _, sysfs, keys = setup(tmp_path, monkeypatch)
    before = settings(sysfs)
    bench_changes(sysfs, keys, restore=True)
    assert settings(sysfs) == before and undo.journals() == []
    assert not [o for o in owners.interrupted() if owners.undo_journal(o)]


def test_a_bench_killed_outright_is_shown_then_put_back_by_the_next_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, sysfs, keys = setup(tmp_path, monkeypatch)
    before = settings(sysfs)
    assert "[writeback]" in before[0] and before[1:] == ("2000", "20000")
    bench_changes(sysfs, keys, restore=False)
    assert settings(sysfs)[1:] == ("0", "0") and "[writethrough]" in settings(sysfs)[0]
    (j,) = undo.journals()
    assert j.entries[0][0] == "/dev/bcache0 cache_mode" and j.keys == keys
    # status and check say so, with the command that puts it back
    rc, out, _ = cli(root, ["status"])
    assert rc == 0 and "owned by bench" in out and "cachemgr restore" in out, out
    rc, out, _ = cli(root, ["check", "--json"])
    doc = json.loads(out)
    assert rc == 1 and "interrupted-bench" in [f["code"] for f in doc["findings"]], out
    # the next command on the device puts everything back first, then does its change
    rc, out, err = cli(root, ["mode", "/dev/bcache0", "writearound"])
    assert rc == 0, err
    assert "put back what an interrupted bench" in err, err
    assert settings(sysfs)[1:] == ("2000", "20000")
    assert "[writearound]" in settings(sysfs)[0]
    assert undo.journals() == []
    rc, out, _ = cli(root, ["restore"])
    assert rc == 4 and "nothing to put back" in out


def test_restore_puts_back_and_a_running_bench_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, sysfs, keys = setup(tmp_path, monkeypatch)
    bench_changes(sysfs, keys, restore=False)
    # while a run holds the device's lock (its bench still running), restore refuses
    with state.locked(sorted(keys)[0], "/dev/bcache0", holder={"procedure": "bench"}):
        assert [o.running for o in owners.owners() if owners.undo_journal(o)] == [True]
        import threading

        box: list[tuple[int, str, str]] = []
        t = threading.Thread(target=lambda: box.append(cli(root, ["restore"])))
        t.start()
        t.join()
        rc, _, err = box[0]
        assert rc == 3 and "bench" in err, err
        assert settings(sysfs)[1:] == ("0", "0")
    rc, out, err = cli(root, ["restore", "/dev/bcache0", "--json"])
    assert rc == 0, err
    (done,) = json.loads(out)["restored"]
    assert done["procedure"] == "bench" and len(done["put_back"]) == 3
    assert settings(sysfs)[1:] == ("2000", "20000") and undo.journals() == []


def test_a_journal_naming_a_path_outside_sysfs_settings_is_never_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, sysfs, keys = setup(tmp_path, monkeypatch)
    with undo.recording("bench", "/dev/bcache0", keys, sysfs) as j, \
            pytest.raises(Exception, match="refusing to record"):
        j.remember("evil", "block/../../etc/shadow", "x")
    path = state.journal_path(undo.KIND, "forged")
    state.write_json(path, {"procedure": "bench", "device": "/dev/bcache0",
                            "keys": sorted(keys), "root": str(root),
                            "entries": [{"what": "x", "path": "block/../../../etc/x",
                                         "value": "1"}]})
    assert undo.journals() == [] and undo.unreadable() == [(str(path), "not an undo journal")]
    assert owners.unreadable() == [(str(path), "not an undo journal")]


@pytest.mark.parametrize("answer", [True, False])
def test_a_command_that_asks_after_an_interrupted_bench_says_it_puts_back_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: bool) -> None:
    """The check before the question has the gate's rules (ops/gate.py precheck): an
    interrupted bench's settings do not refuse the command (with --yes the gate puts them
    back and goes ahead, and so does the command that asks); the question says they are
    put back first. Answered no, nothing is changed, the bench's settings included."""
    from cachemgr.ops import cache as cache_ops
    from cachemgr.ops.control import Control, Plan

    _, sysfs, keys = setup(tmp_path, monkeypatch)
    bench_changes(sysfs, keys, restore=False)
    left = settings(sysfs)
    asked: list[Plan] = []

    def confirm(plan: Plan) -> bool:
        asked.append(plan)
        return answer

    ctl = Control(what="mode", confirm=confirm)
    if not answer:
        with pytest.raises(UnsafeError, match="not confirmed"):
            cache_ops.mode(sysfs, "/dev/bcache0", "none", ctl=ctl)
        assert settings(sysfs) == left and len(undo.journals()) == 1
    else:
        cache_ops.mode(sysfs, "/dev/bcache0", "none", ctl=ctl)
        assert settings(sysfs)[1:] == ("2000", "20000") and "[none]" in settings(sysfs)[0]
        assert undo.journals() == []
    (plan,) = asked
    assert plan.lines[0].startswith("would first put back what an interrupted bench (since "
                                    ), plan.lines
    assert "left changed on /dev/bcache0" in plan.lines[0], plan.lines
