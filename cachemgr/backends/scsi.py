"""SCSI hotplug backend: remove a disk, rescan its host, wait for a disk to come (back).

The SSD replacement procedure pulls the old cache disk out of the kernel and brings the new one
in without a reboot (docs/kernel-notes.md, "SCSI and NVMe hotplug"):

* remove: ``echo 1 > /sys/block/sdX/device/delete`` (the sd driver synchronises the disk's
  write cache, then the SCSI device goes away; on the 7.2 lab the block device is gone when the
  write returns);
* insert: ``echo '- - -' > /sys/class/scsi_host/hostN/scan`` (channel, target, lun wildcards;
  ``C T L`` numbers scan one address), on the host the removed disk was on;
* the scan and the sd probe can finish after the write returns, and the disk may come back
  under another name: :func:`wait_for_disk` polls for it by WWN, serial or H:C:T:L.

A disk's SCSI address comes from its ``device`` link, which ends in ``H:C:T:L`` (7.2 lab:
``block/sda/device -> ../../../0:0:0:0``), or else from ``device/scsi_device/H:C:T:L``. Its
host is ``host<H>`` (``class/scsi_host/host0``). The lab's SCSI disks come from scsi_debug,
whose host number depends on the other SCSI hosts the kernel has: :func:`find_scsi_debug_host`
finds it from scsi_debug's adapter on the pseudo bus (``bus/pseudo/drivers/scsi_debug/
adapter0 -> devices/pseudo_0/adapter0``, which holds ``host0``).

Every kernel file goes through a :class:`~cachemgr.core.sysfs.Sysfs`, every program through
:func:`cachemgr.core.runner.run`. /proc/self/mountinfo and /proc/swaps are read for the in-use check
on the live system only.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cachemgr.backends import inuse
from cachemgr.backends.identity import (
    AUTO,
    ProcText,
    id_words,
    kernel_identity,
    looks_like_wwn,
    normalize_wwn,
)
from cachemgr.core import runner
from cachemgr.core.change import wait_for
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    KernelFormatError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

SCSI_DEBUG_DRIVER = "bus/pseudo/drivers/scsi_debug"


_HCTL = re.compile(r"^(\d+):(\d+):(\d+):(\d+)$")
_HOST = re.compile(r"^host(\d+)$")


@dataclass(frozen=True, order=True)
class Hctl:
    """A SCSI address: host, channel, target, lun (``0:0:1:0``)."""

    host: int
    channel: int
    target: int
    lun: int

    @classmethod
    def parse(cls, text: str) -> Hctl:
        """``"0:0:1:0"`` -> Hctl; KernelFormatError for anything else."""
        m = _HCTL.match(text.strip())
        if not m:
            raise KernelFormatError("SCSI address (H:C:T:L)", text)
        return cls(*(int(g) for g in m.groups()))

    @property
    def host_name(self) -> str:
        return f"host{self.host}"

    def __str__(self) -> str:
        return f"{self.host}:{self.channel}:{self.target}:{self.lun}"


@dataclass(frozen=True)
class ScsiDisk:
    """A SCSI disk as the kernel shows it (no udev needed)."""

    name: str  # sdb
    hctl: Hctl
    wwid: str | None  # device/wwid (kernel form: naa.…), else chosen from VPD page 0x83
    serial: str | None  # device/serial (7.2), else VPD page 0x80
    size_bytes: int | None
    vendor: str | None
    model: str | None
    rev: str | None

    @property
    def host(self) -> str:
        return self.hctl.host_name

    @property
    def node(self) -> str:
        return f"/dev/{self.name}"

    def describe(self) -> str:
        ids = id_words(self.wwid, self.serial)
        return f"{self.name} [{self.hctl}]" + (f" ({ids})" if ids else "")


@dataclass(frozen=True)
class Removed:
    """What :func:`remove` took away, enough to bring it back and to recognise it."""

    disk: ScsiDisk
    overridden: tuple[str, ...] = ()  # in-use reasons that force_in_use went past


@dataclass(frozen=True)
class Rescanned:
    host: str  # host0
    scan: str  # what was written to class/scsi_host/<host>/scan: "- - -" or "C T L"


@dataclass(frozen=True)
class WaitProgress:
    """One poll of :func:`wait_for_disk`: how long so far, and which SCSI disks exist."""

    elapsed: float
    timeout: float
    present: tuple[str, ...]


# ---------------------------------------------------------------------------------------
# reading


def _whole_disk(sysfs: Sysfs, name: str) -> str:
    """``block/<name>``, or UsageError naming the problem (unknown, or a partition)."""
    rel = f"block/{name}"
    if sysfs.exists(rel):
        return rel
    disk = sysfs.disk_of_partition(name)
    if disk is not None:
        raise UsageError(f"/dev/{name} is a partition of /dev/{disk}",
                         hint=f"SCSI hotplug works on whole disks: use /dev/{disk}")
    raise UsageError(f"no such block device: {name}",
                     hint="lsblk -o NAME,HCTL,SERIAL,WWN lists the SCSI disks")


def scsi_address(sysfs: Sysfs, name: str) -> Hctl:
    """The H:C:T:L of disk ``name``; UsageError if it is not a SCSI disk."""
    rel = _whole_disk(sysfs, name)
    link = sysfs.readlink(f"{rel}/device")
    if link:
        base = os.path.basename(link.rstrip("/"))
        if _HCTL.match(base):
            return Hctl.parse(base)
    entries = [e for e in sysfs.listdir(f"{rel}/device/scsi_device") if _HCTL.match(e)]
    if len(entries) == 1:
        return Hctl.parse(entries[0])
    raise UsageError(f"/dev/{name} is not a SCSI disk",
                     hint="SCSI hotplug works on sd disks; NVMe uses device/remove and a PCI "
                          "rescan")


def _clean(text: str | None) -> str | None:
    if text is None:
        return None
    return text.strip() or None


def scsi_disk(sysfs: Sysfs, name: str) -> ScsiDisk:
    """Read SCSI disk ``name``; UsageError if there is no such SCSI disk."""
    hctl = scsi_address(sysfs, name)
    rel = f"block/{name}"
    ident = kernel_identity(sysfs, name, rel)
    return ScsiDisk(
        name=name,
        hctl=hctl,
        wwid=ident.wwn,
        serial=ident.serial,
        size_bytes=ident.size_bytes,
        vendor=_clean(sysfs.read_opt(f"{rel}/device/vendor")),
        model=ident.model,
        rev=_clean(sysfs.read_opt(f"{rel}/device/rev")),
    )


def disks(sysfs: Sysfs) -> tuple[ScsiDisk, ...]:
    """Every SCSI disk, by address. Disks that vanish while being read are left out."""
    out = []
    for name in sysfs.block_names():
        try:
            out.append(scsi_disk(sysfs, name))
        except UsageError:
            continue
    return tuple(sorted(out, key=lambda d: d.hctl))


def hosts(sysfs: Sysfs) -> tuple[str, ...]:
    """The SCSI hosts (``host0``...), in number order."""
    found = [h for h in sysfs.listdir("class/scsi_host") if _HOST.match(h)]
    return tuple(sorted(found, key=lambda h: int(h[4:])))


def scsi_debug_hosts(sysfs: Sysfs) -> tuple[str, ...]:
    """The SCSI hosts scsi_debug created (one per ``add_host``), in number order.

    From its adapters on the pseudo bus (7.2 lab: ``bus/pseudo/drivers/scsi_debug/adapter0 ->
    ../../../../devices/pseudo_0/adapter0``, which contains ``host0``); if that is missing,
    from the hosts whose ``proc_name`` is ``scsi_debug``.
    """
    found: set[str] = set()
    for entry in sysfs.listdir(SCSI_DEBUG_DRIVER):
        if re.fullmatch(r"adapter\d+", entry):
            adapter = sysfs.resolve(f"{SCSI_DEBUG_DRIVER}/{entry}")
            if adapter:
                found.update(e for e in sysfs.listdir(adapter) if _HOST.match(e))
    if not found:
        found.update(h for h in hosts(sysfs)
                     if _clean(sysfs.read_opt(f"class/scsi_host/{h}/proc_name")) == "scsi_debug")
    return tuple(sorted(found, key=lambda h: int(h[4:])))


def find_scsi_debug_host(sysfs: Sysfs) -> str:
    """scsi_debug's (first) SCSI host, e.g. ``host0``; CacheMgrError if it is not loaded."""
    found = scsi_debug_hosts(sysfs)
    if not found:
        raise CacheMgrError("scsi_debug is not loaded: no scsi_debug adapter on the pseudo bus",
                            hint="modprobe scsi_debug delay=0 dev_size_mb=64 "
                                 '(docs/kernel-notes.md, "scsi_debug in the lab")')
    return found[0]


