"""The shared model: frozen dataclasses and enums used by every backend and face.

Foreign text becomes typed data at the edge (sysfs strings, dmsetup lines, blkid probes): the
parsers that do it live here or in the backends, and each documents the formats it accepts with
a sample and raises :class:`KernelFormatError` carrying the text it could not read.
"""

from __future__ import annotations

import enum
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from cachemgr.core import defaults
from cachemgr.core.errors import KernelFormatError, UsageError


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


class AcceptDataLoss(enum.Enum):
    """The explicit, separately named argument for the operations that can lose data.

    Writing ``running=1`` to a backing device whose dirty data sat in a lost cache, or
    ``stop`` to a cache set, can corrupt filesystems or make VM disks vanish
    (bcache.rst; docs/kernel-notes.md, "Failure"). The library (a backend, a cache kind's
    force_run and stop_set) never does either unless handed this.
    """

    I_ACCEPT_DATA_LOSS = "I accept data loss"


_UNITS = "?kMGTPEZY"
# Size.parse_hprint's parsed texts (at most _HPRINT_KEEP, then it starts again)
_HPRINT_SEEN: dict[tuple[str, bool | None], Any] = {}
_HPRINT_KEEP = 4096
# bch_hprint output (docs/kernel-notes.md, "bch_hprint sizes"): 4.14 and later (the lab's
# 7.2 and 6.1) "0.0k", "4.0k", "512.0k", "59.9M", "0.9T": always one shift, one decimal;
# before 4.14 "0", "512" (bytes, no shift), "1.5k", "1.10k" (the decimal is t/100 of the
# 10-bit remainder t, so 0..10: two digits for t >= 1000), "512k" (no decimal from 100 up).
# A leading "-" for negative values (writeback_rate_debug's proportional/integral/change).
# (ASCII digits, at most a u64's 20: int() refuses a run of more than 4300 with a ValueError)
_HPRINT = re.compile(r"^(-?)([0-9]{1,20})(?:\.([0-9]{1,2}))?([kMGTPEZY]?)$")


