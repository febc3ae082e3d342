"""The cache commands: status, mode, drain, attach, detach, create, remove, tune, force-run,
stop-set. One function per command; the CLI, the TUI and the Ansible modules (through the
CLI) only parse, call and render.

Each command takes the target as an admin types it and its options, and does every check
itself, in this order: the words (mode names, option combinations: usage errors, exit 2), the
target (resolved on a fresh snapshot: exit 2 when it names nothing), root (exit 2), the
per-object lock (exit 3 while another run acts on it), the safety refusals (exit 3), then the
change. "Already so" is :class:`~cachemgr.core.errors.AlreadyError` (exit 4) or ``Result.already``.
Progress goes to ``ctl.report`` (which also raises ``Cancelled`` when the operator cancels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cachemgr.backends import bcache, dmcache, smart
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.backends.bcache_super import refuse_orphaned_dirt, refuse_unreadable
from cachemgr.backends.lvm import manage as lvm_manage
from cachemgr.backends.lvm.command import spelling as lvm_spelling
from cachemgr.backends.scancache import ScanCache as ScanCache
from cachemgr.backends.targets import resolve_backing, resolve_cache_set
from cachemgr.core import checks, state
from cachemgr.core.errors import AlreadyError, UnsafeError, UsageError, require_root
from cachemgr.core.model import (
    BcacheBacking,
    CacheMode,
    CacheSet,
    DmCacheDevice,
    DmWritecacheDevice,
    Snapshot,
    human,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import tuning
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import devices as devices_mod
from cachemgr.procedures.devices import BcacheDevice, CachedDevice, DmCache, LvmCache

DRAIN_TIMEOUT = 24 * 3600.0
DETACH_TIMEOUT = 3600.0
STALL_TIMEOUT = 60.0


def status(sysfs: Sysfs, *, probe_unregistered: bool = False, vms: bool = False,
           uri: str | None = None, stats: bool = True,
           cache: ScanCache | None = None) -> Snapshot:
    """Everything on the host, once: the one snapshot every face reads. ``vms``: with the
    libvirt domains of ``uri`` (default qemu:///system) above the caches. ``stats`` False:
    a poll's scan, without bcache's five_minute/hour/day stats; ``cache``: the poller's
    (snapshot.take)."""
    return snapshot_mod.take(sysfs, probe_unregistered=probe_unregistered, vms=vms, uri=uri,
                             stats=stats, cache=cache)


# a poller's pieces (the TUI imports the command layer only)
carry_stats = snapshot_mod.carry_stats


def parse_mode(word: str, *, hint: str = "use writethrough, writeback, writearound or none"
               ) -> CacheMode:
    try:
        return CacheMode(word)
    except ValueError:
        raise UsageError(f"unknown cache mode {word!r}", hint=hint) from None


def _lock_backing(b: BcacheBacking):  # type: ignore[no-untyped-def]
    """The lock a drain, autoattach and every command take on a backing device."""
    return state.locked(b.key, b.device or b.identity.node)


def _lock_set(uuid: str):  # type: ignore[no-untyped-def]
    """The lock replace-ssd and every cache-set command take on a cache set."""
    return state.locked(f"replace-{uuid}", f"cache set {uuid}")


def _ctl(ctl: Control | None, what: str) -> Control:
    return ctl if ctl is not None else Control(what=what)


# ----------------------------------------------------------------------------- mode / drain


def _timeouts(timeout: float, stall_timeout: float | None = None) -> None:
    """A nan timeout never expires and a negative one expires at once: UsageError (exit 2),
    in the CLI's words, whichever face passed it."""
    checks.seconds(timeout, "--timeout")
    if stall_timeout is not None:
        checks.seconds(stall_timeout, "--stall-timeout")


def mode(sysfs: Sysfs, target: str, mode_word: str, *, drain: bool = False,
         ctl: Control | None = None, timeout: float = DRAIN_TIMEOUT,
         stall_timeout: float = STALL_TIMEOUT) -> Result:
    """Switch the cache mode. bcache allows any switch while dirty (writeback goes on; a
    note says so); dm-cache refuses passthrough while dirty unless ``drain``, which flushes
    and then loads passthrough. ``drain`` also waits until clean."""
    _timeouts(timeout, stall_timeout)
    ctl = _ctl(ctl, f"mode {mode_word} on {target}")
    new = parse_mode(mode_word)
    snap = status(sysfs, probe_unregistered=False)
    dev = devices_mod.resolve(snap, target, sysfs)
    if isinstance(dev, LvmCache):
        if not drain:
            return Result(changes=[dev.set_mode(sysfs, new)])
        before = dev.lv.cache_mode or (dev.mode.value if dev.mode else "?")
        d = dev.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                      progress=ctl.report, final_mode=new)
        out = Result(changes=[bcache.Change(dev.lv.full_name, "cache_mode", before, new.value)]
                     if d.restored.get("switched") else [])
        if d.start_bytes:
            out.notes.append(d.summary())
        return out
    if isinstance(dev, DmCache):
        if not drain:
            return Result(changes=[dev.set_mode(sysfs, new)])
        if dev.mode == new:
            return _drained(sysfs, dev, ctl, timeout, stall_timeout, resume=False)
        d = dev.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                      progress=ctl.report, final_mode=new)
        return Result(changes=[bcache.Change(dev.node, "cache_mode", dev.d.mode.value,
                                             new.value)] if d.restored.get("switched") else [])
    assert isinstance(dev, BcacheDevice)
    b = dev.b
    require_root("changing a cache mode")
    out = Result()
    with _lock_backing(b):
        try:
            out.changes = [bcache.set_mode(sysfs, b, new)]
        except AlreadyError:
            if not drain:
                raise
        if drain:
            try:
                d = dev.reread(sysfs).drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                                            progress=ctl.report)
                out.notes.append(d.summary())
            except AlreadyError:
                pass
        elif b.dirty and not b.dirty.is_zero(512) and new != CacheMode.WRITEBACK:
            out.notes.append(f"{b.device}: {human(b.dirty.bytes)} of dirty data is still being "
                             "written back; 'cachemgr drain' (or mode --drain) makes that fast")
    return out


