"""The auto-attach policy: ``/etc/cachemgr/cachemgr.toml``.

Which backing devices go with which cache, the mode and tunables each backing device gets,
and whether a blank SSD that appears in a slot the policy names may be formatted. Devices are
named by ids that survive reboots and hotplug (docs/kernel-notes.md, "Naming"), never by
kernel names::

    version = 1

    [defaults]                          # optional: for every backing that does not say
    mode = "writethrough"

    [cache.ssd0]
    device = "wwn-0x33333330000007d0"   # the SSD (or: cset = "<cache set UUID>", or both)
    format_blank_ssd = false            # the default: never format anything
    bucket_size = "64k"                 # only used when formatting a blank SSD

    [backing.vm-a]
    device = "serial:2001"              # WWN, serial:..., /dev/disk/by-id/..., uuid:...
    cache = "ssd0"
    mode = "writeback"
    writeback_percent = 10
    sequential_cutoff = "4M"

    [lvm.vm-b]                          # an LVM cache (lvm2 does the work)
    lv = "vg0/vm-b"                     # the LV that is cached
    cache = "vg0/vm-b-pool"             # its cache pool or cachevol
    type = "cache"                      # or "writecache"
    mode = "writeback"                  # cache only: writethrough, writeback, passthrough
    erase_cachevol = false              # the default: a plain LV (cachevol) is not attached

    [scheduler.hdd-a]                   # a disk's IO scheduler, set when it appears
    device = "serial:2001"              # any device id; a partition stands for its disk
    scheduler = "bfq"                   # mq-deadline (or deadline), bfq, kyber, none

An ``[lvm.NAME]`` entry attaches the cache pool or cachevol to its LV with lvm2 when both are
there, uncached and whole (every PV present): after ``cachemgr detach`` split it off, it is
attached again when its SSD's PV returns. LVM names (VG/LV) are stable; lvm2 finds the PVs.
lvm2 erases a plain LV that it attaches as a cachevol (a writecache's cache always is one), so
that needs ``erase_cachevol = true``, as formatting a blank SSD needs ``format_blank_ssd``.
A ``[scheduler.NAME]`` entry sets a disk's IO scheduler (the udev worker when the disk
appears, the boot pass): the disk must be request-based (a bcache or device-mapper device has
none: name the disks under it), and the name one of :data:`SCHEDULERS`.

Device ids (:class:`DeviceId`): a WWN in any usual form (``naa.5000…``, ``0x5000…``,
``wwn-0x5000…``, ``eui.…``, ``t10.…``); ``serial:XYZ``; a ``/dev/disk/by-id/…`` link; a
``/dev/disk/by-path/…`` link (a slot: whatever disk sits there); ``uuid:<bcache UUID>`` or
``/dev/bcache/by-uuid/<UUID>`` (a backing device's ``dev.uuid``, which its ``/dev/bcacheN``
keeps across boots). Kernel names (``/dev/sdb``) are refused: they change across boots.

:func:`load` / :func:`parse` raise :class:`PolicyError` listing every problem with its line:
TOML syntax errors carry tomllib's line and column; a semantic error points at the line of
the offending key (found by :func:`key_lines`, since tomllib keeps no positions). A malformed
policy is all-or-nothing: nothing acts on part of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tomllib
import uuid as uuid_mod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cachemgr.backends import scheduler as sched
from cachemgr.backends.bcache import BACKING_TUNABLES, BCACHE_MODES
from cachemgr.backends.identity import looks_like_wwn, normalize_wwn
from cachemgr.backends.lvm.command import check_vg_lv, spelling
from cachemgr.backends.lvm.manage import LVM_CACHE_MODES
from cachemgr.core import checks, state
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode
from cachemgr.core.model import parse_size as _parse_size
from cachemgr.core.text import printable

DEFAULT_PATH = "/etc/cachemgr/cachemgr.toml"
ENV_PATH = "CACHEMGR_POLICY"
VERSION = 1

IdKind = Literal["wwn", "serial", "by-id", "by-path", "uuid"]
BY_ID = "/dev/disk/by-id/"
BY_PATH = "/dev/disk/by-path/"
BCACHE_BY_UUID = "/dev/bcache/by-uuid/"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # TOML bare keys: no quoting needed


def default_path() -> str:
    return os.environ.get(ENV_PATH) or DEFAULT_PATH


# ---------------------------------------------------------------------------------------
# errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy, at ``line`` (1-based; 0 when the file is unreadable)."""

    line: int
    message: str
    column: int | None = None

    def render(self, path: str) -> str:
        col = f":{self.column}" if self.column else ""
        return f"{path}:{self.line}{col}: {self.message}"


class PolicyError(UsageError):
    """A malformed policy (exit 2). ``problems`` are sorted by line; nothing acts on it. The
    message is a line, then one line per problem (each with its control characters, a
    newline in the path included, shown as escapes)."""

    multiline = True

    def __init__(self, path: str, problems: list[Problem]) -> None:
        self.path = path
        self.problems = tuple(sorted(problems, key=lambda p: (p.line, p.column or 0)))
        lines = [printable(p.render(path)) for p in self.problems]
        super().__init__(
            f"policy {printable(path)} is invalid ({len(lines)} "
            f"problem{'s' * (len(lines) != 1)}); nothing is acted on until it is fixed:\n  "
            + "\n  ".join(lines),
            hint=f"fix it, then check it with: cachemgr policy check --policy {printable(path)}",
        )

    @property
    def line(self) -> int:
        return self.problems[0].line if self.problems else 0

    @property
    def missing(self) -> bool:
        """The file is not there (no policy: the callers' defaults), not a bad one."""
        return bool(self.problems) and self.problems[0].line == 0 and \
            self.problems[0].message == "no such file"


