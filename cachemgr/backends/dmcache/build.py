"""Create a dm-cache device: the block and metadata sizes, the checks on the three devices
(busy, signatures, old cache metadata), the fresh metadata superblock."""

from __future__ import annotations

import os
import re

from cachemgr.backends import signatures
from cachemgr.backends.blockdev import block_dirs, in_use
from cachemgr.backends.dmcache import command, discover
from cachemgr.backends.dmcache.discover import dm_devices
from cachemgr.backends.dmcache.refusals import bad_mode
from cachemgr.core.change import Change
from cachemgr.core.errors import AlreadyError, UnsafeError, UsageError, require_root
from cachemgr.core.model import DM_CACHE_MODES, CacheMode, DmCacheTable, human
from cachemgr.core.model import parse_size as _parse_size
from cachemgr.core.sysfs import Sysfs

MIN_BLOCK_SECTORS = 64  # 32 KiB
MAX_BLOCK_SECTORS = 2 * 1024 * 1024  # 1 GiB
DEFAULT_BLOCK_BYTES = 64 * 1024  # lvm2's default cache chunk size
# The kernel warns above a million cache blocks (memory, metadata time): the default block
# size doubles until the cache has at most this many.
MAX_DEFAULT_BLOCKS = 1_000_000
# The on-disk superblock: magic 06142003 (octal in dm-cache-metadata.c) = 0x18c403, le64 at
# byte 32 (struct cache_disk_superblock: csum, flags, blocknr, uuid[16], magic). Seen in the
# lab as "03 c4 18 00 00 00 00 00" at offset 32 of a used metadata device.
CACHE_SUPERBLOCK_MAGIC = 0o6142003


def parse_size(text: str) -> int:
    """``64k``, ``512K``, ``1M``, ``65536`` (bytes) -> bytes
    (:func:`cachemgr.core.model.parse_size`)."""
    return _parse_size(text, hint="e.g. 64k, 256k, 1M")


def default_block_bytes(cache_bytes: int) -> int:
    """64 KiB (lvm2's default), doubled until the cache has at most a million blocks."""
    bs = DEFAULT_BLOCK_BYTES
    while cache_bytes // bs > MAX_DEFAULT_BLOCKS and bs < MAX_BLOCK_SECTORS * 512:
        bs *= 2
    return bs


