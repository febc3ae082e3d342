"""TARGET resolution: what an admin has at hand -> the snapshot's object.

Accepted (every command's TARGET in docs/cli.md): /dev/bcache0, a backing device (/dev/sdb,
/dev/disk/by-id/..., any symlink to it), a bcache backing UUID, /dev/bcache/by-uuid/UUID, a
cset UUID, the cache device of a set; for dm-cache: /dev/mapper/NAME, /dev/dm-N, the dm name,
the dm UUID, or any link to the device. Errors name the target and say how to list valid ones.
"""

from __future__ import annotations

import os

from cachemgr.core.errors import UsageError
from cachemgr.core.model import (
    BcacheBacking,
    CacheSet,
    DmCacheDevice,
    DmWritecacheDevice,
    Snapshot,
)
from cachemgr.core.sysfs import Sysfs


def _kernel_name(target: str, sysfs: Sysfs | None) -> str | None:
    if not target.startswith("/dev/"):
        return None
    if not os.path.exists(target):
        raise UsageError(f"{target}: no such device",
                         hint="cachemgr status lists the cached devices on this host")
    name = sysfs.block_name_of(target) if sysfs else None
    return name or os.path.basename(os.path.realpath(target))


def resolve_backing(snap: Snapshot, target: str, sysfs: Sysfs | None = None) -> BcacheBacking:
    """A bcache backing device (or its /dev/bcacheN) named any way an admin would."""
    by_uuid = target.removeprefix("/dev/bcache/by-uuid/")
    for b in snap.backings:
        if by_uuid == b.uuid or target in (b.device, b.identity.node):
            return b
    name = _kernel_name(target, sysfs)
    for b in snap.backings:
        if name is not None and name in (b.device_name, b.identity.name):
            return b
    raise UsageError(
        f"{target} is not a bcache device or bcache backing device",
        hint="cachemgr status lists them; use /dev/bcacheN, the backing device or its UUID",
    )


def resolve_cache_set(snap: Snapshot, target: str, sysfs: Sysfs | None = None) -> CacheSet:
    """A cache set by its UUID or by its cache device (the SSD)."""
    for c in snap.cache_sets:
        if target == c.uuid or any(target == x.identity.node for x in c.caches):
            return c
    name = _kernel_name(target, sysfs)
    for c in snap.cache_sets:
        if name is not None and any(name == x.identity.name for x in c.caches):
            return c
    raise UsageError(
        f"{target} is not a registered bcache cache set or cache device",
        hint="cachemgr status lists the cache sets; register the SSD first if it is not",
    )


def find_dmcache(snap: Snapshot, target: str, sysfs: Sysfs | None = None
                 ) -> DmCacheDevice | None:
    """The dm-cache device ``target`` names, or None when it names none (then the bcache
    resolvers get their turn, so bcache paths keep working unchanged)."""
    for d in snap.dmcaches:
        if target in (d.name, d.node, d.kernel_name, f"/dev/{d.kernel_name}") or (
                d.uuid and target == d.uuid):
            return d
    if target.startswith("/dev/") and os.path.exists(target) and sysfs is not None:
        name = sysfs.block_name_of(target)
        for d in snap.dmcaches:
            if name is not None and name == d.kernel_name:
                return d
    return None


def resolve_dmcache(snap: Snapshot, target: str, sysfs: Sysfs | None = None) -> DmCacheDevice:
    d = find_dmcache(snap, target, sysfs)
    if d is None:
        raise UsageError(f"{target} is not a dm-cache device",
                         hint="cachemgr status lists them; use /dev/mapper/NAME or the dm name")
    return d


def find_dm(snap: Snapshot, target: str, sysfs: Sysfs | None = None,
            *, lvm: bool) -> DmCacheDevice | DmWritecacheDevice | None:
    """A dm-cache or dm-writecache device ``target`` names: with ``lvm``, only those LVM's
    report joined (``VG/LV``, ``/dev/VG/LV``, ``/dev/mapper/VG-LV``, the dm name or
    /dev/dm-N); without, only dm-writecache devices LVM does not describe."""
    devs = [x for x in snap.dm_devices
            if (x.lvm is not None) == lvm and (lvm or isinstance(x, DmWritecacheDevice))]
    for x in devs:
        names = {x.name, x.node, x.kernel_name, f"/dev/{x.kernel_name}"}
        if x.lvm is not None:
            names |= {x.lvm.full_name, f"/dev/{x.lvm.vg}/{x.lvm.lv}"}
        if target in names or (x.uuid and target == x.uuid):
            return x
    if target.startswith("/dev/") and os.path.exists(target) and sysfs is not None:
        name = sysfs.block_name_of(target)
        for x in devs:
            if name is not None and name == x.kernel_name:
                return x
    return None