@dataclass(frozen=True, order=True)
class Size:
    """A size in bytes, with the bounds a lossy kernel rendering leaves.

    ``bch_hprint`` (drivers/md/bcache/util.c) prints ``q.d`` + unit where ``d`` is the first
    decimal of the remainder, truncated: "59.9M" stands for any value in
    [59.9 MiB, 60.0 MiB). ``low`` is what the text guarantees, ``high`` the largest value it
    can stand for. Code that decides safety (is the cache clean?) must use ``high``.
    Kernels before 4.14 printed other forms (:meth:`parse_hprint`).
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
    def parse_hprint(cls, text: str, *, old: bool | None = False) -> Size:
        """:meth:`_parse_hprint`, each text parsed once: a poll parses the same few texts
        ("0.0k", "512.0k") hundreds of times (writeback_rate_debug's six sizes per backing
        device); a Size is immutable, so the one parsed before is the answer."""
        key = (text, old)
        hit = _HPRINT_SEEN.get(key)
        if hit is not None and type(hit) is cls:
            return hit
        size = cls._parse_hprint(text, old=old)
        if len(_HPRINT_SEEN) >= _HPRINT_KEEP:
            _HPRINT_SEEN.clear()
        _HPRINT_SEEN[key] = size
        return size

    @classmethod
    def _parse_hprint(cls, text: str, *, old: bool | None = False) -> Size:
        """Parse the kernel's ``bch_hprint`` rendering of a byte count.

        ``old``: whether the kernel predates 4.14 (False: 4.14 or later, the lab's kernels;
        None: not known). Only a one-digit decimal after 1 to 99 ("1.1k", "59.9M") reads
        differently: from 4.14 the decimal is ``t*10/1024`` of the 10-bit remainder ``t``
        ("1.1k" is [1127, 1228] bytes), before it ``t/100`` ("1.1k" is [1124, 1223]); with
        None the bounds hold both. The other forms come from one side only and read so
        whatever ``old`` says: "0.0k", "0.9T", "512.0k" from 4.14 on; bytes ("512"), no
        decimal ("512k") and the two-digit ".10" ("1.10k" is [2024, 2047]) from before.
        The 4.14 reading's upper bound is never below the old one's, so the default's
        ``high`` holds an old kernel's value too (docs/kernel-notes.md, "bch_hprint sizes").
        """
        m = _HPRINT.match(text.strip())
        if not m:
            raise KernelFormatError("bcache size", text)
        neg, q, d, unit = m.group(1) == "-", int(m.group(2)), m.group(3), m.group(4)
        if not unit:
            if d is not None:
                raise KernelFormatError("bcache size (no kernel prints a decimal without a "
                                        "unit)", text)
            return cls.exact(-q if neg else q)  # before 4.14: bytes below 1024, exact
        u = _UNITS.index(unit)
        scale = 1 << (10 * u)
        sub = scale >> 10  # one unit of the remainder t (0..1023)

        def before_4_14(t_lo: int, t_hi: int) -> tuple[int, int]:
            # the loop shifts a signed value (>>= floors), t = its low 10 bits, then
            # "%lli" of what is left: "-2.5k" is -2048 + [500, 599]
            v = -q if neg else q
            return v * scale + t_lo * sub, v * scale + t_hi * sub + sub - 1

        def since_4_14(dd: int) -> tuple[int, int]:
            # the magnitude is shifted, "-" printed before it; t*10/1024 == dd <=>
            # ceil(dd*1024/10) <= t <= ceil((dd+1)*1024/10) - 1
            t_lo = -(-dd * 1024 // 10)
            t_hi = -(-(dd + 1) * 1024 // 10) - 1
            low, high = q * scale + t_lo * sub, q * scale + t_hi * sub + sub - 1
            if u >= 2:
                # a second shift only happens while the value is >= 1000 of the unit below:
                # "0.9T" is [1000 GiB, 1 TiB), since 922 GiB prints as "922.0G"
                low = max(low, 1000 * sub)
            if low > high:
                raise KernelFormatError("bcache size (no value prints like this)", text)
            return (-high, -low) if neg else (low, high)

        if d is None:
            low, high = before_4_14(0, 1023)
        elif len(d) == 2:
            if d != "10" or not 1 <= q < 100:
                raise KernelFormatError("bcache size (no kernel prints this decimal)", text)
            low, high = before_4_14(1000, 1023)
        else:
            dd = int(d)
            readings = [since_4_14(dd)]
            if old is not False and 1 <= q < 100:  # both kernels print this form
                readings.append(before_4_14(100 * dd, 100 * dd + 99))
                if old:
                    readings = readings[1:]
            low, high = min(r[0] for r in readings), max(r[1] for r in readings)
        return cls(low, high)

    def __str__(self) -> str:
        return human(self.low)


# The one grammar for a size an admin types (CLI options, the TUI, policy files, fio jobs):
#   size := digits                       bytes: "4096"
#         | digits ["." digits] unit     "64k", "1M", "1.5G", "2TiB"
#         | digits "B"                   bytes: "512B"
#   unit := k|K|M|G|T, optionally followed by "B" or "iB" (any case of b: "4kb", "64KiB")
# Units are binary (1k = 1024, as fio, bcache-tools and dmsetup read them); a fraction must
# come out as a whole number of bytes ("0.1k" is refused). Whitespace around the size is
# ignored, inside it refused ("4 k"). Negative, exponent, nan/inf, and anything above
# MAX_SIZE (off_t's maximum) are refused.
_SIZE = re.compile(r"([0-9]{1,20})(?:\.([0-9]{1,20}))?(?:([kmgt])(?:i?b)?|(b))?",
                   re.ASCII | re.IGNORECASE)
_SIZE_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}
MAX_SIZE = (1 << 63) - 1
SIZE_HINT = "a size is bytes or a number with k, M, G or T (binary: 1k = 1024), e.g. 64k, 1.5G"


def parse_size(text: str, *, hint: str = SIZE_HINT) -> int:
    """The byte count of a size an admin typed (the grammar above); UsageError otherwise.

    Not for the kernel's ``bch_hprint`` output: that is :meth:`Size.parse_hprint`.
    """
    if not isinstance(text, str):
        raise UsageError(f"bad size {text!r}: not text", hint=hint)
    m = _SIZE.fullmatch(text.strip())
    if not m or (m.group(2) is not None and m.group(3) is None):
        raise UsageError(f"bad size {text!r}", hint=hint)
    whole, frac, unit = m.group(1), m.group(2) or "", (m.group(3) or "").lower()
    scaled = int(whole + frac) << _SIZE_SHIFT.get(unit, 0)
    denominator: int = 10 ** len(frac)
    n, rest = divmod(scaled, denominator)
    if rest:
        raise UsageError(f"bad size {text!r}: not a whole number of bytes", hint=hint)
    if n > MAX_SIZE:
        raise UsageError(f"bad size {text!r}: larger than {MAX_SIZE} bytes", hint=hint)
    return n


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


def short(n: int | None) -> str:
    """Compact sizes for tables: 0, 512B, 4.0K, 58.5M, 1.2G ("?": unknown)."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n}B" if n else "0"
    v = float(n)
    for unit in "KMGTP":
        v /= 1024
        if v < 1024 or unit == "P":
            return f"{v:.1f}{unit}"
    raise AssertionError("unreachable")


