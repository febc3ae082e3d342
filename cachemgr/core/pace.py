"""A drain that spares the VMs: keep the other IO's p99 latency under a bound, drain as fast
as that allows.

What is measured (docs/kernel-notes.md, "Pacing a drain"): the latency of the IO the VMs do,
from the block layer counters of the device they use (``/sys/block/bcacheN/stat``: IOs done
and milliseconds spent, reads and writes; Documentation/block/stat.rst). That device's
counters hold the VMs' IO only: the drain's own writes (bcache's writeback) go to the backing
device under it without passing through it. Its time is counted from the bio's submission to
its completion, so a request waiting behind the drain for a tag of the backing disk's queue
is counted too (the backing disk's own counters start only once a request has its tag and
miss that wait: lab, 7.2).

The p99 estimate (:class:`LatencyMeter`): the counters are read every ``SLICE`` seconds;
each slice that completed IOs gives their mean latency, weighted by its count; the estimate
is the 99th percentile of those slice means over the last ``window`` seconds. With a few IOs
per slice (a QD1 VM doing tens of IOPS) a slice's mean is close to each IO's own latency;
with many per slice it averages the tail away and reads low, which the headroom of the
controller (it speeds up only under half the bound) partly covers.

The controller (:class:`Pacer`) starts paced and slow (every IO over the bound counts in the
VMs' p99: a drain let loose before the first measurement makes the first ones; a start at
the floor instead of 128 KiB/s took a drain beside a reader on the lab's 20 ms HDD under
mq-deadline 4.0x the unpaced drain's time instead of 1.4x, for the same p99, and did not
spare a FIFO queue's first slow-down, which came at the floor), and is multiplicative both
ways with a dead band: above the
bound it halves the pace (or the rate the drain was seen writing, when that is lower), under
half the bound it raises it by half, in between it holds. When the drain writes less than
half its pace, it lets the drain go unpaced (bcache's writeback at idle priority, which an
IO scheduler that honours priorities serves after the VMs' reads: lab, mq-deadline, the
reader's p99 40 ms unpaced and paced alike) once: if the VMs' p99
then goes over the bound (a FIFO queue, scheduler ``none``: bcache's rate limiter lets
writeback fall up to 2 s behind and then issues the backlog at once, ``bch_next_delay()``,
drivers/md/bcache/util.c), it does not again, and the pace holds. No other IO for a
period: unpaced (no VM to spare). It decides at most every
``period`` seconds and only on IO measured after its last judgement. The pace never falls
below ``floor`` (a drain that stops entirely never ends, and dirty data sits on the SSD).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cachemgr.core import checks

SLICE = 0.1  # seconds between two readings of the counters while the drain waits
MAX_LATENCY_MS = 60_000.0  # a bound above a minute is a typo, not a wish


def check_max_latency(value: object, what: str = "--max-latency") -> float:
    """The bound in milliseconds: a finite number above 0 and at most a minute; UsageError
    (exit 2) otherwise."""
    return float(checks.number(value, what, above=0, maximum=MAX_LATENCY_MS))


@dataclass(frozen=True)
class Counters:
    """What one reading of a device's stat file gives the meter: IOs completed and the
    milliseconds they spent (reads and writes), and sectors written."""

    ios: int
    ms: int
    write_sectors: int


class LatencyMeter:
    """The other IO's latency, from successive :class:`Counters` of the device the VMs use."""

    def __init__(self, window: float = 4.0) -> None:
        self.window = window
        self.last: tuple[float, Counters] | None = None
        self.slices: deque[tuple[float, int, float]] = deque()  # (end, ios, mean ms)

    def add(self, now: float, c: Counters) -> None:
        if self.last is not None:
            c0 = self.last[1]
            ios, ms = c.ios - c0.ios, c.ms - c0.ms
            if ios > 0 and ms >= 0:
                self.slices.append((now, ios, ms / ios))
            elif ios < 0 or ms < 0:  # counters went back (device re-created): start again
                self.slices.clear()
        self.last = (now, c)
        while self.slices and self.slices[0][0] < now - self.window:
            self.slices.popleft()

    def p99(self, since: float = -math.inf) -> tuple[float | None, int]:
        """(p99 estimate in ms, IOs it rests on) over the slices that ended after ``since``
        and within the window; (None, 0) without any."""
        s = sorted((mean, n) for end, n, mean in self.slices if end > since)
        total = sum(n for _, n in s)
        if not total:
            return None, 0
        need, seen = 0.99 * total, 0
        for mean, n in s:
            seen += n
            if seen >= need:
                return mean, total
        return s[-1][0], total  # pragma: no cover (float rounding)


