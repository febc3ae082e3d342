"""The paced drain's controller (cachemgr/core/pace.py): the p99 estimate from block counters,
the pace decisions, the sampler; and the drain's use of them on a fake bcache tree."""

from __future__ import annotations

import math

import pytest

from cachemgr.cli import args as argtypes
from cachemgr.core import pace
from cachemgr.core.errors import UsageError
from cachemgr.core.pace import Counters, LatencyMeter, Pacer, Sampler

# ----------------------------------------------------------------------------- the bound


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf", "1e999", "abc", "", "60001"])
def test_a_bad_bound_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="--max-latency"):
        pace.check_max_latency(bad)
    import argparse
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.milliseconds(bad)


def test_a_good_bound_passes() -> None:
    assert pace.check_max_latency("12.5") == 12.5
    assert argtypes.milliseconds("10") == 10


# ----------------------------------------------------------------------------- the meter


def _feed(m: LatencyMeter, slices: list[tuple[int, int]], t0: float = 0.0,
          step: float = 0.1) -> float:
    """Slices of (IOs, total ms) fed as cumulative counters; the last time."""
    ios = ms = 0
    t = t0
    m.add(t, Counters(ios, ms, 0))
    for n, total in slices:
        t += step
        ios, ms = ios + n, ms + total
        m.add(t, Counters(ios, ms, 0))
    return t


def test_no_io_no_estimate() -> None:
    m = LatencyMeter()
    _feed(m, [(0, 0)] * 5)
    assert m.p99() == (None, 0)


def test_p99_is_the_tail_slice_weighted_by_its_ios() -> None:
    m = LatencyMeter(window=100)
    # 99 slices of one 5 ms IO, then one of a 80 ms IO: 100 IOs, the slowest is the p99
    _feed(m, [(1, 5)] * 99 + [(1, 80)])
    p99, n = m.p99()
    assert n == 100 and p99 == 5  # the 99th of 100 is still a 5 ms one
    m.add(10.1, Counters(101, 99 * 5 + 80 + 80, 0))  # a second slow one: 2 of 101
    assert m.p99() == (80, 101)


def test_p99_weights_busy_slices() -> None:
    m = LatencyMeter(window=100)
    # one slice of 10 IOs at 50 ms mean, ninety of one IO at 4 ms: 10 % of the IOs are slow
    _feed(m, [(1, 4)] * 90 + [(10, 500)])
    assert m.p99() == (50.0, 100)


def test_only_slices_after_since_and_within_the_window_count() -> None:
    m = LatencyMeter(window=1.0)
    t = _feed(m, [(1, 90)] * 5 + [(1, 3)] * 20)  # 2.5 s: the slow ones are out of the window
    assert m.p99()[0] == 3
    m2 = LatencyMeter(window=100)
    _feed(m2, [(1, 90)] * 5 + [(1, 3)] * 5)
    assert m2.p99(since=0.55)[0] == 3 and m2.p99()[0] == 90
    assert t == pytest.approx(2.5)


def test_counters_going_back_start_again() -> None:
    m = LatencyMeter(window=100)
    t = _feed(m, [(1, 50)] * 3)
    m.add(t + 0.1, Counters(0, 0, 0))  # the device was made again
    assert m.p99() == (None, 0)


# ----------------------------------------------------------------------------- the pacer


def _decide(p: Pacer, t: float, p99: float | None, ios: int = 20,
            rate: float | None = 4000.0) -> pace.Decision:
    return p.decide(t, p99, ios, rate)


def test_it_starts_paced_and_slow() -> None:
    p = Pacer(10, start=256)
    assert p.pace == 256 and p.note.startswith("paced: starting slow")
    assert Pacer(10, start=8, floor=64).pace == 64


def test_over_the_bound_halves_the_pace() -> None:
    p = Pacer(10, period=2, start=2000)
    assert _decide(p, 0, 30).changed is False  # the first call only starts the clock
    d = _decide(p, 2, 30, rate=2000)
    assert d.changed and d.pace == 1000 and p.lowered == 1
    assert d.note == "paced: other IO p99 30 ms > 10 ms"
    d = _decide(p, 4, 25, rate=1000)
    assert d.pace == 500 and p.lowered == 2


