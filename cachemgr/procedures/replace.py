"""Safe replacement of a bcache cache SSD under running VMs: a journaled plan of steps.

The source site's procedure, done while VMs kept writing: switch the cache mode to none, wait
for the dirty data to reach 0, SCSI-remove the SSD, SCSI-insert it (or a new one), add it back.
The kernel's own cookbook (bcache.rst) adds what makes it safe: detach every backing device
(which flushes), unregister the set, make a fresh cache, register, attach to the new set.

Each step below is idempotent: it first checks whether its effect is already there (so a
resumed run does not repeat or undo work), then acts, then the journal under
/var/lib/cachemgr/replace/<id>.json records it (atomically) before the next step starts. A run
killed at any point is finished by ``--resume ID``; before the old cache set is unregistered it
can instead be rolled back (``--rollback ID``: modes and tunables put back). A lock per cache
set stops two runs on one cache. The VMs' /dev/bcacheN devices stay up throughout: detached
backing devices keep running in passthrough.

Every step that could lose data refuses instead: dirty data that will not drain stops the run
before the cache set is touched (the data stays safe on the SSD); the wrong disk (in use,
carrying a filesystem or another cache set, too small, or the old SSD when a new one was
asked for) is refused before it is formatted.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.backends import bcache, bcache_super, hotplug, signatures, snapshot
from cachemgr.backends.identity import looks_like_wwn, normalize_wwn
from cachemgr.backends.targets import resolve_cache_set
from cachemgr.core import runner, signals, state
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import (
    BcacheBacking,
    CacheMode,
    CacheSet,
    CacheState,
    DrainProgress,
    Size,
    Snapshot,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain

log = logging.getLogger(__name__)

STEPS: tuple[tuple[str, str], ...] = (
    ("preflight", "check the cache set, its SSD and every backing device"),
    ("remember", "record modes and tunables to restore at the end"),
    ("mode-interim", "switch every backing device to the interim mode (no new dirty data)"),
    ("drain", "write all dirty data back to the backing devices (fast drain)"),
    ("detach", "detach every backing device (flushes; /dev/bcacheN stay up in passthrough)"),
    ("unregister", "unregister the old cache set"),
    ("wipe-old", "wipe the bcache signature of the old SSD"),
    ("remove-old", "remove the old SSD (SCSI delete; NVMe: its controller's PCI remove)"),
    ("wait-new", "wait for the new (or re-inserted) SSD"),
    ("identify-new", "identify the new SSD and refuse a wrong disk"),
    ("make-cache", "make a fresh bcache cache on the new SSD"),
    ("register", "register the new cache set"),
    ("attach", "attach every backing device to the new cache set"),
    ("restore", "restore modes and tunables"),
    ("verify", "verify every backing device: new set, mode, state"),
)
STEP_NAMES = tuple(name for name, _ in STEPS)
# Step names journals of earlier versions used, and the name each has now.
RENAMED_STEPS = {"scsi-remove": "remove-old"}
# Steps after which a rollback is no longer possible (the old set is gone).
POINT_OF_NO_RETURN = "unregister"
# Fault injection for the crash tests: SIGKILL ourselves right after this step is journaled.
KILL_AFTER_ENV = "CACHEMGR_FAULT_KILL_AFTER"
# bcache refuses a cache with fewer buckets ("ca->sb.nbuckets is too small", 7.2 lab).
MIN_BUCKETS = 1024

Say = Callable[[str], None]
Prompt = Callable[[str], None]


@dataclass
class Options:
    new: str = "same"  # "same" (re-insert the old SSD), "any" (a new disk in its slot), a spec
    interim_mode: str = CacheMode.NONE.value
    wipe_old: bool = True
    yes: bool = False
    drain_timeout: float = 24 * 3600.0
    stall_timeout: float = 120.0
    wait_timeout: float = 600.0


@dataclass
class Journal:
    id: str
    cset: str
    options: dict[str, Any]
    old: dict[str, Any]  # the old SSD: hotplug.record (bus, slot, wwid, serial...), bucket
    backings: list[dict[str, Any]]  # uuid, name, node, device, mode, tunables
    congested: dict[str, int] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    new: dict[str, Any] = field(default_factory=dict)  # name, wwid, serial, cset
    status: str = "running"  # running, done, failed, rolled-back
    error: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    # "bcache" (``cset`` is the cache set's UUID), "lvm" (``cset`` is the cached LV's VG/LV,
    # ``lvm`` what rebuilds its cache: procedures/replace_lvm.py) or "dmcache" (``cset`` is
    # the dm name, ``dm`` its table and areas: procedures/replace_dmcache.py)
    kind: str = "bcache"
    lvm: dict[str, Any] = field(default_factory=dict)
    dm: dict[str, Any] = field(default_factory=dict)
    # wall seconds each step took, over every attempt (a resumed or retried step adds its
    # new attempt); journals of earlier versions have none
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def steps(self) -> tuple[tuple[str, str], ...]:
        return kind_of(self.kind).steps

    @property
    def path(self):  # type: ignore[no-untyped-def]
        return state.journal_path("replace", self.id)

    def save(self) -> None:
        self.updated = time.time()
        state.write_json(self.path, asdict(self))

    @classmethod
    def load(cls, run_id: str) -> Journal:
        """The journal of run ``run_id``: UsageError (exit 2) if there is none, StateFileError
        (exit 2, its path and why) if it cannot be read."""
        j = cls.read(state.journal_path("replace", run_id))
        if j is None:
            raise UsageError(f"no replacement run {run_id!r}",
                             hint="cachemgr replace-ssd --list shows the journaled runs")
        return j

    @classmethod
    def read(cls, path: Path) -> Journal | None:
        """The journal in ``path`` (None if there is no file), checked field by field."""
        data = state.read_json(path)
        if data is None:
            return None
        if isinstance(data.get("done"), list):
            data["done"] = [RENAMED_STEPS.get(s, s) if isinstance(s, str) else s
                            for s in data["done"]]
        problem = _journal_problem(data)
        if problem is None and state.journal_path("replace", data["id"]) != path:
            problem = f"it is the journal of run {data['id']!r}, not of its file name"
        if problem is not None:
            raise state.StateFileError(path, f"not a replace-ssd journal: {problem}")
        return cls(**data)

    def named_by(self, spec: str) -> bool:
        """``spec``, spelt as replace-ssd takes its CACHE, names this run's cache or its old
        SSD; told from the journal alone, so it holds once the old SSD is gone."""
        spec = spec.strip()
        if not spec:
            return False
        if self.kind == "lvm":
            from cachemgr.backends.lvm import command

            if command.spelling(spec) == self.cset:
                return True
        elif self.kind == "dmcache":
            if spec.removeprefix("/dev/mapper/") == self.cset:
                return True
        elif spec.lower() == self.cset.lower():
            return True
        old = self.old
        wwid = str(old.get("wwid") or "")
        if spec in {old.get("node"), old.get("name"), f"/dev/{old.get('name')}"}:
            return True
        return bool(wwid) and normalize_wwn(spec.removeprefix("wwn:")) == wwid

    def same_cache(self, other: Journal) -> bool:
        """``other`` works on this run's cache or on its old SSD."""
        if (self.kind, self.cset) == (other.kind, other.cset):
            return True
        mine, theirs = self.old.get("wwid"), other.old.get("wwid")
        return bool(mine) and mine == theirs

    def took(self, step: str, seconds: float) -> None:
        """Add ``seconds`` of wall time to ``step`` (saved with the next save)."""
        self.seconds[step] = round(self.seconds.get(step, 0.0) + seconds, 3)

    def mark(self, step: str) -> None:
        if step not in self.done:
            self.done.append(step)
        self.save()
        if os.environ.get(KILL_AFTER_ENV) == step:
            os.kill(os.getpid(), signal.SIGKILL)


