"""Prometheus metrics from the snapshot, for bcache and dm-cache alike.

``collect(snapshot)`` yields metric families; the CLI writes them in node_exporter's
textfile format or serves them on /metrics (prometheus-client). Beyond node_exporter's bcache
collector: dm-cache, mode and state as labelled gauges, and no crash when a kernel lacks a
stats file (a missing value is simply not exported). ``priority_stats`` is never read (the
snapshot never reads it).

Naming (Prometheus conventions): ``cachemgr_`` prefix, base units (bytes, seconds), ``_total``
for counters. bcache's five_minute/hour/day stats are decaying windows, exported as
``cachemgr_bcache_hit_ratio{interval=...}`` gauges; only ``stats_total`` feeds counters.

A scrape (and the textfile) reads what the kernel already exposes: /sys, and dmsetup's
table/status for dm-cache. It never opens a block device: no libblkid probe of unclaimed disks
(the VMs' disks among them), so a backing device that bcache stopped while dirty, which only
its superblock still shows, is not exported; ``cachemgr status`` probes for it.

Who owns each device (issue #30): ``cachemgr_device_owner_info`` and
``cachemgr_device_owner_since_seconds`` for each device a cachemgr procedure holds now (its
lock) or an interrupted procedure's journal claims (procedures/owners.py; the keys are the
device's kind's locks), from ``Snapshot.owners``.

A scrape's snapshot and findings are ``cachemgr status``'s and ``cachemgr check``'s
(cachemgr/ops/metrics.py ``SnapshotCollector``: one path, so every finding ``check`` can give
is exported, with its code, in ``cachemgr_health_finding``).

The textfile (:func:`write_textfile`; :func:`textfile_loop`, ``--interval``: one process
rewriting it through the listener's collector and scan cache) is written atomically.

The listener (:func:`parse_listen`, :func:`serve`) binds loopback unless told otherwise:
``:PORT`` or ``PORT`` is 127.0.0.1 and ::1; every address takes an explicit ``0.0.0.0:PORT``
or ``[::]:PORT``.
"""

from __future__ import annotations

import errno
import gzip
import ipaddress
import logging
import math
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cachemgr.backends import smart
from cachemgr.core import signals
from cachemgr.core import state as state_mod
from cachemgr.core.errors import CacheMgrError, UsageError
from cachemgr.core.model import CacheState, Snapshot
from cachemgr.procedures import health, kinds, owners, protect, scrub, unseen, webconfig

log = logging.getLogger(__name__)

BCACHE_MODES = ("writethrough", "writeback", "writearound", "none")
DM_MODES = ("writeback", "writethrough", "passthrough")
# label values without spaces: bcache's "no cache" is exported as no_cache
STATES = tuple(s.value for s in CacheState)


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"cachemgr_{name}", doc, labels=labels)


