"""A consistent snapshot of a writeback cache's origin (``cachemgr snapshot``, issue #46
item 2).

The origin of a writeback cache is not a consistent disk: its newest blocks are on the SSD
until written back (flashcache#116, EnhanceIO#63; seen on the lab kernel: an LVM snapshot of
a bcache backing LV taken with the filesystem frozen but 40 MiB dirty in the cache has no
ext4 superblock at all, docs/kernel-notes.md). So, in order:

1. drain the device while the VMs run (``drain --max-latency``'s paced drain, the same
   function), until no more than ``rest`` bytes are dirty;
2. the moment a drain reading shows ``rest`` or less (and writeback seen moving): freeze the
   filesystem on it (fsfreeze: its dirty pages are written into the cache, and no new
   write reaches the device); a device clean from the start is switched to writethrough
   first, the freeze's writes then reach the origin too;
3. the same drain, unthrottled, until bcache's dirty data reads 0 twice (the rest);
4. the origin's snapshot (lvcreate --snapshot), while still frozen and clean;
5. thaw, the mode back; 6. the drain has put back every tunable it changed
   (procedures/drain.py).

The filesystem is frozen for the rest's drain and the snapshot only: ``max_freeze`` bounds
it (exceeded: thawed, nothing snapshotted, exit 5).

Journaled (``snapshot/KEY.json``, its ``phase``: draining, frozen, snapshotting,
snapshotted) before each step, so a run killed outright is finished by the next ``snapshot``
of the device or by ``cachemgr restore`` (:func:`recover`): a filesystem it may have left
frozen is thawed, the cache mode put back, and a snapshot it took (phase snapshotting or
snapshotted, written only once the device read clean while frozen) is named as
consistent. The drain's own journal puts its tunables back (procedures/drain.py). While the
process lives, a guard process thaws the filesystem the moment it dies
(backends/fsfreeze.py ``Guard``), so VMs never wait for the next command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachemgr.backends import fsfreeze
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.backends.lvm import snap as lvsnap
from cachemgr.core import signals, state
from cachemgr.core.errors import AlreadyError, CacheMgrError, TimeoutExpired
from cachemgr.core.model import CacheMode, DrainProgress, human
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import kinds

log = logging.getLogger(__name__)

KIND = "snapshot"
PHASES = ("draining", "frozen", "snapshotting", "snapshotted")
# Fault injection for the crash tests: SIGKILL ourselves right after this phase is journaled
# (and, for "frozen", after the freeze itself).
KILL_AT_ENV = "CACHEMGR_FAULT_SNAPSHOT_KILL"
REST = 4 << 20  # bytes dirty at most when the filesystem is frozen
MAX_FREEZE = 10.0  # seconds frozen at most (the rest's drain and the snapshot)
POLL = 0.05  # seconds between two readings of the rest's dirty data, frozen


class _RestDone(Exception):
    """Frozen, the drain read no dirty data twice: the rest is on the origin (raised from
    the drain's progress callback, which stops the drain; it puts its tunables back)."""


class FreezeTooLong(TimeoutExpired):
    """The rest did not drain (or the snapshot did not come) within ``max_freeze``."""


@dataclass(frozen=True)
class Request:
    device: str  # the cached device (/dev/bcache0)
    keys: tuple[str, ...]  # its lock keys (the journal claims them)
    mountpoint: str  # the filesystem on it, frozen for the snapshot
    origin: str  # what is snapshotted (VG/LV)
    snapshot: str  # the snapshot to make (VG/NAME)
    rest: int = REST
    max_freeze: float = MAX_FREEZE

    @property
    def key(self) -> str:
        return self.keys[0]


class Steps(Protocol):
    """What the sequence does to the host (ops/snapshot.py gives the live ones; unit tests
    give recording fakes)."""

    def drain(self, progress: Callable[[DrainProgress], None]) -> None:
        """Drain to clean, calling ``progress`` after each reading; AlreadyError when clean
        from the start. Puts back every tunable it changed, also when ``progress`` raises."""

    def dirty_bytes(self) -> int | None:
        """Dirty bytes now (None: not known)."""

    def mode(self) -> str | None:
        """The cache mode now (the kernel's word)."""

    def set_mode(self, mode: str) -> None:
        """Switch the cache mode (already so is fine)."""

    def freeze(self) -> None: ...

    def unpace(self) -> None:
        """The drain at full speed from now on (frozen: the VMs' writes wait on it). Only
        inside :meth:`drain` (from ``progress``): the drain journaled the settings it
        changes and puts them back; outside it, what is written stays."""

    def thaw(self) -> bool:
        """False when it was not frozen."""

    def snapshot(self) -> None: ...

    def snapshot_exists(self) -> bool: ...


@dataclass
class Taken:
    device: str
    snapshot: str
    origin: str
    mountpoint: str
    start_dirty: int | None = None  # at the first drain reading
    dirty_at_freeze: int | None = None
    freeze_s: float = 0.0  # frozen: from the freeze to the thaw
    snapshot_s: float = 0.0  # of which lvcreate
    drain_s: float = 0.0  # before the freeze
    rest_s: float = 0.0  # frozen, until clean (the freeze itself included)
    freeze_call_s: float = 0.0  # the freeze itself (the filesystem writes its dirty pages)
    total_s: float = 0.0
    drain_note: str | None = None  # the drain's last words before the freeze (its pace)
    recovered: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "snapshot": self.snapshot, "origin": self.origin,
                "mountpoint": self.mountpoint, "start_dirty_bytes": self.start_dirty,
                "dirty_bytes_at_freeze": self.dirty_at_freeze,
                "freeze_seconds": round(self.freeze_s, 3),
                "snapshot_seconds": round(self.snapshot_s, 3),
                "drain_seconds": round(self.drain_s, 2),
                "rest_seconds": round(self.rest_s, 3),
                "freeze_call_seconds": round(self.freeze_call_s, 3),
                "seconds": round(self.total_s, 2),
                "drain_note": self.drain_note, "recovered": self.recovered}