def _drained(sysfs: Sysfs, dev: CachedDevice, ctl: Control, timeout: float,
             stall_timeout: float, *, resume: bool) -> Result:
    out = Result()
    if resume:
        restored = dev.restore_interrupted(sysfs)
        if not restored:
            what = "flush" if dev.kind == "dm-cache" else "drain"
            raise AlreadyError(f"{dev.node}: no interrupted {what} to resume")
        if dev.kind == "dm-cache":
            out.notes.append(f"{dev.node}: restored table {restored['table']}")
        elif isinstance(dev, LvmCache):
            out.notes.append(f"{dev.lv.full_name}: restored " + ", ".join(
                f"{k} {v}" for k, v in restored.items()))
        else:
            out.notes.append(f"{dev.node}: restored tunables {restored}")
        dev = dev.reread(sysfs)
    try:
        d = dev.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                      progress=ctl.report)
    except AlreadyError:
        if not resume:
            raise
        out.notes.append(f"{dev.node}: already clean")
        return out
    out.lines.append(d.summary())
    out.data = {"schema": 1, "device": d.device, "clean": True,
                "drained_bytes": d.start_bytes, "seconds": round(d.elapsed_s, 2),
                "restored": d.restored}
    out.value = d
    return out


def drain(sysfs: Sysfs, target: str, *, ctl: Control | None = None, resume: bool = False,
          timeout: float = DRAIN_TIMEOUT, stall_timeout: float = STALL_TIMEOUT) -> Result:
    """Write every dirty block back as fast as the backing device allows, with progress;
    every tunable (or table) changed for it is put back. ``resume`` first puts back what an
    interrupted drain left."""
    _timeouts(timeout, stall_timeout)
    ctl = _ctl(ctl, f"drain of {target}")
    snap = status(sysfs, probe_unregistered=False)
    lv = lvm_spelling(target)
    if resume and lv and devices_mod.find(snap, target, sysfs) is None \
            and lvm_manage.journal_for(lv).exists():
        # killed after lvm2 split or uncached it: no cache left on the LV to restore
        done = lvm_manage.restore_split(lv)
        return Result(notes=[f"{lv}: an interrupted detach/remove had split the cache off; "
                             + (f"policy {done['policy']} put back on {done['on']}" if done
                                else "nothing left to put back")])
    dev = devices_mod.resolve(snap, target, sysfs)
    if isinstance(dev, BcacheDevice):
        require_root("draining")
        with _lock_backing(dev.b):
            return _drained(sysfs, dev, ctl, timeout, stall_timeout, resume=resume)
    return _drained(sysfs, dev, ctl, timeout, stall_timeout, resume=resume)