class UnsafePolicyError(PolicyError):
    """Run as root, a policy file that another user could change (exit 2): the file, or a
    directory above it, owned by another user or writable by group or others, or a link to
    it owned by another user (sshd's StrictModes). One line: the path, why, the fix."""

    multiline = False

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path = path
        self.problems = (Problem(0, problem),)
        UsageError.__init__(
            self, f"policy {printable(path)}: {problem}; cachemgr run as root reads no "
                  f"policy that another user could change (it says what root does to "
                  f"disks); fix: {fix}")


# ---------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True)
class DeviceId:
    """A stable name of a block device, as the policy gives it."""

    kind: IdKind
    value: str  # normalized: WWNs in the kernel's form, links as full paths, UUIDs lowered

    @classmethod
    def parse(cls, text: str) -> DeviceId:
        """Raises ValueError (with a message for the admin) for what is not a stable id."""
        ch = checks.bad_char(text)
        if ch is not None:
            # a newline, an escape or a bidi override hides or fakes what the id says
            raise ValueError(f"{text!r} contains the character {ch}")
        t = text.strip()
        if not t:
            raise ValueError("empty device id")
        low = t.lower()
        if low.startswith("serial:"):
            s = t[len("serial:"):].strip()
            if not s:
                raise ValueError("empty serial in 'serial:'")
            return cls("serial", s)
        if low.startswith("uuid:"):
            return cls("uuid", _uuid(t[len("uuid:"):]))
        if t.startswith(BCACHE_BY_UUID):
            return cls("uuid", _uuid(t[len(BCACHE_BY_UUID):]))
        if t.startswith(BY_ID) and len(t) > len(BY_ID) and "/" not in t[len(BY_ID):]:
            return cls("by-id", t)
        if t.startswith(BY_PATH) and len(t) > len(BY_PATH) and "/" not in t[len(BY_PATH):]:
            return cls("by-path", t)
        if looks_like_wwn(t) and not t.startswith("/"):
            return cls("wwn", normalize_wwn(t) or t)
        raise ValueError(
            f"{t!r} is not a stable device id (kernel names like /dev/sdb change across "
            "boots); use a WWN (naa.…, wwn-0x…), serial:XYZ, /dev/disk/by-id/…, "
            "/dev/disk/by-path/… or uuid:<bcache UUID>")

    def __str__(self) -> str:
        if self.kind == "serial":
            return f"serial:{self.value}"
        if self.kind == "uuid":
            return f"uuid:{self.value}"
        return self.value


def _uuid(text: str) -> str:
    try:
        return str(uuid_mod.UUID(text.strip()))
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a UUID") from None


@dataclass(frozen=True)
class CachePolicy:
    """A cache: its SSD (``device``), its cache set (``cset``), or both."""

    name: str
    device: DeviceId | None = None
    cset: str | None = None
    format_blank_ssd: bool = False
    bucket_size: str | None = None  # make-bcache --bucket, when formatting
    line: int = field(default=0, compare=False)

    @property
    def label(self) -> str:
        return f"cache {self.name} ({self.device or self.cset})"


@dataclass(frozen=True)
class BackingPolicy:
    """A backing device, the cache it goes with, its mode and tunables."""

    name: str
    device: DeviceId
    cache: str
    mode: CacheMode | None = None
    tunables: tuple[tuple[str, int], ...] = ()  # sorted by name; values as the kernel takes
    line: int = field(default=0, compare=False)

    @property
    def label(self) -> str:
        return f"backing {self.name} ({self.device})"


@dataclass(frozen=True)
class LvmPolicy:
    """An LVM cache: the LV (``VG/LV``), its cache pool or cachevol, writecache or not, and
    the mode (lvmcache only)."""

    name: str
    lv: str
    cache: str
    writecache: bool = False
    mode: CacheMode | None = None
    erase_cachevol: bool = False  # a plain LV is erased when attached as a cachevol
    line: int = field(default=0, compare=False)

    @property
    def label(self) -> str:
        return f"lvm {self.name} ({self.lv})"


@dataclass(frozen=True)
class SchedulerPolicy:
    """A disk's IO scheduler (the kernel's name: ``deadline`` is read as ``mq-deadline``)."""

    name: str
    device: DeviceId
    scheduler: str
    line: int = field(default=0, compare=False)

    @property
    def label(self) -> str:
        return f"scheduler {self.name} ({self.device})"


@dataclass(frozen=True)
class ProtectPolicy:
    """The ``[protect]`` table (procedures/protect.py): off by default. When on, a cache
    SSD whose IO errors rose by ``io_errors`` since the last pass, whose SMART verdict failed
    or has an NVMe critical warning (``smart_critical``), or whose wear reached
    ``wear_percent`` has every device on it switched to writethrough and drained."""

    enabled: bool = False
    io_errors: int = 1
    smart_critical: bool = True
    wear_percent: int | None = 90  # None (wear_percent = 0): wear never triggers
    line: int = field(default=0, compare=False)


SCRUB_MAX_LATENCY_MS = 20.0  # the weekly scrub's pace unless the policy says


@dataclass(frozen=True)
class ScrubPolicy:
    """The ``[scrub]`` table: what ``cachemgr scrub --all`` (cachemgr-scrub.timer's weekly
    pass, which is off until the timer is enabled) compares. ``enabled`` false: nothing (the
    timer may be enabled on every host of a fleet); ``devices``: the targets to scrub, as an
    admin types them (none: every write-through or clean cache on the host);
    ``max_latency_ms``: the pace (``--max-latency``), None (``max_latency_ms = 0``): unpaced."""

    enabled: bool = True
    devices: tuple[str, ...] = ()
    max_latency_ms: float | None = SCRUB_MAX_LATENCY_MS
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class WritebackPolicy:
    """The ``[writeback]`` table: the writeback governor's bounds (``cachemgr governor``,
    cachemgr-governor.service; procedures/governor.py), off by default. ``read_p99_ms``: the
    VMs' read p99 on a cached device, in ms; ``max_dirty``: its dirty data, bytes;
    ``max_age_s``: the age of its oldest dirty data, seconds. None: not bounded."""

    enabled: bool = False
    read_p99_ms: float | None = None
    max_dirty: int | None = None
    max_age_s: float | None = None
    line: int = field(default=0, compare=False)


