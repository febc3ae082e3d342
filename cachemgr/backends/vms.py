"""The VMs above the caches: libvirt domains, their disks, the host devices under each disk
down to the cache, and the IO pressure of each VM's cgroup.

* Domains and disks come from libvirt (cachemgr/backends/virsh.py): every ``<disk>`` of a
  domain's XML with its source, bus, ``<driver cache= io=>``.
* The stack: the source's device number (a block device's own, a file's filesystem's) names
  the host block device (``/sys/dev/block/MAJ:MIN``); from there ``slaves/`` (and a
  partition's disk) lead down until a cached device of the snapshot (bcacheN, a dm-cache or
  dm-writecache device) or a disk with nothing under it.
* Pressure: libvirt puts a running domain in the systemd scope
  ``machine.slice/machine-qemu\\x2d<ID>\\x2d<NAME>.scope`` (the machine name systemd-escaped,
  NAME reduced to letters, digits, single ``-`` and ``.``). Its ``io.pressure`` (PSI) and
  ``io.stat`` are the kernel's accounting for the VM's IO. The host's is /proc/pressure/io.
  (docs/kernel-notes.md, "VMs, cgroups and IO pressure").

Everything here is read-only; every string from a domain definition is data.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path

from cachemgr.backends import virsh
from cachemgr.backends.scancache import ScanCache
from cachemgr.backends.virsh import domain_name as domain_name
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import (
    CacheMode,
    IoCounters,
    NoisyNeighbour,
    Pressure,
    Snapshot,
    Vm,
    VmCacheIo,
    VmDisk,
    VmScan,
)
from cachemgr.core.sysfs import Sysfs

PROC_PRESSURE_IO = "/proc/pressure/io"
PROC_STAT = "/proc/stat"
MACHINE_SLICE = "fs/cgroup/machine.slice"
# cache modes with which libvirt lets a domain migrate live without --unsafe
MIGRATION_SAFE = ("none", "directsync")
# cache modes that go through the host's page cache for writes
PAGE_CACHE_WRITES = ("writeback", "unsafe", "default")


# ----------------------------------------------------------------------------- parsing


def parse_domain(xml: str) -> tuple[str, str, int | None, list[dict[str, object]]]:
    """(name, uuid, id, disks) of a domain XML; each disk a dict of its attributes."""
    root = virsh.domain_xml(xml)
    dom_id = root.get("id")
    disks: list[dict[str, object]] = []
    for d in root.iterfind("devices/disk"):
        if d.get("device", "disk") not in ("disk", "lun"):
            continue  # cdrom, floppy: no cache under them that matters
        src, drv, tgt = d.find("source"), d.find("driver"), d.find("target")
        kind = d.get("type", "file")
        source: str | None = None
        if src is not None:
            if kind == "block":
                source = src.get("dev")
            elif kind == "file":
                source = src.get("file")
            elif kind == "volume":
                source = f"{src.get('pool')}/{src.get('volume')}"
            elif kind == "network":
                source = f"{src.get('protocol')}:{src.get('name')}"
            else:
                source = src.get("dir") or src.get("name")
        cache = (drv.get("cache") if drv is not None else None) or "default"
        disks.append({
            "target": (tgt.get("dev") if tgt is not None else None) or "?",
            "bus": tgt.get("bus") if tgt is not None else None,
            "source_type": kind,
            "source": source,
            "cache": cache,
            "io": drv.get("io") if drv is not None else None,
            "read_only": d.find("readonly") is not None,
        })
    return (root.findtext("name") or "?", root.findtext("uuid") or "?",
            int(dom_id) if dom_id and dom_id.isdigit() else None, disks)


_PSI = re.compile(r"^(some|full) avg10=([\d.]+) avg60=([\d.]+) avg300=[\d.]+ total=(\d+)$")


def parse_pressure(text: str) -> Pressure | None:
    """A PSI file (Documentation/accounting/psi.rst): ``some`` and, for IO, ``full`` lines."""
    vals: dict[str, tuple[float, float, int]] = {}
    for line in text.splitlines():
        m = _PSI.match(line.strip())
        if m:
            vals[m[1]] = (float(m[2]), float(m[3]), int(m[4]))
    if "some" not in vals:
        return None
    full = vals.get("full")
    return Pressure(vals["some"][0], vals["some"][1], vals["some"][2],
                    full[0] if full else None, full[1] if full else None,
                    full[2] if full else None)


def parse_io_stat(text: str, devnos: set[str] | None = None) -> IoCounters:
    """``io.stat`` (cgroup-v2.rst): one ``MAJ:MIN key=value...`` line per device, summed over
    ``devnos`` (all lines when None). A VM's write to bcache0 is charged to its cgroup on
    bcache0 and again on the disks bcache writes to: counting the VM's own disks only counts
    each IO once."""
    tot = {"rbytes": 0, "wbytes": 0, "rios": 0, "wios": 0}
    for line in text.splitlines():
        f = line.split()
        if not f or (devnos is not None and f[0] not in devnos):
            continue
        for kv in f[1:]:
            k, _, v = kv.partition("=")
            if k in tot and v.isdigit():
                tot[k] += int(v)
    return IoCounters(**tot)


def parse_io_stat_devices(text: str) -> dict[str, IoCounters]:
    """``io.stat`` by device number: MAJ:MIN -> its counters (a line without values, as the
    kernel prints for a device the group has not used, counts zero)."""
    out: dict[str, IoCounters] = {}
    for line in text.splitlines():
        dev, _, rest = line.partition(" ")
        if not dev:
            continue
        v = dict(_KV.findall(rest))
        out[dev] = IoCounters(int(v.get("rbytes", 0)), int(v.get("wbytes", 0)),
                              int(v.get("rios", 0)), int(v.get("wios", 0)))
    return out


_KV = re.compile(r"(rbytes|wbytes|rios|wios)=(\d+)")


def parse_iowait(text: str) -> int | None:
    """The iowait ticks of /proc/stat's ``cpu`` line (proc_stat(5): the fifth value)."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "cpu" and len(f) > 5 and f[5].isdigit():
            return int(f[5])
    return None


