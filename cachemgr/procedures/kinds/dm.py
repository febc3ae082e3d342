"""device-mapper caches: a dm-cache device cachemgr made or found (``dm-cache``), the caches
lvm2 owns (``lvmcache``, ``lvm-writecache``: changed through lvm2 only), and a dm-writecache
device LVM does not describe (``dm-writecache``: shown, never changed)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from cachemgr.backends import dmcache
from cachemgr.backends.dmcache import flushing
from cachemgr.backends.dmcache import manage as dm_manage
from cachemgr.backends.dmcache import pacing as dm_pacing
from cachemgr.backends.dmcache.refusals import check_changeable
from cachemgr.backends.lvm import manage as lvm_manage
from cachemgr.core import state
from cachemgr.core.change import Change
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
from cachemgr.procedures import keys
from cachemgr.procedures.kinds.base import (
    REMOVE_CANCEL_NOTE,
    Asked,
    Drained,
    Kind,
    ProgressFn,
    Section,
    Switched,
    dirty_words,
    identity_section,
)

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

    # ---------------------------------------------------------------- words the faces show

    key_prefix: ClassVar[str] = "dm"  # its row key: dm:NAME (a writecache's: wc:NAME)

    @property
    def key(self) -> str:
        return f"{self.key_prefix}:{self.obj.name}"

    @property
    def block_name(self) -> str | None:
        return self.obj.kernel_name

    @property
    def bench_target(self) -> str:
        return self.obj.node

    @property
    def vm_node(self) -> str | None:
        return self.obj.node

    @property
    def health_cache(self) -> str | None:
        return self.obj.node

    def hit_counters(self) -> tuple[int, int] | None:
        return None  # a writecache caches writes: its counters are no read hit ratio

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


def _dm_counters(d: DmCacheDevice) -> tuple[int, int] | None:
    """A dm-cache device's hits and misses (reads and writes), from its status."""
    st = d.status
    if st is None:
        return None
    return st.read_hits + st.write_hits, st.read_misses + st.write_misses


