"""Discovery: the dm devices sysfs shows, the ones whose one target is ``cache`` (their
table, status and info from dmsetup), and the warnings a device's state deserves."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cachemgr.backends.bcache import block_dirs, identity
from cachemgr.backends.dmcache.command import DmsetupSource, default_source
from cachemgr.backends.dmcache.parse import (
    parse_info,
    parse_listing,
    parse_status,
    parse_table,
    split_target_line,
)
from cachemgr.core.errors import CacheMgrError, CommandError, KernelFormatError, UsageError
from cachemgr.core.model import DmCacheDevice, Identity
from cachemgr.core.sysfs import Sysfs


@dataclass(frozen=True)
class DmSys:
    kernel_name: str
    name: str
    uuid: str | None
    suspended: bool | None
    devno: str | None
    holders: tuple[str, ...]


def dm_devices(sysfs: Sysfs) -> dict[str, DmSys]:
    """dm name -> what /sys/block/dm-*/dm/ says of it."""
    out = {}
    for kname in sysfs.block_names():
        d = f"block/{kname}"
        if not kname.startswith("dm-") or not sysfs.is_dir(f"{d}/dm"):
            continue
        name = (sysfs.read_opt(f"{d}/dm/name") or "").strip()
        if not name:
            continue
        susp = (sysfs.read_opt(f"{d}/dm/suspended") or "").strip()
        out[name] = DmSys(
            kernel_name=kname, name=name,
            uuid=(sysfs.read_opt(f"{d}/dm/uuid") or "").strip() or None,
            suspended=None if susp not in ("0", "1") else susp == "1",
            devno=(sysfs.read_opt(f"{d}/dev") or "").strip() or None,
            holders=tuple(sysfs.listdir(f"{d}/holders")),
        )
    return out


def _identity(sysfs: Sysfs, devno: str, dirs: dict[str, str]) -> Identity | None:
    if devno.startswith("/dev/"):
        name = sysfs.block_name_of(devno)
    else:
        target = sysfs.readlink(f"dev/block/{devno}")
        name = os.path.basename(target.rstrip("/")) if target else None
    if name is None or name not in dirs:
        return None
    return identity(sysfs, name, dirs[name])


@dataclass(frozen=True)
class DmCacheScan:
    devices: tuple[DmCacheDevice, ...]
    warnings: tuple[str, ...]


def scan(sysfs: Sysfs, source: DmsetupSource | None = None) -> DmCacheScan:
    """Every dm device whose one target is ``cache``. Runs no command when there is no dm
    device at all; a dmsetup failure (not installed, not root) becomes a warning."""
    devs = dm_devices(sysfs)
    if not devs:
        return DmCacheScan((), ())
    src = source or default_source(sysfs)
    warnings: list[str] = []
    try:
        tables = parse_listing(src.output("table"), set(devs))
        cache_names = [n for n, lines in tables.items()
                       if any(split_target_line(x)[2] == "cache" for x in lines)]
        if not cache_names:
            return DmCacheScan((), ())
        statuses = parse_listing(src.output("status"), set(devs))
        infos = parse_info(src.output("info"))
    except CommandError as exc:
        why = "dmsetup needs root" if "ermission" in exc.stderr else str(exc)
        return DmCacheScan((), (f"dm-cache devices not read: {why}",))
    except CacheMgrError as exc:
        return DmCacheScan((), (f"dm-cache devices not read: {exc}",))
    dirs = block_dirs(sysfs)
    out = []
    for name in sorted(cache_names):
        if len(tables[name]) != 1 or len(statuses.get(name, [])) != 1:
            warnings.append(f"{name}: {len(tables[name])} targets including a cache target; "
                            "cachemgr manages single-target dm-cache devices only")
            continue
        try:
            table = parse_table(tables[name][0])
            st = parse_status(statuses[name][0])
        except KernelFormatError as exc:
            warnings.append(f"{name}: {exc}")
            continue
        sysd = devs.get(name)
        info = infos.get(name)
        dev = DmCacheDevice(
            name=name,
            kernel_name=sysd.kernel_name if sysd else "?",
            devno=sysd.devno if sysd else (info.devno if info else None),
            uuid=sysd.uuid if sysd else (info.uuid if info else None),
            table=table,
            status=None if isinstance(st, str) else st,
            failure=st if isinstance(st, str) else None,
            metadata=_identity(sysfs, table.metadata_dev, dirs),
            cache=_identity(sysfs, table.cache_dev, dirs),
            origin=_identity(sysfs, table.origin_dev, dirs),
            open_count=info.open_count if info else None,
            suspended=sysd.suspended if sysd else None,
            holders=sysd.holders if sysd else (),
        )
        warnings.extend(device_warnings(dev))
        out.append(dev)
    return DmCacheScan(tuple(out), tuple(warnings))


def device_warnings(d: DmCacheDevice) -> list[str]:
    w = []
    if d.failure:
        w.append(f"{d.node}: the kernel reports the cache as {d.failure}: its dirty blocks "
                 "cannot be written back; do not remove or reuse its cache device "
                 f"({d.cache.node if d.cache else d.table.cache_dev}); see dmesg")
    if d.status and d.status.needs_check:
        w.append(f"{d.node}: the cache metadata needs a check (cache_check from "
                 "thin-provisioning-tools, with the device stopped)")
    if d.status and d.status.metadata_mode == "ro":
        w.append(f"{d.node}: the cache metadata is read-only (errors): no new cache blocks "
                 "are recorded")
    if d.suspended:
        w.append(f"{d.node} is suspended: IO to it blocks until it is resumed "
                 f"(an interrupted cachemgr run: cachemgr drain {d.name} --resume)")
    return w


def find(sysfs: Sysfs, name: str) -> DmCacheDevice:
    """The dm-cache device called ``name``, read now."""
    sc = scan(sysfs)
    for d in sc.devices:
        if d.name == name:
            return d
    raise UsageError(f"/dev/mapper/{name} is not a dm-cache device (any more)",
                     hint="cachemgr status lists the dm-cache devices on this host")