_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def scope_machine(scope: str) -> str | None:
    """The machine name of a ``machine-….scope`` directory (systemd's escaping undone)."""
    if not (scope.startswith("machine-") and scope.endswith(".scope")):
        return None
    return _ESCAPE.sub(lambda m: chr(int(m[1], 16)), scope[len("machine-"):-len(".scope")])


def machine_name_part(name: str) -> str:
    """What libvirt keeps of a domain name in the machine name (its own rule: letters,
    digits, and ``-``/``.`` but never two in a row, nor first or last), up to 64 characters
    with the ``qemu-ID-`` prefix (cut here to what any ID leaves: 64 - len("qemu-N-"))."""
    out: list[str] = []
    skip = True
    for c in name:
        if c in ".-":
            if not skip:
                out.append(c)
                skip = True
            continue
        if c.isascii() and c.isalnum():
            out.append(c)
            skip = False
    return "".join(out).strip(".-")


def _scopes(sysfs: Sysfs) -> dict[str, dict[int, str]]:
    """machine name part -> {domain ID: cgroup path below the cgroup root} of every qemu
    scope under machine.slice."""
    out: dict[str, dict[int, str]] = {}
    for d in sysfs.listdir(MACHINE_SLICE):
        m = scope_machine(d)
        if m is None or not m.startswith("qemu-"):
            continue
        _, _, rest = m.partition("-")
        dom_id, _, name = rest.partition("-")
        if dom_id.isdigit() and name:
            out.setdefault(name, {})[int(dom_id)] = f"machine.slice/{d}"
    return out


