"""A paced flush (``drain --max-latency``) of a dm-cache device or an LVM cache: the cleaner's
copying held to a share of the time, so that the other IO on the origin keeps its p99 under
the bound (docs/kernel-notes.md, "Pacing a dm-cache drain").

Why not migration_threshold: the cleaner policy asks for writeback whether the device is idle
or not (``clean_target_met`` in dm-cache-policy-smq.c: ``idle || mq->cleaner``), and
``check_migrations`` (dm-cache-target.c) starts every migration the policy gives; the
threshold only decides the ``idle`` flag, i.e. whether the cleaner may also take the blocks
touched in the last writeback period. Under a VM's IO the cache is never idle for a second,
so the threshold changes nothing then (lab: the same drain time and reader p99 at 1 and 2048
sectors).

What the kernel offers instead is kcopyd's throttle, ``cache_copy_throttle`` of the dm_cache
module ("A percentage of time allocated for copying to and/or from cache";
``/sys/module/dm_cache/parameters/cache_copy_throttle``, 100 by default): before each copy
job kcopyd sleeps 100 ms (at most ten times) while its jobs were in flight more than that
share of the time (``io_job_start`` in dm-kcopyd.c). It is the module's, so it holds for every
dm-cache device and LVM cache on the host at once (their promotions too) while the drain
runs: one paced drain at a time (:data:`LOCK`), and the value it found is journaled and put
back at the end, after an error, Ctrl-C or SIGTERM, and by the next drain or ``--resume``
after a kill (:func:`restore_stale`).

The controller is the bcache drain's (:class:`cachemgr.core.pace.Pacer`), its pace the
throttle in percent (:data:`FLOOR` to the value found, which is "unpaced"), its measure the
p99 of the VMs' IO on the cache device itself: the cleaner's copies go to the origin and the
cache device through kcopyd, never through it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cachemgr.backends import blockdev
from cachemgr.core import pace, signals, state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

PARAM = "module/dm_cache/parameters/cache_copy_throttle"  # relative to the sysfs root
LOCK = "dmcache-copy-throttle"
FLOOR = 1  # percent: the slowest pace (a drain that stops never ends)
START = 5  # percent: the first pace, before the other IO is measured


def journal() -> Path:
    """Where a paced drain keeps the throttle it found (one for the host: it is the module's)."""
    return state.journal_path("dmcache-throttle", "cache_copy_throttle")


def read_throttle(sysfs: Sysfs) -> int | None:
    """The module's cache_copy_throttle (percent); None when dm_cache has none (not loaded)."""
    text = sysfs.read_opt(PARAM)
    return int(text) if text is not None and text.strip().isdigit() else None


def write_throttle(sysfs: Sysfs, value: int) -> None:
    sysfs.write(PARAM, str(value))


def _restore_locked(sysfs: Sysfs) -> int | None:
    path = journal()
    saved = state.read_json(path)
    if saved is None:
        return None
    value = saved.get("original")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
        raise state.StateFileError(path, f"not a copy-throttle journal: 'original' is "
                                         f"{value!r}, not a percentage")
    if read_throttle(sysfs) is not None:
        write_throttle(sysfs, value)
        log.info("dm_cache cache_copy_throttle %d restored (a paced drain had changed it)",
                 value)
    path.unlink(missing_ok=True)
    return value


def restore_stale(sysfs: Sysfs) -> int | None:
    """Put back the throttle a killed paced drain left (its journal): the value put back, or
    None (no journal, or a paced drain running now, whose pace it is)."""
    if state.read_json(journal()) is None:
        return None
    try:
        with state.locked(LOCK, "dm_cache cache_copy_throttle"):
            return _restore_locked(sysfs)
    except state.BusyError:
        return None


class Paced:
    """The pace of one paced flush: the pacer, the meter of the VMs' IO on the cache device
    ``vm`` (kernel name), the flush's writes to ``origin``, and the throttle it sets."""

    def __init__(self, sysfs: Sysfs, vm: str | None, origin: str | None, bound_ms: float,
                 original: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs, self.bound, self.clock, self.original = sysfs, bound_ms, clock, original
        self.pacer = pace.Pacer(bound_ms, floor=FLOOR, start=min(START, original),
                                ceiling=original, fmt=percent)
        self.meter = pace.LatencyMeter()
        counters, written = blockdev.pace_sources(sysfs, vm, origin)
        self.sampler = pace.Sampler(counters, written, self.meter, clock=clock)
        self.sampler.read()
        self.slowest: int | None = None

    def apply(self, p: int | None) -> None:
        """Set pace ``p`` (None: unpaced, the value found)."""
        if p is not None:
            self.slowest = p if self.slowest is None else min(self.slowest, p)
        write_throttle(self.sysfs, self.original if p is None else p)

    def step(self, device: str) -> None:
        """One judgement of the pacer on what was measured since its last one."""
        now = self.clock()
        since = self.pacer.changed_at if self.pacer.changed_at is not None else -math.inf
        p99, ios = self.meter.p99(since)
        # the pace is a share of time, not a rate: the flush's own write rate says nothing
        # of whether the disk is the limit (None: the pacer does not compare them)
        d = self.pacer.decide(now, p99, ios, None)
        if d.changed:
            log.info("%s: %s (%s)", device, pace_words(d.pace), d.note)
            self.apply(d.pace)

    def moving(self) -> bool:
        """The flush is writing to the origin (beyond the VMs' writes), lately. Throttled,
        kcopyd ends its copies in batches (its worker ends the finished jobs only between
        passes over the queued ones, each start of which may sleep: dm-kcopyd.c do_work),
        so the dirty count can stand still for minutes while the writes go on (lab, 7.2.7:
        512 dirty blocks for 45 s at 5 %, then 55)."""
        rate = self.sampler.drain_rate()
        return rate is not None and rate > 0

    def words(self) -> str:
        slowed = self.pacer.slowed_words()
        return (f"{self.pacer.note}; {pace_words(self.pacer.pace)}"
                + (f" ({slowed})" if slowed else ""))

    def summary(self) -> dict[str, object]:
        return {**self.pacer.summary(pace_words(self.pacer.pace)),
                "slowest_copy_percent": self.slowest,
                "slowest_words": None if self.slowest is None else pace_words(self.slowest)}


def percent(p: int) -> str:
    return f"{p}%"


def pace_words(p: int | None) -> str:
    """The pace in words: "unpaced" or "copy time 5%" (dm_cache's cache_copy_throttle)."""
    return "unpaced" if p is None else f"copy time {p}% (dm_cache cache_copy_throttle)"


@contextlib.contextmanager
def paced(sysfs: Sysfs, vm: str | None, origin: str | None, bound_ms: float | None,
          device: str) -> Iterator[Paced | None]:
    """A paced flush's throttle, from before the cleaner starts to after it ends (None and
    nothing changed when ``bound_ms`` is None). Holds :data:`LOCK` for its whole life (a
    second paced dm-cache drain is refused, exit 3, naming this one), puts back what a killed
    one left, journals the value found, starts at :data:`START` percent, and puts the value
    back on the way out whatever ends it. An unpaced drain too puts back what a killed paced
    one left: it would otherwise run at that one's pace."""
    if bound_ms is None:
        restore_stale(sysfs)
        held = read_throttle(sysfs) if state.read_json(journal()) is not None else None
        if held is not None:  # a paced drain runs now: its pace is the module's
            log.warning("%s: another paced dm-cache drain holds dm_cache's cache_copy_throttle "
                        "at %d%% (one setting for every dm-cache device): this drain copies "
                        "at that pace too until it ends", device, held)
        yield None
        return
    with state.locked(LOCK, "dm_cache cache_copy_throttle"):
        _restore_locked(sysfs)
        original = read_throttle(sysfs)
        if original is None:
            raise CacheMgrError(f"{device}: the dm_cache module has no cache_copy_throttle "
                                f"(/sys/{PARAM}) to pace the drain with; nothing was changed",
                                hint="drain without --max-latency")
        state.write_json(journal(), {"original": original, "device": device,
                                     "started": time.time()})
        try:  # the journal is put back and removed whatever fails from here on
            p = Paced(sysfs, vm, origin, bound_ms, original)
            p.apply(p.pacer.pace)
            yield p
        finally:
            with signals.deferred():
                try:
                    _restore_locked(sysfs)
                except CacheMgrError as exc:
                    log.error("%s: dm_cache cache_copy_throttle was not put back (%s); %s "
                              "keeps it: the next drain or 'cachemgr drain %s --resume' puts "
                              "it back", device, exc, journal(), device)
                    raise
