"""One small interface for every kind of cached device.

A bcache backing device (``/dev/bcacheN`` over its disk) and a dm-cache device
(``/dev/mapper/NAME``) answer the same questions and take the same orders: node, mode and the
modes allowed, dirty amount, drain until clean, remove. The command layer
(:mod:`cachemgr.ops`) works through this interface; only the adapters below know which
backend does the work. Kinds still to come (LVM-owned caches, dm-writecache) get an adapter
here and nothing else changes above.

"Unknown" has one meaning everywhere: ``dirty_bytes`` is ``None`` when the kernel's figure
cannot be trusted (a bcache backing device whose cache set is missing reads 0 while its state
says dirty; a failed dm-cache has no status), never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cachemgr.backends import bcache, dmcache
from cachemgr.backends.bcache import BCACHE_MODES, Change
from cachemgr.backends.dmcache import flushing
from cachemgr.backends.lvm import manage as lvm_manage
from cachemgr.backends.lvm.command import spelling as lvm_spelling
from cachemgr.backends.targets import find_dm, find_dmcache, resolve_backing
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, UnsafeError, UsageError
from cachemgr.core.model import (
    DM_CACHE_MODES,
    BcacheBacking,
    CacheMode,
    DmCacheDevice,
    DmWritecacheDevice,
    LvmCachedLv,
    Snapshot,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain as drain_mod

ProgressFn = Callable[[Any], None]


@dataclass(frozen=True)
class Drained:
    """What a drain did: the same fields for every kind."""

    device: str
    start_bytes: int | None
    elapsed_s: float
    restored: dict[str, Any]  # what was put back (tunables, or the table's mode and policy)

    def summary(self) -> str:
        from cachemgr.core.model import human

        return (f"{self.device}: clean after {self.elapsed_s:.1f} s "
                f"({human(self.start_bytes)} written back); {self.restored_words()}")

    def restored_words(self) -> str:
        if "cleaner" in self.restored:  # lvm writecache: its cleaner setting
            return f"writecache cleaner={self.restored['cleaner']} restored"
        if "policy" in self.restored:  # dm-cache: its table; lvmcache: its policy
            return (f"mode {self.restored.get('mode')} and policy {self.restored.get('policy')} "
                    "restored")
        return "tunables restored"


class CachedDevice(Protocol):
    """What every cached device answers (see the module docstring)."""

    @property
    def kind(self) -> str: ...  # "bcache" | "dm-cache" | "lvmcache" | "lvm-writecache"

    @property
    def node(self) -> str: ...  # the device VMs use: /dev/bcache0, /dev/mapper/NAME

    @property
    def mode(self) -> CacheMode | None: ...

    @property
    def modes_allowed(self) -> tuple[CacheMode, ...]: ...

    @property
    def dirty_bytes(self) -> int | None: ...  # None: unknown

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change: ...

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained: ...

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]: ...

    def reread(self, sysfs: Sysfs) -> CachedDevice: ...

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]: ...


@dataclass(frozen=True)
class BcacheDevice:
    """A bcache backing device and its /dev/bcacheN."""

    b: BcacheBacking

    @property
    def kind(self) -> str:
        return "bcache"

    @property
    def node(self) -> str:
        return self.b.device or self.b.identity.node

    @property
    def mode(self) -> CacheMode | None:
        return self.b.mode

    @property
    def modes_allowed(self) -> tuple[CacheMode, ...]:
        return tuple(BCACHE_MODES)

    @property
    def dirty_bytes(self) -> int | None:
        return self.b.dirty_bytes

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return bcache.set_mode(sysfs, self.b, mode)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained:
        if final_mode is not None:
            # bcache switches first and drains after: the kernel allows any mode while dirty
            try:
                bcache.set_mode(sysfs, self.b, final_mode)
            except AlreadyError:
                pass
        cur = bcache.reread(sysfs, self.b.identity.name)
        r = drain_mod.drain(sysfs, cur, timeout=timeout, stall_timeout=stall_timeout,
                            progress=progress)
        return Drained(r.device, r.start_bytes, r.elapsed_s, dict(r.restored))

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        return dict(drain_mod.restore_saved(sysfs, self.b))

    def reread(self, sysfs: Sysfs) -> CachedDevice:
        return BcacheDevice(bcache.reread(sysfs, self.b.identity.name))

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        """Detach (bcache flushes first), then stop the bcache device."""
        changes = []
        b = self.b
        if b.cset_uuid is not None:
            changes.append(bcache.detach(sysfs, b, timeout=timeout, progress=progress))
            b = bcache.reread(sysfs, b.identity.name)
        changes.append(bcache.stop_backing(sysfs, b))
        return changes


@dataclass(frozen=True)
class DmCache:
    """A dm-cache device (ours or, refused for changes, LVM's)."""

    d: DmCacheDevice

    @property
    def kind(self) -> str:
        return "dm-cache"

    @property
    def node(self) -> str:
        return self.d.node

    @property
    def mode(self) -> CacheMode | None:
        return self.d.mode

    @property
    def modes_allowed(self) -> tuple[CacheMode, ...]:
        return tuple(DM_CACHE_MODES)

    @property
    def dirty_bytes(self) -> int | None:
        return self.d.dirty_bytes

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return dmcache.set_mode(sysfs, self.d, mode)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained:
        r = dmcache.flush(sysfs, self.d, timeout=timeout, stall_timeout=stall_timeout,
                          progress=progress, final_mode=final_mode)
        restored: dict[str, Any] = dict(r.restored)
        if final_mode is not None:
            restored = {"mode": final_mode.value, "policy": self.d.table.policy,
                        "switched": bool(r.final_table)}
        return Drained(r.device, r.start_bytes, r.elapsed_s, restored)

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        """Put back the table an interrupted flush left, holding the device's lock (the one
        dmcache.flush takes): a flush running in another process is never undone under it
        (refused, exit 3, nothing changed). The journal is read under the lock; one that
        cannot be read is refused (exit 2, its path and why)."""
        with state.locked(flushing.lock_key(self.d), self.d.node):
            path = flushing.journal(self.d)
            saved = state.read_json(path)
            if saved is None:
                return {}
            if not (isinstance(saved.get("original"), str) and saved["original"].strip()):
                raise state.StateFileError(path, "not a dm-cache flush journal: no 'original' "
                                                 "table")
            return dict(dmcache.restore_saved(sysfs, self.d))

    def reread(self, sysfs: Sysfs) -> CachedDevice:
        return DmCache(dmcache.find(sysfs, self.d.name))

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        return dmcache.remove(sysfs, self.d, keep_device=keep_device, timeout=timeout,
                              stall_timeout=stall_timeout, progress=progress)


@dataclass(frozen=True)
class LvmCache:
    """An LVM-owned cache (lvmcache or lvm writecache), changed through lvm2 only."""

    d: DmCacheDevice | DmWritecacheDevice

    @property
    def lv(self) -> LvmCachedLv:
        assert self.d.lvm is not None
        return self.d.lvm

    @property
    def kind(self) -> str:
        return self.lv.kind  # "lvmcache" | "lvm-writecache"

    @property
    def node(self) -> str:
        return f"/dev/{self.lv.vg}/{self.lv.lv}"

    @property
    def mode(self) -> CacheMode | None:
        return self.d.mode

    @property
    def modes_allowed(self) -> tuple[CacheMode, ...]:
        if isinstance(self.d, DmWritecacheDevice):
            return (CacheMode.WRITEBACK,)
        return tuple(lvm_manage.LVM_CACHE_MODES)

    @property
    def dirty_bytes(self) -> int | None:
        return self.d.dirty_bytes

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return lvm_manage.set_mode(self.d, mode)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained:
        start, secs, restored, _ = lvm_manage.drain(
            self.d, timeout=timeout, stall_timeout=stall_timeout, progress=progress,
            final_mode=final_mode)
        return Drained(self.lv.full_name, start, secs, restored)

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        return dict(lvm_manage.restore_interrupted(self.d))

    def reread(self, sysfs: Sysfs) -> CachedDevice:
        return LvmCache(lvm_manage.reread(self.d))

    def detach(self, *, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        return lvm_manage.detach(self.d, timeout=timeout, stall_timeout=stall_timeout,
                                 progress=progress)

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        """``lvconvert --uncache`` after a drain (``keep_device``: ``--splitcache``, the
        cache pool or cachevol kept). The LV stays either way."""
        if keep_device:
            return self.detach(timeout=timeout, stall_timeout=stall_timeout, progress=progress)
        return lvm_manage.uncache(self.d, timeout=timeout, stall_timeout=stall_timeout,
                                  progress=progress)


def _plain_writecache(snap: Snapshot, target: str, sysfs: Sysfs) -> None:
    w = find_dm(snap, target, sysfs, lvm=False)
    if w is not None:
        raise UnsafeError(f"{w.node} is a dm-writecache device LVM does not describe: cachemgr "
                          "shows it and changes writecaches only through lvm2; nothing was "
                          "changed", hint="manage it with the tool that made it (dmsetup)")


def _find_dm(snap: Snapshot, target: str, sysfs: Sysfs) -> CachedDevice | None:
    """An LVM cache or a dm-cache device (their names never look like bcache's); a
    dm-writecache LVM does not describe is refused."""
    lv = find_dm(snap, target, sysfs, lvm=True)
    if lv is not None:
        return LvmCache(lv)
    _plain_writecache(snap, target, sysfs)
    dm = find_dmcache(snap, target, sysfs)
    return DmCache(dm) if dm is not None else None


def find(snap: Snapshot, target: str, sysfs: Sysfs) -> CachedDevice | None:
    """The cached device ``target`` names, or None when it names none."""
    dev = _find_dm(snap, target, sysfs)
    if dev is not None:
        return dev
    try:
        return BcacheDevice(resolve_backing(snap, target, sysfs))
    except UsageError:
        return None


def resolve(snap: Snapshot, target: str, sysfs: Sysfs) -> CachedDevice:
    """Like :func:`find`, but a target that names no cached device is a usage error (in
    bcache's words, the kind an admin most often means; an LV's spelling gets its own)."""
    dev = _find_dm(snap, target, sysfs)
    if dev is not None:
        return dev
    if lvm_spelling(target) is not None and not target.startswith("/dev/mapper/"):
        lvs_trouble = [w for w in snap.warnings if "lvs" in w]
        raise UsageError(f"{target} is not a cached LV" + (
            f" ({lvs_trouble[0]})" if lvs_trouble else ""),
            hint="cachemgr status lists the cached LVs; lvs -a shows LVM's view")
    return BcacheDevice(resolve_backing(snap, target, sysfs))
