"""Human renderings of the snapshot shared by the CLI and the lab demo (text, no colour).

Names come from devices (dm names, bcache device names, by-id links): every line passes
through :func:`cachemgr.core.text.printable`, so a control character shows as an escape and
never reaches the terminal (issue #15)."""

from __future__ import annotations

from cachemgr.backends import vms
from cachemgr.core import model
from cachemgr.core.model import (
    BcacheBacking,
    DmCacheDevice,
    DmWritecacheDevice,
    Snapshot,
    human,
)
from cachemgr.core.text import printable
from cachemgr.procedures import health, kinds

short = model.short  # compact sizes for the table: 0, 512B, 4.0K, 58.5M, 1.2G


def _tail(text: str, width: int) -> str:
    """Keep the end of a long name (/dev/mapper/vm-disk-7 -> ~/vm-disk-7): it tells more."""
    return text if len(text) <= width else "~" + text[-(width - 1):]


def _ratio(b: BcacheBacking, interval: str) -> str:
    s = b.stats.get(interval)
    r = s.computed_hit_ratio if s else None
    return "-" if r is None else f"{100 * r:.0f}%"


dirty_text = model.dirty_text  # a backing device's dirty data ("lost?": on a missing set)


def status_table(snap: Snapshot, *, intervals: bool = True) -> str:
    """One line per backing device and per dm-cache device, then one per cache set and per
    dm-cache device. Fits 80 columns for bcache0-9. ``intervals`` False (``status`` without
    ``--stats``: the snapshot has no five-minute stats) leaves out the HIT5m column."""
    lines = []
    findings = health.assess(snap)
    stranded = {f.device: f for f in findings if f.code == "stranded-dirty"}
    if not snap.bcache_loaded:
        lines.append("bcache: module not loaded (modprobe bcache)")
    hit5m = f"{'HIT5m':>6}" if intervals else ""
    lines.append(f"{'DEVICE':<13}{'BACKING':<13}{'MODE':<13}{'STATE':<9}{'DIRTY':>7}"
                 f"{hit5m}{'HIT':>5}{'WBRATE':>8}{'ERR':>4} CSET")
    for b in snap.backings:
        rate = "-" if b.writeback_rate is None or b.mode is None else \
            short(b.writeback_rate.bytes) + "/s"
        b5m = f"{_ratio(b, 'five_minute'):>6}" if intervals else ""
        lines.append(
            f"{b.device or '(stopped)':<12.12} {_tail(b.identity.node, 12):<12} "
            f"{(b.mode.value if b.mode else '?'):<13}{b.state.value:<9}{dirty_text(b):>7}"
            f"{b5m}{_ratio(b, 'total'):>5}{rate:>8}"
            f"{b.io_errors if b.io_errors is not None else '?':>4} "
            f"{(b.cset_uuid or '-')[:8]}"
        )
    lines.extend(_dm_row(d, intervals) for d in snap.dmcaches)
    lines.extend(_wc_row(w, intervals) for w in snap.writecaches)
    # the kinds registered beyond the built-in ones: the columns every kind has
    others = [k for k in kinds.listed(snap) if any(k.obj is o for o in snap.others)]
    for k in others:
        dev, backing, mode, st, dirty = k.status_row()
        lines.append(f"{dev:<12.12} {backing:<12.12} {mode:<13}{st:<9}{dirty:>7}")
    if not snap.backings:
        lines.append("(no bcache backing devices)")
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
        if f.code != "stranded-dirty" and not f.code.startswith("interrupted-"):
            lines.append(f"{f.level.name}: {f.line()}")
    for w in snap.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(printable(line) for line in lines)


def _bare(node: str | None) -> str:
    return (node or "?").removeprefix("/dev/")


def _dm_row(d: DmCacheDevice, intervals: bool = True) -> str:
    """A dm-cache device in the same columns: DEVICE is its dm name (a valid TARGET; VG/LV
    for LVM's), BACKING its origin, CSET its cache device; no per-interval stats, rate or
    errors."""
    st = d.status
    ratio = st.hit_ratio if st else None
    return _dm_line(d.lvm.full_name if d.lvm else d.name,
                    d.origin.node if d.origin else d.table.origin_dev, d.mode.value,
                    d.state.value, short(d.dirty_bytes) if st else "?",
                    "-" if ratio is None else f"{100 * ratio:.0f}%", "-",
                    d.cache.node if d.cache else d.table.cache_dev, intervals)


def _dm_line(name: str, origin: str, mode: str, state: str, dirty: str, ratio: str,
             errors: str, cache: str, intervals: bool = True) -> str:
    """A device-mapper cache in the table's columns (no per-interval stats or rate)."""
    hit5m = f"{'-':>6}" if intervals else ""
    return (f"{printable(name):<13.13}{_bare(origin):<13.13}{mode:<13}{state:<9}{dirty:>7}"
            f"{hit5m}{ratio:>5}{'-':>8}{errors:>4} {_bare(cache)}")


def _dm_detail(d: DmCacheDevice) -> str:
    st = d.status
    parts = [f"dm-cache {d.node}: cache {d.cache.node if d.cache else d.table.cache_dev}",
             f"metadata {d.metadata.node if d.metadata else d.table.metadata_dev}",
             f"block {human(d.block_bytes)}"]
    if st:
        parts += [f"used {st.used}/{st.total}", f"dirty {st.dirty} blocks",
                  f"policy {st.policy}", f"migration_threshold {st.migration_threshold}"]
    elif d.failure:
        parts.append(f"status {d.failure}")
    else:  # a status line cachemgr cannot read: shown as the kernel printed it
        parts.append(f"status unknown: {printable(d.raw_status or '')}")
    if d.lvm is not None:
        parts = [f"lvmcache {d.lvm.full_name} ({d.node}): {d.lvm.pool_kind} "
                 f"{d.lvm.vg}/{d.lvm.pool} on {','.join(d.lvm.cache_pvs) or '?'}",
                 f"origin on {','.join(d.lvm.origin_pvs) or '?'}", *parts[2:]]
        if d.lvm.health or d.lvm.check_needed:
            parts.append(f"LVM health {d.lvm.health or 'check needed'}")
    elif d.lvm_owned:
        parts.append("owned by LVM (change it with lvchange/lvconvert)")
    if d.open_count:
        parts.append(f"open {d.open_count}")
    return ", ".join(parts)


def _wc_row(w: DmWritecacheDevice, intervals: bool = True) -> str:
    st = w.status
    reads, hits = (st.counter(0), st.counter(1)) if st else (None, None)
    return _dm_line(w.lvm.full_name if w.lvm else w.name,
                    w.origin.node if w.origin else w.table.origin_dev, "writecache",
                    w.state.value, short(w.dirty_bytes),
                    "-" if not reads or hits is None else f"{100 * hits / reads:.0f}%",
                    str(st.error) if st else "?", w.cache.node if w.cache else w.table.cache_dev,
                    intervals)


def _wc_detail(w: DmWritecacheDevice) -> str:
    st = w.status
    set_ = w.table.settings()
    head = (f"lvm writecache {w.lvm.full_name} ({w.node}): cachevol {w.lvm.vg}/{w.lvm.pool} "
            f"on {','.join(w.lvm.cache_pvs) or '?'}, origin on "
            f"{','.join(w.lvm.origin_pvs) or '?'}" if w.lvm is not None
            else f"dm-writecache {w.node}: cache {w.cache.node if w.cache else w.table.cache_dev}")
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


__all__ = ["dirty_text", "human", "status_table"]