# ---------------------------------------------------------------------------------------
# in use?


def in_use(sysfs: Sysfs, name: str, *, mountinfo: ProcText = AUTO,
           swaps: ProcText = AUTO) -> tuple[str, ...]:
    """Why disk ``name`` (or one of its partitions) is in use; empty when it is not
    (:func:`cachemgr.backends.inuse.reasons`: held, registered with bcache, mounted, swap).
    ``mountinfo`` and ``swaps`` are the texts of /proc/self/mountinfo and /proc/swaps; AUTO
    reads them on the live system and skips them on a capture, None skips them.
    """
    rel = _whole_disk(sysfs, name)
    return inuse.reasons(sysfs, rel, *inuse.texts(sysfs, mountinfo, swaps))


# ---------------------------------------------------------------------------------------
# remove, rescan, wait


def remove(sysfs: Sysfs, name: str, *, force_in_use: bool = False, timeout: float = 10.0,
           mountinfo: ProcText = AUTO,
           swaps: ProcText = AUTO) -> Removed:
    """Take SCSI disk ``name`` out of the kernel (``device/delete``), like pulling it.

    Refused with UnsafeError while the disk is in use (see :func:`in_use`): pulling a
    registered bcache cache device fails its cache set, and with dirty data the backing
    devices stop (docs/kernel-notes.md, "Failure"). ``force_in_use`` goes ahead anyway and
    records what it went past. Waits up to ``timeout`` for the block device to disappear
    (TimeoutExpired).
    """
    disk = scsi_disk(sysfs, name)
    reasons = in_use(sysfs, name, mountinfo=mountinfo, swaps=swaps)
    if reasons and not force_in_use:
        raise UnsafeError(
            f"refusing to remove {disk.node} [{disk.hctl}]: " + "; ".join(reasons),
            hint="stop what uses it first (a bcache cache: detach its backing devices and "
                 "unregister the set; unmount; dmsetup remove), or force it if the data on it "
                 "may be lost")
    if reasons:
        log.warning("removing %s although: %s", disk.node, "; ".join(reasons))
    before = sysfs.resolve(f"block/{name}")
    log.info("removing SCSI disk %s", disk.describe())
    sysfs.write(f"block/{name}/device/delete", "1")

    def gone() -> bool:
        return sysfs.resolve(f"block/{name}") != before

    if not _poll(gone, timeout):
        raise TimeoutExpired(
            f"wrote 1 to {name}/device/delete but {disk.node} [{disk.hctl}] is still there "
            f"after {timeout:g} s",
            hint="the device may be busy in the SCSI error handler; check dmesg")
    return Removed(disk, reasons)


