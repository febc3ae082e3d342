"""Auto-attach of LVM caches ([lvm.NAME] policy entries) on the capture
tests/fixtures/lvm-split-uml: lvm2's report of vg0 with vm1's cache pool vg0/pool split off
and whole, vm2's pool vg0/pool2 and vm4's cachevol vg0/fast4 split off on a PV that is gone
(partial), vm3 cached by vg0/pool3 in writethrough, and vg0/plain, a plain LV."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.procedures import autoattach, policy
from cachemgr.procedures.autoattach import Event, LvmAttach, LvmSetMode, Note, View, decide

FX = Path(__file__).resolve().parent.parent / "fixtures" / "lvm-split-uml" / "sys"


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))


def view(lvm: bool = True) -> View:
    return autoattach.take_view(Sysfs(FX), udev=None, probe=None, lvm=lvm)


def entry(lv: str, cache: str, extra: str = "") -> policy.Policy:
    return policy.parse(f'version = 1\n[lvm.e]\nlv = "{lv}"\ncache = "{cache}"\n{extra}\n')


def notes(actions: list[autoattach.Action]) -> list[str]:
    assert all(isinstance(a, Note) for a in actions), actions
    return [a.message for a in actions if isinstance(a, Note)]


def test_the_view_reads_lvm2s_report_only_when_asked() -> None:
    v = view()
    assert v.lvm_error is None and v.lvm_rows is not None
    assert {r["lv_name"] for r in v.lvm_rows} >= {"vm1", "pool", "pool2", "fast4", "vm3"}
    assert view(lvm=False).lvm_rows is None


def test_a_split_pool_that_is_whole_is_attached_in_the_policys_mode() -> None:
    got = decide(None, view(), entry("vg0/vm1", "vg0/pool", 'mode = "writeback"'))
    assert got == [LvmAttach("vg0/vm1", "vg0/vm1", "e", "vg0/pool", False, "writeback")]
    assert got[0].describe() == \
        "attach vg0/pool to vg0/vm1 as its cache with lvm2 (mode writeback)"


@pytest.mark.parametrize(("lv", "cache"), [("vg0/vm2", "vg0/pool2"), ("vg0/vm4", "vg0/fast4")])
def test_a_cache_missing_a_pv_waits_for_it(lv: str, cache: str) -> None:
    extra = "erase_cachevol = true" if cache.endswith("fast4") else ""
    (msg,) = notes(decide(None, view(), entry(lv, cache, extra)))
    assert f"{cache} is missing a PV; it is attached when its PV returns" in msg
    assert "vgextend --restoremissing" in msg


def test_the_mode_of_an_attached_cache_is_set_and_then_left() -> None:
    assert decide(None, view(), entry("vg0/vm3", "vg0/pool3", 'mode = "writeback"')) == [
        LvmSetMode("vg0/vm3", "vg0/vm3", "e", "writeback", "writethrough")]
    assert decide(None, view(), entry("vg0/vm3", "vg0/pool3", 'mode = "writethrough"')) == []
    assert decide(None, view(), entry("vg0/vm3", "vg0/pool3")) == []


def test_an_lv_cached_by_another_cache_is_never_detached() -> None:
    (msg,) = notes(decide(None, view(), entry("vg0/vm3", "vg0/pool")))
    assert "vg0/vm3 is cached by vg0/pool3 (cache), the policy says vg0/pool" in msg
    assert "never detaches" in msg
    (msg,) = notes(decide(None, view(), entry(
        "vg0/vm3", "vg0/pool3", 'type = "writecache"\nerase_cachevol = true')))
    assert "the policy says vg0/pool3 (writecache)" in msg


def test_a_pool_in_use_by_another_lv_is_not_taken() -> None:
    (msg,) = notes(decide(None, view(), entry("vg0/vm1", "vg0/pool3")))
    assert "vg0/pool3 caches vg0/vm3 now; auto-attach never detaches" in msg


def test_a_plain_lv_is_attached_only_with_erase_cachevol() -> None:
    (msg,) = notes(decide(None, view(), entry("vg0/vm1", "vg0/plain")))
    assert "attaching it as a cachevol erases it; not attaching (erase_cachevol is false)" in msg
    assert decide(None, view(), entry("vg0/vm1", "vg0/plain", "erase_cachevol = true")) == [
        LvmAttach("vg0/vm1", "vg0/vm1", "e", "vg0/plain", False, None)]
    assert decide(None, view(), entry(
        "vg0/vm1", "vg0/plain", 'type = "writecache"\nerase_cachevol = true')) == [
        LvmAttach("vg0/vm1", "vg0/vm1", "e", "vg0/plain", True, None)]


def test_a_writecache_is_not_given_a_cache_pool() -> None:
    (msg,) = notes(decide(None, view(), entry(
        "vg0/vm1", "vg0/pool", 'type = "writecache"\nerase_cachevol = true')))
    assert "vg0/pool is a cache pool; a writecache takes a plain LV" in msg


def test_absent_lvs_give_nothing_and_a_missing_cache_says_so() -> None:
    assert decide(None, view(), entry("vg9/vm1", "vg9/pool")) == []
    (msg,) = notes(decide(None, view(), entry("vg0/vm1", "vg0/nopool")))
    assert "vg0/nopool does not exist" in msg


def test_an_unreadable_report_is_a_warning_and_no_action() -> None:
    v = replace(view(), lvm_rows=None, lvm_error="lvm: command not found")
    (msg,) = notes(decide(None, v, entry("vg0/vm1", "vg0/pool")))
    assert "lvm2's report could not be read (lvm: command not found); not acting" in msg


def test_an_lv_a_procedure_works_on_is_left_alone() -> None:
    # a drain/detach of vg0/vm1 interrupted: its journal names the LV
    state.write_json(state.journal_path("lvm-drain", "vg0/vm1"),
                     {"lv": "vg0/vm1", "policy": "smq", "cache_mode": "writeback"})
    (msg,) = notes(decide(None, view(), entry("vg0/vm1", "vg0/pool")))
    assert "leaving it alone: a drain, detach or remove of it is in progress" in msg
    assert "cachemgr drain vg0/vm1 --resume" in msg


def test_an_unfinished_replacement_of_the_lvs_ssd_leaves_it_alone() -> None:
    d = state.state_dir() / "replace"
    d.mkdir(parents=True)
    (d / "r1.json").write_text('{"schema": 1, "id": "r1", "status": "running", "kind": "lvm",'
                               ' "lvm": {"vg": "vg0", "lv": "vm1", "pool": "pool"}}')
    (msg,) = notes(decide(None, view(), entry("vg0/vm1", "vg0/pool")))
    assert "replace-ssd run r1 is unfinished" in msg


def ev(action: str, devname: str) -> Event:
    return Event(action, devname, 7, None, (), 0.0)


def test_events_of_a_pv_bring_the_lvm_entries_in_and_others_do_not() -> None:
    v = view()
    f = v.devices["ubda"]
    pv = replace(v, devices={**v.devices, "ubda": replace(
        f, identity=replace(f.identity, fs_type="LVM2_member"))})
    other = replace(v, devices={**v.devices, "ubda": replace(
        f, identity=replace(f.identity, fs_type="ext4"))})
    p = entry("vg0/vm1", "vg0/pool")
    assert [a.kind for a in decide(ev("add", "/dev/ubda"), pv, p)] == ["lvm-attach"]
    assert decide(ev("add", "/dev/ubda"), other, p) == []
    assert decide(ev("remove", "/dev/ubda"), pv, p) == []


def test_the_actions_go_through_the_attach_and_mode_commands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(autoattach_ops.cache_ops, "attach",
                        lambda *a, **k: calls.append(("attach", a[1:], k)))
    monkeypatch.setattr(autoattach_ops.cache_ops, "mode",
                        lambda *a, **k: calls.append(("mode", a[1:], k)))
    v = view()
    autoattach_ops.act(Sysfs(FX), v, LvmAttach("vg0/vm1", "vg0/vm1", "e", "vg0/fast", True))
    autoattach_ops.act(Sysfs(FX), v, LvmSetMode("vg0/vm3", "vg0/vm3", "e", "writeback", None))
    assert calls == [("attach", ("vg0/vm1", "vg0/fast"), {"writecache": True, "mode": None}),
                     ("mode", ("vg0/vm3", "writeback"), {})]


def test_a_pass_reads_lvm2_only_when_the_policy_names_an_lvm_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    real = autoattach.take_view

    def spy(sysfs: Sysfs, **kw: Any) -> View:
        asked.append(bool(kw.get("lvm")))
        return real(sysfs, udev=None, probe=None, **kw)

    monkeypatch.setattr(autoattach, "take_view", spy)
    res = autoattach.reconcile(Sysfs(FX), entry("vg0/vm1", "vg0/pool"), [None], dry_run=True)
    assert asked == [True]
    assert [(o.action.kind, o.result) for o in res.outcomes] == [("lvm-attach", "dry-run")]
    asked.clear()
    autoattach.reconcile(Sysfs(FX), policy.parse(""), [None], dry_run=True)
    assert asked == [False]
