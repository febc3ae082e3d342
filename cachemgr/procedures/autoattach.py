"""Auto-attach: bring caches and backing devices together the way the policy says.

At boot (``cachemgr autoattach``, a full pass) and on every block-device uevent (udev's
``90-cachemgr.rules`` -> ``cachemgr udev-event`` -> a queued worker), the same three steps:

1. :func:`take_view` reads the host once: the bcache objects
   (:func:`cachemgr.backends.bcache.scan`), every block device's stable identity (sysfs, the
   udev database, libblkid), the superblock
   of each unregistered bcache device (``bcache-super-show``), and which devices a procedure
   (replace-ssd, drain) is working on.
2. :func:`decide` (pure: event + view + policy -> actions) says what to do: register a bcache
   device the policy names, attach a backing device to its cache set, set its mode and
   tunables, format a blank SSD in a named slot (only with ``format_blank_ssd = true``), set
   a disk's IO scheduler (``[scheduler.NAME]``), or nothing, with a :class:`Note` saying
   why. It never detaches, never formats a backing device, and ignores devices the policy
   does not name.
3. :func:`execute` carries the actions out through the command layer's ``act`` (each by
   the cache kind it acts on), logs each with the
   device's stable id (syslog/journald through :mod:`logging`) and appends it to
   ``<state dir>/autoattach/actions.jsonl``. :func:`reconcile` repeats 1-3 until nothing is
   left to do (registering a cache makes the kernel attach the backing devices whose
   superblock names it, which the next view sees).

Idempotent by construction: every action is decided from the current state, so the same
event twice finds nothing left to do. bcache-tools' 69-bcache.rules registers bcache devices
on the same events; its registration and ours race harmlessly (EBUSY = already registered,
an :class:`~cachemgr.core.errors.AlreadyError`, logged as "already so").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, Literal

from cachemgr.backends import bcache, bcache_super, identity
from cachemgr.backends import scheduler as sched
from cachemgr.backends.dmcache import discover as dm_discover
from cachemgr.backends.dmcache import record as dm_record
from cachemgr.backends.lvm import report as lvm_report
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError, KernelFormatError, UnsafeError
from cachemgr.core.model import BcacheBacking, CacheState, Identity, Snapshot, hprint
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import kinds
from cachemgr.procedures.policy import (
    BackingPolicy,
    CachePolicy,
    DeviceId,
    LvmPolicy,
    Policy,
    SchedulerPolicy,
)

log = logging.getLogger("cachemgr.procedures.autoattach")

MAX_ROUNDS = 6
# kernel devices that never carry a cache or a backing device of ours
_SKIP_PREFIXES = ("loop", "ram", "zram", "sr", "fd", "nbd", "md")


# ---------------------------------------------------------------------------------------
# events


@dataclass(frozen=True)
class Event:
    """One uevent as udev's RUN hands it over (its environment), or a full pass (None)."""

    action: str  # add, change, remove, bind, ...
    devname: str | None  # /dev/sdb
    seqnum: int | None = None
    devpath: str | None = None
    properties: tuple[tuple[str, str], ...] = ()  # ID_* and DEVLINKS, sorted
    received: float = 0.0  # time.time() when udev-event queued it
    started: float | None = None  # time.time() when udev started the udev-event handler

    KEEP = ("ACTION", "DEVNAME", "DEVPATH", "DEVTYPE", "SEQNUM", "SUBSYSTEM", "DEVLINKS",
            "ID_FS_TYPE", "ID_FS_UUID", "ID_WWN", "ID_WWN_WITH_EXTENSION", "ID_SERIAL",
            "ID_SERIAL_SHORT", "ID_SCSI_SERIAL", "ID_PATH", "MAJOR", "MINOR")

    @classmethod
    def from_env(cls, env: Mapping[str, str], received: float | None = None,
                 started: float | None = None) -> Event:
        seq = env.get("SEQNUM", "")
        props = tuple(sorted((k, v) for k, v in env.items()
                             if k in cls.KEEP and k not in ("ACTION", "DEVNAME", "SEQNUM",
                                                            "DEVPATH")))
        return cls(
            action=env.get("ACTION", "change"),
            devname=env.get("DEVNAME") or None,
            seqnum=int(seq) if seq.isascii() and seq.isdigit() and len(seq) <= 20 else None,
            devpath=env.get("DEVPATH") or None,
            properties=props,
            received=time.time() if received is None else received,
            started=started,
        )

    def to_json(self) -> dict[str, Any]:
        return {"ACTION": self.action, "DEVNAME": self.devname or "",
                "SEQNUM": "" if self.seqnum is None else str(self.seqnum),
                "DEVPATH": self.devpath or "", **dict(self.properties),
                "_received": self.received,
                **({} if self.started is None else {"_started": self.started})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        """A queued event (cli/udev.py enqueue); KernelFormatError for a record that is not
        one (a ``_received`` or ``_started`` that is not a time)."""
        env = {str(k): str(v) for k, v in data.items() if not str(k).startswith("_")}
        return cls.from_env(env, _time_of(data, "_received", 0.0),
                            _time_of(data, "_started", None, optional=True))

    def stages(self) -> dict[str, Any]:
        """This event's entry in the action journal's pass record: when udev started the
        handler and when the handler had queued it."""
        return {"seq": self.seqnum, "action": self.action, "dev": self.name or "",
                "started": None if self.started is None else round(self.started, 3),
                "queued": round(self.received, 3)}

    @property
    def name(self) -> str | None:
        return os.path.basename(self.devname) if self.devname else None

    def prop(self, key: str) -> str | None:
        return dict(self.properties).get(key) or None

    def describe(self) -> str:
        seq = f" #{self.seqnum}" if self.seqnum is not None else ""
        return f"{self.action}{seq} {self.devname or self.devpath or '?'}"


def _time_of(data: Mapping[str, Any], key: str, default: float | None, *,
             optional: bool = False) -> float | None:
    value = data.get(key, default)
    if value is None and optional:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise KernelFormatError(f"queued udev event ({key})", repr(dict(data))) from None


# ---------------------------------------------------------------------------------------
# the view


@dataclass(frozen=True)
class DeviceFacts:
    """What one block device is, as far as auto-attach cares."""

    identity: Identity
    role: Literal["backing", "cache"] | None = None  # registered with bcache as
    cset: str | None = None  # registered: its cache set; else the superblock's cset.uuid
    sb_kind: Literal["backing", "cache"] | None = None  # unregistered bcache superblock
    bcache_uuid: str | None = None  # dev.uuid (backing_dev_uuid for a registered backing)
    sb_state: str | None = None  # unregistered backing: clean, dirty, ...
    blank: bool = False  # no signature, no partitions, not in use
    holders: bool = False
    # a whole disk's active IO scheduler; None for a partition, a bio-based device, unread
    scheduler: str | None = None

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def node(self) -> str:
        return self.identity.node

    @property
    def registered(self) -> bool:
        return self.role is not None

    @property
    def stable_id(self) -> str:
        """The name logs use: WWN, else serial, else a by-id link, else the bcache UUID."""
        i = self.identity
        if i.partition_of is None and i.wwn:
            return i.wwn
        if i.partition_of is None and i.serial:
            return f"serial:{i.serial}"
        if i.by_id:
            return i.by_id[0]
        if self.bcache_uuid:
            return f"uuid:{self.bcache_uuid}"
        return i.by_path or i.node


@dataclass(frozen=True)
class View:
    """The host as :func:`decide` sees it: the snapshot plus each device's facts."""

    snapshot: Snapshot
    devices: Mapping[str, DeviceFacts]
    busy: Mapping[str, str] = field(default_factory=dict)  # uuid/wwn/serial/VG/LV -> why
    # lvm2's report (``lvs -a``, cachemgr.backends.lvm.command.REPORT_FIELDS), read only when
    # the policy names LVM caches; None with ``lvm_error`` when it could not be read
    lvm_rows: tuple[dict[str, Any], ...] | None = None
    lvm_error: str | None = None
    # recorded dm-cache devices that are not assembled (backends/dmcache/record.py), with
    # where their devices are now; and the record files that could not be read
    dm_records: tuple[tuple[dm_record.Record, dm_record.Resolution], ...] = ()
    dm_record_errors: tuple[str, ...] = ()

    def backing(self, name: str) -> BcacheBacking | None:
        return next((b for b in self.snapshot.backings if b.identity.name == name), None)

    def event_device(self, event: Event) -> str | None:
        """The kernel name an event is about; a bcacheN event is about its backing device."""
        name = event.name
        if name and name.startswith("bcache"):
            b = next((b for b in self.snapshot.backings if b.device_name == name), None)
            return b.identity.name if b else None
        return name


def matches(dev_id: DeviceId, f: DeviceFacts) -> bool:
    """Is ``f`` the device ``dev_id`` names? WWNs and serials name whole disks only (udev
    copies a disk's ID_WWN onto its partitions)."""
    i = f.identity
    whole = i.partition_of is None
    if dev_id.kind == "wwn":
        return whole and i.wwn is not None and identity.normalize_wwn(i.wwn) == dev_id.value
    if dev_id.kind == "serial":
        return whole and i.serial == dev_id.value
    if dev_id.kind == "by-id":
        if dev_id.value in i.by_id:
            return True
        base = os.path.basename(dev_id.value)
        # without udev data there are no links, but a wwn-0x… link name carries the WWN
        return (whole and not i.by_id and base.lower().startswith("wwn-0x")
                and i.wwn is not None and identity.normalize_wwn(base) == i.wwn)
    if dev_id.kind == "by-path":
        return i.by_path == dev_id.value
    return dev_id.value in (f.bcache_uuid, i.fs_uuid)


def event_matches(dev_id: DeviceId, event: Event) -> bool:
    """For a remove event the device is gone from sysfs: match what udev told us about it."""
    links = (event.prop("DEVLINKS") or "").split()
    if dev_id.kind == "wwn":
        w = event.prop("ID_WWN_WITH_EXTENSION") or event.prop("ID_WWN")
        return event.prop("DEVTYPE") != "partition" and identity.normalize_wwn(w) == dev_id.value
    if dev_id.kind == "serial":
        return event.prop("DEVTYPE") != "partition" and dev_id.value in (
            event.prop("ID_SCSI_SERIAL"), event.prop("ID_SERIAL_SHORT"), event.prop("ID_SERIAL"))
    if dev_id.kind in ("by-id", "by-path"):
        return dev_id.value in links
    return event.prop("ID_FS_UUID") == dev_id.value


def _busy_from_journals() -> dict[str, str]:
    """Devices a procedure is working on: unfinished replace-ssd runs and drains."""
    busy: dict[str, str] = {}
    root = state.state_dir()
    for p in sorted((root / "replace").glob("*.json")) if (root / "replace").is_dir() else []:
        try:
            j = state.read_json(p) or {}
        except state.StateFileError as exc:
            log.warning("%s; the devices of that replace-ssd run are not known", exc.message)
            continue
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            if j.get("status") in ("done", "rolled-back"):
                continue
            why = f"replace-ssd run {j.get('id', p.stem)} is unfinished ({j.get('status')})"
            for key in (j.get("cset"), (j.get("new") or {}).get("cset"),
                        (j.get("old") or {}).get("wwid"), (j.get("new") or {}).get("wwid")):
                if key:
                    busy[str(key)] = why
            for b in j.get("backings") or []:
                if isinstance(b, dict) and b.get("uuid"):
                    busy[str(b["uuid"])] = why
            m = j.get("lvm")
            if isinstance(m, dict) and m.get("vg") and m.get("lv"):
                busy[f"{m['vg']}/{m['lv']}"] = why
    for p in sorted((root / "drain").glob("*.json")) if (root / "drain").is_dir() else []:
        busy[p.stem] = "a drain is in progress (or was interrupted: cachemgr drain --resume)"
    lvm_dir = root / "lvm-drain"
    for p in sorted(lvm_dir.glob("*.json")) if lvm_dir.is_dir() else []:
        try:
            lv = (state.read_json(p) or {}).get("lv")
        except (state.StateFileError, AttributeError):
            continue
        if isinstance(lv, str):
            busy[lv] = ("a drain, detach or remove of it is in progress (or was interrupted: "
                        f"cachemgr drain {lv} --resume)")
    return busy


def _lvm_report(sysfs: Sysfs) -> tuple[tuple[dict[str, Any], ...] | None, str | None]:
    from cachemgr.backends.lvm import command as lvm_command

    try:
        return tuple(lvm_command.default_source(sysfs).report()), None
    except CacheMgrError as exc:
        return None, str(exc).splitlines()[0]


def take_view(sysfs: Sysfs, *, udev: identity.UdevArg = identity.AUTO,
              probe: identity.ProbeArg = identity.AUTO,
              super_show: Callable[[str], dict[str, str] | None] | None = None,
              lvm: bool = False) -> View:
    """Read the host once. ``udev``/``probe``/``super_show`` default to the live sources;
    ``lvm``: read lvm2's report too (the policy names LVM caches)."""
    scan = bcache.scan(sysfs)
    # the objects of the kinds that scan for themselves too (kinds.scan_others): an action
    # on one of them goes to its kind, which does it or refuses it by name
    snap = Snapshot(kernel=None, bcache_loaded=scan.loaded, cache_sets=scan.cache_sets,
                    backings=scan.backings, warnings=scan.warnings,
                    others=kinds.scan_others(sysfs))
    dirs = bcache.block_dirs(sysfs)
    live = sysfs.live
    prober = identity.probe_superblock if probe is identity.AUTO and live else (
        None if probe is identity.AUTO else probe)
    show = super_show or (bcache_super.super_show if live else None)
    registered: dict[str, tuple[Literal["backing", "cache"], str | None, str | None]] = {}
    for b in scan.backings:
        registered[b.identity.name] = ("backing", b.cset_uuid, b.uuid)
    for c in scan.caches:
        registered[c.identity.name] = ("cache", c.cset_uuid, None)

    def probe_unregistered(node: str) -> identity.Superblock | None:
        name = os.path.basename(node)
        if prober is None or name in registered or name.startswith(_SKIP_PREFIXES):
            return None
        return prober(node)

    idents = identity.identify_all(sysfs, udev=udev, probe=probe_unregistered)
    devices: dict[str, DeviceFacts] = {}
    for name, ident in idents.items():
        if name.startswith(("bcache", *_SKIP_PREFIXES)):
            continue
        rel = dirs[name]
        holders = bool(sysfs.listdir(f"{rel}/holders"))
        parts = [c for c in sysfs.listdir(rel)
                 if c.startswith(name) and sysfs.exists(f"{rel}/{c}/partition")]
        if name in registered:
            role, cset, uuid = registered[name]
            devices[name] = DeviceFacts(ident, role=role, cset=cset, bcache_uuid=uuid,
                                        holders=holders)
            continue
        if ident.fs_type == "bcache":
            sb = (show(ident.node) if show else None) or {}
            version = sb.get("sb.version", "")
            kind: Literal["backing", "cache"] | None = (
                "backing" if "backing" in version else "cache" if "cache" in version else None)
            devices[name] = DeviceFacts(
                ident, sb_kind=kind, cset=sb.get("cset.uuid"),
                bcache_uuid=sb.get("dev.uuid") or ident.fs_uuid,
                sb_state=sb.get("dev.data.cache_state"), holders=holders)
            continue
        blank = (live or prober is not None) and ident.fs_type is None and not parts \
            and not holders and (ident.size_bytes or 0) > 0
        devices[name] = DeviceFacts(ident, blank=blank, holders=holders)
    for name, f in devices.items():
        if f.identity.partition_of is None:  # a whole disk: its IO scheduler
            current = sched.parse(sysfs.read_opt(f"{dirs[name]}/queue/scheduler"))[0]
            if current is not None:
                devices[name] = replace(f, scheduler=current)
    rows, err = _lvm_report(sysfs) if lvm else (None, None)
    recs, bad = dm_record.load_all()
    pending: list[tuple[dm_record.Record, dm_record.Resolution]] = []
    if recs:
        there = set(dm_discover.dm_devices(sysfs))
        todo = [r for r in recs if r.name not in there]
        ids = dm_record.identities(sysfs, idents) if todo else {}
        pending = [(r, dm_record.resolve(r, ids)) for r in todo]
    return View(snap, devices, _busy_from_journals(), rows, err, tuple(pending), tuple(bad))


# ---------------------------------------------------------------------------------------
# actions


@dataclass(frozen=True)
class Action:
    """One decision. ``device`` is the kernel name (this boot only); ``stable_id`` is what
    logs show; ``policy`` the policy entry it serves."""

    device: str
    stable_id: str
    policy: str

    kind = "action"

    def describe(self) -> str:
        raise NotImplementedError

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class Register(Action):
    role: str = "backing"
    kind = "register"

    def describe(self) -> str:
        return f"register {self.role} {self.stable_id} (/dev/{self.device}) with bcache"


@dataclass(frozen=True)
class Attach(Action):
    cset: str = ""
    kind = "attach"

    def describe(self) -> str:
        return f"attach {self.stable_id} (/dev/{self.device}) to cache set {self.cset}"


@dataclass(frozen=True)
class SetMode(Action):
    mode: str = ""
    before: str | None = None
    kind = "mode"

    def describe(self) -> str:
        return (f"set cache mode of {self.stable_id} (/dev/{self.device}) to {self.mode} "
                f"(was {self.before})")


@dataclass(frozen=True)
class SetTunable(Action):
    name: str = ""
    value: int = 0
    before: str | None = None
    kind = "tunable"

    def describe(self) -> str:
        return (f"set {self.name}={self.value} on {self.stable_id} (/dev/{self.device}) "
                f"(was {self.before})")


@dataclass(frozen=True)
class SetScheduler(Action):
    """``device`` is the whole disk (a partition the policy names stands for its disk)."""

    scheduler: str = ""
    before: str | None = None
    kind = "scheduler"

    def describe(self) -> str:
        return (f"set IO scheduler of {self.stable_id} (/dev/{self.device}) to "
                f"{self.scheduler} (was {self.before})")


@dataclass(frozen=True)
class Format(Action):
    bucket: str | None = None
    kind = "format"

    def describe(self) -> str:
        return (f"format blank SSD {self.stable_id} (/dev/{self.device}) as a bcache cache "
                f"(format_blank_ssd = true)")


@dataclass(frozen=True)
class Note(Action):
    """Nothing to do, and why (logged; changes nothing). ``refused``: something the pass
    would otherwise do and will not, for safety (a recorded dm-cache device over a disk it
    cannot prove, a record it does not trust): its outcome is "refused", and the boot pass
    exits 3."""

    message: str = ""
    level: int = logging.INFO
    refused: bool = False
    kind = "note"

    def describe(self) -> str:
        return self.message


@dataclass(frozen=True)
class LvmAttach(Action):
    """``device`` and ``stable_id`` are the LV (VG/LV); lvm2 attaches ``cache`` to it."""

    cache: str = ""
    writecache: bool = False
    mode: str | None = None
    kind = "lvm-attach"

    def describe(self) -> str:
        how = "writecache" if self.writecache else "cache"
        return (f"attach {self.cache} to {self.device} as its {how} with lvm2"
                + (f" (mode {self.mode})" if self.mode else ""))


@dataclass(frozen=True)
class LvmSetMode(Action):
    mode: str = ""
    before: str | None = None
    kind = "lvm-mode"

    def describe(self) -> str:
        return f"set cache mode of {self.device} to {self.mode} with lvm2 (was {self.before})"


@dataclass(frozen=True)
class AssembleDmCache(Action):
    """``device`` is the dm name of a recorded dm-cache device; its three devices as found
    now (the record's identities matched): ``dmsetup create`` with the recorded table."""

    origin: str = ""
    cache: str = ""
    metadata: str = ""
    mode: str = ""
    kind = "dmcache-assemble"

    def describe(self) -> str:
        return (f"assemble dm-cache {self.stable_id} ({self.mode}) over {self.origin} "
                f"(cache {self.cache}, metadata {self.metadata}) as recorded")


DMCACHE_RECORD = "dm-cache record"

_ORDER = {"dmcache-assemble": 0, "format": 0, "register": 1, "attach": 2, "lvm-attach": 2,
          "mode": 3, "lvm-mode": 3, "tunable": 4, "scheduler": 4, "note": 5}


# ---------------------------------------------------------------------------------------
# decide


class _Planner:
    def __init__(self, view: View, policy: Policy) -> None:
        self.view = view
        self.policy = policy
        self.out: list[Action] = []
        self.csets: dict[str, str | None] = {}

    def note(self, f: DeviceFacts | None, entry: str, msg: str,
             level: int = logging.INFO) -> None:
        self.out.append(Note(f.name if f else "", f.stable_id if f else "", entry, msg, level))

    def find(self, dev_id: DeviceId) -> list[DeviceFacts]:
        return [f for f in self.view.devices.values() if matches(dev_id, f)]

    def busy(self, *keys: str | None) -> str | None:
        return next((self.view.busy[k] for k in keys if k and k in self.view.busy), None)

    def cache(self, c: CachePolicy) -> str | None:
        """Plan cache ``c``; its registered cset UUID, or None while it is not there."""
        if c.name in self.csets:
            return self.csets[c.name]
        self.csets[c.name] = None
        found = self.find(c.device) if c.device else []
        if len(found) > 1:
            self.note(None, c.name, f"{c.label}: {', '.join(f.node for f in found)} all match; "
                                    "ambiguous (multipath?), doing nothing", logging.WARNING)
            return None
        if found:
            f = found[0]
            why = self.busy(f.cset, f.identity.wwn, c.cset)
            if why:
                self.note(f, c.name, f"{c.label}: leaving {f.node} alone: {why}")
                return None
            if f.role == "cache":
                if c.cset and f.cset != c.cset:
                    self.note(f, c.name, f"{c.label}: {f.node} holds cache set {f.cset}, the "
                                         f"policy says {c.cset}; not using it", logging.WARNING)
                    return None
                self.csets[c.name] = f.cset
                return f.cset
            if f.role == "backing":
                self.note(f, c.name, f"{c.label}: {f.node} is a registered bcache backing "
                                     "device, not a cache", logging.WARNING)
            elif f.sb_kind == "cache":
                if c.cset and f.cset != c.cset:
                    self.note(f, c.name, f"{c.label}: {f.node} carries cache set {f.cset}, the "
                                         f"policy says {c.cset}; not registering it",
                              logging.WARNING)
                else:
                    self.out.append(Register(f.name, f.stable_id, c.name, "cache"))
            elif f.sb_kind == "backing":
                self.note(f, c.name, f"{c.label}: {f.node} carries a bcache backing "
                                     "superblock, not a cache one; leaving it", logging.WARNING)
            elif f.blank and c.format_blank_ssd:
                self.out.append(Format(f.name, f.stable_id, c.name, c.bucket_size))
            elif f.blank:
                self.note(f, c.name, f"{c.label}: {f.node} is blank; not formatting it "
                                     "(format_blank_ssd is false)")
            elif f.holders or f.identity.fs_type:
                what = f.identity.fs_type or "holders"
                self.note(f, c.name, f"{c.label}: {f.node} is not a bcache cache ({what}); "
                                     "leaving it", logging.WARNING)
            return None
        if c.cset:
            if self.view.snapshot.cache_set(c.cset) is not None:
                self.csets[c.name] = c.cset
                return c.cset
            carriers = [f for f in self.view.devices.values()
                        if f.sb_kind == "cache" and f.cset == c.cset and not f.registered]
            if len(carriers) == 1 and not self.busy(c.cset):
                f = carriers[0]
                self.out.append(Register(f.name, f.stable_id, c.name, "cache"))
        return None

    def backing(self, b: BackingPolicy) -> None:
        found = self.find(b.device)
        if not found:
            return
        if len(found) > 1:
            self.note(None, b.name, f"{b.label}: {', '.join(f.node for f in found)} all match; "
                                    "ambiguous (multipath?), doing nothing", logging.WARNING)
            return
        f = found[0]
        why = self.busy(f.bcache_uuid, f.identity.wwn)
        if why:
            self.note(f, b.name, f"{b.label}: leaving {f.node} alone: {why}")
            return
        if f.role == "cache" or f.sb_kind == "cache":
            self.note(f, b.name, f"{b.label}: {f.node} is a bcache cache device, not a backing "
                                 "device", logging.WARNING)
            return
        if not f.registered:
            if f.sb_kind == "backing":
                self.out.append(Register(f.name, f.stable_id, b.name, "backing"))
            else:
                self.note(f, b.name, f"{b.label}: {f.node} has no bcache backing superblock; "
                                     "cachemgr never formats backing devices (make-bcache -B "
                                     "or cachemgr create)", logging.WARNING)
            return
        bk = self.view.backing(f.name)
        if bk is None:
            return
        cset = self.cache_of(b)
        if cset is not None:
            if bk.cset_uuid is None:
                if bk.state == CacheState.DIRTY:
                    self.note(f, b.name, f"{b.label}: {f.node} has dirty data for a cache set "
                                         "that is not here; attaching would discard it",
                              logging.WARNING)
                else:
                    self.out.append(Attach(f.name, f.stable_id, b.name, cset))
            elif bk.cset_uuid != cset:
                self.note(f, b.name, f"{b.label}: {f.node} is attached to cache set "
                                     f"{bk.cset_uuid}, the policy says {cset}; auto-attach "
                                     "never detaches (cachemgr detach, then attach)",
                          logging.WARNING)
        if b.mode is not None and bk.mode != b.mode:
            self.out.append(SetMode(f.name, f.stable_id, b.name, b.mode.value,
                                    bk.mode.value if bk.mode else None))
        for name, value in b.tunables:
            same, before = _tunable_is(bk, name, value)
            if not same:
                self.out.append(SetTunable(f.name, f.stable_id, b.name, name, value, before))

    def lvm(self, m: LvmPolicy) -> None:
        """Attach ``m``'s cache pool or cachevol to its LV when both are there, uncached and
        whole; set its mode. Never detaches, never repairs, never erases an LV unasked."""
        if self.view.lvm_rows is None:
            self.note(None, m.name, f"{m.label}: lvm2's report could not be read "
                                    f"({self.view.lvm_error or 'not read'}); not acting",
                      logging.WARNING)
            return
        why = self.busy(m.lv)
        if why:
            self.note(None, m.name, f"{m.label}: leaving it alone: {why}")
            return
        rows = list(self.view.lvm_rows)
        vg, lv = m.lv.split("/", 1)
        cvg, clv = m.cache.split("/", 1)
        olay = lvm_report.field(rows, vg, lv, "lv_layout").split(",")
        if olay == [""]:
            return  # not here (yet): its VG or LV is elsewhere
        if "cache" in olay or "writecache" in olay:
            pool = lvm_report.bare(lvm_report.field(rows, vg, lv, "pool_lv"))
            now = f"{vg}/{lvm_report.attached_name(pool)}"
            kind = "writecache" if "writecache" in olay else "cache"
            if now != m.cache or (kind == "writecache") != m.writecache:
                self.note(None, m.name, f"{m.label}: {m.lv} is cached by {now} ({kind}), the "
                                        f"policy says {m.cache} "
                                        f"({'writecache' if m.writecache else 'cache'}); "
                                        "auto-attach never detaches (cachemgr detach, then "
                                        "attach)", logging.WARNING)
                return
            cur = lvm_report.field(rows, vg, lv, "cache_mode") or None
            if m.mode is not None and kind == "cache" and cur != m.mode.value:
                self.out.append(LvmSetMode(m.lv, m.lv, m.name, m.mode.value, cur))
            return
        if lvm_report.partial(rows, vg, lv):
            self.note(None, m.name, f"{m.label}: {m.lv} is missing a PV; not attaching a "
                                    "cache to it", logging.WARNING)
            return
        clay = lvm_report.field(rows, cvg, clv, "lv_layout").split(",")
        if clay == [""]:
            user = lvm_report.attached_to(rows, cvg, clv)
            self.note(None, m.name, f"{m.label}: {m.cache} " + (
                f"caches {cvg}/{user} now; auto-attach never detaches" if user else
                "does not exist"), logging.WARNING)
            return
        if lvm_report.partial(rows, cvg, clv):
            self.note(None, m.name, f"{m.label}: {m.cache} is missing a PV; it is attached "
                                    "when its PV returns (lvm2 may want vgextend "
                                    "--restoremissing first: lvs shows the PV as missing)")
            return
        is_pool = "pool" in clay
        if m.writecache and is_pool:
            self.note(None, m.name, f"{m.label}: {m.cache} is a cache pool; a writecache "
                                    "takes a plain LV (cachevol)", logging.WARNING)
            return
        if not is_pool:
            if clay != ["linear"] and "striped" not in clay:
                self.note(None, m.name, f"{m.label}: {m.cache} ({','.join(clay)}) is neither "
                                        "a cache pool nor a plain LV", logging.WARNING)
                return
            if not m.erase_cachevol:
                self.note(None, m.name, f"{m.label}: {m.cache} is a plain LV: attaching it "
                                        "as a cachevol erases it; not attaching "
                                        "(erase_cachevol is false)", logging.WARNING)
                return
        self.out.append(LvmAttach(m.lv, m.lv, m.name, m.cache, m.writecache,
                                  m.mode.value if m.mode else None))

    def scheduler(self, sp: SchedulerPolicy) -> None:
        """Set the IO scheduler of the disk ``sp`` names (of its disk, for a partition)."""
        found = self.find(sp.device)
        if not found:
            return
        if len(found) > 1:
            self.note(None, sp.name, f"{sp.label}: {', '.join(f.node for f in found)} all "
                                     "match; ambiguous (multipath?), doing nothing",
                      logging.WARNING)
            return
        f = found[0]
        disk = self.view.devices.get(f.identity.partition_of or f.name)
        if disk is None:
            return
        if disk.scheduler is None:
            self.note(disk, sp.name, f"{sp.label}: {disk.node} has no IO scheduler of its "
                                     "own (bio-based); name the disks under it",
                      logging.WARNING)
        elif disk.scheduler != sp.scheduler:
            self.out.append(SetScheduler(disk.name, disk.stable_id, sp.name, sp.scheduler,
                                         disk.scheduler))

    def cache_of(self, b: BackingPolicy) -> str | None:
        c = self.policy.cache(b.cache)
        return self.cache(c) if c else None


def _tunable_is(bk: BcacheBacking, name: str, value: int) -> tuple[bool, str | None]:
    if name == "sequential_cutoff":
        cur = bk.sequential_cutoff
        if cur is None:
            return False, None
        # printed lossy (bch_hprint): equal if the wanted value lies in what the text allows
        return cur.low <= value <= cur.high or str(cur) == hprint(value), hprint(cur.low)
    got: int | bool | None = getattr(bk, name)
    if got is None:
        return False, None
    return int(got) == value, str(int(got))


def _scope(event: Event | None, view: View, policy: Policy
           ) -> tuple[list[CachePolicy], list[BackingPolicy], list[LvmPolicy],
                      list[SchedulerPolicy]]:
    if event is None:
        return (list(policy.caches), list(policy.backings), list(policy.lvms),
                list(policy.schedulers))
    name = view.event_device(event)
    f = view.devices.get(name) if name else None
    if f is None:
        return [], [], [], []
    # a PV that appears may complete an LV or a cache pool (lvm2 finds which)
    lvms = list(policy.lvms) if f.identity.fs_type == "LVM2_member" else []
    caches = [c for c in policy.caches
              if (c.device is not None and matches(c.device, f))
              or (c.cset is not None and f.cset == c.cset and (f.role or f.sb_kind) == "cache")]
    backs = [b for b in policy.backings if matches(b.device, f)]
    names = {c.name for c in caches}
    caches += [c for c in policy.caches if c.name not in names
               and any(b.cache == c.name for b in backs)]
    backs += [b for b in policy.backings if b not in backs and b.cache in names]
    # a disk's event, or one of its partitions' (a policy may name either)
    disk = view.devices.get(f.identity.partition_of or "")
    scheds = [sp for sp in policy.schedulers
              if matches(sp.device, f) or (disk is not None and matches(sp.device, disk))
              or any(matches(sp.device, p) for p in view.devices.values()
                     if p.identity.partition_of == f.name)]
    return caches, backs, lvms, scheds


def decide(event: Event | None, view: View, policy: Policy) -> list[Action]:
    """What to do about ``event`` (None: a full pass over everything the policy names).

    Pure: reads only its arguments. Devices the policy does not name give no actions; a
    remove event gives at most a note (auto-attach never detaches or stops anything).
    """
    if event is not None and event.action == "remove":
        ids: list[tuple[str, DeviceId | None]] = [
            *((c.name, c.device) for c in policy.caches),
            *((b.name, b.device) for b in policy.backings)]
        named = [n for n, d in ids if d is not None and event_matches(d, event)]
        return [Note(event.name or "", event.devname or "", n,
                     f"{event.devname} removed; nothing to do (auto-attach never detaches; it "
                     "comes back attached when it returns)") for n in named]
    caches, backs, lvms, scheds = _scope(event, view, policy)
    p = _Planner(view, policy)
    p.out += _dm_records(event, view)
    for c in caches:
        p.cache(c)
    for b in backs:
        p.backing(b)
    for m in lvms:
        p.lvm(m)
    for sp in scheds:
        p.scheduler(sp)
    seen: set[Action] = set()
    out = []
    for a in p.out:
        if a not in seen:
            seen.add(a)
            out.append(a)
    return sorted(out, key=lambda a: _ORDER[a.kind])


def _dm_records(event: Event | None, view: View) -> list[Action]:
    """Assemble each recorded dm-cache device whose three devices are present, are the
    recorded ones and are proven so (a key stronger than their place:
    backends/dmcache/record.py); a note saying which device is missing, is another one or
    is known by its place only otherwise (on a full pass always; on an event only when the
    event's device is one of the record's). Refused (the boot pass exits 3): a record that
    cannot be used, a device that is another one, one known by its place only (the
    admin's ``cachemgr assemble NAME`` assembles it); a device that is missing is waited
    for (the udev worker assembles it when it comes)."""
    out: list[Action] = []
    name = view.event_device(event) if event is not None else None
    if event is None:
        out += [Note("", "", DMCACHE_RECORD, msg, logging.ERROR, refused=True)
                for msg in view.dm_record_errors]
    for rec, res in view.dm_records:
        if res.ok:
            out.append(AssembleDmCache(rec.name, rec.node, DMCACHE_RECORD, res.nodes["origin"],
                                       res.nodes["cache"], res.nodes["metadata"],
                                       rec.mode.value))
            continue
        if event is not None and f"/dev/{name}" not in res.nodes.values():
            continue
        stale = " (writeback: its origin is stale; nothing may open it)" \
            if rec.mode.value == "writeback" else ""
        if res.found:  # every device there, some known by their place only
            out.append(Note(rec.name, rec.node, DMCACHE_RECORD,
                            f"dm-cache {rec.node} not assembled{stale}: " + "; ".join(
                                f"{role} {why}" for role, why in res.unproven)
                            + f"; {dm_record.admin_hint(rec, res)}", logging.ERROR,
                            refused=True))
            continue
        out.append(Note(rec.name, rec.node, DMCACHE_RECORD,
                        f"dm-cache {rec.node} not assembled{stale}: " + "; ".join(
                            f"{role} {why}" for role, why in res.problems),
                        logging.WARNING if res.missing else logging.ERROR,
                        refused=not res.missing))
    return out


def decide_all(events: Sequence[Event | None], view: View, policy: Policy) -> list[Action]:
    """The union of :func:`decide` over a batch of events, each action once."""
    seen: set[Action] = set()
    out: list[Action] = []
    for e in events:
        for a in decide(e, view, policy):
            if a not in seen:
                seen.add(a)
                out.append(a)
    return sorted(out, key=lambda a: _ORDER[a.kind])


# ---------------------------------------------------------------------------------------
# execute


def actions_log() -> os.PathLike[str]:
    return state.state_dir() / "autoattach" / "actions.jsonl"


def record(entry: Mapping[str, Any]) -> None:
    """Append one line to the action journal (tests and admins count what was done)."""
    line = json.dumps({"t": round(time.time(), 3), "pid": os.getpid(), **entry},
                      sort_keys=True) + "\n"
    # never through a link; run as root, only a file of root's (cachemgr/core/state.py)
    state.append(state.state_dir() / "autoattach" / "actions.jsonl", line.encode())


@dataclass
class Outcome:
    action: Action
    result: Literal["done", "already", "failed", "skipped", "dry-run", "note", "refused"]
    error: str | None = None


Act = Callable[[Sysfs, View, Action], None]


def execute(sysfs: Sysfs, view: View, actions: Iterable[Action], *, act: Act | None = None,
            dry_run: bool = False, context: Mapping[str, Any] | None = None,
            noted: set[str] | None = None) -> list[Outcome]:
    """Carry out ``actions`` in order through ``act`` (the command layer's:
    cachemgr.ops.autoattach.act, which holds the same locks and checks as the commands); log
    and journal each. Never raises for one action."""
    out: list[Outcome] = []
    ctx = dict(context or {})
    for a in actions:
        if isinstance(a, Note):
            if noted is not None and a.message in noted:
                continue
            if noted is not None:
                noted.add(a.message)
            result: Literal["note", "refused"] = "refused" if a.refused else "note"
            log.log(a.level, "%s: %s", a.policy or "policy", a.message)
            record({**ctx, **a.record(), "level": logging.getLevelName(a.level),
                    "result": result})
            out.append(Outcome(a, result))
            continue
        if dry_run:
            log.info("would %s [policy %s]", a.describe(), a.policy)
            record({**ctx, **a.record(), "result": "dry-run"})
            out.append(Outcome(a, "dry-run"))
            continue
        t0 = time.time()
        try:
            if act is None:
                raise CacheMgrError("no executor given for the autoattach actions")
            act(sysfs, view, a)
        except AlreadyError as exc:
            log.info("%s: already so (%s) [policy %s]", a.describe(), exc.message, a.policy)
            o = Outcome(a, "already")
        except UnsafeError as exc:
            log.warning("not done: %s: %s [policy %s]", a.describe(), exc.message, a.policy)
            o = Outcome(a, "skipped", exc.message)
        except CacheMgrError as exc:
            log.error("failed: %s: %s [policy %s]", a.describe(), exc, a.policy)
            o = Outcome(a, "failed", str(exc))
        else:
            log.info("%s: done [policy %s]", a.describe(), a.policy)
            o = Outcome(a, "done")
        record({**ctx, **a.record(), "result": o.result, "error": o.error,
                "took_s": round(time.time() - t0, 3)})
        out.append(o)
    return out


@dataclass
class PassResult:
    outcomes: list[Outcome]
    rounds: int
    # per round, time.time() when its view was read, its actions decided and carried out
    timeline: list[dict[str, float]] = field(default_factory=list)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == "failed"]

    @property
    def changed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == "done"]

    @property
    def refused(self) -> list[Outcome]:
        """What the pass would have done and did not, for safety: a refused note, or an
        action its command refused (UnsafeError: a busy or unproven device)."""
        return [o for o in self.outcomes if o.result in ("refused", "skipped")]