class _DmCacheWarm(Kind):
    """Warming a dm-cache target (a plain one or an LVM cache: dm-cache underneath).

    smq promotes a block on a read only once its hotspot's level reaches the promote level
    (dm-cache-policy-smq.c, should_promote), and a hotspot climbs at most once per hotspot
    period (1 s): a block read once is not promoted, nor read many times in a row; read in
    passes a second or more apart, more are promoted each pass until none is (measured in
    the lab, docs/kernel-notes.md, "Warming a cache"). So the hot blocks are read in passes
    (at least 3, at most 24) until three in a row promote nothing; promotions are copied in
    the background, so the warm waits for them at its end. No setting is changed."""

    # under load smq still admitted at pass 16 and stopped by pass 19, after lulls of up
    # to two passes without a promotion (lab: docs/kernel-notes.md, "Warming a cache")
    warm_passes = 24
    warm_pass_s = 1.1
    obj: DmCacheDevice

    def warm_refusal(self) -> CacheMgrError | None:
        from cachemgr.core.errors import UsageError

        d = self.obj
        if d.mode == CacheMode.PASSTHROUGH:
            return UsageError(f"{self.node} is in passthrough, which promotes nothing: "
                              "nothing to warm", hint="switch it to writethrough or "
                                                      "writeback first")
        if d.table.policy == "cleaner":
            return UsageError(f"{self.node} runs the cleaner policy (a flush), which "
                              "promotes nothing: nothing to warm",
                              hint="let the flush finish (its policy comes back), then warm")
        return None

    scrub_drop_how = ("the mismatched cache blocks alone are dropped: passthrough, "
                      "invalidate_cblocks of those blocks, and the mode back (the other "
                      "blocks stay cached)")

    def _lvm_name(self) -> str | None:
        """VG/LV when lvm2 owns it (its mode is switched through lvchange)."""
        return None

    def scrub_source(self, sysfs: Sysfs) -> Any:
        """The origin blocks its metadata maps (backends/dmcache/mappings.py), each read
        through the device and from its origin device."""
        from cachemgr.backends.dmcache import mappings
        from cachemgr.procedures import scrub

        d = self.obj
        if d.origin is None or d.status is None:
            raise CacheMgrError(f"{self.node}: its origin device or status is not known: "
                                "nothing compared")
        unit = d.table.block_sectors * 512
        mp = mappings.mapped(d)
        return scrub.Source(d.node, d.origin.node, 0, unit, d.table.length * 512,
                            tuple(sorted(mp)), f"the {len(mp):,} blocks its metadata maps "
                            "(cache_dump)", meter=d.kernel_name,
                            places={o: c for o, (c, _) in mp.items()})

    def scrub_drop(self, sysfs: Sysfs, source: Any, blocks: list[int], *,
                   final_mode: CacheMode | None = None) -> list[Change]:
        return dm_manage.invalidate(sysfs, self.obj, final_mode=final_mode,
                                    lvm_name=self._lvm_name(), origin_blocks=blocks)

    def warm_capacity(self, sysfs: Sysfs) -> int | None:
        st = self.obj.status
        return None if st is None else st.total * st.block_sectors * 512

    def warm_cache_block(self) -> int:
        return self.obj.table.block_sectors * 512

    def warm_trace_names(self) -> set[str]:
        d = self.obj
        out = {self.node, d.node, d.name, d.kernel_name, f"/dev/{d.kernel_name}"}
        if d.origin is not None:  # the origin's offsets are the cached device's
            out |= {n for n in (d.origin.node, d.origin.name) if n}
        return out

    def warm_slow_devices(self, sysfs: Sysfs) -> list[str]:
        from cachemgr.backends.blockdev import block_dirs

        name = self.obj.origin.name if self.obj.origin is not None else None
        rel = block_dirs(sysfs).get(name) if name else None
        return [rel] if rel else []

    def warm_admitted(self, sysfs: Sysfs) -> int | None:
        st = getattr(self.reread(sysfs).obj, "status", None)
        return None if st is None else int(st.promotions)

    def warm_counters(self, sysfs: Sysfs) -> tuple[int, int, int, int] | None:
        # dm-cache counts each bio once it is split at the cache block (dm-cache-target.c:
        # max_io_len is the block; inc_hit_counter / inc_miss_counter in map_bio): a warm's
        # pass over N aligned cache blocks moves hits + misses by N (lab: 256 for 256)
        st = getattr(self.reread(sysfs).obj, "status", None)
        return None if st is None else (int(st.read_hits), int(st.read_misses),
                                        int(st.promotions), int(st.demotions))

    def warm_settle(self, sysfs: Sysfs, *, timeout: float = 60.0) -> None:
        """Wait until the promotions stop (the counters stand still for a second)."""
        import time

        from cachemgr.core import cancel

        last = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = getattr(self.reread(sysfs).obj, "status", None)
            cur = None if st is None else (st.promotions, st.used)
            if cur is not None and cur == last:
                return
            last = cur
            cancel.sleep(1.0, "warm")  # the TUI's Cancel cuts it short


def _dmcache_detail(d: DmCacheDevice) -> list[Section]:
    st = d.status
    out = [Section(f"dm-cache {d.node}", (
        ("dm name", d.name), ("kernel name", d.kernel_name), ("devno", d.devno),
        ("dm UUID", d.uuid), ("owned by LVM", d.lvm_owned), ("mode", d.mode),
        ("state", d.state), ("dirty", human(d.dirty_bytes) if d.dirty_bytes is not None
                             else "unknown"),
        ("block size", human(d.block_bytes)), ("open count", d.open_count),
        ("suspended", d.suspended), ("holders", ", ".join(d.holders) or None),
        ("failure", d.failure), ("table", d.table.line()),
    ))]
    if st:
        out.append(Section("status", (
            ("used", f"{st.used}/{st.total} blocks"),
            ("dirty", f"{st.dirty} blocks"),
            ("metadata", f"{st.metadata_used}/{st.metadata_total} blocks"),
            ("read hits/misses", f"{st.read_hits}/{st.read_misses}"),
            ("write hits/misses", f"{st.write_hits}/{st.write_misses}"),
            ("hit ratio (total)", None if st.hit_ratio is None
             else f"{100 * st.hit_ratio:.1f}%"),
            ("promotions/demotions", f"{st.promotions}/{st.demotions}"),
            ("policy", f"{st.policy} {' '.join(st.policy_args)}".strip()),
            ("migration_threshold", st.migration_threshold),
            ("features", " ".join(st.features)), ("metadata mode", st.metadata_mode),
            ("needs_check", st.needs_check))))
    for title, ident in (("origin", d.origin), ("cache device", d.cache),
                         ("metadata device", d.metadata)):
        if ident is not None:
            out.append(identity_section(title, ident))
    return out + _lvm_detail(d)


