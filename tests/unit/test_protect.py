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
    assert d.triggered[0][1] == ("bcache's IO error count on the cache device rose from 3 "
                                 "to 6")
    assert d.counts == {"bcache:c1": 6}
    # flat since the last pass: nothing, however many there are
    assert protect.decide([ssd(errors=6)], ON, d.counts).acts == ()
    # unless an earlier pass protected the SSD: it stays protected while it caches
    again = protect.decide([ssd(errors=6)], ON, d.counts, {"bcache:c1": "IO errors rose"})
    assert [a.what for a in again.acts] == ["switch"]
    assert again.triggered[0][1] == "since an earlier pass: IO errors rose"
    # a count never seen is the baseline, whatever it reads (issue #41: an SSD that had
    # errors before protect was turned on, or before cachemgr was installed)
    for n in (1, 50):
        first = protect.decide([ssd(errors=n)], ON, {})
        assert first.acts == () and first.triggered == ()
        assert first.counts == {"bcache:c1": n} and first.ignored == {"bcache:c1": "first seen"}
    # the first error after the baseline is enough with the default 1
    assert len(protect.decide([ssd(errors=51)], ON, {"bcache:c1": 50}).acts) == 1
    # bcache's count decays: it is recorded lower and a rise counts from there
    d = protect.decide([ssd(errors=2)], ON, {"bcache:c1": 8})
    assert d.acts == () and d.counts == {"bcache:c1": 2}
    assert len(protect.decide([ssd(errors=3)], ON, d.counts).acts) == 1


def test_smart_critical_and_wear() -> None:
    assert protect.decide([ssd(h=hl(passed=True, wear_percent=89))], ON, {}).acts == ()
    for h, words in ((hl(passed=False), "SMART self-assessment failed"),
                     (hl(critical_warning=4), "NVMe critical warning 0x04"),
                     (hl(wear_percent=90), "wear 90 %, limit 90 %")):
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
    d = protect.decide([ssd(errors=1, members=members)], ON, {"bcache:c1": 0})
    assert [(a.device, a.what) for a in d.acts] == [
        ("/dev/bcache0", "switch"), ("/dev/bcache4", "switch"), ("/dev/mapper/wc", "note"),
        ("/dev/bcache1", "drain"), ("/dev/bcache3", "drain")]
    assert "has no writethrough" in d.acts[2].describe()
    # an SSD that is fine is left alone beside the failing one
    other = Ssd("/dev/sdd", "wwn-2", (wb("/dev/bcache9"),), {"disk:wwn-2": 0})
    d = protect.decide([ssd(errors=1), other], ON, {"bcache:c1": 0})
    assert [a.device for a in d.acts] == ["/dev/bcache0"]
    assert d.counts == {"bcache:c1": 1, "disk:wwn-2": 0}


