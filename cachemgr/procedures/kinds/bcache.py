"""bcache: a backing device with its /dev/bcacheN (``bcache``), and a cache set
(``bcache-set``: the SSD and the devices attached to it)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from cachemgr.backends import bcache
from cachemgr.backends.bcache import BCACHE_MODES
from cachemgr.core.change import Change
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError
from cachemgr.core.model import (
    AcceptDataLoss,
    BcacheBacking,
    CacheMode,
    CacheSet,
    Snapshot,
    dirty_text,
    human,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain as drain_mod
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
    size_words,
    stats_section,
)

# seconds for a registered backing device to show its bcache directory
REGISTER_WAIT = 10.0


class Bcache(Kind):
    """A bcache backing device and its /dev/bcacheN."""

    name = "bcache"
    title = "bcache device"
    modes = tuple(BCACHE_MODES)
    actions = frozenset({"mode", "drain", "detach", "attach", "remove", "tune", "replace",
                         "bench", "force-run", "warm", "invalidate", "scrub", "create",
                         "register", "snapshot"})
    invalidate_how = ("cachemgr detaches it from its cache set and attaches it again: bcache "
                      "forgets every block it held of this device (a few milliseconds; "
                      "the other devices on the set keep theirs). Each time uses one of the "
                      "set's UUID slots for good.")
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
        own = ((keys.bcache_key(self.obj.key), self.node),)
        cset = self.obj.cset_uuid
        return own + (((keys.cache_key(cset), f"cache set {cset}"),) if cset else ())

    def can(self, action: str) -> bool:
        attached = self.obj.cset_uuid is not None
        if action in ("detach", "replace", "invalidate", "scrub"):
            return attached
        if action == "attach":
            return not attached
        return super().can(action)

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        return bcache.set_mode(sysfs, self.obj, mode)

    def force_run(self, sysfs: Sysfs, accept: AcceptDataLoss) -> Change:
        """``running=1`` (bcache.rst's "massive filesystem corruption" when its dirty data
        was in the missing cache)."""
        return bcache.force_run(sysfs, self.obj, accept)

    # ---------------------------------------------------------------- making its objects

    disk_role = "backing"

    @classmethod
    def register_disk(cls, sysfs: Sysfs, node: str) -> Change:
        return bcache.register(sysfs, node)

    @classmethod
    def register_refusal(cls, snap: Snapshot, named: str, disk: Any,
                         batch: Sequence[Any]) -> CacheMgrError | None:
        """A backing device whose dirty data sits on a cache set that is neither registered
        nor registered with it (its SSD absent, or present and not named: the hint names
        it): running it would read stale blocks."""
        u = disk
        if u.sb_state != "dirty" or not u.cset_uuid:
            return None
        caches = {x.cset_uuid for x in batch if x.kind == "cache" and x.cset_uuid}
        if snap.cache_set(u.cset_uuid) is not None or u.cset_uuid in caches:
            return None
        ssd = next((x.identity.node for x in snap.unregistered
                    if x.kind == "cache" and x.cset_uuid == u.cset_uuid), None)
        return UnsafeError(
            f"{named} holds dirty data on cache set {u.cset_uuid}, which is not registered"
            + (f"; its SSD {ssd} is present but was not named" if ssd else
               " and whose SSD is absent") + "; nothing was registered",
            hint=(f"register them together, the SSD first: cachemgr register {ssd} {named}"
                  if ssd else "bring the SSD back (its dirty data is on it), then "
                              f"cachemgr register SSD {named}; running {named} without it "
                              "(force-run) risks filesystem corruption"))

    @classmethod
    def wait_registered(cls, sysfs: Sysfs, disk: Any) -> None:
        """Until the backing device shows its bcache directory (the kernel registers it in
        the write; sysfs follows at once on the lab, a moment later under load)."""
        deadline = time.monotonic() + REGISTER_WAIT
        while time.monotonic() < deadline and not sysfs.is_dir(
                f"block/{disk.identity.name}/bcache"):
            time.sleep(0.1)

    def attach_to(self, sysfs: Sysfs, cache: Kind) -> Change:
        """Attach it to the cache set ``cache`` (bcache's ``attach``: the set's UUID)."""
        if not isinstance(cache, BcacheSet):
            raise UsageError(f"{self.node} attaches to a bcache cache set, not to "
                             f"{cache.node} ({cache.title})",
                             hint="cachemgr status lists the cache sets")
        return bcache.attach(sysfs, self.obj, cache.obj)

    # ---------------------------------------------------------------- warming

    def warm_refusal(self) -> CacheMgrError | None:
        if self.obj.cset_uuid is None:
            return UsageError(f"{self.node} has no cache attached: nothing to warm",
                              hint="attach a cache set first (cachemgr attach)")
        if self.obj.mode == CacheMode.NONE:
            return UsageError(f"{self.node} is in cache mode none, which caches no read: "
                              "nothing to warm",
                              hint="switch it to writethrough, writeback or writearound first")
        return None

    def warm_capacity(self, sysfs: Sysfs) -> int | None:
        from cachemgr.backends import snapshot

        cs = snapshot.take(sysfs).cache_set(self.obj.cset_uuid or "")
        if cs is None or not cs.caches:
            return None
        c = cs.caches[0]
        if c.nbuckets is None or c.bucket_size is None:
            return None
        return c.nbuckets * c.bucket_size.bytes

    def warm_settings(self, sysfs: Sysfs) -> list[tuple[str, str, str]]:
        """bcache bypasses a read that is part of a sequential stream past
        ``sequential_cutoff`` and any read while the cache set is congested (its reads
        slower than ``congested_read_threshold_us``): both off for the run (request.c,
        check_should_bypass; docs/kernel-notes.md, "Warming a cache")."""
        rel = bcache.backing_rel(sysfs, self.obj.identity.name)
        out = [(f"{self.node} sequential_cutoff", f"{rel}/sequential_cutoff", "0")]
        cset = self.obj.cset_uuid
        if cset and sysfs.exists(f"fs/bcache/{cset}/congested_read_threshold_us"):
            out.append((f"cache set {cset[:8]} congested_read_threshold_us",
                        f"fs/bcache/{cset}/congested_read_threshold_us", "0"))
        return out

    def warm_slow_devices(self, sysfs: Sysfs) -> list[str]:
        rel = bcache.block_dirs(sysfs).get(self.obj.identity.name)
        return [rel] if rel else []

    def warm_trace_names(self) -> set[str]:
        """The bcache device itself (its backing device's offsets are shifted by bcache's
        data offset: :meth:`warm_trace_below`)."""
        b = self.obj
        return {n for n in (b.device, b.device_name) if n}

    def warm_trace_below(self, sysfs: Sysfs) -> tuple[set[str], int] | None:
        """The backing device, its offsets ahead by bcache's data offset: /dev/bcacheN's
        sector S is the backing device's S + data_offset, and the kernel sizes bcacheN as
        the backing device less that offset (super.c, cached_dev_init; lab: the difference
        is bcache-super-show's dev.data.first_sector, docs/kernel-notes.md, "Warming a
        cache"). None while either size is unknown."""
        from cachemgr.backends import blockdev

        b = self.obj
        dirs = blockdev.block_dirs(sysfs)

        def size(name: str | None) -> int | None:
            rel = dirs.get(name) if name else None
            n = sysfs.read_int(f"{rel}/size") if rel else None
            return n * 512 if n else None

        mine, whole = size(b.device_name), size(b.identity.name)
        if not mine or not whole or whole <= mine:
            return None
        names = {b.identity.name, b.identity.node, f"/dev/{b.identity.name}"}
        return names, whole - mine

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None,
              max_latency_ms: float | None = None) -> Drained:
        if final_mode is not None:
            # bcache switches first and drains after: the kernel allows any mode while dirty
            try:
                bcache.set_mode(sysfs, self.obj, final_mode)
            except AlreadyError:
                pass
        cur = bcache.reread(sysfs, self.obj.identity.name)
        r = drain_mod.drain(sysfs, cur, timeout=timeout, stall_timeout=stall_timeout,
                            progress=progress, max_latency_ms=max_latency_ms)
        return Drained(r.device, r.start_bytes, r.elapsed_s, dict(r.restored),
                       pacing=r.pacing)

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None,
                    max_latency_ms: float | None = None) -> Switched:
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
                    sysfs, timeout=timeout, stall_timeout=stall_timeout, progress=progress,
                    max_latency_ms=max_latency_ms)
                out.notes.append(out.drained.summary())
            except AlreadyError:
                pass
        elif b.dirty and not b.dirty.is_zero(512) and new != CacheMode.WRITEBACK:
            out.notes.append(f"{b.device}: {human(b.dirty.bytes)} of dirty data is still being "
                             "written back; 'cachemgr drain' (or mode --drain) makes that fast")
        return out

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        return dict(drain_mod.restore_saved(sysfs, self.obj))

    def invalidate(self, sysfs: Sysfs, *, final_mode: CacheMode | None = None,
                   cache: str | None = None) -> list[Change]:
        return bcache.invalidate(sysfs, self.obj, cache=cache, final_mode=final_mode)

    scrub_drop_how = ("bcache cannot drop one block of a device from its cache: every copy "
                      "of the device is dropped (detached and attached again, as cachemgr "
                      "invalidate does)")

    def scrub_source(self, sysfs: Sysfs) -> Any:
        """The whole /dev/bcacheN against its backing device past the data offset
        (``bcache-super-show``: ``dev.data.first_sector``): bcache keeps no list of the
        blocks it holds (procedures/scrub.py)."""
        from cachemgr.backends import bcache_super, blockdev
        from cachemgr.procedures import scrub

        b = self.obj
        if b.device is None or b.cset_uuid is None:
            raise UsageError(f"{self.node} has no cache attached: nothing to scrub")
        sb = bcache_super.super_show(b.identity.node) or {}
        first = sb.get("dev.data.first_sector", "")
        size = blockdev.device_bytes(sysfs, b.device)
        whole = blockdev.device_bytes(sysfs, b.identity.node)
        if not first.isdigit() or not size or not whole or whole - size != int(first) * 512:
            # the kernel sizes bcacheN as the backing device less its data offset
            # (super.c, cached_dev_init): if the two disagree, the offset is not known
            raise CacheMgrError(f"{self.node}: where its data starts on {b.identity.node} is "
                                f"not known (bcache-super-show: dev.data.first_sector "
                                f"{first or '?'}; sizes {size} and {whole}): nothing compared")
        return scrub.Source(b.device, b.identity.node, int(first) * 512, scrub.CHUNK, size,
                            None, "the whole device (bcache keeps no list of the blocks it "
                            "holds that can be read)", meter=b.device_name)

    def scrub_drop(self, sysfs: Sysfs, source: Any, blocks: list[int], *,
                   final_mode: CacheMode | None = None) -> list[Change]:
        return bcache.invalidate(sysfs, self.obj, final_mode=final_mode)

    def reread(self, sysfs: Sysfs) -> Kind:
        return Bcache(bcache.reread(sysfs, self.obj.identity.name))

    # ---------------------------------------------------------------- cachemgr snapshot

    def snapshot_cache(self, sysfs: Sysfs, *, max_latency_ms: float | None, timeout: float,
                       stall_timeout: float) -> Any:
        return SnapshotCache(sysfs, self.obj.identity.name, max_latency_ms=max_latency_ms,
                             timeout=timeout, stall_timeout=stall_timeout)

    @property
    def origin_node(self) -> str | None:
        return self.obj.identity.node

    def origin_offset(self) -> int | None:
        """bcache's superblock comes first: the data starts at ``dev.data.first_sector``
        (bcache-super-show)."""
        from cachemgr.backends import bcache_super

        sb = bcache_super.super_show(self.obj.identity.node) or {}
        first = sb.get("dev.data.first_sector", "")
        return int(first) * 512 if first.isdigit() else None

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

    # ---------------------------------------------------------------- words the faces show

    bench_hygiene = True

    @property
    def key(self) -> str:
        return self.obj.key

    @property
    def block_name(self) -> str | None:
        return self.obj.device_name

    @property
    def cache_name(self) -> str | None:
        return self.obj.cset_uuid

    @property
    def vm_node(self) -> str | None:
        return self.obj.device

    @property
    def health_cache(self) -> str | None:
        return self.obj.cset_uuid

    def detach_words(self, target: str, dirty: str) -> Asked | None:
        return Asked(f"Detach {target} from cache set {self.obj.cset_uuid}.\n\nbcache writes "
                     f"its {dirty} of dirty data back first, then the state reads 'no cache'; "
                     f"{target} stays up without a cache (passthrough).",
                     (("go", "Detach", "warning"),),
                     "Cancel stops waiting; the kernel finishes the detach by itself.")

    def preflight(self, sysfs: Sysfs, action: str, *, mode: CacheMode | None = None,
                  drain: bool = False, keep_device: bool = False) -> None:
        # remove stops a device on no cache set at once (attached: it detaches first)
        if action == "remove" and self.obj.cset_uuid is None:
            err = bcache.stop_refusal(sysfs, self.obj)
            if err is not None:
                raise err

    def would(self, action: str, *, keep_device: bool = False) -> list[str]:
        b = self.obj
        disk = b.identity.node
        out = []
        if b.cset_uuid is not None:
            out.append(f"would detach {self.node} from cache set {b.cset_uuid}: bcache first "
                       f"writes {dirty_words(self.dirty_bytes)} back to {disk}"
                       + (f", then {self.node} runs on uncached" if action == "detach"
                          else ""))
        if action == "remove" and b.device is None:
            out.append(f"would unregister {disk} from bcache (no bcache device of it runs); "
                       "its data stays on it")
        elif action == "remove":
            out.append(f"would stop {self.node}: it disappears, and whatever uses it (a VM's "
                       f"disk, a mount) loses it; the data stays on {disk}")
        return out

    def remove_words(self, target: str, dirty: str, disk: str) -> Asked | None:
        return Asked(f"Decommission {target}: detach it from its cache set (bcache flushes "
                     f"its {dirty} of dirty data first), then stop it. {target} disappears: "
                     f"whatever uses it loses the disk. The data stays on {disk}.",
                     (("go", f"Remove {target}", "error"),), REMOVE_CANCEL_NOTE)

    def attach_choices(self, snap: Snapshot) -> tuple[str, list[tuple[str, str]], str]:
        return (f"Attach {self.node} to which cache set?",
                [(c.uuid, f"{c.uuid[:8]}  SSD {','.join(x.identity.node for x in c.caches)}"
                          f"  {len(c.backing_names)} backing") for c in snap.cache_sets],
                "no cache set is registered")

    def attach_pair(self, choice: str) -> tuple[str, str]:
        return self.node, choice

    def detail(self, snap: Snapshot) -> list[Section]:
        b = self.obj
        cset = snap.cache_set(b.cset_uuid) if b.cset_uuid else None
        out = [
            Section(f"bcache device {b.device or '(stopped)'}", (
                ("device", b.device), ("backing UUID", b.uuid),
                ("by-uuid", f"/dev/bcache/by-uuid/{b.uuid}" if b.uuid else None),
                ("label", b.label or None), ("cache set", b.cset_uuid or "none"),
                ("cache device", ", ".join(c.identity.node for c in cset.caches)
                 if cset else None),
                ("mode", b.mode), ("state", b.state), ("dirty", dirty_text(b)),
                ("running", b.running),
            )),
            identity_section("backing device", b.identity),
            Section("tunables", (
                ("writeback_percent", b.writeback_percent),
                ("writeback_delay", b.writeback_delay),
                ("writeback_running", b.writeback_running),
                ("writeback_rate_minimum", b.writeback_rate_minimum),
                ("writeback_rate", size_words(b.writeback_rate, "/s")
                 if b.writeback_rate else None),
                ("sequential_cutoff", b.sequential_cutoff),
                ("stop_when_cache_set_failed", b.stop_when_cache_set_failed),
            )),
            stats_section(b.stats),
            Section("errors", (("io_errors", b.io_errors),
                               ("io_error_limit", b.io_error_limit))),
        ]
        if b.rate_debug:
            d = b.rate_debug
            out.append(Section("writeback_rate_debug", (
                ("rate", d.rate), ("dirty", d.dirty), ("target", d.target),
                ("proportional", d.proportional), ("integral", d.integral),
                ("change", d.change),
                ("next io", f"{d.next_io_ms} ms" if d.next_io_ms is not None else None))))
        return out