def _wc_detail(d: DmWritecacheDevice) -> list[Section]:
    st = d.status
    out = [Section(f"dm-writecache {d.node}", (
        ("dm name", d.name), ("kernel name", d.kernel_name), ("devno", d.devno),
        ("dm UUID", d.uuid), ("owned by LVM", d.lvm_owned), ("state", d.state),
        ("dirty", human(d.dirty_bytes) if d.dirty_bytes is not None else "unknown"),
        ("block size", human(d.table.block_bytes)), ("open count", d.open_count),
        ("suspended", d.suspended), ("holders", ", ".join(d.holders) or None),
        ("failure", d.failure), ("table", d.table.line()),
    ))]
    if st:
        out.append(Section("status", (
            ("error", st.error), ("blocks", st.total), ("free", st.free),
            ("dirty", f"{st.dirty} blocks"), ("under writeback", st.writeback),
            ("watermarks", f"high {d.table.settings().get('high_watermark', '50')}, "
                           f"low {d.table.settings().get('low_watermark', '45')}"))))
    for title, ident in (("origin", d.origin), ("cache device", d.cache)):
        if ident is not None:
            out.append(identity_section(title, ident))
    return out + _lvm_detail(d)


def _lvm_detail(d: DmCacheDevice | DmWritecacheDevice) -> list[Section]:
    """What lvm2 says of an LVM-owned cache (cachemgr changes it through lvm2)."""
    v = d.lvm
    if v is None:
        if d.lvm_owned:
            return [Section("", note="owned by LVM, but lvs did not describe it (see "
                                     "cachemgr status's warnings)")]
        return []
    return [Section(f"LVM {v.kind} {v.full_name}", (
        ("cache", f"{v.vg}/{v.pool_name} ({v.pool_kind})"), ("segment type", v.segtype),
        ("origin PVs", ", ".join(v.origin_pvs) or None),
        ("cache PVs", ", ".join(v.cache_pvs) or None),
        ("mode (lvm2)", v.cache_mode), ("policy (lvm2)", v.policy),
        ("settings", ",".join(f"{k}={x}" for k, x in v.settings) or None),
        ("chunk/block size", human(v.chunk_bytes) if v.chunk_bytes else None),
        ("health", v.health or "ok"), ("check needed", v.check_needed)))]


