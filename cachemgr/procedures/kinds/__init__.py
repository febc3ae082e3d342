"""The cache kinds, as a registry: one module per kind, each declaring how it is recognised,
its modes, its tunables, what it can do, its words and its operations (kinds/base.py).

:data:`REGISTRY` is the priority order in which a target an admin typed is recognised: the
LVM caches first (their dm names would also match dm-cache), then the dm-writecache LVM does
not describe, dm-cache, the bcache backing device, and the bcache cache set last. A target is
resolved once per command (:func:`resolve`), in one pass over the snapshot: the exact names
first, then the kernel name of a /dev path (read once).

A new kind is one new module with a :class:`~cachemgr.procedures.kinds.base.Kind` subclass
and one :func:`register` call; the command layer, the faces, the metrics and the udev worker
ask it and never branch on it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from cachemgr.backends.lvm.command import spelling as lvm_spelling
from cachemgr.core.errors import UsageError
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.kinds.base import ACTIONS, Drained, Kind
from cachemgr.procedures.kinds.bcache import Bcache, BcacheSet
from cachemgr.procedures.kinds.dm import DmCache, DmWritecache, LvmCache, LvmWritecache

__all__ = ["ACTIONS", "REGISTRY", "Bcache", "BcacheSet", "DmCache", "DmWritecache",
           "Drained", "Kind", "LvmCache", "LvmWritecache", "all_of", "find", "kind_named",
           "listed", "of", "on_disk", "register", "registering", "resolve", "scan_others",
           "unregister"]

REGISTRY: list[type[Kind]] = [LvmCache, LvmWritecache, DmWritecache, DmCache, Bcache, BcacheSet]


def register(kind: type[Kind], *, before: type[Kind] | None = None) -> None:
    """Add ``kind`` to the registry (before ``before`` in the priority order; else last)."""
    if kind in REGISTRY:
        return
    REGISTRY.insert(REGISTRY.index(before) if before in REGISTRY else len(REGISTRY), kind)


def unregister(kind: type[Kind]) -> None:
    if kind in REGISTRY:
        REGISTRY.remove(kind)


def kind_named(name: str) -> type[Kind] | None:
    return next((k for k in REGISTRY if k.name == name), None)


def registering(role: str) -> type[Kind] | None:
    """The kind whose unregistered disks carry the superblock role ``role`` (Kind.disk_role:
    bcache's "backing" and "cache"): the one that registers them."""
    return next((k for k in REGISTRY if k.disk_role == role), None)


def on_disk(snap: Snapshot, name: str) -> Kind | None:
    """The cached device of ``snap`` whose kernel name (its disk's, or its own) is
    ``name``, as its kind; None: none."""
    return next((k for k in all_of(snap, devices_only()) if name in k.kernel_names()), None)


def devices_only() -> list[type[Kind]]:
    """The kinds that are cached devices (not caches)."""
    return [k for k in REGISTRY if k.cached_device]


def all_of(snap: Snapshot, kinds: Sequence[type[Kind]] | None = None) -> Iterator[Kind]:
    """Every object of ``snap``, each as its kind, in the registry's order."""
    for k in kinds if kinds is not None else REGISTRY:
        for obj in k.objects(snap):
            yield k(obj)


def listed(snap: Snapshot, *, caches: bool = False) -> Iterator[Kind]:
    """Every cached device of ``snap`` (with ``caches``, then every cache set) as its kind,
    in the order status lists them: bcache, dm-cache and LVM caches, writecaches, then the
    objects of kinds registered beyond the built-in ones."""
    objs: list[Any] = [*snap.backings, *snap.dmcaches, *snap.writecaches, *snap.others]
    if caches:
        objs += snap.cache_sets
    for obj in objs:
        k = of(obj)
        if k is not None and (caches or k.cached_device):
            yield k


def scan_others(sysfs: Sysfs) -> tuple[Any, ...]:
    """The objects of every kind that scans for itself (Kind.scan: the kinds registered
    beyond the built-in ones, which the snapshot reads itself)."""
    return tuple(o for k in REGISTRY for o in k.scan(sysfs))


def of(obj: object) -> Kind | None:
    """The snapshot object ``obj`` as its kind (None: no registered kind owns it)."""
    for k in REGISTRY:
        if k.owns(obj):
            return k(obj)
    return None


def find(snap: Snapshot, target: str, sysfs: Sysfs | None,
         kinds: Sequence[type[Kind]] | None = None) -> Kind | None:
    """The object ``target`` names, as its kind; None when it names none. One pass: exact
    names in the registry's order, then the kernel name of a /dev path."""
    cands = list(all_of(snap, kinds))
    by_uuid = target.removeprefix("/dev/bcache/by-uuid/")
    for k in cands:
        if target in k.names() or by_uuid in k.names():
            return k
    if target.startswith("/dev/") and os.path.exists(target):
        name = (sysfs.block_name_of(target) if sysfs is not None else None) or \
            os.path.basename(os.path.realpath(target))
        for k in cands:
            if name in k.kernel_names():
                return k
    return None


def resolve(snap: Snapshot, target: str, sysfs: Sysfs | None, *, caches: bool = False
            ) -> Kind:
    """Like :func:`find` over the cached devices (with ``caches``, cache sets too); a target
    that names nothing is a usage error, in the words of the kind an admin most likely
    meant."""
    kinds = REGISTRY if caches else devices_only()
    found = find(snap, target, sysfs, kinds)
    if found is not None:
        return found
    if lvm_spelling(target) is not None and not target.startswith("/dev/mapper/"):
        lvs_trouble = [w for w in snap.warnings if "lvs" in w]
        raise UsageError(f"{target} is not a cached LV" + (
            f" ({lvs_trouble[0]})" if lvs_trouble else ""),
            hint="cachemgr status lists the cached LVs; lvs -a shows LVM's view")
    if target.startswith("/dev/") and not os.path.exists(target):
        raise UsageError(f"{target}: no such device",
                         hint="cachemgr status lists the cached devices on this host")
    if caches:
        raise UsageError(
            f"{target} is not a registered bcache cache set or cache device",
            hint="cachemgr status lists the cache sets; register the SSD first if it is not",
        )
    raise UsageError(
        f"{target} is not a bcache device or bcache backing device",
        hint="cachemgr status lists them; use /dev/bcacheN, the backing device or its UUID",
    )
