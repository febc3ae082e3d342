"""Trends for the sparklines: per device, hit ratio, dirty data and IOPS over recent polls.

Pure data (no textual). Hit ratio here is the ratio *between two polls* (from the counters'
deltas), not the kernel's five-minute figure: bcache folds its counters every ~13.6 s
(drivers/md/bcache/stats.c, accounting_delay), so between folds the delta is empty and the
last value is carried. IOPS come from the block layer's completed-IO counters of the cached
device (``/sys/block/<dev>/stat`` fields 1 and 5), which never wrap like bcache's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from tui import view


@dataclass(frozen=True)
class Sample:
    t: float
    hit: float | None  # 0..1
    dirty: int | None  # bytes
    iops: float | None
    wb: float | None = None  # bytes written back per second (procedures/traffic.py)


def completed_ios(sysfs: Sysfs, name: str | None) -> int | None:
    """Reads + writes completed, from ``block/<name>/stat`` (Documentation/block/stat.rst)."""
    if not name:
        return None
    text = sysfs.read_opt(f"block/{name}/stat")
    if not text:
        return None
    f = text.split()
    try:
        return int(f[0]) + int(f[4])
    except (IndexError, ValueError):
        return None


def counters(obj: view.Obj) -> tuple[int, int] | None:
    """(hits, misses) since the start, where the kernel counts them (its kind says: not for
    a writecache, which caches writes: its counters are no hit ratio)."""
    k = cache_ops.kind_of(obj)
    return k.hit_counters() if k is not None else None


def io_counts(sysfs: Sysfs, snap: Snapshot, rows: list[view.Row] | None = None,
              known: Mapping[str, int] | None = None) -> dict[str, int]:
    """Completed IOs per row key (read in the poll worker, next to the snapshot); ``rows``:
    the snapshot's, when made already; ``known``: the counts this poll has read already, by
    block device name (the write-back meter's, of the bcache devices: not read again)."""
    out: dict[str, int] = {}
    for r in view.rows(snap) if rows is None else rows:
        obj = view.find(snap, r.key)
        if obj is None:
            continue
        name = view.block_name(obj)
        n = known.get(name) if known and name else None
        if n is None:
            n = completed_ios(sysfs, name)
        if n is not None:
            out[r.key] = n
    return out


class History:
    """A ring of samples per device key; ``maxlen`` polls (10 min at the default 1 s)."""

    def __init__(self, maxlen: int = 600) -> None:
        self.maxlen = maxlen
        self.samples: dict[str, deque[Sample]] = {}
        self._last: dict[str, tuple[float, tuple[int, int] | None, int | None]] = {}

    def add(self, t: float, snap: Snapshot, ios: dict[str, int],
            wb: dict[str, float | None] | None = None,
            rows: list[view.Row] | None = None) -> None:
        for r in view.rows(snap) if rows is None else rows:
            obj = view.find(snap, r.key)
            if obj is None:
                continue
            cnt = counters(obj)
            io = ios.get(r.key)
            prev = self._last.get(r.key)
            ring = self.samples.setdefault(r.key, deque(maxlen=self.maxlen))
            hit: float | None = ring[-1].hit if ring else None
            iops: float | None = None
            if prev is not None:
                pt, pcnt, pio = prev
                dt = t - pt
                if cnt is not None and pcnt is not None:
                    dh, dm = cnt[0] - pcnt[0], cnt[1] - pcnt[1]
                    if dh >= 0 and dm >= 0 and dh + dm > 0:
                        hit = dh / (dh + dm)
                if io is not None and pio is not None and dt > 0 and io >= pio:
                    iops = (io - pio) / dt
            self._last[r.key] = (t, cnt, io)
            ring.append(Sample(t, hit, r.dirty_bytes, iops, (wb or {}).get(r.key)))

    def series(self, key: str, what: str, n: int | None = None) -> list[float]:
        """Values for a sparkline (unknowns as 0), the last ``n`` samples."""
        ring = list(self.samples.get(key, ()))
        if n is not None:
            ring = ring[-n:]
        vals: list[float] = []
        for s in ring:
            v = getattr(s, what)
            vals.append(float(v) if v is not None else 0.0)
        return vals

    def last(self, key: str) -> Sample | None:
        ring = self.samples.get(key)
        return ring[-1] if ring else None
