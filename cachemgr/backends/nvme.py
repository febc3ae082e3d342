"""NVMe hotplug backend: find a namespace by its identity, remove its controller's PCI
function, rescan the PCI bus, wait for a namespace to come (back).

What the kernel shows (docs/kernel-notes.md, "SCSI and NVMe hotplug"; lab, 6.1, qemu's NVMe
controller on its own PCIe root port):

* a namespace is a block device ``nvme<C>n<N>`` whose ``device`` link is its controller
  (``class/nvme/nvme<C>``, with ``serial``, ``model``, ``firmware_rev``, ``transport`` and, for
  ``pcie``, ``address``: the PCI function, ``0000:01:00.0``); the namespace has ``wwid`` and
  ``nsid`` (and ``eui``, ``nguid``, ``uuid`` when the drive reports them);
* remove: ``1`` to ``bus/pci/devices/<function>/remove`` takes the controller and every one of
  its namespaces away at once. That is why a controller with another namespace, or a namespace
  in use, is refused: a SCSI disk goes alone, an NVMe controller does not;
* insert: ``1`` to ``bus/pci/rescan``; the controller's probe runs asynchronously and its
  ``nvmeN`` name may differ: :func:`wait_for_namespace` polls by WWID, serial or EUI/NGUID.

Every kernel file goes through a :class:`~cachemgr.core.sysfs.Sysfs`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from cachemgr.backends import inuse
from cachemgr.backends.identity import AUTO, ProcText, id_words
from cachemgr.core.change import wait_for
from cachemgr.core.errors import TimeoutExpired, UnsafeError, UsageError
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

_NS = re.compile(r"^nvme(\d+)n(\d+)$")
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class NvmeNamespace:
    """One NVMe namespace (a block device) and its controller, as sysfs shows them."""

    name: str  # nvme0n1
    controller: str  # nvme0
    nsid: int | None
    wwid: str | None  # block/<name>/wwid: eui.…, nguid-like, uuid.…, or nvme.<vid>-<sn>-<mn>-<nsid>
    eui: str | None
    nguid: str | None
    uuid: str | None
    serial: str | None  # the controller's (stripped)
    model: str | None
    firmware: str | None
    transport: str | None  # pcie, tcp, rdma, fc, loop
    pci: str | None  # the controller's PCI function (pcie transport), 0000:01:00.0
    size_bytes: int | None

    @property
    def node(self) -> str:
        return f"/dev/{self.name}"

    def describe(self) -> str:
        ids = id_words(self.wwid, self.serial)
        where = f" [PCI {self.pci}]" if self.pci else ""
        return f"{self.name}{where}" + (f" ({ids})" if ids else "")


@dataclass(frozen=True)
class Removed:
    """What :func:`remove` took away (the namespace, with its controller's identity)."""

    namespace: NvmeNamespace


def _text(sysfs: Sysfs, rel: str) -> str | None:
    v = sysfs.read_opt(rel)
    v = v.strip() if v is not None else None
    return v or None


def is_namespace(name: str) -> bool:
    return _NS.match(name) is not None


def namespace(sysfs: Sysfs, name: str) -> NvmeNamespace:
    """Namespace ``name`` (``nvme0n1``); UsageError when it is not one (a partition, the
    ``ngXnY`` character device, another disk, nothing)."""
    if not is_namespace(name) or not sysfs.exists(f"block/{name}"):
        disk = sysfs.disk_of_partition(name)
        if disk is not None:
            raise UsageError(f"/dev/{name} is a partition of /dev/{disk}",
                             hint=f"NVMe hotplug works on whole namespaces: /dev/{disk}")
        raise UsageError(f"{name} is not an NVMe namespace here",
                         hint="ls /sys/class/nvme; lsblk -o NAME,SERIAL,WWN")
    b = f"block/{name}"
    ctrl_link = sysfs.readlink(f"{b}/device")
    controller = os.path.basename(ctrl_link.rstrip("/")) if ctrl_link else ""
    c = f"class/nvme/{controller}"
    transport = _text(sysfs, f"{c}/transport")
    addr = _text(sysfs, f"{c}/address")
    pci = addr if transport == "pcie" and addr and _PCI.match(addr) else None
    nsid = _text(sysfs, f"{b}/nsid")
    size = _text(sysfs, f"{b}/size")
    return NvmeNamespace(
        name=name, controller=controller,
        nsid=int(nsid) if nsid and nsid.isdigit() else None,
        wwid=_text(sysfs, f"{b}/wwid"), eui=_text(sysfs, f"{b}/eui"),
        nguid=_text(sysfs, f"{b}/nguid"), uuid=_text(sysfs, f"{b}/uuid"),
        serial=_text(sysfs, f"{c}/serial"), model=_text(sysfs, f"{c}/model"),
        firmware=_text(sysfs, f"{c}/firmware_rev"), transport=transport, pci=pci,
        size_bytes=int(size) * 512 if size and size.isdigit() else None)


def namespaces(sysfs: Sysfs) -> list[NvmeNamespace]:
    """Every NVMe namespace, by name."""
    return [namespace(sysfs, n) for n in sorted(sysfs.block_names()) if is_namespace(n)]


def siblings(sysfs: Sysfs, ns: NvmeNamespace) -> list[str]:
    """The other namespaces of ``ns``'s controller (they go with it on a remove)."""
    return [x.name for x in namespaces(sysfs)
            if x.controller == ns.controller and x.name != ns.name]


def controller_refusals(sysfs: Sysfs, ns: NvmeNamespace, *, mountinfo: ProcText = AUTO,
                        swaps: ProcText = AUTO) -> tuple[str, ...]:
    """Why ``ns``'s controller may not be pulled whatever ``ns`` itself is used for: it is
    not a PCIe function, or it carries another namespace (which would go too; in use or
    not: a root file system on it, for one). Empty when neither."""
    out: list[str] = []
    if ns.pci is None:
        out.append(f"{ns.node}'s controller {ns.controller} is not a PCIe function "
                   f"(transport {ns.transport or 'unknown'}): cachemgr removes only those")
    others = siblings(sysfs, ns)
    if others:
        out.append(f"controller {ns.controller} also carries "
                   + ", ".join(f"/dev/{x}" for x in others)
                   + ": removing it takes them away too")
    texts = inuse.texts(sysfs, mountinfo, swaps)
    for name in others:
        out += inuse.reasons(sysfs, f"block/{name}", *texts)
    return tuple(dict.fromkeys(out))


def removal_refusals(sysfs: Sysfs, ns: NvmeNamespace, *, mountinfo: ProcText = AUTO,
                     swaps: ProcText = AUTO) -> tuple[str, ...]:
    """Why removing ``ns``'s controller is not safe; empty when it is: any of
    :func:`controller_refusals`, or ``ns`` in use (held, registered with bcache, mounted,
    swap)."""
    texts = inuse.texts(sysfs, mountinfo, swaps)
    out = [*controller_refusals(sysfs, ns, mountinfo=texts[0], swaps=texts[1]),
           *inuse.reasons(sysfs, f"block/{ns.name}", *texts)]
    return tuple(dict.fromkeys(out))


def remove(sysfs: Sysfs, name: str, *, timeout: float = 10.0,
           mountinfo: ProcText = AUTO,
           swaps: ProcText = AUTO) -> Removed:
    """Take namespace ``name``'s controller out of the kernel (its PCI function's
    ``remove``), like pulling the drive. Refused (UnsafeError, nothing written) for any of
    :func:`removal_refusals`; waits up to ``timeout`` for the namespace to disappear."""
    ns = namespace(sysfs, name)
    reasons = removal_refusals(sysfs, ns, mountinfo=mountinfo, swaps=swaps)
    if reasons:
        raise UnsafeError(f"refusing to remove {ns.describe()}: " + "; ".join(reasons),
                          hint="stop what uses it first (unmount, dmsetup remove, detach and "
                               "unregister bcache); a shared controller cannot be pulled")
    before = sysfs.resolve(f"block/{name}")
    log.info("removing NVMe controller %s (PCI %s) of %s", ns.controller, ns.pci,
             ns.describe())
    sysfs.write(f"bus/pci/devices/{ns.pci}/remove", "1")

    def gone() -> bool:
        return sysfs.resolve(f"block/{name}") != before

    if not wait_for(gone, timeout, 0.05):
        raise TimeoutExpired(f"wrote 1 to the remove file of PCI {ns.pci} but {ns.node} is "
                             f"still there after {timeout:g} s", hint="check dmesg")
    return Removed(ns)


def rescan(sysfs: Sysfs) -> None:
    """Scan every PCI bus for new functions (a removed controller comes back). The NVMe probe
    completes later: :func:`wait_for_namespace`. Slot power is not used (docs/kernel-notes.md,
    "SCSI and NVMe hotplug": in the qemu lab a slot's power-off ejects the drive for good)."""
    log.info("rescanning the PCI bus")
    sysfs.write("bus/pci/rescan", "1")


@dataclass(frozen=True)
class NsMatch:
    """How a namespace is recognised: ``wwid`` (its WWID, or its EUI-64/NGUID/UUID written
    as the kernel writes them), or ``serial`` (the controller's serial, namespace 1)."""

    kind: str
    value: str

    @classmethod
    def parse(cls, text: str) -> NsMatch:
        t = text.strip()
        if not t:
            raise UsageError("empty NVMe identity")
        if t.lower().startswith("serial:"):
            return cls("serial", t[len("serial:"):].strip())
        return cls("wwid", t)

    def matches(self, ns: NvmeNamespace) -> bool:
        if self.kind == "serial":
            return ns.serial == self.value and ns.nsid in (1, None)
        return self.value in (ns.wwid, ns.eui, ns.nguid, ns.uuid) or (
            ns.eui is not None and self.value.lower() == f"eui.{ns.eui.replace(' ', '')}")

    def __str__(self) -> str:
        return f"{self.kind} {self.value}"


def wait_for_namespace(sysfs: Sysfs, match: str | NsMatch, timeout: float, *,
                       interval: float = 0.1,
                       ready: Callable[[str], bool] | None = None) -> NvmeNamespace:
    """Poll until a namespace matching ``match`` is there (and its node usable: ``ready``,
    default: a block device exists) and return it; TimeoutExpired otherwise."""
    m = match if isinstance(match, NsMatch) else NsMatch.parse(match)
    usable = ready or inuse.node_ready
    found: list[NvmeNamespace] = []

    def there() -> bool:
        found[:] = [x for x in namespaces(sysfs) if m.matches(x) and usable(x.node)]
        return bool(found)

    if not wait_for(there, timeout, interval):
        raise TimeoutExpired(f"no NVMe namespace with {m} after {timeout:g} s",
                             hint="check the drive is seated; dmesg shows the PCI probe")
    return found[0]


def wait_for_all(sysfs: Sysfs, serials: list[str], timeout: float) -> list[NvmeNamespace]:
    """Namespace 1 of each controller in ``serials`` (the driver probes controllers
    asynchronously: at boot or after a modprobe, they appear one by one)."""
    return [wait_for_namespace(sysfs, NsMatch("serial", s), timeout) for s in serials]
