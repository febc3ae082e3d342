"""Building the one :class:`~cachemgr.core.model.Snapshot` and its stable JSON form.

JSON schema 1 (docs/json.md): ``{"schema": 1, "devices": [...], "caches": [...]}``.
``devices`` has one entry per cached device (a bcache backing device or a dm-cache device)
with at least kind, device, mode, state, dirty_bytes, cache.
``caches`` lists cache sets, including those without any backing device.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cachemgr.backends import bcache, dmcache, dmwritecache
from cachemgr.backends import vms as vms_mod
from cachemgr.backends.dmcache.discover import dm_names
from cachemgr.backends.scancache import ScanCache, once
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import (
    BcacheBacking,
    CacheSet,
    DmCacheDevice,
    DmWritecacheDevice,
    LvmCachedLv,
    NoisyNeighbour,
    Pressure,
    Snapshot,
    Stats,
    UnregisteredBcache,
    Unseen,
    Vm,
    VmCacheIo,
    VmScan,
)
from cachemgr.core.sysfs import Sysfs

SCHEMA = 1


def take(sysfs: Sysfs | None = None, *, probe_unregistered: bool = False,
         vms: bool = False, uri: str | None = None, stats: bool = True,
         cache: ScanCache | None = None) -> Snapshot:
    """Read everything once. ``probe_unregistered`` also reads the superblock of every
    unclaimed block device (finds backing devices bcache stopped after a cache failure); it
    opens devices, so pollers leave it off and `status` turns it on. ``vms``: also the
    libvirt domains of ``uri`` (default qemu:///system) above the caches.

    ``stats`` False is a poll's scan: what the table and the health model use, 6 reads a
    backing device (:func:`bcache.read_backing`): bcache's total hits and misses (not
    five_minute, hour, day: a poller carries them, :func:`carry_stats`); the tunables and
    bypass counters nothing else shows are the last full read's, kept by ``cache``
    (backends/scancache.py: dropped when this process writes to sysfs, ``keep`` seconds
    old, or on a uevent; read again then), so a poll's snapshot has every other field a
    full one has. ``cache``: a poller's :class:`ScanCache`, so identities, superblock
    fields, the device list and ``dmsetup table`` are read again only after a uevent;
    without one, nothing is kept (a one-shot poll reads the tunables too)."""
    sysfs = sysfs or Sysfs()
    if cache is not None:
        cache.begin(sysfs)
    cache = once(sysfs, cache)
    scan = bcache.scan(sysfs, stats=stats, cache=cache)
    unregistered: tuple[UnregisteredBcache, ...] = ()
    unseen: list[Unseen] = []
    privileged = sees_all(sysfs)
    if probe_unregistered:
        from cachemgr.backends import bcache_super

        unregistered = bcache_super.scan_unregistered(sysfs)
        if not privileged:
            closed = bcache_super.not_probed(sysfs)
            if closed:
                unseen.append(Unseen(
                    "superblocks", None, "opening a disk needs root",
                    f"whether {_few(closed)} carries a bcache superblock (a backing device "
                    "bcache stopped while dirty)"))
    src = _Once(dmcache.default_source(sysfs), cache)  # one dmsetup call per listing
    if privileged or not dm_names(sysfs, cache):
        dm = dmcache.scan(sysfs, src, cache=cache)
        wc = dmwritecache.scan(sysfs, src, cache=cache)
    else:
        # dmsetup opens /dev/mapper/control, root's only (crw-------): run by another user
        # it fails ("open failed: Permission denied", lab 7.2), and sysfs's dm/ directory
        # has no table: which dm devices are caches, and their dirty blocks, stay unseen
        names = sorted(dm_names(sysfs, cache))
        unseen.append(Unseen(
            "dmsetup", "/dev/mapper/control", "dmsetup needs root",
            f"which of the device-mapper devices {_few(names)} are dm-cache or dm-writecache "
            "devices, their modes, dirty blocks and failures"))
        dm, wc = dmcache.DmCacheScan((), ()), dmwritecache.WritecacheScan((), ())
    dmcaches, writecaches, lvm_warnings = _with_lvm(sysfs, dm.devices, wc.devices)
    snap = Snapshot(
        kernel=kernel_release(sysfs),
        bcache_loaded=scan.loaded,
        cache_sets=scan.cache_sets,
        backings=scan.backings,
        warnings=scan.warnings + dm.warnings + wc.warnings + lvm_warnings,
        unregistered=unregistered,
        dmcaches=dmcaches,
        writecaches=writecaches,
        unseen=tuple(unseen),
    )
    if vms:
        from cachemgr.backends import virsh

        snap = replace(snap, vms=vms_mod.scan(sysfs, snap, virsh.default_source(sysfs, uri),
                                              cache))
    return snap


def sees_all(sysfs: Sysfs) -> bool:
    """Whether a scan of ``sysfs`` can read everything it reads: run as root, or a captured
    tree (its dmsetup answers are files beside it, and it has no disks to open). Another
    user's scan of the live /sys lists what it could not read in ``Snapshot.unseen``."""
    return not sysfs.live or os.geteuid() == 0