# ----------------------------------------------------------------------------- attach/detach


def attach(sysfs: Sysfs, backing: str, cache: str, *, writecache: bool = False,
           mode: str | None = None) -> Result:
    """Attach a bcache backing device to a cache set (its UUID or its SSD); or an LVM cache
    pool or cachevol to an LV, through lvm2 (``writecache``: as lvm writecache)."""
    origin_lv, cache_lv = lvm_spelling(backing), lvm_spelling(cache)
    if origin_lv is not None and cache_lv is not None:
        m = parse_mode(mode, hint="writeback, writethrough or passthrough") if mode else None
        return Result(changes=[lvm_manage.attach(origin_lv, cache_lv, writecache=writecache,
                                                 mode=m)])
    if writecache or mode:
        raise UsageError("--writecache and --mode apply to LVM caches (VG/LV VG/POOL) only",
                         hint="a bcache device takes its mode with 'cachemgr mode'")
    snap = status(sysfs, probe_unregistered=False)
    b = resolve_backing(snap, backing, sysfs)
    c = resolve_cache_set(snap, cache, sysfs)
    require_root("attaching")
    with _lock_backing(b), _lock_set(c.uuid):
        return Result(changes=[bcache.attach(sysfs, b, c)])


def detach(sysfs: Sysfs, backing: str, *, ctl: Control | None = None,
           timeout: float = DETACH_TIMEOUT) -> Result:
    """Detach (bcache flushes first; waits with progress). Cancelling stops the wait only:
    the kernel finishes the detach by itself."""
    _timeouts(timeout)
    ctl = _ctl(ctl, f"detach of {backing}")
    snap = status(sysfs, probe_unregistered=False)
    dev = devices_mod.find(snap, backing, sysfs)
    if isinstance(dev, LvmCache):
        return Result(changes=dev.detach(timeout=timeout, stall_timeout=STALL_TIMEOUT,
                                         progress=ctl.report))
    b = resolve_backing(snap, backing, sysfs)
    require_root("detaching")
    with _lock_backing(b):
        return Result(changes=[bcache.detach(sysfs, b, timeout=timeout, progress=ctl.report)])


# ----------------------------------------------------------------------------- create/remove


def create_bcache(sysfs: Sysfs, *, backings: Sequence[str], cache: str | None,
                  mode: str | None = None, bucket: str | None = None,
                  force: bool = False) -> Result:
    """make-bcache, register, attach (and the mode)."""
    m = parse_mode(mode, hint="writethrough, writeback, writearound or none") if mode else None
    return Result(changes=bcache.create(sysfs, backings=list(backings), cache=cache or None,
                                        mode=m, bucket=bucket or None, force=force))


def create_dmcache(sysfs: Sysfs, *, name: str, origin: str, cache: str, metadata: str,
                   mode: str | None = None, block_size: str | None = None,
                   force: bool = False) -> Result:
    """A dm-cache device over ``origin`` (its data kept)."""
    if not (name and origin and cache and metadata):
        raise UsageError("create dm-cache needs NAME, --origin DEV, --cache DEV and "
                         "--metadata DEV")
    m = parse_mode(mode or "writeback", hint="writeback, writethrough or passthrough")
    block = dmcache.parse_size(block_size) if block_size else None
    return Result(changes=dmcache.create(sysfs, name, origin=origin, cache=cache,
                                         metadata=metadata, mode=m, block_bytes=block,
                                         force=force))


