"""Discovery: the dm devices sysfs shows, the ones whose one target is ``cache`` (their
table, status and info from dmsetup), and the warnings a device's state deserves."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cachemgr.backends.bcache import cached_identity
from cachemgr.backends.blockdev import block_dirs
from cachemgr.backends.dmcache.command import DmsetupSource, default_source
from cachemgr.backends.dmcache.parse import (
    DmInfo,
    FailWord,
    parse_info,
    parse_listing,
    parse_status,
    parse_table,
    split_target_line,
)
from cachemgr.backends.scancache import ScanCache
from cachemgr.core.errors import CacheMgrError, CommandError, KernelFormatError, UsageError
from cachemgr.core.model import DmCacheDevice, DmCacheStatus, Identity
from cachemgr.core.sysfs import Sysfs


@dataclass(frozen=True)
class DmSys:
    kernel_name: str
    name: str
    uuid: str | None
    suspended: bool | None
    devno: str | None
    holders: tuple[str, ...]


@dataclass(frozen=True)
class DmName:
    """What a dm device's sysfs says that changes only with a uevent (a rename or a new UUID
    sends one: dm-ioctl.c), so a poll's :class:`ScanCache` keeps it."""

    kernel_name: str
    name: str
    uuid: str | None
    devno: str | None


def dm_names(sysfs: Sysfs, cache: ScanCache | None = None) -> dict[str, DmName]:
    """dm name -> kernel name, UUID and device number, from /sys/block/dm-*/."""
    if cache is not None:
        return cache.get("dm-names", lambda: dm_names(sysfs))
    out = {}
    for kname in sysfs.block_names():
        d = f"block/{kname}"
        if not kname.startswith("dm-") or not sysfs.is_dir(f"{d}/dm"):
            continue
        name = (sysfs.read_opt(f"{d}/dm/name") or "").strip()
        if not name:
            continue
        out[name] = DmName(
            kernel_name=kname, name=name,
            uuid=(sysfs.read_opt(f"{d}/dm/uuid") or "").strip() or None,
            devno=(sysfs.read_opt(f"{d}/dev") or "").strip() or None,
        )
    return out


def dm_sys(sysfs: Sysfs, n: DmName) -> DmSys:
    """``n`` with what changes without a uevent: suspended, holders."""
    d = f"block/{n.kernel_name}"
    susp = (sysfs.read_opt(f"{d}/dm/suspended") or "").strip()
    return DmSys(kernel_name=n.kernel_name, name=n.name, uuid=n.uuid,
                 suspended=None if susp not in ("0", "1") else susp == "1", devno=n.devno,
                 holders=tuple(sysfs.listdir(f"{d}/holders")))


def dm_devices(sysfs: Sysfs) -> dict[str, DmSys]:
    """dm name -> what /sys/block/dm-*/dm/ says of it."""
    return {name: dm_sys(sysfs, n) for name, n in dm_names(sysfs).items()}


def dm_identity(sysfs: Sysfs, devno: str, dirs: dict[str, str],
                cache: ScanCache | None = None) -> Identity | None:
    if devno.startswith("/dev/"):
        name = sysfs.block_name_of(devno)
    else:
        target = sysfs.readlink(f"dev/block/{devno}")
        name = os.path.basename(target.rstrip("/")) if target else None
    if name is None or name not in dirs:
        return None
    return cached_identity(sysfs, name, dirs[name], cache)


@dataclass(frozen=True)
class Found:
    """One dm device whose one target is the kind looked for: its table and status lines and
    what sysfs and ``dmsetup info`` say of it."""

    name: str
    table: str
    status: str
    sys: DmSys | None
    info: DmInfo | None

    @property
    def kernel_name(self) -> str:
        return self.sys.kernel_name if self.sys else "?"

    @property
    def devno(self) -> str | None:
        return self.sys.devno if self.sys else (self.info.devno if self.info else None)

    @property
    def uuid(self) -> str | None:
        return self.sys.uuid if self.sys else (self.info.uuid if self.info else None)

    @property
    def open_count(self) -> int | None:
        return self.info.open_count if self.info else None

    @property
    def suspended(self) -> bool | None:
        return self.sys.suspended if self.sys else None

    @property
    def holders(self) -> tuple[str, ...]:
        return self.sys.holders if self.sys else ()