def _few(names: list[str] | tuple[str, ...], most: int = 4) -> str:
    """``names`` in words, the first ``most`` of them and how many more."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def kernel_release(sysfs: Sysfs) -> str | None:
    """The release of the kernel whose objects ``sysfs`` shows: the host's for the live
    /sys; for a captured tree the one ``cachemgr capture`` recorded in meta.json beside its
    ``sys/`` (backends/capture.py), None when the capture has none (never the host's: the
    tree was not made by it)."""
    if sysfs.live:
        return platform.release()
    try:
        meta = json.loads((sysfs.root.parent / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    kernel = meta.get("kernel") if isinstance(meta, dict) else None
    return kernel if isinstance(kernel, str) and kernel.strip() else None


def carry_stats(snap: Snapshot, earlier: Snapshot | None) -> Snapshot:
    """A poll's snapshot (``stats=False``) with the five_minute/hour/day stats of an
    ``earlier`` one that has them (same backing device by its key, same cache set), for a
    poller that reads those at its own, slower pace. bcache folds its counters every ~13.6 s
    (stats.c, accounting_delay), so a reading is that old anyway."""
    if earlier is None:
        return snap

    def merged(new: dict[str, Stats], old: dict[str, Stats] | None) -> dict[str, Stats]:
        if not old:
            return new
        return {**{k: v for k, v in old.items() if k not in new}, **new}

    old_b = {b.key: b.stats for b in earlier.backings}
    old_c = {c.uuid: c.stats for c in earlier.cache_sets}
    return replace(
        snap,
        backings=tuple(replace(b, stats=merged(b.stats, old_b.get(b.key)))
                       for b in snap.backings),
        cache_sets=tuple(replace(c, stats=merged(c.stats, old_c.get(c.uuid)))
                         for c in snap.cache_sets))


class _Once:
    """A dmsetup source that runs each listing once (dm-cache and dm-writecache both read
    ``dmsetup table``); the table itself once while no uevent was sent (a table goes live on
    resume, which sends one: docs/kernel-notes.md, "uevent_seqnum")."""

    def __init__(self, inner: dmcache.DmsetupSource, cache: ScanCache) -> None:
        self.inner = inner
        self.cache = cache
        self.seen: dict[str, str] = {}

    def output(self, what: str) -> str:
        if what == "table":
            return self.cache.get(("dmsetup", what), lambda: self.inner.output(what))
        if what not in self.seen:
            self.seen[what] = self.inner.output(what)
        return self.seen[what]


def _with_lvm(sysfs: Sysfs, dms: tuple[DmCacheDevice, ...],
              wcs: tuple[DmWritecacheDevice, ...]
              ) -> tuple[tuple[DmCacheDevice, ...], tuple[DmWritecacheDevice, ...],
                         tuple[str, ...]]:
    """Join LVM's view (one lvs report) to the LVM-owned devices; lvs runs only when one
    exists. A failed lvs is a warning: the devices are still shown, without their LVM names."""
    if not any(d.lvm_owned for d in dms) and not any(w.lvm_owned for w in wcs):
        return dms, wcs, ()
    from cachemgr.backends.lvm import command as lvm_command
    from cachemgr.backends.lvm.report import cached_lvs

    try:
        lvs = cached_lvs(lvm_command.default_source(sysfs).report())
    except CacheMgrError as exc:
        return dms, wcs, (f"LVM's view not read (lvs): {str(exc).splitlines()[0]}",)
    return (tuple(replace(d, lvm=lvs.get(d.node)) if d.lvm_owned else d for d in dms),
            tuple(replace(w, lvm=lvs.get(w.node)) if w.lvm_owned else w for w in wcs), ())


def _stats_json(s: Stats) -> dict[str, Any]:
    return {
        "hits": s.hits,
        "misses": s.misses,
        "hit_ratio": s.computed_hit_ratio,
        "bypassed_bytes": s.bypassed.bytes if s.bypassed else None,
        "bypass_hits": s.bypass_hits,
        "bypass_misses": s.bypass_misses,
        "miss_collisions": s.miss_collisions,
    }


def _dirty(b: BcacheBacking) -> int | None:
    return b.dirty_bytes


def backing_json(b: BcacheBacking) -> dict[str, Any]:
    return {
        "kind": "bcache",
        "device": b.device,
        "backing": b.identity.node,
        "backing_uuid": b.uuid,
        "by_uuid": f"/dev/bcache/by-uuid/{b.uuid}" if b.uuid else None,
        "label": b.label,
        "mode": b.mode.value if b.mode else None,
        "state": b.state.value,
        # A backing device whose cache set is missing reads dirty_data 0 while its state
        # (from the superblock) says dirty: the dirty data is on the absent SSD, its amount
        # unknown (captured: tests/fixtures/bcache-missing-cache-*). Never report 0 then.
        "dirty_bytes": _dirty(b),
        "dirty_bytes_max": b.dirty.high if b.dirty and _dirty(b) is not None else None,
        "cache": b.cset_uuid,
        "running": b.running,
        "writeback_rate_bytes": b.writeback_rate.bytes if b.writeback_rate else None,
        "writeback_percent": b.writeback_percent,
        "writeback_delay": b.writeback_delay,
        "writeback_running": b.writeback_running,
        "sequential_cutoff_bytes": b.sequential_cutoff.bytes if b.sequential_cutoff else None,
        "io_errors": b.io_errors,
        "stats": {k: _stats_json(v) for k, v in b.stats.items()},
    }


def dmcache_json(d: DmCacheDevice) -> dict[str, Any]:
    """A dm-cache device in the same schema as a bcache one (docs/json.md)."""
    st = d.status
    hits = st.read_hits + st.write_hits if st else None
    misses = st.read_misses + st.write_misses if st else None
    return {
        "kind": "dm-cache",
        "device": d.node,
        "name": d.name,
        "dm_uuid": d.uuid,
        "lvm_owned": d.lvm_owned,
        "backing": d.origin.node if d.origin else d.table.origin_dev,
        "metadata": d.metadata.node if d.metadata else d.table.metadata_dev,
        "mode": d.mode.value,
        "state": d.state.value,
        # dirty blocks x block size; null when the kernel failed the cache (never 0 then)
        "dirty_bytes": d.dirty_bytes,
        "dirty_blocks": st.dirty if st else None,
        "cache": d.cache.node if d.cache else d.table.cache_dev,
        "failure": d.failure,
        # the status line as dmsetup printed it when cachemgr could not read it (state
        # "unknown", every change refused); else null
        "raw_status": d.raw_status,
        "block_bytes": d.block_bytes,
        "used_blocks": st.used if st else None,
        "total_blocks": st.total if st else None,
        "metadata_used_blocks": st.metadata_used if st else None,
        "metadata_total_blocks": st.metadata_total if st else None,
        "policy": st.policy if st else d.table.policy,
        "migration_threshold": st.migration_threshold if st else None,
        "features": list(st.features if st else d.table.features),
        "metadata_mode": st.metadata_mode if st else None,
        "needs_check": st.needs_check if st else None,
        "read_hits": st.read_hits if st else None,
        "read_misses": st.read_misses if st else None,
        "write_hits": st.write_hits if st else None,
        "write_misses": st.write_misses if st else None,
        "promotions": st.promotions if st else None,
        "demotions": st.demotions if st else None,
        "open_count": d.open_count,
        "suspended": d.suspended,
        "lvm": lvm_json(d.lvm),
        # the kernel's counters since the cache was created (kept in its metadata)
        "stats": {"total": {"hits": hits, "misses": misses,
                            "hit_ratio": st.hit_ratio if st else None}},
    }


def lvm_json(v: LvmCachedLv | None) -> dict[str, Any] | None:
    """LVM's view of a cached LV (null when LVM does not own the device or lvs failed)."""
    if v is None:
        return None
    return {
        "name": v.full_name,
        "vg": v.vg,
        "lv": v.lv,
        "lv_uuid": v.uuid,
        "segtype": v.segtype,
        "pool": f"{v.vg}/{v.pool}",
        "pool_kind": v.pool_kind,
        "pool_name_when_split": f"{v.vg}/{v.pool_name}",
        "origin_pvs": list(v.origin_pvs),
        "cache_pvs": list(v.cache_pvs),
        "cache_mode": v.cache_mode,
        "policy": v.policy,
        "settings": dict(v.settings),
        "chunk_bytes": v.chunk_bytes,
        "health": v.health or None,
        "check_needed": v.check_needed,
    }