def _scope_of(scopes: dict[str, dict[int, str]], name: str, dom_id: int | None) -> str | None:
    """The scope of a domain: the one with its ID while it runs, else its name's only one."""
    found = scopes.get(machine_name_part(name), {})
    if dom_id is not None and dom_id in found:
        return found[dom_id]
    return next(iter(found.values())) if len(found) == 1 else None


# ----------------------------------------------------------------------------- the stack


def cached_devices(snap: Snapshot) -> dict[str, tuple[str, CacheMode | None]]:
    """Kernel name -> (node, mode) of every cached device VMs can sit on."""
    out: dict[str, tuple[str, CacheMode | None]] = {}
    for b in snap.backings:
        if b.device_name and b.device:
            out[b.device_name] = (b.device, b.mode)
    for d in snap.dm_devices:
        out[d.kernel_name] = (d.node, d.mode)
    return out


def block_name(sysfs: Sysfs, devno: str) -> str | None:
    rel = sysfs.resolve(f"dev/block/{devno}")
    return Path(rel).name if rel else None


def _devno_of(sysfs: Sysfs, name: str) -> str | None:
    """MAJ:MIN of a block device by kernel name (a whole disk, or a partition of one)."""
    disk = sysfs.disk_of_partition(name)
    return sysfs.read_opt(f"block/{disk}/{name}/dev" if disk else f"block/{name}/dev")


def walk(sysfs: Sysfs, name: str, caches: Mapping[str, object]) -> tuple[tuple[str, ...],
                                                                           tuple[str, ...]]:
    """The block devices from ``name`` down to the cached devices in ``caches`` (or to disks
    with nothing under them), and the cached ones reached."""
    stack: list[str] = []
    found: list[str] = []
    todo = [name]
    while todo:
        n = todo.pop(0)
        if n in stack:
            continue
        stack.append(n)
        if n in caches:
            found.append(n)
            continue
        whole = sysfs.disk_of_partition(n)
        todo.extend([whole] if whole else sysfs.listdir(f"block/{n}/slaves"))
    return tuple(stack), tuple(found)


def shared_kind(sysfs: Sysfs, name: str) -> str | None:
    """What makes the block device ``name`` storage that other hosts reach too, or None: a
    multipath device (device-mapper UUID ``mpath-``, multipathd's), an RBD image, an NBD or
    DRBD device, a SCSI disk on an iSCSI session or a Fibre Channel remote port (its sysfs
    device path). A host-local cache over such a device is a hazard for a live migration
    (docs/admin-guide.md, "Live migration over shared storage")."""
    if name.startswith("rbd"):
        return "an RBD image (Ceph)"
    if name.startswith("nbd"):
        return "a network block device (NBD)"
    if name.startswith("drbd"):
        return "a DRBD device"
    if name.startswith("dm-"):
        uuid = sysfs.read_opt(f"block/{name}/dm/uuid") or ""
        return "a multipath device" if uuid.startswith("mpath-") else None
    if name.startswith("sd"):
        dev = sysfs.resolve(f"block/{name}/device") or ""
        if "/session" in dev:
            return "an iSCSI disk"
        if "/rport-" in dev:
            return "a Fibre Channel disk"
    return None


def shared_under(sysfs: Sysfs, name: str) -> tuple[str, str] | None:
    """(the device, what it is) of the first shared-storage device at or under the cached
    device ``name`` (its backing device, origin, and what they sit on), or None."""
    todo, seen = [name], set()
    while todo:
        n = todo.pop(0)
        if n in seen:
            continue
        seen.add(n)
        why = shared_kind(sysfs, n)
        if why is not None:
            return n, why
        whole = sysfs.disk_of_partition(n)
        todo.extend([whole] if whole else sysfs.listdir(f"block/{n}/slaves"))
    return None


def hazard_warning(node: str, shared: tuple[str, str]) -> str:
    """The VM view's mark of a host-local cache over shared storage."""
    return (f"migration hazard: {node} is a host-local cache over shared storage "
            f"(/dev/{shared[0]}: {shared[1]}): after a live migration the other host reads "
            f"stale blocks unless it is writethrough and clean here first (cachemgr mode "
            f"{node} writethrough --drain)")


