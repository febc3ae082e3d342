"""Protect before the SSD dies (issue #31 item 6): a policy, off by default.

When a cache SSD's IO errors rise, or SMART reports a critical warning (the drive's own
self-assessment failed, or an NVMe critical warning bit) or wear past a threshold, every
device cached on that SSD leaves writeback for writethrough and is drained, so that nothing
lives only on the SSD when it dies. The policy's ``[protect]`` table::

    [protect]
    enabled = true          # default false: nothing is decided at all
    io_errors = 1           # act when the SSD's IO error count rose by this much since the
                            # last pass recorded it (kept in <state dir>/protect/state.json)
    smart_critical = true   # act on a failed SMART self-assessment or an NVMe critical warning
    wear_percent = 90       # act once SMART says this much of the rated endurance is used

:func:`ssds` groups the snapshot's cached devices by the SSD under their cache (pure: the
snapshot, the SMART answers, the disks' error counters); :func:`decide` (pure: those groups,
the policy and the counts the last pass recorded -> actions and the counts to record) says
what to do. ops/protect.py carries the actions out through the command layer (the ``mode``
and ``drain`` commands, so through the gate: a device a replacement or a drain owns is
skipped with the gate's words), journals them and keeps the state.

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


# --------------------------------------------------------------------------- the groups


def _member(k: kinds.Kind) -> Member:
    return Member(k.target, k.name, k.mode, k.dirty_bytes,
                  CacheMode.WRITETHROUGH in k.modes)


def ssds(snap: Snapshot, health: Sequence[tuple[smart.Ssd, smart.Health | None]] = (),
         disk_errors: Mapping[str, int] | None = None) -> list[Ssd]:
    """The snapshot's cached devices grouped by the SSD under their cache. ``health``: the
    SMART answers (smart.ssd_health: each SCSI/NVMe cache SSD, the caches on it, its
    cached health); ``disk_errors``: each such disk's kernel error counter by disk name (the
    SCSI ``device/ioerr_cnt``). A cache on a disk SMART does not know (virtio, UML's ubd, a
    dm device) is its own group, named by its cache devices."""
    disk_errors = disk_errors or {}
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
                                             "members": [], "errors": {}, "health": h})
            if disk.name in disk_errors:
                g["errors"][f"disk:{disk.key}"] = disk_errors[disk.name]
            return g
        return groups.setdefault(fallback_key, {"node": fallback_node, "key": fallback_key,
                                                "members": [], "errors": {}, "health": None})

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
    return [Ssd(g["node"], g["key"], tuple(g["members"]), dict(g["errors"]), g["health"])
            for g in groups.values()]


# --------------------------------------------------------------------------- the decision


def _why(s: Ssd, p: ProtectPolicy, last: Mapping[str, int]) -> list[str]:
    why = []
    for key, n in sorted(s.io_errors.items()):
        before = last.get(key, 0)
        if n - before >= p.io_errors:
            src = "bcache" if key.startswith("bcache:") else "the disk"
            why.append(f"IO errors rose from {before} to {n} ({src})")
    h = s.health
    if h is not None and h.error is None:
        if p.smart_critical and h.passed is False:
            why.append("SMART self-assessment failed")
        if p.smart_critical and h.critical_warning:
            why.append(f"NVMe critical warning 0x{h.critical_warning:02x}")
        if p.wear_percent is not None and h.wear_percent is not None \
                and h.wear_percent >= p.wear_percent:
            why.append(f"wear {h.wear_percent} % (limit {p.wear_percent} %)")
    return why


def decide(groups: Iterable[Ssd], p: ProtectPolicy, last: Mapping[str, int],
           before: Mapping[str, str] | None = None) -> Decision:
    """What protecting needs now (pure). ``last``: the IO error counts the previous pass
    recorded (a count never seen counts from 0; a count that fell, as bcache's decaying one
    does, is recorded lower and a rise counts from there). ``before``: the SSDs an earlier
    pass protected (key -> why): they stay protected while they cache anything, so a device
    an earlier pass could not protect (the gate skipped it) or switched back to writeback
    is protected again. Disabled: nothing, and no count."""
    before = before or {}
    if not p.enabled:
        return Decision((), (), {}, ("protect is off (the policy's [protect] enabled = "
                                     "false, the default)",))
    acts: list[Act] = []
    triggered: list[tuple[Ssd, str]] = []
    counts: dict[str, int] = {}
    for s in groups:
        counts.update(s.io_errors)
        why = _why(s, p, last)
        if not why and s.key in before:
            why = [f"{before[s.key]} (an earlier pass)"]
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
                                         f"detach it by hand (cachemgr detach {m.node})"))
            elif m.dirty_bytes is None or m.dirty_bytes > 0:
                acts.append(Act(s.node, m.node, "drain", words))
    # every switch first (fast), then the drains (each may take a while): a device waiting
    # for its drain is no longer adding dirty data
    acts.sort(key=lambda a: {"switch": 0, "note": 1, "drain": 2}[a.what])
    return Decision(tuple(acts), tuple(triggered), counts)


# --------------------------------------------------------------------------- the state


def state_path() -> Any:
    return state.state_dir(create=False) / "protect" / "state.json"


def load_state(view: state.View | None = None) -> dict[str, Any]:
    """``{"counts": {key: n}, "protected": {ssd: {...}}}``; empty when there is none (never
    creates the state directory: a scrape and ``check`` read it too). ``view``: a poller's
    state directory for this poll (core/state.py ``polled``)."""
    try:
        if view is not None:
            data = view.read_json("protect", "state.json") or {}
        elif not state.state_dir(create=False).is_dir():
            return {"counts": {}, "protected": {}}
        else:
            data = state.read_json(state_path()) or {}
    except (CacheMgrError, OSError):
        data = {}
    counts = data.get("counts")
    prot = data.get("protected")
    counts = counts if isinstance(counts, dict) else {}
    prot = prot if isinstance(prot, dict) else {}
    return {"counts": {str(k): int(v) for k, v in counts.items() if isinstance(v, int)},
            "protected": {str(k): v for k, v in prot.items() if isinstance(v, dict)}}


def next_state(old: Mapping[str, Any], d: Decision, groups: Sequence[Ssd],
               results: Mapping[str, str], now: float | None = None) -> dict[str, Any]:
    """The state after a pass: the counts seen; an SSD protected once stays recorded (with
    its first reason and time) until no cache is on it any more (replaced, or pulled)."""
    now = time.time() if now is None else now
    present = {s.key for s in groups}
    prot: dict[str, Any] = {k: v for k, v in old.get("protected", {}).items()
                            if k in present}
    for s, why in d.triggered:
        entry = prot.get(s.key) or {"ssd": s.node, "since": round(now, 3), "why": why}
        entry["last"] = round(now, 3)
        entry["devices"] = {m.node: results.get(m.node, "protected") for m in s.members}
        prot[s.key] = entry
    return {"counts": dict(d.counts), "protected": prot}


DONE = ("done", "already", "protected")  # a device's result that leaves it protected


def earlier(st: Mapping[str, Any]) -> dict[str, str]:
    """The SSDs an earlier pass protected: key -> its first reason (for :func:`decide`)."""
    return {k: str(v.get("why")) for k, v in st.get("protected", {}).items()}


def protected(st: Mapping[str, Any] | None = None, *, view: state.View | None = None
              ) -> list[tuple[str, str]]:
    """(SSD node, words) for every SSD a pass protected, the words after "failing" in the
    health model's CRITICAL finding: why, and what became of its devices (``view``:
    :func:`load_state`'s)."""
    st = load_state(view) if st is None else st
    out = []
    for v in st.get("protected", {}).values():
        devs = v.get("devices") if isinstance(v.get("devices"), dict) else {}
        left = sorted(d for d, r in devs.items() if r not in DONE)
        words = f"({v.get('why')}); "
        if left:
            words += ("not protected yet: " + ", ".join(f"{d} ({devs[d]})" for d in left)
                      + "; the next pass tries again (cachemgr protect --dry-run)")
        else:
            words += "devices switched to writethrough and drained"
        out.append((str(v.get("ssd")), words))
    return out
