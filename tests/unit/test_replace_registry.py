"""replace-ssd asks its kinds (procedures/replace/run.py ``KINDS``): which kind a CACHE is
(each kind's ``claims``, bcache the fallback), whose plan it takes, which fields of
``replace-ssd --json`` each fills and which names name a run's cache (``names_run``)
(issue #44 item 2). A kind that ships nowhere, added to the registry here and nowhere
else, is recognised, planned and shown; the built-in kinds' JSON fields are pinned as
docs/json.md gives them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import replace as ops_replace
from cachemgr.procedures import replace
from cachemgr.procedures.replace import journal, run, steps

LVM_CAPTURE = Path(__file__).resolve().parent.parent / "fixtures" / "lvm-caches-uml" / "sys"


def test_the_registry_is_the_journals_table() -> None:
    assert tuple(run.KINDS) == journal.KIND_NAMES == tuple(steps.BY_KIND)
    assert [k.fallback for k in replace.kinds()] == [True, False, False]
    for name in run.KINDS:
        assert replace.kind_of(name).steps == steps.of(name)
    assert replace.kind_of("no such kind") is replace.BCACHE


@pytest.mark.parametrize("cache,kind", [
    ("vg0/vm1", "lvm"),  # spelt as an LV: told without a look at the host
    ("/dev/vg0/vm1", "lvm"),
    ("vg0-vm1", "lvm"),  # the dm name of an LVM cache: LVM's all the same
    ("/dev/sda", "bcache"),  # an SSD: bcache's checks say what is wrong with it
])
def test_each_kind_is_asked_in_turn(cache: str, kind: str) -> None:
    sysfs = Sysfs(LVM_CAPTURE)
    assert ops_replace.kind_for(cache, sysfs) is replace.kind_of(kind)
    # the TUI passes the snapshot it has: the same answer, and no snapshot taken for it
    snap = snapshot.take(sysfs)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(snapshot, "take", lambda *a, **k: pytest.fail("a snapshot was taken"))
        assert ops_replace.kind_for(cache, sysfs, snap) is replace.kind_of(kind)


def _journal(kind: str, cset: str, **kw: Any) -> replace.Journal:
    return replace.Journal(id="r1", cset=cset, kind=kind, options={}, old={}, backings=[],
                           **kw)


@pytest.mark.parametrize("j,fields", [
    (_journal("bcache", "c0", new={"cset": "c1"}),
     {"cset": "c0", "new_cset": "c1", "lv": None, "lvm": None, "dm_name": None, "dm": None}),
    (_journal("lvm", "vg0/vm1", lvm={"vg": "vg0"}),
     {"cset": None, "new_cset": None, "lv": "vg0/vm1", "lvm": {"vg": "vg0"}, "dm_name": None,
      "dm": None}),
    (_journal("dmcache", "vc", dm={"table": "0 8 cache"}),
     {"cset": None, "new_cset": None, "lv": None, "lvm": None, "dm_name": "vc",
      "dm": {"table": "0 8 cache"}}),
])
def test_each_kind_fills_its_own_json_fields(j: replace.Journal,
                                             fields: dict[str, Any]) -> None:
    doc = ops_replace.journal_json(j)
    assert list(doc)[:11] == ["schema", "id", "kind", "status", "error", *fields]
    assert {k: doc[k] for k in fields} == fields
    assert list(doc)[11:] == ["old", "new", "steps", "wall_s", "drain_s", "backings"]


def test_a_kind_registered_here_is_recognised_planned_and_shown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[tuple[str, object]] = []

    def plan(sysfs: Sysfs, cache: str, opts: replace.Options, found: object
             ) -> replace.Journal:
        planned.append((cache, found))
        return _journal("opencas", cache, new={"cset": "not mine"})

    opencas = dataclasses.replace(
        replace.BCACHE, name="Open-CAS cache", tag="cas", fallback=False,
        claims=lambda cache, sysfs, snap: cache.removeprefix("cas:") if cache.startswith(
            "cas:") else None,
        plan=plan, json=lambda j: {"cas_id": j.cset},
        names_run=lambda j, spec: spec.removeprefix("cas:") == j.cset.removeprefix("cas:"))
    monkeypatch.setitem(run.KINDS, "opencas", lambda: opencas)
    sysfs = Sysfs(LVM_CAPTURE)
    assert ops_replace.kind_for("cas:1") is opencas
    assert ops_replace.kind_for("vg0-vm1", sysfs) is replace.kind_of("lvm")
    j = ops_replace._plan(sysfs, "cas:1", replace.Options())
    assert planned == [("cas:1", "1")] and j.kind == "opencas"
    doc = ops_replace.journal_json(j)
    assert doc["cas_id"] == "cas:1"
    # a run is named as its kind says (bcache's would take "cas:1" alone)
    assert replace.named_by(j, "1") and replace.named_by(j, " cas:1 ")
    assert not replace.named_by(j, "2") and not replace.named_by(j, "")
    # the other kinds' fields are null: bcache's new_cset is not read from this run
    assert all(doc[k] is None for k in ("cset", "new_cset", "lv", "lvm", "dm_name", "dm"))
    other = ops_replace.journal_json(_journal("dmcache", "vc"))
    assert other["cas_id"] is None and other["dm_name"] == "vc"