def disk(sysfs: Sysfs, src: virsh.VirshSource, d: dict[str, object],
         caches: Mapping[str, tuple[str, CacheMode | None]],
         scan_cache: ScanCache | None = None) -> VmDisk:
    """A disk of :func:`parse_domain` with its stack, the caches under it and its warnings.
    With ``scan_cache``, the host block device of a device number and its stack down to the
    caches are kept while no uevent is sent (cachemgr/backends/scancache.py): the source is
    stat'ed on every scan, the tree under it read again only when the kernel said it
    changed."""
    source = d["source"] if isinstance(d["source"], str) else None
    kind = str(d["source_type"])
    stack: tuple[str, ...] = ()
    found: tuple[str, ...] = ()
    why: str | None = None
    if kind not in ("block", "file") or not source:
        why = f"a {kind} disk: no host block device to follow"
    else:
        num = src.devno(source)

        def follow(devno: str) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
            name = block_name(sysfs, devno)
            return (name, *walk(sysfs, name, caches)) if name else (None, (), ())

        if num is None:
            why = f"{source} cannot be read here"
        else:
            name, stack, found = (follow(num[0]) if scan_cache is None else scan_cache.get(
                ("vm-stack", num[0], tuple(sorted(caches))), lambda: follow(num[0])))
            if name is None:
                why = f"{source} is on device {num[0]}, which is no block device here"
    cache = str(d["cache"])
    warnings = vm_cache_warnings(cache, bool(d["read_only"]),
                                 [caches[n][1] for n in found])
    for n in found:
        shared = (shared_under(sysfs, n) if scan_cache is None else
                  scan_cache.get(("vm-shared", n), functools.partial(shared_under, sysfs, n)))
        if shared is not None:
            warnings.append(hazard_warning(caches[n][0], shared))
    return VmDisk(target=str(d["target"]), bus=d["bus"] if isinstance(d["bus"], str) else None,
                  source_type=kind, source=source, cache=cache,
                  io=d["io"] if isinstance(d["io"], str) else None,
                  read_only=bool(d["read_only"]), stack=stack,
                  caches=tuple(caches[n][0] for n in found), warnings=tuple(warnings),
                  unresolved=why)


def vm_cache_warnings(cache: str, read_only: bool,
                      host_modes: list[CacheMode | None]) -> list[str]:
    """What a VM disk's cache mode means for the admin, given the modes of the host caches
    under it (docs/admin-guide.md, "VM disk cache modes")."""
    out: list[str] = []
    if read_only:
        return out
    if cache not in MIGRATION_SAFE:
        out.append(f"cache={cache}: libvirt refuses live migration of this VM unless forced "
                   "(--unsafe); none or directsync migrate safely")
    if cache == "unsafe":
        out.append("cache=unsafe ignores the guest's flushes: a host crash loses writes the "
                   "guest was told are on disk")
    if cache in PAGE_CACHE_WRITES and CacheMode.WRITEBACK in host_modes:
        out.append(f"cache={cache} over a writeback host cache: two write-back layers (the "
                   "host page cache, volatile, over the SSD's dirty data)")
    if any(m in (CacheMode.NONE, CacheMode.PASSTHROUGH) for m in host_modes):
        out.append("the host cache under it is in mode none: this disk runs at the backing "
                   "disk's speed")
    return out


# ------------------------------------------------------------------------ per-VM accounting

# the least a VM must have made the slow disk serve before it is named a noisy neighbour
NOISY_MIN_BYTES = 1 << 20
NOISY_SHARE = 0.5  # ... and its part of the slow disk's reads charged to the VMs there