class DmCache(_DmCacheWarm, _Dm):
    """A dm-cache device LVM does not own."""

    name = "dm-cache"
    title = "dm-cache device"
    drain_word = "flush"
    root_in_backend = True
    modes = tuple(DM_CACHE_MODES)
    actions = frozenset({"mode", "drain", "remove", "tune", "replace", "bench", "warm",
                         "invalidate", "scrub", "create", "assemble"})
    invalidate_how = ("cachemgr switches it to passthrough (every read then goes to the "
                      "origin), drops every cache block (invalidate_cblocks), and switches "
                      "it back: two table reloads, each holding its IO for a moment.")
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
        return ((keys.dmcache_key(self.obj.name), self.node),
                (keys.cache_key(self.obj.name), self.node))

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return dmcache.set_mode(sysfs, self.obj, mode)

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None,
                    max_latency_ms: float | None = None) -> Switched:
        """dm-cache refuses passthrough while dirty: ``drain`` flushes, then loads the new
        mode (already in it: only the flush)."""
        if drain and self.mode == new:
            return Switched([], [], as_drain=True)
        return super().switch_mode(sysfs, new, drain=drain, timeout=timeout,
                                   stall_timeout=stall_timeout, progress=progress,
                                   max_latency_ms=max_latency_ms)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None,
              max_latency_ms: float | None = None) -> Drained:
        r = dmcache.flush(sysfs, self.obj, timeout=timeout, stall_timeout=stall_timeout,
                          progress=progress, final_mode=final_mode,
                          max_latency_ms=max_latency_ms)
        restored: dict[str, Any] = dict(r.restored)
        if final_mode is not None:
            restored = {"mode": final_mode.value, "policy": self.obj.table.policy,
                        "switched": bool(r.final_table)}
        return Drained(r.device, r.start_bytes, r.elapsed_s, restored, pacing=r.pacing,
                       dirty_after=r.dirty_after)

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        """Put back the table an interrupted flush left, holding the device's lock (the one
        dmcache.flush takes): a flush running in another process is never undone under it
        (refused, exit 3, nothing changed). The journal is read under the lock; one that
        cannot be read is refused (exit 2, its path and why)."""
        with state.locked(flushing.lock_key(self.obj), self.obj.node):
            path = flushing.journal(self.obj)
            saved = state.read_json(path)
            if saved is None:
                # a paced drain killed before its flush journal was written or after it was
                # removed leaves only the copy throttle's journal
                value = dm_pacing.restore_stale(sysfs)
                return {} if value is None else {"cache_copy_throttle": value}
            if not (isinstance(saved.get("original"), str) and saved["original"].strip()):
                raise state.StateFileError(path, "not a dm-cache flush journal: no 'original' "
                                                 "table")
            return dict(dmcache.restore_saved(sysfs, self.obj))

    def restored_note(self, restored: dict[str, Any]) -> str:
        out = [f"table {restored['table']}"] if "table" in restored else []
        if "cache_copy_throttle" in restored:
            out.append(f"dm_cache cache_copy_throttle {restored['cache_copy_throttle']}")
        return f"{self.node}: restored " + ", ".join(out)

    def reread(self, sysfs: Sysfs) -> Kind:
        return DmCache(dmcache.find(sysfs, self.obj.name))

    def invalidate(self, sysfs: Sysfs, *, final_mode: CacheMode | None = None,
                   cache: str | None = None) -> list[Change]:
        return dm_manage.invalidate(sysfs, self.obj, final_mode=final_mode)

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

    # ---------------------------------------------------------------- words the faces show

    @property
    def cache_name(self) -> str | None:
        return self.obj.name

    def hit_counters(self) -> tuple[int, int] | None:
        return _dm_counters(self.obj)

    def preflight(self, sysfs: Sysfs, action: str, *, mode: CacheMode | None = None,
                  drain: bool = False, keep_device: bool = False) -> None:
        d = self.obj
        if action == "mode" and mode is not None:
            check_changeable(d, "mode", f"lvchange --cachemode {mode.value} VG/LV")
            if mode == CacheMode.PASSTHROUGH and not drain and d.mode != mode:
                dm_manage.refuse_dirty(d)
        elif action == "remove":
            check_changeable(d, "cache", "lvconvert --uncache VG/LV")
            err = dm_manage.in_use_refusal(d, keep_device)
            if err is not None:
                raise err

    def would(self, action: str, *, keep_device: bool = False) -> list[str]:
        d = self.obj
        origin = d.origin.node if d.origin else d.table.origin_dev
        out = [f"would write {dirty_words(self.dirty_bytes)} back to its origin {origin}, "
               "then load a linear mapping of the origin in place of the cache"]
        if keep_device:
            out.append(f"{self.node} would stay, as that linear mapping: whatever uses it "
                       "keeps running, uncached")
        else:
            out.append(f"would then remove {self.node}: whatever uses it (a VM's disk, a "
                       f"mount) loses it; the data stays on {origin}")
        return out

    def forget(self) -> list[str]:
        """Its record (backends/dmcache/record.py): no cache is left to bring back at boot
        (with --keep-device the device stays as a linear mapping of the origin until the
        next reboot), so the record goes either way."""
        from cachemgr.backends.dmcache import record as dm_record

        if not dm_record.delete(self.obj.name):
            return []
        return [f"cachemgr: its record {dm_record.records_dir()}/{self.obj.name}.json is "
                "removed"]

    def remove_words(self, target: str, dirty: str, disk: str) -> Asked | None:
        return Asked(f"Remove dm-cache {self.obj.node}: flush every dirty block to {disk}, "
                     "swap the table for a linear mapping of the origin, then remove the "
                     "device. 'Keep device' leaves it as that linear mapping so its users keep "
                     "running.",
                     (("go", f"Remove {self.obj.name}", "error"),
                      ("keep", "Keep device (linear)", "warning")), REMOVE_CANCEL_NOTE)

    def detail(self, snap: Snapshot) -> list[Section]:
        return _dmcache_detail(self.obj)


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
        return ((keys.lvm_key(self.lv.full_name), self.lv.full_name),
                (keys.cache_key(self.lv.full_name), self.lv.full_name))

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return lvm_manage.set_mode(self.obj, mode)

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None,
                    max_latency_ms: float | None = None) -> Switched:
        """lvm2 drains with progress (its cleaner), then switches."""
        if not drain:
            return Switched([self.set_mode(sysfs, new)], [])
        before = self.lv.cache_mode or (self.mode.value if self.mode else "?")
        d = self.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                       progress=progress, final_mode=new, max_latency_ms=max_latency_ms)
        return Switched([Change(self.lv.full_name, "cache_mode", before, new.value)]
                        if d.restored.get("switched") else [],
                        [d.summary()] if d.start_bytes else [], d)

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None,
              max_latency_ms: float | None = None) -> Drained:
        start, secs, restored, _ = lvm_manage.drain(
            self.obj, timeout=timeout, stall_timeout=stall_timeout, progress=progress,
            final_mode=final_mode, max_latency_ms=max_latency_ms)
        pacing = restored.pop("pacing", None)
        return Drained(self.lv.full_name, start, secs, restored, pacing=pacing)

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
        # lvm2 lists only the settings it was given: else the kernel's (its table, status)
        return self._kernel_tunable(name) if v is None else str(v)

    def _kernel_tunable(self, name: str) -> str:
        return "?"

    def check_tunable(self, name: str, value: int) -> None:
        lvm_manage.check_tunable(self.obj, name, value)

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        return lvm_manage.tune(self.obj, name, value)

    # ---------------------------------------------------------------- words the faces show

    @property
    def cache_name(self) -> str | None:
        return self.lv.full_name

    def preflight(self, sysfs: Sysfs, action: str, *, mode: CacheMode | None = None,
                  drain: bool = False, keep_device: bool = False) -> None:
        if action == "mode" and mode is not None:
            lvm_manage.check_mode(self.obj, mode)
            lvm_manage.refuse_unhealthy(self.obj, "mode")
            st = self.obj.status
            blocks = st.dirty if st is not None else None
            if not drain and mode != CacheMode.WRITEBACK and blocks:
                raise lvm_manage.dirty_mode_refusal(self.lv, mode, blocks,
                                                    self.obj.dirty_bytes)

    def would(self, action: str, *, keep_device: bool = False) -> list[str]:
        lv, pool = self.lv.full_name, f"{self.lv.vg}/{self.lv.pool_name}"
        drain = (f"would drain {dirty_words(self.dirty_bytes)} through lvm2's cleaner (with "
                 "progress), then ")
        if action == "detach" or keep_device:
            return [drain + f"split its cache {pool} off (lvconvert --splitcache): {lv} runs "
                            "on uncached, the cache is kept for a later attach"]
        return [drain + f"delete its cache {pool} (lvconvert --uncache): {lv} runs on "
                        "uncached, every byte on its origin"]

    def detach_words(self, target: str, dirty: str) -> Asked | None:
        return Asked(f"Detach the cache {self.lv.vg}/{self.lv.pool_name} from {target}.\n\n"
                     f"cachemgr drains its {dirty} of dirty data through lvm2's cleaner "
                     "(with progress), then runs lvconvert --splitcache: the LV goes on "
                     "uncached, the cache pool or cachevol is kept for a later attach.",
                     (("go", "Detach", "warning"),),
                     "Cancel stops the drain at its next poll; the policy is put back and the "
                     "cache stays attached.")

    def remove_words(self, target: str, dirty: str, disk: str) -> Asked | None:
        return Asked(f"Remove the cache of {target}: drain its {dirty} of dirty data "
                     f"through lvm2's cleaner (with progress), then lvconvert --uncache: the "
                     f"cache {self.lv.vg}/{self.lv.pool_name} is deleted, {target} goes on "
                     "uncached with every byte on its origin. 'Keep the pool' splits it off "
                     "instead (lvconvert --splitcache).",
                     (("go", "Remove the cache", "error"),
                      ("keep", "Keep the pool (split)", "warning")), REMOVE_CANCEL_NOTE)


