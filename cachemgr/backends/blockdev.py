"""Block devices as every cache kind needs them: where each disk and partition is in sysfs,
its size, and whether something uses it (before a kind formats it or a replacement pulls
it). Shared by the bcache, dm-cache and LVM backends and the procedures; none owns it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from cachemgr.backends import inuse
from cachemgr.backends.scancache import ScanCache
from cachemgr.core import pace
from cachemgr.core.errors import KernelFormatError, UsageError
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


@dataclass(frozen=True)
class BlockStat:
    """``/sys/block/<dev>/stat`` (Documentation/block/stat.rst), the fields used here: IOs and
    sectors (bench), and milliseconds spent (the sizing trace's latency model; fields 4, 8 and
    11, time_in_queue: every request's time in flight summed).

    Sample: ``3 0 24 30 92534 0 740272 8060 0 8090 8090 0 0 0 0 0 0``.
    """

    reads: int
    read_sectors: int
    writes: int
    write_sectors: int
    read_ms: int = 0
    write_ms: int = 0
    queue_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> BlockStat:
        f = text.split()
        if len(f) < 8 or not all(x.isdigit() for x in f[:8]):
            raise KernelFormatError("block device stat", text)
        ms = (int(f[3]), int(f[7]), int(f[10])) if len(f) >= 11 and f[10].isdigit() else ()
        return cls(int(f[0]), int(f[2]), int(f[4]), int(f[6]), *ms)

    def minus(self, other: BlockStat) -> BlockStat:
        return BlockStat(*(getattr(self, k.name) - getattr(other, k.name)
                           for k in fields(self)))


def read_stat(sysfs: Sysfs, rel: str | None) -> BlockStat | None:
    """The counters of the block device whose directory is ``rel`` (its ``stat``), None
    when there is none or it cannot be read or parsed."""
    text = sysfs.read_opt(f"{rel}/stat") if rel else None
    try:
        return BlockStat.parse(text) if text is not None else None
    except KernelFormatError:
        return None


def written_bytes(sysfs: Sysfs, name: str | None) -> int | None:
    """Bytes written to block device ``name`` since boot (:class:`BlockStat`'s write sectors,
    512-byte sectors whatever the device's block size). None when it cannot be read."""
    s = read_stat(sysfs, f"block/{name}" if name else None)
    return None if s is None else s.write_sectors * 512


def pace_sources(sysfs: Sysfs, vm: str | None, backing: str | None) -> tuple[
        Callable[[], pace.Counters | None], Callable[[], int | None]]:
    """What a paced drain's :class:`cachemgr.core.pace.Sampler` reads: the counters of
    block device ``vm`` (the one the VMs use: its IOs, their milliseconds, sectors written)
    and the sectors written to ``backing`` (where the drain writes). The stat files are found
    once: listing the block devices ten times a second costs the CPU the VMs' IO waits for
    (lab: a UML guest's only CPU). A counter that cannot be read reads None."""
    dirs = block_dirs(sysfs)
    vm_rel, backing_rel = (dirs.get(n) if n else None for n in (vm, backing))

    def vm_counters() -> pace.Counters | None:
        s = read_stat(sysfs, vm_rel)
        return None if s is None else pace.Counters(
            s.reads + s.writes, s.read_ms + s.write_ms, s.write_sectors)

    def backing_written() -> int | None:
        s = read_stat(sysfs, backing_rel)
        return None if s is None else s.write_sectors

    return vm_counters, backing_written