_JOURNAL_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "cset": (str,), "options": (dict,), "old": (dict,), "backings": (list,),
    "congested": (dict,), "done": (list,), "new": (dict,), "status": (str,),
    "error": (str, type(None)), "created": (int, float), "updated": (int, float),
    "kind": (str,), "lvm": (dict,), "dm": (dict,), "seconds": (dict,)}
_OPTION_NAMES = frozenset(Options.__dataclass_fields__)
STATUSES = ("running", "done", "failed", "rolled-back")


def _journal_problem(data: dict[str, Any]) -> str | None:
    """Why ``data`` is not a journal this cachemgr can act on (None if it is one)."""
    unknown = sorted(set(data) - set(_JOURNAL_TYPES))
    if unknown:
        return f"unknown fields {unknown} (written by a newer cachemgr?)"
    for name in ("id", "cset", "options", "old", "backings"):
        if name not in data:
            return f"no {name!r}"
    for name, value in data.items():
        if not isinstance(value, _JOURNAL_TYPES[name]) or isinstance(value, bool):
            return f"{name!r} is a {type(value).__name__}"
    if not data["id"] or not data["cset"]:
        return "an empty 'id' or 'cset'"
    if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
               and v >= 0 for k, v in data.get("seconds", {}).items()):
        return "'seconds' is not a map of step names to seconds"
    if data.get("status", "running") not in STATUSES:
        return f"unknown status {data['status']!r}"
    if not set(data["options"]) <= _OPTION_NAMES:
        return f"unknown options {sorted(set(data['options']) - _OPTION_NAMES)}"
    if not isinstance(data["options"].get("new", "same"), str):
        return "option 'new' is not a string"
    if data.get("kind", "bcache") not in KIND_NAMES:
        return f"unknown kind {data['kind']!r}"
    names = [n for n, _ in kind_of(data.get("kind", "bcache")).steps]
    if any(s not in names for s in data.get("done", [])):
        return f"unknown steps in 'done': {data['done']}"
    for b in data["backings"]:
        if not (isinstance(b, dict) and isinstance(b.get("uuid"), str)
                and isinstance(b.get("tunables", {}), dict)
                and all(k in b for k in ("name", "node", "device", "mode"))):
            return f"a backing device entry {b!r} lacks uuid, name, node, device or mode"
    return None


def scan_runs() -> tuple[list[Journal], list[state.StateFileError]]:
    """Every journaled run (oldest first) and every journal that cannot be read."""
    d = state.state_dir() / "replace"
    if not d.is_dir():
        return [], []
    found: list[Journal] = []
    bad: list[state.StateFileError] = []
    for p in sorted(d.glob("*.json")):
        try:
            j = Journal.read(p)
        except state.StateFileError as exc:
            bad.append(exc)
            continue
        if j is not None:
            found.append(j)
    return sorted(found, key=lambda j: j.created), bad


def list_runs() -> list[Journal]:
    """The readable journaled runs, oldest first (:func:`scan_runs` also gives the others)."""
    return scan_runs()[0]


# --------------------------------------------------------------------------------- context


@dataclass
class Ctx:
    sysfs: Sysfs
    j: Journal
    opts: Options
    say: Say
    prompt: Prompt

    def snap(self) -> Snapshot:
        return snapshot.take(self.sysfs)

    def backing(self, uuid: str, snap: Snapshot | None = None) -> BcacheBacking:
        snap = snap or self.snap()
        for b in snap.backings:
            if b.uuid == uuid:
                return b
        raise CacheMgrError(f"backing device {uuid} is no longer registered",
                            hint="register it again (echo DEV > /sys/fs/bcache/register), "
                                 f"then cachemgr replace-ssd --resume {self.j.id}")

    def dev(self, entry: dict[str, Any]) -> str:
        return str(entry.get("device") or entry["node"])


def _stable(b: BcacheBacking) -> str:
    if not b.uuid:
        raise UnsafeError(f"{b.device or b.identity.node} has no bcache UUID to follow it by")
    return b.uuid


# --------------------------------------------------------------------------------- planning