def find_targets(sysfs: Sysfs, source: DmsetupSource | None, target: str, kind: str,
                 cache: ScanCache | None = None) -> tuple[list[Found], list[str]]:
    """Every dm device whose one target is ``target`` (``cache``, ``writecache``), and the
    warnings for the ones cachemgr cannot read (``kind`` names them). Runs no command when
    there is no dm device at all; a dmsetup failure (not installed, not root) is a warning.
    Reads the dynamic sysfs files (suspended, holders) of the devices found only."""
    devs = dm_names(sysfs, cache)
    if not devs:
        return [], []
    src = source or default_source(sysfs)
    try:
        tables = parse_listing(src.output("table"), set(devs))
        names = [n for n, lines in tables.items()
                 if any(split_target_line(x)[2] == target for x in lines)]
        if not names:
            return [], []
        statuses = parse_listing(src.output("status"), set(devs))
        infos = parse_info(src.output("info"))
    except CommandError as exc:
        why = "dmsetup needs root" if "ermission" in exc.stderr else str(exc)
        return [], [f"{kind} devices not read: {why}"]
    except CacheMgrError as exc:
        return [], [f"{kind} devices not read: {exc}"]
    found: list[Found] = []
    warnings: list[str] = []
    for name in sorted(names):
        if len(tables[name]) != 1 or len(statuses.get(name, [])) != 1:
            warnings.append(f"{name}: {len(tables[name])} targets including a {target} target; "
                            f"cachemgr manages single-target {kind} devices only")
            continue
        n = devs.get(name)
        found.append(Found(name, tables[name][0], statuses[name][0],
                           dm_sys(sysfs, n) if n else None, infos.get(name)))
    return found, warnings


@dataclass(frozen=True)
class DmCacheScan:
    devices: tuple[DmCacheDevice, ...]
    warnings: tuple[str, ...]


def scan(sysfs: Sysfs, source: DmsetupSource | None = None, *,
         cache: ScanCache | None = None) -> DmCacheScan:
    """Every dm device whose one target is ``cache``."""
    found, warnings = find_targets(sysfs, source, "cache", "dm-cache", cache)
    if not found and not warnings:
        return DmCacheScan((), ())
    dirs = block_dirs(sysfs, cache)
    out = []
    for f in found:
        try:
            table = parse_table(f.table)
        except KernelFormatError as exc:
            warnings.append(f"{f.name}: {exc}")
            continue
        # a status line of a form cachemgr does not read keeps the device, as "unknown"
        # with its raw line: it is listed and every change to it is refused, never dropped
        st: DmCacheStatus | FailWord | None
        try:
            st = parse_status(f.status)
        except KernelFormatError:
            st = None
        dev = DmCacheDevice(
            name=f.name,
            kernel_name=f.kernel_name,
            devno=f.devno,
            uuid=f.uuid,
            table=table,
            status=st if isinstance(st, DmCacheStatus) else None,
            failure=st if isinstance(st, str) else None,
            raw_status=f.status.strip() if st is None else None,
            metadata=dm_identity(sysfs, table.metadata_dev, dirs, cache),
            cache=dm_identity(sysfs, table.cache_dev, dirs, cache),
            origin=dm_identity(sysfs, table.origin_dev, dirs, cache),
            open_count=f.open_count,
            suspended=f.suspended,
            holders=f.holders,
        )
        warnings.extend(device_warnings(dev))
        out.append(dev)
    return DmCacheScan(tuple(out), tuple(warnings))


def device_warnings(d: DmCacheDevice) -> list[str]:
    w = []
    if d.unread:
        w.append(f"{d.node}: dmsetup status printed a line cachemgr cannot read: its state "
                 "and dirty data are unknown and every change to it is refused "
                 f"(status: {d.raw_status})")
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
