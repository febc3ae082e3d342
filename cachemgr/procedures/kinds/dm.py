"""device-mapper caches: a dm-cache device cachemgr made or found (``dm-cache``), the caches
lvm2 owns (``lvmcache``, ``lvm-writecache``: changed through lvm2 only), and a dm-writecache
device LVM does not describe (``dm-writecache``: shown, never changed)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cachemgr.backends import dmcache
from cachemgr.backends.bcache import Change
from cachemgr.backends.dmcache import flushing
from cachemgr.backends.lvm import manage as lvm_manage
from cachemgr.core import state
from cachemgr.core.errors import CacheMgrError, UnsafeError
from cachemgr.core.model import (
    DM_CACHE_MODES,
    CacheMode,
    DmCacheDevice,
    DmWritecacheDevice,
    LvmCachedLv,
    Snapshot,
    human,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import owners
from cachemgr.procedures.kinds.base import Drained, Kind, ProgressFn, Switched

WRITECACHE_CONSEQUENCE = ("dm-writecache has only writeback: new writes land in the cache "
                          "first and are dirty until written back.")


class _Dm(Kind):
    """What every dm device answers alike: its names."""

    obj: DmCacheDevice | DmWritecacheDevice

    def names(self) -> set[str]:
        x = self.obj
        out = {x.name, x.node, x.kernel_name, f"/dev/{x.kernel_name}"}
        if x.uuid:
            out.add(x.uuid)
        return out

    def kernel_names(self) -> set[str]:
        return {self.obj.kernel_name}

    @property
    def node(self) -> str:
        return self.obj.node

    # a dm-cache device whose status line cachemgr could not read (model.DmCacheDevice
    # raw_status): its state and dirty data are unknown, so nothing is offered or done
    def can(self, action: str) -> bool:
        return not _unread(self.obj) and super().can(action)

    def refusal(self, action: str) -> CacheMgrError | None:
        if _unread(self.obj):
            return UnsafeError(
                f"{self.node}: cachemgr cannot read its dm-cache status line, so its state "
                f"and dirty data are unknown: it refuses to {action} it; nothing was changed",
                hint=f"the kernel printed: {getattr(self.obj, 'raw_status', '?')} (cachemgr "
                     "status --json: raw_status); change it with dmsetup or lvm2 yourself")
        return super().refusal(action)


def _unread(obj: object) -> bool:
    return isinstance(obj, DmCacheDevice) and obj.unread


class DmCache(_Dm):
    """A dm-cache device LVM does not own."""

    name = "dm-cache"
    title = "dm-cache device"
    drain_word = "flush"
    root_in_backend = True
    modes = tuple(DM_CACHE_MODES)
    actions = frozenset({"mode", "drain", "remove", "tune", "replace", "bench"})
    drain_how = ("cachemgr loads the cleaner policy (in writethrough) until every block is "
                 "clean, then reloads the original table; on cancel or error the original "
                 "table is put back.")
    obj: DmCacheDevice

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        return snap.dmcaches

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, DmCacheDevice) and obj.lvm is None

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        return ((owners.dmcache_key(self.obj.name), self.node),
                (owners.cache_key(self.obj.name), self.node))

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return dmcache.set_mode(sysfs, self.obj, mode)

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None) -> Switched:
        """dm-cache refuses passthrough while dirty: ``drain`` flushes, then loads the new
        mode (already in it: only the flush)."""
        if drain and self.mode == new:
            return Switched([], [], as_drain=True)
        return super().switch_mode(sysfs, new, drain=drain, timeout=timeout,
                                   stall_timeout=stall_timeout, progress=progress)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained:
        r = dmcache.flush(sysfs, self.obj, timeout=timeout, stall_timeout=stall_timeout,
                          progress=progress, final_mode=final_mode)
        restored: dict[str, Any] = dict(r.restored)
        if final_mode is not None:
            restored = {"mode": final_mode.value, "policy": self.obj.table.policy,
                        "switched": bool(r.final_table)}
        return Drained(r.device, r.start_bytes, r.elapsed_s, restored)

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        """Put back the table an interrupted flush left, holding the device's lock (the one
        dmcache.flush takes): a flush running in another process is never undone under it
        (refused, exit 3, nothing changed). The journal is read under the lock; one that
        cannot be read is refused (exit 2, its path and why)."""
        with state.locked(flushing.lock_key(self.obj), self.obj.node):
            path = flushing.journal(self.obj)
            saved = state.read_json(path)
            if saved is None:
                return {}
            if not (isinstance(saved.get("original"), str) and saved["original"].strip()):
                raise state.StateFileError(path, "not a dm-cache flush journal: no 'original' "
                                                 "table")
            return dict(dmcache.restore_saved(sysfs, self.obj))

    def restored_note(self, restored: dict[str, Any]) -> str:
        return f"{self.node}: restored table {restored['table']}"

    def reread(self, sysfs: Sysfs) -> Kind:
        return DmCache(dmcache.find(sysfs, self.obj.name))

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        return dmcache.remove(sysfs, self.obj, keep_device=keep_device, timeout=timeout,
                              stall_timeout=stall_timeout, progress=progress)

    def tunables(self) -> dict[str, tuple[int, int]]:
        return {"migration_threshold": (0, 2**31 - 1)}

    def tunable(self, name: str) -> str:
        s = self.obj.status
        return str(s.migration_threshold if s is not None else "?")

    def check_tunable(self, name: str, value: int) -> None:
        if name != "migration_threshold":
            from cachemgr.core.errors import UsageError

            raise UsageError(f"unknown dm-cache tunable {name!r}",
                             hint="dm-cache has: migration_threshold (sectors)")

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        return dmcache.set_migration_threshold(sysfs, self.obj, value)

    def dirty_consequence(self, mode: CacheMode) -> str:
        return _consequence(self.obj, mode)


def _consequence(d: DmCacheDevice, mode: CacheMode) -> str:
    """A dm-cache device's (lvm2's too) dirty data on a switch to ``mode``."""
    dirty = d.dirty_bytes
    if mode == CacheMode.PASSTHROUGH and (dirty is None or dirty > 0):
        return (f"{d.node} holds {human(dirty)} of dirty data: dm-cache accepts passthrough "
                "only when every block is clean, so a plain switch is refused; "
                "'switch + drain' flushes first, then loads passthrough.")
    if mode == CacheMode.WRITEBACK:
        return ("New writes will land in the cache first: they are dirty (lost if the "
                "cache device dies) until written back.")
    if dirty:
        return (f"{human(dirty)} of dirty data stays in the cache and keeps being written "
                "back; 'switch + drain' writes it back now.")
    return "The cache is clean: nothing is at risk."


class _Lvm(_Dm):
    """An LVM-owned cache, changed through lvm2 only."""

    actions = frozenset({"mode", "drain", "detach", "remove", "tune", "replace", "bench"})
    root_in_backend = True

    @property
    def lv(self) -> LvmCachedLv:
        assert self.obj.lvm is not None
        return self.obj.lvm

    def names(self) -> set[str]:
        return super().names() | {self.lv.full_name, f"/dev/{self.lv.vg}/{self.lv.lv}"}

    @property
    def node(self) -> str:
        return f"/dev/{self.lv.vg}/{self.lv.lv}"

    @property
    def target(self) -> str:
        return self.lv.full_name

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        return ((owners.lvm_key(self.lv.full_name), self.lv.full_name),
                (owners.cache_key(self.lv.full_name), self.lv.full_name))

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return lvm_manage.set_mode(self.obj, mode)

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None) -> Switched:
        """lvm2 drains with progress (its cleaner), then switches."""
        if not drain:
            return Switched([self.set_mode(sysfs, new)], [])
        before = self.lv.cache_mode or (self.mode.value if self.mode else "?")
        d = self.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                       progress=progress, final_mode=new)
        return Switched([Change(self.lv.full_name, "cache_mode", before, new.value)]
                        if d.restored.get("switched") else [],
                        [d.summary()] if d.start_bytes else [], d)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained:
        start, secs, restored, _ = lvm_manage.drain(
            self.obj, timeout=timeout, stall_timeout=stall_timeout, progress=progress,
            final_mode=final_mode)
        return Drained(self.lv.full_name, start, secs, restored)

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        return dict(lvm_manage.restore_interrupted(self.obj))

    def restored_note(self, restored: dict[str, Any]) -> str:
        return f"{self.lv.full_name}: restored " + ", ".join(
            f"{k} {v}" for k, v in restored.items())

    def reread(self, sysfs: Sysfs) -> Kind:
        return type(self)(lvm_manage.reread(self.obj))

    def detach(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        return lvm_manage.detach(self.obj, timeout=timeout, stall_timeout=stall_timeout,
                                 progress=progress)

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        """``lvconvert --uncache`` after a drain (``keep_device``: ``--splitcache``, the
        cache pool or cachevol kept). The LV stays either way."""
        if keep_device:
            return self.detach(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                               progress=progress)
        return lvm_manage.uncache(self.obj, timeout=timeout, stall_timeout=stall_timeout,
                                  progress=progress)

    def tunables(self) -> dict[str, tuple[int, int]]:
        return lvm_manage.tunables(self.obj)

    def tunable(self, name: str) -> str:
        v = self.lv.setting(name)
        return "?" if v is None else str(v)

    def check_tunable(self, name: str, value: int) -> None:
        lvm_manage.check_tunable(self.obj, name, value)

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        return lvm_manage.tune(self.obj, name, value)


class LvmCache(_Lvm):
    """An LV cached by lvm2's dm-cache (lvmcache)."""

    name = "lvmcache"
    title = "LVM cache"
    modes = tuple(lvm_manage.LVM_CACHE_MODES)
    obj: DmCacheDevice

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        return snap.dmcaches

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, DmCacheDevice) and obj.lvm is not None

    @property
    def drain_how(self) -> str:  # type: ignore[override]
        return ("cachemgr loads lvm2's cleaner policy (lvchange --cachepolicy cleaner: "
                "writethrough while it drains) until every block is clean, then puts the "
                f"{self.lv.policy or 'original'} policy back; on cancel or error too.")

    def dirty_consequence(self, mode: CacheMode) -> str:
        if mode != CacheMode.WRITEBACK and self.obj.dirty_bytes:
            return (f"{self.lv.full_name} holds {human(self.obj.dirty_bytes)} of dirty data: "
                    "a plain switch is refused (lvm2 would flush it with no progress); "
                    "'switch + drain' drains it with progress, then switches.")
        return _consequence(self.obj, mode)