def reconcile(sysfs: Sysfs, policy: Policy, events: Sequence[Event | None], *,
              act: Act | None = None, dry_run: bool = False,
              view_fn: Callable[[Sysfs], View] | None = None,
              max_rounds: int = MAX_ROUNDS) -> PassResult:
    """Decide and execute (through ``act``) until nothing is left to do (or ``max_rounds``)."""
    take = view_fn or partial(take_view, lvm=bool(policy.lvms))
    outcomes: list[Outcome] = []
    noted: set[str] = set()
    tried: set[Action] = set()
    seqs = [e.seqnum for e in events if e is not None and e.seqnum is not None]
    ctx = {"events": len(events), "seqnums": seqs[:50]}
    rounds = 0
    timeline: list[dict[str, float]] = []
    for rounds in range(1, max_rounds + 1):  # noqa: B007
        view = take(sysfs)
        stamp = {"view": time.time()}
        timeline.append(stamp)
        actions = decide_all(events, view, policy)
        stamp["decided"] = time.time()
        todo = [a for a in actions if not isinstance(a, Note) and a not in tried]
        outcomes += execute(sysfs, view, [a for a in actions if isinstance(a, Note)],
                            context=ctx, noted=noted)
        if not todo:
            break
        tried.update(todo)
        outcomes += execute(sysfs, view, todo, act=act, dry_run=dry_run, context=ctx)
        stamp["acted"] = time.time()
        if dry_run:
            break
    return PassResult(outcomes, rounds, [{k: round(v, 3) for k, v in t.items()}
                                         for t in timeline])
