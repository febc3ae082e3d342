"""Write-back traffic, measured: the bytes bcache wrote back to each backing device per
second between two looks (issue #34 item 5), never its ``writeback_rate`` setting.

bcache counts no written-back bytes of its own (no sysfs file; its ``writeback_rate`` is the
PI controller's setting, 512 KiB/s on a clean idle device). What the kernel does count
(docs/kernel-notes.md, "Write-back traffic"):

* the backing device's ``stat`` write sectors: every write that reached it, the written-back
  data and the writes bcache passed through (writethrough, writearound, a bypassed write);
* the bcache device's ``stat`` write sectors: every write the VMs sent; a write reaches the
  backing device at most once, so the passed-through bytes are at most these;
* ``dirty_data``: it falls only by what was written back (or overwritten by a bypassed
  write, which reached the backing device too).

So between two looks ``written back >= max(backing - bcache, dirty before - dirty after)``
and ``<= backing``; :func:`written_back` is that lower bound, capped by the upper one. It is
exact while the bcache device is not written (a drain, an idle device: 0), and with writes
in writethrough mode; while VMs write in writeback mode it may read low (their cached writes
hide the same amount of write-back in the first term). ``dirty_data``'s bounds are
bch_hprint's (the lower one before, the upper one after).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cachemgr.backends import blockdev
from cachemgr.backends.scancache import ScanCache
from cachemgr.core.errors import KernelFormatError
from cachemgr.core.model import BcacheBacking, Size
from cachemgr.core.sysfs import Sysfs


@dataclass(frozen=True)
class Look:
    """One device's counters at one moment."""

    t: float  # monotonic seconds
    backing_written: int | None  # bytes written to the backing device since boot
    upper_written: int | None  # bytes written to the bcache device since boot
    dirty: Size | None
    # reads + writes completed on the bcache device since boot (the same ``stat``: the TUI's
    # IOPS, tui/history.py, without reading the file a second time)
    upper_ios: int | None = None


def _stat(sysfs: Sysfs, name: str | None, dirs: dict[str, str]) -> blockdev.BlockStat | None:
    rel = dirs.get(name) if name else None
    text = sysfs.read_opt(f"{rel}/stat") if rel else None
    try:
        return blockdev.BlockStat.parse(text) if text else None
    except KernelFormatError:
        return None


def look(sysfs: Sysfs, b: BcacheBacking, t: float, cache: ScanCache | None = None) -> Look:
    """Two reads: the backing device's and the bcache device's ``stat``."""
    dirs = blockdev.block_dirs(sysfs, cache)
    low, up = _stat(sysfs, b.identity.name, dirs), _stat(sysfs, b.device_name, dirs)
    return Look(t, low.write_sectors * 512 if low else None,
                up.write_sectors * 512 if up else None, b.dirty,
                up.reads + up.writes if up else None)


def written_back(before: Look, after: Look) -> float | None:
    """Bytes per second written back between two looks (the lower bound above); None when
    a counter is missing or went backwards (a device replaced under the same key)."""
    dt = after.t - before.t
    if (dt <= 0 or before.backing_written is None or after.backing_written is None
            or before.upper_written is None or after.upper_written is None):
        return None
    backing = after.backing_written - before.backing_written
    upper = after.upper_written - before.upper_written
    if backing < 0 or upper < 0:
        return None
    low = max(0, backing - upper)
    if before.dirty is not None and after.dirty is not None:
        low = max(low, before.dirty.low - after.dirty.high)
    return min(low, backing) / dt


class Meter:
    """A poller's memory of the last look at each backing device (by its key): ``update``
    answers each device's written-back bytes per second since the poller's previous call
    (None on the first, or for a device not seen then)."""

    def __init__(self) -> None:
        self._last: dict[str, Look] = {}
        # the last update's reads + writes completed, by bcache device name (bcache0)
        self.completed: dict[str, int] = {}

    def update(self, sysfs: Sysfs, backings: Iterable[BcacheBacking], t: float,
               cache: ScanCache | None = None) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        seen: dict[str, Look] = {}
        completed: dict[str, int] = {}
        for b in backings:
            now = look(sysfs, b, t, cache)
            prev = self._last.get(b.key)
            out[b.key] = written_back(prev, now) if prev is not None else None
            seen[b.key] = now
            if b.device_name and now.upper_ios is not None:
                completed[b.device_name] = now.upper_ios
        self._last, self.completed = seen, completed
        return out