def _c(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(f"cachemgr_{name}", doc, labels=labels)


def _kname(path: str) -> str:
    """The kernel name node_exporter's ``device`` label uses for a node we know only by path
    (``/dev/sdc`` -> ``sdc``)."""
    return path.rsplit("/", 1)[-1]


def collect(snap: Snapshot, *, journals: bool = True,
            written_back: Mapping[str, float | None] | None = None,
            findings: Sequence[health.Finding] | None = None) -> Iterator[Metric]:
    """Every metric family of ``snap``. ``device`` is the kernel name (``bcache0``, ``dm-3``,
    ``sdc``: node_exporter's ``node_disk_*`` label), ``path`` the node (``/dev/bcache0``,
    ``/dev/mapper/vmcache``). ``journals``: also the drain and replacement journals under the
    state directory (docs/admin-guide.md, "Alerts and dashboard"). ``written_back``: each
    backing device's measured write-back bytes per second since the previous scrape, by key
    (procedures/traffic.py; a long-lived collector has it). ``findings``: the health model's
    findings of ``snap`` as ``cachemgr check`` gives them (ops/metrics.py: with the journals
    that cannot be read and SMART's answers); default: :func:`health.assess` of ``snap``
    alone."""
    dev = ["kind", "device", "path"]
    one = ["device", "path"]
    dirty = _g("dirty_bytes", "Dirty data held only in the cache (lower bound).", dev)
    size = _g("cache_size_bytes", "Size of the cache (dm-cache, dm-writecache).", dev)
    mode = _g("cache_mode", "Cache mode: 1 for the active mode.", [*dev, "mode"])
    state = _g("cache_state", "Cache state: 1 for the current state.", [*dev, "state"])
    # what each counter counts: docs/kernel-notes.md, "What the hit counters count"
    hit = _g("bcache_hit_ratio", "bcache read hit ratio per stats interval: hits over hits "
             "and misses, read requests only, the bypassed reads left out.",
             [*one, "interval"])
    hits = _c("bcache_hits", "bcache read requests found whole in the cache, not bypassed "
              "(stats_total cache_hits; writes are not counted).", one)
    misses = _c("bcache_misses", "bcache read requests not bypassed and not found whole in "
                "the cache (stats_total cache_misses; a partial hit is a miss).", one)
    bypassed = _c("bcache_bypassed_bytes", "Bytes of reads and writes that bypassed the "
                  "cache (stats_total).", one)
    bhits = _c("bcache_bypass_hits", "Bypassed read requests whose data was in the cache "
               "(stats_total).", one)
    bmiss = _c("bcache_bypass_misses", "Bypassed read requests whose data was not in the "
               "cache (stats_total).", one)
    coll = _c("bcache_miss_collisions", "Miss collisions (stats_total).", one)
    rate = _g("bcache_writeback_rate_bytes_per_second", "bcache's writeback_rate: the rate "
              "its write-back controller is set to, not traffic (512 KiB/s on a clean idle "
              "device); the traffic is cachemgr_bcache_written_back_bytes_per_second.", one)
    wrote = _g("bcache_written_back_bytes_per_second", "Bytes written back to the backing "
               "device per second since the previous scrape, measured from the block "
               "layer's write counters and dirty data (a lower bound while VMs write in "
               "writeback mode).", one)
    wbp = _g("bcache_writeback_percent", "writeback_percent tunable.", one)
    errors = _g("bcache_io_errors", "IO errors counted on the backing device.", one)
    attached = _g("bcache_attached", "1 if the backing device is attached to a cache set.",
                  [*one, "backing_device", "cset"])
    avail = _g("bcache_cache_available_ratio", "Share of the cache set that is available.",
               ["cset"])
    cerr = _g("bcache_cache_io_errors", "IO errors counted on the cache device (decaying: "
              "io_error_halflife).", ["cset", *one])
    # each device's (kind, device, path) labels as the families above have them: the owner
    # families below use the same
    where: dict[int, list[str]] = {}
    for b in snap.backings:
        path = b.device or b.identity.node
        lab = [b.device_name or b.identity.name, path]
        where[id(b)] = ["bcache", *lab]
        if b.dirty is not None and not (b.state == CacheState.DIRTY and b.cset_uuid is None):
            dirty.add_metric(["bcache", *lab], b.dirty.low)
        if b.mode is not None:
            for m in BCACHE_MODES:
                mode.add_metric(["bcache", *lab, m], 1.0 if b.mode.value == m else 0.0)
        for s in STATES:
            state.add_metric(["bcache", *lab, _word(s)], 1.0 if b.state.value == s else 0.0)
        for interval, st in b.stats.items():
            r = st.computed_hit_ratio
            if r is not None:
                hit.add_metric([*lab, interval], r)
        tot = b.stats.get("total")
        if tot is not None:
            for fam, v in ((hits, tot.hits), (misses, tot.misses), (bhits, tot.bypass_hits),
                           (bmiss, tot.bypass_misses), (coll, tot.miss_collisions),
                           (bypassed, tot.bypassed.low if tot.bypassed else None)):
                if v is not None:
                    fam.add_metric(lab, v)
        if b.writeback_rate is not None:
            rate.add_metric(lab, b.writeback_rate.low)
        wb = written_back.get(b.key) if written_back is not None else None
        if wb is not None:
            wrote.add_metric(lab, wb)
        if b.writeback_percent is not None:
            wbp.add_metric(lab, b.writeback_percent)
        if b.io_errors is not None:
            errors.add_metric(lab, b.io_errors)
        attached.add_metric([*lab, b.identity.name, b.cset_uuid or ""],
                            1.0 if b.cset_uuid else 0.0)
    for c in snap.cache_sets:
        if c.cache_available_percent is not None:
            avail.add_metric([c.uuid], c.cache_available_percent / 100)
        for x in c.caches:
            if x.io_errors is not None:
                cerr.add_metric([c.uuid, x.identity.name, x.identity.node], x.io_errors)

    dm_used = _g("dmcache_used_blocks", "Cache blocks in use.", one)
    dm_total = _g("dmcache_total_blocks", "Cache blocks in all.", one)
    dm_block = _g("dmcache_block_bytes", "Cache block size.", one)
    dm_md = _g("dmcache_metadata_used_ratio", "Share of the metadata device in use.", one)
    # dm-cache counts one per cache block a request covers (dm splits it at the block); in
    # passthrough a read of a block it holds is a read hit, served by the origin
    block = "one per cache block a request covers"
    dm_help = {"read_hits": f"dm-cache read hits ({block}; in passthrough the origin "
                            "serves them).",
               "read_misses": f"dm-cache read misses ({block}).",
               "write_hits": f"dm-cache write hits: writes to cached blocks ({block}).",
               "write_misses": f"dm-cache write misses ({block}).",
               "demotions": "dm-cache demotions.", "promotions": "dm-cache promotions."}
    dm_counters = {k: _c(f"dmcache_{k}", h, one) for k, h in dm_help.items()}
    dm_check = _g("dmcache_needs_check", "1 if the metadata needs a check.", one)
    dm_ro = _g("dmcache_metadata_read_only", "1 if the metadata went read-only.", one)
    for d in snap.dmcaches:
        lab = [d.kernel_name, d.node]
        where[id(d)] = ["dm-cache", *lab]
        db = d.dirty_bytes
        if db is not None:
            dirty.add_metric(["dm-cache", *lab], db)
        m_active = d.mode.value
        for m in DM_MODES:
            mode.add_metric(["dm-cache", *lab, m], 1.0 if m_active == m else 0.0)
        for s in STATES:
            state.add_metric(["dm-cache", *lab, _word(s)], 1.0 if d.state.value == s else 0.0)
        ds = d.status
        if ds is None:
            continue
        size.add_metric(["dm-cache", *lab], ds.total * ds.block_sectors * 512)
        dm_used.add_metric(lab, ds.used)
        dm_total.add_metric(lab, ds.total)
        dm_block.add_metric(lab, ds.block_sectors * 512)
        if ds.metadata_total:
            dm_md.add_metric(lab, ds.metadata_used / ds.metadata_total)
        for k, fam in dm_counters.items():
            fam.add_metric(lab, getattr(ds, k))
        dm_check.add_metric(lab, 1.0 if ds.needs_check else 0.0)
        dm_ro.add_metric(lab, 1.0 if ds.metadata_mode == "ro" else 0.0)

    wc_free = _g("writecache_free_blocks", "dm-writecache blocks free.", one)
    wc_total = _g("writecache_total_blocks", "dm-writecache blocks in all.", one)
    wc_wb = _g("writecache_writeback_blocks", "dm-writecache blocks being written back.", one)
    wc_err = _g("writecache_error", "dm-writecache error indicator (0: none).", one)
    for w in snap.writecaches:
        lab = [w.kernel_name, w.node]
        where[id(w)] = ["dm-writecache", *lab]
        if w.dirty_bytes is not None:
            dirty.add_metric(["dm-writecache", *lab], w.dirty_bytes)
        for m in DM_MODES:  # writecache has writeback only
            mode.add_metric(["dm-writecache", *lab, m], 1.0 if m == w.mode.value else 0.0)
        for s in STATES:
            state.add_metric(["dm-writecache", *lab, _word(s)],
                             1.0 if w.state.value == s else 0.0)
        if w.status is not None:
            if w.block_bytes:
                size.add_metric(["dm-writecache", *lab], w.status.total * w.block_bytes)
            wc_free.add_metric(lab, w.status.free)
            wc_total.add_metric(lab, w.status.total)
            wc_wb.add_metric(lab, w.status.writeback)
            wc_err.add_metric(lab, w.status.error)

    lvm = _g("lvm_cache_info", "1 for each LVM-owned cache: its VG/LV, cache pool or "
             "cachevol, and whether lvm2 says it needs a check.",
             [*one, "lv", "cache", "kind", "check_needed"])
    for dmdev in snap.dm_devices:
        lv = dmdev.lvm
        if lv is not None:
            lvm.add_metric([dmdev.kernel_name, dmdev.node, lv.full_name,
                            f"{lv.vg}/{lv.pool_name}", lv.kind,
                            "1" if lv.check_needed else "0"], 1.0)

    # the devices of kinds registered beyond the built-in ones (Snapshot.others): what every
    # kind answers (its name, node, mode, modes and dirty bytes)
    for kd in kinds.listed(snap):
        if id(kd.obj) in where:
            continue
        lab = [kd.name, _kname(kd.node), kd.node]
        where[id(kd.obj)] = lab
        if kd.dirty_bytes is not None:
            dirty.add_metric(lab, kd.dirty_bytes)
        if kd.mode is not None:
            for cm in kd.modes:
                mode.add_metric([*lab, cm.value], 1.0 if cm == kd.mode else 0.0)
    owned = _owner_metrics(snap, where)

    up = _g("bcache_loaded", "1 if the bcache module is loaded.", [])
    up.add_metric([], 1.0 if snap.bcache_loaded else 0.0)
    warn = _g("scan_warnings", "Files the last scan could not read or parse.", [])
    warn.add_metric([], len(snap.warnings))
    blind = _g("unseen", "1 for each thing this exporter could not read because it does not "
               "run as root (what: state-directory, dmcache-records, dmsetup, superblocks), or "
               "the kernel log it could not read (kernel-log): "
               "a CRITICAL finding there would not be seen (cachemgr_health_status is 3).",
               ["what", "path"])
    for u in snap.unseen:
        blind.add_metric([u.what, u.path or ""], 1.0)
    yield from (dirty, size, mode, state, hit, hits, misses, bypassed, bhits, bmiss, coll, rate,
                wrote, wbp, errors, attached, avail, cerr, dm_used, dm_total, dm_block, dm_md,
                *dm_counters.values(), dm_check, dm_ro, wc_free, wc_total, wc_wb, wc_err, lvm,
                up, warn, blind, *owned)
    yield from _health_metrics(snap, health.assess(snap) if findings is None else findings)
    if journals:
        yield from _journal_metrics(snap)
        yield from _scrub_metrics(snap)
    if snap.vms is not None:
        yield from _vm_metrics(snap)


def _health_metrics(snap: Snapshot, findings: Sequence[health.Finding]
                    ) -> tuple[Metric, Metric]:
    """The health model's verdict (procedures/health.py, what ``cachemgr check`` reports;
    a scrape never probes a disk, so the devices bcache left unregistered are not in it:
    ``check`` and ``status`` read those)."""
    level = _g("health_status", "The worst finding of the health model: 0 OK, 1 WARNING, "
               "2 CRITICAL, 3 UNKNOWN: not root, something not read could hide a CRITICAL "
               "(cachemgr_unseen; cachemgr check's exit codes).", [])
    level.add_metric([], float(unseen.verdict(health.worst(findings), snap.unseen)))
    each = _g("health_finding", "1 for each finding of the health model (cachemgr check's): "
              "its level, its stable code (the code of cachemgr check --json) and the device.",
              ["level", "code", "device"])
    for f in findings:
        each.add_metric([f.level.name.lower(), f.code, f.device], 1.0)
    return level, each


OWNER_STATES = ("running", "interrupted")


def _owner_metrics(snap: Snapshot, where: dict[int, list[str]]) -> tuple[Metric, Metric]:
    """Who owns each cached device of ``snap`` (``snap.owners``, the one owner
    procedures/owners.owner_of picks for the keys of the device's kind: an interrupted
    procedure before a running one). ``where``: each device's (kind, device, path) labels."""
    labels = ["kind", "device", "path", "procedure", "run", "step", "state"]
    info = _g("device_owner_info", "1 for each device a cachemgr procedure owns: running (its "
              "process holds the device's lock) or interrupted (its process is gone and its "
              "journal claims the device until it is resumed or rolled back; every change to "
              "the device is refused meanwhile).", labels)
    since = _g("device_owner_since_seconds", "When the procedure that owns the device "
               "started (Unix time), as its lock file or journal says.", labels)
    if not snap.owners:
        return info, since
    for k in kinds.listed(snap):
        o = owners.owner_of(snap.owners, (key for key, _ in k.locks))
        if o is None:
            continue
        lab = [*where.get(id(k.obj), [k.name, _kname(k.node), k.node]), _word(o.procedure),
               _word(o.run), _word(o.step), OWNER_STATES[0] if o.running else OWNER_STATES[1]]
        info.add_metric(lab, 1.0)
        if o.since is not None:
            since.add_metric(lab, o.since)
    return info, since


def _scrub_metrics(snap: Snapshot) -> Iterator[Metric]:
    """Each device's last scrub (procedures/scrub.py's records): read from the state
    directory, never created by a scrape."""
    mism = _g("scrub_mismatches", "Blocks the device's last scrub found its cache serving "
              "unlike its origin (dropped from the cache when found).", ["device"])
    blocks = _g("scrub_blocks", "Blocks the device's last scrub compared with its origin.",
                ["device"])
    when = _g("scrub_last_timestamp_seconds", "When the device's last scrub ended.",
              ["device"])
    if not any(u.what == unseen.STATE for u in snap.unseen):
        for s in scrub.lasts():
            dev = _word(s.device)
            mism.add_metric([dev], float(s.mismatches))
            blocks.add_metric([dev], float(s.blocks))
            if s.at is not None:
                when.add_metric([dev], s.at)
    yield from (mism, blocks, when)


def _journal_metrics(snap: Snapshot) -> Iterator[Metric]:
    """Drains a journal says are under way (or were killed), and replacements not finished:
    read from the state directory, never created by a scrape (a read-only sandbox)."""
    from cachemgr.backends.dmcache import flushing
    from cachemgr.backends.lvm import manage as lvm_manage
    from cachemgr.procedures import drain, replace

    draining = _g("drain_running", "1 while a drain's journal exists for the device: a drain "
                  "under way, or one killed before it put the tunables back.",
                  ["kind", "device", "path"])
    unfinished = _g("replace_unfinished", "1 for each replace-ssd run that is neither done nor "
                    "rolled back (status running or failed).", ["run", "kind", "cache", "status"])
    updated = _g("replace_updated_timestamp_seconds", "When an unfinished replace-ssd run last "
                 "wrote its journal.", ["run", "kind", "cache", "status"])
    unreadable = _g("replace_unreadable_journals", "replace-ssd journals that cannot be read.",
                    [])
    guarded = _g("protect_active", "1 for each cache SSD the protect policy acted on (its "
                 "devices switched to writethrough and drained) that still caches.", ["ssd"])
    guarded_since = _g("protect_since_timestamp_seconds", "When the protect policy first "
                       "acted on the SSD.", ["ssd"])
    if any(u.what == unseen.STATE for u in snap.unseen) \
            or not state_mod.state_dir(create=False).is_dir():  # none written here, or root's
        unreadable.add_metric([], 0)
        yield from (draining, unfinished, updated, unreadable, guarded, guarded_since)
        return
    for entry in protect.load_state()["protected"].values():
        ssd = _word(str(entry.get("ssd")))
        guarded.add_metric([ssd], 1.0)
        if isinstance(entry.get("since"), (int, float)):
            guarded_since.add_metric([ssd], float(entry["since"]))
    # each kind's journal directory listed once (a path per device opened the state
    # directory each time, with its ownership checks: 64 backing devices, 0.23 s in the lab)
    drains = state_mod.journal_names("drain") if snap.backings else set()
    for b in snap.backings:
        if state_mod.journal_name(drain.journal_key(b)) in drains:
            draining.add_metric(["bcache", b.device_name or b.identity.name,
                                 b.device or b.identity.node], 1.0)
    for d in snap.dmcaches:
        if d.lvm is None and flushing.journal(d).exists():
            draining.add_metric(["dm-cache", d.kernel_name, d.node], 1.0)
    for dd in snap.dm_devices:
        if dd.lvm is not None and lvm_manage.journal(dd.lvm).exists():
            kind = "dm-writecache" if dd in snap.writecaches else "dm-cache"
            draining.add_metric([kind, dd.kernel_name, dd.node], 1.0)
    runs, bad = replace.scan_runs()
    for j in runs:
        if j.status in ("running", "failed"):
            lab = [j.id, j.kind, j.cset, j.status]
            unfinished.add_metric(lab, 1.0)
            updated.add_metric(lab, j.updated)
    unreadable.add_metric([], len(bad))
    yield from (draining, unfinished, updated, unreadable, guarded, guarded_since)


def _word(text: str | None) -> str:
    """A label value without spaces (a drive model: ``Samsung_SSD_970_EVO_Plus_250GB``)."""
    return "_".join((text or "").split())


def health_metrics(rows: Iterable[tuple[smart.Ssd, smart.Health | None]]) -> Iterator[Metric]:
    """Each cache SSD's SMART health as last read (smart.lookup: at most every 10 min, by
    status, the TUI or replace-ssd; a scrape never runs smartctl)."""
    one = ["device", "path"]
    info = _g("ssd_info", "1 for each cache SSD and cache on it: model, serial, protocol.",
              [*one, "model", "serial", "protocol", "cache"])
    up = _g("ssd_smart_up", "1 if smartctl's last answer for the SSD was usable.", one)
    read = _g("ssd_health_read_timestamp_seconds", "When smartctl last read the SSD.", one)
    wear = _g("ssd_wear_ratio", "Share of the rated endurance used (NVMe percentage used, "
              "SCSI endurance indicator, ATA wear attribute; may pass 1).", one)
    media = _c("ssd_media_errors", "Media and data integrity errors the SSD reports.", one)
    spare = _g("ssd_spare_ratio", "Available spare (NVMe; ATA reserved space, normalized).", one)
    spare_t = _g("ssd_spare_threshold_ratio", "The spare threshold the drive sets.", one)
    passed = _g("ssd_smart_passed", "1 if the drive's SMART self-assessment passed.", one)
    crit = _g("ssd_critical_warning", "NVMe critical warning bits (0: none).", one)
    soon = _g("ssd_replace_soon", "1 if cachemgr says to replace the SSD soon (failed, worn "
              "past 90 %, spare below threshold, critical warning, media errors).", one)
    for ssd, h in rows:
        lab = [ssd.name, ssd.node]
        if h is None:
            continue
        for cache in ssd.caches:
            info.add_metric([*lab, _word(h.model), _word(h.serial), _word(h.protocol), cache],
                            1.0)
        up.add_metric(lab, 0.0 if h.error else 1.0)
        read.add_metric(lab, h.read_at)
        # percentages as ratios; counts and bits as they are
        for fam, v, scale in ((wear, h.wear_percent, 100), (spare, h.spare_percent, 100),
                              (spare_t, h.spare_threshold_percent, 100),
                              (media, h.media_errors, 1), (crit, h.critical_warning, 1),
                              (passed, h.passed, 1)):
            if v is not None:
                fam.add_metric(lab, float(v) / scale)
        if not h.error:
            soon.add_metric(lab, 1.0 if h.replace_soon else 0.0)
    yield from (info, up, read, wear, media, spare, spare_t, passed, crit, soon)


def _vm_metrics(snap: Snapshot) -> Iterator[Metric]:
    """The VMs above the caches (libvirt): each disk and what serves it, and the IO pressure
    and IO of each VM's cgroup and of the host."""
    assert snap.vms is not None
    disk = _g("vm_disk_info", "1 for each VM disk: its cache mode and the cached device "
              "under it (device: kernel name, path: node; empty: none).",
              ["vm", "disk", "cache_mode", "device", "path"])
    names = {**{b.device: b.device_name for b in snap.backings if b.device},
             **{d.node: d.kernel_name for d in snap.dm_devices}}
    disk_warn = _g("vm_disk_warnings", "Warnings about a VM disk's cache mode (live "
                   "migration, flushes ignored, stacked write-back layers).", ["vm", "disk"])
    pressure = _g("vm_io_pressure_ratio", "Share of the last 10 s in which some or all of a "
                  "VM's tasks waited on IO (PSI io.pressure avg10 / 100).", ["vm", "kind"])
    stall = _c("vm_io_stall_seconds", "Time some or all of a VM's tasks waited on IO (PSI "
               "total).", ["vm", "kind"])
    ios = _c("vm_io_ops", "IOs of a VM's cgroup (io.stat).", ["vm", "op"])
    nbytes = _c("vm_io_bytes", "Bytes of a VM's cgroup (io.stat).", ["vm", "op"])
    cache_read = _c("vm_cache_read_bytes", "Bytes a VM read through a cached device (its "
                    "cgroup's io.stat on it; device: kernel name, path: node).",
                    ["vm", "device", "path"])
    slow_read = _c("vm_cache_slow_read_bytes", "Of them, the bytes the slow disk under the "
                   "cache served the VM (its misses: io.stat on the backing device or origin).",
                   ["vm", "device", "path"])
    vm_hit = _g("vm_cache_read_hit_ratio", "A VM's read hit ratio on a cached device since "
                "its scope was made: 1 - slow / read bytes (absent while unknown).",
                ["vm", "device", "path"])
    noisy = _g("vm_noisy_neighbour", "1 for a VM whose misses make most of the slow disk's "
               "reads under a cache that other VMs share while another there misses too.",
               ["vm", "device", "path"])
    host = _g("host_io_pressure_ratio", "Share of the last 10 s in which some or all tasks "
              "of the host waited on IO (/proc/pressure/io avg10 / 100).", ["kind"])
    host_stall = _c("host_io_stall_seconds", "Time some or all tasks of the host waited on "
                    "IO (/proc/pressure/io total).", ["kind"])
    for v in snap.vms.vms:
        for d in v.disks:
            for dev in d.caches or ("",):
                disk.add_metric([v.name, d.target, d.cache,
                                 names.get(dev) or _kname(dev), dev], 1.0)
            disk_warn.add_metric([v.name, d.target], len(d.warnings))
        if v.pressure is not None:
            pressure.add_metric([v.name, "some"], v.pressure.some_avg10 / 100)
            stall.add_metric([v.name, "some"], v.pressure.some_total_us / 1e6)
            if v.pressure.full_avg10 is not None and v.pressure.full_total_us is not None:
                pressure.add_metric([v.name, "full"], v.pressure.full_avg10 / 100)
                stall.add_metric([v.name, "full"], v.pressure.full_total_us / 1e6)
        for c in v.cache_io:
            lab = [v.name, names.get(c.cache) or _kname(c.cache), c.cache]
            if c.why is None and c.read_bytes is not None:
                cache_read.add_metric(lab, c.read_bytes)
                slow_read.add_metric(lab, c.slow_read_bytes or 0)
            h = c.read_hit_ratio
            if h is not None:
                vm_hit.add_metric(lab, h)
        if v.io is not None:
            ios.add_metric([v.name, "read"], v.io.rios)
            ios.add_metric([v.name, "write"], v.io.wios)
            nbytes.add_metric([v.name, "read"], v.io.rbytes)
            nbytes.add_metric([v.name, "write"], v.io.wbytes)
    for n in snap.vms.noisy:
        noisy.add_metric([n.vm, names.get(n.cache) or _kname(n.cache), n.cache], 1.0)
    hp = snap.vms.host_pressure
    if hp is not None:
        host.add_metric(["some"], hp.some_avg10 / 100)
        host_stall.add_metric(["some"], hp.some_total_us / 1e6)
        if hp.full_avg10 is not None and hp.full_total_us is not None:
            host.add_metric(["full"], hp.full_avg10 / 100)
            host_stall.add_metric(["full"], hp.full_total_us / 1e6)
    yield from (disk, disk_warn, pressure, stall, ios, nbytes, cache_read, slow_read, vm_hit,
                noisy, host, host_stall)


# how often a long-lived collector (ops/metrics.py) reads what changes slowly (issue #34):
# bcache's decaying stats intervals (five_minute, hour, day; folded every ~13.6 s, a
# five-minute window read once a minute) and libvirt's domains (the TUI's pace; one listing
# through libvirt's binding, or a virsh call per domain where the binding is missing:
# backends/virsh.py)
STATS_EVERY = 60.0
VM_EVERY = 15.0


# ---------------------------------------------------------------------------- exposition

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _value(v: float) -> str:
    """A sample's value as prometheus_client writes it (utils.floatToGoString)."""
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(float(v))
    dot = r.find(".")
    if v > 0 and dot > 6:  # Go's exponent form from 1e+06 on
        mantissa = f"{r[0]}.{r[1:dot]}{r[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return r


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def text(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4) of ``families``: what prometheus_client's
    ``generate_latest`` writes for them, byte for byte (tests/unit/test_metrics_cache.py),
    in a fifth of its time. Only what this module makes: gauges and counters, legacy names,
    sorted labels, no timestamps (its validation of every label name per sample was a fifth
    of a scrape in the UML lab)."""
    out: list[str] = []
    for m in families:
        name = m.name + "_total" if m.type == "counter" else m.name
        doc = m.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {m.type}\n")
        for smp in m.samples:
            if smp.labels:
                labels = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(smp.labels.items()))
                out.append(f"{smp.name}{{{labels}}} {_value(smp.value)}\n")
            else:
                out.append(f"{smp.name} {_value(smp.value)}\n")
    return "".join(out).encode()


def wsgi_app(registry: Collector) -> Callable[..., Iterable[bytes]]:
    """/metrics (any path, as prometheus_client's app) in the text format, gzipped when the
    scraper accepts it (Prometheus does); ``name[]`` picks families as there."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        fams: Iterable[Metric] = registry.collect()
        if names:
            fams = [f for f in fams if f.name in names
                    or (f.type == "counter" and f.name + "_total" in names)]
        body = text(fams)
        headers = [("Content-Type", CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app


# ------------------------------------------------------------------------------ listener

LOOPBACK = ("127.0.0.1", "::1")
LISTEN_HINT = ("use :PORT for loopback only (127.0.0.1 and ::1), HOST:PORT or [IPV6]:PORT for "
               "one address, 0.0.0.0:PORT or [::]:PORT for all")


@dataclass(frozen=True)
class Listen:
    """Where to serve /metrics: the addresses (IP literals) and the one port."""

    addrs: tuple[str, ...]
    port: int
    loopback_default: bool = False  # ":PORT": ::1 is skipped on a host without IPv6



def parse_listen(text: str) -> Listen:
    """``--listen``: ``PORT`` or ``:PORT`` (loopback: 127.0.0.1 and ::1), ``HOST:PORT`` (an
    IPv4 address or a name, resolved once here), ``[IPV6]:PORT``. UsageError if malformed."""
    raw = text.strip()
    if raw.startswith("["):
        host, close, rest = raw[1:].partition("]")
        if not close or not rest.startswith(":"):
            raise UsageError(f"bad --listen {text!r}: expected [IPV6]:PORT", hint=LISTEN_HINT)
        port_s = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UsageError(f"bad --listen {text!r}: {host!r} is not an IPv6 address",
                             hint=LISTEN_HINT) from None
    elif ":" not in raw:
        host, port_s = "", raw
    else:
        host, _, port_s = raw.rpartition(":")
        if ":" in host:
            raise UsageError(f"bad --listen {text!r}: an IPv6 address goes in brackets, "
                             f"e.g. [::1]:{port_s or 9563}", hint=LISTEN_HINT)
    if not (port_s.isascii() and port_s.isdigit()) or not 1 <= int(port_s) <= 65535:
        raise UsageError(f"bad --listen {text!r}: the port must be a number from 1 to 65535",
                         hint=LISTEN_HINT)
    port = int(port_s)
    if not host:
        return Listen(LOOPBACK, port, loopback_default=True)
    try:
        ipaddress.ip_address(host)
        return Listen((host,), port)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"bad --listen {text!r}: cannot resolve {host!r} ({exc})",
                         hint=LISTEN_HINT) from None
    addrs = tuple(dict.fromkeys(str(i[4][0]) for i in infos
                                if i[0] in (socket.AF_INET, socket.AF_INET6)))
    if not addrs:
        raise UsageError(f"bad --listen {text!r}: {host!r} has no IP address", hint=LISTEN_HINT)
    return Listen(addrs, port)


class _Handler(WSGIRequestHandler):
    def setup(self) -> None:
        # TLS (--web-config): the handshake here, in the scrape's own thread, with a timeout
        # (in the accept loop one client that never finishes it would stall every other)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(webconfig.HANDSHAKE_TIMEOUT)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr would flood the journal


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """A threaded WSGI server (one thread per scrape)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that fails its TLS handshake or hangs up: nothing to print per scrape
        log.debug("metrics: request from %s failed", client_address, exc_info=True)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the address up in DNS (socket.getfqdn): skip it
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Server6(_Server):
    address_family = socket.AF_INET6


def _server(addr: str, port: int) -> _Server:
    return (_Server6 if ":" in addr else _Server)((addr, port), _Handler)


def _where(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def bound(servers: Iterable[WSGIServer]) -> str:
    """``127.0.0.1:9563 and [::1]:9563``: where ``servers`` listen."""
    return " and ".join(_where(str(s.server_address[0]), int(s.server_address[1]))
                        for s in servers)


def _bind_error(addr: str, port: int, exc: OSError) -> CacheMgrError:
    where = _where(addr, port)
    if exc.errno == errno.EADDRINUSE:
        return CacheMgrError(
            f"cannot listen on {where}: the port is in use",
            hint=f"stop what holds it (ss -ltnp 'sport = :{port}') or pick another port")
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return UsageError(f"cannot listen on {where}: that address is not on this host",
                          hint=f"use one of this host's addresses (ip -brief address), or "
                               f":{port} for loopback only")
    if exc.errno == errno.EACCES:
        return CacheMgrError(f"cannot listen on {where}: permission denied",
                             hint="ports below 1024 need root; pick a port from 1024 up")
    return CacheMgrError(f"cannot listen on {where}: {exc.strerror or exc}")


def serve(listen: Listen, registry: Collector,
          web: webconfig.WebConfig | None = None) -> list[_Server]:
    """Bind every address of ``listen`` and serve /metrics from ``registry`` on each, in
    daemon threads; returns the servers (``shutdown()`` + ``server_close()`` to stop).

    Nothing is served unless every address binds: a port in use or an address not on this host
    raises CacheMgrError (exit 1) or UsageError (exit 2). For ``:PORT`` a host without IPv6
    serves on 127.0.0.1 alone. ``web``: TLS and basic auth from a web-config file
    (procedures/webconfig.py)."""
    app = wsgi_app(registry)
    if web is not None:
        app = webconfig.wrap_app(web, app)
    servers: list[_Server] = []
    try:
        for addr in listen.addrs:
            try:
                srv = _server(addr, listen.port)
            except OSError as exc:
                if (listen.loopback_default and ":" in addr
                        and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)):
                    continue  # no IPv6 here: 127.0.0.1 alone is loopback enough
                raise _bind_error(addr, listen.port, exc) from None
            if web is not None and web.tls is not None:
                srv.socket = web.tls.wrap_socket(srv.socket, server_side=True,
                                                 do_handshake_on_connect=False)
            srv.set_app(app)
            servers.append(srv)
    except BaseException:
        for srv in servers:
            srv.server_close()
        raise
    for srv in servers:
        threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return servers



# ---------------------------------------------------------------------------- textfile


def write_textfile(path: Path, registry: Collector) -> None:
    """One refresh of node_exporter's textfile: the exposition of ``registry`` written
    atomically to ``path``, readable by node_exporter (0644), so its collector never sees
    half a file and a failed write leaves no temporary file (core/state.py ``write_atomic``)."""
    _write(path, text(registry.collect()))


def _write(path: Path, body: bytes) -> None:
    state_mod.write_atomic(path, body, mode=0o644)


def textfile_loop(path: Path, registry: Collector, interval: float, *,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep,
                  refreshes: int | None = None,
                  written: Callable[[], None] | None = None) -> int:
    """Write ``path`` now, then again every ``interval`` seconds through ``registry`` (the
    listener's :class:`SnapshotCollector`: its scan cache, the intervals and libvirt at
    their own pace), until SIGTERM or SIGHUP (or ``refreshes`` files in all: tests);
    returns the files written. ``written`` is called once the first file is written.

    The first write is the one-shot's: its error ends the command as it ends ``metrics
    --textfile PATH`` (exit 2 for a path the command line can fix). A later scan or write
    that fails (the directory gone, the disk full, dmsetup refused) is logged (once per
    distinct error, and once more when a write succeeds again) and tried again at the next
    interval: the last complete file stays. A refresh that takes longer than the interval
    skips the times it missed instead of running back to back. SIGTERM while a file is
    written is held until it is whole."""
    done = 0
    failing: str | None = None
    failures = 0
    try:
        with signals.terminate_as_interrupt():
            due = clock()
            body = text(registry.collect())
            with signals.deferred():  # a SIGTERM now waits for the whole file
                _write(path, body)
                done = 1
            if written is not None:
                written()
            while refreshes is None or done < refreshes:
                now = clock()
                due += interval * max(1, math.ceil((now - due) / interval))
                if now < due:
                    sleep(due - now)
                try:
                    body = text(registry.collect())
                    with signals.deferred():
                        _write(path, body)
                        done += 1
                except (CacheMgrError, OSError) as exc:
                    failures += 1
                    words = (exc.message if isinstance(exc, CacheMgrError)
                             else exc.strerror or str(exc))
                    if words != failing:
                        log.warning("metrics: %s not written: %s (trying again every %g s)",
                                    path, words, interval)
                    failing = words
                    continue
                if failing is not None:
                    log.warning("metrics: %s written again, after %d failed refresh%s",
                                path, failures, "" if failures == 1 else "es")
                    failing, failures = None, 0
    except signals.Terminated as exc:
        log.info("metrics: %s: stopped by %s after %d files", path, exc.name, done)
    return done
