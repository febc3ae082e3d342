"""Protect before the SSD dies (issue #31 item 6): a policy, off by default.

When a cache SSD's IO errors rise, or SMART reports a critical warning (the drive's own
self-assessment failed, or an NVMe critical warning bit) or wear past a threshold, every
device cached on that SSD leaves writeback for writethrough and is drained, so that nothing
lives only on the SSD when it dies. The policy's ``[protect]`` table::

    [protect]
    enabled = true          # default false: nothing is decided at all
    io_errors = 1           # act when the SSD's IO error count rose by this much since the
                            # last pass recorded it (kept in <state dir>/protect/state.json):
                            # never on a count first seen (that is the baseline), never on
                            # errors that probe commands (smartctl) can explain
    smart_critical = true   # act on a failed SMART self-assessment or an NVMe critical warning
    wear_percent = 90       # act once SMART says this much of the rated endurance is used

:func:`ssds` groups the snapshot's cached devices by the SSD under their cache (pure: the
snapshot, the SMART answers, the disks' error counters); :func:`decide` (pure: those groups,
the policy and the counts the last pass recorded -> actions and the counts to record) says
what to do. ops/protect.py carries the actions out through the command layer (the ``mode``
and ``drain`` commands, so through the gate: a device a replacement or a drain owns is
skipped with the gate's words), journals them and keeps the state.

What counts as a rise (issue #41 item 4; docs/kernel-notes.md, "What smartctl does to
ioerr_cnt" and "The kernel log's IO errors"): a counter first seen is only a baseline,
whatever it reads; a counter that fell (a disk added again, bcache's count decaying) is a new
baseline. A SCSI disk's ``device/ioerr_cnt`` counts every command that completed with an
error, smartctl's own pass-through commands too (smartctl 7.3 ``-a`` on scsi_debug: 2 of its
24 commands rejected, +2 every run), and they log nothing; a failed read or write of the
disk's data logs one line in the kernel log (``critical medium error, dev sdc, sector ...``,
``I/O error, dev sdc, ...``: backends/kernlog.py). So of a disk counter's rise only as many
errors count as the kernel logged failed requests of that disk since the last pass (the
window: the /dev/kmsg records after the last one that pass read, :class:`Log`); the rest are
probes. When the log cannot show every failed request of the window (it could not be read,
its ring lost records since, or its rate limit dropped lines: 10 a 5 s, every disk together)
and the rise has errors the log does not explain, they are neither acted on nor taken for
probes: the pass says it cannot tell, and the state keeps it (the health model's UNKNOWN)
until ``cachemgr protect --clear SSD``. bcache's own count on the cache device is never
raised by a probe (it counts bcache's IO): its rise counts as it is.

(Counting probes by the disk's commands done, ``iodone_cnt``, less the block layer's
requests done, from ``stat``, failed under load: the two are counted at different moments of
a command's end, and a pass saw 4 errors unexplained on a healthy SSD after 286 rounds of
smartctl under fio: tests/kernel/test_protect_kernel.py.)

Undone by ``cachemgr protect --clear SSD`` (ops/protect.py ``clear``): the modes the passes
changed are put back and the SSD's record and baseline start again. Off (``enabled =
false``, or no policy), a pass acts on nothing, keeps the counts as the new baseline and
marks its records off: the health model then says so, a warning naming ``--clear``.

Devices in a mode that writes nothing new to the SSD as dirty (bcache writearound or none,
dm-cache/LVM passthrough) keep their mode and are only drained when dirty: switching them to
writethrough would start filling a failing SSD. A dm-writecache has no writethrough: a note
says so (drain or detach it by hand).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachemgr.backends import smart
from cachemgr.core import state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import CacheMode, Snapshot
from cachemgr.procedures import kinds
from cachemgr.procedures.policy import ProtectPolicy

# modes that add no dirty data: a device in one of them is drained if dirty, never switched
SAFE_MODES = (CacheMode.WRITETHROUGH, CacheMode.WRITEAROUND, CacheMode.NONE,
              CacheMode.PASSTHROUGH)


@dataclass(frozen=True)
class Member:
    """A cached device on an SSD: what protecting it needs to know."""

    node: str  # /dev/bcache0, /dev/mapper/vmcache, vg0/vm1: what the commands take
    kind: str  # the kind's name (bcache, dm-cache, lvmcache, ...)
    mode: CacheMode | None
    dirty_bytes: int | None  # None: unknown
    can_writethrough: bool


@dataclass(frozen=True)
class Ssd:
    """One cache SSD and what is cached on it."""

    node: str  # /dev/sdc (or the cache devices of a bcache set, joined by ",")
    key: str  # stable: the disk's WWID or serial, else bcache:<cset UUID>, else the node
    members: tuple[Member, ...]
    io_errors: Mapping[str, int] = field(default_factory=dict)  # counter key -> count
    health: smart.Health | None = None
    # a disk counter's key -> the failed requests the kernel logged for that disk, as
    # (record sequence number, seconds since boot): only these count (module doc)
    logged: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Log:
    """The kernel log (/dev/kmsg) as a pass read it, after the counters (ops/protect.py
    ``gather``): what tells a disk's failed requests from probes, and whether it can."""

    why_not: str | None = None  # why it could not be read (None: it was)
    boot: str | None = None  # the boot's ID (sequence numbers start again at each boot)
    first: int | None = None  # the oldest record it held (its sequence number)
    last: int | None = None  # the newest read: where this pass's window ends
    at: float | None = None  # the newest record's time (seconds since boot)
    lost: bool = False  # records overwritten while it was read
    # the rate limit's notices (sequence number, time, lines dropped): they name no disk
    suppressed: tuple[tuple[int, float, int], ...] = ()
    failed: tuple[tuple[int, float], ...] = ()  # every failed-request line, every disk

    def mark(self) -> dict[str, Any] | None:
        """Where the next pass's window starts (kept in the state), None when unread."""
        if self.why_not is not None or self.last is None:
            return None
        return {"boot": self.boot, "seq": self.last, "at": self.at}