class LvmCache(_DmCacheWarm, _Lvm):
    """An LV cached by lvm2's dm-cache (lvmcache)."""

    name = "lvmcache"
    title = "LVM cache"
    modes = tuple(lvm_manage.LVM_CACHE_MODES)
    actions = _Lvm.actions | {"warm", "invalidate", "scrub"}
    invalidate_how = ("cachemgr switches it to passthrough through lvm2 (lvchange "
                      "--cachemode; every read then goes to the origin), drops every cache "
                      "block (dm-cache's invalidate_cblocks message, which changes no table "
                      "and nothing lvm2 records), and switches it back through lvm2.")
    obj: DmCacheDevice

    def _lvm_name(self) -> str | None:
        return self.lv.full_name

    def scrub_drop(self, sysfs: Sysfs, source: Any, blocks: list[int], *,
                   final_mode: CacheMode | None = None) -> list[Change]:
        lvm_manage.refuse_unhealthy(self.obj, "cached blocks")
        return super().scrub_drop(sysfs, source, blocks, final_mode=final_mode)

    def invalidate(self, sysfs: Sysfs, *, final_mode: CacheMode | None = None,
                   cache: str | None = None) -> list[Change]:
        lvm_manage.refuse_unhealthy(self.obj, "cached blocks")
        return dm_manage.invalidate(sysfs, self.obj, final_mode=final_mode,
                                    lvm_name=self.lv.full_name)

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

    # ---------------------------------------------------------------- words the faces show

    def _kernel_tunable(self, name: str) -> str:
        return DmCache.tunable(self, name)  # type: ignore[arg-type]

    def hit_counters(self) -> tuple[int, int] | None:
        return _dm_counters(self.obj)

    def detail(self, snap: Snapshot) -> list[Section]:
        return _dmcache_detail(self.obj)


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

    # ---------------------------------------------------------------- words the faces show

    key_prefix = "wc"

    def _kernel_tunable(self, name: str) -> str:
        return DmWritecache.tunable(self, name)  # type: ignore[arg-type]

    def detail(self, snap: Snapshot) -> list[Section]:
        return _wc_detail(self.obj)


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
        return ((keys.dmcache_key(self.obj.name), self.node),)

    def tunable(self, name: str) -> str:
        return self.obj.table.settings().get(name, "default")

    def refusal(self, action: str) -> CacheMgrError | None:
        return UnsafeError(f"{self.node} is a dm-writecache device LVM does not describe: "
                           "cachemgr shows it and changes writecaches only through lvm2; "
                           "nothing was changed",
                           hint="manage it with the tool that made it (dmsetup)")

    def dirty_consequence(self, mode: CacheMode) -> str:
        return WRITECACHE_CONSEQUENCE

    # ---------------------------------------------------------------- words the faces show

    key_prefix = "wc"

    def detail(self, snap: Snapshot) -> list[Section]:
        return _wc_detail(self.obj)
