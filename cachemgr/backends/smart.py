"""SSD health from smartmontools: ``smartctl --json -a`` (the one wrapper), read rarely and
cached.

A worn cache SSD is what starts a replacement, so status (JSON), the TUI detail, the metrics
and the replacement plan show each cache SSD's health: how much of its rated endurance is
used, media and data-integrity errors, the spare area against its threshold, the drive's own
verdict. The SMART data is smartctl's JSON (``--json``, smartmontools >= 7.0), never a parse
of raw SMART pages here: smartctl knows the protocols (ATA, SCSI, NVMe) and its drive database
names the vendors' attributes. The fields cachemgr picks, per protocol (docs/kernel-notes.md,
"SSD health from smartctl"):

* wear (percent of the rated endurance used, 0 new, may pass 100): NVMe
  ``nvme_smart_health_information_log.percentage_used``; SCSI/SAS
  ``scsi_percentage_used_endurance_indicator``; ATA the device statistics' "Percentage Used
  Endurance Indicator" when the output has it, else 100 minus the normalized value of the
  first wear attribute smartctl's database names (``Wear_Leveling_Count``,
  ``Media_Wearout_Indicator``, ``Percent_Lifetime_Remain``, ``SSD_Life_Left``,
  ``Percent_Life_Remaining``): each counts down from 100 as the flash wears.
* media errors: NVMe ``media_errors`` ("Media and Data Integrity Errors"); SCSI the
  uncorrected read, write and verify errors; ATA the raw counts of ``Reported_Uncorrect``,
  ``Uncorrectable_Error_Cnt`` and ``Offline_Uncorrectable``.
* spare: NVMe ``available_spare`` and ``available_spare_threshold``; ATA
  ``Available_Reservd_Space`` / ``Reserved_Block_Pct`` (normalized value and threshold).
* ``smart_status.passed`` (the drive's overall verdict) and NVMe ``critical_warning``.

SMART commands cost (they reach the drive's firmware), so :func:`lookup` runs smartctl at
most once per :data:`MAX_AGE` seconds per disk and keeps the answer in
``<state dir>/smart/<WWID or serial>.json`` (the raw JSON, parsed on every read), keyed by the
disk's stable identity, not its kernel name. A failed run is kept too (no retry before
MAX_AGE). Callers that must not run it (a metrics scrape) pass ``refresh=False`` and get what
is there, however old: its ``read_at`` says when it was read. Nothing here is on the snapshot's
per-poll path: the snapshot never asks for health.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.backends import hotplug
from cachemgr.core import runner, state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import Identity, Snapshot
from cachemgr.core.sysfs import Sysfs

MAX_AGE = 600.0  # seconds between two smartctl runs for one disk
TIMEOUT = 60.0
WEAR_LIMIT = 90  # percent used from which the plan, status and the alert say "replace soon"

# smartctl(8) "RETURN VALUES": bits 0-1 mean no answer (the command line did not parse; the
# device could not be opened or did not identify itself). Bit 2 (a SMART command failed or a
# checksum was wrong) still comes with what the other commands read, and bits 3-7 report what
# the answer says: those documents are read.
_FATAL_BITS = 0b011
_WEAR_ATTRS = ("Wear_Leveling_Count", "Media_Wearout_Indicator", "Percent_Lifetime_Remain",
               "SSD_Life_Left", "Percent_Life_Remaining")
_MEDIA_ATTRS = ("Reported_Uncorrect", "Uncorrectable_Error_Cnt", "Offline_Uncorrectable")
_SPARE_ATTRS = ("Available_Reservd_Space", "Reserved_Block_Pct")


@dataclass(frozen=True)
class Health:
    """One disk's health as smartctl answered (or why it did not)."""

    node: str  # the node smartctl was asked about: /dev/nvme0n1, /dev/sdc
    read_at: float  # when (Unix time)
    error: str | None = None  # no usable answer: why
    protocol: str | None = None  # NVMe, ATA, SCSI
    model: str | None = None
    serial: str | None = None
    passed: bool | None = None  # smart_status.passed: the drive's own verdict
    wear_percent: int | None = None  # of the rated endurance used (0 new; may pass 100)
    wear_source: str | None = None  # where wear_percent comes from, in smartctl's words
    media_errors: int | None = None
    spare_percent: int | None = None
    spare_threshold_percent: int | None = None
    critical_warning: int | None = None  # NVMe bit mask (0: none)
    power_on_hours: int | None = None
    temperature_celsius: int | None = None
    warnings: tuple[str, ...] = field(default=())  # why to replace it soon (empty: no reason)

    @property
    def replace_soon(self) -> bool:
        return bool(self.warnings)

    def words(self) -> str:
        """One line: ``wear 75 %, media errors 0, spare 99 % (threshold 10 %), SMART passed``."""
        if self.error:
            return f"no SMART data ({self.error})"
        parts = [f"wear {self.wear_percent} %" if self.wear_percent is not None
                 else "wear unknown"]
        if self.media_errors is not None:
            parts.append(f"media errors {self.media_errors}")
        if self.spare_percent is not None:
            parts.append(f"spare {self.spare_percent} % (threshold "
                         f"{self.spare_threshold_percent} %)")
        if self.passed is not None:
            parts.append("SMART " + ("passed" if self.passed else "FAILED"))
        line = ", ".join(parts)
        if self.warnings:
            line += "; replace soon: " + "; ".join(self.warnings)
        return line


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _total(counts: list[int | None]) -> int | None:
    """The sum of the counts the drive reported (None: it reported none of them)."""
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _attrs(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """ATA attributes by smartctl's name (the first of a name wins)."""
    table = (doc.get("ata_smart_attributes") or {}).get("table") or []
    out: dict[str, Mapping[str, Any]] = {}
    for a in table:
        if isinstance(a, dict) and isinstance(a.get("name"), str):
            out.setdefault(a["name"], a)
    return out


def _devstat_used(doc: Mapping[str, Any]) -> int | None:
    for page in (doc.get("ata_device_statistics") or {}).get("pages") or []:
        for row in page.get("table") or [] if isinstance(page, dict) else []:
            if isinstance(row, dict) and row.get("name") == "Percentage Used Endurance Indicator":
                return _int(row.get("value"))
    return None


def parse(node: str, doc: Mapping[str, Any], read_at: float) -> Health:
    """smartctl's JSON document -> Health (fields absent from it stay None)."""
    ctl = doc.get("smartctl") or {}
    exit_status = _int(ctl.get("exit_status")) or 0
    if exit_status & _FATAL_BITS:
        msgs = [str(m["string"]) for m in ctl.get("messages") or []
                if isinstance(m, dict) and isinstance(m.get("string"), str)]
        return Health(node, read_at, error="; ".join(msgs) or f"smartctl exit {exit_status}")
    dev = doc.get("device") or {}
    protocol = dev.get("protocol") if isinstance(dev.get("protocol"), str) else None
    status = doc.get("smart_status") or {}
    passed = status.get("passed") if isinstance(status.get("passed"), bool) else None
    wear = source = media = spare = thresh = crit = None
    nv = doc.get("nvme_smart_health_information_log")
    if isinstance(nv, dict):
        wear, source = _int(nv.get("percentage_used")), "NVMe percentage_used"
        media = _int(nv.get("media_errors"))
        spare, thresh = _int(nv.get("available_spare")), _int(nv.get("available_spare_threshold"))
        crit = _int(nv.get("critical_warning"))
    elif protocol == "SCSI":
        wear = _int(doc.get("scsi_percentage_used_endurance_indicator"))
        source = "SCSI percentage used endurance indicator" if wear is not None else None
        log = doc.get("scsi_error_counter_log") or {}
        media = _total([_int((log.get(k) or {}).get("total_uncorrected_errors"))
                        for k in ("read", "write", "verify")])
    else:
        attrs = _attrs(doc)
        wear = _devstat_used(doc)
        if wear is not None:
            source = "ATA device statistics: Percentage Used Endurance Indicator"
        else:
            for name in _WEAR_ATTRS:
                v = _int((attrs.get(name) or {}).get("value"))
                if v is not None:
                    wear, source = max(0, 100 - v), f"ATA attribute {name} (100 - normalized)"
                    break
        media = _total([_int(((attrs.get(n) or {}).get("raw") or {}).get("value"))
                        for n in _MEDIA_ATTRS])
        for name in _SPARE_ATTRS:
            a = attrs.get(name)
            if a is not None:
                spare, thresh = _int(a.get("value")), _int(a.get("thresh"))
                break
    temp = _int((doc.get("temperature") or {}).get("current"))
    hours = _int((doc.get("power_on_time") or {}).get("hours"))
    warnings: list[str] = []
    if passed is False:
        warnings.append("the drive's SMART self-assessment failed")
    if wear is not None and wear >= WEAR_LIMIT:
        warnings.append(f"{wear} % of its rated endurance used")
    # strictly below: qemu's emulated NVMe reports spare 0 with threshold 0 (new, not worn)
    if spare is not None and thresh is not None and spare < thresh:
        warnings.append(f"spare {spare} % below its threshold {thresh} %")
    if crit:
        warnings.append(f"NVMe critical warning 0x{crit:02x}")
    if media:
        warnings.append(f"{media} media/data integrity errors")
    return Health(node, read_at, protocol=protocol,
                  model=doc.get("model_name") if isinstance(doc.get("model_name"), str) else None,
                  serial=(doc.get("serial_number") if isinstance(doc.get("serial_number"), str)
                          else None),
                  passed=passed, wear_percent=wear, wear_source=source, media_errors=media,
                  spare_percent=spare, spare_threshold_percent=thresh, critical_warning=crit,
                  power_on_hours=hours, temperature_celsius=temp, warnings=tuple(warnings))


def smartctl(node: str) -> dict[str, Any]:
    """``smartctl --json -a NODE``'s JSON document. Its exit status is a bit mask
    (smartctl(8)): a non-zero one still comes with a document, which :func:`parse` reads."""
    done = runner.run(["smartctl", "--json", "-a", node], timeout=TIMEOUT, check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise CacheMgrError(f"smartctl --json -a {node}: no JSON (exit {done.returncode}): "
                            f"{done.stderr.strip()[:200]}")
    return doc


# ------------------------------------------------------------------------------ the cache

_memo: dict[str, dict[str, Any]] = {}  # key -> cache entry, for a process whose file failed


def cache_path(key: str) -> Path:
    return state.state_dir(create=False) / "smart" / f"{state._safe(key)}.json"


def _load(key: str) -> dict[str, Any] | None:
    try:
        entry = state.read_json(cache_path(key))
    except CacheMgrError:
        entry = None  # unreadable: read again
    if entry is None:
        return _memo.get(key)
    return entry


def _store(key: str, entry: dict[str, Any]) -> None:
    _memo[key] = entry
    try:
        state.write_json(cache_path(key), entry)
    except OSError:
        pass  # a read-only state directory: this process remembers it (_memo)


def _health(entry: Mapping[str, Any]) -> Health:
    node, read_at = str(entry.get("node")), float(entry.get("read_at") or 0)
    doc = entry.get("smartctl")
    if isinstance(doc, dict):
        return parse(node, doc, read_at)
    return Health(node, read_at, error=str(entry.get("error") or "no answer"))


def lookup(node: str, key: str, *, refresh: bool = True, max_age: float = MAX_AGE,
           now: float | None = None) -> Health | None:
    """The health of the disk at ``node`` whose stable identity is ``key``: the cached answer
    while it is younger than ``max_age``, else (``refresh``) a new smartctl run, cached. With
    ``refresh=False`` what the cache holds, however old, or None."""
    now = time.time() if now is None else now
    entry = _load(key)
    fresh = entry is not None and 0 <= now - float(entry.get("read_at") or 0) < max_age
    if entry is not None and (fresh or not refresh):
        return _health(entry)
    if not refresh:
        return None
    new: dict[str, Any] = {"key": key, "node": node, "read_at": now}
    try:
        new["smartctl"] = smartctl(node)
    except CacheMgrError as exc:
        new["error"] = exc.message
    _store(key, new)
    return _health(new)


# ------------------------------------------------------------------ which disks are the SSDs


@dataclass(frozen=True)
class Ssd:
    """A disk under a cache: a SCSI disk or an NVMe namespace (the disks smartctl asks)."""

    name: str  # sdc, nvme0n1
    node: str
    key: str  # stable identity: WWID, else serial
    caches: tuple[str, ...]  # what it caches for: cache set UUIDs, dm-cache/writecache nodes


def _disks_under(sysfs: Sysfs, name: str, depth: int = 0) -> list[str]:
    """The whole disks under block device ``name``: itself, its disk if a partition, or
    what a device-mapper device sits on (slaves/, down the stack)."""
    if depth > 8:
        return []
    slaves = sysfs.listdir(f"block/{name}/slaves") if name.startswith("dm-") else []
    if slaves:
        return [d for s in slaves for d in _disks_under(sysfs, s, depth + 1)]
    return [sysfs.disk_of_partition(name) or name]


def cache_ssds(sysfs: Sysfs, snap: Snapshot) -> list[Ssd]:
    """Every SCSI disk and NVMe namespace holding a cache of ``snap``, in order, with the
    caches on each (other disks, e.g. virtio or UML's ubd, have no SMART to ask)."""
    users: dict[str, list[str]] = {}

    def add(ident: Identity | None, cache: str) -> None:
        if ident is None:
            return
        for d in _disks_under(sysfs, ident.name):
            users.setdefault(d, [])
            if cache not in users[d]:
                users[d].append(cache)

    for c in snap.cache_sets:
        for x in c.caches:
            add(x.identity, c.uuid)
    for d in snap.dmcaches:
        add(d.cache, d.node)
    for w in snap.writecaches:
        add(w.cache, w.node)
    out = []
    for name, caches in users.items():
        try:
            disk = hotplug.disk(sysfs, name)
        except CacheMgrError:
            continue
        key = disk.wwid or disk.serial
        if key:
            out.append(Ssd(disk.name, disk.node, key, tuple(caches)))
    return out


def health_json(h: Health | None, *, now: float | None = None) -> dict[str, Any] | None:
    """docs/json.md, ``ssd_health``."""
    if h is None:
        return None
    now = time.time() if now is None else now
    return {"read_at": h.read_at, "age_seconds": max(0.0, round(now - h.read_at, 1)),
            "error": h.error, "protocol": h.protocol, "model": h.model, "serial": h.serial,
            "smart_passed": h.passed, "wear_percent": h.wear_percent,
            "wear_source": h.wear_source, "media_errors": h.media_errors,
            "spare_percent": h.spare_percent,
            "spare_threshold_percent": h.spare_threshold_percent,
            "critical_warning": h.critical_warning, "power_on_hours": h.power_on_hours,
            "temperature_celsius": h.temperature_celsius, "replace_soon": h.replace_soon,
            "warnings": list(h.warnings)}


def ssd_health(sysfs: Sysfs, snap: Snapshot, *, refresh: bool = True,
               max_age: float = MAX_AGE) -> list[tuple[Ssd, Health | None]]:
    """Each cache SSD of ``snap`` with its (cached) health; smartctl for an answer older than
    ``max_age`` (0: every disk now). smartctl runs only against the live /sys (a captured
    tree's disks are not this host's): elsewhere the cache alone."""
    # smartctl opens the disk: root's to do (another user's run would only store "permission
    # denied" answers); the cache then, as far as this process may read it
    refresh = refresh and sysfs.live and os.geteuid() == 0
    return [(s, lookup(s.node, s.key, refresh=refresh, max_age=max_age))
            for s in cache_ssds(sysfs, snap)]


def of_records(records: Iterable[Mapping[str, Any]], *, refresh: bool = True) -> list[
        tuple[str, Health | None]]:
    """Health of disks a journal recorded (``hotplug.record``): node and the lookup."""
    out = []
    for r in records:
        node, key = r.get("node"), r.get("wwid") or r.get("serial")
        if isinstance(node, str) and isinstance(key, str) and key:
            out.append((node, lookup(node, key, refresh=refresh)))
    return out