def parse_bracketed(text: str) -> tuple[str, tuple[str, ...]]:
    """``writethrough [writeback] writearound none`` -> (active, all choices).

    bcache prints sysfs choice files this way (cache_mode, cache_replacement_policy,
    stop_when_cache_set_failed); the active one is in brackets.
    """
    words = text.split()
    active = [w[1:-1] for w in words if len(w) > 2 and w[0] == "[" and w[-1] == "]"]
    choices = tuple(w[1:-1] if len(w) > 2 and w[0] == "[" and w[-1] == "]" else w
                    for w in words)
    if len(active) != 1 or any("[" in c or "]" in c for c in choices):
        raise KernelFormatError("bracketed choice", text)
    return active[0], choices


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
                if not re.fullmatch(r"-?[0-9]{1,20}ms", value, re.ASCII):
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

    @property
    def dirty_bytes(self) -> int | None:
        """Dirty bytes, or None when unknown: a device whose cache set is missing reads
        ``dirty_data`` 0 while its state says dirty (the dirty data is on the missing SSD)."""
        if self.dirty is None:
            return None
        if self.state == CacheState.DIRTY and self.cset_uuid is None and self.dirty.is_zero(512):
            return None
        return self.dirty.bytes


def dirty_text(b: BcacheBacking) -> str:
    """A backing device's dirty data for a table: "lost?" when it sits on a cache set that
    is not registered, "?" when unknown."""
    if b.dirty is None:
        return "?"
    if b.cset_uuid is None and b.state.value == "dirty":
        return "lost?"  # the dirty data is on a cache set that is not registered
    return short(b.dirty.bytes)


def errors_text(own: int | None, ssd: int = 0) -> str:
    """A backing device's ERR cell: its own IO errors, and its cache set's SSD's after a
    "+" when it has any ("0+4 SSD": none on the backing device, 4 on the SSD its dirty data
    is on), so that no row says 0 while its data sits on a failing SSD."""
    text = "?" if own is None else str(own)
    return f"{text}+{ssd} SSD" if ssd else text


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
    # the cache set's dirty_data: only updated at GC (docs/kernel-notes.md, "Cache-set files")
    dirty: Size | None
    stats: dict[str, Stats] = field(default_factory=dict)


@dataclass(frozen=True)
class UnregisteredBcache:
    """A block device with a bcache superblock that the kernel has not registered.

    Seen after a cache SSD failed (lab, 7.2): bcache stops and unregisters every backing
    device that held dirty data; its superblock still says ``dirty`` and names the lost cache
    set. From ``bcache-super-show`` (sb.version, dev.uuid, cset.uuid, dev.data.cache_state).
    """

    identity: Identity
    kind: str  # "backing" or "cache"
    uuid: str | None  # dev.uuid
    cset_uuid: str | None
    sb_state: str | None  # backing devices: "no cache", "clean", "dirty", "stale"
    sb_mode: str | None

    @property
    def dirty_data_lost_with_cache(self) -> bool:
        return self.kind == "backing" and self.sb_state == "dirty"


@dataclass(frozen=True)
class Owner:
    """A procedure that owns cache objects: a drain, a replace-ssd run, a mode switch...
    running (its process holds the objects' locks) or interrupted (its process is gone; its
    journal is there and claims them until it is resumed or rolled back). ``keys`` are the
    lock keys of the objects it owns (cachemgr/procedures/owners.py)."""

    procedure: str  # "drain", "replace-ssd", "dm-cache flush", "lvm drain", "mode", ...
    keys: frozenset[str]
    device: str  # what it acts on, in words (/dev/bcache0, cache set UUID, VG/LV)
    running: bool
    run: str | None = None  # a replace-ssd run ID
    step: str | None = None
    since: float | None = None  # epoch seconds
    pid: int | None = None
    resume: str | None = None  # the command that finishes or resumes it
    rollback: str | None = None  # the command that undoes it (None: only finishing is safe)
    journal: str | None = None  # its journal's path
    # a drain or flush under way: when it last lowered the dirty data (epoch seconds, as its
    # lock file says; core/drainloop.py writes it), and how much was dirty then
    progress_at: float | None = None
    progress_dirty: int | None = None

    def words(self) -> str:
        """"replace-ssd run R (since 10:42:07, step drain, pid 123)"."""
        import time as _time

        head = (self.procedure or "a cachemgr run") + (f" run {self.run}" if self.run else "")
        bits = []
        if self.since is not None:
            bits.append("since " + _time.strftime("%H:%M:%S", _time.localtime(self.since)))
        if self.step:
            bits.append(("at step " if self.running else "stopped in step ") + self.step)
        if self.pid and self.running:
            bits.append(f"pid {self.pid}")
        if not self.running:
            bits.append("interrupted: its process is gone")
        return head + (f" ({', '.join(bits)})" if bits else "")

    def next_step(self) -> str:
        """What an admin does about it."""
        if self.running:
            return "wait for it to finish"
        if self.resume and self.rollback:
            return f"resume it ({self.resume}) or roll it back ({self.rollback}) first"
        if self.resume:
            return f"resume it first ({self.resume})"
        return "look at its journal " + (self.journal or "") + " first"


