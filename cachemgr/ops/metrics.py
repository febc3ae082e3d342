"""``cachemgr metrics``'s scrape: the snapshot ``cachemgr status`` takes and the findings
``cachemgr check`` gives, exported by procedures/metrics.py (``collect``, the textfile and
the listener).

Why here and not beside ``collect``: a scrape read the host its own way before (a bare
scan and the owners), so the findings that need what status adds to a scan (the kernel log's
failed requests of a dm-cache SSD, a dm-cache record that cannot be used, a recorded device
not assembled, the journals that cannot be read, SMART's replace-soon) were never exported
(issue #41). One path now: :class:`SnapshotCollector` calls ``ops.cache.status`` and
``ops.health.findings``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from cachemgr.backends import smart
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import GoneBacking, Snapshot, Unseen, VmScan
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import health as health_ops
from cachemgr.procedures import governor, health, traffic, unseen
from cachemgr.procedures.metrics import STATS_EVERY, VM_EVERY, collect, health_metrics

__all__ = ["KERNEL_LOG", "STATS_EVERY", "VM_EVERY", "SnapshotCollector", "gone"]

# cachemgr_unseen's ``what`` for a kernel log the scrape could not read
KERNEL_LOG = "kernel-log"

log = logging.getLogger("cachemgr.procedures.metrics")


def gone(sysfs: Sysfs, snap: Snapshot) -> Iterator[GoneBacking]:
    """The bcache backing devices ``check`` last saw dirty (health.remembered) that a scrape
    can tell are gone without opening a disk: not registered, and their disk is not on the
    host under its name any more (``block/NAME`` in sysfs, or the node's device number).
    One whose disk is still there may be stopped by bcache (``stranded-dirty``, which only
    a probe of its superblock tells: ``check`` and ``status`` make it) or another disk in
    its place: not said here (the alert CachemgrDirtyDeviceGone covers a stopped device)."""
    if any(u.what == unseen.STATE for u in snap.unseen):
        return
    for g in health.gone(snap, health.remembered()):
        name = os.path.basename(g.node)
        there = (sysfs.exists(f"block/{name}") or sysfs.disk_of_partition(name) is not None
                 or (sysfs.live and sysfs.block_name_of(g.node) is not None))
        if not there:
            yield g


class SnapshotCollector(Collector):
    """A snapshot per scrape, from what a poller already knows: sysfs and dmsetup only, never
    a disk probe. The snapshot is ``cachemgr status``'s (ops.cache.status: the owners, the
    protected SSDs, the unassembled dm-cache records, the kernel log's failed requests, the
    records that cannot be used), and the findings are ``cachemgr check``'s (:func:`findings`),
    so ``cachemgr_health_finding`` has every code ``check`` gives, but for what only a disk
    probe tells (``stranded-dirty``; ``backing-gone-dirty`` of a disk still on the host: see
    :func:`gone`).

    It keeps a :class:`~cachemgr.backends.scancache.ScanCache`, so identities, the device
    list, bcache's UUIDs and labels and ``dmsetup table`` are read again only after a uevent
    (docs/kernel-notes.md, "uevent_seqnum"); every scrape reads the counters, ``stats_total``,
    modes, states, dirty data and the tunables (its cache keeps none of the values a TUI poll
    takes from its last full read: ``keep=0``). bcache's five_minute/hour/day stats are read every
    ``STATS_EVERY`` seconds and carried between (``snapshot.carry_stats``), libvirt's domains
    every ``VM_EVERY`` seconds (their pressure and IO with them): the first scrape asks
    libvirt itself, a later one that finds the answer old starts a new look in a thread of
    its own (``background``) and exports the last answer meanwhile, so no scrape waits on
    libvirt (through virsh, a call per domain: 20 domains took 14 s in the UML lab, past
    Prometheus's default scrape timeout; libvirt's binding answers in one listing, each
    domain's XML kept until an event: backends/virsh.py). ``clock``: monotonic seconds
    (tests)."""

    def __init__(self, sysfs: Sysfs, *, vms: bool = True, uri: str | None = None,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        self.sysfs = sysfs
        self.vms = vms  # also libvirt's domains (every VM_EVERY s)
        self.uri = uri
        self.clock = clock
        self.background = background
        self._vm_thread: threading.Thread | None = None
        self.meter = traffic.Meter()
        # keep=0: every scrape reads the tunables and bypass counters a TUI poll takes from
        # its last full read (backends/scancache.py): a counter is exported as it reads now
        self.cache = cache_ops.ScanCache(keep=0)
        self._lock = threading.Lock()  # one scan at a time (the listener's threads)
        self._stats_at: float | None = None
        self._with_stats: Snapshot | None = None
        self._vms_at: float | None = None
        self._vms: VmScan | None = None
        self._said: tuple[Unseen, ...] = ()  # what was not read, as last logged

    def snapshot(self) -> Snapshot:
        """This scrape's snapshot (what :meth:`collect` exports)."""
        return self._scrape()[0]

    def _scrape(self) -> tuple[Snapshot, dict[str, float | None]]:
        """The snapshot and each backing device's written-back bytes per second since the
        previous scrape (procedures/traffic.py)."""
        with self._lock:
            now = self.clock()
            stats = self._stats_at is None or now - self._stats_at >= STATS_EVERY
            snap = cache_ops.status(self.sysfs, stats=stats, cache=self.cache)
            if stats:
                self._stats_at, self._with_stats = now, snap
            else:
                snap = cache_ops.carry_stats(snap, self._with_stats)
            written = self.meter.update(self.sysfs, snap.backings, now, self.cache)
            if self.vms:
                if self._vms_at is None:
                    self._vms_at, self._vms = now, self._scan_vms(snap)
                elif now - self._vms_at >= VM_EVERY and self._vm_thread is None:
                    self._vms_at = now
                    if self.background:
                        self._vm_thread = threading.Thread(
                            target=self._refresh_vms, args=(snap,), name="metrics-vms",
                            daemon=True)
                        self._vm_thread.start()
                    else:
                        self._vms = self._scan_vms(snap)
                snap = dataclasses.replace(snap, vms=self._vms)
            snap = dataclasses.replace(snap, gone=tuple(gone(self.sysfs, snap)),
                                       unseen=snap.unseen + tuple(self._log_unseen(snap)))
            return snap, written

    def _log_unseen(self, snap: Snapshot) -> Iterator[Unseen]:
        """The kernel log, when the scrape could not read it while the host has a
        device-mapper cache (the shipped unit's sandbox before it allowed /dev/kmsg; a user
        without CAP_SYSLOG where kernel.dmesg_restrict is 1): a failing cache SSD would not
        be seen, so never OK (cachemgr_health_status 3, as for what another user cannot
        read)."""
        reader = self.cache.kernlog
        why = reader.why_not if reader is not None else None
        if snap.dm_devices and why:
            yield Unseen(KERNEL_LOG, "/dev/kmsg", why.rsplit(": ", 1)[-1],
                         "a device-mapper cache's SSD failing requests (failing-cache-dirty, "
                         "cache-io-errors)")

    def _scan_vms(self, snap: Snapshot) -> VmScan:
        from cachemgr.backends import virsh
        from cachemgr.backends import vms as vms_mod

        return vms_mod.scan(self.sysfs, snap, virsh.default_source(self.sysfs, self.uri))

    def _refresh_vms(self, snap: Snapshot) -> None:
        try:
            self._vms = self._scan_vms(snap)
        except Exception:  # the last answer stays; the next due scrape tries again
            log.warning("metrics: libvirt's domains not read", exc_info=True)
        finally:
            self._vm_thread = None

    def collect(self) -> Iterable[Metric]:
        snap, written = self._scrape()
        blind = any(u.what == unseen.STATE for u in snap.unseen)
        if snap.unseen and snap.unseen != self._said:  # said once on stderr (the unit's log)
            self._said = snap.unseen
            log.warning("%s", unseen.words(snap.unseen))
        rows = [] if blind else smart.ssd_health(self.sysfs, snap, refresh=False)
        return [*collect(snap, written_back=written, findings=health_ops.findings(snap, rows)),
                *health_metrics(rows), *_governor(blind)]


def _governor(blind: bool) -> list[Metric]:
    """The writeback governor's figures (procedures/governor.py ``metrics``), from its state
    file: none when the state directory cannot be read (another user than root)."""
    if blind:
        return []
    try:
        st = governor.load_state()
    except (OSError, CacheMgrError):
        st = None
    return governor.metrics(st, time.time())