def rescan(sysfs: Sysfs, target: str | int | Hctl) -> Rescanned:
    """Scan a SCSI host for new devices: ``- - -`` to its ``scan`` file.

    ``target``: ``host0``, ``0``, an int, or an address (an Hctl or ``"0:0:1:0"``), which scans
    only that channel/target/lun. UsageError for a host that does not exist. The sd probe of
    what the scan finds completes later: follow with :func:`wait_for_disk`.
    """
    value = "- - -"
    if isinstance(target, Hctl):
        host, value = target.host_name, f"{target.channel} {target.target} {target.lun}"
    elif isinstance(target, int):
        host = f"host{target}"
    else:
        t = target.strip()
        if _HCTL.match(t):
            return rescan(sysfs, Hctl.parse(t))
        host = f"host{t}" if t.isdigit() else t
    if not _HOST.match(host) or not sysfs.exists(f"class/scsi_host/{host}/scan"):
        raise UsageError(f"no SCSI host {host!r}",
                         hint="the hosts are: " + (", ".join(hosts(sysfs)) or "none"))
    log.info("rescanning SCSI %s (%s)", host, value)
    sysfs.write(f"class/scsi_host/{host}/scan", value)
    return Rescanned(host, value)


@dataclass(frozen=True)
class DiskMatch:
    """What :func:`wait_for_disk` looks for: a WWN, a serial or a SCSI address."""

    kind: Literal["wwn", "serial", "hctl"]
    value: str

    @classmethod
    def parse(cls, match: str | Hctl) -> DiskMatch:
        """An Hctl or ``H:C:T:L``; ``serial:X``; a WWN (``naa.…``, ``0x…``, ``wwn-0x…``,
        ``eui.…``); anything else is taken as a serial."""
        if isinstance(match, Hctl):
            return cls("hctl", str(match))
        t = match.strip()
        if not t:
            raise UsageError("empty disk match", hint="give a WWN, serial:XYZ or H:C:T:L")
        if _HCTL.match(t):
            return cls("hctl", str(Hctl.parse(t)))
        if t.lower().startswith("serial:"):
            return cls("serial", t[len("serial:"):].strip())
        if looks_like_wwn(t):
            return cls("wwn", normalize_wwn(t) or t)
        return cls("serial", t)

    def matches(self, disk: ScsiDisk) -> bool:
        if self.kind == "hctl":
            return str(disk.hctl) == self.value
        if self.kind == "serial":
            return disk.serial == self.value
        return disk.wwid is not None and normalize_wwn(disk.wwid) == self.value

    def __str__(self) -> str:
        return f"{self.kind} {self.value}"