@dataclass(frozen=True)
class LoggedErrors:
    """The failed requests the block layer logged for one disk in the last hour (the kernel
    log: backends/kernlog.py; never a passthrough command's, such as smartctl's probing)."""

    disk: str  # /dev/sda
    count: int  # lines in the log (a lower bound: the log is rate limited and a ring)
    ops: tuple[str, ...]  # READ, WRITE, ...
    latest_age: float  # seconds since the latest
    latest: str  # the latest line

    def words(self) -> str:
        ago = (f"{self.latest_age:.0f} s" if self.latest_age < 120
               else f"{self.latest_age / 60:.0f} min")
        return (f"{self.count} failed {'/'.join(self.ops)} requests on {self.disk} in the "
                f"kernel log, the latest {ago} ago")


@dataclass(frozen=True)
class GoneBacking:
    """A bcache backing device last seen with dirty data on a cache set, and not on the host
    now (pulled, dead, its dm device removed): its dirty data is only on the set's SSD.
    Remembered by ``cachemgr check`` (procedures/health.py, :func:`remember`)."""

    uuid: str  # its bcache UUID (dev.uuid / backing_dev_uuid)
    node: str  # its node when last seen: /dev/sdb
    device: str | None  # /dev/bcache0 when last seen
    cset_uuid: str
    dirty_bytes: int | None
    seen_at: float  # epoch seconds


@dataclass(frozen=True)
class UnassembledDmCache:
    """A dm-cache device cachemgr created and recorded (/etc/cachemgr/dmcache/NAME.json)
    that is not assembled now: after a reboot until the boot pass assembles it, or for good
    while one of its devices is missing or is not the recorded one. In writeback its origin
    may be stale: the newest blocks are on its cache device."""

    name: str
    record: str  # the record's path
    mode: CacheMode
    # role -> why it cannot be used ("missing", "a different disk ..."); empty: all present
    problems: tuple[tuple[str, str], ...] = ()
    # role -> why it is not proven: present, but known by its place only, so the boot pass
    # leaves it to the admin (backends/dmcache/record.py)
    unproven: tuple[tuple[str, str], ...] = ()
    # with ``unproven`` and no problems: what the admin checks, then the command
    check: str | None = None

    @property
    def node(self) -> str:
        return f"/dev/mapper/{self.name}"