def remove(sysfs: Sysfs, target: str, *, keep_device: bool = False,
           ctl: Control | None = None, timeout: float = DETACH_TIMEOUT,
           stall_timeout: float = STALL_TIMEOUT) -> Result:
    """Safe decommission: a backing device is detached (flushes), then stopped; a dm-cache
    device is flushed and removed (or kept as a linear mapping); a cache set is unregistered
    once nothing is attached and no stopped backing device left dirty data on its SSD."""
    _timeouts(timeout, stall_timeout)
    ctl = _ctl(ctl, f"remove of {target}")
    snap = status(sysfs, probe_unregistered=False)
    dev = devices_mod.find(snap, target, sysfs)
    if isinstance(dev, (DmCache, LvmCache)):
        return Result(changes=dev.remove(sysfs, keep_device=keep_device, timeout=timeout,
                                         stall_timeout=stall_timeout, progress=ctl.report))
    require_root("removing")
    if isinstance(dev, BcacheDevice):
        with _lock_backing(dev.b):
            return Result(changes=dev.remove(sysfs, keep_device=keep_device, timeout=timeout,
                                             stall_timeout=stall_timeout, progress=ctl.report))
    return remove_cache_set(sysfs, resolve_cache_set(snap, target, sysfs))


def remove_cache_set(sysfs: Sysfs, c: CacheSet) -> Result:
    """Unregister ``c``: refused while backing devices are attached or dirty, and while a
    backing device that bcache stopped still has its dirty data on this SSD (it is no longer
    listed in the set; only its superblock says so)."""
    with _lock_set(c.uuid):
        full = status(sysfs, probe_unregistered=True)
        refuse_orphaned_dirt(full, c.uuid, doing="unregistering the cache set",
                             then="run remove again")
        refuse_unreadable(sysfs, c.uuid, "unregistering the cache set")
        cur = full.cache_set(c.uuid) or c
        return Result(changes=[bcache.unregister_cache_set(sysfs, cur, full.backings)])


# ----------------------------------------------------------------------------- tune


def tunables_of(obj: object) -> dict[str, tuple[int, int]]:
    """What can be tuned on ``obj`` and the library's bounds."""
    if isinstance(obj, BcacheBacking):
        return dict(bcache.BACKING_TUNABLES)
    if isinstance(obj, CacheSet):
        return dict(bcache.SET_TUNABLES)
    if isinstance(obj, (DmCacheDevice, DmWritecacheDevice)) and obj.lvm is not None:
        return lvm_manage.tunables(obj)
    if isinstance(obj, DmCacheDevice):
        return {"migration_threshold": (0, 2**31 - 1)}
    return {}


def tune(sysfs: Sysfs, target: str, settings: Sequence[str]) -> Result:
    """NAME=VALUE settings; every one is checked before the first write; "already so" for
    each unchanged one (a note), and exit 4 when none changed."""
    snap = status(sysfs, probe_unregistered=False)
    changes, already = tuning.tune(sysfs, snap, target, settings)
    return Result(changes=changes, notes=list(already), already=not changes and bool(already))


# ----------------------------------------------------------------------------- dangerous


def force_run(sysfs: Sysfs, backing: str, *, accept_data_loss: bool = False) -> Result:
    """Start a backing device without its cache: refused unless the caller accepts the
    data loss in so many words."""
    if not accept_data_loss:
        raise UnsafeError(
            "starting a backing device without its cache can corrupt its filesystem when its "
            "dirty data was in that cache",
            hint="bring the cache back instead; if it is gone for good, repeat with "
                 "--i-accept-data-loss",
        )
    b = resolve_backing(status(sysfs, probe_unregistered=False), backing, sysfs)
    require_root("force-run")
    with _lock_backing(b):
        return Result(changes=[bcache.force_run(sysfs, b,
                                                bcache.AcceptDataLoss.I_ACCEPT_DATA_LOSS)])