MIGRATION_ACTIONS = ("refuse", "writethrough")
# where the warm after an arrival looks for traces (``[migration] warm_traces``)
WARM_TRACES = "/var/lib/cachemgr/traces"


@dataclass(frozen=True)
class MigrationPolicy:
    """The ``[migration]`` table: what cachemgr's libvirt hook (cachemgr/ops/migrate.py)
    does when a VM is about to arrive (``migrate begin``) or, with ``guard_start``, to start
    (``prepare begin``) while one of its disks sits on a host-local cache over shared
    storage that is in writeback or holds dirty data. ``on_hazard``: ``refuse`` (the
    default) refuses with the command that makes it safe; ``writethrough`` runs that command
    itself (``cachemgr mode DEV writethrough --drain``, through the gate), for at most
    ``drain_timeout`` seconds, and refuses when the cache is still not clean then.
    ``warm_after``: once an arrival has dropped a cache's copies, a process the hook leaves
    running warms it again (``cachemgr warm``) from the newest trace in ``warm_traces`` (a
    directory of ``cachemgr trace`` files) that maps onto the device, when the VM runs here
    (ops/migrate.py ``warm_after``)."""

    on_hazard: str = "refuse"
    guard_start: bool = False
    drain_timeout: int = 60
    warm_after: bool = False
    warm_traces: str = WARM_TRACES
    line: int = field(default=0, compare=False)


# the schedulers a policy may name: mainline's (an out-of-tree one fails at run time, not
# in `policy check`: a typo must not wait for a disk to appear to be found)
SCHEDULERS = sched.KNOWN


@dataclass(frozen=True)
class Policy:
    caches: tuple[CachePolicy, ...] = ()
    backings: tuple[BackingPolicy, ...] = ()
    path: str = field(default=DEFAULT_PATH, compare=False)
    lvms: tuple[LvmPolicy, ...] = ()
    schedulers: tuple[SchedulerPolicy, ...] = ()
    protect: ProtectPolicy = ProtectPolicy()
    migration: MigrationPolicy = MigrationPolicy()
    scrub: ScrubPolicy = ScrubPolicy()
    writeback: WritebackPolicy = WritebackPolicy()

    def cache(self, name: str) -> CachePolicy | None:
        return next((c for c in self.caches if c.name == name), None)


# ---------------------------------------------------------------------------------------
# where a key is (tomllib keeps no positions)

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _parse_key(s: str, i: int) -> tuple[list[str], int] | None:
    """A dotted key starting at ``s[i]``: (parts, index after it), or None."""
    parts: list[str] = []
    n = len(s)
    while True:
        while i < n and s[i] in " \t":
            i += 1
        if i < n and s[i] in "\"'":
            q = s[i]
            j = i + 1
            buf = []
            while j < n and s[j] != q:
                if q == '"' and s[j] == "\\" and j + 1 < n:
                    buf.append(s[j + 1])
                    j += 2
                    continue
                buf.append(s[j])
                j += 1
            if j >= n:
                return None
            parts.append("".join(buf))
            i = j + 1
        else:
            m = _BARE.match(s, i)
            if not m:
                return None
            parts.append(m.group(0))
            i = m.end()
        while i < n and s[i] in " \t":
            i += 1
        if i < n and s[i] == ".":
            i += 1
            continue
        return parts, i


def _bracket_delta(s: str) -> tuple[int, str | None]:
    """Net [ ] / { } nesting of a value's text outside strings; and an unclosed multi-line
    string opener (\"\"\" or ''') if one is left open."""
    depth = 0
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith('"""', i) or s.startswith("'''", i):
            q = s[i:i + 3]
            end = s.find(q, i + 3)
            if end < 0:
                return depth, q
            i = end + 3
            continue
        if c in "\"'":
            j = i + 1
            while j < n and s[j] != c:
                j += 2 if (c == '"' and s[j] == "\\") else 1
            i = j + 1
            continue
        if c == "#":
            break
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        i += 1
    return depth, None


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Every table header and key of a (valid) TOML text -> the line it is on (1-based).

    Best effort for locating semantic errors: ``[backing.vm-a]`` gives ``("backing",
    "vm-a")``, a ``mode = …`` under it ``("backing", "vm-a", "mode")``; keys inside inline
    tables and arrays of tables are found at the line of their parent key.
    """
    out: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    depth = 0
    open_string: str | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        if open_string is not None:
            if open_string in raw:
                rest = raw[raw.index(open_string) + 3:]
                open_string = None
                d, open_string = _bracket_delta(rest)
                depth += d
            continue
        if depth > 0:
            d, open_string = _bracket_delta(raw)
            depth = max(0, depth + d)
            continue
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("["):
            arr = s.startswith("[[")
            got = _parse_key(s, 2 if arr else 1)
            if got:
                table = tuple(got[0])
                out.setdefault(table, no)
            continue
        got = _parse_key(s, 0)
        if not got:
            continue
        parts, i = got
        rest = s[i:].lstrip()
        if not rest.startswith("="):
            continue
        path = (*table, *parts)
        out.setdefault(path, no)
        d, open_string = _bracket_delta(rest[1:])
        depth = max(0, d)
    return out


def _line_of(lines: Mapping[tuple[str, ...], int], path: tuple[str, ...]) -> int:
    """The line of ``path``, else of its nearest ancestor that is in the text, else 1."""
    for k in range(len(path), 0, -1):
        if path[:k] in lines:
            return lines[path[:k]]
    return 1


# ---------------------------------------------------------------------------------------
# nesting (tomllib recurses once per level: RecursionError past ~1000)

MAX_DEPTH = 32  # a policy nests 2 or 3 levels; anything deeper is not a policy


def too_deep(text: str, limit: int = MAX_DEPTH) -> Problem | None:
    """The first place where arrays and inline tables nest deeper than ``limit``, as a
    Problem at its line and column; None when they do not. Strings and comments are
    skipped (brackets in them do not nest)."""
    depth, line, col0 = 0, 1, 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line, col0 = line + 1, i + 1
        elif text.startswith(('"""', "'''"), i):
            end = text.find(text[i:i + 3], i + 3)
            end = n if end < 0 else end + 3
            line += text.count("\n", i, end)
            if "\n" in text[i:end]:
                col0 = text.rindex("\n", i, end) + 1
            i = end
            continue
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if (c == '"' and text[j] == "\\") else 1
            i = j + 1 if j < n and text[j] == c else j
            continue
        elif c == "#":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        elif c in "[{":
            depth += 1
            if depth > limit:
                return Problem(line, f"arrays or tables nested more than {limit} deep",
                               i - col0 + 1)
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