def metadata_bytes_needed(cache_bytes: int, block_bytes: int) -> int:
    """4 MiB + 16 bytes per cache block: the sizing rule of thumb from the dm-cache
    documentation and thin-provisioning-tools' cache_metadata_size (generous: the lab's
    4096-block cache used 23 metadata blocks of 4 KiB)."""
    return 4 * 1024 * 1024 + 16 * (cache_bytes // block_bytes)


def _size_bytes(sysfs: Sysfs, kname: str, dirs: dict[str, str]) -> int:
    n = sysfs.read_int(f"{dirs[kname]}/size")
    if not n:
        raise UsageError(f"/dev/{kname} has no size (empty or gone)")
    return n * 512


def has_cache_metadata(node: str) -> bool:
    """Does the device start with a dm-cache metadata superblock (magic at byte 32)?"""
    try:
        with open(node, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return len(head) >= 40 and int.from_bytes(head[32:40], "little") == CACHE_SUPERBLOCK_MAGIC


def _signature(node: str) -> str | None:
    return ", ".join(signatures.found(node)) or None


def zero_superblock(node: str) -> None:
    """Zero the first 4 KiB: dm-cache then formats fresh metadata (cache.rst). O_EXCL makes
    the open fail if anything holds the device exclusively (a mount, dm, bcache, md)."""
    fd = os.open(node, os.O_WRONLY | os.O_EXCL)
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
    finally:
        os.close(fd)


def create(sysfs: Sysfs, name: str, *, origin: str, cache: str, metadata: str,
           mode: CacheMode = CacheMode.WRITEBACK, block_bytes: int | None = None,
           policy: str = "smq", force: bool = False) -> list[Change]:
    """Create dm-cache device ``name`` over ``origin`` with ``cache`` and ``metadata``.

    The origin's data is kept (it is what the new device shows); the cache device's and the
    metadata's contents are overwritten: refused if either carries a signature or the
    metadata already holds dm-cache metadata (possibly another cache's dirty blocks), unless
    ``force``. Busy devices are always refused.
    """
    if mode not in DM_CACHE_MODES:
        raise bad_mode(mode)
    if not name or "/" in name or name.startswith("-") or len(name) > 127 \
            or any(c.isspace() for c in name):
        raise UsageError(f"bad dm name {name!r}", hint="letters, digits, '_', '-', '.'")
    require_root("creating a dm-cache device")
    devs = dm_devices(sysfs)
    nodes = {"origin": origin, "cache": cache, "metadata": metadata}
    knames: dict[str, str] = {}
    for role, node in nodes.items():
        if not os.path.exists(node):
            raise UsageError(f"{node} ({role}): no such device")
        k = sysfs.block_name_of(node)
        if k is None:
            raise UsageError(f"{node} ({role}) is not a block device")
        knames[role] = k
    if len(set(knames.values())) != 3:
        raise UsageError("origin, cache and metadata must be three different devices")
    if name in devs:
        try:
            cur = discover.find(sysfs, name)
        except UsageError:
            raise UsageError(f"/dev/mapper/{name} exists already (not a dm-cache device)"
                             ) from None
        same = {cur.origin.name if cur.origin else None, cur.cache.name if cur.cache else None,
                cur.metadata.name if cur.metadata else None} == set(knames.values())
        if same:
            raise AlreadyError(f"/dev/mapper/{name} already caches {origin} with {cache}")
        raise UsageError(f"/dev/mapper/{name} exists already (another dm-cache device)")
    for role, node in nodes.items():
        why = in_use(sysfs, node)
        if why:
            for x in devs.values():  # "in use by dm-1" -> "... dm-1 (/dev/mapper/vc)"
                why = re.sub(rf"\b{x.kernel_name}\b", f"{x.kernel_name} (/dev/mapper/{x.name})",
                             why)
            raise UnsafeError(f"{node} ({role}) is busy: {why}; nothing was changed")
    if not force:
        if has_cache_metadata(metadata):
            raise UnsafeError(
                f"{metadata} holds dm-cache metadata already: it may belong to another cache "
                "whose dirty blocks are still on its cache device; nothing was changed",
                hint="if that cache is gone for good, repeat with --force (zeroes it)")
        for role in ("cache", "metadata"):
            sig = _signature(nodes[role])
            if sig:
                raise UnsafeError(
                    f"{nodes[role]} ({role}) carries a {sig} signature; its contents would "
                    "be overwritten; nothing was changed",
                    hint="wipe it (wipefs -a) if it is unused, or repeat with --force")
    dirs = block_dirs(sysfs)
    origin_bytes = _size_bytes(sysfs, knames["origin"], dirs)
    cache_bytes = _size_bytes(sysfs, knames["cache"], dirs)
    meta_bytes = _size_bytes(sysfs, knames["metadata"], dirs)
    bs = block_bytes if block_bytes is not None else default_block_bytes(cache_bytes)
    if bs % (MIN_BLOCK_SECTORS * 512) or not MIN_BLOCK_SECTORS * 512 <= bs <= \
            MAX_BLOCK_SECTORS * 512:
        raise UsageError(f"block size {human(bs)} is not a multiple of 32 KiB between 32 KiB "
                         "and 1 GiB (cache.rst)")
    if cache_bytes < bs:
        raise UsageError(f"{cache} ({human(cache_bytes)}) is smaller than one cache block")
    need = metadata_bytes_needed(cache_bytes, bs)
    if meta_bytes < need and not force:
        raise UsageError(
            f"{metadata} ({human(meta_bytes)}) is too small for the metadata of "
            f"{cache_bytes // bs} cache blocks: needs about {human(need)}",
            hint="a larger metadata device, or a larger --block-size")
    if origin_bytes % 512:
        raise UsageError(f"{origin}: size is not a whole number of sectors")
    zero_superblock(metadata)
    table = DmCacheTable(0, origin_bytes // 512, metadata, cache, origin, bs // 512,
                         (mode.value,), policy, ())
    command.dmsetup("create", name, "--table", table.line())
    d = discover.find(sysfs, name)
    return [Change(d.node, "create", None,
                   f"dm-cache {mode.value} over {origin} (cache {cache}, metadata {metadata}, "
                   f"block {human(bs)}, {d.status.total if d.status else '?'} blocks)")]