def journal_path(key: str):  # type: ignore[no-untyped-def]
    return state.journal_path(KIND, key)


def _record(req: Request, phase: str, started: float, mode: str | None) -> None:
    state.write_json(journal_path(req.key), {
        "device": req.device, "keys": list(req.keys), "mountpoint": req.mountpoint,
        "origin": req.origin, "snapshot": req.snapshot, "phase": phase, "started": started,
        "mode": mode, "pid": os.getpid()})
    if os.environ.get(KILL_AT_ENV) == phase and phase != "frozen":
        os.kill(os.getpid(), signal.SIGKILL)


def take(req: Request, steps: Steps, *, report: Callable[[DrainProgress], None] | None = None,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> Taken:
    """The sequence (module docstring). The caller holds the device's locks (the gate) and
    has run :func:`recover` for an interrupted run first."""
    out = Taken(req.device, req.snapshot, req.origin, req.mountpoint)
    t0 = clock()
    started = time.time()
    frozen_at: float | None = None
    tried = False  # a freeze was asked for (a failed or timed-out one may still have frozen)
    mode0 = steps.mode()
    last: int | None = None  # the drain's reading before
    switched = False  # writethrough while frozen (put back after the thaw)

    def freeze_now(dirty: int | None, *, through: bool = False) -> None:
        nonlocal frozen_at, tried, switched
        _record(req, "frozen", started, mode0)  # first: a crash from here thaws
        if through and mode0 == "writeback":
            # clean from the start: no drain is writing back, and bcache's writeback
            # thread may sleep its writeback_delay (30 s by default, nothing cuts it
            # short: procedures/drain.py) before it writes what the freeze writes (ext4
            # writes its journal out to the blocks' homes). In writethrough that goes to
            # the origin as well. Not while a drain runs: the freeze then writes through
            # to the disk at its pace (lab: 6.6 s frozen in writethrough against 0.2-0.5 s)
            switched = True
            steps.set_mode("writethrough")
        tried = True
        frozen_at = clock()  # the VMs' writes may wait from here
        steps.freeze()
        out.freeze_call_s = clock() - frozen_at
        log.info("%s: frozen in %.2f s at %s dirty", req.mountpoint, out.freeze_call_s,
                 "?" if dirty is None else human(dirty))
        out.drain_s = frozen_at - t0
        out.dirty_at_freeze = dirty
        if os.environ.get(KILL_AT_ENV) == "frozen":
            os.kill(os.getpid(), signal.SIGKILL)

    def too_long(what: str) -> FreezeTooLong:
        assert frozen_at is not None
        return FreezeTooLong(
            f"{req.device}: {what} within --max-freeze {req.max_freeze:g} s of the freeze "
            f"of {req.mountpoint} ({clock() - frozen_at:.1f} s): thawed, nothing was "
            "snapshotted",
            hint=f"drain it first while the VMs are quiet (cachemgr drain {req.device}), "
                 "or allow a longer freeze (--max-freeze) or a smaller rest (--rest)")

    def wait_rest() -> None:
        """Frozen: poll the dirty data until it reads 0 twice, POLL s apart, then stop the
        drain (_RestDone; it puts its tunables back). bcache's dirty_data counts the
        sectors of dirty keys, and a key turns clean only once its write to the backing
        device completed (writeback.c, write_dirty_finish): 0 twice is every block on the
        origin. Not the drain's own end: it reads every second while paced and waits for
        the state to read clean as well, which bcache writes only after a pass over the
        index: seconds more of freeze. The drain's settings (unthrottled: unpace) hold while
        this polls."""
        assert frozen_at is not None
        zero_seen = False
        while True:
            left = steps.dirty_bytes()
            if left == 0:
                if zero_seen:
                    raise _RestDone
                zero_seen = True
            else:
                zero_seen = False
            if clock() - frozen_at > req.max_freeze:
                raise too_long(f"still {'?' if left is None else human(left)} dirty")
            sleep(POLL)

    def progress(p: DrainProgress) -> None:
        if report is not None:
            report(p)
        if out.start_dirty is None:
            out.start_dirty = p.dirty_bytes
        nonlocal last
        # writeback is seen moving (a reading lower than the one before), or nothing is
        # dirty: only then the freeze. At the drain's start bcache's writeback thread may
        # still sleep its writeback_delay (30 s by default, nothing cuts it short:
        # procedures/drain.py); frozen then, the rest would wait for it (seen on the lab
        # kernel: a device left with 4 MiB dirty, frozen at the drain's first reading,
        # wrote nothing back within --max-freeze)
        moving = p.dirty_bytes is not None and last is not None and p.dirty_bytes < last
        last = p.dirty_bytes
        if frozen_at is None:
            out.drain_note = p.note or out.drain_note
            if p.dirty_bytes is not None and p.dirty_bytes <= req.rest \
                    and (p.dirty_bytes == 0 or moving):
                freeze_now(p.dirty_bytes)
                steps.unpace()
                wait_rest()
        else:  # the drain after a freeze of a device clean from the start
            steps.unpace()
            wait_rest()

    def drain() -> None:
        with contextlib.suppress(AlreadyError, _RestDone):
            steps.drain(progress)

    _record(req, "draining", started, mode0)
    try:
        drain()
        if frozen_at is None:  # clean from the start: the freeze still writes its pages
            now = steps.dirty_bytes()
            if out.start_dirty is None:
                out.start_dirty = now
            freeze_now(now, through=True)
            drain()
        out.rest_s = clock() - frozen_at if frozen_at is not None else 0.0
        log.info("%s: the rest drained %.2f s after the freeze", req.device, out.rest_s)
        left = steps.dirty_bytes()
        if left != 0:
            raise CacheMgrError(
                f"{req.device}: {'an unknown amount' if left is None else human(left)} "
                f"dirty after the drain while {req.mountpoint} was frozen: thawed, nothing "
                "was snapshotted",
                hint=f"cachemgr status {req.device}; cachemgr drain {req.device}")
        assert frozen_at is not None
        if clock() - frozen_at > req.max_freeze:
            raise too_long("the drain ended, but not")
        _record(req, "snapshotting", started, mode0)
        s0 = clock()
        steps.snapshot()
        out.snapshot_s = clock() - s0
        _record(req, "snapshotted", started, mode0)
    finally:
        if tried:
            with signals.deferred():  # a signal now waits until the VMs can write again
                steps.thaw()
            if frozen_at is not None:
                out.freeze_s = clock() - frozen_at
        if switched and mode0 is not None:
            with signals.deferred():
                steps.set_mode(mode0)
        # thawed (a thaw that failed raised: the journal stays for restore); the drain put
        # its tunables back
        journal_path(req.key).unlink(missing_ok=True)
    out.total_s = clock() - t0
    return out


@dataclass(frozen=True)
class Interrupted:
    """An interrupted run's journal, read back."""

    device: str
    keys: frozenset[str]
    mountpoint: str
    origin: str
    snapshot: str
    phase: str
    started: float | None
    path: str
    mode: str | None = None  # the cache mode before the freeze (writethrough while frozen)


def load(data: dict[str, Any], path: str) -> Interrupted | None:
    """A journal's content checked field by field (None: not a snapshot journal)."""
    keys = data.get("keys")
    vals = [data.get(k) for k in ("device", "mountpoint", "origin", "snapshot", "phase")]
    if not (isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys)
            and all(isinstance(v, str) and v for v in vals) and data.get("phase") in PHASES
            and str(data.get("mountpoint", "")).startswith("/")):
        return None
    started, mode = data.get("started"), data.get("mode")
    device, mountpoint, origin, snapshot, phase = (str(v) for v in vals)
    return Interrupted(device, frozenset(keys), mountpoint, origin, snapshot, phase,
                       float(started) if isinstance(started, int | float) else None, path,
                       mode if isinstance(mode, str) and mode else None)


