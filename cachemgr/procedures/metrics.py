"""Prometheus metrics from the snapshot, for bcache and dm-cache alike.

``collect(snapshot)`` yields metric families; the CLI writes them in node_exporter's
textfile format or serves them on /metrics (prometheus-client). Beyond node_exporter's bcache
collector: dm-cache, mode and state as labelled gauges, and no crash when a kernel lacks a
stats file (a missing value is simply not exported). ``priority_stats`` is never read (the
snapshot never reads it).

Naming (Prometheus conventions): ``cachemgr_`` prefix, base units (bytes, seconds), ``_total``
for counters. bcache's five_minute/hour/day stats are decaying windows, exported as
``cachemgr_bcache_hit_ratio{interval=...}`` gauges; only ``stats_total`` feeds counters.

A scrape (and the textfile timer) reads what the kernel already exposes: /sys, and dmsetup's
table/status for dm-cache. It never opens a block device: no libblkid probe of unclaimed disks
(the VMs' disks among them), so a backing device that bcache stopped while dirty, which only
its superblock still shows, is not exported; ``cachemgr status`` probes for it.

The listener (:func:`parse_listen`, :func:`serve`) binds loopback unless told otherwise:
``:PORT`` or ``PORT`` is 127.0.0.1 and ::1; every address takes an explicit ``0.0.0.0:PORT``
or ``[::]:PORT``.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import socketserver
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.core.errors import CacheMgrError, UsageError
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

    wc_free = _g("writecache_free_blocks", "dm-writecache blocks free.", ["device"])
    wc_total = _g("writecache_total_blocks", "dm-writecache blocks in all.", ["device"])
    wc_wb = _g("writecache_writeback_blocks", "dm-writecache blocks being written back.",
               ["device"])
    wc_err = _g("writecache_error", "dm-writecache error indicator (0: none).", ["device"])
    for w in snap.writecaches:
        name = w.node
        if w.dirty_bytes is not None:
            dirty.add_metric(["dm-writecache", name], w.dirty_bytes)
        for m in DM_MODES:  # writecache has writeback only
            mode.add_metric(["dm-writecache", name, m], 1.0 if m == w.mode.value else 0.0)
        for s in STATES:
            state.add_metric(["dm-writecache", name, s], 1.0 if w.state.value == s else 0.0)
        if w.status is not None:
            wc_free.add_metric([name], w.status.free)
            wc_total.add_metric([name], w.status.total)
            wc_wb.add_metric([name], w.status.writeback)
            wc_err.add_metric([name], w.status.error)

    lvm = _g("lvm_cache_info", "1 for each LVM-owned cache: its VG/LV, cache pool or "
             "cachevol, and whether lvm2 says it needs a check.",
             ["device", "lv", "cache", "kind", "check_needed"])
    for dmdev in snap.dm_devices:
        lv = dmdev.lvm
        if lv is not None:
            lvm.add_metric([dmdev.node, lv.full_name, f"{lv.vg}/{lv.pool_name}", lv.kind,
                            "1" if lv.check_needed else "0"], 1.0)

    up = _g("bcache_loaded", "1 if the bcache module is loaded.", [])
    up.add_metric([], 1.0 if snap.bcache_loaded else 0.0)
    warn = _g("scan_warnings", "Files the last scan could not read or parse.", [])
    warn.add_metric([], len(snap.warnings))
    yield from (dirty, mode, state, hit, hits, misses, bypassed, bhits, bmiss, coll, rate, wbp,
                errors, attached, avail, cerr, dm_used, dm_total, dm_block, dm_md,
                *dm_counters.values(), dm_check, dm_ro, wc_free, wc_total, wc_wb, wc_err, lvm,
                up, warn)
    if snap.vms is not None:
        yield from _vm_metrics(snap)


def _vm_metrics(snap: Snapshot) -> Iterator[Metric]:
    """The VMs above the caches (libvirt): each disk and what serves it, and the IO pressure
    and IO of each VM's cgroup and of the host."""
    assert snap.vms is not None
    disk = _g("vm_disk_info", "1 for each VM disk: its cache mode and the cached device "
              "under it (empty: none).", ["vm", "disk", "cache_mode", "device"])
    disk_warn = _g("vm_disk_warnings", "Warnings about a VM disk's cache mode (live "
                   "migration, flushes ignored, stacked write-back layers).", ["vm", "disk"])
    pressure = _g("vm_io_pressure_ratio", "Share of the last 10 s in which some or all of a "
                  "VM's tasks waited on IO (PSI io.pressure avg10 / 100).", ["vm", "kind"])
    stall = _c("vm_io_stall_seconds", "Time some or all of a VM's tasks waited on IO (PSI "
               "total).", ["vm", "kind"])
    ios = _c("vm_io_ops", "IOs of a VM's cgroup (io.stat).", ["vm", "op"])
    nbytes = _c("vm_io_bytes", "Bytes of a VM's cgroup (io.stat).", ["vm", "op"])
    host = _g("host_io_pressure_ratio", "Share of the last 10 s in which some or all tasks "
              "of the host waited on IO (/proc/pressure/io avg10 / 100).", ["kind"])
    host_stall = _c("host_io_stall_seconds", "Time some or all tasks of the host waited on "
                    "IO (/proc/pressure/io total).", ["kind"])
    for v in snap.vms.vms:
        for d in v.disks:
            for dev in d.caches or ("",):
                disk.add_metric([v.name, d.target, d.cache, dev], 1.0)
            disk_warn.add_metric([v.name, d.target], len(d.warnings))
        if v.pressure is not None:
            pressure.add_metric([v.name, "some"], v.pressure.some_avg10 / 100)
            stall.add_metric([v.name, "some"], v.pressure.some_total_us / 1e6)
            if v.pressure.full_avg10 is not None and v.pressure.full_total_us is not None:
                pressure.add_metric([v.name, "full"], v.pressure.full_avg10 / 100)
                stall.add_metric([v.name, "full"], v.pressure.full_total_us / 1e6)
        if v.io is not None:
            ios.add_metric([v.name, "read"], v.io.rios)
            ios.add_metric([v.name, "write"], v.io.wios)
            nbytes.add_metric([v.name, "read"], v.io.rbytes)
            nbytes.add_metric([v.name, "write"], v.io.wbytes)
    hp = snap.vms.host_pressure
    if hp is not None:
        host.add_metric(["some"], hp.some_avg10 / 100)
        host_stall.add_metric(["some"], hp.some_total_us / 1e6)
        if hp.full_avg10 is not None and hp.full_total_us is not None:
            host.add_metric(["full"], hp.full_avg10 / 100)
            host_stall.add_metric(["full"], hp.full_total_us / 1e6)
    yield from (disk, disk_warn, pressure, stall, ios, nbytes, host, host_stall)


