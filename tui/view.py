"""What the dashboard shows, as plain data: rows of the device tree from a Snapshot.

No textual here: the rows are computed (and unit-tested) apart from the widgets that draw
them. Words and formats follow ``cachemgr status`` (cachemgr/ops/render.py): the same ``lost?``
for dirty data on a missing cache set, the same kernel words for modes and states.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from cachemgr.core.model import (
    BcacheBacking,
    CacheSet,
    CacheState,
    DmCacheDevice,
    DmWritecacheDevice,
    GoneBacking,
    Owner,
    Snapshot,
    Stats,
)
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import vms as vm_ops
from cachemgr.ops.health import Finding, Level
from cachemgr.ops.render import dirty_text, errors_text, short

__all__ = ["Row", "dirty_text", "rows"]

# kinds of selectable objects
BCACHE = "bcache"
CSET = "cset"
DM = "dm"  # dm-cache (LVM's lvmcache too)
WC = "wc"  # dm-writecache (LVM's writecache too)
OTHER = "other"  # a kind registered beyond the built-in ones (cachemgr/procedures/kinds)
# a bcache backing device ``check`` last saw dirty that is gone (Snapshot.gone): no device
# to act on, only its finding and what to do (issue #41)
GONE = "gone"
KIND_WORDS = {BCACHE: "bcache", CSET: "cache set", DM: "dm-cache", WC: "dm-writecache",
              OTHER: "cache", GONE: "gone backing device"}
Obj = BcacheBacking | CacheSet | DmCacheDevice | DmWritecacheDevice | GoneBacking


@dataclass(frozen=True)
class Row:
    """One line of the device tree. ``key`` is stable across polls (uuid or dm name)."""

    key: str
    kind: str  # BCACHE, CSET, DM or WC
    device: str  # what the first column shows (tree-indented)
    disk: str  # the backing device, the SSD, or the dm origin
    mode: str
    state: str
    dirty: str
    hit5m: str
    hit: str
    wbrate: str
    used: str
    errors: str
    target: str  # what the CLI takes as TARGET for this object
    dirty_bytes: int | None = None
    alert: bool = False  # failed, lost dirty data, IO errors
    owner: str = ""  # HELD or OWNED: a procedure holds it (owner_mark)
    vms: str = ""  # the libvirt domains whose disks are on it: "vm1 vda, vm2 vdb"
    disk_nodes: tuple[str, ...] = ()  # ``disk`` as device nodes (prose and findings)

    def cells(self) -> tuple[str, ...]:
        return (self.device, self.disk, self.mode, self.state, self.dirty, self.hit5m,
                self.hit, self.used, self.errors, self.owner, self.vms)


COLUMNS: tuple[tuple[str, str, int, bool], ...] = (
    # (key, label, width at 80 columns, right-aligned): 78 columns with the separators, so
    # the table fits 80 with its scrollbar; a wider terminal widens DEVICE, DISK and VMS
    # (:func:`widths`). No WB/s: bcache's writeback_rate is a controller's setting, not
    # traffic (the detail view shows it)
    ("device", "DEVICE", 10, False),
    ("disk", "DISK", 8, False),
    ("mode", "MODE", 12, False),
    ("state", "STATE", 8, False),
    ("dirty", "DIRTY", 6, True),
    ("hit5m", "HIT5m", 5, True),
    ("hit", "RHIT", 4, True),  # read hits, since the start
    ("used", "USED", 4, True),
    ("errors", "ERR", 3, True),
    # a procedure holds it (HELD) or an interrupted one owns it (OWNED)
    ("owner", "⚑", 1, False),
    ("vms", "VMS", 6, False),
)
# the columns a wider terminal gives its extra width to, and their shares of it
GROW = {"device": 2, "disk": 2, "vms": 3}


def widths(rows: Sequence[Row], total: int) -> list[int]:
    """Each column's width for a table ``total`` columns wide (the separators and the
    scrollbar's 2 included): at 80 the base widths; beyond, DEVICE, DISK and VMS grow by
    their shares, never wider than their longest cell, the rest going to VMS."""
    base = [w for _, _, w, _ in COLUMNS]
    extra = total - (sum(base) + len(base) + 2)
    if extra <= 0:
        return base
    keys = [k for k, *_ in COLUMNS]
    need = {k: max([len(getattr(r, k)) for r in rows] + [base[keys.index(k)]]) for k in GROW}
    out = list(base)
    left = extra
    for k in ("device", "disk"):
        i = keys.index(k)
        add = min(extra * GROW[k] // sum(GROW.values()), need[k] - base[i])
        out[i] += add
        left -= add
    out[keys.index("vms")] += left
    return out
# the owner column's marks: a run holds it now; an interrupted run's journal owns it
HELD, OWNED = "⚑", "!"


def pct(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.0f}%"


def ratio(stats: dict[str, Stats], interval: str) -> float | None:
    s = stats.get(interval)
    return s.computed_hit_ratio if s else None


def bare(node: str | None) -> str:
    """A device as the table names it: sdb, nvme0n1, and a device-mapper device by its
    name (slowhdd for /dev/mapper/slowhdd)."""
    return (node or "?").removeprefix("/dev/mapper/").removeprefix("/dev/")


def backing_dirty_bytes(b: BcacheBacking) -> int | None:
    """None when unknown (the dirty data sits on a cache set that is not registered)."""
    if b.dirty is None:
        return None
    if b.cset_uuid is None and b.state == CacheState.DIRTY:
        return None
    return b.dirty.bytes


def backing_row(b: BcacheBacking, prefix: str, ssd_errors: int = 0) -> Row:
    """``ssd_errors``: its cache set's SSD's IO errors (ERR shows them after its own)."""
    rate = "-" if b.writeback_rate is None or b.mode is None else short(b.writeback_rate.bytes)
    lost = b.cset_uuid is None and b.state == CacheState.DIRTY
    return Row(
        key=b.key, kind=BCACHE,
        device=prefix + (b.device_name or "(stopped)"),
        disk=bare(b.identity.node),
        disk_nodes=(b.identity.node,) if b.identity.node else (),
        mode=b.mode.value if b.mode else "?",
        state=b.state.value,
        dirty=dirty_text(b),
        hit5m=pct(ratio(b.stats, "five_minute")),
        hit=pct(ratio(b.stats, "total")),
        wbrate=rate,
        used="",
        errors=errors_text(b.io_errors, ssd_errors),
        target=b.device or b.identity.node,
        dirty_bytes=backing_dirty_bytes(b),
        alert=lost or bool(b.io_errors) or bool(ssd_errors)
        or b.state == CacheState.INCONSISTENT,
    )


def gone_row(g: GoneBacking, prefix: str) -> Row:
    """A bcache backing device gone while dirty: no /dev/bcacheN and no disk any more, its
    dirty data only on the cache set's SSD. The row is where the admin finds it (red, the
    finding and its next command in its detail); it offers no action."""
    return Row(
        key=f"gone:{g.uuid}", kind=GONE,
        device=prefix + "(gone)",
        disk=bare(g.node),
        disk_nodes=(g.node,),
        mode="?",
        state="gone",
        dirty=short(g.dirty_bytes) if g.dirty_bytes is not None else "?",
        hit5m="-", hit="-", wbrate="-", used="", errors="-",
        target=g.node,
        dirty_bytes=None,  # not drainable here: never "most dirty"
        alert=True,
    )


def cset_row(c: CacheSet, members: list[BcacheBacking]) -> Row:
    errs = sum(x.io_errors or 0 for x in c.caches)
    known = [backing_dirty_bytes(b) for b in members]
    dirty = None if any(d is None for d in known) else sum(d or 0 for d in known)
    return Row(
        key=f"cset:{c.uuid}", kind=CSET,
        device=f"cset {c.uuid[:5]}",
        disk=",".join(bare(x.identity.node) for x in c.caches) or "?",
        disk_nodes=tuple(x.identity.node for x in c.caches if x.identity.node),
        mode="",
        state="errors" if c.errors and c.errors not in ("0", "none") and errs else "",
        dirty=short(dirty) if members else "",
        hit5m=pct(ratio(c.stats, "five_minute")),
        hit=pct(ratio(c.stats, "total")),
        wbrate="",
        used="?" if c.cache_available_percent is None else
        f"{100 - c.cache_available_percent}%",
        errors=str(errs),
        target=c.uuid,
        dirty_bytes=dirty,
        alert=bool(errs),
    )


def dm_name(d: DmCacheDevice | DmWritecacheDevice) -> str:
    """How a dm device is named to an admin: VG/LV for LVM's, else its dm name."""
    return d.lvm.full_name if d.lvm is not None else d.name


