"""Block devices as every cache kind needs them: where each disk and partition is in sysfs,
its size, and whether something uses it (before a kind formats it or a replacement pulls
it). Shared by the bcache, dm-cache and LVM backends and the procedures; none owns it."""

from __future__ import annotations

from cachemgr.backends import inuse
from cachemgr.backends.scancache import ScanCache
from cachemgr.core.errors import UsageError
from cachemgr.core.sysfs import Sysfs


def block_dirs(sysfs: Sysfs, cache: ScanCache | None = None) -> dict[str, str]:
    """Kernel name -> device directory (relative to the sysfs root) of disks and partitions.
    With a ``cache``: listed once while no uevent was sent (a disk or partition that comes or
    goes sends one)."""
    if cache is not None:
        return cache.get("block_dirs", lambda: block_dirs(sysfs))
    out: dict[str, str] = {}
    for name in sysfs.block_names():
        base = f"block/{name}"
        out[name] = base
        for child in sysfs.listdir(base):
            # a partition's name extends its disk's (sda1, nvme0n1p1: disk_name() in
            # block/partitions/core.c); skipping the ~20 other entries per disk saves
            # hundreds of stat calls per scan (auto-attach profile in the UML lab)
            if child.startswith(name) and sysfs.exists(f"{base}/{child}/partition"):
                out[child] = f"{base}/{child}"
    return out


def in_use(sysfs: Sysfs, node: str) -> str | None:
    """Why a block device is busy (holders, registered with bcache, mounted, swap, or one of
    its partitions so: :func:`cachemgr.backends.inuse.uses`), or None."""
    name = sysfs.block_name_of(node)
    rel = block_dirs(sysfs).get(name) if name else None
    if name is None or rel is None:
        raise UsageError(f"{node}: no such block device")
    mountinfo, swaps = inuse.proc_texts(sysfs)
    found = inuse.uses(sysfs, rel, mountinfo=mountinfo, swaps=swaps)
    own = {u.kind for u in found if not u.partition}
    holders = [u.by for u in found if u.kind == "held" and not u.partition]
    if holders:
        return f"it is in use by {', '.join(holders)}"
    if "bcache" in own:
        return "it is registered with bcache"
    if "mounted" in own:
        return "it is mounted"
    if "swap" in own:
        return "it is in use as swap"
    part = next((u.member for u in found if u.partition), None)
    return f"its partition {part} is in use" if part else None


def device_bytes(sysfs: Sysfs, node: str) -> int | None:
    """A block device's size in bytes (its sysfs ``size``), or None when unknown."""
    name = sysfs.block_name_of(node)
    rel = block_dirs(sysfs).get(name) if name else None
    sectors = sysfs.read_int(f"{rel}/size") if rel else None
    return sectors * 512 if sectors is not None else None


def written_bytes(sysfs: Sysfs, name: str | None) -> int | None:
    """Bytes written to block device ``name`` since boot: ``block/NAME/stat``'s write sectors
    (the seventh field, in 512-byte sectors whatever the device's block size: the kernel's
    Documentation/block/stat.rst). None when it cannot be read."""
    if not name:
        return None
    f = (sysfs.read_opt(f"block/{name}/stat") or "").split()
    try:
        return int(f[6]) * 512
    except (IndexError, ValueError):
        return None
