"""dm-writecache devices: the table and status parsers and discovery (shown for every
writecache device; changed only through lvm2 when LVM owns it, see cachemgr/backends/lvm/).

Table (Documentation/admin-guide/device-mapper/writecache.rst)::

    0 614400 writecache s 253:2 253:1 4096 2 high_watermark 60

``s``/``p`` (SSD or persistent memory), origin, cache, block size, the number of optional
arguments and the arguments (``high_watermark 60``, ``cleaner``...). Status::

    0 614400 writecache 0 25500 20380 0 0 0 5120 0 0 0 5120 0 0 0

error indicator, blocks, free blocks, blocks under writeback, then (newer kernels) counters.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from cachemgr.backends.blockdev import block_dirs
from cachemgr.backends.dmcache import command
from cachemgr.backends.dmcache.command import DmsetupSource
from cachemgr.backends.dmcache.discover import dm_identity, find_targets
from cachemgr.backends.dmcache.parse import (
    DEVNO,
    INT,
    number,
    split_target_line,
)
from cachemgr.backends.scancache import ScanCache
from cachemgr.core.errors import KernelFormatError
from cachemgr.core.model import DmWritecacheDevice, DmWritecacheStatus, DmWritecacheTable
from cachemgr.core.sysfs import Sysfs

_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _int(tok: str, what: str, line: str) -> int:
    return number(tok, what, line, target="dm-writecache")


def parse_table(line: str) -> DmWritecacheTable:
    start, length, target, p = split_target_line(line)
    if target != "writecache" or len(p) < 5 or p[0] not in ("s", "p"):
        raise KernelFormatError("dm-writecache table line", line)
    origin, cache = p[1], p[2]
    for dev in (origin, cache):
        if not (DEVNO.match(dev) or dev.startswith("/dev/")):
            raise KernelFormatError("dm-writecache table line (device)", line)
    bs = _int(p[3], "block size", line)
    n = _int(p[4], "argument count", line)
    args = tuple(p[5:])
    if len(args) != n or not all(_WORD.match(a) or INT.fullmatch(a) for a in args):
        raise KernelFormatError("dm-writecache table line (arguments)", line)
    return DmWritecacheTable(start, length, p[0] == "p", origin, cache, bs, args)


def parse_status(line: str) -> DmWritecacheStatus | str:
    """The status numbers, or the kernel's failure word (``Fail``/``Error``)."""
    _, _, target, p = split_target_line(line)
    if target != "writecache":
        raise KernelFormatError("dm-writecache status line", line)
    if len(p) == 1 and p[0] in ("Fail", "Error"):
        return p[0]
    if len(p) < 4:
        raise KernelFormatError("dm-writecache status line", line)
    nums = [_int(t, "status field", line) for t in p]
    return DmWritecacheStatus(nums[0], nums[1], nums[2], nums[3], tuple(nums[4:]))


@dataclass(frozen=True)
class WritecacheScan:
    devices: tuple[DmWritecacheDevice, ...]
    warnings: tuple[str, ...]


def scan(sysfs: Sysfs, source: DmsetupSource | None = None, *,
         cache: ScanCache | None = None) -> WritecacheScan:
    """Every dm device whose one target is ``writecache``."""
    found, warnings = find_targets(sysfs, source, "writecache", "dm-writecache", cache)
    if not found and not warnings:
        return WritecacheScan((), ())
    dirs = block_dirs(sysfs, cache)
    out = []
    for f in found:
        try:
            table = parse_table(f.table)
            st = parse_status(f.status)
        except KernelFormatError as exc:
            warnings.append(f"{f.name}: {exc}")
            continue
        dev = DmWritecacheDevice(
            name=f.name,
            kernel_name=f.kernel_name,
            devno=f.devno,
            uuid=f.uuid,
            table=table,
            status=None if isinstance(st, str) else st,
            failure=st if isinstance(st, str) else None,
            cache=dm_identity(sysfs, table.cache_dev, dirs, cache),
            origin=dm_identity(sysfs, table.origin_dev, dirs, cache),
            open_count=f.open_count,
            suspended=f.suspended,
            holders=f.holders,
        )
        if dev.failure or (dev.status and dev.status.error):
            word = dev.failure or f"error {dev.status.error if dev.status else '?'}"
            warnings.append(f"{dev.node}: the kernel reports an error on the writecache "
                            f"({word}); its dirty blocks may not be written back; see dmesg")
        out.append(dev)
    return WritecacheScan(tuple(out), tuple(warnings))


def read_status(name: str) -> DmWritecacheStatus | str:
    from cachemgr.backends.dmcache.command import status_line

    return parse_status(status_line(name))


def flush_held(name: str) -> float:
    """Write every cached block of writecache ``name`` back with IO held: the
    ``flush_on_suspend`` message, then suspend (dm-writecache's postsuspend writes everything
    back and waits for it) and resume. Returns the seconds IO was held.

    What the cleaner setting alone cannot do: under it dm-writecache still caches writes to
    the blocks it holds (writecache.rst, "cleaner"), so a block a writer keeps rewriting never
    gets clean. Once written back with IO held it is no longer held, and the writes after the
    resume go around the cache (docs/kernel-notes.md, "dm-writecache"). Signals are held
    while the device is suspended; a failed suspend is resumed."""
    from cachemgr.backends.dmcache.switch import critical  # (switch imports this package)

    with critical():
        t0 = time.monotonic()
        command.dmsetup("message", "--", name, "0", "flush_on_suspend")
        try:
            command.dmsetup("suspend", "--", name, timeout=600)
        finally:
            command.dmsetup("resume", "--", name)
        return time.monotonic() - t0