def origin_nodes(d: DmCacheDevice | DmWritecacheDevice) -> tuple[str, ...]:
    """Where a dm device's data lives, as an admin knows it: an LVM cache's origin PVs (its
    origin is a hidden sub-LV, ``*_corig``), else the origin device."""
    if d.lvm is not None and d.lvm.origin_pvs:
        return tuple(d.lvm.origin_pvs)
    return (d.origin.node,) if d.origin and d.origin.node else ()


def origin_words(d: DmCacheDevice | DmWritecacheDevice) -> str:
    nodes = origin_nodes(d)
    return ",".join(bare(n) for n in nodes) if nodes else bare(d.table.origin_dev)


def read_hits(st: object) -> float | None:
    """dm-cache's read hit ratio: what HIT means for every kind (bcache counts hits on
    reads only); its write hits are mostly writes the cache absorbed (issue #32: an LVM
    cache at 99 % HIT while lvs reported 0/0 read hits)."""
    rh, rm = getattr(st, "read_hits", None), getattr(st, "read_misses", None)
    if rh is None or rm is None or rh + rm == 0:
        return None
    return float(rh / (rh + rm))


def dm_row(d: DmCacheDevice) -> Row:
    st = d.status
    return Row(
        key=f"dm:{d.name}", kind=DM,
        device=dm_name(d),
        disk=origin_words(d),
        disk_nodes=origin_nodes(d),
        mode=d.mode.value,
        state=d.state.value,
        dirty=short(d.dirty_bytes) if st else "?",
        hit5m="-",
        hit=pct(read_hits(st)),
        wbrate="-",
        used=f"{100 * st.used // st.total}%" if st and st.total else "?",
        errors=d.failure or ("ro" if st and st.metadata_mode == "ro" else "0"),
        target=dm_name(d),
        dirty_bytes=d.dirty_bytes,
        alert=st is None or st.metadata_mode == "ro" or bool(st.needs_check),
    )