@dataclass(frozen=True)
class Decision:
    pace: int | None  # sectors per second; None: unpaced (as fast as the disk allows)
    note: str  # why, for the progress line
    changed: bool


class Pacer:
    """Decides the drain's pace from the other IO's p99 (module docstring)."""

    MIN_IOS = 4  # fewer other IOs than that since the last change: too few to judge

    def __init__(self, bound_ms: float, *, floor: int = 64, period: float = 2.0,
                 start: int = 256, ceiling: int | None = None,
                 fmt: Callable[[int], str] | None = None) -> None:
        """``floor``, ``start``: the slowest and the first pace, in the pace's unit (sectors
        per second by default); ``ceiling``: a pace that high is no pace (unpaced), None for
        none; ``fmt``: the pace in words ("256 KiB/s")."""
        self.bound = bound_ms
        self.floor, self.period, self.ceiling = floor, period, ceiling
        self.fmt = fmt or kib_per_s
        # it starts paced, slow: every p99 over the bound counts in the VMs' p99, and a
        # drain let loose before the first measurement would make the first ones
        self.pace: int | None = max(floor, start)
        # unpaced because the drain did not use its pace; and whether that once made the
        # VMs' p99 go over the bound (then it is not done again)
        self.unpaced_short = False
        self.unpacing_hurt = False
        self.over_at_floor = 0  # judgements over the bound while already at the floor
        self.changed_at: float | None = None
        self.lowered = 0  # how many times the pace went down
        self.last_lowered: str | None = None  # why, the last time: "p99 22 ms > 15 ms"
        self.note = (f"paced: starting slow until the other IO is measured (bound p99 "
                     f"{bound_ms:g} ms)")

    def decide(self, now: float, p99: float | None, ios: int,
               drain_rate: float | None) -> Decision:
        """One step: ``p99``/``ios`` measured since the last change (LatencyMeter.p99 with
        ``since=changed_at``), ``drain_rate`` the drain's own writes, sectors/s, lately."""
        if self.changed_at is None:
            self.changed_at = now
        if now - self.changed_at < self.period:
            return Decision(self.pace, self.note, False)
        b = f"{self.bound:g} ms"
        if p99 is None or ios < self.MIN_IOS:
            if ios == 0:
                return self._set(now, None, f"unpaced: no other IO for {self.period:g} s")
            return self._hold(now, f"{self._pace(self.pace)}: too little other IO to measure "
                              f"({ios} IOs)")
        if p99 > self.bound:
            if self.pace is None and self.unpaced_short:
                self.unpacing_hurt = True
            base = self.pace if self.pace is not None else (
                drain_rate or self.ceiling or self.floor * 4)
            if self.pace is not None and drain_rate and drain_rate < self.pace:
                base = min(base, int(drain_rate))  # the disk gave less than the pace
            new = max(self.floor, int(base / 2))
            self.lowered += 1
            self.last_lowered = f"p99 {p99:.0f} ms > {b}"
            if self.pace is not None and self.pace <= self.floor:
                # slower than the floor the drain would not end: the bound is not held here
                self.over_at_floor += 1
                return self._set(now, new, f"paced at its slowest: other IO p99 {p99:.0f} ms > "
                                 f"{b}, not held (the disk cannot serve the slowest drain "
                                 "beside this IO)")
            return self._set(now, new, f"paced: other IO p99 {p99:.0f} ms > {b}")
        if p99 < self.bound / 2:
            if self.pace is None:
                return self._hold(now, f"unpaced: other IO p99 {p99:.0f} ms < {b}")
            if drain_rate is not None and drain_rate < self.pace / 2:
                if self.unpacing_hurt:
                    return self._hold(now, f"{self._pace(self.pace)}: other IO p99 {p99:.0f} "
                                      f"ms < {b}, the drain wrote under its pace (unpaced, it "
                                      "made the other IO slower): holding")
                # the drain does not even take its pace: let it go (module docstring)
                d = self._set(now, None, f"unpaced: other IO p99 {p99:.0f} ms < {b}, the "
                              "drain wrote under its pace")
                self.unpaced_short = True
                return d
            faster = int(self.pace * 1.5) + 1
            if self.ceiling is not None and faster >= self.ceiling:
                return self._set(now, None, f"unpaced: other IO p99 {p99:.0f} ms < {b}")
            return self._set(now, faster,
                             f"paced: other IO p99 {p99:.0f} ms < {b}, speeding up")
        return self._hold(now, f"{self._pace(self.pace)}: other IO p99 {p99:.0f} ms <= {b}, "
                          "holding")

    def summary(self, final: str) -> dict[str, object]:
        """What every kind's paced drain reports of its pacer (DrainResult.pacing), ``final``
        its last pace in the kind's words; the kind adds its slowest pace."""
        return {"max_latency_ms": self.bound, "lowered": self.lowered,
                "over_at_floor": self.over_at_floor, "final": final, "note": self.note}

    def slowed_words(self) -> str:
        """How often the pace went down and why the last time, for a progress line that is
        printed less often than the pacer decides: "" until it first does."""
        if not self.lowered:
            return ""
        times = "once" if self.lowered == 1 else f"{self.lowered} times"
        return f"slowed {times}, last for other IO {self.last_lowered}"

    def _hold(self, now: float, note: str) -> Decision:
        # the next judgement rests on what comes after this one
        self.changed_at, self.note = now, note
        return Decision(self.pace, note, False)

    def _set(self, now: float, pace: int | None, note: str) -> Decision:
        changed = pace != self.pace
        if changed:  # still unpaced (no other IO for a while): it is the same unpacing
            self.unpaced_short = False
        self.pace, self.changed_at, self.note = pace, now, note
        return Decision(pace, note, changed)

    def _pace(self, pace: int | None) -> str:
        return "unpaced" if pace is None else f"paced at {self.fmt(pace)}"