def test_the_state_keeps_a_protected_ssd_until_it_caches_nothing() -> None:
    s = ssd(errors=1)
    d = protect.decide([s], ON, {"bcache:c1": 0})
    st = protect.next_state({}, d, [s], {"/dev/bcache0": "done"}, now=10.0)
    assert st["protected"]["bcache:c1"]["since"] == 10.0
    assert st["protected"]["bcache:c1"]["devices"] == {"/dev/bcache0": "done"}
    assert st["protected"]["bcache:c1"]["modes"] == {"/dev/bcache0": "writeback"}
    # flat counts: no new trigger, the record stays (the SSD is still failing)
    d2 = protect.decide_from([s], ON, st)
    st2 = protect.next_state(st, d2, [s], {}, now=70.0)
    assert st2["protected"] == {"bcache:c1": {**st["protected"]["bcache:c1"], "last": 70.0}}
    assert protect.protected(st2) == [("/dev/sdc", (
        "bcache's IO error count on the cache device rose from 0 to 1; protected since "
        "1970-01-01 00:00:10 UTC; devices switched to writethrough and drained: "
        "/dev/bcache0; if the SSD is sound, cachemgr protect --clear /dev/sdc puts back "
        "/dev/bcache0 writeback"))]
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
    """The captured writeback tree, seen healthy by a pass (the baseline: 0 errors), then
    with ``errors`` IO errors on its cache device."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (root / CACHE_ERRORS).write_text("0\n")
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy",
                       str(_policy(tmp_path)))
    assert rc == 0 and "none failing" in out, out + err
    (root / CACHE_ERRORS).write_text(f"{errors}\n")
    return root


def nested(text: str) -> list[str]:
    """The lines of ``text`` with a bracket inside another (issue #41)."""
    out = []
    for line in text.splitlines():
        depth = 0
        for ch in line:
            depth += ch in "([{"
            if depth > 1:
                out.append(line)
                break
            depth -= ch in ")]}"
    return out


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
    assert ("SSD /dev/ubdb failing: bcache's IO error count on the cache device rose from 0 "
            "to 3 between ") in out
    assert "dry-run  protect /dev/bcache0: mode writethrough, then drain" in out
    kept = (state_dir / "protect" / "state.json").read_text()
    assert '"protected": {}' in kept
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
    assert (state_dir / "protect" / "state.json").read_text() == kept  # a dry run writes none


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
    assert rc == 2 and "not protected yet: /dev/bcache0: skipped" in out, out


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
    assert ("/dev/ubdb: protected: SSD /dev/ubdb failing: bcache's IO error count on the "
            "cache device rose from 0 to 3 between ") in out
    assert ("devices switched to writethrough and drained: /dev/bcache0; if the SSD is sound, "
            "cachemgr protect --clear /dev/ubdb puts back /dev/bcache0 writeback; next: "
            "cachemgr replace-ssd /dev/ubdb") in out
    assert not nested(out)
    # a second pass, counts flat: the SSD stays protected (the captured device still reads
    # dirty, the drain being a stand-in here: drained again, never switched again)
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--policy", str(_policy(tmp_path)))
    assert rc == 0 and "since an earlier pass" in out and drained == ["/dev/bcache0"] * 2
    assert "mode writethrough" not in out
    from cachemgr.procedures import metrics

    fams = {f.name: f for f in metrics.collect(snapshot.take(Sysfs(str(root))))}
    (s,) = fams["cachemgr_protect_active"].samples
    assert s.labels == {"ssd": "/dev/ubdb"} and s.value == 1.0


def test_the_health_finding() -> None:
    snap = Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=(),
                    protected=(("/dev/sdc", "wear 93 %, limit 90 %; devices switched "
                                            "to writethrough and drained"),))
    (f,) = health.assess(snap)
    assert (f.level, f.code, f.device) == (health.Level.CRITICAL, "protected", "/dev/sdc")
    assert f.next == "cachemgr replace-ssd /dev/sdc"
    assert f.what == ("protected: SSD /dev/sdc failing: wear 93 %, limit 90 %; devices "
                      "switched to writethrough and drained")
    # protect off since: a warning naming the way to undo it, no CRITICAL
    (f,) = health.assess(dataclasses.replace(snap, protect_off=True))
    assert (f.level, f.code, f.next) == (health.Level.WARNING, "protect-off",
                                         "cachemgr protect --clear /dev/sdc")


def test_the_state_file_is_the_state_directory_s(state_dir: Path) -> None:
    empty = {"counts": {}, "marks": {}, "read_at": {}, "off": None, "protected": {},
             "unknown": {}}
    assert protect.load_state() == empty
    assert not state_dir.exists()  # reading never creates it
    state.write_json(state_dir / "protect" / "state.json", {"counts": {"a": 1},
                                                           "protected": "junk"})
    assert protect.load_state() == {**empty, "counts": {"a": 1}}


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
    assert "not protected yet: /dev/bcache0: switched" in out
    # the timer's pass drains it
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and drained == ["/dev/bcache0"] and "done     protect /dev/bcache0" in out


# ------------------------------------------------- baselines and probes (issue #41 item 4)


KEY = "disk:wwn-1"
MARK = {KEY: {"boot": "b1", "seq": 100, "at": 10.0}}  # where the last pass read the log to


def disk(errors: int, logged: tuple[tuple[int, float], ...] = (),
         members: tuple[Member, ...] = (wb(),)) -> Ssd:
    """An SSD with a SCSI error counter and its disk's failed requests in the log."""
    return Ssd("/dev/sdc", "wwn-1", members, {KEY: errors}, None, {KEY: logged})


def klog(last: int = 130, *, first: int = 0, boot: str = "b1", **kw: object) -> protect.Log:
    """The kernel log as a pass read it: records ``first`` to ``last`` held."""
    return protect.Log(boot=boot, first=first, last=last, at=70.0, **kw)  # type: ignore[arg-type]