class SnapshotCache:
    """A bcache backing device's part of cachemgr snapshot (procedures/snapshot.py
    ``CacheSteps``), each reading fresh from sysfs: the drain of procedures/drain.py (paced
    under ``max_latency_ms``), its dirty bytes and mode, its mode switched, the drain
    unthrottled."""

    # the drain's "clean twice, this far apart": 0.2 s, not the drain's 2 s, because it is
    # part of the freeze; with the filesystem frozen nothing new gets dirty (the 2 s are for
    # writes that redirty under a running VM: procedures/drain.py)
    CONFIRM = 0.2
    INTERVAL = 0.2  # the drain's readings (its default 0.5 s is spent frozen too)

    def __init__(self, sysfs: Sysfs, name: str, *, max_latency_ms: float | None,
                 timeout: float, stall_timeout: float) -> None:
        self.sysfs, self.name = sysfs, name
        self.max_latency_ms, self.timeout, self.stall_timeout = (max_latency_ms, timeout,
                                                                 stall_timeout)

    def drain(self, progress: ProgressFn) -> None:
        b = bcache.reread(self.sysfs, self.name)
        drain_mod.drain(self.sysfs, b, timeout=self.timeout,
                        stall_timeout=self.stall_timeout, confirm=self.CONFIRM,
                        interval=self.INTERVAL,
                        progress=progress, max_latency_ms=self.max_latency_ms)

    def dirty_bytes(self) -> int | None:
        b = bcache.reread(self.sysfs, self.name)
        if drain_mod.is_clean(b):
            return 0
        return b.dirty.bytes if b.dirty is not None else None

    def mode(self) -> str | None:
        b = bcache.reread(self.sysfs, self.name)
        return b.mode.value if b.mode is not None else None

    def set_mode(self, mode: str) -> None:
        """Already so is fine."""
        try:
            bcache.set_mode(self.sysfs, bcache.reread(self.sysfs, self.name), CacheMode(mode))
        except AlreadyError:
            pass

    def unpace(self) -> None:
        """writeback_percent 0 (unthrottled writeback) and writeback_delay 0, both journaled
        by the drain before it began and put back at its end (procedures/drain.py). The
        paced drain sets writeback_percent to its PACED_PERCENT while it slows down for the
        VMs and goes back to 0 only after 2 s without their IO: frozen, 2 s more of freeze.
        The drain's writeback_delay of 1 s is a pause after each pass over the index, which
        what the freeze wrote waits out (writeback.c, bch_writeback_thread)."""
        b = bcache.reread(self.sysfs, self.name)
        for name in ("writeback_percent", "writeback_delay"):
            if getattr(b, name) != 0:
                bcache.set_tunable(self.sysfs, b, name, 0)