def _toml(v: object) -> str:
    """A value as TOML writes it (``true``, ``1.0``, ``"1"``) for messages."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _q(v)
    return repr(v)


# ---------------------------------------------------------------------------------------
# parsing

_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")
_COMMON_KEYS = {"mode", *BACKING_TUNABLES}
_CACHE_KEYS = {"device", "cset", "format_blank_ssd", "bucket_size"}
_BACKING_KEYS = {"device", "cache", *_COMMON_KEYS}
_LVM_KEYS = {"lv", "cache", "type", "mode", "erase_cachevol"}
_SCHED_KEYS = {"device", "scheduler"}
_PROTECT_KEYS = {"enabled", "io_errors", "smart_critical", "wear_percent"}
_MIGRATION_KEYS = {"on_hazard", "guard_start", "drain_timeout", "warm_after", "warm_traces"}
_SCRUB_KEYS = {"enabled", "devices", "max_latency_ms"}
_WRITEBACK_KEYS = {"enabled", "read_p99_ms", "max_dirty", "max_age_s"}
_TOP_KEYS = {"version", "defaults", "cache", "backing", "lvm", "scheduler", "protect",
             "migration", "scrub", "writeback"}


def parse_size(value: object) -> int:
    """A byte count: a TOML integer, or a string in :func:`cachemgr.core.model.parse_size`'s
    grammar (``4M``, ``512k``, ``1GiB``)."""
    if isinstance(value, bool):
        raise ValueError("a size, not true/false")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, str):
        with contextlib.suppress(UsageError):
            return _parse_size(value)
    raise ValueError(f"{value!r} is not a size (bytes, or a number with k/M/G: '4M')")


def _tunable(name: str, value: object) -> int:
    if name == "sequential_cutoff":
        v = parse_size(value)
    elif name == "writeback_running":
        if isinstance(value, bool):
            v = int(value)
        elif isinstance(value, int) and value in (0, 1):
            v = value
        else:
            raise ValueError("must be true or false")
    else:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, not {value!r}")
        v = value
    lo, hi = BACKING_TUNABLES[name]
    if not lo <= v <= hi:
        raise ValueError(f"must be between {lo} and {hi}, not {v}")
    return v


def _mode(value: object) -> CacheMode:
    names = ", ".join(m.value for m in BCACHE_MODES)
    if not isinstance(value, str):
        raise ValueError(f"must be one of {names}")
    try:
        mode = CacheMode(value.strip().lower())
    except ValueError:
        raise ValueError(f"unknown cache mode {value!r}; one of {names}") from None
    if mode not in BCACHE_MODES:
        raise ValueError(f"bcache has no mode {value!r}; one of {names}")
    return mode


class _Checker:
    def __init__(self, text: str) -> None:
        self.lines = key_lines(text)
        self.problems: list[Problem] = []

    def bad(self, path: tuple[str, ...], message: str) -> None:
        self.problems.append(Problem(_line_of(self.lines, path), message))

    def table(self, data: object, path: tuple[str, ...]) -> dict[str, Any] | None:
        if not isinstance(data, dict):
            self.bad(path, f"[{'.'.join(path)}] must be a table")
            return None
        return data

    def section(self, data: Mapping[str, object], name: str,
                allowed: set[str]) -> dict[str, Any] | None:
        """A top-level table (``[protect]``, ``[migration]``...): None when it is absent or
        not a table (said), else its body, its unknown keys said."""
        if name not in data:
            return None
        body = self.table(data[name], (name,))
        if body is not None:
            self.unknown(body, allowed, (name,))
        return body

    def flags(self, body: Mapping[str, object], path: tuple[str, ...],
              keys: Iterable[str], out: dict[str, Any]) -> None:
        """Each of ``keys`` present in ``body`` into ``out``, if it is true or false."""
        for key in keys:
            if key in body:
                if isinstance(body[key], bool):
                    out[key] = body[key]
                else:
                    self.bad((*path, key), f"{key} must be true or false")

    def unknown(self, data: Mapping[str, object], allowed: set[str],
                path: tuple[str, ...]) -> None:
        for k in data:
            if k not in allowed:
                self.bad((*path, k), f"unknown key {k!r} in [{'.'.join(path) or 'top'}]; "
                                     f"known: {', '.join(sorted(allowed))}")

    def entries(self, data: Mapping[str, object], kind: str) -> Iterator[tuple[str, dict[str,
                                                                               Any]]]:
        section = data.get(kind, {})
        sec = self.table(section, (kind,))
        if sec is None:
            return
        for name, body in sec.items():
            if not _NAME.match(name):
                self.bad((kind, name),
                         f"{kind} name {name!r}: use up to 64 letters, digits, _ and -")
            t = self.table(body, (kind, name))
            if t is not None:
                yield name, t

    def common(self, body: Mapping[str, object], path: tuple[str, ...]
               ) -> tuple[CacheMode | None, dict[str, int]]:
        mode = None
        if "mode" in body:
            try:
                mode = _mode(body["mode"])
            except ValueError as exc:
                self.bad((*path, "mode"), f"mode: {exc}")
        tun: dict[str, int] = {}
        for name in BACKING_TUNABLES:
            if name in body:
                try:
                    tun[name] = _tunable(name, body[name])
                except ValueError as exc:
                    self.bad((*path, name), f"{name}: {exc}")
        return mode, tun

    def device(self, body: Mapping[str, object], path: tuple[str, ...]) -> DeviceId | None:
        v = body.get("device")
        if not isinstance(v, str):
            self.bad((*path, "device"), "device must be a string (a WWN, serial:…, "
                                         "/dev/disk/by-id/…, uuid:…)")
            return None
        try:
            return DeviceId.parse(v)
        except ValueError as exc:
            self.bad((*path, "device"), f"device: {exc}")
            return None


def parse(text: str, path: str = DEFAULT_PATH) -> Policy:
    """Parse and validate a policy; PolicyError lists every problem with its line."""
    deep = too_deep(text)
    if deep is not None:
        raise PolicyError(path, [deep])
    try:
        data = tomllib.loads(text)
    except RecursionError:  # too_deep's limit is far below Python's; kept as a last guard
        raise PolicyError(path, [Problem(1, "arrays or tables nested too deeply")]) from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_POS.search(msg)
        if m:
            line, col = int(m.group(1)), int(m.group(2))
        else:  # "(at end of document)"
            line, col = max(1, len(text.splitlines())), 0
        reason = _TOML_POS.sub("", msg).replace("(at end of document)", "").strip()
        raise PolicyError(path, [Problem(line, f"TOML syntax: {reason}", col or None)]
                          ) from None
    ck = _Checker(text)
    ck.unknown(data, _TOP_KEYS, ())
    if "version" in data and (type(data["version"]) is not int or data["version"] != VERSION):
        # true == 1 and 1.0 == 1 in Python; the version is the integer itself
        ck.bad(("version",), f"version {_toml(data['version'])} is not supported (this "
                             f"cachemgr reads version = {VERSION}, an integer)")
    d_mode: CacheMode | None = None
    d_tun: dict[str, int] = {}
    if "defaults" in data:
        d = ck.table(data["defaults"], ("defaults",))
        if d is not None:
            ck.unknown(d, _COMMON_KEYS, ("defaults",))
            d_mode, d_tun = ck.common(d, ("defaults",))

    caches: list[CachePolicy] = []
    seen_ids: dict[DeviceId, str] = {}
    for name, body in ck.entries(data, "cache"):
        p = ("cache", name)
        ck.unknown(body, _CACHE_KEYS, p)
        dev = ck.device(body, p) if "device" in body else None
        cset = None
        if "cset" in body:
            try:
                if not isinstance(body["cset"], str):
                    raise ValueError("must be a string")
                cset = _uuid(body["cset"])
            except ValueError as exc:
                ck.bad((*p, "cset"), f"cset: {exc}")
        if "device" not in body and "cset" not in body:
            ck.bad(p, f"cache {name!r} needs device = <the SSD's id> or cset = <UUID>")
        fmt = body.get("format_blank_ssd", False)
        if not isinstance(fmt, bool):
            ck.bad((*p, "format_blank_ssd"), "format_blank_ssd must be true or false")
            fmt = False
        if fmt and "device" not in body:
            ck.bad((*p, "format_blank_ssd"), "format_blank_ssd needs device = <the slot or "
                                             "SSD id> to know which disk may be formatted")
        if fmt and dev is not None and dev.kind == "uuid":
            ck.bad((*p, "device"), "a blank SSD has no UUID: name the slot "
                                   "(/dev/disk/by-path/…) or the disk (WWN, serial)")
        bucket = None
        if "bucket_size" in body:
            try:
                n = parse_size(body["bucket_size"])
                if n < 4096 or n & (n - 1):
                    raise ValueError("must be a power of two of at least 4k")
                bucket = f"{n // 1024}k"
            except ValueError as exc:
                ck.bad((*p, "bucket_size"), f"bucket_size: {exc}")
        if dev is not None:
            if dev in seen_ids:
                ck.bad((*p, "device"), f"{dev} is already named by {seen_ids[dev]}")
            seen_ids[dev] = f"cache {name}"
        caches.append(CachePolicy(name, dev, cset, fmt, bucket, ck.lines.get(p, 0)))
    csets = [c.cset for c in caches if c.cset]
    for c in caches:
        if c.cset and csets.count(c.cset) > 1:
            ck.bad(("cache", c.name, "cset"), f"cset {c.cset} is named by more than one cache")
            csets = [x for x in csets if x != c.cset]

    backings: list[BackingPolicy] = []
    cache_names = {c.name for c in caches}
    for name, body in ck.entries(data, "backing"):
        p = ("backing", name)
        ck.unknown(body, _BACKING_KEYS, p)
        dev = ck.device(body, p)
        cache = body.get("cache")
        if not isinstance(cache, str):
            ck.bad((*p, "cache"), "cache = <name of a [cache.NAME] table> is required")
            cache = ""
        elif not _NAME.match(cache):
            ck.bad((*p, "cache"), f"cache {cache!r}: a cache name is up to 64 letters, digits, "
                                  "_ and -")
        elif cache not in cache_names:
            ck.bad((*p, "cache"), f"no [cache.{cache}] in this policy (caches: "
                                  f"{', '.join(sorted(cache_names)) or 'none'})")
        mode, tun = ck.common(body, p)
        if dev is not None:
            if dev in seen_ids:
                ck.bad((*p, "device"), f"{dev} is already named by {seen_ids[dev]}")
            seen_ids[dev] = f"backing {name}"
            merged = {**d_tun, **tun}
            backings.append(BackingPolicy(name, dev, cache, mode or d_mode,
                                          tuple(sorted(merged.items())), ck.lines.get(p, 0)))
    lvms = _lvms(ck, data)
    schedulers = _schedulers(ck, data)
    protect = _protect(ck, data)
    migration = _migration(ck, data)
    scrub = _scrub(ck, data)
    writeback = _writeback(ck, data)
    if ck.problems:
        raise PolicyError(path, ck.problems)
    return Policy(tuple(caches), tuple(backings), path, tuple(lvms), tuple(schedulers),
                  protect, migration, scrub, writeback)


def _writeback(ck: _Checker, data: Mapping[str, object]) -> WritebackPolicy:
    p = ("writeback",)
    body = ck.section(data, "writeback", _WRITEBACK_KEYS)
    if body is None:
        return WritebackPolicy()
    out: dict[str, Any] = {}
    ck.flags(body, p, ("enabled",), out)
    for key, top, unit in (("read_p99_ms", 60_000, "milliseconds"),
                           ("max_age_s", 7 * 86400, "seconds")):
        if key in body:
            v = body[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= top:
                ck.bad((*p, key), f"{key} must be a number of {unit} above 0 and at most "
                                  f"{top}, not {_toml(v)}")
            else:
                out[key] = float(v)
    if "max_dirty" in body:
        try:
            n = parse_size(body["max_dirty"])
        except ValueError as exc:
            ck.bad((*p, "max_dirty"), f"max_dirty: {exc}")
        else:
            if n < 1 << 20:
                ck.bad((*p, "max_dirty"), f"max_dirty must be at least 1M, not "
                                          f"{_toml(body['max_dirty'])}")
            else:
                out["max_dirty"] = n
    if out.get("enabled") and not ({"read_p99_ms", "max_dirty", "max_age_s"} & out.keys()):
        ck.bad(p, "an enabled [writeback] needs at least one of read_p99_ms, max_dirty, "
                  "max_age_s")
    return WritebackPolicy(**out, line=ck.lines.get(p, 0))


def _scrub(ck: _Checker, data: Mapping[str, object]) -> ScrubPolicy:
    p = ("scrub",)
    body = ck.section(data, "scrub", _SCRUB_KEYS)
    if body is None:
        return ScrubPolicy()
    out: dict[str, Any] = {}
    ck.flags(body, p, ("enabled",), out)
    if "devices" in body:
        v = body["devices"]
        if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() and
                                              "\0" not in x for x in v):
            ck.bad((*p, "devices"), f"devices must be a list of devices as cachemgr scrub "
                                    f"takes them (\"/dev/bcache0\", \"vg/lv\"), not {_toml(v)}")
        else:
            out["devices"] = tuple(dict.fromkeys(x.strip() for x in v))
    if "max_latency_ms" in body:
        v = body["max_latency_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 60_000 \
                or v != v:
            ck.bad((*p, "max_latency_ms"), f"max_latency_ms must be a number of milliseconds "
                                           f"from 0 (unpaced) to 60000, not {_toml(v)}")
        else:
            out["max_latency_ms"] = float(v) or None
    return ScrubPolicy(**out, line=ck.lines.get(p, 0))


def _migration(ck: _Checker, data: Mapping[str, object]) -> MigrationPolicy:
    p = ("migration",)
    body = ck.section(data, "migration", _MIGRATION_KEYS)
    if body is None:
        return MigrationPolicy()
    out: dict[str, Any] = {}
    if "on_hazard" in body:
        v = body["on_hazard"]
        if v in MIGRATION_ACTIONS:
            out["on_hazard"] = v
        else:
            ck.bad((*p, "on_hazard"), f"on_hazard must be one of "
                                      f"{', '.join(MIGRATION_ACTIONS)}, not {_toml(v)}")
    ck.flags(body, p, ("guard_start",), out)
    if "drain_timeout" in body:
        v = body["drain_timeout"]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 3600:
            ck.bad((*p, "drain_timeout"), f"drain_timeout must be an integer from 1 to 3600 "
                                          f"(seconds), not {_toml(v)}")
        else:
            out["drain_timeout"] = v
    ck.flags(body, p, ("warm_after",), out)
    if "warm_traces" in body:
        v = body["warm_traces"]
        if isinstance(v, str) and v.startswith("/") and "\0" not in v:
            out["warm_traces"] = v
        else:
            ck.bad((*p, "warm_traces"), f"warm_traces must be an absolute directory path "
                                        f"(where the trace files are), not {_toml(v)}")
    return MigrationPolicy(**out, line=ck.lines.get(p, 0))


def _protect(ck: _Checker, data: Mapping[str, object]) -> ProtectPolicy:
    p = ("protect",)
    body = ck.section(data, "protect", _PROTECT_KEYS)
    if body is None:
        return ProtectPolicy()
    out: dict[str, Any] = {}
    ck.flags(body, p, ("enabled", "smart_critical"), out)
    if "io_errors" in body:
        v = body["io_errors"]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
            ck.bad((*p, "io_errors"), f"io_errors must be an integer of at least 1 (a rise "
                                      f"of that many IO errors), not {_toml(v)}")
        else:
            out["io_errors"] = v
    if "wear_percent" in body:
        v = body["wear_percent"]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255:
            ck.bad((*p, "wear_percent"), f"wear_percent must be an integer from 1 to 255 "
                                         f"(0: wear never triggers), not {_toml(v)}")
        else:
            out["wear_percent"] = v or None
    return ProtectPolicy(**out, line=ck.lines.get(p, 0))


def _scheduler_name(value: object) -> str:
    names = ", ".join(SCHEDULERS)
    if not isinstance(value, str):
        raise ValueError(f"must be a string: one of {names}")
    try:
        word = sched.check_name(value)
    except UsageError as exc:
        raise ValueError(f"{exc.message}; {exc.hint}") from None
    if word not in SCHEDULERS:
        raise ValueError(f"unknown IO scheduler {value!r}; one of {names}")
    return word


def _schedulers(ck: _Checker, data: Mapping[str, object]) -> list[SchedulerPolicy]:
    out: list[SchedulerPolicy] = []
    seen: dict[DeviceId, str] = {}
    for name, body in ck.entries(data, "scheduler"):
        p = ("scheduler", name)
        ck.unknown(body, _SCHED_KEYS, p)
        dev = ck.device(body, p)
        word = None
        if "scheduler" not in body:
            ck.bad(p, f"scheduler {name!r} needs scheduler = \"NAME\" (one of "
                      f"{', '.join(SCHEDULERS)})")
        else:
            try:
                word = _scheduler_name(body["scheduler"])
            except ValueError as exc:
                ck.bad((*p, "scheduler"), f"scheduler: {exc}")
        if dev is not None and dev in seen:
            ck.bad((*p, "device"), f"{dev} is already named by {seen[dev]}")
            continue
        if dev is not None and word is not None:
            seen[dev] = f"scheduler {name}"
            out.append(SchedulerPolicy(name, dev, word, ck.lines.get(p, 0)))
    return out


def _lv_name(value: object) -> str:
    """``vg0/vm1``, ``/dev/vg0/vm1`` or ``/dev/mapper/vg0-vm1`` -> ``vg0/vm1``."""
    if not isinstance(value, str):
        raise ValueError("must be a string: VG/LV")
    ch = checks.bad_char(value)
    if ch is not None:
        raise ValueError(f"{value!r} contains the character {ch}")
    name = spelling(value.strip())
    if name is None:
        raise ValueError(f"{value.strip()!r} is not an LV name (VG/LV, /dev/VG/LV or "
                         "/dev/mapper/VG-LV)")
    try:
        check_vg_lv(name)
    except UsageError as exc:
        raise ValueError(exc.message) from None
    return name


def _lvms(ck: _Checker, data: Mapping[str, object]) -> list[LvmPolicy]:
    out: list[LvmPolicy] = []
    seen: dict[str, str] = {}
    modes = ", ".join(m.value for m in LVM_CACHE_MODES)
    for name, body in ck.entries(data, "lvm"):
        p = ("lvm", name)
        ck.unknown(body, _LVM_KEYS, p)
        names: dict[str, str] = {}
        for key in ("lv", "cache"):
            if key not in body:
                ck.bad(p, f"lvm {name!r} needs {key} = \"VG/LV\" (the "
                          f"{'cached LV' if key == 'lv' else 'cache pool or cachevol'})")
                continue
            try:
                names[key] = _lv_name(body[key])
            except ValueError as exc:
                ck.bad((*p, key), f"{key}: {exc}")
        kind = body.get("type", "cache")
        if kind not in ("cache", "writecache"):
            ck.bad((*p, "type"), f"type must be \"cache\" or \"writecache\", not {_toml(kind)}")
            kind = "cache"
        mode = None
        if "mode" in body:
            v = body["mode"]
            try:
                mode = CacheMode(v.strip().lower()) if isinstance(v, str) else None
            except ValueError:
                mode = None
            if kind == "writecache":
                ck.bad((*p, "mode"), "mode: a writecache has no modes (leave mode out)")
                mode = None
            elif mode not in LVM_CACHE_MODES:
                ck.bad((*p, "mode"), f"mode: lvmcache has no mode {_toml(v)}; one of {modes}")
                mode = None
        erase = body.get("erase_cachevol", False)
        if not isinstance(erase, bool):
            ck.bad((*p, "erase_cachevol"), "erase_cachevol must be true or false")
            erase = False
        if kind == "writecache" and not erase and "erase_cachevol" not in body:
            ck.bad(p, f"lvm {name!r}: a writecache's cache is a plain LV (cachevol), which "
                      "lvm2 erases when it attaches it: say erase_cachevol = true")
        if len(names) < 2:
            continue
        lv, cache = names["lv"], names["cache"]
        if lv == cache:
            ck.bad((*p, "cache"), f"cache: {cache} is the cached LV itself")
            continue
        if lv.partition("/")[0] != cache.partition("/")[0]:
            ck.bad((*p, "cache"), f"cache: {cache} is not in {lv}'s VG (lvm2 caches an LV "
                                  "only with a cache pool or cachevol of its own VG)")
            continue
        bad = False
        for key, what in (("lv", lv), ("cache", cache)):
            if what in seen:
                ck.bad((*p, key), f"{key}: {what} is already named by {seen[what]}")
                bad = True
        if bad:
            continue
        seen[lv] = seen[cache] = f"lvm {name}"
        out.append(LvmPolicy(name, lv, cache, kind == "writecache", mode, erase,
                             ck.lines.get(p, 0)))
    return out


def _kind_of(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a regular file"


def check_trusted(path: str, st: os.stat_result) -> None:
    """Run as root, refuse (:class:`UnsafePolicyError`) the policy file ``path`` (``st``:
    the fstat of what was opened) unless only root can change it: the file owned by root
    and not writable by group or others; every directory from / to it (after symbolic
    links: ``realpath``) the same, a root-owned sticky one (``/tmp``) allowed; ``path``
    itself, when it is a symbolic link, root's. Nothing else is read before this passes."""
    if os.geteuid() != 0:
        return
    lst = os.lstat(path)
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid != 0:
        raise UnsafePolicyError(path, f"a symbolic link owned by uid {lst.st_uid}, not root",
                                "replace it with the file it points to, owned by root "
                                "(or name that file with --policy)")
    why = state.loose(st)
    real = os.path.realpath(path)
    if why:
        raise UnsafePolicyError(path, f"{real} is {why}" if real != path else why,
                                f"chown root:root {real} && chmod 0644 {real}")
    rst = os.stat(real)
    if (rst.st_dev, rst.st_ino) != (st.st_dev, st.st_ino):
        raise UnsafePolicyError(path, "it was replaced while it was read",
                                "look at who changes it; then run again")
    bad = state.loose_parent(os.path.dirname(real))
    if bad:
        raise UnsafePolicyError(path, f"its directory {bad[0]} is {bad[1]}",
                                f"chown root:root {bad[0]} && chmod go-w {bad[0]}")


