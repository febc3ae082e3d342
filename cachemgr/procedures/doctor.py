"""Why a cache does not help: ``cachemgr doctor``'s diagnosis, a pure procedure over two
snapshots of the host taken a window apart (and the block layer's counters of the same two
moments), never a read of its own.

Each :class:`Cause` has the shape of the health model's findings (procedures/health.py): a
code, the device, what is known in words, the exact next command; and its evidence, the
figures it was named from. The causes, in the order they are looked for and listed (the
first one named is the one to fix first):

* ``mode-left``: a mode that caches nothing left behind: bcache ``none``, dm-cache and LVM
  cache ``passthrough`` (named whatever the IO); bcache ``writearound`` when the window saw
  writes (it still caches reads: docs/kernel-notes.md, "Warming a cache").
* ``sequential-bypass``: bcache bypassed most of the window's requests (its
  ``cache_bypass_hits`` and ``cache_bypass_misses`` against its hits and misses) while
  ``sequential_cutoff`` is on and the cache set shows no congestion.
* ``congestion-bypass``: bcache bypassed most of the window's requests and its cache set
  was congested: the cache device's mean request time in the window (the block layer's
  milliseconds over its requests) above ``congested_read_threshold_us`` or
  ``congested_write_threshold_us``; or, where ``sequential_cutoff`` is off, the set's
  ``congested`` file non-zero at either end (one moment's sample: a single slow request
  sets it) (docs/kernel-notes.md, "Why a cache does not help"). When the cache device is also
  slower per read than the backing device, the thresholds are doing their job and the fix
  is the SSD; else it is the thresholds.
* ``dirty-full``: bcache in writeback with its cache set's buckets in use at the writeback
  cutoff (70 %: above it writes go around the cache; named from 65 %, as the figure hovers
  around the cutoff) and dirty data on it. (A dm-cache full of dirty data is not named:
  not proven in the lab.)
* ``working-set`` (with a trace of the device: ``doctor --trace``): the trace's miss-ratio
  curve (procedures/sizing.py, in the cache's own block size) read-hits at least
  :data:`WS_GAP` more at the trace's footprint than at the cache's capacity; the size that
  would do is the smallest on the curve within :data:`WS_CLOSE` of the best.
* ``writethrough-dirty``: dm-cache (or an LVM cache) in writethrough with dirty blocks. A
  write-through cache makes no dirty data of its own; after an unclean shutdown dm-cache
  loads every block it held as dirty (the metadata was not closed cleanly), and writes them
  all back to an origin that has them (lvm2#141: 25 M blocks, 10 hours). Or the device was
  switched from writeback while dirty (real dirty data). Doctor cannot tell which; either
  way the cache spends its bandwidth on the write-back until it ends (the window gives
  its pace). The fix named is cachemgr's flush; no cheaper way was proven safe in the lab.
* ``smq-not-promoting``: dm-cache (or an LVM cache) whose read misses rose in the window
  with no promotion, on the ``cleaner`` policy (a flush's, left behind). A low
  ``migration_threshold`` is not a cause on the lab's kernels: at 1 sector smq still
  promoted (docs/kernel-notes.md, "Why a cache does not help").
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachemgr.backends.blockdev import BlockStat
from cachemgr.core.model import (
    BcacheBacking,
    CacheMode,
    CacheSet,
    DmCacheDevice,
    Size,
    Snapshot,
    Stats,
    human,
)
from cachemgr.procedures.health import Finding, Level
from cachemgr.procedures.sizing import Point

# the order causes are looked for and listed in: the first is the one to fix first
ORDER = ("mode-left", "sequential-bypass", "congestion-bypass", "dirty-full",
         "smq-not-promoting", "working-set", "writethrough-dirty")

# below this many requests counted in the window, no share of them is judged: a few reads
# of an idle device say nothing about why the cache does not help
MIN_REQUESTS = 64
# bypassed at least this share of the requests bcache counted in the window
BYPASS_SHARE = 0.5
# a device's mean request time is evidence from this many requests in the window
MIN_TIMED_REQUESTS = 32
# bcache's writeback cutoff (writeback.h CUTOFF_WRITEBACK_SYNC, the module parameter
# bch_cutoff_writeback_sync, 70 by default): with more of the set's buckets in use, no
# write is cached in writeback (should_writeback() in writeback.h)
WRITEBACK_CUTOFF_PERCENT = 70
# a cache at its writeback cutoff hovers around it (bypassed writes replace dirty data,
# which frees buckets, and garbage collection, which refreshes the figure, runs now and
# then): lab, 26 to 30 % available under a steady writer; named from this far below it
FULL_MARGIN_PERCENT = 5
# working set: named when a cache as big as the trace's footprint would read-hit this much
# more of the trace than the cache has now; the size that would do is the smallest within
# WS_CLOSE of that best
WS_GAP = 0.10
WS_CLOSE = 0.02


@dataclass(frozen=True)
class Cause(Finding):
    """A reason a cache does not help: a health finding's shape (level WARNING, code,
    device, what, next) with the figures it was named from."""

    evidence: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, object]:
        doc = super().to_json()
        doc["evidence"] = dict(self.evidence)
        return doc


@dataclass(frozen=True)
class Window:
    """Two snapshots ``seconds`` apart, with the block layer's counters (``/sys/block/<dev>
    /stat``, by kernel name) read with each."""

    before: Snapshot
    after: Snapshot
    seconds: float
    blk_before: Mapping[str, BlockStat]
    blk_after: Mapping[str, BlockStat]

    def io(self, name: str | None) -> BlockStat | None:
        """What block device ``name`` did in the window (None: not read at both ends)."""
        if name is None:
            return None
        a, b = self.blk_before.get(name), self.blk_after.get(name)
        return b.minus(a) if a is not None and b is not None else None

    def rate(self, n: int) -> float:
        return n / self.seconds if self.seconds > 0 else 0.0


def diagnose(w: Window, extra: Iterable[Cause] = ()) -> list[Cause]:
    """Every cause found in ``w`` (and ``extra``: :func:`working_set`'s), in :data:`ORDER`,
    then by device."""
    found = [*_bcache(w), *_dmcache(w), *extra]
    return sorted(found, key=lambda c: (ORDER.index(c.code), c.device))


def unfolded(w: Window) -> list[str]:
    """The bcache devices read in the window whose counters did not move: bcache folds them
    every ~13.6 s, so a shorter window may see nothing of what it did."""
    out = []
    for b in w.after.backings:
        io, prev = w.io(b.device_name), _before(w, b)
        t0 = prev.stats.get("total") if prev is not None else None
        t1 = b.stats.get("total")
        if io is not None and io.reads and t0 is not None and t1 is not None and \
                (t0.hits, t0.misses, t0.bypass_hits, t0.bypass_misses) == \
                (t1.hits, t1.misses, t1.bypass_hits, t1.bypass_misses):
            out.append(b.device or b.identity.node)
    return out


def observed_read_hit_ratio(w: Window, device: str) -> float | None:
    """The read hit ratio the kernel counted for ``device`` in the window (bcache: its hits
    against hits, misses and bypassed reads; dm-cache: read hits against read misses)."""
    for b in w.after.backings:
        if (b.device or b.identity.node) == device:
            prev = _before(w, b)
            t0 = prev.stats.get("total") if prev is not None else None
            t1 = b.stats.get("total")
            n = [_delta(t0, t1, f) for f in ("hits", "misses", "bypass_hits",
                                             "bypass_misses")]
            if None in n or not sum(x or 0 for x in n):
                return None
            return (n[0] or 0) / sum(x or 0 for x in n)
    before = {d.name: d.status for d in w.before.dmcaches}
    for d in w.after.dmcaches:
        a, b2 = before.get(d.name), d.status
        if d.node == device and a is not None and b2 is not None:
            hits, misses = b2.read_hits - a.read_hits, b2.read_misses - a.read_misses
            return hits / (hits + misses) if hits + misses > 0 else None
    return None


def working_set(device: str, capacity: int, points: Sequence[Point], trace: str, *,
                cache: str | None = None, observed: float | None = None) -> Cause | None:
    """The working-set cause of ``device`` whose cache holds ``capacity`` bytes, from the
    miss-ratio curve ``points`` of ``trace`` (sizing.curve, with ``capacity`` among its
    sizes; ``cache``: what replace-ssd takes for its cache, the SSD or the cset UUID); None
    when a bigger cache would not read-hit :data:`WS_GAP` more."""
    def ratio(p: Point) -> float | None:
        return p.read_hit_ratio if p.read_hit_ratio is not None else p.hit_ratio

    pts = sorted((p for p in points if ratio(p) is not None), key=lambda p: p.cache_bytes)
    at = next((p for p in pts if p.cache_bytes == capacity), None)
    if at is None or not pts:
        return None
    best = max(ratio(p) or 0.0 for p in pts)
    now = ratio(at) or 0.0
    if best - now < WS_GAP:
        return None
    need = next(p for p in pts if (ratio(p) or 0.0) >= best - WS_CLOSE)
    return _cause("working-set", device,
                  f"the working set is larger than the cache: by the trace {trace}, its "
                  f"{human(capacity)} of cache would read-hit {now:.0%} of the reads, "
                  f"{human(need.cache_bytes)} would hit {ratio(need):.0%} (the most any size "
                  f"would: {best:.0%})" + (f"; in the window it read-hit {observed:.0%}"
                                           if observed is not None else ""),
                  f"a cache SSD of {human(need.cache_bytes)} or more: cachemgr replace-ssd "
                  f"{cache or device} --new DEV --dry-run (DEV: the bigger SSD; the curve: "
                  "cachemgr "
                  f"size --trace {trace})", cache_bytes=capacity,
                  trace_read_hit_ratio=round(now, 3), size_that_would_do=need.cache_bytes,
                  its_read_hit_ratio=round(ratio(need) or 0.0, 3),
                  best_read_hit_ratio=round(best, 3),
                  observed_read_hit_ratio=None if observed is None else round(observed, 3))


def _cause(code: str, device: str, what: str, next_: str,
           **evidence: Any) -> Cause:
    return Cause(Level.WARNING, code, device, what, next_,
                 tuple((k, v) for k, v in evidence.items() if v is not None))


# ----------------------------------------------------------------------------- bcache


def _delta(a: Stats | None, b: Stats | None, field: str) -> int | None:
    x = getattr(a, field, None) if a is not None else None
    y = getattr(b, field, None) if b is not None else None
    if isinstance(x, Size) and isinstance(y, Size):
        return max(0, y.low - x.low)
    return y - x if isinstance(x, int) and isinstance(y, int) and y >= x else None


def _before(w: Window, b: BcacheBacking) -> BcacheBacking | None:
    return next((x for x in w.before.backings if (b.uuid and x.uuid == b.uuid)
                 or x.identity.name == b.identity.name), None)


def _congested_now(c: CacheSet | None) -> bool:
    """The set's ``congested`` file: bch_get_congested() << 9 printed by bch_hprint; 0 (or
    absent) when bcache does not see the cache device as congested."""
    if c is None or not c.congested:
        return False
    try:
        return Size.parse_hprint(c.congested).high > 0 and \
            Size.parse_hprint(c.congested).low > 0
    except ValueError:
        return False


def _ms_per_request(s: BlockStat | None, write: bool) -> float | None:
    """The mean time of the window's reads (or writes); None below
    :data:`MIN_TIMED_REQUESTS` of them: a few requests' time is noise (lab, host load 16:
    a sequential reader's window, whose bypassed reads never reach the cache device, saw
    its few reads at 6.3 ms)."""
    if s is None:
        return None
    n, ms = (s.writes, s.write_ms) if write else (s.reads, s.read_ms)
    return ms / n if n >= MIN_TIMED_REQUESTS else None


def _bcache(w: Window) -> Iterable[Cause]:
    for b in w.after.backings:
        if b.cset_uuid is None:
            continue  # no cache: nothing for a cache to do
        dev = b.device or b.identity.node
        io = w.io(b.device_name)
        if b.mode == CacheMode.NONE:
            yield _cause("mode-left", dev, "mode none: bcache caches nothing more (a read "
                         "of a block it still holds comes from it; every other request "
                         f"goes to the backing device {b.identity.node})",
                         f"cachemgr mode {dev} writethrough",
                         mode="none", reads_per_s=_r(w, io.reads if io else None),
                         writes_per_s=_r(w, io.writes if io else None))
            continue
        if b.mode == CacheMode.WRITEAROUND and io is not None and io.writes > 0:
            yield _cause("mode-left", dev, f"mode writearound: its {w.rate(io.writes):.0f} "
                         "writes a second go to the backing device "
                         f"{b.identity.node} and are not cached (reads are)",
                         f"cachemgr mode {dev} writethrough", mode="writearound",
                         writes_per_s=_r(w, io.writes))
        prev = _before(w, b)
        t0 = prev.stats.get("total") if prev is not None else None
        t1 = b.stats.get("total")
        hits, misses = _delta(t0, t1, "hits"), _delta(t0, t1, "misses")
        bh, bm = _delta(t0, t1, "bypass_hits"), _delta(t0, t1, "bypass_misses")
        cs = w.after.cache_set(b.cset_uuid)
        yield from _bypass(w, b, dev, cs, hits, misses, bh, bm)
        yield from _bcache_dirty(w, b, dev, cs)


def _r(w: Window, n: int | None) -> float | None:
    return None if n is None else round(w.rate(n), 1)


def _bypass(w: Window, b: BcacheBacking, dev: str, cs: CacheSet | None, hits: int | None,
            misses: int | None, bh: int | None, bm: int | None) -> Iterable[Cause]:
    if None in (hits, misses, bh, bm) or cs is None:
        return
    assert hits is not None and misses is not None and bh is not None and bm is not None
    counted = hits + misses + bh + bm
    byp = bh + bm
    if counted < MIN_REQUESTS or byp < BYPASS_SHARE * counted:
        return
    share = byp / counted
    # (bcache's ``bypassed`` sectors are not evidence: folded as a 16-bit count every
    # 13.6 s, they wrap past 32 MiB an interval: docs/kernel-notes.md, "bcache statistics")
    ev: dict[str, Any] = {"hits": hits, "misses": misses, "bypass_hits": bh,
                          "bypass_misses": bm, "bypassed_share": round(share, 3)}
    # congestion: the cache device's mean request time in the window against the set's
    # thresholds (bch_bbio_count_io_errors() in io.c marks the set congested per request
    # over them), or its congested file at either end
    rth, wth = cs.congested_read_threshold_us, cs.congested_write_threshold_us
    slow: list[str] = []
    for c in cs.caches:
        s = w.io(c.identity.name)
        for write, th in ((False, rth), (True, wth)):
            ms = _ms_per_request(s, write)
            if th and ms is not None and ms * 1000 > th:
                slow.append(f"{c.identity.node} {'writes' if write else 'reads'} took "
                            f"{ms * 1000:.0f} us on average (threshold {th} us)")
                ev[f"cache_{'write' if write else 'read'}_us"] = round(ms * 1000)
    before_cs = w.before.cache_set(cs.uuid)
    flagged = _congested_now(cs) or _congested_now(before_cs)
    cutoff = b.sequential_cutoff.low if b.sequential_cutoff is not None else None
    # the congested file is one moment's sample: a single slow request (a file-backed SSD
    # under host load, lab) sets it; alone it names congestion only where the sequential
    # cutoff cannot explain the bypass
    if (rth or wth) and (slow or (flagged and not cutoff)):
        ev.update(congested_read_threshold_us=rth, congested_write_threshold_us=wth,
                  congested_flag=flagged)
        why = "; ".join(slow) if slow else "the cache set read as congested"
        # the thresholds protect the VMs from a cache device slower than their disk: then
        # the fix is the SSD, not the thresholds
        ssd_ms = [m for c in cs.caches
                  if (m := _ms_per_request(w.io(c.identity.name), False)) is not None]
        disk_ms = _ms_per_request(w.io(b.identity.name), False)
        if disk_ms is not None:
            ev["backing_read_us"] = round(disk_ms * 1000)
        ssd = ",".join(c.identity.node for c in cs.caches) or cs.uuid
        if ssd_ms and disk_ms is not None and max(ssd_ms) > disk_ms:
            yield _cause("congestion-bypass", dev,
                         f"{share:.0%} of its requests bypassed the cache ({byp} of "
                         f"{counted} in {w.seconds:.0f} s): the cache device is slower than "
                         f"the congestion thresholds ({why}) and slower than the backing "
                         f"device {b.identity.node} ({disk_ms * 1000:.0f} us a read): "
                         "bcache rightly sends IO around it; the cache device is the cause",
                         f"cachemgr replace-ssd {ssd} --dry-run", **ev)
        else:
            yield _cause("congestion-bypass", dev,
                         f"{share:.0%} of its requests bypassed the cache ({byp} of "
                         f"{counted} in {w.seconds:.0f} s): the cache device is slower than "
                         f"the congestion thresholds ({why}), so bcache sends IO straight "
                         "to the backing device", f"cachemgr tune {cs.uuid} "
                         "congested_read_threshold_us=0 congested_write_threshold_us=0",
                         **ev)
        return
    if cutoff:
        ev["sequential_cutoff"] = cutoff
        yield _cause("sequential-bypass", dev,
                     f"{share:.0%} of its requests bypassed the cache ({byp} of {counted} "
                     f"in {w.seconds:.0f} s) with sequential_cutoff "
                     f"{human(cutoff)}: streams longer than that go to the backing "
                     "device (a backup, a scan); if they are what should be cached",
                     f"cachemgr tune {dev} sequential_cutoff=0", **ev)


def _bcache_dirty(w: Window, b: BcacheBacking, dev: str,
                  cs: CacheSet | None) -> Iterable[Cause]:
    if b.mode != CacheMode.WRITEBACK or cs is None or cs.cache_available_percent is None:
        return
    # garbage collection refreshes the figure now and then: the fuller of the two reads
    was_cs = w.before.cache_set(cs.uuid)
    in_use = 100 - min(cs.cache_available_percent,
                       was_cs.cache_available_percent if was_cs is not None
                       and was_cs.cache_available_percent is not None else 100)
    dirty = b.dirty.low if b.dirty is not None else None
    if in_use < WRITEBACK_CUTOFF_PERCENT - FULL_MARGIN_PERCENT or not dirty:
        return
    size = sum((c.nbuckets or 0) * (c.bucket_size.low if c.bucket_size else 0)
               for c in cs.caches) or None
    prev = _before(w, b)
    was = prev.dirty.low if prev is not None and prev.dirty is not None else None
    io, disk = w.io(b.device_name), w.io(b.identity.name)
    stopped = b.writeback_running is False
    yield _cause("dirty-full", dev,
                 f"writeback cache full: {in_use}% of cache set {cs.uuid[:8]}'s buckets in "
                 f"use (bcache's writeback cutoff: {WRITEBACK_CUTOFF_PERCENT}%), "
                 f"{human(dirty)} dirty" + (f" of {human(size)}" if size else "")
                 + ": new writes go around the cache to the backing device"
                 + (f" ({w.rate(disk.writes):.0f} of its {w.rate(io.writes):.0f} writes a "
                    "second)" if io is not None and disk is not None and io.writes else "")
                 + (", and writeback is stopped (writeback_running 0: after the drain, "
                    f"cachemgr tune {dev} writeback_running=1)" if stopped else
                    f" faster than writeback (writeback_percent {b.writeback_percent}) "
                    "frees buckets"), f"cachemgr drain {dev}",
                 in_use_percent=in_use, dirty_bytes=dirty, dirty_bytes_before=was,
                 cache_bytes=size, writeback_percent=b.writeback_percent,
                 writeback_running=b.writeback_running,
                 writes_per_s=_r(w, io.writes if io else None),
                 backing_writes_per_s=_r(w, disk.writes if disk else None))


# ----------------------------------------------------------------------------- dm-cache


def _dm_target(d: DmCacheDevice) -> str:
    return f"{d.lvm.vg}/{d.lvm.lv}" if d.lvm is not None else d.node


def _dmcache(w: Window) -> Iterable[Cause]:
    prev = {d.name: d for d in w.before.dmcaches}
    for d in w.after.dmcaches:
        st = d.status
        if st is None:
            continue  # failed or unread: the health model's matter
        dev, target = d.node, _dm_target(d)
        if st.mode == CacheMode.PASSTHROUGH:
            yield _cause("mode-left", dev, "mode passthrough: dm-cache sends every request "
                         "to the origin and caches nothing", f"cachemgr mode {target} "
                         "writethrough", mode="passthrough")
            continue
        p = prev.get(d.name)
        p_st = p.status if p is not None else None
        if st.mode == CacheMode.WRITETHROUGH and st.dirty > 0:
            yield _writethrough_dirty(w, d, p_st.dirty if p_st is not None else None)
        if p_st is None:
            continue
        misses = st.read_misses - p_st.read_misses
        promoted = st.promotions - p_st.promotions
        if misses < MIN_REQUESTS or promoted > 0:
            continue
        ev = dict(read_misses=misses, promotions=promoted, policy=st.policy,
                  migration_threshold=st.migration_threshold)
        if st.policy == "cleaner":
            yield _cause("smq-not-promoting", dev,
                         f"policy cleaner: {misses} read misses in {w.seconds:.0f} s and "
                         "no promotion: the cleaner (a flush's policy) promotes nothing; "
                         "left behind by a flush that did not finish (cachemgr check names "
                         "one of its own), it keeps the cache from ever helping",
                         _smq_back(d), **ev)


def _writethrough_dirty(w: Window, d: DmCacheDevice, was: int | None) -> Cause:
    st = d.status
    assert st is not None
    pace = (was - st.dirty) / w.seconds if was is not None and w.seconds > 0 else None
    eta = st.dirty / pace if pace else None
    return _cause("writethrough-dirty", d.node,
                  f"{st.dirty} of {st.used} cached blocks read as dirty in writethrough "
                  f"({human(st.dirty_bytes)}): after an unclean shutdown dm-cache marks "
                  "every block it held dirty (the origin has them), or the device was "
                  "switched from writeback while dirty; writing them back takes the "
                  "cache's bandwidth" + (f", at {pace:.0f} blocks a second, about "
                                          f"{eta / 60:.0f} min more" if eta else
                                          ", and none was written back in the window"),
                  f"cachemgr drain {_dm_target(d)}", dirty_blocks=st.dirty,
                  dirty_blocks_before=was, blocks_used=st.used,
                  blocks_written_back_per_s=None if pace is None else round(pace, 1),
                  migration_threshold=st.migration_threshold)


def _smq_back(d: DmCacheDevice) -> str:
    """The command that puts smq back: lvm2's for an LVM cache, else the same table with
    policy smq (its default arguments) loaded and resumed."""
    if d.lvm is not None:
        return f"lvchange --cachepolicy smq {d.lvm.vg}/{d.lvm.lv}"
    name = shlex.quote(d.name)
    line = d.table.with_policy("smq", ()).line()
    return (f"dmsetup suspend {name} && dmsetup reload {name} --table '{line}' && "
            f"dmsetup resume {name}")