def plan(sysfs: Sysfs, cache: str, opts: Options) -> Journal:
    """Preflight and remember: everything is checked before anything is changed."""
    if opts.interim_mode not in (CacheMode.NONE.value, CacheMode.WRITETHROUGH.value,
                                 CacheMode.WRITEAROUND.value):
        raise UsageError(f"interim mode {opts.interim_mode!r} would keep making dirty data",
                         hint="use none (default), writearound or writethrough")
    snap = snapshot.take(sysfs, probe_unregistered=True)
    cset = resolve_cache_set(snap, cache, sysfs)
    bcache_super.refuse_orphaned_dirt(snap, cset.uuid)
    bcache_super.refuse_unreadable(sysfs, cset.uuid, "replacing the SSD")
    if len(cset.caches) != 1:
        raise UnsafeError(f"cache set {cset.uuid} has {len(cset.caches)} cache devices; "
                          "replace-ssd handles sets with exactly one")
    ssd = cset.caches[0]
    disk = hotplug_disk(sysfs, ssd.identity.name, ssd.identity.node)
    refuse_unpullable(sysfs, disk, ssd.identity.name)
    if cset.flash_volumes:
        raise UnsafeError(f"cache set {cset.uuid} holds {cset.flash_volumes} flash volume(s): "
                          "their data lives only on the SSD",
                          hint="move their data off and remove them first")
    attached = [b for b in snap.backings if b.cset_uuid == cset.uuid]
    names = set(cset.backing_names)
    if {b.identity.name for b in attached} != names:
        raise UnsafeError(f"cache set {cset.uuid} lists backing devices {sorted(names)} that "
                          "are not all readable here")
    for b in attached:
        _stable(b)
        if b.state == CacheState.INCONSISTENT:
            raise UnsafeError(f"{b.device}: state inconsistent; do not touch its cache")
        if b.writeback_running is False:
            raise UnsafeError(f"{b.device}: writeback is switched off, so it cannot drain",
                              hint=f"cachemgr tune {b.device} writeback_running=1")
    if ssd.io_errors:
        log.warning("%s has %d IO errors (a worn SSD: replacing it is right)",
                    ssd.identity.node, ssd.io_errors)
    old_id = _old_match(disk)
    twins = [d.node for d in hotplug.disks(sysfs) if old_id.matches(d) and d.name != disk.name]
    if twins:
        raise UnsafeError(f"{disk.node} cannot be told apart from {', '.join(twins)}: they "
                          f"share its {old_id}; the replacement finds the old SSD again by it "
                          "after the cache set is gone",
                          hint="replace this SSD by hand (docs/admin-guide.md, the runbook)")
    _check_new_spec(sysfs, opts.new, disk, cset.uuid, ssd.bucket_size.low
                    if ssd.bucket_size else None)
    if opts.new == "any" and not opts.yes and not sys.stdin.isatty():
        raise UsageError("--new any needs an operator to swap the disk",
                         hint="run it on a terminal, or pass --yes once the disk is in")
    run_id = new_run_id(cset.uuid[:8])
    j = Journal(
        id=run_id,
        cset=cset.uuid,
        options=asdict(opts),
        old={**hotplug.record(disk),
             "bucket": ssd.bucket_size.low if ssd.bucket_size else None},
        backings=[{
            "uuid": _stable(b), "name": b.identity.name, "node": b.identity.node,
            "device": b.device, "mode": b.mode.value if b.mode else None,
            "tunables": _tunables(b),
        } for b in attached],
        congested={k: v for k, v in (
            ("congested_read_threshold_us", cset.congested_read_threshold_us),
            ("congested_write_threshold_us", cset.congested_write_threshold_us),
        ) if v is not None},
    )
    return j


