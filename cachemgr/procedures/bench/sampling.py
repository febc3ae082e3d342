"""The cache side of a run: the block layer's IO counts (``/sys/block/*/stat``), the cache's
own counters and dirty data sampled while fio runs (:class:`_Sampler`), bcache's accounting
tick, the hit ratio of a run (:class:`CacheSample`: bcache's counters, else the block layer's)
and the cache set's capacity.

bcache's ``cache_hits``/``cache_misses`` count reads only, are folded every ~13.6 s and wrap
above 65,535 events per interval: see the package docstring (:mod:`cachemgr.procedures.bench`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachemgr.backends import bcache, snapshot
from cachemgr.backends.blockdev import BlockStat
from cachemgr.core import cancel
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import BcacheBacking, CacheSet, Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.bench.stats import ratio
from cachemgr.procedures.bench.targets import Target

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- block stats


def read_block_stat(sysfs: Sysfs, name: str) -> BlockStat | None:
    rel = bcache.block_dirs(sysfs).get(name)
    text = sysfs.read_opt(f"{rel}/stat") if rel else None
    return BlockStat.parse(text) if text is not None else None


# ----------------------------------------------------------------------------- cache side


def _backing(sysfs: Sysfs, name: str) -> BcacheBacking:
    return bcache.reread(sysfs, name)


def _cache_set(sysfs: Sysfs, b: BcacheBacking) -> CacheSet | None:
    if b.cset_uuid is None:
        return None
    return snapshot.take(sysfs).cache_set(b.cset_uuid)


def _kernel_counts(b: BcacheBacking) -> tuple[int, int, int, int, int] | None:
    s = b.stats.get("total")
    if s is None or None in (s.hits, s.misses, s.bypass_hits, s.bypass_misses):
        return None
    byp = s.bypassed.bytes if s.bypassed is not None else 0
    return (s.hits or 0, s.misses or 0, s.bypass_hits or 0, s.bypass_misses or 0, byp)


@dataclass(frozen=True)
class CacheSample:
    """The cache's own view of one run (deltas over the run) next to the block layer's."""

    device: str
    mode: str | None
    hit_ratio: float | None  # reads served from the cache: the figure to compare
    hit_ratio_source: str | None  # "kernel" | "block"
    hit_ratio_kernel: float | None  # bcache's hits / (hits + misses), bypassed excluded
    hit_ratio_block: float | None  # 1 - backing reads / bcache reads
    hits: int | None
    misses: int | None
    bypass_hits: int | None
    bypass_misses: int | None
    bypassed_bytes: int | None
    kernel_counters_consistent: bool | None
    reads: int
    writes: int
    backing_reads: int | None
    backing_writes: int | None
    cache_reads: int | None
    cache_writes: int | None
    dirty_start: int | None
    dirty_end: int | None
    dirty_max: int | None
    cache_available_percent_min: int | None
    timeline: tuple[tuple[float, int | None, int], ...] = ()  # (s, dirty bytes, reads so far)


class _Sampler:
    """Samples the device's IO count, the cache's dirty data and the cache set's free space
    while fio runs, every ``interval`` seconds (0: not at all), and reports progress. A
    thread: fio runs in the foreground through the runner.

    Three small sysfs reads a sample, their paths found once before the run (it read a whole
    snapshot, about 60 files and dmsetup, every second before): its own effect on the
    measured IOPS and p99 is measured by benchmarks/bench_fidelity_bench.py
    (docs/benchmarks.md, "Bench fidelity: the sampler's own cost, and the ceiling")."""

    def __init__(self, sysfs: Sysfs, name: str, backing_name: str | None, interval: float,
                 progress: Callable[[float, int, int | None], None] | None) -> None:
        self.sysfs, self.name, self.backing_name = sysfs, name, backing_name
        self.interval, self.progress = interval, progress
        self.stop = threading.Event()
        self.points: list[tuple[float, int | None, int]] = []
        self.avail: list[int] = []
        self.samples = 0
        # its own cost (benchmarks/bench_fidelity_bench.py): wall and CPU time spent sampling
        self.busy_s = 0.0
        self.cpu_s = 0.0
        dirs = bcache.block_dirs(sysfs)
        self.stat_rel = f"{dirs[name]}/stat" if name in dirs else None
        self.dirty_rel = self.avail_rel = None
        if backing_name and backing_name in dirs:
            b = f"{dirs[backing_name]}/bcache"
            self.dirty_rel = f"{b}/dirty_data"
            target = sysfs.readlink(f"{b}/cache")
            if target:
                cset = target.rstrip("/").rsplit("/", 1)[-1]
                self.avail_rel = f"fs/bcache/{cset}/cache_available_percent"
        self.t0 = time.monotonic()
        self.start_stat = self._stat()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _stat(self) -> BlockStat | None:
        text = self.sysfs.read_opt(self.stat_rel) if self.stat_rel else None
        return BlockStat.parse(text) if text is not None else None

    def __enter__(self) -> _Sampler:
        if self.interval > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def _loop(self) -> None:
        last = self.start_stat
        last_t = self.t0
        while not self.stop.wait(self.interval):
            t, c = time.monotonic(), time.thread_time()
            try:
                st = self._stat()
                dirty = None
                if self.dirty_rel:
                    text = self.sysfs.read_opt(self.dirty_rel)
                    dirty = Size.parse_hprint(text).bytes if text is not None else None
                if self.avail_rel:
                    avail = self.sysfs.read_int(self.avail_rel)
                    if avail is not None:
                        self.avail.append(avail)
            except CacheMgrError as exc:  # a vanished device ends sampling, not the run
                log.warning("sampling %s: %s", self.name, exc)
                return
            self.samples += 1
            now = time.monotonic()
            self.busy_s += now - t
            self.cpu_s += time.thread_time() - c
            if st is None or self.start_stat is None or last is None:
                continue
            done = st.minus(self.start_stat)
            self.points.append((round(now - self.t0, 2), dirty, done.reads + done.writes))
            if self.progress:
                d = st.minus(last)
                iops = int((d.reads + d.writes) / max(now - last_t, 1e-3))
                self.progress(now - self.t0, iops, dirty)
            last, last_t = st, now


def wait_accounting_tick(sysfs: Sysfs, backing_name: str, *, timeout: float = 16.0,
                         interval: float = 0.25) -> bool:
    """Wait until bcache folds its collectors into the stats (every ~13.6 s): the counts of
    IO done before the call are then visible. False if nothing changed in ``timeout``
    (nothing was pending)."""
    first = _kernel_counts(_backing(sysfs, backing_name))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cancel.sleep(interval, "the benchmark")  # up to 16 s: a cancel does not wait it out
        if _kernel_counts(_backing(sysfs, backing_name)) != first:
            return True
    return False


def _sample_result(sysfs: Sysfs, target: Target, before: BcacheBacking,
                   after: BcacheBacking, blk: dict[str, tuple[BlockStat | None,
                                                              BlockStat | None]],
                   sampler: _Sampler) -> CacheSample:
    def delta(key: str) -> BlockStat | None:
        a, b = blk.get(key, (None, None))
        return b.minus(a) if a is not None and b is not None else None

    dev = delta("dev")
    bk = delta("backing")
    ca = delta("cache")
    k0, k1 = _kernel_counts(before), _kernel_counts(after)
    hits = misses = bh = bm = byp = None
    if k0 is not None and k1 is not None:
        hits, misses, bh, bm, byp = (y - x for x, y in zip(k0, k1, strict=True))
    reads = dev.reads if dev else 0
    h_kernel = ratio(hits, (hits or 0) + (misses or 0)) if hits is not None else None
    h_block = None
    if dev is not None and bk is not None and dev.reads > 0:
        h_block = max(0.0, 1 - bk.reads / dev.reads)
    consistent = None
    if hits is not None and reads > 0:
        counted = (hits or 0) + (misses or 0) + (bh or 0) + (bm or 0)
        consistent = abs(counted - reads) <= max(2, 0.01 * reads)
    hit, source = None, None
    if consistent and hits is not None and counted_served(hits, misses, bh, bm) is not None:
        hit, source = counted_served(hits, misses, bh, bm), "kernel"
    elif h_block is not None:
        hit, source = h_block, "block"
    dirty_vals = [d for _, d, _ in sampler.points if d is not None]
    return CacheSample(
        device=target.device,
        mode=after.mode.value if after.mode else None,
        hit_ratio=hit, hit_ratio_source=source, hit_ratio_kernel=h_kernel,
        hit_ratio_block=h_block, hits=hits, misses=misses, bypass_hits=bh, bypass_misses=bm,
        bypassed_bytes=byp, kernel_counters_consistent=consistent,
        reads=reads, writes=dev.writes if dev else 0,
        backing_reads=bk.reads if bk else None, backing_writes=bk.writes if bk else None,
        cache_reads=ca.reads if ca else None, cache_writes=ca.writes if ca else None,
        dirty_start=before.dirty.bytes if before.dirty else None,
        dirty_end=after.dirty.bytes if after.dirty else None,
        dirty_max=max(dirty_vals) if dirty_vals else None,
        cache_available_percent_min=min(sampler.avail) if sampler.avail else None,
        timeline=tuple(sampler.points),
    )


def counted_served(hits: int | None, misses: int | None, bh: int | None,
                   bm: int | None) -> float | None:
    """Reads served from the cache by bcache's own counters: (hits + bypass hits) / all.

    bcache counts a bypassed read that found its data in the cache as a bypass hit (it is
    still served from the cache); a partial hit counts as a miss."""
    if hits is None or misses is None:
        return None
    total = hits + misses + (bh or 0) + (bm or 0)
    return (hits + (bh or 0)) / total if total else None


def cache_capacity_bytes(cset: CacheSet) -> int | None:
    """The cache device's data capacity: buckets x bucket size (the whole device less its
    superblock and alignment; btree, journal and allocator reserves live in it too)."""
    if not cset.caches:
        return None
    c = cset.caches[0]
    if c.nbuckets is None or c.bucket_size is None:
        return None
    return c.nbuckets * c.bucket_size.bytes