class LvmWritecache(_Lvm):
    """An LV cached by lvm2's dm-writecache."""

    name = "lvm-writecache"
    title = "LVM writecache"
    modes = (CacheMode.WRITEBACK,)
    drain_how = ("cachemgr sets lvm2's cleaner=1 (lvchange --cachesettings) until every "
                 "block is written back, then cleaner=0; on cancel or error too.")
    obj: DmWritecacheDevice

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        return snap.writecaches

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, DmWritecacheDevice) and obj.lvm is not None

    def dirty_consequence(self, mode: CacheMode) -> str:
        return WRITECACHE_CONSEQUENCE


class DmWritecache(_Dm):
    """A dm-writecache device LVM does not describe: shown, never changed."""

    name = "dm-writecache"
    title = "dm-writecache device"
    modes = (CacheMode.WRITEBACK,)
    actions = frozenset()
    obj: DmWritecacheDevice

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        return snap.writecaches

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, DmWritecacheDevice) and obj.lvm is None

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        return ((owners.dmcache_key(self.obj.name), self.node),)

    def tunable(self, name: str) -> str:
        return self.obj.table.settings().get(name, "default")

    def refusal(self, action: str) -> CacheMgrError | None:
        return UnsafeError(f"{self.node} is a dm-writecache device LVM does not describe: "
                           "cachemgr shows it and changes writecaches only through lvm2; "
                           "nothing was changed",
                           hint="manage it with the tool that made it (dmsetup)")

    def dirty_consequence(self, mode: CacheMode) -> str:
        return WRITECACHE_CONSEQUENCE
