"""bcache: a backing device with its /dev/bcacheN (``bcache``), and a cache set
(``bcache-set``: the SSD and the devices attached to it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cachemgr.backends import bcache
from cachemgr.backends.bcache import BCACHE_MODES, Change
from cachemgr.core.errors import AlreadyError
from cachemgr.core.model import BcacheBacking, CacheMode, CacheSet, Snapshot, human
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain as drain_mod
from cachemgr.procedures import owners
from cachemgr.procedures.kinds.base import Drained, Kind, ProgressFn, Switched


class Bcache(Kind):
    """A bcache backing device and its /dev/bcacheN."""

    name = "bcache"
    title = "bcache device"
    modes = tuple(BCACHE_MODES)
    actions = frozenset({"mode", "drain", "detach", "attach", "remove", "tune", "replace",
                         "bench", "force-run"})
    drain_how = ("cachemgr sets writeback_percent=0, writeback_delay=1 and writeback_running=1 "
                 "(saved first) and puts every value back at the end, on error and on cancel.")
    obj: BcacheBacking

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        return snap.backings

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, BcacheBacking)

    def names(self) -> set[str]:
        b = self.obj
        out = {b.identity.node}
        if b.device:
            out.add(b.device)
        if b.uuid:
            out |= {b.uuid, f"/dev/bcache/by-uuid/{b.uuid}"}
        return out

    def kernel_names(self) -> set[str]:
        return {n for n in (self.obj.device_name, self.obj.identity.name) if n}

    @property
    def node(self) -> str:
        return self.obj.device or self.obj.identity.node

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        own = ((owners.bcache_key(self.obj.key), self.node),)
        cset = self.obj.cset_uuid
        return own + (((owners.cache_key(cset), f"cache set {cset}"),) if cset else ())

    def can(self, action: str) -> bool:
        attached = self.obj.cset_uuid is not None
        if action in ("detach", "replace"):
            return attached
        if action == "attach":
            return not attached
        return super().can(action)

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return bcache.set_mode(sysfs, self.obj, mode)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None) -> Drained:
        if final_mode is not None:
            # bcache switches first and drains after: the kernel allows any mode while dirty
            try:
                bcache.set_mode(sysfs, self.obj, final_mode)
            except AlreadyError:
                pass
        cur = bcache.reread(sysfs, self.obj.identity.name)
        r = drain_mod.drain(sysfs, cur, timeout=timeout, stall_timeout=stall_timeout,
                            progress=progress)
        return Drained(r.device, r.start_bytes, r.elapsed_s, dict(r.restored))

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None) -> Switched:
        """bcache allows any switch while dirty (writeback goes on; a note says so);
        ``drain`` then drains in the new mode."""
        b = self.obj
        out = Switched([], [])
        try:
            out.changes = [bcache.set_mode(sysfs, b, new)]
        except AlreadyError:
            if not drain:
                raise
        if drain:
            try:
                out.drained = self.reread(sysfs).drain(
                    sysfs, timeout=timeout, stall_timeout=stall_timeout, progress=progress)
                out.notes.append(out.drained.summary())
            except AlreadyError:
                pass
        elif b.dirty and not b.dirty.is_zero(512) and new != CacheMode.WRITEBACK:
            out.notes.append(f"{b.device}: {human(b.dirty.bytes)} of dirty data is still being "
                             "written back; 'cachemgr drain' (or mode --drain) makes that fast")
        return out

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        return dict(drain_mod.restore_saved(sysfs, self.obj))

    def reread(self, sysfs: Sysfs) -> Kind:
        return Bcache(bcache.reread(sysfs, self.obj.identity.name))

    def detach(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        return [bcache.detach(sysfs, self.obj, timeout=timeout, progress=progress)]

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        """Detach (bcache flushes first), then stop the bcache device."""
        changes = []
        b = self.obj
        if b.cset_uuid is not None:
            changes.append(bcache.detach(sysfs, b, timeout=timeout, progress=progress))
            b = bcache.reread(sysfs, b.identity.name)
        changes.append(bcache.stop_backing(sysfs, b))
        return changes

    def tunables(self) -> dict[str, tuple[int, int]]:
        return dict(bcache.BACKING_TUNABLES)

    def tunable(self, name: str) -> str:
        v = getattr(self.obj, name, None)
        if v is None:
            return "?"
        if isinstance(v, bool):
            return str(int(v))
        return str(v.low if hasattr(v, "low") else v)

    def check_tunable(self, name: str, value: int) -> None:
        bcache.check_tunable(name, value)

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        return bcache.set_tunable(sysfs, self.obj, name, value)

    def dirty_consequence(self, mode: CacheMode) -> str:
        dirty = self.obj.dirty.bytes if self.obj.dirty else None
        if mode == CacheMode.WRITEBACK:
            return ("New writes will land on the SSD first: they are dirty (lost if the SSD "
                    "dies) until bcache writes them back.")
        if dirty:
            return (f"{self.node} has {human(dirty)} of dirty data. Switching does not make it "
                    "clean: bcache keeps writing it back, and with its defaults that is at "
                    "4 KiB/s once below 10 % of the cache. 'switch + drain' writes it back fast "
                    "(cachemgr mode --drain).")
        return f"{self.node} is clean: nothing is at risk."


class BcacheSet(Kind):
    """A bcache cache set: its SSD and the backing devices attached to it."""

    name = "bcache-set"
    title = "bcache cache set"
    cached_device = False
    actions = frozenset({"remove", "tune", "attach", "replace", "stop-set"})
    obj: CacheSet

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        return snap.cache_sets

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, CacheSet)

    def names(self) -> set[str]:
        return {self.obj.uuid, *(x.identity.node for x in self.obj.caches)}

    def kernel_names(self) -> set[str]:
        return {x.identity.name for x in self.obj.caches}

    @property
    def node(self) -> str:
        return f"cache set {self.obj.uuid}"

    @property
    def target(self) -> str:
        return self.obj.uuid

    @property
    def mode(self) -> CacheMode | None:
        return None

    @property
    def dirty_bytes(self) -> int | None:
        return self.obj.dirty.bytes if self.obj.dirty else None

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        return ((owners.cache_key(self.obj.uuid), self.node),)

    def tunables(self) -> dict[str, tuple[int, int]]:
        return dict(bcache.SET_TUNABLES)

    def tunable(self, name: str) -> str:
        v = getattr(self.obj, name, None)
        return "?" if v is None else str(v)

    def check_tunable(self, name: str, value: int) -> None:
        bcache.check_tunable(name, value, cache_set=True)

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        return bcache.set_cache_set_tunable(sysfs, self.obj, name, value)