def test_the_last_slow_down_is_kept_for_the_progress_line() -> None:
    """The progress line comes less often than the decisions: "holding" after a slow-down
    still says that it slowed and why."""
    p = Pacer(10, period=1, start=2000)
    assert p.slowed_words() == ""
    _decide(p, 0, 30)
    _decide(p, 1, 30, rate=2000)
    assert p.slowed_words() == "slowed once, last for other IO p99 30 ms > 10 ms"
    d = _decide(p, 2, 8)
    assert "holding" in d.note
    _decide(p, 3, 22, rate=1000)
    _decide(p, 4, 3, rate=500)  # speeding up again: the slow-downs stay told
    assert p.slowed_words() == "slowed 2 times, last for other IO p99 22 ms > 10 ms"


def test_over_the_bound_halves_what_the_disk_gave_when_less_than_the_pace() -> None:
    p = Pacer(10, period=1, start=4000)
    _decide(p, 0, 30)
    assert _decide(p, 1, 30, rate=1000).pace == 500


def test_it_waits_a_period_between_decisions() -> None:
    p = Pacer(10, period=2, start=2000)
    _decide(p, 0, 30)
    assert _decide(p, 1.9, 30).changed is False
    assert _decide(p, 2.0, 30).changed is True
    assert _decide(p, 3.0, 30).changed is False


def test_never_below_the_floor() -> None:
    p = Pacer(10, period=1, floor=64)
    _decide(p, 0, 50)
    for t in range(1, 20):
        d = _decide(p, t, 50)
    assert d.pace == 64


def test_over_the_bound_at_the_floor_says_the_bound_is_not_held() -> None:
    """At its slowest pace the drain cannot spare the VMs more: said, counted, not hidden
    as another slow-down (lab: a FIFO 20 ms disk at 32 KiB/s, docs/benchmarks.md)."""
    p = Pacer(10, period=1, floor=64, start=128)
    _decide(p, 0, 50)
    d = _decide(p, 1, 50, rate=None)
    assert d.pace == 64 and p.over_at_floor == 0 and d.note.startswith("paced: other IO")
    d = _decide(p, 2, 50, rate=None)
    assert d.pace == 64 and p.over_at_floor == 1
    assert d.note == ("paced at its slowest: other IO p99 50 ms > 10 ms, not held (the disk "
                      "cannot serve the slowest drain beside this IO)")
    from cachemgr.procedures.kinds.base import pacing_words
    assert pacing_words({"max_latency_ms": 10.0, "lowered": 2, "over_at_floor": 1,
                         "slowest_sectors_per_s": 64}) == (
        "paced under p99 10 ms of the other IO: slowed down 2 times; slowest pace 32 KiB/s; "
        "over the bound 1 time at the slowest pace: not held")
    assert "not held" not in pacing_words({"max_latency_ms": 10.0, "lowered": 1,
                                           "over_at_floor": 0})


def test_under_half_the_bound_speeds_up() -> None:
    p = Pacer(10, period=1, start=256)
    _decide(p, 0, 3)
    d = _decide(p, 1, 3, rate=250)
    assert d.pace == 385 and d.changed and "speeding up" in d.note
    assert _decide(p, 2, 3, rate=380).pace == 578


def test_unpaced_when_the_drain_does_not_take_its_pace() -> None:
    p = Pacer(10, period=1, start=4000)
    _decide(p, 0, 3)
    d = _decide(p, 1, 3, rate=1500)  # asked for 4000, the drain wrote 1500
    assert d.pace is None and d.changed and "the drain wrote under its pace" in d.note
    d = _decide(p, 2, 3)
    assert d.pace is None and not d.changed  # unpaced and fine: it stays so
    d = _decide(p, 3, 40, rate=1500)  # then the VMs suffer: half of what it drained
    assert d.pace == 750 and p.lowered == 1


