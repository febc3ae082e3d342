"""Protect before the SSD dies (issue #31 item 6): the [protect] policy, the pure decision
(procedures/protect.py), the pass (ops/protect.py) through the gate, its state, the health
finding and the metric."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
from pathlib import Path

import pytest

from cachemgr.backends import smart, snapshot
from cachemgr.cli.main import main
from cachemgr.core import state
from cachemgr.core.model import CacheMode, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import health, policy, protect
from cachemgr.procedures.policy import ProtectPolicy
from cachemgr.procedures.protect import Member, Ssd
from tests.unit.test_parity import plant
from tests.unit.tui_helpers import copy_capture, kernel_writes

ON = ProtectPolicy(enabled=True)
CACHE_ERRORS = "devices/platform/uml-blkdev.1/block/ubdb/bcache/io_errors"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def wb(node: str = "/dev/bcache0", dirty: int | None = 4096,
       mode: CacheMode = CacheMode.WRITEBACK, wt: bool = True) -> Member:
    return Member(node, "bcache", mode, dirty, wt)


def ssd(errors: int | None = None, h: smart.Health | None = None,
        members: tuple[Member, ...] = (wb(),)) -> Ssd:
    return Ssd("/dev/sdc", "bcache:c1", members,
               {} if errors is None else {"bcache:c1": errors}, h)


def hl(**kw: object) -> smart.Health:
    return smart.Health("/dev/sdc", 1.0, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the policy


def test_off_by_default_and_the_table_parsed() -> None:
    pol = policy.parse('version = 1\n')
    assert pol.protect == ProtectPolicy() and not pol.protect.enabled
    d = protect.decide([ssd(errors=50, h=hl(passed=False))], pol.protect, {})
    assert d.acts == () and d.triggered == () and d.counts == {}
    pol = policy.parse('version = 1\n[protect]\nenabled = true\nio_errors = 3\n'
                       'smart_critical = false\nwear_percent = 80\n')
    assert pol.protect == ProtectPolicy(True, 3, False, 80)
    assert policy.parse(policy.dumps(pol)).protect == pol.protect
    assert policy.parse('[protect]\nenabled = true\nwear_percent = 0\n').protect.wear_percent \
        is None


def test_bad_protect_values_are_refused_with_their_lines() -> None:
    with pytest.raises(policy.PolicyError) as e:
        policy.parse('version = 1\n[protect]\nenabled = "yes"\nio_errors = 0\n'
                     'wear_percent = 300\nlimit = 2\n')
    lines = [(p.line, p.message.split()[0]) for p in e.value.problems]
    assert lines == [(3, "enabled"), (4, "io_errors"), (5, "wear_percent"), (6, "unknown")]


# ----------------------------------------------------------------------------- decisions


def test_rising_io_errors_trigger_flat_ones_do_not() -> None:
    p = dataclasses.replace(ON, io_errors=3)
    assert protect.decide([ssd(errors=5)], p, {"bcache:c1": 3}).acts == ()  # +2 < 3
    d = protect.decide([ssd(errors=6)], p, {"bcache:c1": 3})  # +3
    assert [(a.device, a.what) for a in d.acts] == [("/dev/bcache0", "switch")]
    assert "IO errors rose from 3 to 6" in d.triggered[0][1]
    assert d.counts == {"bcache:c1": 6}
    # flat since the last pass: nothing, however many there are
    assert protect.decide([ssd(errors=6)], ON, d.counts).acts == ()
    # unless an earlier pass protected the SSD: it stays protected while it caches
    again = protect.decide([ssd(errors=6)], ON, d.counts, {"bcache:c1": "IO errors rose"})
    assert [a.what for a in again.acts] == ["switch"]
    assert again.triggered[0][1] == "IO errors rose (an earlier pass)"
    # a count never seen counts from 0 (the first error is enough with the default 1)
    assert len(protect.decide([ssd(errors=1)], ON, {}).acts) == 1
    assert protect.decide([ssd(errors=0)], ON, {}).acts == ()
    # bcache's count decays: it is recorded lower and a rise counts from there
    d = protect.decide([ssd(errors=2)], ON, {"bcache:c1": 8})
    assert d.acts == () and d.counts == {"bcache:c1": 2}
    assert len(protect.decide([ssd(errors=3)], ON, d.counts).acts) == 1


def test_smart_critical_and_wear() -> None:
    assert protect.decide([ssd(h=hl(passed=True, wear_percent=89))], ON, {}).acts == ()
    for h, words in ((hl(passed=False), "SMART self-assessment failed"),
                     (hl(critical_warning=4), "NVMe critical warning 0x04"),
                     (hl(wear_percent=90), "wear 90 % (limit 90 %)")):
        d = protect.decide([ssd(h=h)], ON, {})
        assert len(d.acts) == 1 and words in d.triggered[0][1], h
    off = dataclasses.replace(ON, smart_critical=False, wear_percent=None)
    assert protect.decide([ssd(h=hl(passed=False, critical_warning=1, wear_percent=150))],
                          off, {}).acts == ()
    # an answer smartctl could not give says nothing
    assert protect.decide([ssd(h=hl(error="no answer", passed=False))], ON, {}).acts == ()


def test_every_device_on_the_ssd_each_as_its_mode_needs() -> None:
    members = (wb("/dev/bcache0"), wb("/dev/bcache1", mode=CacheMode.WRITEAROUND),
               wb("/dev/bcache2", dirty=0, mode=CacheMode.WRITETHROUGH),
               wb("/dev/bcache3", dirty=None, mode=CacheMode.NONE),
               Member("/dev/mapper/wc", "dm-writecache", CacheMode.WRITEBACK, 10, False),
               wb("/dev/bcache4"))
    d = protect.decide([ssd(errors=1, members=members)], ON, {})
    assert [(a.device, a.what) for a in d.acts] == [
        ("/dev/bcache0", "switch"), ("/dev/bcache4", "switch"), ("/dev/mapper/wc", "note"),
        ("/dev/bcache1", "drain"), ("/dev/bcache3", "drain")]
    assert "has no writethrough" in d.acts[2].describe()
    # an SSD that is fine is left alone beside the failing one
    other = Ssd("/dev/sdd", "wwn-2", (wb("/dev/bcache9"),), {"disk:wwn-2": 0})
    d = protect.decide([ssd(errors=1), other], ON, {})
    assert [a.device for a in d.acts] == ["/dev/bcache0"]
    assert d.counts == {"bcache:c1": 1, "disk:wwn-2": 0}


def test_the_state_keeps_a_protected_ssd_until_it_caches_nothing() -> None:
    s = ssd(errors=1)
    d = protect.decide([s], ON, {})
    st = protect.next_state({}, d, [s], {"/dev/bcache0": "done"}, now=10.0)
    assert st["protected"]["bcache:c1"]["since"] == 10.0
    assert st["protected"]["bcache:c1"]["devices"] == {"/dev/bcache0": "done"}
    # flat counts: no new trigger, the record stays (the SSD is still failing)
    d2 = protect.decide([s], ON, st["counts"])
    st2 = protect.next_state(st, d2, [s], {}, now=70.0)
    assert st2["protected"] == st["protected"]
    assert protect.protected(st2) == [("/dev/sdc", "(IO errors rose from 0 to 1 (bcache)); "
                                                   "devices switched to writethrough and "
                                                   "drained")]
    # replaced (or pulled): no cache on it any more
    assert protect.next_state(st2, protect.decide([], ON, {}), [], {})["protected"] == {}


# ------------------------------------------------------------------------ on a captured tree


def _policy(tmp_path: Path, enabled: bool = True) -> Path:
    p = tmp_path / "cachemgr.toml"
    p.write_text(f"version = 1\n[protect]\nenabled = {'true' if enabled else 'false'}\n")
    os.chmod(p, 0o644)
    return p


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


def sick(tmp_path: Path, errors: int = 3) -> Path:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (root / CACHE_ERRORS).write_text(f"{errors}\n")
    return root


def test_the_groups_of_a_captured_tree(tmp_path: Path) -> None:
    snap = snapshot.take(Sysfs(str(sick(tmp_path))))
    (g,) = protect.ssds(snap)
    c = snap.cache_sets[0]
    assert g.key == f"bcache:{c.uuid}" and g.node == "/dev/ubdb"
    assert g.io_errors == {f"bcache:{c.uuid}": 3}
    assert [(m.node, m.mode) for m in g.members] == [("/dev/bcache0", CacheMode.WRITEBACK)]


def test_dry_run_says_what_it_would_do_and_changes_nothing(tmp_path: Path,
                                                          state_dir: Path) -> None:
    root = sick(tmp_path)
    pol = _policy(tmp_path)
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--dry-run", "--policy", str(pol))
    assert rc == 0, out
    assert "SSD /dev/ubdb failing: IO errors rose from 0 to 3 (bcache)" in out
    assert "dry-run  protect /dev/bcache0: mode writethrough, then drain" in out
    assert not (state_dir / "protect").exists()
    rc, out2, _ = cli("--sysfs-root", str(root), "autoattach", "--dry-run", "--policy",
                      str(pol))
    assert "dry-run  protect /dev/bcache0: mode writethrough, then drain" in out2
    rc, js, _ = cli("--sysfs-root", str(root), "protect", "--dry-run", "--json", "--policy",
                    str(pol))
    doc = json.loads(js)
    assert doc["actions"][0]["result"] == "dry-run" and doc["ssds"][0]["why"]
    # disabled: nothing read, nothing decided
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--dry-run", "--policy",
                     str(_policy(tmp_path, enabled=False)))
    assert rc == 0 and "protect is off" in out


def test_a_device_a_replacement_owns_is_skipped_with_the_gates_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    root = sick(tmp_path)
    writes = kernel_writes(monkeypatch)
    plant(root, "replace:/dev/bcache0")
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy",
                       str(_policy(tmp_path)))
    assert rc == 0, out + err
    assert "skipped  protect /dev/bcache0" in out and "replace-ssd" in out
    assert not [w for w in writes if "cache_mode" in w[0]], writes
    entries = [json.loads(x) for x in (state_dir / "autoattach" / "actions.jsonl")
               .read_text().splitlines()]
    assert [(e["kind"], e["result"]) for e in entries] == [("protect", "skipped")]
    st = protect.load_state()
    assert next(iter(st["protected"].values()))["devices"] == {"/dev/bcache0": "skipped"}
    # check says it is not protected yet; the next pass tries again
    rc, out, _ = cli("--sysfs-root", str(root), "check")
    assert rc == 2 and "not protected yet: /dev/bcache0 (skipped)" in out, out


def test_a_pass_switches_drains_records_and_check_says_critical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    from cachemgr.ops import cache as cache_ops

    root = sick(tmp_path)
    writes = kernel_writes(monkeypatch)
    drained: list[str] = []
    monkeypatch.setattr(cache_ops, "drain", lambda sysfs, dev, **kw: drained.append(dev))
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy",
                       str(_policy(tmp_path)))
    assert rc == 0, out + err
    assert ("block/bcache0/bcache/cache_mode", "writethrough") in writes or any(
        w[0].endswith("cache_mode") and w[1] == "writethrough" for w in writes), writes
    assert drained == ["/dev/bcache0"]
    assert "done     protect /dev/bcache0" in out
    assert "protect: SSD /dev/ubdb failing" in err
    st = protect.load_state()
    assert st["counts"] and next(iter(st["protected"].values()))["ssd"] == "/dev/ubdb"
    rc, out, _ = cli("--sysfs-root", str(root), "check")
    assert rc == 2
    assert ("/dev/ubdb: protected: SSD /dev/ubdb failing (IO errors rose from 0 to 3 "
            "(bcache)); devices switched to writethrough and drained; replace it; next: "
            "cachemgr replace-ssd /dev/ubdb") in out
    # a second pass, counts flat: the SSD stays protected (the captured device still reads
    # dirty, the drain being a stand-in here: drained again, never switched again)
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--policy", str(_policy(tmp_path)))
    assert rc == 0 and "(an earlier pass)" in out and drained == ["/dev/bcache0"] * 2
    assert "mode writethrough" not in out
    from cachemgr.procedures import metrics

    fams = {f.name: f for f in metrics.collect(snapshot.take(Sysfs(str(root))))}
    (s,) = fams["cachemgr_protect_active"].samples
    assert s.labels == {"ssd": "/dev/ubdb"} and s.value == 1.0


def test_the_health_finding() -> None:
    snap = Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=(),
                    protected=(("/dev/sdc", "(wear 93 % (limit 90 %)); devices switched "
                                            "to writethrough and drained"),))
    (f,) = health.assess(snap)
    assert (f.level, f.code, f.device) == (health.Level.CRITICAL, "protected", "/dev/sdc")
    assert f.next == "cachemgr replace-ssd /dev/sdc"
    assert f.what == ("protected: SSD /dev/sdc failing (wear 93 % (limit 90 %)); devices "
                      "switched to writethrough and drained; replace it")


def test_the_state_file_is_the_state_directory_s(state_dir: Path) -> None:
    assert protect.load_state() == {"counts": {}, "protected": {}}
    assert not state_dir.exists()  # reading never creates it
    state.write_json(state_dir / "protect" / "state.json", {"counts": {"a": 1},
                                                           "protected": "junk"})
    assert protect.load_state() == {"counts": {"a": 1}, "protected": {}}


def test_a_dm_cache_is_grouped_by_its_cache_device(tmp_path: Path) -> None:
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "dmcache-writeback"))))
    groups = protect.ssds(snap)
    d = snap.dmcaches[0]
    assert d.cache is not None
    g = next(g for g in groups if g.node == d.cache.node)
    assert g.key == f"dev:{d.cache.node}"
    assert [(m.node, m.kind, m.can_writethrough) for m in g.members] == [
        (d.node, "dm-cache", True)]
    # an SSD failing by SMART (no error counter on it): the dm-cache switched, then drained
    sick = dataclasses.replace(g, health=hl(passed=False))
    dec = protect.decide([sick], ON, {})
    assert [(a.device, a.what) for a in dec.acts] == [(d.node, "switch")]


def test_status_says_it_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = sick(tmp_path)
    kernel_writes(monkeypatch)
    from cachemgr.ops import cache as cache_ops

    monkeypatch.setattr(cache_ops, "drain", lambda sysfs, dev, **kw: None)
    assert cli("--sysfs-root", str(root), "protect", "--policy", str(_policy(tmp_path)))[0] == 0
    rc, out, _ = cli("--sysfs-root", str(root), "status", "--no-vms")
    assert rc == 0
    assert "CRITICAL: /dev/ubdb: protected: SSD /dev/ubdb failing" in out, out


def test_the_boot_pass_switches_and_leaves_the_drain_to_the_timer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.ops import cache as cache_ops

    root = sick(tmp_path)
    writes = kernel_writes(monkeypatch)
    drained: list[str] = []
    monkeypatch.setattr(cache_ops, "drain", lambda sysfs, dev, **kw: drained.append(dev))
    pol = str(_policy(tmp_path))
    rc, out, err = cli("--sysfs-root", str(root), "autoattach", "--policy", pol)
    assert rc == 0, out + err
    assert any(w[0].endswith("cache_mode") and w[1] == "writethrough" for w in writes)
    assert drained == [] and "switched protect /dev/bcache0" in out
    assert "the boot pass does not wait for them" in err
    rc, out, _ = cli("--sysfs-root", str(root), "check")
    assert "not protected yet: /dev/bcache0 (switched)" in out
    # the timer's pass drains it
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and drained == ["/dev/bcache0"] and "done     protect /dev/bcache0" in out
