"""A hot-pluggable disk, whichever its bus: what replace-ssd needs of its cache SSD.

Two kinds of disk (docs/kernel-notes.md, "SCSI and NVMe hotplug"):

* a SCSI disk (:mod:`cachemgr.backends.scsi`) goes alone (``device/delete``) and comes back
  on a scan of its SCSI host; its slot is its address H:C:T:L;
* an NVMe namespace (:mod:`cachemgr.backends.nvme`) goes with its whole controller (the PCI
  function's ``remove``) and comes back on a PCI bus rescan, maybe under another ``nvmeN``
  name; its slot is the controller's PCI function (``0000:01:00.0``): a drive put into the
  same PCIe slot gets the same address.

Above this module nothing asks which bus a disk is on: identity (WWID, serial), the slot, what
uses it, remove, rescan and wait are the same calls for both.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cachemgr.backends import inuse, nvme, scsi
from cachemgr.backends.identity import AUTO, ProcText, looks_like_wwn, normalize_wwn
from cachemgr.core.errors import CacheMgrError, TimeoutExpired, UsageError
from cachemgr.core.sysfs import Sysfs

Disk = scsi.ScsiDisk | nvme.NvmeNamespace
Bus = Literal["scsi", "nvme"]

_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_HCTL = re.compile(r"^\d+:\d+:\d+:\d+$")


def bus(d: Disk) -> Bus:
    return "nvme" if isinstance(d, nvme.NvmeNamespace) else "scsi"


def slot(d: Disk) -> str:
    """Where the disk sits: a SCSI address, an NVMe controller's PCI function ("" for an
    NVMe controller that is not a PCIe function)."""
    return d.pci or "" if isinstance(d, nvme.NvmeNamespace) else str(d.hctl)


def where(d: Disk) -> str:
    """The slot in words: ``SCSI 0:0:1:0``, ``PCI 0000:01:00.0``."""
    return f"PCI {slot(d)}" if bus(d) == "nvme" else f"SCSI {slot(d)}"


def disk(sysfs: Sysfs, name: str) -> Disk:
    """The SCSI disk or NVMe namespace ``name`` is (or is a partition of); UsageError for any
    other block device (virtio, loop, device-mapper, a missing name)."""
    whole = name if sysfs.exists(f"block/{name}") else sysfs.disk_of_partition(name) or name
    if nvme.is_namespace(whole):
        return nvme.namespace(sysfs, whole)
    try:
        return scsi.scsi_disk(sysfs, name)
    except CacheMgrError as exc:
        raise UsageError(f"/dev/{name} is neither a SCSI disk nor an NVMe namespace "
                         f"({exc.message})",
                         hint="cachemgr hot-plugs SCSI disks (sdX) and NVMe namespaces "
                              "(nvmeXnY)") from None


def disks(sysfs: Sysfs) -> tuple[Disk, ...]:
    """Every SCSI disk and NVMe namespace."""
    return (*scsi.disks(sysfs), *nvme.namespaces(sysfs))


def in_use(sysfs: Sysfs, d: Disk, *, mountinfo: ProcText = AUTO,
           swaps: ProcText = AUTO) -> tuple[str, ...]:
    """Why ``d`` itself (or a partition of it) is in use: held, bcache, mounted, swap."""
    return inuse.reasons(sysfs, f"block/{d.name}", *inuse.texts(sysfs, mountinfo, swaps))


def removal_refusals_besides(sysfs: Sysfs, d: Disk, member: str | None, *,
                             mountinfo: ProcText = AUTO,
                             swaps: ProcText = AUTO) -> tuple[str, ...]:
    """Why pulling ``d`` would not be safe even once ``member`` (``d`` or a partition of it:
    the cache device being replaced) is released: another use of ``d`` or of its
    partitions; for NVMe, a controller that is not a PCIe function, or one that carries
    another namespace (in use or not: it goes too). Empty when nothing else is in the way.
    At plan time, so that a run does not stop at its remove step after the drain.
    ``member`` None: every use of ``d`` is the cache's own (an LVM PV under a cache: its
    dm devices hold it); only the controller is checked."""
    texts = inuse.texts(sysfs, mountinfo, swaps)
    out = [] if member is None else [
        r for u, r in _uses_in_words(sysfs, d.name, texts)
        if not (u.member == member and _bcache_own(sysfs, u))]
    if isinstance(d, nvme.NvmeNamespace):
        out += nvme.controller_refusals(sysfs, d, mountinfo=texts[0], swaps=texts[1])
    return tuple(dict.fromkeys(out))


def _bcache_own(sysfs: Sysfs, u: inuse.Use) -> bool:
    """A use the cache device has as long as its set is registered: its bcache directory,
    and a bcache device over it as holder (the kernel links the cache device under every
    bcacheN of the set: lab, 6.1 and 7.2)."""
    return u.kind == "bcache" or (u.kind == "held" and u.by.startswith("bcache")
                                  and sysfs.is_dir(f"block/{u.by}/bcache"))


def _uses_in_words(sysfs: Sysfs, name: str,
                   texts: tuple[str | None, str | None]) -> list[tuple[inuse.Use, str]]:
    rel = f"block/{name}"
    return [(u, inuse.reasons_of(sysfs, (u,))[0])
            for u in inuse.uses(sysfs, rel, mountinfo=texts[0], swaps=texts[1])]


@dataclass(frozen=True)
class Removed:
    disk: Disk
    how: str  # what was done, in words


# the one hotplug method of each bus (docs/kernel-notes.md, "SCSI and NVMe hotplug"): a
# journal records it, so --resume does what the plan said
METHODS = {"scsi": "scsi-delete-scan", "nvme": "pci-remove-rescan"}


def method_words(old: dict[str, Any]) -> str:
    """How :func:`remove` and :func:`rescan` take a recorded disk (:func:`record`) out and
    bring one back, in words (the plan prints it). NVMe: never slot power: in the qemu lab a
    slot's power-off (acpiphp or pciehp) deletes the emulated drive for good, so the method is
    unproven there."""
    if old.get("bus") == "nvme":
        return (f"PCI remove/rescan (PCI function {old.get('slot')} removed with its whole "
                "controller, then a PCI bus rescan; a hotplug slot's power is not used)")
    return f"SCSI delete/scan (delete {old.get('hctl')}, then scan SCSI {old.get('host')})"


def remove(sysfs: Sysfs, d: Disk, *, timeout: float = 10.0) -> Removed:
    """Take ``d`` out of the kernel, like pulling it (refused, nothing written, while it or
    what goes with it is in use)."""
    if isinstance(d, nvme.NvmeNamespace):
        r = nvme.remove(sysfs, d.name, timeout=timeout)
        return Removed(r.namespace, f"NVMe controller {d.controller} (PCI {d.pci}) removed")
    rs = scsi.remove(sysfs, d.name, timeout=timeout)
    return Removed(rs.disk, f"removed from SCSI {rs.disk.host}")


def rescan(sysfs: Sysfs, old: dict[str, Any]) -> str:
    """Look for disks where the old one was (``old``: a journal's record of it, see
    :func:`record`): its SCSI host, or the PCI bus. Returns what was scanned, in words.
    A recorded method this version does not know (a later one's journal) is refused."""
    if old.get("method", METHODS.get(str(old.get("bus")), "")) not in METHODS.values():
        raise UsageError(f"the journal asks for hotplug method {old.get('method')!r}, which "
                         "this cachemgr does not know", hint="resume with the version that "
                         "made the plan")
    if old.get("bus") == "nvme":
        nvme.rescan(sysfs)
        return "PCI bus rescanned"
    r = scsi.rescan(sysfs, str(old["host"]))
    return f"SCSI {r.host} scanned"


def record(d: Disk) -> dict[str, Any]:
    """What a journal keeps of a disk to find it again and to say where it was."""
    out: dict[str, Any] = {"name": d.name, "node": d.node, "bus": bus(d), "slot": slot(d),
                           "wwid": d.wwid, "serial": d.serial, "size_bytes": d.size_bytes,
                           "method": METHODS[bus(d)]}
    if isinstance(d, nvme.NvmeNamespace):
        out.update(controller=d.controller, model=d.model)
    else:
        out.update(hctl=str(d.hctl), host=d.host)
    return out


def slot_words(old: dict[str, Any]) -> str:
    """Where a recorded disk sat: ``SCSI host0 [0:0:1:0]``, ``PCI 0000:01:00.0``. Journals
    written before NVMe support have no bus: SCSI."""
    if old.get("bus") == "nvme":
        return f"PCI {old.get('slot')}"
    return f"SCSI {old.get('host')} [{old.get('hctl')}]"


@dataclass(frozen=True)
class Match:
    """How a disk is recognised: ``wwn`` (a SCSI WWID, an NVMe namespace's WWID/EUI-64/NGUID/
    UUID; compared in the kernel's form), ``serial`` (a SCSI disk's, or an NVMe controller's
    for its namespace 1) or ``slot`` (a SCSI address, an NVMe controller's PCI function)."""

    kind: Literal["wwn", "serial", "slot"]
    value: str

    @classmethod
    def parse(cls, text: str) -> Match:
        """``H:C:T:L`` or ``DDDD:BB:DD.F``: a slot; ``serial:X``; a WWN (``naa.…``, ``0x…``,
        ``eui.…``, ``nvme.…``, ``wwn:…``); anything else is a serial."""
        t = text.strip()
        if not t:
            raise UsageError("empty disk identity",
                             hint="give a WWN, serial:XYZ, H:C:T:L or a PCI address")
        if _HCTL.match(t):
            return cls("slot", str(scsi.Hctl.parse(t)))
        if _PCI.match(t):
            return cls("slot", t.lower())
        low = t.lower()
        if low.startswith("serial:"):
            return cls("serial", t[len("serial:"):].strip())
        if low.startswith("wwn:"):
            t = t[len("wwn:"):].strip()
        if looks_like_wwn(t):
            return cls("wwn", normalize_wwn(t) or t)
        return cls("serial", t)

    def matches(self, d: Disk) -> bool:
        if self.kind == "slot":
            return slot(d) == self.value
        if isinstance(d, nvme.NvmeNamespace):
            return nvme.NsMatch("serial" if self.kind == "serial" else "wwid",
                                self.value).matches(d)
        if self.kind == "serial":
            return d.serial == self.value
        return d.wwid is not None and normalize_wwn(d.wwid) == self.value

    def words(self) -> str:
        """The form :meth:`parse` reads back."""
        return f"serial:{self.value}" if self.kind == "serial" else self.value

    def __str__(self) -> str:
        return f"{self.kind} {self.value}"


def find(sysfs: Sysfs, match: Match) -> list[Disk]:
    return [d for d in disks(sysfs) if match.matches(d)]


def wait_for(sysfs: Sysfs, match: Match, timeout: float, *, interval: float = 0.1,
             ready: Callable[[str], bool] | None = None) -> Disk:
    """Poll until one disk matching ``match`` is there and usable (a size, and on the live
    system its /dev node) and return it; TimeoutExpired, naming the disks there, after
    ``timeout`` seconds."""
    usable = ready or (inuse.node_ready if sysfs.live else (lambda _node: True))
    start = time.monotonic()
    while True:
        present = disks(sysfs)
        for d in present:
            if match.matches(d) and d.size_bytes and usable(d.node):
                return d
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            seen = "; ".join(x.describe() for x in present) or "none"
            raise TimeoutExpired(f"no disk with {match} appeared within {timeout:g} s "
                                 f"(disks: {seen})",
                                 hint="check it is plugged in and look in dmesg")
        time.sleep(max(0.0, min(interval, timeout - elapsed)))
