"""Cache hygiene for benchmarks: tunables changed for a run and restored at the end
(:class:`Hygiene`: mode, congestion thresholds, ``sequential_cutoff``, a disk's IO
scheduler), and a fresh cache set rebuilt before a run (:func:`fresh_cache`)."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

from cachemgr.backends import bcache, signatures, snapshot
from cachemgr.backends import scheduler as sched
from cachemgr.core import undo
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import CacheSet, Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.bench.sampling import _backing, _cache_set

log = logging.getLogger(__name__)


@dataclass
class Hygiene:
    """Tunables changed for the benchmark (restored at the end) and what was done."""

    sysfs: Sysfs
    notes: list[str] = field(default_factory=list)
    _restore: list[tuple[str, str, str]] = field(default_factory=list)  # (what, path, value)

    def set(self, what: str, path: str, value: str) -> None:
        before = self.sysfs.read(path).strip()
        if before.startswith("[") or " [" in before:  # bracketed choice (cache_mode)
            from cachemgr.core.model import parse_bracketed

            before = parse_bracketed(before)[0]
        if what.endswith("sequential_cutoff"):
            before = str(Size.parse_hprint(before).low)
        if before == value:
            return
        j = undo.current()
        if j is not None:  # on disk before the change: a session lost now still undoes it
            j.remember(what, path, before)
        self.sysfs.write(path, value)
        if not any(p == path for _, p, _ in self._restore):
            self._restore.append((what, path, before))
            note = f"{what}: {before} -> {value} (restored afterwards)"
            if note not in self.notes:  # set again for each run (the warm-up's cutoff)
                self.notes.append(note)

    def scheduler(self, disk: str, name: str) -> None:
        """Put whole disk ``disk`` on IO scheduler ``name`` for the next run, read back from
        sysfs (UsageError: the kernel has no such scheduler); the scheduler it had before
        the first change is put back by :meth:`restore`."""
        q = sched.read(self.sysfs, disk)
        if q.current == name:
            return
        path = f"block/{disk}/queue/scheduler"
        first = not any(p == path for _, p, _ in self._restore)
        if first and q.current is not None:
            # recorded before the write: a Ctrl-C or an error after it still restores it
            j = undo.current()
            if j is not None:
                j.remember(f"/dev/{disk} IO scheduler", path, q.current)
            self._restore.append((f"/dev/{disk} IO scheduler", path, q.current))
            self.notes.append(f"/dev/{disk} IO scheduler: {q.current}, set per target for "
                              f"its runs (restored afterwards)")
        sched.set_scheduler(self.sysfs, disk, name)

    def restore(self) -> None:
        """Put every changed setting back, newest first; the undo journal (core/undo.py)
        keeps only what could not be put back."""
        j = undo.current()
        failed = False
        for what, path, value in reversed(self._restore):
            try:
                self.sysfs.write(path, value)
            except CacheMgrError as exc:
                failed = True
                log.error("could not restore %s to %s: %s", what, value, exc)
            else:
                if j is not None:
                    j.forget(path)
        self._restore.clear()
        if j is not None and not failed:
            j.done()  # the entries put back earlier in the run (sequential_cutoff) too


def _backing_rel(sysfs: Sysfs, name: str) -> str:
    return bcache.backing_rel(sysfs, name)


def fresh_cache(sysfs: Sysfs, backing_name: str, *, timeout: float = 600) -> list[str]:
    """Rebuild the cache set of one backing device: detach (flushes), unregister, wipe and
    format the cache device again with the same bucket size, register, attach, same mode.

    A reused cache gives false hits (docs/kernel-notes.md, "Benchmarking traps"). Refused
    when the set serves other backing devices or flash volumes.
    """
    b = _backing(sysfs, backing_name)
    cset = _cache_set(sysfs, b)
    if cset is None or not cset.caches:
        raise UsageError(f"{b.device}: no cache attached; nothing to refresh")
    if cset.flash_volumes or set(cset.backing_names) - {backing_name}:
        raise UnsafeError(f"cache set {cset.uuid} serves other devices too; refusing to "
                          "rebuild it for a benchmark")
    cache = cset.caches[0]
    bucket = cache.bucket_size.bytes if cache.bucket_size else None
    mode = b.mode
    steps = [f"detach {b.device}"]
    bcache.detach(sysfs, b, timeout=timeout)
    bcache.unregister_cache_set(sysfs, _cache_set_by_uuid(sysfs, cset.uuid),
                                snapshot.take(sysfs).backings)
    node = cache.identity.node
    # the unregister is asynchronous: the kernel holds the device until its cache set is
    # gone, and a wipe before that fails with EBUSY (a cache that had served minutes of
    # reads, lab 7.2): wait for its bcache directory to go
    rel = bcache.block_dirs(sysfs).get(cache.identity.name)
    gone = time.monotonic() + 60
    while rel and sysfs.exists(f"{rel}/bcache") and time.monotonic() < gone:
        time.sleep(0.2)
    signatures.wipe(node)
    bcache.make_bcache(cache=node, bucket=f"{bucket // 1024}k" if bucket else None, wipe=True,
                       force=True)
    bcache.register(sysfs, node)
    new = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and new is None:
        for c in snapshot.take(sysfs).cache_sets:
            if any(x.identity.name == cache.identity.name for x in c.caches):
                new = c
        time.sleep(0.1)
    if new is None:
        raise TimeoutExpired(f"the new cache set on {node} did not appear")
    bcache.attach(sysfs, _backing(sysfs, backing_name), new)
    if mode is not None:
        with contextlib.suppress(AlreadyError):
            bcache.set_mode(sysfs, _backing(sysfs, backing_name), mode)
    steps.append(f"new cache set {new.uuid} on {node}, attached, mode {mode}")
    return steps


def _cache_set_by_uuid(sysfs: Sysfs, uuid: str) -> CacheSet:
    c = snapshot.take(sysfs).cache_set(uuid)
    if c is None:
        raise CacheMgrError(f"cache set {uuid} vanished")
    return c