def wc_row(d: DmWritecacheDevice) -> Row:
    st = d.status
    dirty = d.dirty_bytes
    return Row(
        key=f"wc:{d.name}", kind=WC,
        device=dm_name(d),
        disk=origin_words(d),
        disk_nodes=origin_nodes(d),
        mode=d.mode.value,
        state=d.state.value,
        dirty=short(dirty) if st else "?",
        hit5m="-",
        hit="-",  # writecache caches writes: its counters are not a read hit ratio
        wbrate="-",
        used=f"{100 * (st.total - st.free) // st.total}%" if st and st.total else "?",
        errors=d.failure or (str(st.error) if st else "?"),
        target=dm_name(d),
        dirty_bytes=dirty,
        alert=st is None or bool(st.error),
    )


def owner_mark(o: Owner | None) -> str:
    """The owner column: HELD (a run holds it now), OWNED (an interrupted run owns it)."""
    if o is None:
        return ""
    return HELD if o.running else OWNED


def owner_line(o: Owner) -> str:
    """What the detail view says of the owner: who holds it since when, or the
    interrupted run and what to do about it (the words of cachemgr status)."""
    if o.running:
        return f"held by {o.words()}"
    return f"owned by {o.words()}; {o.next_step()}"


def owner_short(o: Owner) -> str:
    """The owner in a few words: "drain", "replace-ssd R", "drain (interrupted)"."""
    return o.procedure + (f" {o.run}" if o.run else "") + (
        "" if o.running else " (interrupted)")


# a mark that a VM whose disk is on the device left this host (the VMS column's words)
LEFT_WORD = "left"

Left = tuple[str, str | None, str]  # ops.coherence.left_marks: device, VM, words


def rows(snap: Snapshot, findings: Sequence[Finding] = (),
         left: Sequence[Left] = ()) -> list[Row]:
    """The device tree: each cache set with its backing devices under it, then backing
    devices on no (registered) set, then dm-cache devices; each marked with its owner, and
    in red (``alert``) when a finding of the health model (``findings``) is about it; a
    device marked as holding copies of a disk a VM took elsewhere (``left``: issue #42)
    says so in its VMS cell ("vm1 left"), before the VMs it serves."""
    out = _rows(snap)
    if snap.vms is not None:
        out = [dataclasses.replace(r, vms=vms_text(snap, r)) for r in out]
    if left:
        out = [dataclasses.replace(r, vms=", ".join(
            [*(f"{vm or 'a VM'} {LEFT_WORD}" for _, vm, _ in left_of(snap, r, left)),
             *([r.vms] if r.vms else [])])) if left_of(snap, r, left) else r for r in out]
    if not snap.owners and not findings:
        return out
    marked = []
    for r in out:
        obj = find(snap, r.key)
        o = cache_ops.owner_of(snap, obj) if obj is not None else None
        if o is not None:
            r = dataclasses.replace(r, owner=owner_mark(o))
        if not r.alert and any(f.level >= Level.WARNING for f in about(snap, r, findings)):
            r = dataclasses.replace(r, alert=True)
        marked.append(r)
    return marked


def left_of(snap: Snapshot, r: Row, left: Sequence[Left]) -> list[Left]:
    """The "a VM left" marks of row ``r``'s device (a cache set has none: its devices do)."""
    if r.kind in (CSET, GONE):
        return []
    own = names(snap, r)
    return [m for m in left if m[0] in own]


def names(snap: Snapshot, r: Row) -> set[str]:
    """What a finding may call the row's device: its TARGET, its node, its disks (a cache
    set's SSDs, a device's backing disk or origin) and a cache set's UUID."""
    out = {r.target, *r.disk_nodes}
    obj = find(snap, r.key)
    k = cache_ops.kind_of(obj) if obj is not None else None
    return out | (k.names() if k is not None else set())