def test_only_failed_requests_the_kernel_logged_count() -> None:
    # docs/kernel-notes.md, "What smartctl does to ioerr_cnt": smartctl -a on scsi_debug,
    # ioerr_cnt +2, no line in the kernel log: probes, whatever the load
    probed = protect.decide([disk(2)], ON, {KEY: 0}, log=klog(), marks=MARK)
    assert probed.acts == () and probed.triggered == () and probed.unknown == {}
    assert probed.ignored == {KEY: "explained"} and probed.counts == {KEY: 2}
    assert probed.mark == {"boot": "b1", "seq": 130, "at": 70.0}
    # a failed read of the VM's: one error, one "critical medium error, dev sdc" line
    real = protect.decide([disk(3, ((120, 65.0),))], ON, {KEY: 2}, log=klog(), marks=MARK,
                          read_at={KEY: 60.0}, now=120.0)
    assert [a.what for a in real.acts] == ["switch"]
    assert real.triggered[0][1] == ("the disk's ioerr_cnt rose from 2 to 3 between "
                                    "1970-01-01 00:01:00 UTC and 1970-01-01 00:02:00 UTC")
    # a line logged before the window (the last pass counted it): not again
    assert protect.decide([disk(3, ((90, 5.0),))], ON, {KEY: 2}, log=klog(),
                          marks=MARK).acts == ()
    # probes and real errors in one window: only the logged ones count, and it says so
    both = protect.decide([disk(5, ((101, 11.0), (102, 11.0), (103, 11.0)))], ON, {KEY: 0},
                          log=klog(), marks=MARK)
    assert "rose from 0 to 5, 3 of it failed requests the kernel logged (the rest: probe " \
        "commands)" in both.triggered[0][1]
    # never more than the rise: lines of a request retried count once per error
    assert protect.decide([disk(1, ((101, 11.0), (102, 11.0)))], ON, {KEY: 0}, log=klog(),
                          marks=MARK).triggered[0][1].endswith("rose from 0 to 1")
    # a boot since (sequence numbers start again): every record of this boot counts
    boot = protect.decide([disk(3, ((7, 2.0),))], ON, {KEY: 2}, log=klog(40, boot="b2"),
                          marks=MARK)
    assert [a.what for a in boot.acts] == ["switch"]
    # bcache's own count: no probe reaches it, its rise counts as it is
    both_keys = Ssd("/dev/sdc", "wwn-1", (wb(),), {KEY: 2, "bcache:c1": 1}, None, {KEY: ()})
    d = protect.decide([both_keys], ON, {KEY: 0, "bcache:c1": 0}, log=klog(), marks=MARK)
    assert d.triggered[0][1] == "bcache's IO error count on the cache device rose from 0 to 1"


@pytest.mark.parametrize(("log", "marks", "words"), [
    (protect.Log(why_not="the kernel log (/dev/kmsg) not read: Operation not permitted"),
     MARK, "not read: Operation not permitted"),
    (klog(), {}, "no earlier pass read the kernel log"),
    (klog(first=120), MARK, "its ring was overwritten"),
    (klog(lost=True), MARK, "its ring was overwritten"),
    (klog(suppressed=((125, 66.0, 20),)), MARK,
     "the kernel's rate limit dropped 20 failed-request line(s)"),
    # another disk's 10 lines within 5 s: the rate limit's burst, every disk together
    (klog(failed=tuple((101 + i, 60.0 + i / 10) for i in range(10))), MARK,
     "10 failed-request lines within 5 s"),
])
def test_a_rise_the_log_cannot_tell_is_unknown_never_acted_on_never_silent(
        log: protect.Log, marks: dict[str, dict[str, object]], words: str,
        state_dir: Path) -> None:
    d = protect.decide([disk(4)], ON, {KEY: 0}, log=log, marks=marks)
    assert d.acts == () and d.triggered == ()
    assert d.ignored == {KEY: "unknown"}
    (node, said), = d.unknown.values()
    assert node == "/dev/sdc" and words in said, said
    assert "ioerr_cnt rose from 0 to 4" in said and "0 of it failed requests" in said
    # kept until --clear: the health model's UNKNOWN, naming the SSD and the command
    st = protect.next_state({}, d, [disk(4)], {})
    assert protect.next_state(st, protect.decide([disk(4)], ON, {KEY: 4}, log=klog(),
                                                 marks=MARK), [disk(4)], {})["unknown"]
    (ssd, text), = protect.unknown(st)
    snap = Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=(),
                    protect_unknown=((ssd, text),))
    (f,) = health.assess(snap)
    assert (f.level, f.code, f.device) == (health.Level.UNKNOWN, "protect-unknown", "/dev/sdc")
    assert f.next == "cachemgr ssd-health --refresh, then cachemgr protect --clear /dev/sdc"
    assert protect.find(st, "/dev/sdc") == "wwn-1"
    assert protect.forget(st, "wwn-1", [disk(4)])["unknown"] == {}
    # failed requests logged, enough to act on: acted on, whatever the log lost besides
    acted = protect.decide([disk(4, ((121, 66.0),))], ON, {KEY: 0}, log=log, marks=marks)
    if log.why_not is None:
        assert [a.what for a in acted.acts] == ["switch"] and acted.unknown == {}