def stop_set(sysfs: Sysfs, cache: str, *, accept_data_loss: bool = False) -> Result:
    """Stop a cache set without flushing: refused unless the data loss is accepted."""
    if not accept_data_loss:
        raise UnsafeError(
            "stopping a cache set stops every backing device on it (the VMs' disks vanish) "
            "and leaves dirty data behind on the SSD",
            hint="use 'cachemgr remove' (flushes first); to stop anyway, repeat with "
                 "--i-accept-data-loss",
        )
    c = resolve_cache_set(status(sysfs, probe_unregistered=False), cache, sysfs)
    require_root("stop-set")
    with _lock_set(c.uuid):
        return Result(changes=[bcache.stop_cache_set(
            sysfs, c, bcache.AcceptDataLoss.I_ACCEPT_DATA_LOSS)])


# ----------------------------------------------------------------------------- words


def dirty_consequence(obj: object, mode: CacheMode) -> str:
    """What happens to the dirty data when switching ``obj`` to ``mode`` (a confirmation
    text)."""
    if isinstance(obj, DmWritecacheDevice):
        return ("dm-writecache has only writeback: new writes land in the cache first and "
                "are dirty until written back.")
    if isinstance(obj, DmCacheDevice) and obj.lvm is not None and mode != CacheMode.WRITEBACK \
            and obj.dirty_bytes:
        return (f"{obj.lvm.full_name} holds {human(obj.dirty_bytes)} of dirty data: a plain "
                "switch is refused (lvm2 would flush it with no progress); 'switch + drain' "
                "drains it with progress, then switches.")
    if isinstance(obj, DmCacheDevice):
        d = obj.dirty_bytes
        if mode == CacheMode.PASSTHROUGH and (d is None or d > 0):
            return (f"{obj.node} holds {human(d)} of dirty data: dm-cache accepts passthrough "
                    "only when every block is clean, so a plain switch is refused; "
                    "'switch + drain' flushes first, then loads passthrough.")
        if mode == CacheMode.WRITEBACK:
            return ("New writes will land in the cache first: they are dirty (lost if the "
                    "cache device dies) until written back.")
        if d:
            return (f"{human(d)} of dirty data stays in the cache and keeps being written "
                    "back; 'switch + drain' writes it back now.")
        return "The cache is clean: nothing is at risk."
    if isinstance(obj, BcacheBacking):
        dev = obj.device or obj.identity.node
        dirty = obj.dirty.bytes if obj.dirty else None
        if mode == CacheMode.WRITEBACK:
            return ("New writes will land on the SSD first: they are dirty (lost if the SSD "
                    "dies) until bcache writes them back.")
        if dirty:
            return (f"{dev} has {human(dirty)} of dirty data. Switching does not make it clean: "
                    "bcache keeps writing it back, and with its defaults that is at 4 KiB/s "
                    "once below 10 % of the cache. 'switch + drain' writes it back fast "
                    "(cachemgr mode --drain).")
        return f"{dev} is clean: nothing is at risk."
    return ""


def status_json(snap: Snapshot, sysfs: Sysfs | None = None) -> dict[str, Any]:
    """``status --json``: schema 1 (docs/json.md). With ``sysfs``, also ``ssd_health``: each
    cache SSD's SMART health (smart.lookup: smartctl at most every 10 min per disk, cached;
    never on the snapshot's own scan)."""
    doc = snapshot_mod.to_json(snap)
    if sysfs is not None:
        doc["ssd_health"] = ssd_health_json(ssd_health(sysfs, snap))
    return doc


def ssd_health(sysfs: Sysfs, snap: Snapshot, *, max_age: float = smart.MAX_AGE) -> list[
        tuple[smart.Ssd, smart.Health | None]]:
    """Each cache SSD of ``snap`` with its SMART health (cached; smartctl for an answer older
    than ``max_age``: status, the TUI detail, ``ssd-health``)."""
    return smart.ssd_health(sysfs, snap, max_age=max_age)


def ssd_health_json(rows: list[tuple[smart.Ssd, smart.Health | None]]) -> list[dict[str, Any]]:
    """docs/json.md, ``ssd_health``: one entry per cache SSD."""
    return [{"device": ssd.node, "name": ssd.name, "caches": list(ssd.caches),
             "health": smart.health_json(h)}
            for ssd, h in rows]
