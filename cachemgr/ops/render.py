"""Human renderings of the snapshot shared by the CLI and the lab demo (text, no colour).

Names come from devices (dm names, bcache device names, by-id links): every line passes
through :func:`cachemgr.core.text.printable`, so a control character shows as an escape and
never reaches the terminal (issue #15)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachemgr.backends import vms
from cachemgr.backends.dmcache.refusals import lvm_name
from cachemgr.core import model
from cachemgr.core.model import (
    BcacheBacking,
    CacheSet,
    DmCacheDevice,
    DmWritecacheDevice,
    Identity,
    Snapshot,
    Stats,
    human,
)
from cachemgr.core.text import printable
from cachemgr.procedures import health, kinds

short = model.short  # compact sizes for the table: 0, 512B, 4.0K, 58.5M, 1.2G


# ----------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Column:
    """A column of the status table: numbers are right-aligned; a name column (``cut`` > 0)
    may be cut to fit a terminal, keeping its end (the part that tells devices apart), the
    lowest ``cut`` first."""

    head: str
    right: bool = False
    cut: int = 0


@dataclass
class Row:
    """One row: its cells (device text, made printable here), the tree mark before the
    first one (``├``/``└`` under a cache set); ``whole``: its first cell is never cut (a
    cache set's ``cset 058feacd``)."""

    cells: list[str]
    mark: str = ""
    whole: bool = False


ELLIPSIS = "…"
GAP = 2  # spaces between columns; 1 when the table must shrink to fit
NAME_MIN = 8  # a name column is never cut narrower than this (or its heading)


def cell_width(text: str) -> int:
    """The terminal cells ``text`` takes: a wide (East Asian) character two, a combining
    or format character none (text already :func:`printable`: no control characters)."""
    n = 0
    for c in text:
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
            continue
        n += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return n


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells: whole when it fits, else an ellipsis and its end
    (``/dev/mapper/slowhdd`` -> ``…/slowhdd``, not a stub of a word before a ``/``): the end
    of a device name is what tells it from its neighbours."""
    if cell_width(text) <= width:
        return text
    if width < 2:
        return ELLIPSIS[:width]
    tail: list[str] = []
    used = 0
    for c in reversed(text):
        w = cell_width(c)
        if used + w > width - 1:
            break
        tail.append(c)
        used += w
    end = "".join(reversed(tail))
    slash = end.find("/")
    if 0 < slash <= 3 and slash < len(end) - 1:  # a stub of a word: start at the "/"
        end = end[slash:]
    return ELLIPSIS + end


def grid(cols: list[Column], rows: list[Row], width: int | None = None) -> list[str]:
    """The header and the rows, each column as wide as its widest cell. Past ``width``
    (a terminal's columns; None: no limit) the gaps narrow to one space, then the name
    columns are cut (:func:`cut`) in their ``cut`` order, each down to :data:`NAME_MIN`; a
    table that still does not fit is printed at that size (the terminal wraps its lines;
    its columns still line up)."""
    texts = [[printable(c) for c in r.cells] for r in rows]
    need = [max([cell_width(col.head)] + [cell_width((r.mark if i == 0 else "") + t[i])
                                     for r, t in zip(rows, texts, strict=True)])
            for i, col in enumerate(cols)]
    gap = GAP
    if width is not None:
        if sum(need) + gap * (len(cols) - 1) > width:
            gap = 1
        excess = sum(need) + gap * (len(cols) - 1) - width
        kept = [max([0] + [cell_width(r.mark + t[0]) for r, t in zip(rows, texts, strict=True)
                           if r.whole])] + [0] * (len(cols) - 1)
        for i in sorted((i for i, c in enumerate(cols) if c.cut), key=lambda i: cols[i].cut):
            floor = max(cell_width(cols[i].head), NAME_MIN, kept[i])
            give = min(max(0, excess), max(0, need[i] - floor))
            need[i] -= give
            excess -= give

    def line(values: list[str], mark: str = "") -> str:
        out = []
        for i, (col, v) in enumerate(zip(cols, values, strict=True)):
            m = mark if i == 0 else ""
            v = m + cut(v, need[i] - cell_width(m))
            pad = " " * max(0, need[i] - cell_width(v))
            out.append(pad + v if col.right else v + pad)
        return (" " * gap).join(out).rstrip()

    return [line([c.head for c in cols])] + [line(t, r.mark)
                                             for r, t in zip(rows, texts, strict=True)]


# ----------------------------------------------------------------------------- the table


def _pct(hits: int | None, total: int | None) -> str:
    """A hit ratio as the table shows it; "-" when nothing was counted."""
    return "-" if hits is None or not total else f"{100 * hits / total:.0f}%"


def _ratio(stats: dict[str, Stats], interval: str) -> str:
    """bcache's hit ratio of ``interval``: reads only (bcache counts no write hits)."""
    s = stats.get(interval)
    r = s.computed_hit_ratio if s else None
    return "-" if r is None else f"{100 * r:.0f}%"


def _natural(text: str) -> list[Any]:
    """bcache2 before bcache10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


dirty_text = model.dirty_text  # a backing device's dirty data ("lost?": on a missing set)
errors_text = model.errors_text  # a backing device's ERR: its own, then its SSD's ("0+4 SSD")


def status_table(snap: Snapshot, *, intervals: bool = True, width: int | None = None,
                 written_back: Mapping[str, float | None] | None = None) -> str:
    """The status table, then a line per cache set and cached device with what the table
    has no room for, then unregistered devices, unassembled records, the VMs, owners,
    findings and warnings.

    The table (docs/admin-guide.md, "See what you have"): each cache set with its backing
    devices under it, the backing devices of no registered set, then the device-mapper
    caches (dm-cache, dm-writecache, LVM's by VG/LV) and the kinds registered beyond the
    built-in ones. Columns take the width of their content; ``width`` (the terminal's) cuts
    names to fit (:func:`grid`). RHIT and WHIT are read and write hit ratios apart (bcache
    counts reads only). bcache's ``writeback_rate`` is a controller setting, not traffic: it
    is not in the table (status --json and the detail views have it); ``written_back`` (a
    poller's measurements, procedures/traffic.py: ``status --watch``) adds WB/s, the bytes
    written back per second since the previous look. ``intervals`` False
    (``status`` without ``--stats``: the snapshot has no five-minute stats) leaves out the
    RHIT5m column."""
    lines = []
    findings = health.assess(snap)
    stranded = {f.device: f for f in findings if f.code == "stranded-dirty"}
    if not snap.bcache_loaded:
        lines.append("bcache: module not loaded (modprobe bcache)")
    cols = [Column("DEVICE", cut=3), Column("BACKING", cut=1), Column("MODE"),
            Column("STATE"), Column("DIRTY", right=True)]
    cols += [Column("WB/s", right=True)] if written_back is not None else []
    cols += [Column("RHIT5m", right=True)] if intervals else []
    cols += [Column("RHIT", right=True), Column("WHIT", right=True), Column("ERR", right=True),
             Column("CACHE", cut=2)]
    rows = _rows(snap, intervals, written_back)
    if rows:
        lines.extend(grid(cols, rows, width))
    else:
        lines.append("(no cached devices: no bcache cache set or backing device, no dm-cache "
                     "or dm-writecache device)")
    for c in snap.cache_sets:
        ssd = ",".join(x.identity.node for x in c.caches) or "?"
        used = "?" if c.cache_available_percent is None else f"{100 - c.cache_available_percent}%"
        errs = sum(x.io_errors or 0 for x in c.caches)
        lines.append(f"cset {c.uuid}: cache {ssd}, {len(c.backing_names)} backing, "
                     f"used {used}, io errors {errs}")
    lines.extend(_dm_detail(d) for d in snap.dmcaches)
    lines.extend(_wc_detail(w) for w in snap.writecaches)
    for u in snap.unregistered:
        line = f"unregistered bcache {u.kind} {u.identity.node}: superblock {u.sb_state or '?'}"
        if u.cset_uuid and snap.cache_set(u.cset_uuid) is None:
            line += f", its cache set {u.cset_uuid[:8]} is not registered"
        lines.append(line)
        if u.dirty_data_lost_with_cache:
            f = stranded.get(u.identity.node)
            if f is not None:
                lines.append(f"  {f.what}; next: {f.next}")
    for d in snap.unassembled:
        lines.append(f"unassembled dm-cache {d.node}: {d.mode.value}, recorded in {d.record}"
                     + ("; " + "; ".join(f"{r} {w}" for r, w in d.problems) if d.problems
                        else "; its devices are present, known by their place only: check "
                        f"them, then cachemgr assemble {d.name}" if d.unproven
                        else "; its devices are present (cachemgr autoattach assembles it)"))
    if snap.vms is not None:
        for node in [b.device for b in snap.backings if b.device] + [
                d.node for d in snap.dm_devices]:
            served = [f"{v.name} ({d.target}, cache={d.cache})"
                      for v, d in vms.serving(snap.vms, node)]
            if served:
                lines.append(f"VMs on {node}: " + ", ".join(served))
    for o in snap.owners:
        if o.running:
            lines.append(f"{o.device}: held by {o.words()}")
        else:
            lines.append(f"{o.device}: owned by {o.words()}; {o.next_step()}")
    # the health model's other findings (procedures/health.py; what cachemgr check reports)
    for f in findings:
        # (the scan's warnings are the "warning:" lines below)
        if f.code not in ("stranded-dirty", "scan-warning") and \
                not f.code.startswith("interrupted-"):
            lines.append(f"{f.level.name}: {f.line()}")
    for w in snap.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(printable(line) for line in lines)


def _rows(snap: Snapshot, intervals: bool,
          written_back: Mapping[str, float | None] | None = None) -> list[Row]:
    """The table's rows: each cache set and its backing devices (tree marks), the backing
    devices of no registered set, the device-mapper caches, then the other kinds'.
    ``written_back``: a WB/s cell after DIRTY, each backing device's measured write-back
    traffic by key ("-" where not measured: the first look, other kinds)."""
    rows = _rows_plain(snap, intervals)
    if written_back is None:
        return rows
    by_device = {b.device or "(stopped)": b.key for b in snap.backings}
    for r in rows:
        key = by_device.get(r.cells[0]) if r.mark or not r.whole else None
        v = written_back.get(key) if key is not None else None
        r.cells.insert(5, "-" if v is None else short(round(v)))
    return rows


def _rows_plain(snap: Snapshot, intervals: bool) -> list[Row]:
    rows: list[Row] = []

    def order(b: BcacheBacking) -> list[Any]:
        return _natural(b.device or "~") + _natural(b.identity.node)

    under: set[int] = set()
    for c in snap.cache_sets:
        mine = sorted((b for b in snap.backings if b.cset_uuid == c.uuid), key=order)
        under |= {id(b) for b in mine}
        rows.append(_cset_row(c, mine, intervals))
        rows += [_bcache_row(snap, b, intervals, "└" if i == len(mine) - 1 else "├")
                 for i, b in enumerate(mine)]
    rows += [_bcache_row(snap, b, intervals)
             for b in sorted(snap.backings, key=order) if id(b) not in under]
    rows += [_dm_row(d, intervals) for d in snap.dmcaches]
    rows += [_wc_row(w, intervals) for w in snap.writecaches]
    # the kinds registered beyond the built-in ones: the columns every kind has
    for k in kinds.listed(snap):
        if any(k.obj is o for o in snap.others):
            dev, backing, mode, st, dirty = k.status_row()
            rows.append(Row([dev, backing, mode, st, dirty, *(["-"] if intervals else []),
                             "-", "-", "-", "-"]))
    return rows


def _ssds(c: CacheSet) -> str:
    return ",".join(x.identity.node for x in c.caches) or "?"


def _cset_row(c: CacheSet, mine: list[BcacheBacking], intervals: bool) -> Row:
    """A cache set: its dirty data (its backing devices' together), its hit ratio (reads),
    its SSD's IO errors, the SSD."""
    dirty = [b.dirty_bytes for b in mine]
    total = "?" if any(d is None for d in dirty) else short(sum(d or 0 for d in dirty))
    return Row([f"cset {c.uuid[:8]}", "-", "-", "-", total,
                *([_ratio(c.stats, "five_minute")] if intervals else []),
                _ratio(c.stats, "total"), "-", str(sum(x.io_errors or 0 for x in c.caches)),
                _ssds(c)], whole=True)


def _bcache_row(snap: Snapshot, b: BcacheBacking, intervals: bool, mark: str = "") -> Row:
    """A backing device: CACHE is its set's SSD ("-" when detached; the set's UUID when the
    set is not registered)."""
    c = snap.cache_set(b.cset_uuid) if b.cset_uuid else None
    cache = _ssds(c) if c is not None else f"cset {b.cset_uuid[:8]}" if b.cset_uuid else "-"
    return Row([b.device or "(stopped)", b.identity.node,
                b.mode.value if b.mode else "?", b.state.value, dirty_text(b),
                *([_ratio(b.stats, "five_minute")] if intervals else []),
                _ratio(b.stats, "total"), "-",
                model.errors_text(b.io_errors, sum(x.io_errors or 0 for x in c.caches)
                                  if c is not None else 0), cache], mark)


# LVM's hidden sub-LVs as dm names: a cache pool's data and metadata (POOL_cpool_cdata,
# POOL_cpool_cmeta), a cachevol's (FAST_cvol-cdata, FAST_cvol-cmeta), the origin (LV_corig,
# LV_wcorig); lvm_name() drops the "-cdata" layer suffix
_LAYER = ("_cdata", "_cmeta", "_cpool", "_cvol")
_ORIGIN = ("_corig", "_wcorig")


def _lvm_part(node: str) -> str | None:
    """The LV an admin knows for one of LVM's hidden sub-LVs (``/dev/mapper/vg0-pool_cpool_
    cdata`` -> ``vg0/pool``), "?" for an origin sub-LV (the PVs under it are lvs's to say),
    None for any other node."""
    if not node.startswith("/dev/mapper/"):
        return None
    name = lvm_name(node.removeprefix("/dev/mapper/"))
    if "/" not in name:
        return None
    if name.endswith(_ORIGIN):
        return "?"
    base = name
    while base.endswith(_LAYER):
        base = base[: base.rindex("_")]
    return base if base != name else None


def _dm_node(owned: bool, ident: Identity | None, devno: str) -> str:
    """A device under a dm cache by its node; an LVM sub-LV by the LV it belongs to."""
    node = ident.node if ident else devno
    return (_lvm_part(node) or node) if owned else node


def _dm_names(d: DmCacheDevice | DmWritecacheDevice) -> tuple[str, str, str]:
    """DEVICE, BACKING and CACHE of a device-mapper cache: LVM's by VG/LV, the PVs under
    its origin and its cache pool or cachevol by the name it was given (``vg0/pool``, not
    the hidden ``pool_cpool_cdata``)."""
    if d.lvm is not None:
        return (d.lvm.full_name, ",".join(d.lvm.origin_pvs) or "?",
                f"{d.lvm.vg}/{d.lvm.pool_name}")
    return (d.node, _dm_node(d.lvm_owned, d.origin, d.table.origin_dev),
            _dm_node(d.lvm_owned, d.cache, d.table.cache_dev))


def _dm_row(d: DmCacheDevice, intervals: bool = True) -> Row:
    """A dm-cache device (LVM's too): read and write hit ratios from the kernel's counters
    since the cache was made (lvs's cache_read_hits... are the same counters); no
    per-interval stats or error count."""
    st = d.status
    dev, origin, cache = _dm_names(d)
    return Row([dev, origin, d.mode.value, d.state.value, short(d.dirty_bytes) if st else "?",
                *(["-"] if intervals else []),
                _pct(st.read_hits, st.read_hits + st.read_misses) if st else "-",
                _pct(st.write_hits, st.write_hits + st.write_misses) if st else "-",
                "-", cache])


def _dm_detail(d: DmCacheDevice) -> str:
    """What the table has no room for: the metadata device, block size, occupancy, the
    hit and miss counters (for LVM's, the ones lvs prints as cache_read_hits,
    cache_read_misses, cache_write_hits, cache_write_misses: lvm2 reads the same status
    line), the policy; an LVM cache's pool or cachevol by the name it was given."""
    st = d.status
    owned = d.lvm_owned
    parts = [f"dm-cache {d.node}: cache {_dm_node(owned, d.cache, d.table.cache_dev)}",
             f"metadata {_dm_node(owned, d.metadata, d.table.metadata_dev)}",
             f"block {human(d.block_bytes)}"]
    if st:
        parts += [f"used {st.used}/{st.total}", f"dirty {st.dirty} blocks",
                  f"read hits/misses {st.read_hits}/{st.read_misses}, write hits/misses "
                  f"{st.write_hits}/{st.write_misses}",
                  f"policy {st.policy}", f"migration_threshold {st.migration_threshold}"]
    elif d.failure:
        parts.append(f"status {d.failure}")
    else:  # a status line cachemgr cannot read: shown as the kernel printed it
        parts.append(f"status unknown: {printable(d.raw_status or '')}")
    if d.lvm is not None:
        parts = [f"lvmcache {d.lvm.full_name} ({d.node}): {d.lvm.pool_kind} "
                 f"{d.lvm.vg}/{d.lvm.pool_name} on {','.join(d.lvm.cache_pvs) or '?'}",
                 f"origin on {','.join(d.lvm.origin_pvs) or '?'}", *parts[2:]]
        if d.lvm.health or d.lvm.check_needed:
            parts.append(f"LVM health {d.lvm.health or 'check needed'}")
    elif d.lvm_owned:
        parts.append("owned by LVM (change it with lvchange/lvconvert)")
    if d.open_count:
        parts.append(f"open {d.open_count}")
    return ", ".join(parts)


def _wc_row(w: DmWritecacheDevice, intervals: bool = True) -> Row:
    """A dm-writecache device: read hits of reads, write hits (uncommitted and committed
    blocks) of writes, when the kernel prints its counters; its error indicator."""
    st = w.status
    dev, origin, cache = _dm_names(w)
    reads, read_hits = (st.counter(0), st.counter(1)) if st else (None, None)
    writes, hit_u, hit_c = (st.counter(2), st.counter(3), st.counter(4)) if st else (None,) * 3
    write_hits = None if hit_u is None or hit_c is None else hit_u + hit_c
    return Row([dev, origin, "writecache", w.state.value, short(w.dirty_bytes),
                *(["-"] if intervals else []), _pct(read_hits, reads),
                _pct(write_hits, writes), str(st.error) if st else "?", cache])


def _wc_detail(w: DmWritecacheDevice) -> str:
    st = w.status
    set_ = w.table.settings()
    head = (f"lvm writecache {w.lvm.full_name} ({w.node}): cachevol {w.lvm.vg}/"
            f"{w.lvm.pool_name} on {','.join(w.lvm.cache_pvs) or '?'}, origin on "
            f"{','.join(w.lvm.origin_pvs) or '?'}" if w.lvm is not None
            else f"dm-writecache {w.node}: cache "
            f"{_dm_node(w.lvm_owned, w.cache, w.table.cache_dev)}")
    parts = [head, f"block {human(w.block_bytes)}"]
    if st:
        parts += [f"dirty {st.dirty} blocks", f"free {st.free}/{st.total}",
                  f"writeback {st.writeback}"]
    else:
        parts.append(f"status {w.failure}")
    parts.append(f"watermarks {set_.get('high_watermark', '50')}/"
                 f"{set_.get('low_watermark', '45')}%")
    if w.lvm is None and w.lvm_owned:
        parts.append("owned by LVM (change it with lvchange/lvconvert)")
    return ", ".join(parts)


__all__ = ["Column", "Row", "cell_width", "cut", "dirty_text", "grid", "human", "short",
           "status_table"]