def load(path: str | None = None) -> Policy:
    """Read and parse the policy file; PolicyError (line 0) when it cannot be read or is
    not a regular file (a FIFO would block the reader for ever, a device never end): it is
    looked at (stat) before it is opened, and opened without blocking. Run as root, a file
    that another user could change is refused (:func:`check_trusted`)."""
    p = path or default_path()
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise PolicyError(p, [Problem(0, f"{_kind_of(st.st_mode)}, not a regular file; "
                                             "the policy is a TOML file")])
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())  # the same check on what was opened (it may be swapped)
            if not stat.S_ISREG(st.st_mode):
                raise PolicyError(p, [Problem(0, f"{_kind_of(st.st_mode)}, not a regular "
                                                 "file; the policy is a TOML file")])
            check_trusted(p, st)
            raw = f.read()
    except FileNotFoundError:
        raise PolicyError(p, [Problem(0, "no such file")]) from None
    except OSError as exc:
        raise PolicyError(p, [Problem(0, f"cannot read it: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise PolicyError(p, [Problem(line, "not valid UTF-8")]) from None
    return parse(text, p)


def load_if_present(path: str | None = None) -> Policy | None:
    """:func:`load`, None when there is no policy file (a bad one still raises)."""
    try:
        return load(path)
    except PolicyError as exc:
        if exc.missing:
            return None
        raise


# ---------------------------------------------------------------------------------------
# writing (for tests, and for `policy check --normalized`)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dumps(policy: Policy) -> str:
    """TOML text that :func:`parse` reads back into an equal policy."""
    out = [f"version = {VERSION}", ""]
    for c in policy.caches:
        out.append(f"[cache.{c.name}]")
        if c.device is not None:
            out.append(f"device = {_q(str(c.device))}")
        if c.cset is not None:
            out.append(f"cset = {_q(c.cset)}")
        out.append(f"format_blank_ssd = {'true' if c.format_blank_ssd else 'false'}")
        if c.bucket_size is not None:
            out.append(f"bucket_size = {_q(c.bucket_size)}")
        out.append("")
    for b in policy.backings:
        out.append(f"[backing.{b.name}]")
        out.append(f"device = {_q(str(b.device))}")
        out.append(f"cache = {_q(b.cache)}")
        if b.mode is not None:
            out.append(f"mode = {_q(b.mode.value)}")
        for k, v in b.tunables:
            out.append(f"{k} = {v}")
        out.append("")
    for m in policy.lvms:
        out.append(f"[lvm.{m.name}]")
        out.append(f"lv = {_q(m.lv)}")
        out.append(f"cache = {_q(m.cache)}")
        out.append(f"type = {_q('writecache' if m.writecache else 'cache')}")
        if m.mode is not None:
            out.append(f"mode = {_q(m.mode.value)}")
        out.append(f"erase_cachevol = {'true' if m.erase_cachevol else 'false'}")
        out.append("")
    for sp in policy.schedulers:
        out.append(f"[scheduler.{sp.name}]")
        out.append(f"device = {_q(str(sp.device))}")
        out.append(f"scheduler = {_q(sp.scheduler)}")
        out.append("")
    pr = policy.protect
    if pr != ProtectPolicy():
        out += ["[protect]", f"enabled = {'true' if pr.enabled else 'false'}",
                f"io_errors = {pr.io_errors}",
                f"smart_critical = {'true' if pr.smart_critical else 'false'}",
                f"wear_percent = {pr.wear_percent or 0}", ""]
    mg = policy.migration
    if mg != MigrationPolicy():
        out += ["[migration]", f"on_hazard = {_q(mg.on_hazard)}",
                f"guard_start = {'true' if mg.guard_start else 'false'}",
                f"drain_timeout = {mg.drain_timeout}",
                f"warm_after = {'true' if mg.warm_after else 'false'}",
                f"warm_traces = {_q(mg.warm_traces)}", ""]
    sc = policy.scrub
    if sc != ScrubPolicy():
        out += ["[scrub]", f"enabled = {'true' if sc.enabled else 'false'}",
                f"devices = [{', '.join(_q(d) for d in sc.devices)}]",
                f"max_latency_ms = {sc.max_latency_ms or 0:g}", ""]
    wb = policy.writeback
    if wb != WritebackPolicy():
        out += ["[writeback]", f"enabled = {'true' if wb.enabled else 'false'}"]
        if wb.read_p99_ms is not None:
            out.append(f"read_p99_ms = {wb.read_p99_ms!r}")
        if wb.max_dirty is not None:
            out.append(f"max_dirty = {wb.max_dirty}")
        if wb.max_age_s is not None:
            out.append(f"max_age_s = {wb.max_age_s!r}")
        out.append("")
    return "\n".join(out)