BURST, INTERVAL = 10, 5.0  # backends/kernlog.py: the failed-request lines' rate limit


def window(log: Log, since: Mapping[str, Any] | None) -> tuple[int, str | None]:
    """(the sequence number the window starts after, why the log may not hold every failed
    request of the window: None when it does). ``since``: the last pass's :meth:`Log.mark`."""
    if log.why_not is not None:
        return -1, log.why_not
    if log.last is None:
        return -1, "the kernel log held no record"
    if not since or not isinstance(since.get("seq"), int):
        return -1, "no earlier pass read the kernel log (nothing to count the rise from)"
    start = int(since["seq"])
    if since.get("boot") != log.boot or log.last < start:
        start = -1  # a boot since: the counters started again too, every record counts
    if log.lost or (log.first is not None and log.first > start + 1):
        return start, ("the kernel log no longer holds every record since the last pass "
                       "(its ring was overwritten)")
    dropped = sum(n for seq, _, n in log.suppressed if seq > start)
    if dropped:
        return start, (f"the kernel's rate limit dropped {dropped} failed-request line(s) "
                       "since the last pass, which name no disk")
    t0 = since.get("at") if start >= 0 and isinstance(since.get("at"), (int, float)) else None
    ats = sorted(at for seq, at in log.failed
                 if seq > start or (t0 is not None and at >= t0 - INTERVAL))
    if any(ats[i + BURST - 1] - ats[i] < INTERVAL for i in range(len(ats) - BURST + 1)):
        return start, (f"{BURST} failed-request lines within {INTERVAL:g} s (the kernel's "
                       "rate limit): more may have been dropped")
    return start, None


@dataclass(frozen=True)
class Act:
    """One thing to do on one device: ``switch`` (to writethrough, then drain) or
    ``drain`` (its mode adds no dirty data, but some is left)."""

    ssd: str
    device: str
    what: str  # "switch" | "drain" | "note"
    why: str
    note: str = ""

    def describe(self) -> str:
        if self.what == "switch":
            return (f"protect {self.device}: mode writethrough, then drain (SSD {self.ssd}: "
                    f"{self.why})")
        if self.what == "drain":
            return f"protect {self.device}: drain (SSD {self.ssd}: {self.why})"
        return f"protect {self.device}: {self.note} (SSD {self.ssd}: {self.why})"

    def record(self) -> dict[str, Any]:
        return {"kind": "protect", "ssd": self.ssd, "device": self.device,
                "what": self.what, "why": self.why, "note": self.note}


