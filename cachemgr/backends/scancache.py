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

What changes without a uevent is never kept here: modes, states, dirty data, rates,
tunables, the counters, links to a cache set (a cache device registers without one), the
dm-cache status.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from cachemgr.core.sysfs import Sysfs

T = TypeVar("T")

SEQNUM = "kernel/uevent_seqnum"


class ScanCache:
    def __init__(self) -> None:
        self._root: Path | None = None
        self._seqnum: str | None = None
        self._data: dict[Hashable, Any] = {}
        self.invalidations = 0  # how often a scan found the cache stale (tests, benchmarks)

    def begin(self, sysfs: Sysfs) -> None:
        """At the start of a scan: keep the entries only if no uevent was sent since the last
        one (one read)."""
        seq = sysfs.read_opt(SEQNUM)
        if seq is None or seq != self._seqnum or sysfs.root != self._root:
            if self._data:
                self.invalidations += 1
            self._data.clear()
        self._root, self._seqnum = sysfs.root, seq

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        try:
            return self._data[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._data[key] = make()
            return value

    def clear(self) -> None:
        self._data.clear()


def once(sysfs: Sysfs, cache: ScanCache | None) -> ScanCache:
    """``cache`` for a scan, or a fresh one that lives for this scan only (a one-shot command
    still reads each identity once, not once per module that wants it)."""
    if cache is None:
        cache = ScanCache()
        cache.begin(sysfs)
    return cache
