"""bcache backend: reads the kernel's bcache objects into the model and changes them.

The backend translates between the kernel and the model and holds no policy. File names and
formats are those of drivers/md/bcache/sysfs.c and Documentation/admin-guide/bcache.rst, as
seen on the lab kernels (captures in tests/fixtures/). Files that a kernel lacks read as None.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from cachemgr.backends import signatures
from cachemgr.backends.blockdev import block_dirs as block_dirs
from cachemgr.backends.blockdev import device_bytes as device_bytes
from cachemgr.backends.blockdev import in_use as in_use
from cachemgr.backends.scancache import ScanCache, once
from cachemgr.core import drainloop, runner
from cachemgr.core.change import Change as Change
from cachemgr.core.change import wait_for as wait_for
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    KernelFormatError,
    SysfsError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import AcceptDataLoss as AcceptDataLoss
from cachemgr.core.model import (
    BcacheBacking,
    BcacheCache,
    CacheMode,
    CacheSet,
    CacheState,
    DrainProgress,
    Identity,
    Size,
    Stats,
    WritebackDebug,
    hprint,
    parse_bracketed,
    parse_size,
)
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

STATS_INTERVALS = ("five_minute", "hour", "day", "total")
# What a poll reads (``stats=False``): the total only; the three decaying intervals are read
# when asked for (status --stats, the TUI's detail and its slower refresh, the metrics).
POLL_INTERVALS = ("total",)
# What a poll takes from its ScanCache instead (the last full read's, scancache.py): the
# files neither the table nor the health model use (issue #34). A backing device's tunables,
# and ``running``, which never changes without a uevent anyway (it turns 1 when the bcacheN
# disk is added, super.c bch_cached_dev_run; 0 only when the device stops and goes):
KEPT_BACKING = ("writeback_percent", "writeback_delay", "sequential_cutoff",
                "writeback_rate_minimum", "writeback_running", "io_error_limit",
                "stop_when_cache_set_failed", "running")
# a cache set's and a cache device's:
KEPT_SET = ("congested", "io_error_limit", "io_error_halflife", "block_size", "bucket_size",
            "dirty_data")
KEPT_CACHE = ("cache_replacement_policy", "written")
# and the bypass counters of stats_total, of both a backing device and a cache set (the
# hits and misses are read by every poll: the RHIT column)
KEPT_TOTAL = ("bypassed", "cache_bypass_hits", "cache_bypass_misses", "cache_miss_collisions")
BCACHE_MODES = (CacheMode.WRITETHROUGH, CacheMode.WRITEBACK, CacheMode.WRITEAROUND,
                CacheMode.NONE)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _opt(fn: Callable[[str], object], text: str | None, what: str, warnings: list[str]):  # type: ignore[no-untyped-def]
    if text is None:
        return None
    try:
        return fn(text)
    except (KernelFormatError, ValueError) as exc:
        warnings.append(f"{what}: {exc}")
        return None


def _bool(text: str) -> bool:
    if text.strip() not in ("0", "1"):
        raise ValueError(f"not 0/1: {text!r}")
    return text.strip() == "1"


def _int(text: str) -> int:
    return int(text.strip())


def identity(sysfs: Sysfs, name: str, rel: str) -> Identity:
    """What sysfs itself knows of a block device (udev's ID_* come from identity.py)."""
    size = sysfs.read_int(f"{rel}/size")
    wwid = sysfs.read_opt(f"{rel}/device/wwid") or sysfs.read_opt(f"{rel}/wwid")
    serial = sysfs.read_opt(f"{rel}/serial") or sysfs.read_opt(f"{rel}/device/serial")
    if serial is not None and serial.strip() == "(null)":  # UML's ubd prints this
        serial = None
    model = sysfs.read_opt(f"{rel}/device/model")
    rot = sysfs.read_opt(f"{rel}/queue/rotational")
    part_of = None
    if sysfs.exists(f"{rel}/partition"):
        part_of = rel.split("/")[-2]
    dm_name = sysfs.read_opt(f"{rel}/dm/name")
    return Identity(
        name=name,
        # VMs and admins know device-mapper devices by /dev/mapper/NAME, not /dev/dm-N
        node=f"/dev/mapper/{dm_name.strip()}" if dm_name else f"/dev/{name}",
        devno=sysfs.read_opt(f"{rel}/dev"),
        size_bytes=size * 512 if size is not None else None,
        serial=(serial or "").strip() or None,
        wwn=(wwid or "").strip() or None,
        model=(model or "").strip() or None,
        rotational=None if rot is None else rot.strip() == "1",
        partition_of=part_of,
    )


def cached_identity(sysfs: Sysfs, name: str, rel: str, cache: ScanCache | None) -> Identity:
    """:func:`identity`, read once while no uevent was sent (scancache.py says why it cannot
    change in between)."""
    if cache is None:
        return identity(sysfs, name, rel)
    return cache.get(("identity", rel), lambda: identity(sysfs, name, rel))


def read_stats(sysfs: Sysfs, rel: str, warnings: list[str],
               intervals: tuple[str, ...] = STATS_INTERVALS, *,
               kernel_ratio: bool = True, kept: Kept | None = None) -> dict[str, Stats]:
    """The stats_<interval> directories; ``kernel_ratio`` False skips ``cache_hit_ratio``
    (the kernel's rounded percent: nothing shows it, the ratio is computed from the hits and
    misses). ``kept``: stats_total's bypass counters (:data:`KEPT_TOTAL`) are those, not
    read here (:func:`_kept`)."""
    out = {}
    for interval in intervals:
        d = f"{rel}/stats_{interval}"
        if not sysfs.is_dir(d):
            continue
        if interval == "total" and kept is not None:
            bypass = kept.total
        else:
            bypass = _bypass(sysfs, d, warnings)
        out[interval] = Stats(
            interval=interval,
            hits=_num(sysfs, f"{d}/cache_hits", warnings),
            misses=_num(sysfs, f"{d}/cache_misses", warnings),
            hit_ratio=_num(sysfs, f"{d}/cache_hit_ratio", warnings) if kernel_ratio else None,
            **bypass,
        )
    return out


def _num(sysfs: Sysfs, path: str, warnings: list[str]) -> int | None:
    """The integer in the file at ``path`` (None: missing, or a warning: not one)."""
    return _opt(_int, sysfs.read_opt(path), path, warnings)  # type: ignore[no-any-return]


def _bypass(sysfs: Sysfs, d: str, warnings: list[str]) -> dict[str, Any]:
    """The bypass counters of one stats_<interval> directory ``d``, as Stats' fields."""
    return {"bypassed": _opt(Size.parse_hprint, sysfs.read_opt(f"{d}/bypassed"),
                             f"{d}/bypassed", warnings),
            "bypass_hits": _num(sysfs, f"{d}/cache_bypass_hits", warnings),
            "bypass_misses": _num(sysfs, f"{d}/cache_bypass_misses", warnings),
            "miss_collisions": _num(sysfs, f"{d}/cache_miss_collisions", warnings)}


@dataclass(frozen=True)
class Kept:
    """The files of one bcache object a poll does not read (:data:`KEPT_BACKING`,
    :data:`KEPT_SET`, :data:`KEPT_CACHE`, :data:`KEPT_TOTAL`), as the last full read read
    them: the text of each (None: missing), the bypass counters of stats_total as Stats'
    fields, and the warnings their reading gave (said again by every poll that uses them)."""

    text: dict[str, str | None]
    total: dict[str, Any]
    warnings: tuple[str, ...]


def _kept(sysfs: Sysfs, rel: str, names: tuple[str, ...], cache: ScanCache | None,
          fresh: bool, warnings: list[str]) -> Kept:
    """The :class:`Kept` files of the object at ``rel``: read when ``fresh`` (a full read)
    or when ``cache`` holds none young enough, else the kept ones (backends/scancache.py
    says for how long)."""

    def read() -> Kept:
        ws: list[str] = []
        total = _bypass(sysfs, f"{rel}/stats_total", ws) if sysfs.is_dir(
            f"{rel}/stats_total") else {}
        return Kept({n: sysfs.read_opt(f"{rel}/{n}") for n in names}, total, tuple(ws))

    k = read() if cache is None else cache.kept(("bcache-kept", rel, names), read, fresh=fresh)
    warnings.extend(k.warnings)
    return k


def _link_name(sysfs: Sysfs, rel: str) -> str | None:
    target = sysfs.readlink(rel)
    return os.path.basename(target.rstrip("/")) if target else None


def _link_device(sysfs: Sysfs, rel: str) -> str | None:
    """A cset's cacheN/bdevN link points at <dev>/bcache: return <dev>'s name."""
    target = sysfs.readlink(rel)
    if not target:
        return None
    parts = target.rstrip("/").split("/")
    return parts[-2] if len(parts) >= 2 and parts[-1] == "bcache" else None


def read_backing(sysfs: Sysfs, name: str, rel: str, warnings: list[str], *,
                 stats: bool = True, cache: ScanCache | None = None) -> BcacheBacking:
    """One backing device. ``stats`` False is a poll's read: the total stats only, and the
    files neither the table nor the health model use (:data:`KEPT_BACKING`, stats_total's
    :data:`KEPT_TOTAL`) as ``cache`` kept them from the last full read
    (backends/scancache.py); dirty data and the writeback rate come from
    ``writeback_rate_debug`` (the same bch_hprint of the same counters as ``dirty_data`` and
    ``writeback_rate``: drivers/md/bcache/sysfs.c), the identity, UUID and label from
    ``cache`` while no uevent was sent."""
    b = f"{rel}/bcache"
    kept = _kept(sysfs, b, KEPT_BACKING, cache, stats, warnings)

    def r(f: str) -> str | None:
        return sysfs.read_opt(f"{b}/{f}")

    def w(f: str) -> str:
        return f"{name}: {f}"

    mode_text = r("cache_mode")
    mode = None
    if mode_text is not None:
        try:
            mode = CacheMode.parse(parse_bracketed(mode_text)[0])
        except KernelFormatError as exc:
            warnings.append(w(str(exc)))
    state_text = r("state")
    state = CacheState.UNKNOWN
    if state_text is not None:
        try:
            state = CacheState.parse(state_text)
        except KernelFormatError as exc:
            warnings.append(w(str(exc)))
    k = kept.text.get
    dbg = _opt(WritebackDebug.parse, r("writeback_rate_debug"), w("writeback_rate_debug"),
               warnings)
    dev_name = _link_name(sysfs, f"{b}/dev")
    cset = _link_name(sysfs, f"{b}/cache")

    def sb() -> tuple[str | None, str | None]:
        # the superblock's UUID and label: a label write sends a change uevent (sysfs.c)
        return (r("backing_dev_uuid") or "").strip() or None, (r("label") or "").strip() or None

    uuid, label = sb() if cache is None else cache.get(("bcache-sb", b), sb)
    dirty = dbg.dirty if dbg is not None and dbg.dirty is not None else _opt(
        Size.parse_hprint, r("dirty_data"), w("dirty_data"), warnings)
    rate = dbg.rate if dbg is not None and dbg.rate is not None else _opt(
        lambda t: Size.parse_hprint(t.removesuffix("/sec")), r("writeback_rate"),
        w("writeback_rate"), warnings)
    return BcacheBacking(
        identity=cached_identity(sysfs, name, rel, cache),
        device=f"/dev/{dev_name}" if dev_name else None,
        device_name=dev_name,
        uuid=uuid,
        cset_uuid=cset if cset and _UUID.match(cset) else None,
        label=label,
        mode=mode,
        state=state,
        dirty=dirty,
        running=_opt(_bool, k("running"), w("running"), warnings),
        writeback_rate=rate,
        writeback_percent=_opt(_int, k("writeback_percent"), w("writeback_percent"), warnings),
        writeback_delay=_opt(_int, k("writeback_delay"), w("writeback_delay"), warnings),
        writeback_running=_opt(_bool, k("writeback_running"), w("writeback_running"), warnings),
        writeback_rate_minimum=_opt(_int, k("writeback_rate_minimum"),
                                    w("writeback_rate_minimum"), warnings),
        sequential_cutoff=_opt(Size.parse_hprint, k("sequential_cutoff"),
                               w("sequential_cutoff"), warnings),
        io_errors=_opt(_int, r("io_errors"), w("io_errors"), warnings),
        io_error_limit=_opt(_int, k("io_error_limit"), w("io_error_limit"), warnings),
        stop_when_cache_set_failed=(
            _opt(lambda t: parse_bracketed(t)[0], k("stop_when_cache_set_failed"),
                 w("stop_when_cache_set_failed"), warnings)),
        rate_debug=dbg,
        stats=read_stats(sysfs, b, warnings, STATS_INTERVALS if stats else POLL_INTERVALS,
                         kernel_ratio=stats, kept=kept),
    )


def read_cache(sysfs: Sysfs, name: str, rel: str, warnings: list[str], *,
               stats: bool = True, cache: ScanCache | None = None) -> BcacheCache:
    """A cache device; ``stats`` False (a poll) takes the replacement policy and ``written``
    (:data:`KEPT_CACHE`) as ``cache`` kept them from the last full read, and the
    superblock's geometry (bucket and block size, buckets) from ``cache`` while no uevent
    was sent and the cache set is the same."""
    b = f"{rel}/bcache"

    def r(f: str) -> str | None:
        return sysfs.read_opt(f"{b}/{f}")

    def geometry() -> tuple[Size | None, int | None, Size | None]:
        return (_opt(Size.parse_hprint, r("bucket_size"), f"{name}: bucket_size", warnings),
                _opt(_int, r("nbuckets"), f"{name}: nbuckets", warnings),
                _opt(Size.parse_hprint, r("block_size"), f"{name}: block_size", warnings))

    cset = _link_name(sysfs, f"{b}/set")
    # registering a cache device sends no uevent (lab: docs/kernel-notes.md, "uevent_seqnum"):
    # kept per cache set UUID, which a new make-bcache changes
    bucket, nbuckets, block = geometry() if cache is None else cache.get(
        ("bcache-geo", b, cset), geometry)
    kept = _kept(sysfs, b, KEPT_CACHE, cache, stats, warnings).text.get
    policy = kept("cache_replacement_policy")
    return BcacheCache(
        identity=cached_identity(sysfs, name, rel, cache),
        cset_uuid=cset if cset and _UUID.match(cset) else None,
        io_errors=_opt(_int, r("io_errors"), f"{name}: io_errors", warnings),
        bucket_size=bucket,
        nbuckets=nbuckets,
        block_size=block,
        replacement_policy=_opt(lambda t: parse_bracketed(t)[0], policy,
                                f"{name}: cache_replacement_policy", warnings),
        written=_opt(Size.parse_hprint, kept("written"), f"{name}: written", warnings),
    )


def read_cache_set(sysfs: Sysfs, uuid: str, caches: dict[str, BcacheCache],
                   warnings: list[str], *, stats: bool = True,
                   block: Collection[str] | None = None,
                   cache: ScanCache | None = None) -> CacheSet:
    """A cache set; ``stats`` False (a poll) reads what status and its JSON show (available
    space, the error action, the congestion thresholds, the total hits and misses) and takes
    the rest (:data:`KEPT_SET`, stats_total's :data:`KEPT_TOTAL`; the set's dirty_data
    moves only at GC: docs/kernel-notes.md) as ``cache`` kept it from the last full read.
    ``block``: the disks and partitions under /sys/block; a ``bdevN`` link naming none of
    them is a warning (the set's member is not shown as a backing device)."""
    d = f"fs/bcache/{uuid}"
    entries = sysfs.listdir(d)
    cache_names = [_link_device(sysfs, f"{d}/{e}") for e in entries if re.fullmatch(r"cache\d+", e)]
    bdev_names = []
    for e in (e for e in entries if re.fullmatch(r"bdev\d+", e)):
        n = _link_device(sysfs, f"{d}/{e}")
        if n is None or (block is not None and n not in block):
            warnings.append(f"cache set {uuid}: {e} names a backing device that is not a "
                            "block device (disk or partition) here "
                            f"({sysfs.readlink(f'{d}/{e}') or 'unreadable link'}): "
                            "it is not shown as a device; its state and dirty data are "
                            "unknown")
        bdev_names.append(n)
    flash = sum(1 for e in entries if re.fullmatch(r"volume\d+", e))

    kept = _kept(sysfs, d, KEPT_SET, cache, stats, warnings)
    r = kept.text.get

    def always(f: str) -> str | None:
        return sysfs.read_opt(f"{d}/{f}")

    errors = always("errors")
    return CacheSet(
        uuid=uuid,
        caches=tuple(caches[n] for n in cache_names if n and n in caches),
        backing_names=tuple(n for n in bdev_names if n),
        flash_volumes=flash,
        cache_available_percent=_opt(_int, always("cache_available_percent"),
                                     f"{uuid}: cache_available_percent", warnings),
        congested=r("congested"),
        congested_read_threshold_us=_opt(_int, always("congested_read_threshold_us"),
                                         f"{uuid}: congested_read_threshold_us", warnings),
        congested_write_threshold_us=_opt(_int, always("congested_write_threshold_us"),
                                          f"{uuid}: congested_write_threshold_us", warnings),
        errors=_opt(lambda t: parse_bracketed(t)[0], errors, f"{uuid}: errors", warnings),
        io_error_limit=_opt(_int, r("io_error_limit"), f"{uuid}: io_error_limit", warnings),
        io_error_halflife=_opt(_int, r("io_error_halflife"), f"{uuid}: io_error_halflife",
                               warnings),
        block_size=_opt(Size.parse_hprint, r("block_size"), f"{uuid}: block_size", warnings),
        bucket_size=_opt(Size.parse_hprint, r("bucket_size"), f"{uuid}: bucket_size", warnings),
        dirty=_opt(Size.parse_hprint, r("dirty_data"), f"{uuid}: dirty_data", warnings),
        stats=read_stats(sysfs, d, warnings, STATS_INTERVALS if stats else POLL_INTERVALS,
                         kernel_ratio=stats, kept=kept),
    )


@dataclass(frozen=True)
class BcacheScan:
    loaded: bool
    cache_sets: tuple[CacheSet, ...]
    backings: tuple[BcacheBacking, ...]
    caches: tuple[BcacheCache, ...]
    warnings: tuple[str, ...]


def scan(sysfs: Sysfs, *, stats: bool = True, cache: ScanCache | None = None) -> BcacheScan:
    """Read every bcache object: cache sets, their cache devices, backing devices.
    ``stats`` False is a poll's read (:func:`read_backing`); ``cache`` keeps what cannot
    change between polls (scancache.py)."""
    cache = once(sysfs, cache)
    warnings: list[str] = []
    backings: list[BcacheBacking] = []
    caches: dict[str, BcacheCache] = {}
    dirs = block_dirs(sysfs, cache)
    for name, rel in sorted(dirs.items()):
        # bcache/ appears on registration, with or without a uevent (a cache device sends
        # none): looked at on every scan
        # a backing device's cache_mode first: one look for each of them (a poll's every
        # look is a system call: a round trip to the host under UML)
        if name.startswith("bcache"):
            continue
        if sysfs.exists(f"{rel}/bcache/cache_mode"):
            backings.append(read_backing(sysfs, name, rel, warnings, stats=stats, cache=cache))
        elif not sysfs.is_dir(f"{rel}/bcache"):
            continue
        elif sysfs.exists(f"{rel}/bcache/bucket_size") or sysfs.exists(f"{rel}/bcache/set"):
            caches[name] = read_cache(sysfs, name, rel, warnings, stats=stats, cache=cache)
    sets = []
    if sysfs.is_dir("fs/bcache"):
        for entry in sysfs.listdir("fs/bcache"):
            if _UUID.match(entry) and sysfs.is_dir(f"fs/bcache/{entry}"):
                sets.append(read_cache_set(sysfs, entry, caches, warnings, stats=stats,
                                           block=dirs, cache=cache))
    return BcacheScan(
        loaded=sysfs.is_dir("fs/bcache"),
        cache_sets=tuple(sets),
        backings=tuple(backings),
        caches=tuple(caches.values()),
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------------------
# operations


def cache_nodes(sysfs: Sysfs, cset: str | None) -> list[str]:
    """The cache devices (SSDs) of the registered cache set ``cset`` as nodes (empty: not
    registered, or unknown)."""
    if not cset:
        return []
    d = f"fs/bcache/{cset}"
    names = [_link_device(sysfs, f"{d}/{e}") for e in sysfs.listdir(d)
             if re.fullmatch(r"cache\d+", e)]
    return [f"/dev/{n}" for n in names if n]


def backing_rel(sysfs: Sysfs, name: str) -> str:
    rel = block_dirs(sysfs).get(name)
    if rel is None or not sysfs.is_dir(f"{rel}/bcache"):
        raise UsageError(f"/dev/{name} is not a registered bcache device",
                         hint="cachemgr status lists the bcache devices on this host")
    return f"{rel}/bcache"


def set_mode(sysfs: Sysfs, backing: BcacheBacking, mode: CacheMode) -> Change:
    """Write ``cache_mode``. bcache persists it in the backing superblock.

    The kernel lets a mode change happen with dirty data present (writeback continues);
    the caller decides whether to drain. Raises AlreadyError if the mode is already active.
    """
    if mode not in BCACHE_MODES:
        raise UsageError(f"bcache has no cache mode {mode.value!r}",
                         hint="use writethrough, writeback, writearound or none")
    name = backing.identity.name
    if backing.mode == mode:
        raise AlreadyError(f"{backing.device or name} is already in {mode.value} mode")
    rel = backing_rel(sysfs, name)
    sysfs.write(f"{rel}/cache_mode", mode.value)
    now, _ = parse_bracketed(sysfs.read(f"{rel}/cache_mode"))
    if now != mode.value:
        raise CacheMgrError(f"{name}: wrote cache_mode {mode.value} but the kernel reports {now}")
    return Change(backing.device or name, "cache_mode",
                  backing.mode.value if backing.mode else None, now)


RELEASE_WAIT = 5.0  # seconds a stopped bcache device's disk may stay held (see register)


def _registered(sysfs: Sysfs, node: str) -> bool:
    """Whether ``node`` is registered with bcache now: its block directory has ``bcache``
    (a backing device's, or a cache device's with its set link)."""
    name = sysfs.block_name_of(node)
    rel = block_dirs(sysfs).get(name) if name else None
    return rel is not None and sysfs.is_dir(f"{rel}/bcache")


def register(sysfs: Sysfs, node: str, *, release_wait: float = RELEASE_WAIT) -> Change:
    """``echo DEV > /sys/fs/bcache/register``; the write's error *is* the kernel's answer.

    EBUSY is two answers in super.c ``register_bcache``: "device already registered" (the
    device is bcache's: exit 4) and "device busy" (someone else holds it exclusively). The
    second is also what a register right after a stop gets: the stopped device's sysfs
    directories are gone before its exclusive open is released (``cached_dev_free`` drops
    the file with ``fput``, deferred from the closure's kernel thread; 9 ms after the
    directories on the UML lab, docs/kernel-notes.md). So a busy device that is not
    registered is waited for (up to ``release_wait`` seconds, on the exclusive open coming
    free) and tried once more; held longer, it is an error naming the holder's kinds."""
    if not sysfs.exists("fs/bcache/register"):
        raise CacheMgrError("the bcache module is not loaded", hint="modprobe bcache")
    try:
        try:
            sysfs.write("fs/bcache/register", node)
        except SysfsError as exc:
            if exc.errno != errno.EBUSY or _registered(sysfs, node):
                raise
            deadline = time.monotonic() + release_wait
            while claimed(node) and time.monotonic() < deadline:
                time.sleep(0.01)
            if claimed(node):
                raise CacheMgrError(
                    f"the kernel refused to register {node}: device busy (another user holds "
                    f"it open exclusively: a mount, md, device-mapper or a bcache device still "
                    f"stopping; waited {release_wait:g} s)",
                    hint=f"see lsblk {node} and /sys/class/block/"
                         f"{sysfs.block_name_of(node) or os.path.basename(node)}/holders") from exc
            sysfs.write("fs/bcache/register", node)
    except SysfsError as exc:
        # EBUSY/EEXIST: "device already registered" (super.c register_bcache)
        if exc.errno in (errno.EBUSY, errno.EEXIST):
            raise AlreadyError(f"{node} is already registered with bcache") from exc
        said = kernel_reason(sysfs, node)
        if said:
            raise CacheMgrError(f"the kernel refused to register {node}: {said}",
                                hint=_REFUSAL_HINTS.get(said.rsplit(": ", 1)[-1])) from exc
        raise CacheMgrError(
            f"the kernel refused to register {node}: {exc}",
            hint="check that it carries a bcache superblock (bcache-super-show), and the "
                 "kernel log (dmesg)",
        ) from exc
    return Change(node, "register", None, "registered")


def kernel_reason(sysfs: Sysfs, node: str, *, lines: int = 40) -> str | None:
    """The kernel's own reason for refusing ``node`` (its last bcache error line about the
    device in the kernel log, e.g. "register_cache() error ubda: cache_alloc(): cache
    device is too small"), without the timestamp; None when the log says nothing (dmesg
    unreadable or no such line)."""
    name = sysfs.block_name_of(node) or os.path.basename(node)
    try:
        out = runner.run(["dmesg"], timeout=10, check=False).stdout
    except CommandError:
        return None
    found = [re.sub(r"^\[[^]]*\]\s*", "", ln).strip() for ln in out.splitlines()[-lines:]]
    found = [ln for ln in found if "bcache" in ln and "error" in ln
             and re.search(rf"\b{re.escape(name)}\b", ln)]
    if not found:
        return None
    return found[-1].removeprefix("bcache: ")


# The kernel refuses a cache device of 512 buckets or fewer: cache_alloc() sizes its free
# list as roundup_pow_of_two(nbuckets) >> 10 and fails when that is 0 ("ca->sb.nbuckets is
# too small", then "cache device is too small"). Measured on the lab kernel: 256 MiB with
# 512k buckets (512) is refused, 257 MiB (514) registers; 64 MiB registers with 64k (1024)
# and is refused with 128k (512). make-bcache itself counts size // bucket.
MIN_CACHE_BUCKETS = 513
DEFAULT_BUCKET = 512 * 1024  # make-bcache's default (1024 sectors)
SMALLEST_BUCKET = 4096

# what the admin can do about the kernel's reasons (super.c's words)
_REFUSAL_HINTS = {
    "cache device is too small":
        f"re-create it with a smaller bucket (--bucket): the kernel needs more than "
        f"{MIN_CACHE_BUCKETS - 1} buckets",
}


def bucket_count(size_bytes: int, bucket_bytes: int) -> int:
    """Buckets make-bcache gives a cache device of ``size_bytes`` (whole sectors)."""
    return (size_bytes // 512) // max(1, bucket_bytes // 512)


def bucket_for(size_bytes: int) -> int | None:
    """The largest power-of-two bucket, at most the default, that gives the kernel enough
    buckets; None when even 4k buckets are too few."""
    b = DEFAULT_BUCKET
    while b >= SMALLEST_BUCKET:
        if bucket_count(size_bytes, b) >= MIN_CACHE_BUCKETS:
            return b
        b //= 2
    return None


def _kib(n: int) -> str:
    return f"{n // 1024}k"


def check_bucket(cache: str, size_bytes: int, bucket: str | None) -> str | None:
    """The bucket to format ``cache`` with: ``bucket`` when the kernel will take that many
    buckets (UsageError naming one that works otherwise); when None, the default if it gives
    enough buckets (None: make-bcache's default), else the largest that does."""
    mib = size_bytes / (1 << 20)
    if bucket is not None:
        n = parse_size(bucket, hint="use a bucket size like 64k, 128k or 512k")
        if n < SMALLEST_BUCKET or n & (n - 1):
            raise UsageError(f"{cache}: bucket size {bucket} must be a power of two of at "
                             "least 4k")
        have = bucket_count(size_bytes, n)
        if have >= MIN_CACHE_BUCKETS:
            return bucket
        fit = bucket_for(size_bytes)
        raise UsageError(
            f"{cache} ({mib:g} MiB) with {bucket} buckets has {have} buckets; the kernel "
            f"refuses a cache device of fewer than {MIN_CACHE_BUCKETS}; nothing was formatted",
            hint=f"use --bucket {_kib(fit)} or smaller" if fit else
            "use a larger cache device")
    if bucket_count(size_bytes, DEFAULT_BUCKET) >= MIN_CACHE_BUCKETS:
        return None
    fit = bucket_for(size_bytes)
    if fit is None:
        raise UsageError(
            f"{cache} ({mib:g} MiB) is too small for a bcache cache: even 4k buckets give "
            f"fewer than {MIN_CACHE_BUCKETS}; nothing was formatted",
            hint="use a larger cache device")
    return _kib(fit)


def make_bcache(
    *, backing: list[str] | None = None, cache: str | None = None, bucket: str | None = None,
    writeback: bool = False, wipe: bool = False, force: bool = False, timeout: float = 300,
) -> runner.Completed:
    """Format devices with make-bcache (-B backing, -C cache). Refuses devices holding a
    signature (a filesystem or another superblock) unless ``force``."""
    devices = [*(backing or []), *([cache] if cache else [])]
    if not devices:
        raise UsageError("make-bcache needs a backing or a cache device")
    if not force:
        for dev in devices:
            sig = signatures.first(dev)
            if sig is not None:
                raise UnsafeError(
                    f"{dev} holds a {sig} signature; refusing to format it",
                    hint="check it is the right disk; wipe it deliberately (wipefs -a) first",
                )
    argv = ["make-bcache"]
    if bucket:
        argv += ["--bucket", bucket]
    if writeback:
        argv.append("--writeback")
    if wipe:
        argv.append("--wipe-bcache")
    if cache:
        argv += ["-C", cache]
    if backing:
        argv += ["-B", *backing]
    return runner.run(argv, timeout=timeout)


Progress = Callable[[DrainProgress], None]

# Tunables settable per backing device and per cache set: name -> (validator, help).
# Values are written as the kernel reads them; the kernel clamps some silently
# (writeback_percent 50 reads back 40 on 7.2), so every write is read back and compared.
BACKING_TUNABLES: dict[str, tuple[int, int]] = {
    "sequential_cutoff": (0, 2**32 - 1),  # bytes; 7.2 rejects unit suffixes ("1M": EINVAL)
    "writeback_percent": (0, 40),
    "writeback_delay": (0, 2**31 - 1),  # seconds
    "writeback_rate_minimum": (1, 2**31 - 1),  # sectors per second
    "writeback_running": (0, 1),
}
SET_TUNABLES: dict[str, tuple[int, int]] = {
    "congested_read_threshold_us": (0, 2**31 - 1),
    "congested_write_threshold_us": (0, 2**31 - 1),
}


def _dev(b: BcacheBacking) -> str:
    return b.device or b.identity.node


def _read_tunable(sysfs: Sysfs, path: str, name: str) -> int:
    text = sysfs.read(path)
    if name == "sequential_cutoff":
        return Size.parse_hprint(text).low
    return int(text)


def check_tunable(name: str, value: int, *, cache_set: bool = False) -> None:
    """A usage error unless ``name`` is a backing device's (or with ``cache_set``, a cache
    set's) tunable and ``value`` within its bounds; writes nothing."""
    table, what = (SET_TUNABLES, "cache-set") if cache_set else (BACKING_TUNABLES, "bcache")
    if name not in table:
        raise UsageError(f"unknown {what} tunable {name!r}",
                         hint="one of: " + ", ".join(sorted(table)))
    lo, hi = table[name]
    if not lo <= value <= hi:
        raise UsageError(f"{name} must be between {lo} and {hi}, not {value}")


def set_tunable(sysfs: Sysfs, backing: BcacheBacking, name: str, value: int) -> Change:
    """Set one writeback/caching tunable of a backing device; "already so" if equal."""
    check_tunable(name, value)
    rel = backing_rel(sysfs, backing.identity.name)
    before_text = sysfs.read(f"{rel}/{name}")
    before = _read_tunable(sysfs, f"{rel}/{name}", name)
    if name == "sequential_cutoff":
        # printed lossy (hprint): compare by what the value would print as
        if hprint(value) == before_text or before == value:
            raise AlreadyError(f"{_dev(backing)}: {name} is already {before_text}")
    elif before == value:
        raise AlreadyError(f"{_dev(backing)}: {name} is already {value}")
    sysfs.write(f"{rel}/{name}", str(value))
    after_text = sysfs.read(f"{rel}/{name}")
    after = _read_tunable(sysfs, f"{rel}/{name}", name)
    if name != "sequential_cutoff" and after != value:
        raise CacheMgrError(f"{_dev(backing)}: wrote {name}={value}, the kernel keeps {after}")
    return Change(_dev(backing), name, before_text, after_text)


def set_writeback_rate(sysfs: Sysfs, backing: BcacheBacking, sectors: int) -> None:
    """Write ``writeback_rate`` (sectors per second; it reads back in bytes, hprint): the PI
    controller's output, which it overwrites at its next run (every
    ``writeback_rate_update_seconds``), clamped to ``writeback_rate_minimum`` from below. Not a
    setting to put back: the kernel recomputes it from the settings (docs/kernel-notes.md,
    "Pacing a drain")."""
    check_tunable("writeback_rate_minimum", sectors)
    sysfs.write(f"{backing_rel(sysfs, backing.identity.name)}/writeback_rate", str(sectors))


def set_cache_set_tunable(sysfs: Sysfs, cset: CacheSet, name: str, value: int) -> Change:
    check_tunable(name, value, cache_set=True)
    path = f"fs/bcache/{cset.uuid}/{name}"
    before = sysfs.read(path)
    if int(before) == value:
        raise AlreadyError(f"cache set {cset.uuid}: {name} is already {value}")
    sysfs.write(path, str(value))
    after = sysfs.read(path)
    if int(after) != value:
        raise CacheMgrError(f"cache set {cset.uuid}: wrote {name}={value}, kernel keeps {after}")
    return Change(cset.uuid, name, before, after)


def attach(sysfs: Sysfs, backing: BcacheBacking, cset: CacheSet) -> Change:
    """Attach a backing device to a cache set (writes the cset UUID to ``attach``)."""
    if backing.cset_uuid == cset.uuid:
        raise AlreadyError(f"{_dev(backing)} is already attached to cache set {cset.uuid}")
    if backing.cset_uuid is not None:
        raise UsageError(
            f"{_dev(backing)} is attached to another cache set ({backing.cset_uuid})",
            hint=f"detach it first: cachemgr detach {_dev(backing)}",
        )
    if backing.state == CacheState.DIRTY:
        raise UnsafeError(
            f"{_dev(backing)} has dirty data in a cache set that is not here; attaching it to "
            f"{cset.uuid} would discard that data",
            hint="bring back the original cache device (register it) first",
        )
    rel = backing_rel(sysfs, backing.identity.name)
    try:
        sysfs.write(f"{rel}/attach", cset.uuid)
    except SysfsError as exc:
        # ENOENT: no such cache set; EINVAL: already attached (super.c bch_cached_dev_attach)
        raise CacheMgrError(f"the kernel refused to attach {_dev(backing)} to {cset.uuid}: "
                            f"{exc}") from exc
    return Change(_dev(backing), "attach", None, cset.uuid)


def detach(sysfs: Sysfs, backing: BcacheBacking, *, timeout: float = 3600,
           progress: Progress | None = None, interval: float = 0.5) -> Change:
    """Detach from the cache set. bcache writes all dirty data back first (unthrottled),
    then the state reads ``no cache``; this waits for that and for the device's ``cache``
    link to go, with progress (the dirty data of each reading, rate and ETA; ``action``
    "detach") and a timeout. The state turns ``no cache`` when the writeback thread has
    written the superblock, before the detach is finished and the links to the set are
    removed (docs/kernel-notes.md, "Detach, stop and unregister"): on a loaded lab host an
    unregister right after was refused for a backing device still attached.
    """
    if backing.cset_uuid is None and backing.state in (CacheState.NO_CACHE, CacheState.CLEAN):
        raise AlreadyError(f"{_dev(backing)} is not attached to a cache set")
    name = backing.identity.name
    rel = backing_rel(sysfs, name)
    sysfs.write(f"{rel}/detach", "1")
    deadline = time.monotonic() + timeout
    meter = drainloop.Meter("detach", _dev(backing), time.monotonic())
    while True:
        cur = reread(sysfs, name)
        if cur.state == CacheState.NO_CACHE and cur.cset_uuid is None:
            return Change(_dev(backing), "detach", backing.cset_uuid, None)
        if progress:
            progress(meter.update(time.monotonic(), cur.dirty_bytes, cur.state))
        if time.monotonic() >= deadline:
            raise TimeoutExpired(
                f"{_dev(backing)}: still {cur.state} with {cur.dirty} dirty after "
                f"{timeout:g} s of detaching; the kernel keeps flushing and will finish the "
                "detach by itself",
                hint=f"watch it with: cachemgr status --watch 2 ({_dev(backing)})",
            )
        time.sleep(interval)


def invalidate(sysfs: Sysfs, backing: BcacheBacking, *, timeout: float = 60,
               interval: float = 0.005, cache: str | None = None,
               final_mode: CacheMode | None = None) -> list[Change]:
    """Drop every copy the cache set holds of ``backing``: detach it, then attach it again to
    the same set, in the mode it had. A detach marks the device's slot in the set's UUID
    table invalid (super.c, bcache_device_detach) and the attach takes a new, empty slot
    (bch_cached_dev_attach, uuid_find_empty): the old keys name the old slot and are never
    found again; the other devices on the set keep theirs. No key is walked, so the time
    does not grow with the cache (docs/kernel-notes.md, "Dropping a device's cached copies":
    5-9 ms on a clean device in the lab).

    Refused (exit 3) while the device is dirty or in writeback: a detach writes the dirty
    data back first, which is not what an arriving VM should wait for, and a writeback cache
    over shared storage is refused on arrival anyway. Each invalidation uses one slot of the
    set's UUID table for good (bucket size / 128 B of them: 1024 with 128 KiB buckets; the
    kernel never reuses an invalidated slot): when none is left the attach fails, the device
    stays detached (it runs uncached, reading the disk: safe) and the error says so.

    ``cache`` and ``final_mode``: what an interrupted invalidation recorded. A device it left
    detached holds no copies any more (the detach dropped them): it is only attached again
    to ``cache`` and put back in ``final_mode``."""
    dev = _dev(backing)
    cset = backing.cset_uuid
    if cset is None and cache is not None and backing.state == CacheState.NO_CACHE:
        try:
            sysfs.write(f"{backing_rel(sysfs, backing.identity.name)}/attach", cache)
        except SysfsError as exc:
            raise CacheMgrError(f"{dev}: its copies are dropped (it is detached) but the "
                                f"kernel refused to attach it again to cache set {cache}: "
                                f"{kernel_reason_any(backing.identity.name) or exc}; it runs "
                                "uncached", hint=f"cachemgr attach {dev} {cache}") from exc
        out = [Change(dev, "attach", None, cache)]
        now = reread(sysfs, backing.identity.name, stats=False)
        if final_mode is not None and now.mode != final_mode:
            out.append(set_mode(sysfs, now, final_mode))
        return out
    if cset is None:
        raise AlreadyError(f"{dev} is not attached to a cache set: it holds no cached copies")
    if backing.mode == CacheMode.WRITEBACK or backing.state == CacheState.DIRTY or (
            backing.dirty is not None and not backing.dirty.is_zero(512)):
        raise UnsafeError(f"{dev} is in {backing.mode.value if backing.mode else '?'} mode "
                          f"with {backing.state.value if backing.state else '?'} state: its "
                          "copies are not dropped while the cache may hold data the disk "
                          "does not; nothing was changed",
                          hint=f"cachemgr mode {dev} writethrough --drain, then cachemgr "
                               f"invalidate {dev}")
    name = backing.identity.name
    rel = backing_rel(sysfs, name)
    mode = final_mode or backing.mode
    sysfs.write(f"{rel}/detach", "1")
    deadline = time.monotonic() + timeout
    # the detach is over when the device's link to the set is gone (the state reads "no
    # cache" a little before: an attach then is refused as "already attached")
    while sysfs.exists(f"{rel}/cache") or _read_state(sysfs, rel) != CacheState.NO_CACHE:
        if time.monotonic() >= deadline:
            raise TimeoutExpired(f"{dev}: the detach did not finish in {timeout:g} s; the "
                                 "kernel finishes it by itself, and the invalidation is "
                                 "pending", hint=f"cachemgr invalidate {dev} --yes")
        time.sleep(interval)
    changes = [Change(dev, "detach", cset, None)]
    try:
        sysfs.write(f"{rel}/attach", cset)
    except SysfsError as exc:
        said = kernel_reason_any(name)
        raise CacheMgrError(
            f"{dev}: detached (its cached copies are dropped) but the kernel refused to "
            f"attach it again to cache set {cset}: {said or exc}; {dev} runs uncached",
            hint=("the cache set's UUID table is full (one slot is used by each "
                  "invalidation): make the cache set again (cachemgr replace-ssd "
                  f"{cset}) to cache {dev} again" if said and "no room for UUID" in said
                  else f"cachemgr attach {dev} {cset}")) from exc
    changes.append(Change(dev, "attach", None, cset))
    if mode is not None:
        now = reread(sysfs, name, stats=False)
        if now.mode != mode:
            changes.append(set_mode(sysfs, now, mode))
    return changes


def _read_state(sysfs: Sysfs, rel: str) -> CacheState | None:
    try:
        return CacheState(sysfs.read(f"{rel}/state").strip())
    except (SysfsError, ValueError):
        return None


def kernel_reason_any(name: str, *, lines: int = 20) -> str | None:
    """The kernel's last bcache line about ``name`` (bch_cached_dev_attach's "Not caching
    ubda, no room for UUID" has no "error" in it), without its timestamp."""
    try:
        out = runner.run(["dmesg"], timeout=10, check=False).stdout
    except CommandError:
        return None
    found = [re.sub(r"^\[[^]]*\]\s*", "", ln).strip() for ln in out.splitlines()[-lines:]]
    found = [ln for ln in found if "bcache" in ln and re.search(rf"\b{re.escape(name)}\b", ln)]
    return found[-1].removeprefix("bcache: ") if found else None


def reread(sysfs: Sysfs, name: str, *, stats: bool = True) -> BcacheBacking:
    """One backing device read again (``stats`` False: a poll's read, :func:`read_backing`)."""
    rel = block_dirs(sysfs).get(name)
    if rel is None or not sysfs.is_dir(f"{rel}/bcache"):
        raise CacheMgrError(f"/dev/{name} vanished while we were waiting on it")
    return read_backing(sysfs, name, rel, [], stats=stats)


def clear_stats(sysfs: Sysfs, target: BcacheBacking | CacheSet) -> Change:
    if isinstance(target, CacheSet):
        sysfs.write(f"fs/bcache/{target.uuid}/clear_stats", "1")
        return Change(target.uuid, "clear_stats", None, None)
    rel = backing_rel(sysfs, target.identity.name)
    sysfs.write(f"{rel}/clear_stats", "1")
    return Change(_dev(target), "clear_stats", None, None)


def unregister_cache_set(sysfs: Sysfs, cset: CacheSet, backings: tuple[BcacheBacking, ...], *,
                         allow_attached: bool = False, timeout: float = 60) -> Change:
    """Unregister a cache set (flushes and detaches what is attached, the set goes away).

    Refused while backing devices are attached unless ``allow_attached``; refused while any
    of them is dirty in any case (detach them first: that flushes with progress).
    """
    attached = [b for b in backings if b.cset_uuid == cset.uuid]
    dirty = [b for b in attached if b.state == CacheState.DIRTY
             or (b.dirty is not None and not b.dirty.is_zero(512))]
    if dirty:
        raise UnsafeError(
            f"cache set {cset.uuid} holds dirty data of "
            + ", ".join(_dev(b) for b in dirty),
            hint="detach or drain those first: cachemgr detach " + _dev(dirty[0]),
        )
    if attached and not allow_attached:
        raise UnsafeError(
            f"cache set {cset.uuid} still has backing devices attached: "
            + ", ".join(_dev(b) for b in attached),
            hint="detach them first (cachemgr detach DEVICE)",
        )
    if cset.flash_volumes:
        raise UnsafeError(f"cache set {cset.uuid} has {cset.flash_volumes} flash volume(s); "
                          "unregistering would take them away")
    sysfs.write(f"fs/bcache/{cset.uuid}/unregister", "1")
    if not wait_for(lambda: not sysfs.exists(f"fs/bcache/{cset.uuid}"), timeout):
        raise TimeoutExpired(f"cache set {cset.uuid} is still registered after {timeout:g} s")
    return Change(cset.uuid, "unregister", "registered", None)


def stop_backing(sysfs: Sysfs, backing: BcacheBacking, *, timeout: float = 30) -> Change:
    """Stop a backing device: /dev/bcacheN goes away and the device is unregistered.

    Refused while the bcache device is in use (holders such as dm or md on top, a mount) or
    while it holds dirty data in its cache (detach first, which flushes).
    """
    err = stop_refusal(sysfs, backing)
    if err is not None:
        raise err
    rel = backing_rel(sysfs, backing.identity.name)
    sysfs.write(f"{rel}/stop", "1")
    name = backing.identity.name
    if not wait_for(lambda: not sysfs.exists(f"{block_dirs(sysfs).get(name, 'x')}/bcache"),
                    timeout):
        raise TimeoutExpired(f"{_dev(backing)} is still registered {timeout:g} s after stop")
    return Change(_dev(backing), "stop", "running", None)


def stop_refusal(sysfs: Sysfs, backing: BcacheBacking) -> UnsafeError | None:
    """Why :func:`stop_backing` refuses ``backing`` as it is (None: it does not)."""
    if backing.state == CacheState.DIRTY or (
        backing.dirty is not None and not backing.dirty.is_zero(512)
    ):
        return UnsafeError(f"{_dev(backing)} has dirty data in its cache",
                           hint=f"detach it first (flushes): cachemgr detach {_dev(backing)}")
    if backing.device_name:
        holders = sysfs.listdir(f"block/{backing.device_name}/holders")
        if holders:
            return UnsafeError(f"{backing.device} is in use by {', '.join(holders)}")
        if _mounted(backing.device or ""):
            return UnsafeError(f"{backing.device} is mounted")
    return None


def _mounted(node: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split()[0] == node for line in f if line.strip())
    except OSError:
        return False


def stop_cache_set(sysfs: Sysfs, cset: CacheSet, accept: AcceptDataLoss) -> Change:
    """Write ``stop`` to a cache set: every attached backing device stops with it (the VMs'
    disks vanish) and dirty data stays behind on the SSD. Only with AcceptDataLoss."""
    if accept is not AcceptDataLoss.I_ACCEPT_DATA_LOSS:
        raise UnsafeError("stopping a cache set needs the explicit data-loss acknowledgement")
    sysfs.write(f"fs/bcache/{cset.uuid}/stop", "1")
    return Change(cset.uuid, "stop", "registered", None)


def force_run(sysfs: Sysfs, backing: BcacheBacking, accept: AcceptDataLoss) -> Change:
    """Write ``running=1``: start a backing device without its cache. If its dirty data sat
    in the missing cache this is bcache.rst's "massive filesystem corruption" case."""
    if accept is not AcceptDataLoss.I_ACCEPT_DATA_LOSS:
        raise UnsafeError("running a backing device without its cache needs the explicit "
                          "data-loss acknowledgement")
    if backing.running:
        raise AlreadyError(f"{_dev(backing)} is already running")
    rel = backing_rel(sysfs, backing.identity.name)
    sysfs.write(f"{rel}/running", "1")
    return Change(_dev(backing), "running", "0", "1")


def _distinct(sysfs: Sysfs, devs: list[str]) -> None:
    """Refuse (UsageError) two names of one device, or a disk and a partition of it, in one
    make-bcache: it would format the same blocks twice."""
    names = [sysfs.block_name_of(d) or os.path.realpath(d) for d in devs]
    dirs = block_dirs(sysfs)
    for i, (a, na) in enumerate(zip(devs, names, strict=True)):
        for b, nb in list(zip(devs, names, strict=True))[i + 1:]:
            if na == nb:
                raise UsageError(f"{a} and {b} are the same device",
                                 hint="the backing and the cache devices must be different")
            for disk, part in ((na, nb), (nb, na)):
                rel = dirs.get(disk)
                if rel and sysfs.exists(f"{rel}/{part}/partition"):
                    raise UsageError(f"{a} and {b} overlap: /dev/{part} is a partition of "
                                     f"/dev/{disk}",
                                     hint="the backing and the cache devices must not overlap")


def create(
    sysfs: Sysfs, *, backings: list[str], cache: str | None, mode: CacheMode | None = None,
    bucket: str | None = None, force: bool = False, timeout: float = 30,
) -> list[Change]:
    """Format, register and attach: make-bcache -C cache -B backing..., then wait for each
    /dev/bcacheN to appear attached, then set the mode. Refuses busy devices, and devices
    with a signature unless ``force``."""
    if os.geteuid() != 0:
        raise UsageError("creating bcache devices needs root")
    if not backings and not cache:
        raise UsageError("create needs --backing DEV and/or --cache DEV")
    for dev in [*backings, *([cache] if cache else [])]:
        if not os.path.exists(dev):
            raise UsageError(f"{dev}: no such device")
    _distinct(sysfs, [*backings, *([cache] if cache else [])])
    for dev in [*backings, *([cache] if cache else [])]:
        why = in_use(sysfs, dev)
        if why:
            raise UnsafeError(f"{dev} is busy: {why}; refusing to format it")
    picked = None
    if cache:
        size = device_bytes(sysfs, cache)
        if size is not None:
            use = check_bucket(cache, size, bucket)
            if bucket is None and use is not None:
                picked, bucket = use, use
    make_bcache(backing=backings, cache=cache, bucket=bucket, force=force, wipe=force)
    changes = [Change(d, "format", None, "bcache backing") for d in backings]
    if cache:
        changes.append(Change(cache, "format", None, "bcache cache"))
    if picked and cache:
        # the default bucket (512k) gives the kernel too few buckets on this cache
        changes.append(Change(cache, "bucket_size", _kib(DEFAULT_BUCKET), picked))
    for dev in [*([cache] if cache else []), *backings]:
        # udev's 69-bcache.rules may have been faster: already registered is fine
        with contextlib.suppress(AlreadyError):
            changes.append(register(sysfs, dev))
    names = [sysfs.block_name_of(d) or os.path.basename(d) for d in backings]

    def ready() -> bool:
        dirs = block_dirs(sysfs)
        for n in names:
            rel = dirs.get(n)
            if rel is None or not sysfs.exists(f"{rel}/bcache/dev"):
                return False
            if cache and not sysfs.exists(f"{rel}/bcache/cache"):
                return False
        return True

    if not wait_for(ready, timeout):
        raise TimeoutExpired(f"bcache devices for {', '.join(backings)} did not appear within "
                             f"{timeout:g} s", hint="check dmesg for bcache errors")
    if mode is not None:
        dirs = block_dirs(sysfs)
        for n in names:
            b = read_backing(sysfs, n, dirs[n], [])
            with contextlib.suppress(AlreadyError):
                changes.append(set_mode(sysfs, b, mode))
    return changes


def claimed(node: str) -> bool:
    """Whether someone holds the block device ``node`` exclusively (bcache, a mount, md, dm):
    an O_EXCL open fails with EBUSY then, as wipefs's does. A missing node is not held."""
    try:
        fd = os.open(node, os.O_RDONLY | os.O_EXCL)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return True
        if exc.errno == errno.ENOENT:
            return False
        raise
    os.close(fd)
    return False


