"""The one "wait until clean" loop (drainloop.wait_clean) on a fake device and a fake clock:
clean read twice ``confirm`` apart, stall after no new minimum, timeout, progress fields, the
EWMA and mean rates; and bcache.detach reporting the same progress type."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import drainloop
from cachemgr.core.errors import StallError, TimeoutExpired
from cachemgr.core.model import CacheMode, CacheState, DrainProgress, Size
from cachemgr.core.sysfs import Sysfs


class Fake:
    """A device whose dirty bytes follow ``values`` (the last one repeats), one per reading,
    and a clock that only moves when the loop sleeps."""

    def __init__(self, values: list[int | None]) -> None:
        self.values = values
        self.now = 100.0
        self.reads = 0
        self.seen: list[DrainProgress] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def sample(self) -> drainloop.Sample[int | None]:
        v = self.values[min(self.reads, len(self.values) - 1)]
        self.reads += 1
        st = CacheState.CLEAN if v == 0 else CacheState.DIRTY
        return drainloop.Sample(v, v, st, v == 0, None if v is None else v // 512)

    def run(self, **kw: Any) -> drainloop.LoopResult:
        args: dict[str, Any] = dict(
            action="drain", device="/dev/x", timeout=100.0, stall_timeout=10.0, confirm=2.0,
            interval=1.0, progress=self.seen.append,
            stall_error=lambda raw, progressed: StallError(f"stalled at {raw} {progressed}"),
            timeout_error=lambda raw: TimeoutExpired(f"timeout at {raw}"),
            clock=self.clock, sleep=self.sleep)
        args.update(kw)
        return drainloop.wait_clean(self.sample, **args)


def test_clean_must_read_twice_confirm_apart() -> None:
    f = Fake([3000, 1000, 0, 0, 0, 0])
    r = f.run()
    # 0 first at t=2; still 0 at t=3 (1 s: not yet), t=4 (2 s: confirmed)
    assert f.reads == 5 and r.elapsed_s == 4.0 and r.zero_s == 2.0 and r.start_bytes == 3000


def test_a_dirty_reading_between_restarts_the_confirmation() -> None:
    f = Fake([1000, 0, 512, 0, 0, 0, 0])
    r = f.run()
    assert f.reads == 6 and r.elapsed_s == 5.0
    assert r.zero_s == 1.0  # the first zero, even though dirt came back


def test_stall_after_no_new_minimum() -> None:
    # goes down to 500 at t=2, then up and down above it: no new minimum after t=2
    f = Fake([1000, 800, 500, 900, 600, 700])
    with pytest.raises(StallError, match="stalled at 700 True"):
        f.run(stall_timeout=5.0)
    assert f.now == 100.0 + 8  # 8 - 2 > 5: raised at the reading at t=8


def test_stall_without_any_progress_says_so() -> None:
    f = Fake([1000])
    with pytest.raises(StallError, match="stalled at 1000 False"):
        f.run(stall_timeout=3.0)
    assert f.now == 104.0


def test_moving_holds_the_stall_off_while_the_count_stands_still() -> None:
    """A paced dm-cache drain: kcopyd ends its copies in batches, the count stands still
    while the writes go on; the stall clock starts when they stop."""
    f = Fake([1000])
    with pytest.raises(StallError, match="stalled at 1000 False"):
        f.run(stall_timeout=3.0, moving=lambda: f.now < 110)
    assert f.now == 113.0  # "moving" last at 109: more than 3 s later


def test_first_reading_counts_as_the_start_and_first_minimum() -> None:
    f = Fake([1000])
    first = drainloop.Sample(1000, 1000, CacheState.DIRTY, False)
    with pytest.raises(StallError, match="False"):
        f.run(stall_timeout=3.0, first=first)
    # a lower reading after t0 is progress
    f = Fake([1000, 900])
    with pytest.raises(StallError, match="True"):
        f.run(stall_timeout=3.0, first=first)
    assert f.seen[0].start_bytes == 1000


def test_timeout() -> None:
    f = Fake(list(range(10_000, 0, -1)))  # always progressing, never clean
    with pytest.raises(TimeoutExpired, match="timeout at 9994"):
        f.run(timeout=5.5)


def test_check_hook_runs_after_the_clean_test() -> None:
    def check(raw: int | None) -> None:
        if raw == 700:
            raise StallError("io errors")

    f = Fake([1000, 700])
    with pytest.raises(StallError, match="io errors"):
        f.run(check=check)
    assert len(f.seen) == 2  # the reading was reported first


def test_unknown_dirty_is_none() -> None:
    f = Fake([None, None, 1000, 0, 0, 0])
    r = f.run(stall_timeout=1.5)
    assert f.seen[0].dirty_bytes is None and f.seen[0].fraction is None
    assert r.start_bytes is None  # the first reading's, unknown


def test_progress_fields_and_ewma_rate() -> None:
    f = Fake([4000, 3000, 1000, 1000, 0, 0, 0])
    f.run(action="drain", t0=99.0)
    p = f.seen
    assert [x.dirty_bytes for x in p] == [4000, 3000, 1000, 1000, 0, 0, 0]
    assert all(x.action == "drain" and x.device == "/dev/x" and x.start_bytes == 4000 for x in p)
    assert [x.elapsed_s for x in p] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert p[0].rate_bps is None and p[0].eta_s is None
    assert p[1].rate_bps == 1000.0 and p[1].eta_s == 3.0
    assert p[2].rate_bps == pytest.approx(0.7 * 1000 + 0.3 * 2000)
    assert p[3].rate_bps == pytest.approx(0.7 * 1300)
    assert p[2].fraction == 0.75 and p[2].state == CacheState.DIRTY
    assert p[4].state == CacheState.CLEAN and p[4].dirty_blocks == 0 and p[4].eta_s == 0


def test_mean_rate_since_t0() -> None:
    f = Fake([4000, 4000, 2000, 2000, 0, 0, 0])
    f.run(action="flush", rate="mean", t0=98.0)  # t0 two seconds before the loop
    p = f.seen
    assert p[0].rate_bps is None and p[1].rate_bps is None  # nothing written yet
    assert p[2].rate_bps == pytest.approx(2000 / 4) and p[2].eta_s == pytest.approx(4.0)
    assert p[3].rate_bps == pytest.approx(2000 / 5)
    assert p[4].rate_bps == pytest.approx(4000 / 6) and p[4].action == "flush"


def test_meter_alone() -> None:
    m = drainloop.Meter("detach", "/dev/bcache0", 10.0)
    assert m.update(11.0, 2048, CacheState.DIRTY).start_bytes == 2048
    p = m.update(12.0, 1024, CacheState.DIRTY)
    assert p.rate_bps == 1024.0 and p.eta_s == 1.0 and p.fraction == 0.5
    m = drainloop.Meter("drain", "/dev/bcache0", 10.0)
    m.set_start(None)
    assert m.update(11.0, 1024, CacheState.DIRTY).start_bytes is None


ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "scsi-ssd-in-use-uml" / "sys"


def test_detach_reports_drain_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    b0 = snapshot.take(Sysfs(ROOT)).backings[0]
    assert b0.cset_uuid is not None
    dirty = [dataclasses.replace(b0, state=CacheState.DIRTY, dirty=Size.exact(n))
             for n in (8192, 4096)]
    # the cache set's link gone first: dirty_data reads 0 but the dirt is unknown
    gone = dataclasses.replace(b0, state=CacheState.DIRTY, cset_uuid=None, dirty=Size.exact(0))
    done = dataclasses.replace(b0, state=CacheState.NO_CACHE, cset_uuid=None,
                               dirty=Size.exact(0))
    seq = [*dirty, gone, done]
    writes: list[tuple[str, str]] = []

    class FakeSysfs:
        def write(self, rel: str, value: str) -> None:
            writes.append((rel, value))

    monkeypatch.setattr(bcache, "backing_rel", lambda sysfs, name: "block/sdx/bcache")
    monkeypatch.setattr(bcache, "reread", lambda sysfs, name: seq.pop(0))
    seen: list[DrainProgress] = []
    ch = bcache.detach(FakeSysfs(), b0, progress=seen.append, interval=0.0)  # type: ignore[arg-type]
    assert writes == [("block/sdx/bcache/detach", "1")] and ch.what == "detach"
    assert [p.action for p in seen] == ["detach"] * 3
    assert [p.device for p in seen] == [b0.device] * 3
    assert [p.dirty_bytes for p in seen] == [8192, 4096, None]
    assert seen[0].start_bytes == 8192 and seen[1].fraction == 0.5


def test_detach_waits_for_the_link_to_the_set_to_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state reads "no cache" before the detach is finished (the writeback thread
    writes the superblock first, the links go later): detach returns once the cache link is
    gone too, so an unregister after it finds no backing device attached."""
    b0 = snapshot.take(Sysfs(ROOT)).backings[0]
    early = dataclasses.replace(b0, state=CacheState.NO_CACHE, dirty=Size.exact(0))
    assert early.cset_uuid is not None
    done = dataclasses.replace(early, cset_uuid=None)
    seq = [early, early, done]
    monkeypatch.setattr(bcache, "backing_rel", lambda sysfs, name: "block/sdx/bcache")
    monkeypatch.setattr(bcache, "reread", lambda sysfs, name: seq.pop(0))

    class FakeSysfs:
        def write(self, rel: str, value: str) -> None:
            pass

    bcache.detach(FakeSysfs(), b0, interval=0.0)  # type: ignore[arg-type]
    assert seq == []  # read until the link was gone