def about(snap: Snapshot, r: Row, findings: Sequence[Finding]) -> list[Finding]:
    """The findings about row ``r``'s device (an interrupted procedure's owner is shown by
    its own mark and line, not here)."""
    own = names(snap, r)
    return [f for f in findings if not f.code.startswith("interrupted-")
            and own.intersection(f.device.split(","))]


def vms_text(snap: Snapshot, r: Row) -> str:
    """The VM disks on the row's device ("vm1 vda 0.93, vm2 vdb": the VM's read hit ratio
    on it where known); for a cache set, those on its devices."""
    if snap.vms is None:
        return ""
    if r.kind == CSET:
        nodes = [b.device for b in snap.backings if b.cset_uuid == r.target and b.device]
    else:
        obj = find(snap, r.key)
        k = cache_ops.kind_of(obj) if obj is not None else None
        nodes = [r.target, *sorted(k.names() if k is not None else ())]
    seen: list[str] = []
    for node in dict.fromkeys(nodes):
        for v, d in vm_ops.serving(snap.vms, node):
            # the VM's read hit ratio on this cache where io.stat tells it (cachemgr vms)
            hit = vm_ops.hit_text(next((c for c in v.cache_io if c.cache == node), None))
            word = f"{v.name} {d.target}" + (f" {hit}" if hit != "-" else "")
            if word not in seen:
                seen.append(word)
    return ", ".join(seen)


def finding_line(f: Finding) -> str:
    """One finding as the banner and the detail view say it."""
    return f"{f.level.name} {f.line()}"


def _rows(snap: Snapshot) -> list[Row]:
    out: list[Row] = []
    seen: set[str] = set()
    for c in snap.cache_sets:
        members = [b for b in snap.backings if b.cset_uuid == c.uuid]
        gone = [g for g in snap.gone if g.cset_uuid == c.uuid]
        out.append(cset_row(c, members))
        errs = sum(x.io_errors or 0 for x in c.caches)
        n = len(members) + len(gone)
        for i, b in enumerate(members):
            out.append(backing_row(b, "└ " if i == n - 1 else "├ ", errs))
            seen.add(b.key)
        for i, g in enumerate(gone, start=len(members)):
            out.append(gone_row(g, "└ " if i == n - 1 else "├ "))
            seen.add(g.uuid)
    for b in snap.backings:
        if b.key not in seen:
            out.append(backing_row(b, ""))
    out.extend(gone_row(g, "") for g in snap.gone if g.uuid not in seen)
    out.extend(dm_row(d) for d in snap.dmcaches)
    out.extend(wc_row(d) for d in snap.writecaches)
    out.extend(other_row(k) for k in cache_ops.others(snap))
    return out


def other_key(k: cache_ops.Kind) -> str:
    return f"other:{k.name}:{k.node}"


def other_row(k: cache_ops.Kind) -> Row:
    """A device of a kind registered beyond the built-in ones: the columns every kind has
    (Kind.status_row), as cachemgr status lists it."""
    dev, backing, mode, state, dirty = k.status_row()
    return Row(key=other_key(k), kind=OTHER, device=bare(dev), disk=bare(backing),
               disk_nodes=(backing,) if backing.startswith("/dev/") else (), mode=mode,
               state=state, dirty=dirty, hit5m="-", hit="-", wbrate="-", used="-", errors="-",
               target=k.target, dirty_bytes=k.dirty_bytes)


def find(snap: Snapshot, key: str) -> Obj | None:
    """The snapshot's object behind a row key."""
    if key.startswith("cset:"):
        return snap.cache_set(key[5:])
    if key.startswith("dm:"):
        return next((d for d in snap.dmcaches if d.name == key[3:]), None)
    if key.startswith("wc:"):
        return next((d for d in snap.writecaches if d.name == key[3:]), None)
    if key.startswith("other:"):
        return next((k.obj for k in cache_ops.others(snap) if other_key(k) == key), None)
    if key.startswith("gone:"):
        return next((g for g in snap.gone if g.uuid == key[5:]), None)
    return next((b for b in snap.backings if b.key == key), None)


def most_dirty(snap: Snapshot) -> str | None:
    """The key of the cached device holding the most dirty data (what to drain first)."""
    best: tuple[int, str] | None = None
    for r in rows(snap):
        if r.kind != CSET and r.dirty_bytes and (best is None or r.dirty_bytes > best[0]):
            best = (r.dirty_bytes, r.key)
    return best[1] if best else None


def block_name(obj: Obj) -> str | None:
    """The kernel block device whose IO counters measure the device's IOPS (its kind's)."""
    k = cache_ops.kind_of(obj)
    return k.block_name if k is not None else None


def disk_words(r: Row) -> str:
    """The row's disk(s) as prose names them: device nodes."""
    return ", ".join(r.disk_nodes) or r.disk
