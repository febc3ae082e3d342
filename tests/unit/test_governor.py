"""The writeback governor: its decisions (procedures/governor.py ``Governor``, pure), the
policy's ``[writeback]`` table, and a run on a copy of a lab capture (ops/governor.py):
every setting journaled before it changes, put back at the end, and after a kill by the
next start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import undo
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import governor as gov_ops
from cachemgr.procedures import governor as gov
from cachemgr.procedures import policy
from tests.unit.tui_helpers import copy_capture, kernel_writes

M = 1 << 20


def run_ticks(g: gov.Governor, ticks: list[tuple[float | None, int, int | None]],
              t0: float = 0.0) -> list[gov.Tick]:
    """One decision every PERIOD for each (p99, ios, dirty)."""
    out = []
    for i, (p99, ios, dirty) in enumerate(ticks):
        out.append(g.decide(t0 + (i + 1) * gov.PERIOD, p99, ios, None, dirty))
    return out


def test_idle_disk_writes_back_unpaced() -> None:
    g = gov.Governor(gov.Bounds(read_p99_ms=20), 0.0)
    t = run_ticks(g, [(None, 0, 8 * M)])[-1]
    assert t.pace is None and "no other IO" in t.note and not t.gave_up


def test_reads_over_the_bound_slow_it_down_under_half_speed_it_up() -> None:
    g = gov.Governor(gov.Bounds(read_p99_ms=20), 0.0)
    first = g.pace
    assert first is not None
    slow = run_ticks(g, [(30.0, 50, 8 * M)])[-1]
    assert slow.pace is not None and slow.pace < first and not slow.gave_up
    fast = run_ticks(g, [(5.0, 50, 8 * M)], t0=gov.PERIOD)[-1]
    assert fast.pace is not None and fast.pace > slow.pace


def test_dirty_near_its_ceiling_goes_unpaced_and_gives_up_the_read_bound() -> None:
    g = gov.Governor(gov.Bounds(read_p99_ms=20, max_dirty=100 * M), 0.0)
    t = run_ticks(g, [(30.0, 50, 85 * M)])[-1]
    assert t.pace is None and "near its ceiling" in t.note
    assert set(t.gave_up) == {"read_p99"} and "ceiling" in t.gave_up["read_p99"]
    # still pressed at 60 % (hysteresis), released at 50 %
    t = run_ticks(g, [(5.0, 50, 60 * M)], t0=gov.PERIOD)[-1]
    assert t.pace is None and t.pressed
    t = run_ticks(g, [(5.0, 50, 50 * M)], t0=2 * gov.PERIOD)[-1]
    assert not t.pressed and t.pace is not None


def test_dirty_over_its_ceiling_unpaced_is_said() -> None:
    g = gov.Governor(gov.Bounds(max_dirty=100 * M), 0.0)
    ts = run_ticks(g, [(None, 0, 120 * M), (None, 0, 130 * M)])
    assert "writing back unpaced from now" in ts[0].gave_up["max_dirty"] or ts[0].pace is None
    assert "faster than the disk writes back" in ts[1].gave_up["max_dirty"]


def test_age_unknown_until_dirty_reads_zero_then_counted_from_it() -> None:
    g = gov.Governor(gov.Bounds(read_p99_ms=20, max_age_s=60), 0.0)
    t = run_ticks(g, [(5.0, 50, 4 * M)])[-1]
    assert t.age_s is None and t.pace is None and "unknown" in t.note
    t = g.decide(4.0, 5.0, 50, None, 0)  # clean: the age starts here
    assert t.age_s == 0 and not t.pressed
    t = g.decide(30.0, 5.0, 50, None, 4 * M)
    assert t.age_s == 26 and not t.pressed
    t = g.decide(54.0, 5.0, 50, None, 4 * M)  # 50 s >= 0.8 x 60
    assert t.pace is None and "oldest dirty data 50 s near its ceiling" in t.note
    t = g.decide(70.0, 5.0, 50, None, 4 * M)
    assert "max_age_s" in t.gave_up and "66 s > 60 s" in t.gave_up["max_age_s"]


def test_the_read_bound_given_up_at_the_slowest_pace() -> None:
    g = gov.Governor(gov.Bounds(read_p99_ms=20), 0.0)
    ts = run_ticks(g, [(50.0, 50, 8 * M)] * 8)
    assert g.pace == g.pacer.floor if g.pacer else False
    assert "read_p99" in ts[-1].gave_up and "slowest" in ts[-1].gave_up["read_p99"]


POLICY = """version = 1
[writeback]
enabled = true
read_p99_ms = 20
max_dirty = "256M"
max_age_s = 600
"""


def test_policy_table_reads_back_and_refuses_bad_values() -> None:
    p = policy.parse(POLICY)
    assert p.writeback == policy.WritebackPolicy(True, 20.0, 256 * M, 600.0)
    assert policy.parse(policy.dumps(p)).writeback == p.writeback
    assert policy.parse("version = 1\n").writeback.enabled is False
    for bad, word in (("read_p99_ms = 0", "read_p99_ms"), ("max_dirty = \"2k\"", "at least 1M"),
                      ("max_age_s = true", "max_age_s"), ("speed = 3", "unknown key"),
                      ("enabled = 1", "enabled")):
        with pytest.raises(policy.PolicyError, match=word):
            policy.parse(f"version = 1\n[writeback]\n{bad}\n")
    with pytest.raises(policy.PolicyError, match="at least one of"):
        policy.parse("version = 1\n[writeback]\nenabled = true\n")


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sysfs, str, str]:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    kernel_writes(monkeypatch)
    b = snapshot.take(sysfs).backings[0]
    pol = tmp_path / "policy.toml"
    pol.write_text(POLICY)
    os.chmod(pol, 0o600)
    return sysfs, f"block/{b.identity.name}/bcache", str(pol)


def knobs(sysfs: Sysfs, rel: str) -> dict[str, str]:
    return {k: sysfs.read(f"{rel}/{k}").strip() for k in
            ("writeback_percent", "writeback_delay", "writeback_running",
             "writeback_rate_minimum")}


@pytest.mark.skipif(os.geteuid() != 0, reason="the governor changes settings as root only")
def test_run_journals_first_and_puts_everything_back(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, rel, pol = setup(tmp_path, monkeypatch)
    before = knobs(sysfs, rel)
    seen: list[dict[str, str]] = []
    journals: list[list[str]] = []
    real = gov.Device.tick

    def tick(self: gov.Device, s: Sysfs, now: float) -> gov.Tick:
        t = real(self, s, now)
        seen.append(knobs(sysfs, rel))
        journals.append([p for _, p, _ in self.knobs.journal.entries])
        return t

    monkeypatch.setattr(gov.Device, "tick", tick)
    res = gov_ops.run(sysfs, pol, ticks=2, period=0.05)
    # unpaced (the capture's dirty data has no known age), delay 1, and each journaled
    assert seen[0]["writeback_percent"] == "0" and seen[0]["writeback_delay"] == "1"
    assert f"{rel}/writeback_percent" in journals[0] and f"{rel}/writeback_delay" in journals[0]
    assert knobs(sysfs, rel) == before
    assert res.data is not None and res.data["put_back"]
    assert not undo.journals()
    st = gov.load_state()
    assert st is not None and st["running"] is False and st["devices"][0]["dirty_bytes"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the governor changes settings as root only")
def test_a_killed_governors_settings_are_put_back_by_its_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, rel, pol = setup(tmp_path, monkeypatch)
    before = knobs(sysfs, rel)

    def killed(*a: object, **k: object) -> str:  # SIGKILL: no finally runs
        raise SystemExit("killed")

    monkeypatch.setattr(gov_ops, "_loop", killed)
    monkeypatch.setattr(gov_ops, "_put_back", lambda j: [])  # what SIGKILL skips
    with pytest.raises(SystemExit):
        gov_ops.run(sysfs, pol, ticks=1, period=0.05)
    assert knobs(sysfs, rel)["writeback_delay"] == "1"
    assert [j.procedure for j in undo.journals()] == ["governor"]
    monkeypatch.undo()
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    kernel_writes(monkeypatch)
    res = gov_ops.run(sysfs, pol, once=True, period=0.05)
    assert knobs(sysfs, rel) == before
    assert not undo.journals()
    assert res.data is not None


def claim(dev: str) -> None:
    """What a protect pass that found ``dev``'s cache SSD failing writes (its switch refused
    by the governor's lock: procedures/protect.py next_state)."""
    from cachemgr.core import state
    state.write_json(state.state_dir() / "protect" / "state.json", {
        "counts": {}, "protected": {"sdb": {"ssd": "/dev/sdb", "since": 1.0, "last": 1.0,
                                            "why": "3 IO errors", "devices": {dev: "skipped"},
                                            "modes": {}}}})
    assert dev in gov.claimed_by_protect()