def test_once_unpacing_hurt_the_vms_it_holds_the_pace() -> None:
    """A FIFO disk queue (scheduler none) serves bcache's unpaced writeback in front of the
    VMs' reads: once going unpaced made their p99 go over the bound, a drain short of its
    pace holds it (lab, docs/benchmarks.md)."""
    p = Pacer(10, period=1, start=4000)
    _decide(p, 0, 3)
    assert _decide(p, 1, 3, rate=1500).pace is None
    assert _decide(p, 2, 40, rate=1500).pace == 750
    d = _decide(p, 3, 3, rate=100)  # short of its pace again
    assert d.pace == 750 and not d.changed
    assert "unpaced, it made the other IO slower" in d.note and "holding" in d.note
    assert _decide(p, 4, 3, rate=700).pace == 1126  # it still speeds up when it takes it


def test_unpaced_for_no_other_io_then_slow_is_not_held_against_unpacing() -> None:
    p = Pacer(10, period=1, start=4000)
    _decide(p, 0, None, ios=0)
    assert _decide(p, 1, None, ios=0).pace is None  # no VM: unpaced
    assert _decide(p, 2, 40, rate=1500).pace == 750  # a VM came, it slowed down
    assert _decide(p, 3, 3, rate=100).pace is None  # short of its pace: unpaced, once


def test_between_half_and_the_bound_it_holds() -> None:
    p = Pacer(10, period=1, start=256)
    _decide(p, 0, 8)
    d = _decide(p, 1, 8)
    assert d.pace == 256 and not d.changed and "holding" in d.note


def test_too_few_ios_hold_and_none_at_all_unpaces() -> None:
    p = Pacer(10, period=1, start=2000)
    _decide(p, 0, 20)
    d = _decide(p, 1, 50, ios=2)  # two IOs: too few to judge, even slow ones
    assert d.pace == 2000 and "too little other IO" in d.note
    d = _decide(p, 2, None, ios=0)
    assert d.pace is None and d.note == "unpaced: no other IO for 1 s"


def test_unpaced_without_a_rate_starts_from_four_floors() -> None:
    p = Pacer(10, period=1, floor=64)
    _decide(p, 0, None, ios=0)
    assert _decide(p, 1, None, ios=0).pace is None
    assert _decide(p, 2, 20, rate=None).pace == 128


def test_pace_words() -> None:
    assert pace.pace_words(None) == "unpaced"
    assert pace.pace_words(512) == "writeback 256 KiB/s"


def test_a_pace_in_other_units_stops_at_its_ceiling() -> None:
    """A share of time (dm-cache's copy throttle, percent): no drain rate to compare, the
    ceiling is "unpaced", and over the bound from unpaced it halves the ceiling."""
    p = Pacer(10, period=1, floor=1, start=5, ceiling=100, fmt=lambda x: f"{x}%")
    _decide(p, 0, None, ios=0)
    assert _decide(p, 1, 30, rate=None).pace == 2
    assert "paced at 2%" in _decide(p, 2, 7, rate=None).note  # holding, in its own words
    for t in range(3, 20):
        _decide(p, t, 2, rate=None)
    assert p.pace is None and p.note.startswith("unpaced")
    assert _decide(p, 20, 30, rate=None).pace == 50


# ----------------------------------------------------------------------------- the sampler


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_sampler_reads_every_slice_and_knows_the_drains_writes() -> None:
    clock = Clock()
    vm_ios = [0]

    def vm() -> Counters:
        vm_ios[0] += 1  # one 5 ms IO per reading, 8 sectors written by the VM
        return Counters(vm_ios[0], 5 * vm_ios[0], 8 * vm_ios[0])

    def backing() -> int:
        # the backing device: the VM's writes plus the drain's 100 sectors per 0.1 s
        return 8 * vm_ios[0] + round(clock.t * 1000)

    m = LatencyMeter(window=100)
    s = Sampler(vm, backing, m, clock=clock, sleep=clock.sleep)
    s.sleep(1.0)
    assert 10 <= len(m.slices) <= 11  # one reading per SLICE
    assert m.p99() == (5.0, len(m.slices))
    rate = s.drain_rate()
    assert rate is not None and math.isclose(rate, 1000, rel_tol=0.01)


