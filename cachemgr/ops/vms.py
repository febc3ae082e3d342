"""The VM commands: ``vms`` (the domains above the caches, their disks' stacks, cache modes,
warnings and IO pressure) and ``vm-cache`` (a VM disk's cache mode in the domain's persistent
definition, through libvirt). cachemgr/backends/vms.py reads; virsh.py is the one wrapper."""

from __future__ import annotations

import dataclasses
import io
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.backends import virsh
from cachemgr.backends import vms as vms_mod
from cachemgr.core.change import Change
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError, require_root
from cachemgr.core.model import (
    VM_CACHE_MODES,
    Pressure,
    Snapshot,
    Vm,
    VmCacheIo,
    VmDisk,
    VmScan,
    human,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Result


def scan(sysfs: Sysfs, uri: str | None = None) -> Snapshot:
    """The snapshot with the VMs of ``uri`` (default qemu:///system) filled in."""
    return snapshot_mod.take(sysfs, vms=True, uri=uri)


serving = vms_mod.serving  # the VM disks a cached device serves (for the TUI: ops + core)


def pressure_text(p: Pressure | None) -> str:
    if p is None:
        return "-"
    full = f" full {p.full_avg10:.1f}/{p.full_avg60:.1f}" if p.full_avg10 is not None else ""
    return f"some {p.some_avg10:.1f}/{p.some_avg60:.1f}{full}"


def hit_text(c: VmCacheIo | None) -> str:
    """A VM's read hit ratio on a cache: ``0.93``; ``-`` before it read or when unknown."""
    h = c.read_hit_ratio if c is not None else None
    return "-" if h is None else f"{h:.2f}"


def _on(v: Vm, d: VmDisk) -> VmCacheIo | None:
    return next((c for c in v.cache_io if d.caches and c.cache == d.caches[0]), None)


def table(s: VmScan) -> list[str]:
    """``vms`` as text: one line per VM disk with the VM's read hit ratio on the cache under
    it and the bytes it made the slow disk serve (io.stat, since the VM started), its
    warnings under it, why a VM's figures are unknown, the noisy neighbours, the host's
    pressure."""
    lines = [f"{'VM':<16} {'STATE':<9} {'DISK':<5} {'CACHE':<12} {'ON':<22} {'RHIT':>5} "
             f"{'SLOW READ':>10} IO PRESSURE %"]
    for v in s.vms:
        for i, d in enumerate(v.disks or ()):
            on = ", ".join(d.caches) or (f"/dev/{d.stack[-1]} (no cache)" if d.stack
                                         else (d.unresolved or "?"))
            c = _on(v, d)
            slow = human(c.slow_read_bytes) if c is not None and c.why is None else "-"
            lines.append(f"{v.name if i == 0 else '':<16.16} {v.state if i == 0 else '':<9.9} "
                         f"{d.target:<5} {d.cache:<12} {on:<22.22} {hit_text(c):>5} "
                         f"{slow:>10} "
                         + (pressure_text(v.pressure) if i == 0 else ""))
            lines += [f"  ! {d.target}: {w}" for w in d.warnings]
        if not v.disks:
            lines.append(f"{v.name:<16.16} {v.state:<9.9} (no disks)")
        if v.cgroup is not None:
            lines += [f"  ? {c.cache}: hit ratio unknown: {c.why}" for c in v.cache_io if c.why]
    if not s.vms:
        lines.append("(no domains)")
    lines += [n.text for n in s.noisy]
    lines.append(f"host IO pressure % (10 s/60 s): {pressure_text(s.host_pressure)}")
    return lines


def vms(sysfs: Sysfs, uri: str | None = None) -> Result:
    from cachemgr.ops import coherence

    snap = scan(sysfs, uri)
    assert snap.vms is not None
    doc = {"schema": 1, **snapshot_mod.vm_scan_json(snap.vms)}
    doc["left"] = coherence.left_json()  # caches holding copies of a disk a VM took away
    doc["warms"] = coherence.warm_json()  # the warms arrivals started
    return Result(lines=table(snap.vms) + coherence.mark_lines(),
                  notes=[f"cachemgr: {w}" for w in snap.vms.warnings], data=doc, value=snap)


def watch_lines(prev: VmScan | None, cur: VmScan, dt: float) -> list[str]:
    """``vms --watch``: one line per VM with a cgroup, its IO pressure now and its IOPS and
    bytes per second since the previous look (the before/after around a mode change or a
    drain made meanwhile), its read hit ratio on each cache in that window, the noisy
    neighbours of the window, then the host's pressure."""
    before = {v.uuid: v.io for v in prev.vms} if prev is not None else {}
    win = window(prev, cur) if prev is not None else None
    lines = []
    for v in cur.vms:
        if v.cgroup is None:
            continue
        rate = ""
        old = before.get(v.uuid)
        if old is not None and v.io is not None and dt > 0:
            r_io, w_io = (v.io.rios - old.rios) / dt, (v.io.wios - old.wios) / dt
            r_b, w_b = (v.io.rbytes - old.rbytes) / dt, (v.io.wbytes - old.wbytes) / dt
            rate = (f" read {r_io:.0f} IO/s {human(int(r_b))}/s, "
                    f"write {w_io:.0f} IO/s {human(int(w_b))}/s")
        hits = ""
        if win is not None:
            wv = next((w for w in win.vms if w.uuid == v.uuid), None)
            hits = "".join(f", read hit ratio on {c.cache} {hit_text(c)}"
                           for c in (wv.cache_io if wv is not None else ()) if c.read_bytes)
        lines.append(f"{v.name}: IO pressure % {pressure_text(v.pressure)}{rate}{hits}")
    if win is not None:
        lines += [n.text for n in win.noisy]
    lines.append(f"host: IO pressure % {pressure_text(cur.host_pressure)}")
    return lines


def window(prev: VmScan, cur: VmScan) -> VmScan:
    """``cur`` with each VM's reads through its caches counted since ``prev`` (the VMs seen
    both times), and the noisy neighbours of that window: a victim is a VM whose hit ratio
    in the window is lower than it was at ``prev``."""
    old = {(v.uuid, c.cache): c for v in prev.vms for c in v.cache_io}
    vms = []
    for v in cur.vms:
        rows = []
        for c in v.cache_io:
            o = old.get((v.uuid, c.cache))
            if o is None or c.why or o.why or c.read_bytes is None or o.read_bytes is None:
                rows.append(VmCacheIo(c.cache, None, None, c.why or "no earlier look"))
                continue
            rows.append(VmCacheIo(c.cache, c.read_bytes - o.read_bytes,
                                  (c.slow_read_bytes or 0) - (o.slow_read_bytes or 0)))
        vms.append(dataclasses.replace(v, cache_io=tuple(rows)))
    names = {v.uuid: v.name for v in cur.vms}
    before = {(names.get(u, u), cache): c.read_hit_ratio for (u, cache), c in old.items()}
    return dataclasses.replace(cur, vms=tuple(vms),
                               noisy=vms_mod.noisy(tuple(vms), before))


# ------------------------------------------------------------------------------ vm-cache


@dataclass(frozen=True)
class CachePlan:
    uri: str
    uuid: str
    domain: str
    disk: str
    before: str
    after: str
    running: bool
    warnings: tuple[str, ...]
    xml: str  # the persistent definition with the change made


def _namespaces(xml: str) -> None:
    """Keep the prefixes the document uses (ElementTree would rename them ns0...)."""
    for _, (prefix, uri) in ET.iterparse(io.StringIO(xml), events=("start-ns",)):
        if prefix:
            ET.register_namespace(prefix, uri)


def _set_cache(xml: str, disk: str, mode: str) -> tuple[str, str]:
    """(the changed XML, the disk's mode before) with ``disk`` (its target dev, or its
    source path) given ``mode``."""
    _namespaces(xml)
    root = ET.fromstring(xml)
    found = []
    for d in root.iterfind("devices/disk"):
        tgt, src = d.find("target"), d.find("source")
        names = {tgt.get("dev") if tgt is not None else None}
        if src is not None:
            names |= {src.get("dev"), src.get("file")}
        if disk in names - {None}:
            found.append(d)
    if len(found) != 1:
        targets = [t.get("dev") for t in root.iterfind("devices/disk/target")]
        raise UsageError(f"{root.findtext('name')!r} has {'no' if not found else 'more than one'}"
                         f" disk {disk!r}",
                         hint="its disks: " + (", ".join(str(t) for t in targets) or "none"))
    d = found[0]
    drv = d.find("driver")
    if drv is None:
        drv = ET.Element("driver", {"name": "qemu"})
        d.insert(0, drv)
    before = drv.get("cache") or "default"
    if mode == "default":
        drv.attrib.pop("cache", None)
    else:
        drv.set("cache", mode)
    return ET.tostring(root, encoding="unicode"), before


def plan_cache(sysfs: Sysfs, domain: str, disk: str, mode: str, *, uri: str | None = None,
               next_boot: bool = False) -> CachePlan:
    """Everything checked, nothing changed: the definition ``vm-cache`` would store."""
    if mode not in VM_CACHE_MODES:
        raise UsageError(f"unknown VM disk cache mode {mode!r}",
                         hint="one of " + ", ".join(VM_CACHE_MODES))
    src = virsh.LiveVirsh(uri)
    why = src.available()
    if why is not None:
        raise CacheMgrError(f"cannot reach libvirt at {src.uri}: {why}")
    uuid = virsh.find(src, domain)
    state = virsh.domstate(src, uuid)
    running = state != "shut off"
    if running and not next_boot:
        raise UnsafeError(f"domain {domain!r} is {state}: a disk's cache mode changes only "
                          "when qemu starts again",
                          hint="add --next-boot to change the definition for its next boot")
    new_xml, before = _set_cache(virsh.dumpxml(src, uuid, inactive=True), disk, mode)
    if before == mode:
        raise AlreadyError(f"{domain} {disk}: cache is {mode} already")
    caches = vms_mod.cached_devices(snapshot_mod.take(sysfs))
    name, _, _, disks = vms_mod.parse_domain(new_xml)
    d = vms_mod.disk(sysfs, src, next(x for x in disks
                                      if x["target"] == disk or x["source"] == disk), caches)
    return CachePlan(uri=src.uri, uuid=uuid, domain=name, disk=d.target, before=before,
                     after=mode, running=running, warnings=d.warnings, xml=new_xml)


def describe_cache(p: CachePlan) -> list[str]:
    """The plan of ``vm-cache``, before it is done (the question's text)."""
    lines = [f"would set the cache mode of {p.domain}'s disk {p.disk} from {p.before} to "
             f"{p.after} in its persistent definition"
             + (" (the domain runs: it applies from its next boot)" if p.running else "")]
    return lines + [f"warning: {w}" for w in p.warnings]


def vm_cache(p: CachePlan) -> Result:
    """Store the planned definition through libvirt and read it back."""
    require_root("vm-cache")
    # the gate: one change to a domain's definition at a time (define replaces it whole)
    with gate.gate(gate.of_names(f"{p.domain} {p.disk}", [f"vm-{p.uuid}"]), "vm-cache",
                   detail={"to": p.after}):
        virsh.define(p.uri, p.xml)
    src = virsh.LiveVirsh(p.uri)
    _, _, _, disks = vms_mod.parse_domain(virsh.dumpxml(src, p.uuid, inactive=True))
    now = next((str(d["cache"]) for d in disks if d["target"] == p.disk), None)
    if now != p.after:
        raise CacheMgrError(f"{p.domain} {p.disk}: libvirt stored cache {now}, not {p.after}")
    res = Result(changes=[Change(f"{p.domain}:{p.disk}", "cache", p.before, p.after)],
                 notes=[f"cachemgr: {w}" for w in p.warnings]
                 + (["cachemgr: the domain runs: the mode applies from its next boot"]
                    if p.running else []))
    return res