def writecache_json(w: DmWritecacheDevice) -> dict[str, Any]:
    """A dm-writecache device in the devices list (docs/json.md)."""
    st = w.status
    settings = w.table.settings()
    reads, read_hits = (st.counter(0), st.counter(1)) if st else (None, None)
    return {
        "kind": "dm-writecache",
        "device": w.node,
        "name": w.name,
        "dm_uuid": w.uuid,
        "lvm_owned": w.lvm_owned,
        "backing": w.origin.node if w.origin else w.table.origin_dev,
        "cache": w.cache.node if w.cache else w.table.cache_dev,
        "mode": w.mode.value,
        "state": w.state.value,
        "dirty_bytes": w.dirty_bytes,
        "dirty_blocks": st.dirty if st else None,
        "free_blocks": st.free if st else None,
        "total_blocks": st.total if st else None,
        "writeback_blocks": st.writeback if st else None,
        "error": st.error if st else None,
        "failure": w.failure,
        "block_bytes": w.block_bytes,
        "pmem": w.table.pmem,
        # the kernel's defaults when not set (writecache.rst): 50 % and 45 %
        "high_watermark": int(settings.get("high_watermark", "50")),
        "low_watermark": int(settings.get("low_watermark", "45")),
        "settings": settings,
        "open_count": w.open_count,
        "suspended": w.suspended,
        "lvm": lvm_json(w.lvm),
        "stats": {"total": {"hits": read_hits,
                            "misses": (reads - read_hits) if reads is not None
                            and read_hits is not None else None,
                            "hit_ratio": (read_hits / reads) if reads and read_hits is not None
                            else None}},
    }