def _poll(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    return wait_for(pred, timeout, interval)


def wait_for_disk(sysfs: Sysfs, match: str | Hctl, timeout: float, *, interval: float = 0.1,
                  progress: Callable[[WaitProgress], None] | None = None) -> ScsiDisk:
    """Poll until a SCSI disk matching ``match`` is there and usable, and return it.

    Usable: its size is known and non-zero and, on the live system, its /dev node exists.
    ``progress`` is called after each poll that did not find it. TimeoutExpired after
    ``timeout`` seconds, naming what is there instead.
    """
    want = DiskMatch.parse(match)
    live = sysfs.live
    start = time.monotonic()
    while True:
        present = disks(sysfs)
        for d in present:
            if want.matches(d) and d.size_bytes and (not live or inuse.node_ready(d.node)):
                return d
        elapsed = time.monotonic() - start
        if progress is not None:
            progress(WaitProgress(elapsed, timeout, tuple(d.name for d in present)))
        if elapsed >= timeout:
            seen = "; ".join(d.describe() for d in present) or "none"
            raise TimeoutExpired(
                f"no SCSI disk with {want} appeared within {timeout:g} s (SCSI disks: {seen})",
                hint="rescan the disk's SCSI host, check it is plugged in, and look in dmesg")
        time.sleep(max(0.0, min(interval, timeout - elapsed)))


# ---------------------------------------------------------------------------------------
# scsi_debug (the lab's SCSI disks)


def load_scsi_debug(sysfs: Sysfs, *, timeout: float = 30.0,
                    **params: int | str) -> tuple[ScsiDisk, ...]:
    """Load scsi_debug with ``params`` and wait for its disks; returns them by address.

    ``delay=0`` unless given: the default one-jiffy delay makes the "SSD" slower than bcache's
    congestion thresholds and bcache silently bypasses it (docs/kernel-notes.md, "scsi_debug
    in the lab"). sd_mod is loaded too: without udevd nothing loads it for the new devices
    (7.2 lab). Without ``per_host_store``
    all of scsi_debug's disks share one RAM store: what is written to one shows on the others.
    AlreadyError if scsi_debug is loaded.
    """
    if sysfs.is_dir(SCSI_DEBUG_DRIVER):
        raise AlreadyError("scsi_debug is already loaded",
                           hint="rmmod scsi_debug to load it with other parameters")
    opts: dict[str, int | str] = {"delay": 0, **params}
    runner.run(["modprobe", "scsi_debug", *(f"{k}={v}" for k, v in opts.items())], timeout=60)
    runner.run(["modprobe", "sd_mod"], timeout=60)
    expected = 1
    for key in ("num_tgts", "max_luns", "add_host"):
        expected *= int(opts.get(key, 1))
    found: tuple[ScsiDisk, ...] = ()

    def ready() -> bool:
        nonlocal found
        mine = set(scsi_debug_hosts(sysfs))
        found = tuple(d for d in disks(sysfs) if d.host in mine and d.size_bytes
                      and (not sysfs.live or inuse.node_ready(d.node)))
        return len(found) >= expected

    if not _poll(ready, timeout, 0.1):
        raise TimeoutExpired(f"scsi_debug showed {len(found)} of {expected} disks within "
                             f"{timeout:g} s", hint="check dmesg for the sd probe")
    return found