def test_never_100_percent_or_eta_0_while_not_clean() -> None:
    """A writer that keeps dirtying the device makes it read 0 B while its state stays
    dirty (issue #32: "100 % ETA 1 s" for a minute, then a stall): not done, no ETA."""
    m = drainloop.Meter("drain", "/dev/x", 0.0)
    m.update(0.0, 4096, CacheState.DIRTY)
    p = m.update(1.0, 0, CacheState.DIRTY)
    assert p.fraction == 0.999 and p.eta_s is None
    p = m.update(2.0, 0, CacheState.CLEAN)
    assert p.fraction == 1.0 and p.eta_s == 0.0


def test_explain_puts_the_kinds_words_in_the_report() -> None:
    f = Fake([3000, 3000, 1000, 0, 0, 0, 0])
    seen: list[tuple[int | None, float, bool]] = []

    def explain(raw: int | None, elapsed: float, progressed: bool) -> str | None:
        seen.append((raw, elapsed, progressed))
        return None if progressed else f"waiting ({elapsed:g} s)"

    f.run(explain=explain)
    assert [p.note for p in f.seen[:3]] == ["waiting (0 s)", "waiting (1 s)", None]
    assert seen[2] == (1000, 2.0, True)


def test_drain_notes_the_writeback_delay_pause_and_arriving_writes(tmp_path: Path) -> None:
    """Capture bcache-writeback-dirty-uml: bcache0 in writeback with dirty data. The notes
    a drain's progress carries: the writeback_delay pause before any progress; writes
    arriving into a writeback cache (from its block layer counters), with the way out."""
    from cachemgr.procedures import drain
    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    b = snapshot.take(sysfs).backings[0]
    assert b.mode == CacheMode.WRITEBACK and b.device_name == "bcache0"
    note = drain.drain_note(b, "/dev/bcache0", {"writeback_delay": 30}, None, 7.0, False)
    assert note is not None and "writeback_delay (30 s)" in note and "at most 23 s" in note
    assert drain.drain_note(b, "/dev/bcache0", {"writeback_delay": 30}, None, 7.0, True) is None
    assert drain.drain_note(b, "/dev/bcache0", {"writeback_delay": 30}, None, 31.0,
                            False) is None
    # the block layer's write sectors (field 7) grow 8192 sectors (4 MiB) a second
    stat = root / "block" / "bcache0" / "stat"
    fields = stat.read_text().split()
    now = [0.0]
    meter = drain.WriteMeter(sysfs, "bcache0", clock=lambda: now[0])
    rates = []
    for i in range(4):
        fields[6] = str(int(fields[6]) + 8192 * (i > 0))
        stat.write_text(" ".join(fields) + "\n")
        rates.append(meter.rate())
        now[0] += 1.0
    assert rates[0] is None and rates[1:] == [4 << 20] * 3, rates
    words = drain.drain_note(b, "/dev/bcache0", {"writeback_delay": 30}, rates[-1], 1.0, False)
    assert words is not None and words.startswith("writes are arriving at 4.0 MiB/s")
    assert "cachemgr mode /dev/bcache0 writethrough --drain" in words
    # in writethrough arriving writes are not cached dirty: nothing to say of them
    wt = dataclasses.replace(b, mode=CacheMode.WRITETHROUGH)
    assert drain.arriving_words(wt, "/dev/bcache0", 4 << 20) is None
    assert drain.arriving_words(b, "/dev/bcache0", 1000) is None  # under 4 KiB/s: noise
