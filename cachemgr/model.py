"""The shared model: frozen dataclasses and enums used by every backend and face.

Foreign text becomes typed data at the edge (sysfs strings, dmsetup lines, blkid probes): the
parsers that do it live here or in the backends, and each documents the formats it accepts with
a sample and raises :class:`KernelFormatError` carrying the text it could not read.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from cachemgr.errors import KernelFormatError


class CacheMode(enum.StrEnum):
    """A cache mode, in the kernel's words (bcache's ``cache_mode``; dm-cache's features)."""

    WRITETHROUGH = "writethrough"
    WRITEBACK = "writeback"
    WRITEAROUND = "writearound"
    NONE = "none"
    PASSTHROUGH = "passthrough"  # dm-cache's word; bcache calls it "none"

    @classmethod
    def parse(cls, text: str) -> CacheMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise KernelFormatError("cache mode", text) from None


class CacheState(enum.StrEnum):
    """bcache's ``state`` words; dm-cache maps onto clean/dirty, plus failed and unknown."""

    NO_CACHE = "no cache"
    CLEAN = "clean"
    DIRTY = "dirty"
    INCONSISTENT = "inconsistent"
    FAILED = "failed"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, text: str) -> CacheState:
        try:
            return cls(text.strip())
        except ValueError:
            raise KernelFormatError("cache state", text) from None


_UNITS = "?kMGTPEZY"
# bch_hprint output: "0.0k", "4.0k", "512.0k", "59.9M", "0.9T" (7.2 lab kernel); older
# kernels printed "0", "512", "58M" (no forced shift, no decimal for q >= 10); a leading "-"
# for negative values (writeback_rate_debug's proportional/integral/change).
_HPRINT = re.compile(r"^(-?)(\d+)(?:\.(\d))?([kMGTPEZY]?)$")