@pytest.mark.skipif(os.geteuid() != 0, reason="the governor changes settings as root only")
def test_it_steps_aside_for_the_protect_pass(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A governed device whose SSD a protect pass records as failing: at the next tick every
    setting is put back and the gate left (no undo journal, its locks free), and it is not
    governed again while the record stands; so the protect pass's next switch gets through."""
    sysfs, rel, pol = setup(tmp_path, monkeypatch)
    dev = snapshot.take(sysfs).backings[0].device
    assert dev is not None
    before = knobs(sysfs, rel)
    seen: list[dict[str, str]] = []
    real = gov.Device.tick

    def tick(self: gov.Device, s: Sysfs, now: float) -> gov.Tick:
        t = real(self, s, now)
        seen.append(knobs(sysfs, rel))
        if len(seen) == 1:
            claim(dev)
        return t

    monkeypatch.setattr(gov.Device, "tick", tick)
    res = gov_ops.run(sysfs, pol, ticks=5, period=0.05)
    assert len(seen) == 1 and seen[0]["writeback_delay"] == "1"  # it governed, once
    assert knobs(sysfs, rel) == before
    assert not undo.journals()
    assert res.data is not None and res.data["devices"] == []
    assert any(f"{dev}: not governed: its cache SSD /dev/sdb is failing" in line
               for line in res.lines), res.lines
    # a start while the record stands governs nothing of it (still in writeback)
    seen.clear()
    res = gov_ops.run(sysfs, pol, ticks=2, period=0.05)
    assert seen == [] and knobs(sysfs, rel) == before and not undo.journals()
    assert "nothing to govern" in res.lines[-1]
    # the protect pass's switch passes the gate (the governor holds nothing)
    from cachemgr.ops import cache as cache_ops
    cache_ops.mode(sysfs, dev, "writethrough")
    assert sysfs.read(f"{rel}/cache_mode").split("[")[1].startswith("writethrough")


def test_off_by_default_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    res = gov_ops.run(sysfs, str(tmp_path / "none.toml"))
    assert res.exit_code == 0 and "off (no policy file)" in res.lines[0]
    pol = tmp_path / "p.toml"
    pol.write_text("version = 1\n[writeback]\nread_p99_ms = 20\n")
    os.chmod(pol, 0o600)
    res = gov_ops.run(sysfs, str(pol))
    assert "not enabled" in res.lines[0]


def test_a_bound_given_up_is_a_warning_in_check_while_the_governor_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import time

    from cachemgr.core import state
    from cachemgr.ops import health as health_ops

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    why = "read p99 31 ms > 20 ms while writing back unpaced for the ceiling (dirty ...)"
    doc = {"schema": 1, "running": True, "updated": time.time(), "bounds": {},
           "devices": [{"device": "/dev/bcache0", "gave_up": {"read_p99": why}}]}
    path = state.state_dir() / "governor" / "state.json"
    state.write_json(path, doc)
    res = health_ops.check(sysfs)
    assert res.data is not None
    found = [f for f in res.data["findings"] if f["code"] == "governor-gave-up"]
    assert found and found[0]["level"] == "WARNING" and why in found[0]["what"], res.data
    assert int(res.value) >= 1
    # stopped, or not written for over a minute: nothing said
    for stale in ({**doc, "running": False}, {**doc, "updated": time.time() - 120}):
        state.write_json(path, stale)
        data = health_ops.check(sysfs).data
        assert data is not None
        assert not [f for f in data["findings"] if f["code"] == "governor-gave-up"]
    assert json.loads(path.read_text())["devices"]


def test_a_clean_reading_between_ticks_starts_the_age() -> None:
    """Dirty data read 0 between two decisions (Device.watch, every pace.SLICE): the age is
    known from then, though every tick itself reads some dirty data."""
    g = gov.Governor(gov.Bounds(max_age_s=60), 0.0)
    assert g.decide(2.0, None, 0, None, 4 * M).age_s is None
    g.saw_clean(3.5)
    t = g.decide(4.0, None, 0, None, 4 * M)
    assert t.age_s == 0.5 and not t.pressed


def test_a_command_refused_while_the_governor_runs_says_how_to_stop_it() -> None:
    from cachemgr.core import state

    e = state.BusyError("/dev/bcache0", {"procedure": "governor", "pid": 42})
    assert "held by governor" in e.message and e.hint is not None
    assert "systemctl stop cachemgr-governor.service" in e.hint
    d = state.BusyError("/dev/bcache0", {"procedure": "drain", "pid": 42})
    assert d.hint is not None and d.hint.startswith("wait for it to finish")


def test_metrics_from_the_state_file_while_it_runs() -> None:
    import time

    now = time.time()
    st = {"schema": 1, "running": True, "updated": now - 5, "bounds": {},
          "devices": [{"device": "/dev/bcache0", "pace_sectors_per_s": 128,
                       "read_p99_ms": 12.0, "oldest_dirty_s": 33.0,
                       "gave_up": {"max_dirty": "dirty 9 MiB > 8 MiB"}},
                      {"device": "/dev/bcache1", "pace_sectors_per_s": None,
                       "read_p99_ms": None, "oldest_dirty_s": None, "gave_up": {}}]}
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in gov.metrics(st, now) for s in fam.samples}
    assert got[("cachemgr_governor_running", ())] == 1.0
    assert got[("cachemgr_governor_pace_bytes_per_second", (("path", "/dev/bcache0"),))] \
        == 128 * 512
    assert got[("cachemgr_governor_pace_bytes_per_second", (("path", "/dev/bcache1"),))] == 0
    assert got[("cachemgr_governor_read_p99_seconds", (("path", "/dev/bcache0"),))] == 0.012
    assert got[("cachemgr_governor_oldest_dirty_seconds", (("path", "/dev/bcache0"),))] == 33
    assert ("cachemgr_governor_oldest_dirty_seconds", (("path", "/dev/bcache1"),)) not in got
    assert got[("cachemgr_governor_gave_up", (("bound", "max_dirty"),
                                              ("path", "/dev/bcache0")))] == 1
    # stopped, or not written for over a minute (killed): not running, no figures
    for old in ({**st, "running": False}, {**st, "updated": now - 120}, None):
        fams = gov.metrics(old, now)  # type: ignore[arg-type]
        assert [(f.name, [s.value for s in f.samples]) for f in fams] == [
            ("cachemgr_governor_running", [0.0])]
