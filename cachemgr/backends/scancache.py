"""What a poll need not read again: the reads that cannot change while the kernel sends no
uevent.

A poller (the TUI, ``status --watch``, the metrics listener) keeps one :class:`ScanCache` and
hands it to every :func:`cachemgr.backends.snapshot.take`. Each scan starts with one read of
``kernel/uevent_seqnum``, the kernel's count of the uevents it has sent
(kernel/ksysfs.c; ``kobject_uevent_env`` increments it for each event): while it reads the
same, no block device was added, removed, renamed or resized, no bcache device was created or
stopped and no label written, no device-mapper table went live (a resume sends a change
event), so the identities (size, serial, WWN, model, dm name), the device list with its
partitions, bcache's backing UUID and label and ``dmsetup table`` are still what the last
scan read. Any other value, another tree, or a tree without that file (a capture made before
the file was captured) empties the cache: correctness never depends on it, only the cost of
a poll does. Facts and the lab check: docs/kernel-notes.md, "uevent_seqnum".

What changes without a uevent and is shown in the table or used by the health model is
never kept here: modes, states, dirty data, rates, the hits and misses, ``io_errors``, links
to a cache set (a cache device registers without one), the dm-cache status.

The values a poll does not read (issue #34): the tunables and counters that neither the
table nor the health model use (a backing device's ``writeback_percent``,
``writeback_delay``, ``sequential_cutoff``, ``writeback_rate_minimum``,
``writeback_running``, ``io_error_limit``, ``stop_when_cache_set_failed``, ``running`` and
its ``stats_total`` bypass counters; a cache set's and a cache device's alike: bcache.py
names them) are read by every full scan (``stats=True``) and
kept here by :meth:`ScanCache.kept`; a poll (``stats=False``) takes them from here. So every
snapshot has every field (nothing shows "-" between two full reads), and a kept value is

* read again by the next full scan (the TUI's every 15 s, and every poll while its detail
  view is open);
* dropped when this process wrote to sysfs since the last scan (``core/sysfs.writes``: a
  tune, a drain's settings, any change cachemgr makes through the gate), so cachemgr's own
  change shows on the next poll;
* dropped after ``keep`` seconds (15 by default; the metrics listener keeps nothing: its
  scrapes read them all) and with everything else on a uevent.

A value changed behind cachemgr's back (another process, ``echo > /sys/...``) is thus seen at
the next full scan, ``keep`` seconds at the latest. bcache's ``stats_total`` counters move
only when the kernel folds its counters, every ~13.6 s (stats.c, ``accounting_delay``),
so a kept bypass counter is at most one fold behind.

The state directory's journals, lock files, protect record and the dm-cache records are
not the kernel's and no uevent tells of them: ``ScanCache.state`` (core/state.py ``Kept``)
keeps what ``ops.cache.status`` read of them while their directories' and files' times say
nothing changed (``keep`` seconds at most), and reads which locks are held from /proc/locks
at every poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from cachemgr.core import state
from cachemgr.core import sysfs as sysfs_mod
from cachemgr.core.sysfs import Sysfs

T = TypeVar("T")

SEQNUM = "kernel/uevent_seqnum"
KEEP = 15.0  # seconds a value a poll does not read is kept (the TUI's full read's pace)


class ScanCache:
    """``keep``: seconds a value a poll does not read is kept (0: a poll reads them all);
    ``clock``: monotonic seconds (tests)."""

    def __init__(self, *, keep: float = KEEP,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._root: Path | None = None
        self._seqnum: str | None = None
        self._data: dict[Hashable, Any] = {}
        self.keep = keep
        self.clock = clock
        self._kept: dict[Hashable, tuple[float, Any]] = {}  # key -> (scan's time, value)
        self._writes: int | None = None
        self._now: float | None = None
        self.invalidations = 0  # how often a scan found the cache stale (tests, benchmarks)
        # the state directory's journals, lock files and records as the last poll read them
        # (ops.cache.status; core/state.py Kept: kept while they do not change, never on a
        # uevent's account, ``keep`` seconds at most)
        self.state = state.Kept(keep=keep, clock=clock)
        # the poller's kernel log reader (backends/kernlog.py: only new records read at each
        # poll; ops.cache.status makes it)
        self.kernlog: Any = None

    def begin(self, sysfs: Sysfs) -> None:
        """At the start of a scan: keep the entries only if no uevent was sent since the last
        one (one read); the kept values (:meth:`kept`) only if also this process wrote
        nothing to sysfs since."""
        seq = sysfs.read_opt(SEQNUM)
        writes = sysfs_mod.writes()
        if seq is None or seq != self._seqnum or sysfs.root != self._root:
            if self._data:
                self.invalidations += 1
            self._data.clear()
            self._kept.clear()
        elif writes != self._writes:
            self._kept.clear()
        self._root, self._seqnum, self._writes = sysfs.root, seq, writes
        self._now = self.clock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        try:
            return self._data[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._data[key] = make()
            return value

    def kept(self, key: Hashable, read: Callable[[], T], *, fresh: bool) -> T:
        """A value a poll does not read: ``read()`` when ``fresh`` (a full scan), when none
        is kept or it is ``keep`` seconds old (counted from the start of the scan that read
        it); else the kept one (module docstring)."""
        now = self._now if self._now is not None else self.clock()
        if not fresh:
            hit = self._kept.get(key)
            if hit is not None and now - hit[0] < self.keep:
                return hit[1]  # type: ignore[no-any-return]
        value = read()
        self._kept[key] = (now, value)
        return value

    def clear(self) -> None:
        self._data.clear()
        self._kept.clear()
        self.state.clear()


def once(sysfs: Sysfs, cache: ScanCache | None) -> ScanCache:
    """``cache`` for a scan, or a fresh one that lives for this scan only (a one-shot command
    still reads each identity once, not once per module that wants it)."""
    if cache is None:
        cache = ScanCache()
        cache.begin(sysfs)
    return cache