@dataclass(frozen=True)
class Decision:
    acts: tuple[Act, ...]
    triggered: tuple[tuple[Ssd, str], ...]  # each SSD to protect and why
    counts: dict[str, int]  # the IO error counts to record for the next pass
    notes: tuple[str, ...] = ()
    # counter key -> why its rise was not acted on: "first seen", "fell", "explained" (by
    # probe commands), "unknown" (the log cannot tell: ``unknown`` says why)
    ignored: dict[str, str] = field(default_factory=dict)
    # SSD key -> (its node, words): a rise the kernel log could not tell from probes
    unknown: dict[str, tuple[str, str]] = field(default_factory=dict)
    mark: dict[str, Any] | None = None  # the log's mark for the next pass (Log.mark)


# --------------------------------------------------------------------------- the groups


def _member(k: kinds.Kind) -> Member:
    return Member(k.target, k.name, k.mode, k.dirty_bytes,
                  CacheMode.WRITETHROUGH in k.modes)


def ssds(snap: Snapshot, health: Sequence[tuple[smart.Ssd, smart.Health | None]] = (),
         disk_errors: Mapping[str, int] | None = None,
         disk_logged: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> list[Ssd]:
    """The snapshot's cached devices grouped by the SSD under their cache. ``health``: the
    SMART answers (smart.ssd_health: each SCSI/NVMe cache SSD, the caches on it, its
    cached health); ``disk_errors``: each such disk's kernel error counter by disk name (the
    SCSI ``device/ioerr_cnt``); ``disk_logged``: the failed requests the kernel logged for
    it by disk name (:class:`Log`'s records), read after it. A cache on a disk SMART does
    not know (virtio, UML's ubd, a dm device) is its own group, named by its cache
    devices."""
    disk_errors = disk_errors or {}
    disk_logged = disk_logged or {}
    by_cache: dict[str, tuple[smart.Ssd, smart.Health | None]] = {}
    for disk, h in health:
        for name in disk.caches:
            by_cache.setdefault(name, (disk, h))
    groups: dict[str, dict[str, Any]] = {}

    def group(cache: str, fallback_node: str, fallback_key: str) -> dict[str, Any]:
        hit = by_cache.get(cache)
        if hit is not None:
            disk, h = hit
            g = groups.setdefault(disk.key, {"node": disk.node, "key": disk.key,
                                             "members": [], "errors": {}, "health": h,
                                             "logged": {}})
            if disk.name in disk_errors:
                g["errors"][f"disk:{disk.key}"] = disk_errors[disk.name]
                g["logged"][f"disk:{disk.key}"] = tuple(disk_logged.get(disk.name, ()))
            return g
        return groups.setdefault(fallback_key, {"node": fallback_node, "key": fallback_key,
                                                "members": [], "errors": {}, "health": None,
                                                "logged": {}})

    for c in snap.cache_sets:
        node = ",".join(x.identity.node for x in c.caches) or c.uuid
        g = group(c.uuid, node, f"bcache:{c.uuid}")
        errs = [x.io_errors for x in c.caches if x.io_errors is not None]
        if errs:
            g["errors"][f"bcache:{c.uuid}"] = sum(errs)
        for b in snap.backings:
            k = kinds.of(b)
            if b.cset_uuid == c.uuid and k is not None and k.cached_device:
                g["members"].append(_member(k))
    for d in (*snap.dmcaches, *snap.writecaches):
        k = kinds.of(d)
        under = getattr(d, "cache", None)
        if k is None or under is None:
            continue
        g = group(d.node, under.node, f"dev:{under.node}")
        g["members"].append(_member(k))
    return [Ssd(g["node"], g["key"], tuple(g["members"]), dict(g["errors"]), g["health"],
                dict(g["logged"])) for g in groups.values()]


# --------------------------------------------------------------------------- the decision


def when(t: float | None) -> str:
    """An epoch time in the words of a finding (UTC, to the second)."""
    if t is None:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _rise(key: str, n: int, last: Mapping[str, int],
          logged: Sequence[tuple[int, float]], start: int) -> tuple[int, int, str | None]:
    """(the rise, the errors of it that count, why none count) for counter ``key`` reading
    ``n`` now; ``logged``: the disk's failed requests in the log, ``start``: the window's."""
    if key not in last:
        return 0, 0, "first seen"  # the baseline: whatever it reads, it is not a rise
    rise = n - last[key]
    if rise < 0:
        return 0, 0, "fell"  # re-added disk, or bcache's decay: the new baseline
    if rise == 0 or not key.startswith("disk:"):
        return rise, rise, None  # bcache's count: no probe of anyone's reaches it
    # only a failed request the kernel logged in the window is the data's (module doc)
    counted = min(rise, sum(1 for seq, _ in logged if seq > start))
    return rise, counted, (None if counted else "explained")


def _why(s: Ssd, p: ProtectPolicy, last: Mapping[str, int], log: Log | None,
         marks: Mapping[str, Any], read_at: Mapping[str, float],
         now: float | None, ignored: dict[str, str], unknown: dict[str, tuple[str, str]]
         ) -> list[str]:
    why = []
    for key, n in sorted(s.io_errors.items()):
        start, gap = window(log, marks.get(key)) if log is not None else (
            -1, "the kernel log not read")
        rise, counted, skip = _rise(key, n, last, s.logged.get(key, ()), start)
        t0 = read_at.get(key)
        span = (f" between {when(t0)} and {when(now)}" if t0 is not None and now is not None
                else f" since {when(t0)}" if t0 is not None else "")
        if key.startswith("disk:") and counted < rise and counted < p.io_errors \
                and gap is not None:
            # errors the log does not explain, and a log that may not show them all
            skip = "unknown"
            unknown[s.key] = (s.node, (
                f"the disk's ioerr_cnt rose from {last[key]} to {n}{span}, {counted} of it "
                f"failed requests the kernel logged; whether the rest were probe commands "
                f"or the data's failed requests is unknown: {gap}"))
        if skip is not None:
            ignored[key] = skip
        if counted and counted >= p.io_errors:
            src = ("bcache's IO error count on the cache device" if key.startswith("bcache:")
                   else "the disk's ioerr_cnt")
            w = f"{src} rose from {last[key]} to {n}{span}"
            if counted != rise:
                w += (f", {counted} of it failed requests the kernel logged (the rest: probe "
                      "commands)")
            why.append(w)
    h = s.health
    if h is not None and h.error is None:
        if p.smart_critical and h.passed is False:
            why.append("SMART self-assessment failed")
        if p.smart_critical and h.critical_warning:
            why.append(f"NVMe critical warning 0x{h.critical_warning:02x}")
        if p.wear_percent is not None and h.wear_percent is not None \
                and h.wear_percent >= p.wear_percent:
            why.append(f"wear {h.wear_percent} %, limit {p.wear_percent} %")
    return why


def decide(groups: Iterable[Ssd], p: ProtectPolicy, last: Mapping[str, int],
           before: Mapping[str, str] | None = None, *,
           log: Log | None = None, marks: Mapping[str, Any] | None = None,
           read_at: Mapping[str, float] | None = None,
           now: float | None = None) -> Decision:
    """What protecting needs now (pure). ``last``: the IO error counts the previous pass
    recorded and ``read_at`` when it read each (the state's); ``log``: the kernel log read
    now, ``marks``: where the log's reading with each count ended (its :meth:`Log.mark`).
    A count is acted on only when it rose from ``last`` by ``p.io_errors`` or more, a disk
    counter's only by failed requests the kernel logged for the disk in the window (module
    doc); a rise the log cannot tell is in ``unknown``. A count never seen is the baseline,
    a count that fell, as bcache's decaying one does, is recorded lower and a rise counts
    from there. ``before``: the SSDs an earlier pass protected (key -> why):
    they stay protected while they cache anything (until ``cachemgr protect --clear``), so
    a device an earlier pass could not protect (the gate skipped it) or switched back to
    writeback is protected again. Disabled: nothing (ops/protect.py keeps the counts)."""
    before = before or {}
    read_at = read_at or {}
    marks = marks or {}
    if not p.enabled:
        return Decision((), (), {}, ("protect is off (the policy's protect table has "
                                     "enabled = false, the default)",))
    acts: list[Act] = []
    triggered: list[tuple[Ssd, str]] = []
    counts: dict[str, int] = {}
    ignored: dict[str, str] = {}
    unknown: dict[str, tuple[str, str]] = {}
    for s in groups:
        counts.update(s.io_errors)
        why = _why(s, p, last, log, marks, read_at, now, ignored, unknown)
        if not why and s.key in before:
            why = [f"since an earlier pass: {before[s.key]}"]
        if not why:
            continue
        words = "; ".join(why)
        triggered.append((s, words))
        for m in s.members:
            if m.mode not in SAFE_MODES:
                if m.can_writethrough:
                    acts.append(Act(s.node, m.node, "switch", words))
                else:
                    acts.append(Act(s.node, m.node, "note", words,
                                    note=f"a {m.kind} has no writethrough: drain or "
                                         f"detach it by hand: cachemgr detach {m.node}"))
            elif m.dirty_bytes is None or m.dirty_bytes > 0:
                acts.append(Act(s.node, m.node, "drain", words))
    # every switch first (fast), then the drains (each may take a while): a device waiting
    # for its drain is no longer adding dirty data
    acts.sort(key=lambda a: {"switch": 0, "note": 1, "drain": 2}[a.what])
    for s, _ in triggered:  # acted on: nothing unknown about it
        unknown.pop(s.key, None)
    return Decision(tuple(acts), tuple(triggered), counts, ignored=ignored, unknown=unknown,
                    mark=log.mark() if log is not None else None)


# --------------------------------------------------------------------------- the state


def state_path() -> Any:
    return state.state_dir(create=False) / "protect" / "state.json"


def _ints(v: object) -> dict[str, int]:
    return {str(k): int(n) for k, n in v.items()
            if isinstance(n, int) and not isinstance(n, bool)} if isinstance(v, dict) else {}


def _marks(v: object) -> dict[str, dict[str, Any]]:
    if not isinstance(v, dict):
        return {}
    return {str(k): {"boot": m.get("boot") if isinstance(m.get("boot"), str) else None,
                     "seq": m["seq"],
                     "at": float(m["at"]) if isinstance(m.get("at"), (int, float)) else None}
            for k, m in v.items() if isinstance(m, dict) and isinstance(m.get("seq"), int)
            and not isinstance(m.get("seq"), bool)}


def load_state(view: state.View | None = None) -> dict[str, Any]:
    """``{"counts": {key: n}, "marks": {key: {boot, seq, at}}, "read_at": {key: t},
    "off": t | None, "protected": {ssd: {...}}, "unknown": {ssd: {...}}}``; empty when
    there is none (never creates the state directory: a scrape and ``check`` read it too).
    ``marks``: where the kernel log had been read when each count was (:meth:`Log.mark`).
    ``view``: a poller's state directory for this poll (core/state.py ``polled``). A state
    written before the marks were kept reads with none: a rise of a disk counter it finds
    then is one the log cannot tell (``unknown``), never one acted on."""
    try:
        if view is not None:
            data = view.read_json("protect", "state.json") or {}
        elif not state.state_dir(create=False).is_dir():
            data = {}
        else:
            data = state.read_json(state_path()) or {}
    except (CacheMgrError, OSError):
        data = {}
    prot = data.get("protected")
    prot = prot if isinstance(prot, dict) else {}
    unk = data.get("unknown")
    unk = unk if isinstance(unk, dict) else {}
    read_at = data.get("read_at")
    off = data.get("off")
    return {"counts": _ints(data.get("counts")), "marks": _marks(data.get("marks")),
            "read_at": {str(k): float(v) for k, v in read_at.items()
                        if isinstance(v, (int, float))} if isinstance(read_at, dict) else {},
            "off": float(off) if isinstance(off, (int, float)) else None,
            "protected": {str(k): v for k, v in prot.items() if isinstance(v, dict)},
            "unknown": {str(k): v for k, v in unk.items() if isinstance(v, dict)}}


def decide_from(groups: Sequence[Ssd], p: ProtectPolicy, st: Mapping[str, Any],
                now: float | None = None, log: Log | None = None) -> Decision:
    """:func:`decide` with what state ``st`` (:func:`load_state`) kept."""
    return decide(groups, p, st.get("counts", {}), earlier(st), log=log,
                  marks=st.get("marks"), read_at=st.get("read_at"), now=now)


def _seen(groups: Sequence[Ssd], now: float, mark: Mapping[str, Any] | None
          ) -> dict[str, Any]:
    """The counts, the log's marks and the reading times after a pass that read
    ``groups`` and the kernel log up to ``mark`` (None: the log not read)."""
    counts = {k: n for s in groups for k, n in s.io_errors.items()}
    return {"counts": counts,
            "marks": {k: dict(mark) for k in counts} if mark is not None else {},
            "read_at": {k: round(now, 3) for k in counts}}


def _unknown(old: Mapping[str, Any], d: Decision | None, groups: Sequence[Ssd],
             now: float) -> dict[str, Any]:
    """The rises the log could not tell, kept (the first, and the last pass's words) while
    the SSD is there and no pass protected it, until ``--clear`` forgets them."""
    present = {s.key for s in groups}
    out = {k: dict(v) for k, v in old.get("unknown", {}).items() if k in present}
    if d is not None:
        for key, (node, words) in d.unknown.items():
            entry = out.get(key) or {"ssd": node, "since": round(now, 3), "why": words}
            entry["last"], entry["latest"] = round(now, 3), words
            out[key] = entry
        for s, _ in d.triggered:
            out.pop(s.key, None)
    return out


def next_state(old: Mapping[str, Any], d: Decision, groups: Sequence[Ssd],
               results: Mapping[str, str], now: float | None = None) -> dict[str, Any]:
    """The state after a pass: the counts seen, where the log was read, when; an SSD
    protected once stays recorded (with its first reason and time, and the mode each
    device had before a pass switched it: ``--clear`` puts them back) until no cache is on
    it any more (replaced, or pulled) or ``cachemgr protect --clear`` forgets it; so does a
    rise the log could not tell (``unknown``)."""
    now = time.time() if now is None else now
    present = {s.key for s in groups}
    prot: dict[str, Any] = {k: v for k, v in old.get("protected", {}).items()
                            if k in present}
    switched = {a.device for a in d.acts if a.what == "switch"}
    for s, why in d.triggered:
        entry = prot.get(s.key) or {"ssd": s.node, "since": round(now, 3), "why": why}
        entry["last"] = round(now, 3)
        entry["devices"] = {m.node: results.get(m.node, "protected") for m in s.members}
        got = entry.get("modes")
        modes: dict[str, str] = dict(got) if isinstance(got, dict) else {}
        for m in s.members:  # the first mode a pass saw before switching: the admin's
            if m.node in switched and m.node not in modes and m.mode is not None \
                    and results.get(m.node) not in ("skipped", "failed", "dry-run"):
                modes[m.node] = m.mode.value
        entry["modes"] = modes
        prot[s.key] = entry
    return {**_seen(groups, now, d.mark), "off": None, "protected": prot,
            "unknown": _unknown(old, d, groups, now)}


def off_state(old: Mapping[str, Any], groups: Sequence[Ssd],
              now: float | None = None, mark: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
    """The state after a pass with protect off: the counts are the new baseline (an error
    while it was off is never acted on once it is on again), the records kept and marked
    off since the first such pass (the health model's warning); ``mark``: the log's."""
    now = time.time() if now is None else now
    present = {s.key for s in groups}
    prot = {k: v for k, v in old.get("protected", {}).items() if k in present}
    off = old.get("off")
    return {**_seen(groups, now, mark), "off": off if off is not None else round(now, 3),
            "protected": prot, "unknown": _unknown(old, None, groups, now)}


def forget(old: Mapping[str, Any], key: str, groups: Sequence[Ssd],
           now: float | None = None, mark: Mapping[str, Any] | None = None
           ) -> dict[str, Any]:
    """The state after ``cachemgr protect --clear``: the SSD's record (and what the log
    could not tell of it) gone, and its counts (every other kept as it was) read now, with
    the log up to ``mark``, as its new baseline."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {
        "counts": dict(old.get("counts", {})),
        "marks": {k: dict(v) for k, v in old.get("marks", {}).items()},
        "read_at": dict(old.get("read_at", {})), "off": old.get("off"),
        "protected": {k: v for k, v in old.get("protected", {}).items() if k != key},
        "unknown": {k: v for k, v in old.get("unknown", {}).items() if k != key}}
    for s in groups:
        if s.key == key:
            fresh = _seen([s], now, mark)
            for part in ("counts", "read_at"):
                out[part].update(fresh[part])
            for k in s.io_errors:  # an unread log: no mark, the next rise is unknown
                out["marks"].pop(k, None)
            out["marks"].update(fresh["marks"])
    return out


def find(st: Mapping[str, Any], name: str, same: Any = None) -> str | None:
    """The key of the protected SSD ``name`` names (or of one whose errors the log could not
    tell): its key, its node (one of them, for a bcache set's), or a path ``same(name,
    node)`` says is the same device."""
    for key, v in [*st.get("protected", {}).items(), *st.get("unknown", {}).items()]:
        nodes = str(v.get("ssd")).split(",")
        if name == key or name == v.get("ssd") or name in nodes:
            return str(key)
        if same is not None and any(same(name, n) for n in nodes):
            return str(key)
    return None


DONE = ("done", "already", "protected")  # a device's result that leaves it protected


def earlier(st: Mapping[str, Any]) -> dict[str, str]:
    """The SSDs an earlier pass protected: key -> its first reason (for :func:`decide`)."""
    return {k: str(v.get("why")) for k, v in st.get("protected", {}).items()}


def protected(st: Mapping[str, Any] | None = None, *, view: state.View | None = None
              ) -> list[tuple[str, str]]:
    """(SSD node, words) for every SSD a pass protected: what it saw and when, what became
    of its devices and how to undo it (the health model's finding; ``view``:
    :func:`load_state`'s). Never a bracket inside another: the words are data in a finding
    that monitoring and the TUI show."""
    st = load_state(view) if st is None else st
    out = []
    for v in st.get("protected", {}).values():
        devs = v.get("devices") if isinstance(v.get("devices"), dict) else {}
        left = sorted(d for d, r in devs.items() if r not in DONE)
        ssd = str(v.get("ssd"))
        since = v.get("since") if isinstance(v.get("since"), (int, float)) else None
        words = f"{v.get('why')}; protected since {when(since)}; "
        if st.get("off") is not None:
            words += (f"protect is off since {when(st['off'])}, so nothing more is done; "
                      "its devices stay as the passes left them")
        elif left:
            words += ("not protected yet: " + ", ".join(f"{d}: {devs[d]}" for d in left)
                      + "; the next pass tries again, cachemgr protect --dry-run shows it")
        else:
            words += "devices switched to writethrough and drained: " + ", ".join(sorted(devs))
        modes = v.get("modes") if isinstance(v.get("modes"), dict) else {}
        back = ", ".join(f"{d} {m}" for d, m in sorted(modes.items()) if m != "writethrough")
        words += (f"; if the SSD is sound, cachemgr protect --clear {ssd} puts back "
                  + (back if back else "its record and baseline"))
        out.append((ssd, words))
    return out


def unknown(st: Mapping[str, Any] | None = None, *, view: state.View | None = None
            ) -> list[tuple[str, str]]:
    """(SSD node, words) for every SSD whose error count rose by errors the kernel log could
    not tell from probe commands (the health model's UNKNOWN): nothing was done to it."""
    st = load_state(view) if st is None else st
    out = []
    for v in st.get("unknown", {}).values():
        ssd = str(v.get("ssd"))
        since = v.get("since") if isinstance(v.get("since"), (int, float)) else None
        out.append((ssd, f"{v.get('latest') or v.get('why')}; first seen {when(since)}; "
                         "protect acted on nothing: look at its SMART answer (cachemgr "
                         "ssd-health --refresh) and the kernel log (dmesg) for its failed "
                         f"requests; if it is sound, cachemgr protect --clear {ssd} takes "
                         "its counts as the new baseline"))
    return out


def is_off(st: Mapping[str, Any] | None = None, *, view: state.View | None = None) -> bool:
    """Whether the last pass found protect off (its records are then only history)."""
    st = load_state(view) if st is None else st
    return st.get("off") is not None