def interrupted(key: str) -> Interrupted | None:
    p = journal_path(key)
    d = state.read_json(p)
    if d is None:
        return None
    j = load(d, str(p))
    if j is None:
        raise state.StateFileError(p, "not a snapshot journal")
    return j


def recover(j: Interrupted, *, thaw: Callable[[str], bool], exists: Callable[[str], bool],
            set_mode: Callable[[str, str], bool]) -> list[str]:
    """Finish what the interrupted run ``j`` left: thaw its filesystem (from the freeze on),
    say whether its snapshot was taken (and so is consistent), remove its journal. The
    words. The caller holds the device's locks."""
    said = []
    if j.phase != "draining":
        with signals.deferred():
            was = thaw(j.mountpoint)
        said.append(f"{j.mountpoint}: thawed (left frozen by an interrupted snapshot of "
                    f"{j.device})" if was else
                    f"{j.mountpoint}: not frozen (an interrupted snapshot of {j.device} had "
                    "frozen it; it was thawed since)")
        if j.mode == "writeback":
            put = set_mode(j.device, j.mode)
            said.append(f"{j.device}: cache mode {j.mode} put back (writethrough while "
                        "frozen)" if put else f"{j.device}: cache mode {j.mode} already")
    if j.phase in ("snapshotting", "snapshotted"):
        if exists(j.snapshot):
            said.append(f"{j.snapshot}: taken by the interrupted run while {j.mountpoint} "
                        f"was frozen and {j.device} clean: consistent, kept")
        else:
            said.append(f"{j.snapshot}: not taken (the run was interrupted before lvcreate "
                        "made it)")
    elif j.phase == "frozen":
        said.append(f"{j.snapshot}: not taken (the run was interrupted before it)")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(j.path)
    return said