def test_sampler_without_counters_measures_nothing() -> None:
    clock = Clock()
    m = LatencyMeter()
    s = Sampler(lambda: None, lambda: None, m, clock=clock, sleep=clock.sleep)
    s.sleep(0.5)
    assert m.p99() == (None, 0) and s.drain_rate() is None


# ----------------------------------------------------------------------------- the drain


def test_a_paced_drain_journals_and_puts_back_the_rate_floor(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """On a lab capture whose dirty data never goes down (the drain stalls): the paced drain
    saved writeback_rate_minimum with the other tunables before changing anything, and every
    one is back afterwards. The pacer is made to slow down at once (a period of 0 and slow
    IO on the bcache device's counters), so the floor really was changed."""
    from cachemgr.backends import bcache, snapshot
    from cachemgr.core import state
    from cachemgr.core.errors import StallError
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import drain
    from tests.unit.tui_helpers import copy_capture, kernel_writes

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    kernel_writes(monkeypatch)
    b = snapshot.take(sysfs).backings[0]
    rel = f"block/{b.identity.name}/bcache"
    names = ("writeback_percent", "writeback_delay", "writeback_running",
             "writeback_rate_minimum")
    before = {n: sysfs.read(f"{rel}/{n}") for n in names}
    stat = f"block/{b.device_name}/stat"
    n = [0]

    def slow_io(self: Sysfs, path: str) -> str | None:  # 4 IOs of 50 ms per reading
        if path == stat:
            n[0] += 4
            return f"{n[0]} 0 {8 * n[0]} {50 * n[0]} 0 0 0 0 0 0 0"
        return real_read_opt(self, path)

    real_read_opt = Sysfs.read_opt
    monkeypatch.setattr(Sysfs, "read_opt", slow_io)
    monkeypatch.setattr(pace.Pacer, "__init__", _quick_pacer(pace.Pacer.__init__))
    journaled: list[dict[str, int]] = []
    real_set = bcache.set_tunable
    floors: list[int] = []

    def set_tunable(s: Sysfs, bk, name: str, value: int):  # type: ignore[no-untyped-def]
        if not journaled:
            saved = state.read_json(state.journal_path("drain", bk.uuid or bk.identity.name))
            journaled.append(saved["original"] if saved else {})
        if name == "writeback_rate_minimum":
            floors.append(value)
        return real_set(s, bk, name, value)

    monkeypatch.setattr(bcache, "set_tunable", set_tunable)
    with pytest.raises(StallError):
        drain.drain(sysfs, b, stall_timeout=1.5, interval=0.05, confirm=0.1,
                    max_latency_ms=10)
    assert set(journaled[0]) == set(names)  # saved before the first write
    assert floors and floors[0] != int(before["writeback_rate_minimum"])  # it was paced
    assert {k: sysfs.read(f"{rel}/{k}") for k in names} == before  # and all put back
    assert not list((tmp_path / "state").rglob("*.json"))


def _quick_pacer(init):  # type: ignore[no-untyped-def]
    def quick(self, bound_ms, **kw):  # type: ignore[no-untyped-def]
        init(self, bound_ms, **{**kw, "period": 0.0})
    return quick


def test_a_lull_while_unpaced_does_not_forget_why_it_was_unpaced() -> None:
    """Unpaced because the drain wrote under its pace, then 2 s without other IO, then the
    VMs back and over the bound: that unpacing hurt them, and is not done again."""
    p = Pacer(10, period=1, start=4000)
    _decide(p, 0, 3)
    assert _decide(p, 1, 3, rate=1500).pace is None  # short of its pace: unpaced
    assert _decide(p, 2, None, ios=0).pace is None  # a lull: still unpaced
    assert _decide(p, 3, 40, rate=1500).pace == 750 and p.unpacing_hurt
    d = _decide(p, 4, 3, rate=100)
    assert d.pace == 750 and "holding" in d.note