class BcacheSet(Kind):
    """A bcache cache set: its SSD and the backing devices attached to it."""

    name = "bcache-set"
    title = "bcache cache set"
    cached_device = False
    actions = frozenset({"remove", "tune", "attach", "replace", "stop-set", "create",
                         "register"})
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
        return ((keys.cache_key(self.obj.uuid), self.node),)

    def stop_set(self, sysfs: Sysfs, accept: AcceptDataLoss) -> Change:
        """``stop`` on the set: every attached backing device stops, dirty data stays on
        the SSD."""
        return bcache.stop_cache_set(sysfs, self.obj, accept)

    def preflight(self, sysfs: Sysfs, action: str, *, mode: CacheMode | None = None,
                  drain: bool = False, keep_device: bool = False) -> None:
        if action == "remove":
            self._unregister_refusals(sysfs)

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        """Unregister the set: refused while backing devices are attached or dirty, and while
        a backing device that bcache stopped still has its dirty data on this SSD (it is no
        longer listed in the set; only its superblock says so)."""
        full = self._unregister_refusals(sysfs)
        cur = full.cache_set(self.obj.uuid) or self.obj
        return [bcache.unregister_cache_set(sysfs, cur, full.backings)]

    def _unregister_refusals(self, sysfs: Sysfs) -> Snapshot:
        """The refusals of unregistering the set that only the superblocks tell (a backing
        device bcache stopped with its dirty data on this SSD, or one that cannot be read);
        the snapshot that has them (probe_unregistered)."""
        from cachemgr.backends import bcache_super, snapshot

        full = snapshot.take(sysfs, probe_unregistered=True)
        bcache_super.refuse_orphaned_dirt(full, self.obj.uuid,
                                          doing="unregistering the cache set",
                                          then="run remove again")
        bcache_super.refuse_unreadable(sysfs, self.obj.uuid, "unregistering the cache set")
        return full

    # ---------------------------------------------------------------- making its objects

    disk_role = "cache"

    @classmethod
    def register_disk(cls, sysfs: Sysfs, node: str) -> Change:
        return bcache.register(sysfs, node)

    @classmethod
    def format_disk(cls, sysfs: Sysfs, node: str, *, bucket: str | None = None
                    ) -> list[Change]:
        """make-bcache -C (a bucket the kernel would refuse is refused first, nothing
        formatted; unset, one that gives the kernel enough buckets), then register it:
        the SSD of a new cache set."""
        size = bcache.device_bytes(sysfs, node)
        if size is not None:
            bucket = bcache.check_bucket(node, size, bucket)
        bcache.make_bcache(cache=node, bucket=bucket)
        out = [Change(node, "format", None, "bcache cache")]
        try:
            out.append(bcache.register(sysfs, node))
        except AlreadyError:  # 69-bcache.rules may be first
            pass
        return out

    def tunables(self) -> dict[str, tuple[int, int]]:
        return dict(bcache.SET_TUNABLES)

    def tunable(self, name: str) -> str:
        v = getattr(self.obj, name, None)
        return "?" if v is None else str(v)

    def check_tunable(self, name: str, value: int) -> None:
        bcache.check_tunable(name, value, cache_set=True)

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        return bcache.set_cache_set_tunable(sysfs, self.obj, name, value)

    # ---------------------------------------------------------------- words the faces show

    @property
    def key(self) -> str:
        return f"cset:{self.obj.uuid}"

    @property
    def cache_name(self) -> str | None:
        return self.obj.uuid

    @property
    def health_cache(self) -> str | None:
        return self.obj.uuid

    def would(self, action: str, *, keep_device: bool = False) -> list[str]:
        c = self.obj
        ssd = ", ".join(x.identity.node for x in c.caches) or "its SSD"
        return [f"would unregister cache set {c.uuid}: bcache lets go of {ssd}, which then "
                "caches nothing until it is made a cache again"]

    def remove_words(self, target: str, dirty: str, disk: str) -> Asked | None:
        return Asked(f"Unregister cache set {self.obj.uuid} (SSD {disk}). Refused while "
                     "backing devices are attached or hold dirty data.",
                     (("go", "Unregister", "error"),), REMOVE_CANCEL_NOTE)

    def attach_choices(self, snap: Snapshot) -> tuple[str, list[tuple[str, str]], str]:
        free = [b for b in snap.backings if b.cset_uuid is None]
        return (f"Attach which backing device to {self.obj.uuid[:8]}?",
                [(b.device or b.identity.node,
                  f"{b.device or '-'}  on {b.identity.node}  {b.state.value}") for b in free],
                "no detached backing device")

    def attach_pair(self, choice: str) -> tuple[str, str]:
        return choice, self.obj.uuid

    def detail(self, snap: Snapshot) -> list[Section]:
        c = self.obj
        out = [Section(f"cache set {c.uuid}", (
            ("backing devices", ", ".join(f"/dev/{n}" for n in c.backing_names) or "none"),
            ("flash volumes", c.flash_volumes),
            ("cache used", None if c.cache_available_percent is None
             else f"{100 - c.cache_available_percent}% ({c.cache_available_percent}% "
                  "available)"),
            ("dirty (at last GC)", c.dirty), ("block size", c.block_size),
            ("bucket size", c.bucket_size), ("congested", c.congested),
            ("congested_read_threshold_us", c.congested_read_threshold_us),
            ("congested_write_threshold_us", c.congested_write_threshold_us),
            ("errors", c.errors), ("io_error_limit", c.io_error_limit),
            ("io_error_halflife", c.io_error_halflife),
        ))]
        for x in c.caches:
            out.append(identity_section(f"cache device {x.identity.node}", x.identity))
            out.append(Section("cache device", (
                ("io_errors", x.io_errors), ("buckets", x.nbuckets),
                ("bucket size", x.bucket_size), ("block size", x.block_size),
                ("replacement", x.replacement_policy), ("written", x.written))))
        out.append(stats_section(c.stats))
        members = [b for b in snap.backings if b.cset_uuid == c.uuid]
        if members:
            out.append(Section("backing devices",
                               columns=("device", "backing", "mode", "state", "dirty"),
                               rows=tuple((b.device or "-", b.identity.node, b.mode,
                                           b.state.value, dirty_text(b)) for b in members)))
        return out