class CacheSteps(Protocol):
    """The cache's part of the sequence (:class:`Steps`' drain, dirty_bytes, mode,
    set_mode, unpace), which its kind gives (``Kind.snapshot_cache``: the kinds that declare
    snapshot; procedures/kinds/bcache.py for bcache)."""

    def drain(self, progress: Callable[[DrainProgress], None]) -> None: ...

    def dirty_bytes(self) -> int | None: ...

    def mode(self) -> str | None: ...

    def set_mode(self, mode: str) -> None: ...

    def unpace(self) -> None: ...


class LiveSteps:
    """The live steps: the cache's own (its kind's :class:`CacheSteps`: the drain, paced
    under the command's ``--max-latency``, and its readings), fsfreeze with its guard,
    lvcreate --snapshot of the LVM LV that is the cache's origin."""

    def __init__(self, cache: CacheSteps, *, mountpoint: str, origin: str, name: str,
                 size: str | None, thin: bool) -> None:
        self.cache = cache
        self.mountpoint, self.origin, self.snap_name = mountpoint, origin, name
        self.size, self.thin = size, thin
        self.guard: fsfreeze.Guard | None = None

    def drain(self, progress: Callable[[DrainProgress], None]) -> None:
        self.cache.drain(progress)

    def dirty_bytes(self) -> int | None:
        return self.cache.dirty_bytes()

    def mode(self) -> str | None:
        return self.cache.mode()

    def set_mode(self, mode: str) -> None:
        self.cache.set_mode(mode)

    def unpace(self) -> None:
        self.cache.unpace()

    def freeze(self) -> None:
        self.guard = fsfreeze.Guard(self.mountpoint)
        fsfreeze.freeze(self.mountpoint)

    def thaw(self) -> bool:
        # a thaw that fails raises with the guard kept: it tries again when cachemgr exits
        was = fsfreeze.thaw(self.mountpoint)
        if self.guard is not None:
            self.guard.release()
            self.guard = None
        return was

    def snapshot(self) -> None:
        lvsnap.create(self.origin, self.snap_name.split("/", 1)[1], size=self.size,
                      thin=self.thin)

    def snapshot_exists(self) -> bool:
        return lvsnap.exists(self.snap_name)


def mode_setter(sysfs: Sysfs) -> Callable[[str, str], bool]:
    """:func:`recover`'s ``set_mode`` for cached devices named by their node
    (/dev/bcacheN): the device's kind switches it, on a fresh read; False when so
    already."""
    def put(device: str, mode: str) -> bool:
        snap = dataclasses.replace(snapshot_mod.take(sysfs, stats=False),
                                   others=kinds.scan_others(sysfs))
        k = kinds.find(snap, device, sysfs, kinds.devices_only())
        if k is None:
            raise CacheMgrError(f"{device}: not found to put its cache mode {mode} back",
                                hint=f"cachemgr mode {device} {mode}")
        try:
            k.set_mode(sysfs, CacheMode(mode))
        except AlreadyError:
            return False
        return True
    return put
