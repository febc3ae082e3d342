"""The words of each kind of SSD replacement (``replace.Kind``: bcache cache set, LVM cache,
dm-cache device), and the CLI's output that uses them: --list, the refusal of a second run,
the line a finished run ends with (issue #30 items 5 and 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.core.errors import UnsafeError
from cachemgr.ops import replace as ops_replace
from cachemgr.procedures import replace

DM_RUN = "20261122-000001-vc"
LVM_RUN = "20261122-000002-vg0-vm1"
DM_PAST = "20261122-000004-vc2"


@pytest.fixture(autouse=True)
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    replace.Journal(id=DM_RUN, cset="vc", kind="dmcache", options={}, old={}, backings=[],
                    done=["preflight", "remember", "drain"], status="failed",
                    error="release-old: the SSD is busy").save()
    replace.Journal(id=LVM_RUN, cset="vg0/vm1", kind="lvm", options={}, old={}, backings=[],
                    done=["preflight", "remember", "drain", "split"]).save()
    replace.Journal(id="20261122-000003-fb5bd09d", cset="fb5bd09d-1111-2222-3333-444455556666",
                    options={}, old={}, backings=[], done=["preflight", "remember"]).save()
    replace.Journal(id=DM_PAST, cset="vc2", kind="dmcache", options={}, old={}, backings=[],
                    done=["preflight", "remember", "drain", "release-old"]).save()


@pytest.mark.parametrize("name,what,tag,ponr,interim", [
    ("bcache", "bcache cache set", "cset", "unregister", True),
    ("lvm", "LVM cache", "lv", "remove-old-cache", False),
    ("dmcache", "dm-cache device", "dm", "release-old", False),
])
def test_each_kind_declares_its_words(name: str, what: str, tag: str, ponr: str,
                                      interim: bool) -> None:
    kind = replace.kind_of(name)
    assert (kind.name, kind.tag, kind.point_of_no_return, kind.interim_mode) == (
        what, tag, ponr, interim)
    assert ponr in kind.step_names and ponr in kind.funcs
    assert kind.label("fb5bd09d-1111-2222", short=True).startswith(f"{tag} ")
    assert kind.stays_up.endswith(".") and kind.undoes.endswith(".")
    assert f"'{ponr}'" in kind.rollback_words()
    assert kind in ops_replace.KINDS


def test_cli_list_and_refusal_use_the_kinds_tags(tmp_path: Path) -> None:
    lines = ops_replace.list_runs().lines
    assert any(line.startswith(DM_RUN) and " dm vc  done: drain" in line for line in lines)
    assert any(line.startswith(LVM_RUN) and " lv vg0/vm1  " in line for line in lines)
    assert any(" cset fb5bd09d-1111-2222-3333-444455556666  " in line for line in lines)
    with pytest.raises(UnsafeError) as exc:
        ops_replace._refuse_second(replace.Journal.load(DM_RUN))
    assert f"run {DM_RUN} on dm vc is unfinished" in exc.value.message
    assert f"--rollback {DM_RUN}" in str(exc.value.hint)
    with pytest.raises(UnsafeError) as exc:
        ops_replace._refuse_second(replace.Journal.load(DM_PAST))
    assert "--rollback" not in str(exc.value.hint)


def test_done_lines_are_the_kinds() -> None:
    dm = replace.Journal(id="r1", cset="vc", kind="dmcache", options={}, old={}, backings=[],
                         new={"node": "/dev/sdd"})
    assert replace.kind_of("dmcache").done_line(dm) == "r1: done; dm-cache vc caches on /dev/sdd"
    lv = replace.Journal(id="r2", cset="vg0/vm1", kind="lvm", options={}, old={}, backings=[],
                         new={"node": "/dev/sdd"}, lvm={"vg": "vg0", "pool": "pool"})
    assert replace.kind_of("lvm").done_line(lv) == \
        "r2: done; vg0/vm1 cached by vg0/pool on /dev/sdd"
    bc = replace.Journal(id="r3", cset="c0", options={}, old={},
                         backings=[{"uuid": "u", "name": "sdb", "node": "/dev/sdb",
                                    "device": "/dev/bcache0", "mode": "writeback"}],
                         new={"node": "/dev/sdd", "cset": "c1"})
    assert replace.BCACHE.done_line(bc) == \
        "r3: done; cache set c1 on /dev/sdd caches /dev/bcache0"