def accounting_devices(sysfs: Sysfs, snap: Snapshot) -> dict[str, tuple[str, str | None,
                                                                        str | None]]:
    """Kernel name of each cached device -> (its node, its MAJ:MIN, the MAJ:MIN of the slow
    disk under it: bcache's backing device, a dm-cache's or dm-writecache's origin)."""
    out: dict[str, tuple[str, str | None, str | None]] = {}
    for b in snap.backings:
        if b.device_name and b.device:
            out[b.device_name] = (b.device, _devno_of(sysfs, b.device_name),
                                  b.identity.devno or _devno_of(sysfs, b.identity.name))
    for d in snap.dm_devices:
        out[d.kernel_name] = (d.node, d.devno, d.origin.devno if d.origin else None)
    return out


def cache_io(stat: dict[str, IoCounters] | None, why: str | None, disks: tuple[VmDisk, ...],
             acct: Mapping[str, tuple[str, str | None, str | None]],
             devno_of: Mapping[str, str | None]) -> tuple[VmCacheIo, ...]:
    """One :class:`VmCacheIo` per cached device under the VM's disks, from its io.stat by
    device (``stat``; None with ``why``). ``devno_of``: MAJ:MIN of each disk's top device.
    Where the VM read its disk and nothing was charged to it on the cache under it, the IO
    reached the cache from a kernel thread (charged to the root cgroup): unknown, said so."""
    out: dict[str, VmCacheIo] = {}
    for d in disks:
        for name in d.stack:
            if name not in acct or acct[name][0] in out:
                continue
            node, num, slow = acct[name]
            if stat is None:
                out[node] = VmCacheIo(node, None, None, why)
                continue
            if num is None or slow is None:
                out[node] = VmCacheIo(node, None, None, "the device numbers of the cache or of "
                                      "the slow disk under it are unknown")
                continue
            zero = IoCounters(0, 0, 0, 0)
            read = stat.get(num, zero).rbytes
            top = devno_of.get(d.stack[0]) if d.stack else None
            if read == 0 and top is not None and top != num and stat.get(top, zero).rbytes:
                out[node] = VmCacheIo(node, None, None, f"its reads of {d.target} reach "
                                      f"{node} from a kernel thread (charged to the root "
                                      "cgroup): not attributable from io.stat")
                continue
            out[node] = VmCacheIo(node, read, stat.get(slow, zero).rbytes)
    return tuple(out.values())


def noisy(vms: tuple[Vm, ...],
          before: Mapping[tuple[str, str], float | None] | None = None
          ) -> tuple[NoisyNeighbour, ...]:
    """The noisy neighbours among ``vms``: on a cached device two or more VMs read through,
    one VM made at least NOISY_SHARE of the slow disk's reads charged to them (and at least
    NOISY_MIN_BYTES) while another VM there missed too: its read hit ratio below 1, or, given
    ``before`` ((VM, cache) -> its hit ratio at an earlier look), lower than then."""
    per: dict[str, list[tuple[str, VmCacheIo]]] = {}
    for v in vms:
        for c in v.cache_io:
            if c.why is None and c.read_bytes:
                per.setdefault(c.cache, []).append((v.name, c))
    out: list[NoisyNeighbour] = []
    for cache, rows in sorted(per.items()):
        total = sum(c.slow_read_bytes or 0 for _, c in rows)
        if len(rows) < 2 or total <= 0:
            continue
        name, top = max(rows, key=lambda r: r[1].slow_read_bytes or 0)
        slow = top.slow_read_bytes or 0
        if slow / total < NOISY_SHARE or slow < NOISY_MIN_BYTES:
            continue
        victims = []
        for n, c in rows:
            h = c.read_hit_ratio
            if n == name or h is None:
                continue
            was = before.get((n, cache)) if before is not None else None
            if (h < was) if was is not None else (before is None and h < 1.0):
                victims.append((n, h))
        if victims:
            out.append(NoisyNeighbour(cache, name, slow / total, slow, tuple(victims)))
    return tuple(out)


# ------------------------------------------------------------------------------- the scan