def test_a_critical_stands_over_an_unknown() -> None:
    snap = Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=(),
                    protected=(("/dev/sdd", "wear 93 %, limit 90 %"),),
                    protect_unknown=(("/dev/sdc", "cannot tell"),))
    found = health.assess(snap)
    assert [f.level for f in found] == [health.Level.CRITICAL, health.Level.UNKNOWN]
    assert health.worst(found) == health.Level.CRITICAL


# the lab's lines (UML 7.2.7, a scsi_debug disk failing reads: docs/kernel-notes.md)
MEDIUM = "critical medium error, dev sda, sector 0 op 0x0:(READ) flags 0x800 phys_seg 16 " \
    "prio class 2"


def test_a_captured_scsi_ssd_s_counter_and_its_kernel_log(
        tmp_path: Path, state_dir: Path) -> None:
    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    dev = root / "devices/pseudo_0/adapter0/host0/target0:0:0/0:0:0:0"
    kmsg = root.parent / "kmsg.txt"
    captured = Path(__file__).parents[1] / "fixtures" / "dmcache-ssd-errors-uml" / "kmsg.txt"
    boot = captured.read_text().splitlines()[:20]
    kmsg.write_text("\n".join(boot) + "\n")  # a boot's first records: no failed request

    def log(*lines: str) -> None:
        n = len(kmsg.read_text().splitlines())
        with kmsg.open("a") as f:
            f.writelines(f"3,{n + i},{(100 + n + i) * 1000000},-;{x}\n"
                         for i, x in enumerate(lines))

    pol = str(_policy(tmp_path))
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and "first seen at 0 errors" in out, out + err
    assert protect.load_state()["marks"]["disk:naa.33333330000007d0"] == {
        "boot": None, "seq": 19, "at": 0.0}
    # what one smartctl -a did in the lab: +2 errors, nothing logged
    (dev / "ioerr_cnt").write_text("0x2\n")
    log("sd 0:0:0:0: [sda] Attached SCSI disk")
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and "none failing" in out and "no failed request of its disk" in out, out
    # +2 more and the rate limit's notice, no line of sda's: cannot tell, says so, acts not
    (dev / "ioerr_cnt").write_text("0x4\n")
    log("blk_print_req_error: 20 callbacks suppressed")
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and "protect: SSD /dev/sda: cannot tell: the disk's ioerr_cnt rose " \
        "from 2 to 4" in out, out
    assert "protect /dev/" not in out and "cannot tell" in err, out + err
    rc, out, err = cli("--sysfs-root", str(root), "check")
    assert rc == 3 and "protect cannot tell: SSD /dev/sda" in out, out + err
    # the next pass, nothing new: still said (kept), nothing done
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and "none failing" in out, out
    rc, out, err = cli("--sysfs-root", str(root), "check")
    assert rc == 3, out
    # the admin looked: --clear forgets it, its count the new baseline
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--clear", "/dev/sda",
                       "--policy", pol)
    assert rc == 0 and "forgot   SSD /dev/sda" in out, out + err
    rc, out, err = cli("--sysfs-root", str(root), "check")
    assert "protect" not in out, out
    # then one failing read: +1 error, one line: acted on
    (dev / "ioerr_cnt").write_text("0x5\n")
    log(MEDIUM)
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--dry-run", "--policy", pol)
    assert "SSD /dev/sda failing: the disk's ioerr_cnt rose from 4 to 5 between" in out, out