@dataclass(frozen=True)
class Unseen:
    """Something a run without root could not read (``cachemgr check``, ``status`` and the
    metrics run by a monitoring agent's user): ``what`` (``state-directory``,
    ``dmcache-records``, ``dmsetup``, ``superblocks``: a stable word, the metrics' label),
    ``path`` (where it is, or None), ``why`` (the kernel's or the tool's words) and
    ``hides`` (what cannot be seen because of it, in words). Every one of them can hide a
    CRITICAL finding: ``check`` says UNKNOWN rather than OK or WARNING while one is
    listed (docs/admin-guide.md, "Monitoring as a user other than root")."""

    what: str
    path: str | None
    why: str
    hides: str

    def line(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"{self.what}{where} ({self.why}): {self.hides}"


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
    dmcaches: tuple[DmCacheDevice, ...] = ()  # dm-cache devices (cachemgr/backends/dmcache/)
    writecaches: tuple[DmWritecacheDevice, ...] = ()  # dm-writecache devices
    # devices carrying a bcache superblock that are not registered (live systems only)
    unregistered: tuple[UnregisteredBcache, ...] = ()
    # the libvirt domains above the caches; None: not looked at (``take(vms=True)`` does)
    vms: VmScan | None = None
    # the procedures that own cache objects now, running or interrupted (ops.cache.status
    # fills it; a bare scan leaves it empty)
    owners: tuple[Owner, ...] = ()
    # objects of cache kinds registered beyond the built-in ones (each kind's scan,
    # cachemgr/procedures/kinds: ops.cache.status fills it)
    others: tuple[Any, ...] = ()
    # recorded dm-cache devices that are not assembled (ops.cache.status fills it)
    unassembled: tuple[UnassembledDmCache, ...] = ()
    # (SSD, words) for each cache SSD the protect policy acted on and that still caches
    # (procedures/protect.py's state; ops.cache.status fills it)
    protected: tuple[tuple[str, str], ...] = ()
    # the last protect pass found protect off: ``protected`` is only what earlier passes did
    protect_off: bool = False
    # (SSD, words): a cache SSD whose error count rose by errors the kernel log could not
    # tell from probe commands; protect did nothing (procedures/protect.py ``unknown``)
    protect_unknown: tuple[tuple[str, str], ...] = ()
    # what this run could not read without root (empty when run as root: :class:`Unseen`)
    unseen: tuple[Unseen, ...] = ()
    # (cached device node, failed requests logged for a disk under its cache device): the
    # device-mapper kinds' cache SSD errors (ops.cache.status fills it; bcache counts its
    # own, BcacheCache.io_errors)
    cache_errors: tuple[tuple[str, LoggedErrors], ...] = ()
    # dm-cache record files that cannot be read or are not trusted, each as (its path, why)
    # (ops.cache.status fills it)
    bad_records: tuple[tuple[str, str], ...] = ()
    # bcache backing devices last seen dirty and gone now (ops.cache.status fills it)
    gone: tuple[GoneBacking, ...] = ()
    # (device, words) for each device whose last scrub found blocks the cache served unlike
    # its origin (procedures/scrub.py's records; ops.cache.status fills it)
    scrub_mismatches: tuple[tuple[str, str], ...] = ()

    @property
    def dm_devices(self) -> tuple[DmCacheDevice | DmWritecacheDevice, ...]:
        """Every dm-cache and dm-writecache device (LVM's included)."""
        return (*self.dmcaches, *self.writecaches)

    def cache_set(self, uuid: str) -> CacheSet | None:
        return next((c for c in self.cache_sets if c.uuid == uuid), None)


# ---------------------------------------------------------------------------------------
# dm-cache (Documentation/admin-guide/device-mapper/cache.rst, drivers/md/dm-cache-target.c).
# The parsers live in cachemgr/backends/dmcache/parse.py; these are the typed results.

DM_CACHE_MODES = (CacheMode.WRITEBACK, CacheMode.WRITETHROUGH, CacheMode.PASSTHROUGH)


@dataclass(frozen=True)
class DmCacheTable:
    """One ``cache`` target line of ``dmsetup table``: the constructor arguments.

    ``0 2097152 cache 98:32 98:16 253:0 64 1 writeback smq 0`` (7.2). The kernel prints the
    features and policy arguments as they were loaded; devices as ``major:minor``.
    """

    start: int
    length: int  # sectors
    metadata_dev: str  # "98:32"
    cache_dev: str
    origin_dev: str
    block_sectors: int
    features: tuple[str, ...]
    policy: str
    policy_args: tuple[str, ...]

    @property
    def mode(self) -> CacheMode:
        """writeback when no mode feature is given (the kernel's default)."""
        for f in self.features:
            if f in ("writeback", "writethrough", "passthrough"):
                return CacheMode(f)
        return CacheMode.WRITEBACK

    def with_mode(self, mode: CacheMode) -> DmCacheTable:
        modes = {m.value for m in DM_CACHE_MODES}
        rest = tuple(f for f in self.features if f not in modes)
        return DmCacheTable(self.start, self.length, self.metadata_dev, self.cache_dev,
                            self.origin_dev, self.block_sectors, (mode.value, *rest),
                            self.policy, self.policy_args)

    def with_policy(self, policy: str, args: tuple[str, ...]) -> DmCacheTable:
        return DmCacheTable(self.start, self.length, self.metadata_dev, self.cache_dev,
                            self.origin_dev, self.block_sectors, self.features, policy, args)

    def line(self) -> str:
        """The table line ``dmsetup load --table`` takes (and ``dmsetup table`` prints)."""
        return " ".join([
            str(self.start), str(self.length), "cache", self.metadata_dev, self.cache_dev,
            self.origin_dev, str(self.block_sectors), str(len(self.features)), *self.features,
            self.policy, str(len(self.policy_args)), *self.policy_args,
        ])


@dataclass(frozen=True)
class DmCacheStatus:
    """The status line of a healthy dm-cache target, every field by its position::

        <md block size> <used md>/<total md> <cache block size> <used>/<total>
        <read hits> <read misses> <write hits> <write misses> <demotions> <promotions>
        <dirty> <#features> <features>* <#core args> <core args>* <policy>
        <#policy args> <policy args>* <ro|rw> <needs_check|->

    (kernels before 4.2 print neither ``ro|rw`` nor ``needs_check|-``: both are None then.)
    Block counts are in cache blocks (``block_sectors`` sectors each), metadata in
    ``metadata_block_sectors``. ``dirty`` is its own field: never ``used``.
    """

    metadata_block_sectors: int
    metadata_used: int
    metadata_total: int
    block_sectors: int
    used: int
    total: int
    read_hits: int
    read_misses: int
    write_hits: int
    write_misses: int
    demotions: int
    promotions: int
    dirty: int
    features: tuple[str, ...]
    core_args: tuple[tuple[str, str], ...]
    policy: str
    policy_args: tuple[str, ...]
    metadata_mode: str | None  # "rw", "ro" (metadata read-only: errors); None: before 4.2
    needs_check: bool | None  # None: not reported (kernels before 4.2)

    @property
    def mode(self) -> CacheMode:
        for f in self.features:
            if f in ("writeback", "writethrough", "passthrough"):
                return CacheMode(f)
        return CacheMode.WRITEBACK

    @property
    def migration_threshold(self) -> int | None:
        for k, v in self.core_args:
            if k == "migration_threshold" and v.isdigit():
                return int(v)
        return None

    @property
    def dirty_bytes(self) -> int:
        return self.dirty * self.block_sectors * 512

    @property
    def hit_ratio(self) -> float | None:
        hits = self.read_hits + self.write_hits
        total = hits + self.read_misses + self.write_misses
        return hits / total if total else None


class DmNamed:
    """What a device-mapper device is called: its node and whether LVM owns it (shared by
    dm-cache and dm-writecache devices)."""

    name: str  # the dm name: /dev/mapper/<name>
    uuid: str | None  # dm UUID; "LVM-..." when LVM owns the device

    @property
    def node(self) -> str:
        return f"/dev/mapper/{self.name}"

    @property
    def lvm_owned(self) -> bool:
        return bool(self.uuid and self.uuid.startswith("LVM-"))


@dataclass(frozen=True)
class DmCacheDevice(DmNamed):
    """A device-mapper device whose (single) target is ``cache``.

    ``status`` is None when the kernel reports the cache as ``Fail`` (or ``Error``): then
    ``failure`` holds that word and nothing about dirty blocks is known. It is None too when
    the status line could not be read (a kernel's form cachemgr does not know): then
    ``raw_status`` holds the line as dmsetup printed it, the state is "unknown" and every
    change is refused (procedures/kinds/dm.py); the device is never dropped from a snapshot.
    """

    name: str  # the dm name: /dev/mapper/<name>
    kernel_name: str  # dm-1
    devno: str | None  # "253:1"
    uuid: str | None  # dm UUID; "LVM-..." when LVM owns the device
    table: DmCacheTable
    status: DmCacheStatus | None
    failure: str | None  # "Fail" / "Error" from the kernel, else None
    metadata: Identity | None
    cache: Identity | None
    origin: Identity | None
    open_count: int | None = None
    suspended: bool | None = None
    holders: tuple[str, ...] = ()
    lvm: LvmCachedLv | None = None  # LVM's view, when LVM owns the device and lvs answered
    raw_status: str | None = None  # the status line cachemgr could not read (else None)

    @property
    def mode(self) -> CacheMode:
        return self.status.mode if self.status else self.table.mode

    @property
    def unread(self) -> bool:
        """Its status line was not understood: its state and dirty data are unknown."""
        return self.status is None and self.failure is None

    @property
    def state(self) -> CacheState:
        if self.unread:
            return CacheState.UNKNOWN
        if self.status is None:
            return CacheState.FAILED
        return CacheState.DIRTY if self.status.dirty else CacheState.CLEAN

    @property
    def dirty_bytes(self) -> int | None:
        """None when unknown (failed cache): never 0 then."""
        return self.status.dirty_bytes if self.status else None

    @property
    def block_bytes(self) -> int:
        return self.table.block_sectors * 512


# ---------------------------------------------------------------------------------------
# LVM-owned caches (lvmcache(7)) and dm-writecache
# (Documentation/admin-guide/device-mapper/writecache.rst). Parsers:
# cachemgr/backends/lvm/report.py and cachemgr/backends/dmwritecache.py.


@dataclass(frozen=True)
class LvmCachedLv:
    """LVM's view of one cached LV, from ``lvs --reportformat json`` (docs/kernel-notes.md,
    "lvm2"): the names an admin types and what lvm2 keeps in its metadata.

    ``pool`` is the cache pool or cachevol as lvs names it while attached (``pool_cpool``,
    ``fast_cvol``); ``pool_name`` is the name it has again once split off (``pool``, ``fast``).
    """

    vg: str
    lv: str
    uuid: str
    segtype: str  # "cache" | "writecache"
    pool: str
    pool_kind: str  # "cachepool" | "cachevol"
    origin_pvs: tuple[str, ...]
    cache_pvs: tuple[str, ...]
    cache_mode: str | None  # lvm2's metadata: writeback/writethrough/passthrough; None: writecache
    policy: str | None
    settings: tuple[tuple[str, str], ...]
    chunk_bytes: int | None
    health: str  # lv_health_status: "" when healthy
    check_needed: bool

    @property
    def full_name(self) -> str:
        return f"{self.vg}/{self.lv}"

    @property
    def pool_name(self) -> str:
        for suffix in ("_cpool", "_cvol"):
            if self.pool.endswith(suffix):
                return self.pool[: -len(suffix)]
        return self.pool

    @property
    def kind(self) -> str:
        return "lvm-writecache" if self.segtype == "writecache" else "lvmcache"

    def setting(self, name: str) -> str | None:
        return next((v for k, v in self.settings if k == name), None)


@dataclass(frozen=True)
class DmWritecacheTable:
    """One ``writecache`` target line: ``0 614400 writecache s 253:2 253:1 4096 2
    high_watermark 60`` (``s``: SSD, ``p``: persistent memory; then origin, cache, block
    size, and the optional arguments counted)."""

    start: int
    length: int
    pmem: bool
    origin_dev: str
    cache_dev: str
    block_bytes: int
    args: tuple[str, ...]

    def line(self) -> str:
        """The table line again, as dmsetup prints it."""
        return " ".join([str(self.start), str(self.length), "writecache",
                         "p" if self.pmem else "s", self.origin_dev, self.cache_dev,
                         str(self.block_bytes), str(len(self.args)), *self.args])

    def settings(self) -> dict[str, str]:
        """The optional arguments by name; a flag (``cleaner``) maps to ``"1"``."""
        out: dict[str, str] = {}
        valued = {"start_sector", "high_watermark", "low_watermark", "writeback_jobs",
                  "autocommit_blocks", "autocommit_time", "max_age", "pause_writeback"}
        i = 0
        while i < len(self.args):
            k = self.args[i]
            if k in valued and i + 1 < len(self.args):
                out[k] = self.args[i + 1]
                i += 2
            else:
                out[k] = "1"
                i += 1
        return out


@dataclass(frozen=True)
class DmWritecacheStatus:
    """``<error> <blocks> <free blocks> <blocks under writeback>`` and, on newer kernels,
    counters: reads, read hits, writes, write hits (uncommitted), write hits (committed),
    writes around, writes allocated, writes blocked on the freelist, flushes, discards.
    A block is dirty from the write until written back; then it is freed, so
    ``blocks - free`` are the dirty ones (docs/kernel-notes.md, "dm-writecache")."""

    error: int
    total: int
    free: int
    writeback: int
    counters: tuple[int, ...] = ()

    @property
    def dirty(self) -> int:
        return max(0, self.total - self.free)

    def counter(self, i: int) -> int | None:
        return self.counters[i] if i < len(self.counters) else None


@dataclass(frozen=True)
class DmWritecacheDevice(DmNamed):
    """A device-mapper device whose one target is ``writecache`` (dmsetup's or LVM's)."""

    name: str
    kernel_name: str
    devno: str | None
    uuid: str | None
    table: DmWritecacheTable
    status: DmWritecacheStatus | None
    failure: str | None
    cache: Identity | None
    origin: Identity | None
    open_count: int | None = None
    suspended: bool | None = None
    holders: tuple[str, ...] = ()
    lvm: LvmCachedLv | None = None

    @property
    def mode(self) -> CacheMode:
        return CacheMode.WRITEBACK  # dm-writecache has no other mode

    @property
    def state(self) -> CacheState:
        if self.status is None or self.status.error:
            return CacheState.FAILED
        return CacheState.DIRTY if self.status.dirty else CacheState.CLEAN

    @property
    def dirty_bytes(self) -> int | None:
        if self.status is None or self.status.error:
            return None
        return self.status.dirty * self.table.block_bytes

    @property
    def block_bytes(self) -> int:
        return self.table.block_bytes


@dataclass(frozen=True)
class DrainProgress:
    """One progress report of a wait for clean: a bcache ``drain`` or ``detach``, a dm-cache
    ``flush`` (``action``). Every face shows all three from these fields."""

    action: str  # "drain", "flush", "detach"
    device: str
    dirty_bytes: int | None  # None: unknown (never 0 then)
    start_bytes: int | None
    rate_bps: float | None  # bytes per second: bcache smoothed, dm-cache mean since start
    eta_s: float | None
    elapsed_s: float
    state: CacheState
    dirty_blocks: int | None = None  # dm-cache's #dirty
    # why it is where it is, in words, when the numbers alone mislead: a wait the kernel
    # imposes (bcache's writeback_delay), writes arriving as fast as it drains
    note: str | None = None

    @property
    def clean(self) -> bool:
        return self.state in (CacheState.CLEAN, CacheState.NO_CACHE)

    @property
    def fraction(self) -> float | None:
        """Done, 0..1; never 1 while the device is not clean (its dirty data rounds to 0 B
        while a writer keeps dirtying it)."""
        if not self.start_bytes or self.dirty_bytes is None:
            return None
        f = max(0.0, min(1.0, 1 - self.dirty_bytes / self.start_bytes))
        return f if self.clean else min(f, 0.999)


# ---------------------------------------------------------------------------------------
# The VMs above the caches (libvirt domains: cachemgr/backends/vms.py). What a hypervisor
# admin thinks in: a VM, its disks, the host devices under each disk down to the cache, and
# the IO pressure the kernel measures for the VM's cgroup.

# libvirt's disk <driver cache=...> values; "default" when the attribute is absent (qemu then
# uses writeback). docs/admin-guide.md, "VM disk cache modes", says what each means.
VM_CACHE_MODES = defaults.VM_CACHE_MODES


@dataclass(frozen=True)
class Pressure:
    """One PSI file (``io.pressure`` of a cgroup, /proc/pressure/io): the share of wall time
    in which some (``some``) or all (``full``) runnable tasks waited on IO, in percent
    averaged over 10 s and 60 s, and the total stall time in microseconds."""

    some_avg10: float
    some_avg60: float
    some_total_us: int
    full_avg10: float | None
    full_avg60: float | None
    full_total_us: int | None


@dataclass(frozen=True)
class IoCounters:
    """A cgroup's ``io.stat`` summed over its devices: bytes and IOs read and written since
    the cgroup was made (rates come from two readings)."""

    rbytes: int
    wbytes: int
    rios: int
    wios: int


@dataclass(frozen=True)
class VmDisk:
    """One disk of a domain and the host devices under it."""

    target: str  # the guest's name for it: vda, sda
    bus: str | None  # virtio, scsi, sata, ide...
    source_type: str  # block, file, volume, network...
    source: str | None  # the block device or file path, pool/volume, or the network name
    cache: str  # VM_CACHE_MODES
    io: str | None  # native, threads, io_uring, or None (default)
    read_only: bool
    # the host's block devices from the one holding the source down to the first cache (or
    # the bare disk), by kernel name: ("dm-4", "bcache0") for an LV on a bcache PV
    stack: tuple[str, ...]
    # the cached devices the disk sits on (status targets: /dev/bcache0, /dev/mapper/NAME)
    caches: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    unresolved: str | None = None  # why the stack could not be followed


@dataclass(frozen=True)
class VmCacheIo:
    """What one VM read through one cached device, from its cgroup's ``io.stat``: the bytes
    charged to it on the cached device (bcacheN, the dm device) and on the slow disk under
    it (bcache's backing device, dm-cache's origin). The kernel charges a cache's reads of
    the slow disk to the VM that asked (the miss is a clone of its bio); its own background
    IO (writeback, promotion) to the root cgroup, no VM's (docs/kernel-notes.md, "What a
    cache charges to a VM's cgroup"). Counted since the VM's scope was made."""

    cache: str  # the cached device's node: /dev/bcache0, /dev/mapper/NAME
    read_bytes: int | None  # the VM's reads of the cached device
    slow_read_bytes: int | None  # of them, what the slow disk served (the misses)
    why: str | None = None  # why the figures are unknown (None: known)

    @property
    def read_hit_ratio(self) -> float | None:
        """1 - slow / read: the share of the VM's read bytes the cache served; None while
        unknown or before it read anything."""
        if self.why is not None or not self.read_bytes or self.slow_read_bytes is None:
            return None
        return max(0.0, 1.0 - self.slow_read_bytes / self.read_bytes)


@dataclass(frozen=True)
class NoisyNeighbour:
    """One VM's misses make most of the slow disk's reads under a cache that other VMs
    share, while another VM on it misses too (or, over a window, its hit ratio fell)."""

    cache: str  # the cached device's node
    vm: str  # the noisy VM
    share: float  # its part of the slow disk's reads charged to the VMs on that cache
    slow_read_bytes: int  # what it made the slow disk serve
    victims: tuple[tuple[str, float | None], ...]  # (VM, its read hit ratio) that miss too

    @property
    def text(self) -> str:
        others = ", ".join(f"{n} ({'?' if h is None else f'{h:.2f}'})" for n, h in self.victims)
        return (f"noisy neighbour on {self.cache}: {self.vm} made {100 * self.share:.0f}% of "
                f"the slow disk's reads ({human(self.slow_read_bytes)}) while {others} "
                f"missed too; to cap its reads: virsh blkdeviotune {shlex.quote(self.vm)} "
                "DISK --read-bytes-sec BYTES")


@dataclass(frozen=True)
class Vm:
    """A libvirt domain, running or only defined."""

    name: str
    uuid: str
    state: str  # virsh domstate: running, shut off, paused...
    domain_id: int | None  # set while it runs
    disks: tuple[VmDisk, ...]
    cgroup: str | None  # its scope under machine.slice (a path below the cgroup root)
    pressure: Pressure | None  # the scope's io.pressure (None: no scope, or no PSI)
    io: IoCounters | None
    cache_io: tuple[VmCacheIo, ...] = ()  # per cached device under its disks

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{d.target}: {w}" for d in self.disks for w in d.warnings)


@dataclass(frozen=True)
class VmScan:
    """Every domain of one libvirt connection, and the host's own IO pressure."""

    uri: str
    vms: tuple[Vm, ...]
    host_pressure: Pressure | None
    iowait_ticks: int | None  # /proc/stat's cpu iowait (USER_HZ ticks since boot)
    warnings: tuple[str, ...] = ()
    noisy: tuple[NoisyNeighbour, ...] = ()