def new_run_id(tag: str) -> str:
    """A run id not taken yet: the time and ``tag`` (a second run in the same second: -2...)."""
    base = time.strftime("%Y%m%d-%H%M%S") + "-" + tag
    run_id, n = base, 1
    while state.journal_path("replace", run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id


NEW_HINT = ("--new same (the old SSD re-inserted), any (the disk an operator puts in its slot), "
            "/dev/sdX or /dev/nvmeXnY (a disk that is there now), wwn:WWN, serial:SERIAL, "
            "H:C:T:L (a SCSI slot) or a PCI address (an NVMe slot)")


def hotplug_disk(sysfs: Sysfs, name: str, node: str) -> hotplug.Disk:
    """The SCSI disk or NVMe namespace the cache SSD ``name`` is; UsageError (exit 2) for
    any other device: replace-ssd pulls and re-inserts only those."""
    try:
        return hotplug.disk(sysfs, name)
    except CacheMgrError as exc:
        raise UsageError(f"{node} is neither a SCSI disk nor an NVMe namespace; replace-ssd "
                         "removes and re-inserts only those", hint=exc.hint) from exc


def refuse_unpullable(sysfs: Sysfs, disk: hotplug.Disk, member: str | None) -> None:
    """Refuse (exit 3, at plan time) an SSD that could not be pulled once its cache is
    released: another use of it or of its partitions (a mounted file system, swap, a
    holder), an NVMe controller that is not a PCIe function or carries another namespace.
    ``member``: the cache device (the disk or a partition); None: every use of the disk is
    the cache's (an LVM PV), only its controller is checked."""
    why = hotplug.removal_refusals_besides(sysfs, disk, member)
    if why:
        raise UnsafeError(f"{disk.node} could not be pulled after its cache is released: "
                          + "; ".join(why),
                          hint="replace-ssd takes out the whole disk (NVMe: the whole "
                               "controller); move what else lives on it first")


def _old_match(old: hotplug.Disk | dict[str, Any]) -> hotplug.Match:
    """How the old SSD is found again after its cache set is gone (wipe-old, remove-old,
    --new same): its WWID, else its serial. Neither: refused (exit 3), as nothing would
    tell it from another disk once it is removed; no step is skipped for want of one."""
    wwid: str | None
    serial: str | None
    if not isinstance(old, dict):
        wwid, serial, node = old.wwid, old.serial, old.node
    else:
        wwid, serial, node = old.get("wwid"), old.get("serial"), str(old.get("node"))
    if wwid:
        return hotplug.Match("wwn", normalize_wwn(wwid) or wwid)
    if serial:
        return hotplug.Match("serial", serial)
    raise UnsafeError(f"{node} has neither a WWID nor a serial number: after its cache set is "
                      "gone nothing would tell it from another disk, so replace-ssd could not "
                      "find it again to wipe, remove or re-insert it",
                      hint="replace this SSD by hand (docs/admin-guide.md, the runbook)")


def new_match(new: str) -> hotplug.Match | None:
    """What ``--new`` names: None for same, any and /dev paths (checked apart), else the
    DiskMatch the new disk is waited for by. UsageError (exit 2) for a value that can never
    name a disk (empty, ``wwn:`` or ``serial:`` with nothing after, a wwn: that is no WWN)."""
    if new in ("same", "any") or new.startswith("/dev/"):
        return None
    t = new.strip()
    if not t:
        raise UsageError("--new is empty", hint=NEW_HINT)
    for prefix in ("wwn:", "serial:"):
        if t.lower().startswith(prefix):
            value = t[len(prefix):].strip()
            if not value:
                raise UsageError(f"--new {new} names no {prefix[:-1]}", hint=NEW_HINT)
            if prefix == "serial:":
                return hotplug.Match("serial", value)
            if not looks_like_wwn(value):
                raise UsageError(f"--new {new}: {value!r} is not a WWN (naa.…, eui.…, 0x…, "
                                 "t10.…, nvme.…)", hint=NEW_HINT)
            return hotplug.Match("wwn", normalize_wwn(value) or value)
    return hotplug.Match.parse(t)


def _check_new_spec(sysfs: Sysfs, new: str, old: hotplug.Disk, cset: str,
                    bucket: int | None, need_bytes: int | None = None) -> None:
    """Refuse at plan time a --new that cannot finish: one that names nothing, the old SSD
    (but for same/any), several disks, or a disk there now that identify-new would refuse."""
    if new in ("same", "any"):
        return
    if new.startswith("/dev/"):
        name = _block_name(sysfs, new)
        if name is None:
            raise UsageError(f"--new {new}: no such block device",
                             hint="a /dev path must name a disk that is there now (kernel "
                                  "names change as disks come and go); for a disk not inserted "
                                  "yet use --new wwn:WWN, serial:SERIAL or any")
        if name == old.name:
            raise UsageError(f"--new {new} is the SSD being replaced",
                             hint="use --new same to re-insert the same SSD")
        try:
            disk = hotplug.disk(sysfs, name)
        except CacheMgrError as exc:
            raise UsageError(f"--new {new}: {exc.message}", hint=NEW_HINT) from None
        refuse_new_disk(sysfs, disk, same=False, old=_old_dict(old), cset=cset, bucket=bucket,
                        probe=sysfs.live, need_bytes=need_bytes)
        return
    match = new_match(new)
    assert match is not None
    found = hotplug.find(sysfs, match)
    if match.kind == "slot":  # the old SSD's slot: it is there until remove-old
        found = [d for d in found if d.name != old.name]
    if len(found) > 1:
        raise UsageError(f"--new {new} matches {len(found)} disks: "
                         + "; ".join(d.describe() for d in found), hint=NEW_HINT)
    if found:
        if found[0].name == old.name:
            raise UsageError(f"--new {new} is the SSD being replaced ({old.describe()})",
                             hint="use --new same to re-insert the same SSD")
        refuse_new_disk(sysfs, found[0], same=False, old=_old_dict(old), cset=cset,
                        bucket=bucket, probe=sysfs.live, need_bytes=need_bytes)


def _block_name(sysfs: Sysfs, path: str) -> str | None:
    """The kernel name of /dev path ``path``: /dev/NAME of a block device in sysfs is its
    node (devtmpfs; as the target resolvers, so a captured tree answers too), any other
    path by its major:minor."""
    base = path.removeprefix("/dev/")
    if "/" not in base and base in sysfs.block_names():
        return base
    return sysfs.block_name_of(path)


def _old_dict(d: hotplug.Disk) -> dict[str, Any]:
    return {"wwid": d.wwid, "serial": d.serial, "size_bytes": d.size_bytes}


def refuse_new_disk(sysfs: Sysfs, d: hotplug.Disk, *, same: bool, old: dict[str, Any],
                    cset: str, bucket: int | None, probe: bool = True,
                    need_bytes: int | None = None) -> None:
    """Refuse (exit 3) a disk that must not become the new cache: the old SSD when a new one
    was asked for, a disk in use, one carrying a signature (but for the old SSD's own
    bcache one when it is re-inserted), or one too small. At plan time and at identify-new.
    ``probe``: read its signatures (wipefs, bcache-super-show on its /dev node).
    ``need_bytes``: the size an LVM cache needs (else a bcache cache's bucket count)."""
    old_serial, old_wwid = old.get("serial"), old.get("wwid")
    if not same and ((old_wwid and d.wwid == old_wwid)
                     or (old_serial and d.serial == old_serial)):
        raise UnsafeError(f"{d.describe()} is the old SSD, but a new one was asked for",
                          hint="insert the new SSD, or use --new same to reuse the old one")
    reasons = hotplug.in_use(sysfs, d)
    if reasons:
        raise UnsafeError(f"{d.node} is in use: {'; '.join(reasons)}; refusing it as the new "
                          "cache")
    if probe:
        sig = signatures.first(d.node)
        if sig is not None and not (same and sig == "bcache"):
            raise UnsafeError(f"{d.node} carries a {sig} signature; refusing to format it",
                              hint="check it is the right disk; wipe it deliberately "
                                   "(wipefs -a)")
        if sig == "bcache" and same:
            sb = _super(d.node)
            if sb.get("cset.uuid") not in (None, cset):
                raise UnsafeError(f"{d.node} belongs to another cache set "
                                  f"{sb.get('cset.uuid')}")
    if need_bytes is not None:
        if d.size_bytes is None or d.size_bytes < need_bytes:
            raise UnsafeError(f"{d.node} ({d.size_bytes} bytes) is too small for the cache "
                              f"(it needs {need_bytes} bytes)")
        return
    bucket = int(bucket or 512 * 1024)
    if d.size_bytes is None or d.size_bytes < MIN_BUCKETS * bucket:
        raise UnsafeError(f"{d.node} ({d.size_bytes} bytes) is too small for a bcache cache "
                          f"with {bucket}-byte buckets (needs {MIN_BUCKETS} buckets)")


def _tunables(b: BcacheBacking) -> dict[str, int]:
    vals: dict[str, int | None] = {
        "writeback_percent": b.writeback_percent,
        "writeback_delay": b.writeback_delay,
        "writeback_rate_minimum": b.writeback_rate_minimum,
        "sequential_cutoff": b.sequential_cutoff.low if b.sequential_cutoff else None,
        "writeback_running": None if b.writeback_running is None else int(b.writeback_running),
    }
    return {k: v for k, v in vals.items() if v is not None}


def new_words(j: Journal) -> str:
    """What --new asks for, in words."""
    old = j.old
    new = str(j.options["new"])
    return {"same": f"the same SSD re-inserted ({old['wwid'] or 'serial ' + str(old['serial'])})",
            "any": f"a new disk in the same slot ({hotplug.slot_words(old)}) (operator swap)",
            }.get(new, new)


def ssd_words(old: dict[str, Any]) -> str:
    """The old SSD of a journal, for the plan's head: node, slot, identity."""
    return (f"{old['node']} ({hotplug.slot_words(old)}; {old['wwid']}, serial "
            f"{old['serial']})")


def _head(j: Journal) -> list[str]:
    old = j.old
    devs = ", ".join(f"{b['device'] or b['node']} ({b['mode']})" for b in j.backings) or "none"
    return [f"replace the cache SSD {ssd_words(old)} of cache set {j.cset}",
            f"backing devices: {devs}"]


def describe(j: Journal) -> list[str]:
    """The plan in full, as --dry-run prints it: the kind's own head, then what every kind
    says (the new SSD, the hotplug method), then the steps."""
    o = j.options
    lines = [*kind_of(j.kind).head(j), f"new SSD: {new_words(j)}",
             f"hotplug: {hotplug.method_words(j.old)}", ""]
    for i, (name, text) in enumerate(j.steps, 1):
        extra = ""
        if name == "mode-interim":
            extra = f" ({o['interim_mode']})"
        elif name == "wipe-old" and not o["wipe_old"]:
            extra = " (skipped: --keep-old-signature)"
        lines.append(f"{i:2d}. {name:<13} {text}{extra}")
    return lines


# --------------------------------------------------------------------------------- steps


def s_mode_interim(c: Ctx) -> None:
    snap = c.snap()
    mode = CacheMode(c.opts.interim_mode)
    for e in c.j.backings:
        b = c.backing(e["uuid"], snap)
        if b.cset_uuid != c.j.cset:
            continue  # already detached in an earlier run
        try:
            bcache.set_mode(c.sysfs, b, mode)
            c.say(f"{c.dev(e)}: mode {b.mode} -> {mode}")
        except AlreadyError:
            pass


def drain_reporter(say: Say) -> Callable[[DrainProgress], None]:
    """A drain's progress callback that says the dirty amount and ETA every 2 s at most."""
    last = [0.0]

    def report(p: DrainProgress) -> None:
        if time.monotonic() - last[0] >= 2:
            last[0] = time.monotonic()
            say(f"drain {p.device}: dirty {Size.exact(p.dirty_bytes or 0)}"
                + (f", ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""))

    return report


class _Stopped(Exception):
    """A drain stopped because another one failed (or the run was interrupted)."""


def s_drain(c: Ctx) -> None:
    """Drain every attached device at the same time, each in its own thread: a drain is mostly
    waiting (for bcache's writeback thread, then the clean confirmation), and one after the
    other those waits added up (~4-6 s per device on the lab). The first failure, Ctrl-C, or
    the face's ``say`` raising (the TUI's cancel) stops the other drains at their next
    progress report (every 0.5 s); each drain restores its own tunables on the way out. So do
    SIGTERM and SIGHUP; the run's journal stays resumable (the step is not marked done)."""
    snap = c.snap()
    todo = [(e, b) for e in c.j.backings
            if (b := c.backing(e["uuid"], snap)).cset_uuid == c.j.cset]
    if not todo:
        return
    stop = threading.Event()
    say_lock = threading.Lock()

    def say(msg: str) -> None:
        with say_lock:
            c.say(msg)

    def one(e: dict[str, Any], b: BcacheBacking) -> None:
        report = drain_reporter(say)

        def prog(p: DrainProgress) -> None:
            if stop.is_set():
                raise _Stopped
            report(p)

        try:
            res = drain.drain(c.sysfs, b, timeout=c.opts.drain_timeout,
                              stall_timeout=c.opts.stall_timeout, progress=prog)
            say(f"{c.dev(e)}: clean after {res.elapsed_s:.1f} s")
        except AlreadyError:
            say(f"{c.dev(e)}: already clean")

    # SIGTERM/SIGHUP reach the main thread, waiting here, as Ctrl-C does (signals.Terminated);
    # the handlers stay until every drain has stopped and put its tunables back
    with signals.terminate_as_interrupt(), \
            ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="drain") as pool:
        # each drain acts for the run (its locks: state.acting_as, a context variable)
        futures = [pool.submit(contextvars.copy_context().run, one, e, b) for e, b in todo]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # Ctrl-C, SIGTERM or SIGHUP while waiting
            stop.set()
            raise
        errors = [exc for f in futures if f.done() and (exc := f.exception()) is not None]
        if errors:
            stop.set()  # leaving the with block waits for the others to stop and restore
            raise errors[0]


def s_detach(c: Ctx) -> None:
    for e in c.j.backings:
        b = c.backing(e["uuid"])
        if b.cset_uuid is None:
            continue
        if b.cset_uuid != c.j.cset:
            raise UnsafeError(f"{c.dev(e)} is attached to another cache set {b.cset_uuid}")
        # drained already, so the detach is quick: poll its state often (0.5 s cost ~0.5 s
        # per device on every replacement)
        bcache.detach(c.sysfs, b, timeout=c.opts.drain_timeout, interval=0.1)
        c.say(f"{c.dev(e)}: detached (passthrough, still serving IO)")


def s_unregister(c: Ctx) -> None:
    snap = snapshot.take(c.sysfs, probe_unregistered=True)
    cset = snap.cache_set(c.j.cset)
    if cset is None:
        return
    bcache_super.refuse_orphaned_dirt(snap, cset.uuid)
    bcache_super.refuse_unreadable(c.sysfs, cset.uuid, "replacing the SSD")
    bcache.unregister_cache_set(c.sysfs, cset, snap.backings)
    # The set's directory goes first; the cache device's own bcache/ directory, its holders
    # link and last its exclusive claim on the device follow a little later (a loaded lab
    # host showed each gap; wipefs then failed with EBUSY): wait for all three, or the next
    # steps would find the SSD still "in use" and refuse.
    name = c.j.old["name"]

    def released() -> bool:
        return not c.sysfs.is_dir(f"block/{name}/bcache") and not c.sysfs.listdir(
            f"block/{name}/holders") and not (c.sysfs.live and bcache.claimed(f"/dev/{name}"))

    if not bcache.wait_for(released, 60, 0.2):
        raise CacheMgrError(f"{c.j.old['node']} is still held by bcache 60 s after its cache "
                            "set was unregistered")
    c.say(f"cache set {c.j.cset} unregistered")


def _old_present(c: Ctx) -> hotplug.Disk | None:
    match = _old_match(c.j.old)
    found = hotplug.find(c.sysfs, match)
    if len(found) > 1:
        raise UnsafeError(f"{len(found)} disks have the old SSD's {match}: "
                          + "; ".join(d.describe() for d in found),
                          hint="remove the one that is not the old SSD, then resume")
    return found[0] if found else None


def s_wipe_old(c: Ctx) -> None:
    if not c.opts.wipe_old:
        c.say(f"{c.j.old['node']}: bcache signature kept (--keep-old-signature)")
        return
    d = _old_present(c)
    if d is None:
        c.say(f"the old SSD ({_old_match(c.j.old)}) is not there any more: nothing to wipe")
        return
    if not bcache.wait_for(lambda: not c.sysfs.exists(f"block/{d.name}/bcache"), 30, 0.2):
        raise UnsafeError(f"{d.node} is still registered with bcache; refusing to wipe it")
    if c.sysfs.live and not bcache.wait_for(lambda: not bcache.claimed(d.node), 30, 0.2):
        raise UnsafeError(f"{d.node} is still held by another user (an exclusive open fails "
                          "with EBUSY); refusing to wipe it")
    if signatures.first(d.node) is None:
        c.say(f"{d.node}: no signature left to wipe")
        return
    signatures.wipe(d.node)
    c.say(f"{d.node}: old bcache signature wiped")


def s_remove_old(c: Ctx) -> None:
    d = _old_present(c)
    if d is None:
        c.say(f"the old SSD ({_old_match(c.j.old)}) is not there any more: already removed")
        return
    # where it sits now (a SCSI address, a PCI function) is where its replacement is looked for
    bucket = c.j.old.get("bucket")
    c.j.old.update(hotplug.record(d), bucket=bucket)
    c.j.save()
    r = hotplug.remove(c.sysfs, d)
    c.say(f"{d.node} ({hotplug.where(d)}): {r.how}")


def _new_match(c: Ctx) -> hotplug.Match:
    """What wait-new waits for."""
    new = c.opts.new
    if new == "any":
        return hotplug.Match("slot", str(c.j.old.get("slot") or c.j.old["hctl"]))
    m = _old_match(c.j.old) if new == "same" else new_match(new)
    assert m is not None
    return m


def _find_new(c: Ctx) -> hotplug.Disk | None:
    if c.j.new.get("wwid"):
        want = c.j.new["wwid"]
        return next((d for d in hotplug.disks(c.sysfs) if d.wwid == want), None)
    new = c.opts.new
    if new.startswith("/dev/"):
        name = _block_name(c.sysfs, new)
        if name:
            try:
                return hotplug.disk(c.sysfs, name)
            except CacheMgrError as exc:
                raise UsageError(f"--new {new}: {exc.message}") from None
        return None
    found = hotplug.find(c.sysfs, _new_match(c))
    if len(found) > 1:
        raise UnsafeError(f"{len(found)} disks match --new {new}: "
                          + "; ".join(d.describe() for d in found),
                          hint="remove the ones that are not the new SSD, then resume")
    return found[0] if found else None


def s_wait_new(c: Ctx) -> None:
    if _find_new(c) is not None:
        return
    if c.opts.new != "same" and not c.opts.yes:
        c.prompt(f"Insert the new SSD (slot of the old one: {hotplug.slot_words(c.j.old)}), "
                 "then press Enter")
    c.say(hotplug.rescan(c.sysfs, c.j.old))
    if c.opts.new.startswith("/dev/"):
        if not bcache.wait_for(lambda: _find_new(c) is not None, c.opts.wait_timeout, 0.2):
            raise CacheMgrError(f"{c.opts.new} did not appear within {c.opts.wait_timeout:g} s")
        return
    d = hotplug.wait_for(c.sysfs, _new_match(c), c.opts.wait_timeout)
    c.say(f"found {d.describe()}")


def new_disk(c: Ctx) -> hotplug.Disk:
    """The new SSD, found as :func:`_find_new` does; CacheMgrError if it is gone."""
    d = _find_new(c)
    if d is None:
        raise CacheMgrError("the new SSD is not there any more",
                            hint=f"insert it and resume: cachemgr replace-ssd --resume {c.j.id}")
    return d


def s_identify_new(c: Ctx) -> None:
    d = new_disk(c)
    if c.j.new.get("wwid") == d.wwid and c.j.new.get("checked"):
        return
    refuse_new_disk(c.sysfs, d, same=c.opts.new == "same", old=c.j.old, cset=c.j.cset,
                    bucket=c.j.old.get("bucket"),
                    need_bytes=(c.j.lvm or c.j.dm).get("need_bytes"))
    if c.j.old.get("size_bytes") and d.size_bytes < c.j.old["size_bytes"]:
        c.say(f"note: {d.node} is smaller than the old SSD ({d.size_bytes} < "
              f"{c.j.old['size_bytes']} bytes)")
    c.j.new.update({**hotplug.record(d), "checked": True})
    c.j.save()
    c.say(f"new SSD: {d.describe()}")


def _super(node: str) -> dict[str, str]:
    out = runner.run(["bcache-super-show", node], check=False, timeout=30).stdout
    fields = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            fields[parts[0]] = parts[1].strip()
    return fields


def s_make_cache(c: Ctx) -> None:
    d = _find_new(c)
    if d is None:
        raise CacheMgrError("the new SSD vanished before it was formatted")
    if c.j.new.get("cset"):
        sb = _super(d.node)
        if sb.get("cset.uuid") == c.j.new["cset"]:
            return  # formatted by an earlier run
    if signatures.first(d.node) is not None:
        signatures.wipe(d.node)  # the re-inserted old cache
    bucket = int(c.j.old.get("bucket") or 512 * 1024)
    try:
        bcache.make_bcache(cache=d.node, bucket=f"{bucket // 1024}k", wipe=True, force=True)
    except CommandError as exc:
        raise CacheMgrError(f"make-bcache failed on {d.node}: {exc}") from exc
    sb = _super(d.node)
    if not sb.get("cset.uuid"):
        raise CacheMgrError(f"{d.node}: no cset.uuid after make-bcache")
    c.j.new["cset"] = sb["cset.uuid"]
    c.j.save()
    c.say(f"{d.node}: new cache set {c.j.new['cset']}")


def s_register(c: Ctx) -> None:
    if c.sysfs.is_dir(f"fs/bcache/{c.j.new['cset']}"):
        return
    d = _find_new(c)
    if d is None:
        raise CacheMgrError("the new SSD vanished before it was registered")
    try:
        bcache.register(c.sysfs, d.node)
    except AlreadyError:
        pass
    if not bcache.wait_for(lambda: c.sysfs.is_dir(f"fs/bcache/{c.j.new['cset']}"), 30):
        raise CacheMgrError(f"cache set {c.j.new['cset']} did not appear after register")


def _new_set(c: Ctx, snap: Snapshot) -> CacheSet:
    cset = snap.cache_set(c.j.new["cset"])
    if cset is None:
        raise CacheMgrError(f"the new cache set {c.j.new['cset']} is not registered")
    return cset


def s_attach(c: Ctx) -> None:
    snap = c.snap()
    cset = _new_set(c, snap)
    for e in c.j.backings:
        b = c.backing(e["uuid"], snap)
        try:
            bcache.attach(c.sysfs, b, cset)
            c.say(f"{c.dev(e)}: attached to {cset.uuid}")
        except AlreadyError:
            pass


def s_restore(c: Ctx) -> None:
    snap = c.snap()
    cset = _new_set(c, snap)
    for name, value in c.j.congested.items():
        try:
            bcache.set_cache_set_tunable(c.sysfs, cset, name, int(value))
        except AlreadyError:
            pass
    for e in c.j.backings:
        # set_mode compares with the mode read here (nothing else changes it meanwhile: the
        # run holds the lock); set_tunable reads each current value itself
        b = c.backing(e["uuid"], snap)
        if e["mode"]:
            try:
                bcache.set_mode(c.sysfs, b, CacheMode(e["mode"]))
                c.say(f"{c.dev(e)}: mode {e['mode']} restored")
            except AlreadyError:
                pass
        for name, value in e["tunables"].items():
            try:
                bcache.set_tunable(c.sysfs, b, name, int(value))
            except AlreadyError:
                pass


def s_verify(c: Ctx) -> None:
    snap = c.snap()
    problems = []
    for e in c.j.backings:
        b = c.backing(e["uuid"], snap)
        if b.cset_uuid != c.j.new["cset"]:
            problems.append(f"{c.dev(e)} is attached to {b.cset_uuid}, not the new set")
        if e["mode"] and (b.mode.value if b.mode else None) != e["mode"]:
            problems.append(f"{c.dev(e)} is in mode {b.mode}, not {e['mode']}")
        if b.state not in (CacheState.CLEAN, CacheState.DIRTY):
            problems.append(f"{c.dev(e)} is {b.state}")
        if b.device is None:
            problems.append(f"{e['node']} is not running")
    if problems:
        raise CacheMgrError("verification failed: " + "; ".join(problems))
    c.say(f"verified: {len(c.j.backings)} backing device(s) on cache set {c.j.new['cset']}")


def _rollback(c: Ctx) -> None:
    """Reattach what was detached, put the modes back."""
    snap = snapshot.take(c.sysfs)
    for e in c.j.backings:
        b = next((x for x in snap.backings if x.uuid == e["uuid"]), None)
        if b is None:
            continue
        if b.cset_uuid is None:
            cset = snap.cache_set(c.j.cset)
            if cset is not None:
                try:
                    bcache.attach(c.sysfs, b, cset)
                except AlreadyError:
                    pass
                b = bcache.reread(c.sysfs, b.identity.name)
        if e["mode"]:
            try:
                bcache.set_mode(c.sysfs, b, CacheMode(e["mode"]))
                c.say(f"{e['device'] or e['node']}: mode {e['mode']} restored")
            except AlreadyError:
                pass


STEP_FUNCS: dict[str, Callable[[Ctx], None]] = {
    "mode-interim": s_mode_interim,
    "drain": s_drain,
    "detach": s_detach,
    "unregister": s_unregister,
    "wipe-old": s_wipe_old,
    "remove-old": s_remove_old,
    "wait-new": s_wait_new,
    "identify-new": s_identify_new,
    "make-cache": s_make_cache,
    "register": s_register,
    "attach": s_attach,
    "restore": s_restore,
    "verify": s_verify,
}


@dataclass(frozen=True)
class Kind:
    """One kind of cache the procedure replaces the SSD of: its steps, how each is done,
    the step after which only finishing is safe, how a rollback undoes the earlier ones,
    and every word a face (the CLI, the TUI) says about a run of it."""

    steps: tuple[tuple[str, str], ...]
    funcs: dict[str, Callable[[Ctx], None]]
    point_of_no_return: str
    rollback: Callable[[Ctx], None]
    head: Callable[[Journal], list[str]]  # the plan's first lines
    what: str  # the cache, in messages: "cache set", "cached LV"
    # the words: every face takes them from here, never spells a kind out itself
    name: str  # the kind as people name it: "bcache cache set", "LVM cache"
    tag: str  # a run's object in a list of runs: "cset", "lv", "dm"
    tag_chars: int | None  # how much of the object a narrow list shows (None: all of it)
    stays_up: str  # what keeps serving IO while the run goes on, as a sentence
    undoes: str  # what a rollback puts back, as a sentence
    done_line: Callable[[Journal], str]  # what a finished run made, in one line
    interim_mode: bool  # the run switches to the operator's interim mode first

    def short(self, cset: str) -> str:
        """A run's object, as far as a narrow list shows it (a cache set's UUID prefix)."""
        return cset[:self.tag_chars] if self.tag_chars else cset

    def label(self, cset: str, *, short: bool = False) -> str:
        """A run's object in a list of runs: "cset 5f3c0e52", "lv vg0/vm1", "dm vc"."""
        return f"{self.tag} {self.short(cset) if short else cset}"

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.steps)

    def rollback_words(self) -> str:
        """Until when a run of this kind can be rolled back, and what then."""
        n = self.step_names.index(self.point_of_no_return) + 1
        return (f"possible only before step {n} of {len(self.steps)}, "
                f"'{self.point_of_no_return}': after it only finishing the run is safe")


def _done_line(j: Journal) -> str:
    return (f"{j.id}: done; cache set {j.new.get('cset')} on {j.new.get('node')} caches "
            + ", ".join(b["device"] or b["node"] for b in j.backings))


BCACHE = Kind(STEPS, STEP_FUNCS, POINT_OF_NO_RETURN, _rollback, _head, "cache set",
              name="bcache cache set", tag="cset", tag_chars=8,
              stays_up="The VMs' bcache devices stay up (passthrough while detached).",
              undoes="Put the modes back and re-attach what was detached.",
              done_line=_done_line, interim_mode=True)
KIND_NAMES = ("bcache", "lvm", "dmcache")


def kind_of(name: str) -> Kind:
    if name == "lvm":
        from cachemgr.procedures import replace_lvm

        return replace_lvm.KIND
    if name == "dmcache":
        from cachemgr.procedures import replace_dmcache

        return replace_dmcache.KIND
    return BCACHE


# --------------------------------------------------------------------------------- running


def _default_prompt(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
    try:
        input()
    except EOFError:
        raise UsageError("no operator input (stdin closed)",
                         hint="pass --yes when the new disk is already in") from None


def _reload(j: Journal) -> None:
    """Bring ``j`` up to its journal on disk, read while holding the cache set's lock (a
    journal read before the lock may be stale: another run may have moved it on since). A
    fresh plan has no journal yet; a journal of the same id from another run is refused."""
    disk = Journal.read(j.path)
    if disk is None:
        if j.done:
            raise UsageError(f"run {j.id}: its journal {j.path} is gone",
                             hint="cachemgr replace-ssd --list shows the journaled runs")
        return
    if (disk.cset, disk.created) != (j.cset, j.created):
        raise UsageError(f"run id {j.id} is taken by another run (journal {j.path})",
                         hint="plan again: the new run gets another id")
    for f in dataclasses.fields(Journal):
        setattr(j, f.name, getattr(disk, f.name))


def execute(sysfs: Sysfs, j: Journal, *, say: Say | None = None,
            prompt: Prompt | None = None) -> Journal:
    """Run (or resume) the steps not yet journaled as done, holding the cache's lock."""
    kind = kind_of(j.kind)
    with state.locked(f"replace-{j.cset}", f"{kind.what} {j.cset}"):
        _reload(j)
        opts = Options(**j.options)
        ctx = Ctx(sysfs, j, opts, say or (lambda m: log.info("%s", m)),
                  prompt or _default_prompt)
        if j.status == "done":
            raise AlreadyError(f"run {j.id} is already done")
        if j.status == "rolled-back":
            raise UsageError(f"run {j.id} was rolled back")
        j.status, j.error = "running", None
        for step in ("preflight", "remember"):
            if step not in j.done:
                j.mark(step)
        names = [name for name, _ in kind.steps]
        for i, step in enumerate(names, 1):
            if step in j.done:
                continue
            ctx.say(f"[{i}/{len(names)}] {step}")
            state.update_holder(step=step)  # what the lock files say: status, refusals
            t0 = time.monotonic()
            try:
                kind.funcs[step](ctx)
            except CacheMgrError as exc:
                j.took(step, time.monotonic() - t0)
                j.status, j.error = "failed", f"{step}: {exc.message}"
                j.save()
                safe = names.index(step) <= names.index(kind.point_of_no_return)
                exc.hint = ((exc.hint + "; ") if exc.hint else "") + (
                    f"fix the cause, then: cachemgr replace-ssd --resume {j.id}"
                    + (f" (or --rollback {j.id} to put modes back)" if safe else ""))
                raise
            j.took(step, time.monotonic() - t0)
            j.mark(step)
        j.status = "done"
        j.save()
    return j


def rollback(sysfs: Sysfs, j: Journal, *, say: Say | None = None) -> Journal:
    """Undo a run that stopped before its point of no return (the old cache still there)."""
    say = say or (lambda m: log.info("%s", m))
    kind = kind_of(j.kind)
    with state.locked(f"replace-{j.cset}", f"{kind.what} {j.cset}"):
        _reload(j)
        if kind.point_of_no_return in j.done:
            raise UnsafeError(f"run {j.id} is past '{kind.point_of_no_return}': the old cache "
                              "is gone, so only finishing it is safe",
                              hint=f"cachemgr replace-ssd --resume {j.id}")
        if j.status == "done":
            raise AlreadyError(f"run {j.id} finished; nothing to roll back")
        kind.rollback(Ctx(sysfs, j, Options(**j.options), say, _default_prompt))
        j.status = "rolled-back"
        j.save()
    return j