def _read_host(sysfs: Sysfs, path: str) -> str | None:
    """A /proc file of the host: the live one, or the capture's copy beside a captured tree."""
    p = Path(path) if sysfs.live else sysfs.root.parent / path.lstrip("/")
    try:
        return p.read_text()
    except OSError:
        return None


# the disks' stacks of the scans given no cache (status, vms): one per process, kept while no
# uevent is sent (a process that scans once reads the seqnum once more, no more)
_STACKS = ScanCache()


@functools.lru_cache(maxsize=1024)
def _parsed(xml: str) -> tuple[str, str, int | None, list[dict[str, object]]]:
    """:func:`parse_domain` of an XML seen before (the binding's source hands the same
    string again until the domain changes): not parsed again. Read-only to its callers."""
    return parse_domain(xml)


def scan(sysfs: Sysfs, snap: Snapshot, src: virsh.VirshSource | None = None,
         cache: ScanCache | None = None) -> VmScan:
    """Every domain of the connection with its disks' stacks, warnings and pressure. When
    libvirt cannot be asked, no VMs and a warning saying why. ``cache``: the poller's scan
    cache, begun for this scan (snapshot.take); else the module's own, begun here."""
    src = src or virsh.default_source(sysfs)
    if cache is None:
        cache = _STACKS
        cache.begin(sysfs)
    host_text = _read_host(sysfs, PROC_PRESSURE_IO)
    stat_text = _read_host(sysfs, PROC_STAT)
    host = parse_pressure(host_text) if host_text else None
    iowait = parse_iowait(stat_text) if stat_text else None
    why = src.available()
    if why is not None:
        return VmScan(src.uri, (), host, iowait, (f"VMs: {why}",))
    caches = cached_devices(snap)
    acct = accounting_devices(sysfs, snap)
    scopes = _scopes(sysfs)
    vms: list[Vm] = []
    try:
        listing, warnings = src.domains()
    except CacheMgrError as exc:
        return VmScan(src.uri, (), host, iowait, (f"VMs: libvirt: {exc.message}",))
    for _u, xml, state in listing:
        name, uuid, dom_id, disks = _parsed(xml)
        cg = _scope_of(scopes, name, dom_id)
        pressure = io = None
        s: str | None = None
        if cg is not None:
            p = sysfs.read_opt(f"fs/cgroup/{cg}/io.pressure")
            pressure = parse_pressure(p) if p else None
            s = sysfs.read_opt(f"fs/cgroup/{cg}/io.stat")
        vm_disks = tuple(disk(sysfs, src, d, caches, cache) for d in disks)
        top_devnos = {d.stack[0]: cache.get(("vm-devno", d.stack[0]),
                                            functools.partial(_devno_of, sysfs, d.stack[0]))
                      for d in vm_disks if d.stack}
        by_dev: dict[str, IoCounters] | None = None
        if cg is not None and s is not None:
            tops = {n for n in top_devnos.values() if n}
            by_dev = parse_io_stat_devices(s)
            sel = [c for k, c in by_dev.items() if not tops or k in tops]
            io = IoCounters(sum(c.rbytes for c in sel), sum(c.wbytes for c in sel),
                            sum(c.rios for c in sel), sum(c.wios for c in sel))
        why_not = (None if by_dev is not None else
                   "no cgroup scope under machine.slice (not running)" if cg is None else
                   "its scope has no io.stat (the io controller is off for machine.slice)")
        vms.append(Vm(name=name, uuid=uuid, state=state, domain_id=dom_id, disks=vm_disks,
                      cgroup=cg, pressure=pressure, io=io,
                      cache_io=cache_io(by_dev, why_not, vm_disks, acct, top_devnos)))
    vms.sort(key=lambda v: v.name)
    return VmScan(src.uri, tuple(vms), host, iowait, tuple(warnings), noisy(tuple(vms)))


def serving(scan_: VmScan, node: str) -> list[tuple[Vm, VmDisk]]:
    """The VM disks a cached device (by its node) serves."""
    return [(v, d) for v in scan_.vms for d in v.disks if node in d.caches]