def _protected_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                    ) -> tuple[Path, str, list[tuple[str, str]]]:
    from cachemgr.ops import cache as cache_ops

    root = sick(tmp_path)
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr(cache_ops, "drain", lambda sysfs, dev, **kw: None)
    pol = str(_policy(tmp_path))
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and "done     protect /dev/bcache0" in out, out + err
    return root, pol, writes


def _mode(root: Path) -> CacheMode | None:
    return snapshot.take(Sysfs(str(root))).backings[0].mode


def _codes(root: Path) -> list[str]:
    _, js, _ = cli("--sysfs-root", str(root), "check", "--json")
    return [f["code"] for f in json.loads(js)["findings"]]


def test_clear_puts_back_the_admins_writeback_and_forgets_the_ssd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    root, pol, writes = _protected_tree(tmp_path, monkeypatch)
    assert _mode(root) == CacheMode.WRITETHROUGH and "protected" in _codes(root)
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--clear", "/dev/ubdb",
                     "--dry-run", "--policy", pol)
    assert rc == 0 and "dry-run  /dev/bcache0: back to writeback" in out, out
    assert _mode(root) == CacheMode.WRITETHROUGH
    del writes[:]
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--clear", "/dev/ubdb",
                       "--policy", pol)
    assert rc == 0, out + err
    assert "done     /dev/bcache0: back to writeback" in out
    assert "forgot   SSD /dev/ubdb" in out and "are the baseline" in out
    assert [w for w in writes if w[0].endswith("cache_mode")] == [
        (next(w[0] for w in writes if w[0].endswith("cache_mode")), "writeback")]
    assert _mode(root) == CacheMode.WRITEBACK
    st = protect.load_state()
    assert st["protected"] == {} and 3 in st["counts"].values()
    entries = [json.loads(x) for x in (state_dir / "autoattach" / "actions.jsonl")
               .read_text().splitlines()]
    assert [(e["what"], e["result"]) for e in entries[-2:]] == [("clear", "done"),
                                                                 ("forget", "done")]
    assert "protected" not in _codes(root)
    # the next passes: the counts flat since the clear, the admin's writeback stays
    for _ in range(3):
        rc, out, _ = cli("--sysfs-root", str(root), "protect", "--policy", pol)
        assert rc == 0 and "none failing" in out, out
    assert _mode(root) == CacheMode.WRITEBACK
    # nothing recorded any more: already so
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--clear", "/dev/ubdb",
                       "--policy", pol)
    assert rc == 4 and "no SSD recorded as protected" in err, out + err


def test_off_acts_on_nothing_and_the_critical_becomes_a_warning_naming_clear(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    root, pol, writes = _protected_tree(tmp_path, monkeypatch)
    off = str(_policy(tmp_path / "off" if (tmp_path / "off").mkdir() is None else tmp_path,
                      enabled=False))
    # the admin puts writeback back by hand, and turns protect off
    rc, out, err = cli("--sysfs-root", str(root), "mode", "/dev/bcache0", "writeback")
    assert rc == 0, out + err
    del writes[:]
    for _ in range(3):
        rc, out, err = cli("--sysfs-root", str(root), "protect", "--policy", off)
        assert rc == 0 and "protect is off" in out, out + err
        assert "protect --clear /dev/ubdb forgets it" in out
    assert writes == [] and _mode(root) == CacheMode.WRITEBACK
    codes = _codes(root)
    assert "protect-off" in codes and "protected" not in codes
    rc, out, _ = cli("--sysfs-root", str(root), "check")
    line = next(x for x in out.splitlines() if "protected earlier" in x) if \
        "protected earlier" in out else out
    assert "protect is off since" in line and "next: cachemgr protect --clear /dev/ubdb" in out
    assert not nested(out)
    # errors that rise while off: the off passes keep them as the baseline
    (root / CACHE_ERRORS).write_text("9\n")
    assert cli("--sysfs-root", str(root), "protect", "--policy", off)[0] == 0
    assert 9 in protect.load_state()["counts"].values()
    # clear: the device was switched back by hand, left so; the record goes
    rc, out, err = cli("--sysfs-root", str(root), "protect", "--clear", "/dev/ubdb",
                       "--policy", off)
    assert rc == 0 and "left     /dev/bcache0" in out, out + err
    assert "protect-off" not in _codes(root)
    # on again: nothing rose since, nothing done
    rc, out, _ = cli("--sysfs-root", str(root), "protect", "--policy", pol)
    assert rc == 0 and "none failing" in out and writes == [], out