@dataclass(frozen=True, order=True)
class Size:
    """A size in bytes, with the bounds a lossy kernel rendering leaves.

    ``bch_hprint`` (drivers/md/bcache/util.c) prints ``q.d`` + unit where ``d`` is the first
    decimal of the remainder, truncated: "59.9M" stands for any value in
    [59.9 MiB, 60.0 MiB). ``low`` is what the text guarantees, ``high`` the largest value it
    can stand for. Code that decides safety (is the cache clean?) must use ``high``.
    """

    low: int
    high: int

    @classmethod
    def exact(cls, n: int) -> Size:
        return cls(n, n)

    @property
    def bytes(self) -> int:
        return self.low

    @property
    def is_exact(self) -> bool:
        return self.low == self.high

    def is_zero(self, granularity: int = 1) -> bool:
        """True only if the value is certainly 0 given the counting ``granularity``.

        dirty_data counts 512-byte sectors, so "0.0k" (any value below 103 bytes) is 0.
        """
        return self.low == 0 and self.high < max(granularity, 1)

    @classmethod
    def parse_hprint(cls, text: str) -> Size:
        """Parse the kernel's ``bch_hprint`` rendering of a byte count."""
        m = _HPRINT.match(text.strip())
        if not m:
            raise KernelFormatError("bcache size", text)
        neg, q, d, unit = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        u = _UNITS.index(unit) if unit else 0
        scale = 1 << (10 * u)
        sub = scale >> 10  # one unit of the remainder t (0..1023)
        if u == 0:
            low = high = q
        elif d is None:
            low, high = q * scale, q * scale + scale - 1
        else:
            dd = int(d)
            # t*10/1024 == dd  <=>  ceil(dd*1024/10) <= t <= ceil((dd+1)*1024/10) - 1
            t_lo = -(-dd * 1024 // 10)
            t_hi = -(-(dd + 1) * 1024 // 10) - 1
            low, high = q * scale + t_lo * sub, q * scale + t_hi * sub + sub - 1
        if u >= 2:
            # a second shift only happens while the value is >= 1000 of the unit below:
            # "0.9T" is [1000 GiB, 1 TiB), since 922 GiB prints as "922.0G"
            low = max(low, 1000 * sub)
        if low > high:
            raise KernelFormatError("bcache size (no value prints like this)", text)
        if neg:
            low, high = -high, -low
        return cls(low, high)

    def __str__(self) -> str:
        return human(self.low)


def hprint(v: int) -> str:
    """The 7.2 kernel's bch_hprint, for tests and display (always at least one shift)."""
    q = abs(v)
    u = 0
    while True:
        u += 1
        t = q & 1023
        q >>= 10
        if q < 1000:
            break
    return f"{'-' if v < 0 else ''}{q}.{t * 10 // 1024}{_UNITS[u]}"


def human(n: int | None) -> str:
    """Bytes for people: 0 B, 512 B, 4.0 KiB, 58.5 MiB (binary units)."""
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n} B"
    v = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        v /= 1024
        if abs(v) < 1024 or unit == "PiB":
            return f"{v:.1f} {unit}"
    raise AssertionError("unreachable")


def parse_bracketed(text: str) -> tuple[str, tuple[str, ...]]:
    """``writethrough [writeback] writearound none`` -> (active, all choices).

    bcache prints sysfs choice files this way (cache_mode, cache_replacement_policy,
    stop_when_cache_set_failed); the active one is in brackets.
    """
    words = text.split()
    active = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    if len(active) != 1:
        raise KernelFormatError("bracketed choice", text)
    return active[0], tuple(w.strip("[]") for w in words)


@dataclass(frozen=True)
class Identity:
    """Who a block device is, by names that survive a reboot where the kernel has them."""

    name: str  # kernel name: sdb, ubda, bcache0, dm-3
    node: str  # /dev/sdb
    devno: str | None = None  # "8:16"
    size_bytes: int | None = None
    serial: str | None = None
    wwn: str | None = None
    model: str | None = None
    vendor: str | None = None
    by_id: tuple[str, ...] = ()
    by_path: str | None = None
    rotational: bool | None = None
    fs_type: str | None = None
    fs_uuid: str | None = None
    partition_of: str | None = None


@dataclass(frozen=True)
class Stats:
    """One interval of bcache's stats_* directory; a missing file is None (unknown)."""

    interval: str
    hits: int | None = None
    misses: int | None = None
    hit_ratio: int | None = None  # percent, as the kernel rounds it
    bypassed: Size | None = None
    bypass_hits: int | None = None
    bypass_misses: int | None = None
    miss_collisions: int | None = None

    @property
    def computed_hit_ratio(self) -> float | None:
        """hits / (hits + misses), or None when there was no IO or counts are unknown."""
        if self.hits is None or self.misses is None or self.hits + self.misses == 0:
            return None
        return self.hits / (self.hits + self.misses)


@dataclass(frozen=True)
class WritebackDebug:
    """``writeback_rate_debug``: the PI controller's view (drivers/md/bcache/sysfs.c).

    Sample (7.2)::

        rate:		512.0k/sec
        dirty:		59.9M
        target:		0.0k
        proportional:	0.0k
        integral:	0.0k
        change:		0.0k/sec
        next io:	-2922ms
    """

    rate: Size | None = None
    dirty: Size | None = None
    target: Size | None = None
    proportional: Size | None = None
    integral: Size | None = None
    change: Size | None = None
    next_io_ms: int | None = None

    @classmethod
    def parse(cls, text: str) -> WritebackDebug:
        vals: dict[str, Size | int | None] = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            key, sep, value = line.partition(":")
            if not sep:
                raise KernelFormatError("writeback_rate_debug line", line)
            key, value = key.strip(), value.strip()
            if key == "next io":
                if not value.endswith("ms"):
                    raise KernelFormatError("writeback_rate_debug next io", line)
                vals["next_io_ms"] = int(value[:-2])
            elif key in ("rate", "dirty", "target", "proportional", "integral", "change"):
                vals[key] = Size.parse_hprint(value.removesuffix("/sec"))
            # unknown keys are new kernel fields: ignored, not fatal
        return cls(**vals)  # type: ignore[arg-type]


@dataclass(frozen=True)
class BcacheBacking:
    """A registered bcache backing device (``/sys/block/<bdev>/bcache``)."""

    identity: Identity
    device: str | None  # /dev/bcache0: the node VMs use
    device_name: str | None  # bcache0
    uuid: str | None  # backing_dev_uuid: stable across boots (/dev/bcache/by-uuid/)
    cset_uuid: str | None  # the cache set it is attached to, None when detached
    label: str | None
    mode: CacheMode | None
    state: CacheState
    dirty: Size | None
    running: bool | None
    writeback_rate: Size | None
    writeback_percent: int | None
    writeback_delay: int | None
    writeback_running: bool | None
    writeback_rate_minimum: int | None
    sequential_cutoff: Size | None
    io_errors: int | None
    io_error_limit: int | None
    stop_when_cache_set_failed: str | None
    rate_debug: WritebackDebug | None
    stats: dict[str, Stats] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.uuid or self.identity.name


@dataclass(frozen=True)
class BcacheCache:
    """The cache device (the SSD) of a cache set (``/sys/block/<ssd>/bcache``)."""

    identity: Identity
    cset_uuid: str | None
    io_errors: int | None
    bucket_size: Size | None
    nbuckets: int | None
    block_size: Size | None
    replacement_policy: str | None
    written: Size | None


@dataclass(frozen=True)
class CacheSet:
    """A bcache cache set (``/sys/fs/bcache/<uuid>``): one cache device, N backing devices."""

    uuid: str
    caches: tuple[BcacheCache, ...]
    backing_names: tuple[str, ...]  # kernel names of attached backing devices
    flash_volumes: int
    cache_available_percent: int | None
    congested: str | None
    congested_read_threshold_us: int | None
    congested_write_threshold_us: int | None
    errors: str | None
    io_error_limit: int | None
    io_error_halflife: int | None
    block_size: Size | None
    bucket_size: Size | None
    dirty: Size | None  # cache-set dirty_data: only updated at GC (FACTS.md)
    stats: dict[str, Stats] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """Everything cachemgr knows about the host's caches, read once.

    ``status``, the TUI, metrics and the procedures all read this; nothing re-reads sysfs its
    own way. ``warnings`` lists what could not be read (the snapshot is still usable).
    """

    kernel: str | None
    bcache_loaded: bool
    cache_sets: tuple[CacheSet, ...]
    backings: tuple[BcacheBacking, ...]
    warnings: tuple[str, ...] = ()

    def cache_set(self, uuid: str) -> CacheSet | None:
        return next((c for c in self.cache_sets if c.uuid == uuid), None)