def kib_per_s(sectors: int) -> str:
    """A pace in sectors per second, in words: "256 KiB/s"."""
    return f"{sectors * 512 // 1024} KiB/s"


def pace_words(pace: int | None) -> str:
    """The pace in words: "unpaced" or "writeback 256 KiB/s"."""
    return "unpaced" if pace is None else f"writeback {pace * 512 // 1024} KiB/s"


class Sampler:
    """Reads the counters every ``SLICE`` seconds while the drain loop sleeps (its ``sleep``),
    and the drain's own write rate (the backing device's written sectors less the VMs')."""

    def __init__(self, vm: Callable[[], Counters | None], backing: Callable[[], int | None],
                 meter: LatencyMeter, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.vm, self.backing, self.meter = vm, backing, meter
        self.clock, self._sleep = clock, sleep
        self.writes: deque[tuple[float, int]] = deque()  # (t, drain's sectors so far)

    def read(self) -> None:
        now, c, w = self.clock(), self.vm(), self.backing()
        if c is not None:
            self.meter.add(now, c)
            if w is not None:
                self.writes.append((now, w - c.write_sectors))
                while len(self.writes) > 2 and self.writes[1][0] < now - self.meter.window:
                    self.writes.popleft()

    def drain_rate(self) -> float | None:
        """The drain's writes to the backing device, sectors per second, lately."""
        if len(self.writes) < 2:
            return None
        (t0, w0), (t1, w1) = self.writes[0], self.writes[-1]
        return max(0.0, (w1 - w0) / (t1 - t0)) if t1 > t0 else None

    def sleep(self, seconds: float) -> None:
        end = self.clock() + seconds
        while True:
            self.read()
            left = end - self.clock()
            if left <= 0:
                return
            self._sleep(min(SLICE, left))
