"""bcache backend: reads the kernel's bcache objects into the model and changes them.

The backend translates between the kernel and the model and holds no policy. File names and
formats are those of drivers/md/bcache/sysfs.c and Documentation/admin-guide/bcache.rst, as
seen on the lab kernels (captures in tests/fixtures/). Files that a kernel lacks read as None.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachemgr import runner
from cachemgr.errors import (
    AlreadyError,
    CacheMgrError,
    KernelFormatError,
    SysfsError,
    UnsafeError,
    UsageError,
)
from cachemgr.model import (
    BcacheBacking,
    BcacheCache,
    CacheMode,
    CacheSet,
    CacheState,
    Identity,
    Size,
    Stats,
    WritebackDebug,
    parse_bracketed,
)
from cachemgr.sysfs import Sysfs

log = logging.getLogger(__name__)

STATS_INTERVALS = ("five_minute", "hour", "day", "total")
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


def block_dirs(sysfs: Sysfs) -> dict[str, str]:
    """Kernel name -> device directory (relative to the sysfs root) of disks and partitions."""
    out: dict[str, str] = {}
    for name in sysfs.block_names():
        base = f"block/{name}"
        out[name] = base
        for child in sysfs.listdir(base):
            if sysfs.exists(f"{base}/{child}/partition"):
                out[child] = f"{base}/{child}"
    return out


def identity(sysfs: Sysfs, name: str, rel: str) -> Identity:
    """What sysfs itself knows of a block device (udev's ID_* come from identity.py)."""
    size = sysfs.read_int(f"{rel}/size")
    wwid = sysfs.read_opt(f"{rel}/device/wwid") or sysfs.read_opt(f"{rel}/wwid")
    serial = sysfs.read_opt(f"{rel}/serial") or sysfs.read_opt(f"{rel}/device/serial")
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


def read_stats(sysfs: Sysfs, rel: str, warnings: list[str]) -> dict[str, Stats]:
    out = {}
    for interval in STATS_INTERVALS:
        d = f"{rel}/stats_{interval}"
        if not sysfs.is_dir(d):
            continue

        def num(name: str, d: str = d) -> int | None:
            return _opt(_int, sysfs.read_opt(f"{d}/{name}"), f"{d}/{name}", warnings)  # type: ignore[no-any-return]

        out[interval] = Stats(
            interval=interval,
            hits=num("cache_hits"),
            misses=num("cache_misses"),
            hit_ratio=num("cache_hit_ratio"),
            bypassed=_opt(Size.parse_hprint, sysfs.read_opt(f"{d}/bypassed"), f"{d}/bypassed",
                          warnings),
            bypass_hits=num("cache_bypass_hits"),
            bypass_misses=num("cache_bypass_misses"),
            miss_collisions=num("cache_miss_collisions"),
        )
    return out


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


def read_backing(sysfs: Sysfs, name: str, rel: str, warnings: list[str]) -> BcacheBacking:
    b = f"{rel}/bcache"

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
    swf = r("stop_when_cache_set_failed")
    dbg = r("writeback_rate_debug")
    dev_name = _link_name(sysfs, f"{b}/dev")
    cset = _link_name(sysfs, f"{b}/cache")
    return BcacheBacking(
        identity=identity(sysfs, name, rel),
        device=f"/dev/{dev_name}" if dev_name else None,
        device_name=dev_name,
        uuid=(r("backing_dev_uuid") or "").strip() or None,
        cset_uuid=cset if cset and _UUID.match(cset) else None,
        label=(r("label") or "").strip() or None,
        mode=mode,
        state=state,
        dirty=_opt(Size.parse_hprint, r("dirty_data"), w("dirty_data"), warnings),
        running=_opt(_bool, r("running"), w("running"), warnings),
        writeback_rate=_opt(lambda t: Size.parse_hprint(t.removesuffix("/sec")),
                            r("writeback_rate"), w("writeback_rate"), warnings),
        writeback_percent=_opt(_int, r("writeback_percent"), w("writeback_percent"), warnings),
        writeback_delay=_opt(_int, r("writeback_delay"), w("writeback_delay"), warnings),
        writeback_running=_opt(_bool, r("writeback_running"), w("writeback_running"), warnings),
        writeback_rate_minimum=_opt(_int, r("writeback_rate_minimum"),
                                    w("writeback_rate_minimum"), warnings),
        sequential_cutoff=_opt(Size.parse_hprint, r("sequential_cutoff"),
                               w("sequential_cutoff"), warnings),
        io_errors=_opt(_int, r("io_errors"), w("io_errors"), warnings),
        io_error_limit=_opt(_int, r("io_error_limit"), w("io_error_limit"), warnings),
        stop_when_cache_set_failed=(
            _opt(lambda t: parse_bracketed(t)[0], swf, w("stop_when_cache_set_failed"),
                 warnings)),
        rate_debug=_opt(WritebackDebug.parse, dbg, w("writeback_rate_debug"), warnings),
        stats=read_stats(sysfs, b, warnings),
    )


def read_cache(sysfs: Sysfs, name: str, rel: str, warnings: list[str]) -> BcacheCache:
    b = f"{rel}/bcache"

    def r(f: str) -> str | None:
        return sysfs.read_opt(f"{b}/{f}")

    cset = _link_name(sysfs, f"{b}/set")
    policy = r("cache_replacement_policy")
    return BcacheCache(
        identity=identity(sysfs, name, rel),
        cset_uuid=cset if cset and _UUID.match(cset) else None,
        io_errors=_opt(_int, r("io_errors"), f"{name}: io_errors", warnings),
        bucket_size=_opt(Size.parse_hprint, r("bucket_size"), f"{name}: bucket_size", warnings),
        nbuckets=_opt(_int, r("nbuckets"), f"{name}: nbuckets", warnings),
        block_size=_opt(Size.parse_hprint, r("block_size"), f"{name}: block_size", warnings),
        replacement_policy=_opt(lambda t: parse_bracketed(t)[0], policy,
                                f"{name}: cache_replacement_policy", warnings),
        written=_opt(Size.parse_hprint, r("written"), f"{name}: written", warnings),
    )


def read_cache_set(sysfs: Sysfs, uuid: str, caches: dict[str, BcacheCache],
                   warnings: list[str]) -> CacheSet:
    d = f"fs/bcache/{uuid}"
    entries = sysfs.listdir(d)
    cache_names = [_link_device(sysfs, f"{d}/{e}") for e in entries if re.fullmatch(r"cache\d+", e)]
    bdev_names = [_link_device(sysfs, f"{d}/{e}") for e in entries if re.fullmatch(r"bdev\d+", e)]
    flash = sum(1 for e in entries if re.fullmatch(r"volume\d+", e))

    def r(f: str) -> str | None:
        return sysfs.read_opt(f"{d}/{f}")

    errors = r("errors")
    return CacheSet(
        uuid=uuid,
        caches=tuple(caches[n] for n in cache_names if n and n in caches),
        backing_names=tuple(n for n in bdev_names if n),
        flash_volumes=flash,
        cache_available_percent=_opt(_int, r("cache_available_percent"),
                                     f"{uuid}: cache_available_percent", warnings),
        congested=r("congested"),
        congested_read_threshold_us=_opt(_int, r("congested_read_threshold_us"),
                                         f"{uuid}: congested_read_threshold_us", warnings),
        congested_write_threshold_us=_opt(_int, r("congested_write_threshold_us"),
                                          f"{uuid}: congested_write_threshold_us", warnings),
        errors=_opt(lambda t: parse_bracketed(t)[0], errors, f"{uuid}: errors", warnings),
        io_error_limit=_opt(_int, r("io_error_limit"), f"{uuid}: io_error_limit", warnings),
        io_error_halflife=_opt(_int, r("io_error_halflife"), f"{uuid}: io_error_halflife",
                               warnings),
        block_size=_opt(Size.parse_hprint, r("block_size"), f"{uuid}: block_size", warnings),
        bucket_size=_opt(Size.parse_hprint, r("bucket_size"), f"{uuid}: bucket_size", warnings),
        dirty=_opt(Size.parse_hprint, r("dirty_data"), f"{uuid}: dirty_data", warnings),
        stats=read_stats(sysfs, d, warnings),
    )


@dataclass(frozen=True)
class BcacheScan:
    loaded: bool
    cache_sets: tuple[CacheSet, ...]
    backings: tuple[BcacheBacking, ...]
    caches: tuple[BcacheCache, ...]
    warnings: tuple[str, ...]


def scan(sysfs: Sysfs) -> BcacheScan:
    """Read every bcache object: cache sets, their cache devices, backing devices."""
    warnings: list[str] = []
    backings: list[BcacheBacking] = []
    caches: dict[str, BcacheCache] = {}
    for name, rel in sorted(block_dirs(sysfs).items()):
        if name.startswith("bcache") or not sysfs.is_dir(f"{rel}/bcache"):
            continue
        if sysfs.exists(f"{rel}/bcache/cache_mode"):
            backings.append(read_backing(sysfs, name, rel, warnings))
        elif sysfs.exists(f"{rel}/bcache/bucket_size") or sysfs.exists(f"{rel}/bcache/set"):
            caches[name] = read_cache(sysfs, name, rel, warnings)
    sets = []
    if sysfs.is_dir("fs/bcache"):
        for entry in sysfs.listdir("fs/bcache"):
            if _UUID.match(entry) and sysfs.is_dir(f"fs/bcache/{entry}"):
                sets.append(read_cache_set(sysfs, entry, caches, warnings))
    return BcacheScan(
        loaded=sysfs.is_dir("fs/bcache"),
        cache_sets=tuple(sets),
        backings=tuple(backings),
        caches=tuple(caches.values()),
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------------------
# operations


@dataclass(frozen=True)
class Change:
    """What an operation did: ``changed`` False means it was already so."""

    target: str
    what: str
    before: str | None
    after: str | None
    changed: bool = True


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
    return Change(backing.device or name, "cache_mode", str(backing.mode), now)


def register(sysfs: Sysfs, node: str) -> Change:
    """``echo DEV > /sys/fs/bcache/register``; the write's error *is* the kernel's answer."""
    if not sysfs.exists("fs/bcache/register"):
        raise CacheMgrError("the bcache module is not loaded", hint="modprobe bcache")
    try:
        sysfs.write("fs/bcache/register", node)
    except SysfsError as exc:
        # EBUSY/EEXIST: "device already registered" (super.c register_bcache)
        if exc.errno in (16, 17):
            raise AlreadyError(f"{node} is already registered with bcache") from exc
        raise CacheMgrError(
            f"the kernel refused to register {node}: {exc}",
            hint="check that it carries a bcache superblock (bcache-super-show)",
        ) from exc
    return Change(node, "register", None, "registered")


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
            sig = runner.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", dev],
                             check=False, timeout=30)
            if sig.returncode == 0 and sig.stdout.strip():
                raise UnsafeError(
                    f"{dev} holds a {sig.stdout.split()[0]} signature; refusing to format it",
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


def wait_for(pred: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