def cache_set_json(c: CacheSet, nodes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A cache set. ``nodes``: kernel name -> node of the backing devices (the snapshot's),
    so a backing device is named as in ``devices`` (``/dev/mapper/NAME``, not ``/dev/dm-N``);
    its kernel name stays in ``backing_kernel_names``."""
    nodes = nodes or {}
    return {
        "kind": "bcache-cache-set",
        "uuid": c.uuid,
        "cache_devices": [x.identity.node for x in c.caches],
        "backing_devices": [nodes.get(n, f"/dev/{n}") for n in c.backing_names],
        "backing_kernel_names": list(c.backing_names),
        "flash_volumes": c.flash_volumes,
        "cache_available_percent": c.cache_available_percent,
        "io_errors": sum(x.io_errors or 0 for x in c.caches),
        "errors": c.errors,
        "congested_read_threshold_us": c.congested_read_threshold_us,
        "congested_write_threshold_us": c.congested_write_threshold_us,
        "stats": {k: _stats_json(v) for k, v in c.stats.items()},
    }


def to_json(snap: Snapshot) -> dict[str, Any]:
    """Schema 1 (docs/json.md): every device named once, as an admin names it (a dm device
    by ``/dev/mapper/NAME``); kernel names only in fields that say so."""
    nodes = {b.identity.name: b.identity.node for b in snap.backings}
    devices = ([backing_json(b) for b in snap.backings]
               + [dmcache_json(d) for d in snap.dmcaches]
               + [writecache_json(w) for w in snap.writecaches])
    out = {
        "schema": SCHEMA,
        "kernel": snap.kernel,
        "bcache_loaded": snap.bcache_loaded,
        "devices": devices,
        "caches": [cache_set_json(c, nodes) for c in snap.cache_sets],
        "unregistered": [unregistered_json(u, snap) for u in snap.unregistered],
        "warnings": list(snap.warnings),
    }
    if snap.vms is not None:
        for dev in devices:
            dev["vms"] = [{"name": v.name, "disk": d.target, "cache": d.cache,
                           "pressure": pressure_json(v.pressure),
                           **_vm_on(v, dev["device"])}
                          for v, d in vms_mod.serving(snap.vms, dev["device"])]
        out.update(vm_scan_json(snap.vms))
    return out


def pressure_json(p: Pressure | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"some_avg10": p.some_avg10, "some_avg60": p.some_avg60,
            "some_total_us": p.some_total_us, "full_avg10": p.full_avg10,
            "full_avg60": p.full_avg60, "full_total_us": p.full_total_us}


def vm_json(v: Vm) -> dict[str, Any]:
    return {
        "name": v.name, "uuid": v.uuid, "state": v.state, "id": v.domain_id,
        "cgroup": v.cgroup, "pressure": pressure_json(v.pressure),
        "io": None if v.io is None else {"rbytes": v.io.rbytes, "wbytes": v.io.wbytes,
                                         "rios": v.io.rios, "wios": v.io.wios},
        "disks": [{"target": d.target, "bus": d.bus, "source_type": d.source_type,
                   "source": d.source, "cache": d.cache, "io": d.io, "read_only": d.read_only,
                   "stack": list(d.stack), "caches": list(d.caches),
                   "warnings": list(d.warnings), "unresolved": d.unresolved}
                  for d in v.disks],
        "cache_io": [cache_io_json(c) for c in v.cache_io],
        "warnings": list(v.warnings),
    }


def _vm_on(v: Vm, node: str) -> dict[str, Any]:
    """A VM's read hit ratio and slow-disk bytes on the cached device ``node``."""
    c = next((c for c in v.cache_io if c.cache == node), None)
    h = c.read_hit_ratio if c is not None else None
    return {"read_hit_ratio": None if h is None else round(h, 4),
            "slow_read_bytes": c.slow_read_bytes if c is not None else None}


def cache_io_json(c: VmCacheIo) -> dict[str, Any]:
    """A VM's reads through one cached device (docs/kernel-notes.md, "What a cache charges
    to a VM's cgroup")."""
    h = c.read_hit_ratio
    return {"cache": c.cache, "read_bytes": c.read_bytes,
            "slow_read_bytes": c.slow_read_bytes,
            "read_hit_ratio": None if h is None else round(h, 4), "unknown": c.why}


def noisy_json(n: NoisyNeighbour) -> dict[str, Any]:
    return {"cache": n.cache, "vm": n.vm, "share": round(n.share, 4),
            "slow_read_bytes": n.slow_read_bytes,
            "victims": [{"vm": v, "read_hit_ratio": None if h is None else round(h, 4)}
                        for v, h in n.victims],
            "text": n.text}


def vm_scan_json(s: VmScan) -> dict[str, Any]:
    """``vms`` (every domain) and ``host`` (the host's IO pressure) of status and vms."""
    return {"libvirt_uri": s.uri, "vms": [vm_json(v) for v in s.vms],
            "host": {"pressure": pressure_json(s.host_pressure),
                     "iowait_ticks": s.iowait_ticks},
            "vm_warnings": list(s.warnings),
            "noisy_neighbours": [noisy_json(n) for n in s.noisy]}


def unregistered_json(u: UnregisteredBcache, snap: Snapshot) -> dict[str, Any]:
    """What is known of a device bcache has not registered, and no more: dirty data on its
    cache set is "lost with the cache" only while that set's SSD is nowhere on the host
    (neither registered nor present unregistered); a transient fault that stopped the set
    leaves the SSD present and the dirty data on it (docs/json.md)."""
    registered = u.cset_uuid is not None and snap.cache_set(u.cset_uuid) is not None
    present = registered or any(x.kind == "cache" and x.cset_uuid == u.cset_uuid
                                for x in snap.unregistered)
    dirty = u.kind == "backing" and u.sb_state == "dirty"
    return {
        "kind": f"bcache-{u.kind}-unregistered",
        "device": u.identity.node,
        "uuid": u.uuid,
        "cache": u.cset_uuid,
        "superblock_state": u.sb_state,
        "superblock_mode": u.sb_mode,
        "dirty_data": dirty,
        "cache_registered": registered if u.cset_uuid else None,
        "cache_ssd_present": present if u.cset_uuid else None,
        "dirty_data_lost_with_cache": dirty and not present,
    }