class SnapshotCollector(Collector):
    """Takes a fresh snapshot on every scrape: sysfs and dmsetup only, never a disk probe."""

    def __init__(self, sysfs: Sysfs, *, vms: bool = True, uri: str | None = None) -> None:
        self.sysfs = sysfs
        self.vms = vms  # also libvirt's domains (a virsh call per domain and scrape)
        self.uri = uri

    def collect(self) -> Iterable[Metric]:
        return list(collect(snapshot_mod.take(self.sysfs, probe_unregistered=False,
                                              vms=self.vms, uri=self.uri)))


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
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr would flood the journal


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """A threaded WSGI server (one thread per scrape)."""

    daemon_threads = True

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


def serve(listen: Listen, registry: Collector) -> list[_Server]:
    """Bind every address of ``listen`` and serve /metrics from ``registry`` on each, in
    daemon threads; returns the servers (``shutdown()`` + ``server_close()`` to stop).

    Nothing is served unless every address binds: a port in use or an address not on this host
    raises CacheMgrError (exit 1) or UsageError (exit 2). For ``:PORT`` a host without IPv6
    serves on 127.0.0.1 alone."""
    app = make_wsgi_app(registry)
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
            srv.set_app(app)
            servers.append(srv)
    except BaseException:
        for srv in servers:
            srv.server_close()
        raise
    for srv in servers:
        threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return servers

