"""Prometheus metrics from the snapshot, for bcache and dm-cache alike.

``collect(snapshot)`` yields metric families; the CLI writes them in node_exporter's
textfile format or serves them on /metrics (prometheus-client). Beyond node_exporter's bcache
collector: dm-cache, mode and state as labelled gauges, and no crash when a kernel lacks a
stats file (a missing value is simply not exported). ``priority_stats`` is never read (the
snapshot never reads it).

Naming (Prometheus conventions): ``cachemgr_`` prefix, base units (bytes, seconds), ``_total``
for counters. bcache's five_minute/hour/day stats are decaying windows, exported as
``cachemgr_bcache_hit_ratio{interval=...}`` gauges; only ``stats_total`` feeds counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.core.model import CacheState, Snapshot
from cachemgr.core.sysfs import Sysfs

BCACHE_MODES = ("writethrough", "writeback", "writearound", "none")
DM_MODES = ("writeback", "writethrough", "passthrough")
STATES = tuple(s.value for s in CacheState)


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"cachemgr_{name}", doc, labels=labels)


def _c(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(f"cachemgr_{name}", doc, labels=labels)


def collect(snap: Snapshot) -> Iterator[Metric]:
    dev = ["kind", "device"]
    dirty = _g("dirty_bytes", "Dirty data held only in the cache (lower bound).", dev)
    mode = _g("cache_mode", "Cache mode: 1 for the active mode.", [*dev, "mode"])
    state = _g("cache_state", "Cache state: 1 for the current state.", [*dev, "state"])
    hit = _g("bcache_hit_ratio", "bcache hit ratio per stats interval.", ["device", "interval"])
    hits = _c("bcache_hits", "bcache cache hits (stats_total).", ["device"])
    misses = _c("bcache_misses", "bcache cache misses (stats_total).", ["device"])
    bypassed = _c("bcache_bypassed_bytes", "Bytes that bypassed the cache (stats_total).",
                  ["device"])
    bhits = _c("bcache_bypass_hits", "Bypassed requests that hit (stats_total).", ["device"])
    bmiss = _c("bcache_bypass_misses", "Bypassed requests that missed (stats_total).",
               ["device"])
    coll = _c("bcache_miss_collisions", "Miss collisions (stats_total).", ["device"])
    rate = _g("bcache_writeback_rate_bytes", "Current writeback rate, bytes per second.",
              ["device"])
    wbp = _g("bcache_writeback_percent", "writeback_percent tunable.", ["device"])
    errors = _g("bcache_io_errors", "IO errors counted on the backing device.", ["device"])
    attached = _g("bcache_attached", "1 if the backing device is attached to a cache set.",
                  ["device", "backing", "cset"])
    avail = _g("bcache_cache_available_ratio", "Share of the cache set that is available.",
               ["cset"])
    cerr = _g("bcache_cache_io_errors", "IO errors counted on the cache device.",
              ["cset", "cache_device"])
    lost = _g("bcache_unregistered_dirty", "1 for a backing device that bcache stopped while "
              "its dirty data sat in a cache set that is gone.", ["backing", "cset"])
    for b in snap.backings:
        name = b.device or b.identity.node
        if b.dirty is not None and not (b.state == CacheState.DIRTY and b.cset_uuid is None):
            dirty.add_metric(["bcache", name], b.dirty.low)
        if b.mode is not None:
            for m in BCACHE_MODES:
                mode.add_metric(["bcache", name, m], 1.0 if b.mode.value == m else 0.0)
        for s in STATES:
            state.add_metric(["bcache", name, s], 1.0 if b.state.value == s else 0.0)
        for interval, st in b.stats.items():
            r = st.computed_hit_ratio
            if r is not None:
                hit.add_metric([name, interval], r)
        tot = b.stats.get("total")
        if tot is not None:
            for fam, v in ((hits, tot.hits), (misses, tot.misses), (bhits, tot.bypass_hits),
                           (bmiss, tot.bypass_misses), (coll, tot.miss_collisions),
                           (bypassed, tot.bypassed.low if tot.bypassed else None)):
                if v is not None:
                    fam.add_metric([name], v)
        if b.writeback_rate is not None:
            rate.add_metric([name], b.writeback_rate.low)
        if b.writeback_percent is not None:
            wbp.add_metric([name], b.writeback_percent)
        if b.io_errors is not None:
            errors.add_metric([name], b.io_errors)
        attached.add_metric([name, b.identity.node, b.cset_uuid or ""],
                            1.0 if b.cset_uuid else 0.0)
    for c in snap.cache_sets:
        if c.cache_available_percent is not None:
            avail.add_metric([c.uuid], c.cache_available_percent / 100)
        for x in c.caches:
            if x.io_errors is not None:
                cerr.add_metric([c.uuid, x.identity.node], x.io_errors)
    for u in snap.unregistered:
        if u.kind == "backing":
            lost.add_metric([u.identity.node, u.cset_uuid or ""],
                            1.0 if u.dirty_data_lost_with_cache else 0.0)

    dm_used = _g("dmcache_used_blocks", "Cache blocks in use.", ["device"])
    dm_total = _g("dmcache_total_blocks", "Cache blocks in all.", ["device"])
    dm_block = _g("dmcache_block_bytes", "Cache block size.", ["device"])
    dm_md = _g("dmcache_metadata_used_ratio", "Share of the metadata device in use.", ["device"])
    dm_counters = {k: _c(f"dmcache_{k}", f"dm-cache {k.replace('_', ' ')}.", ["device"])
                   for k in ("read_hits", "read_misses", "write_hits", "write_misses",
                             "demotions", "promotions")}
    dm_check = _g("dmcache_needs_check", "1 if the metadata needs a check.", ["device"])
    dm_ro = _g("dmcache_metadata_read_only", "1 if the metadata went read-only.", ["device"])
    for d in snap.dmcaches:
        name = d.node
        db = d.dirty_bytes
        if db is not None:
            dirty.add_metric(["dm-cache", name], db)
        m_active = d.mode.value
        for m in DM_MODES:
            mode.add_metric(["dm-cache", name, m], 1.0 if m_active == m else 0.0)
        for s in STATES:
            state.add_metric(["dm-cache", name, s], 1.0 if d.state.value == s else 0.0)
        ds = d.status
        if ds is None:
            continue
        dm_used.add_metric([name], ds.used)
        dm_total.add_metric([name], ds.total)
        dm_block.add_metric([name], ds.block_sectors * 512)
        if ds.metadata_total:
            dm_md.add_metric([name], ds.metadata_used / ds.metadata_total)
        for k, fam in dm_counters.items():
            fam.add_metric([name], getattr(ds, k))
        dm_check.add_metric([name], 1.0 if ds.needs_check else 0.0)
        dm_ro.add_metric([name], 1.0 if ds.metadata_mode == "ro" else 0.0)

    up = _g("bcache_loaded", "1 if the bcache module is loaded.", [])
    up.add_metric([], 1.0 if snap.bcache_loaded else 0.0)
    warn = _g("scan_warnings", "Files the last scan could not read or parse.", [])
    warn.add_metric([], len(snap.warnings))
    yield from (dirty, mode, state, hit, hits, misses, bypassed, bhits, bmiss, coll, rate, wbp,
                errors, attached, avail, cerr, lost, dm_used, dm_total, dm_block, dm_md,
                *dm_counters.values(), dm_check, dm_ro, up, warn)


class SnapshotCollector(Collector):
    """Takes a fresh snapshot on every scrape."""

    def __init__(self, sysfs: Sysfs) -> None:
        self.sysfs = sysfs

    def collect(self) -> Iterable[Metric]:
        return list(collect(snapshot_mod.take(self.sysfs, probe_unregistered=True)))

