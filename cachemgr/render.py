"""Human renderings of the snapshot shared by the CLI and the lab demo (text, no colour)."""

from __future__ import annotations

from cachemgr.model import BcacheBacking, Snapshot, human


def _short(n: int | None) -> str:
    """Compact sizes for the table: 0, 512B, 4.0K, 58.5M, 1.2G."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n}B" if n else "0"
    v = float(n)
    for unit in "KMGTP":
        v /= 1024
        if v < 1024 or unit == "P":
            return f"{v:.1f}{unit}"
    raise AssertionError("unreachable")


def _ratio(b: BcacheBacking, interval: str) -> str:
    s = b.stats.get(interval)
    r = s.computed_hit_ratio if s else None
    return "-" if r is None else f"{100 * r:.0f}%"


def dirty_text(b: BcacheBacking) -> str:
    if b.dirty is None:
        return "?"
    if b.cset_uuid is None and b.state.value == "dirty":
        return "lost?"  # the dirty data is on a cache set that is not registered
    return _short(b.dirty.bytes)


def status_table(snap: Snapshot) -> str:
    """One line per backing device, then one per cache set. Fits 80 columns for bcache0-9."""
    lines = []
    if not snap.bcache_loaded:
        lines.append("bcache: module not loaded (modprobe bcache)")
    lines.append(f"{'DEVICE':<13}{'BACKING':<13}{'MODE':<13}{'STATE':<9}{'DIRTY':>7}"
                 f"{'HIT5m':>6}{'HIT':>5}{'WBRATE':>8}{'ERR':>4} CSET")
    for b in snap.backings:
        rate = "-" if b.writeback_rate is None or b.mode is None else \
            _short(b.writeback_rate.bytes) + "/s"
        lines.append(
            f"{b.device or '(stopped)':<13.13}{b.identity.node:<13.13}"
            f"{(b.mode.value if b.mode else '?'):<13}{b.state.value:<9}{dirty_text(b):>7}"
            f"{_ratio(b, 'five_minute'):>6}{_ratio(b, 'total'):>5}{rate:>8}"
            f"{b.io_errors if b.io_errors is not None else '?':>4} "
            f"{(b.cset_uuid or '-')[:8]}"
        )
    if not snap.backings:
        lines.append("(no bcache backing devices)")
    for c in snap.cache_sets:
        ssd = ",".join(x.identity.node for x in c.caches) or "?"
        used = "?" if c.cache_available_percent is None else f"{100 - c.cache_available_percent}%"
        errs = sum(x.io_errors or 0 for x in c.caches)
        lines.append(f"cset {c.uuid}: cache {ssd}, {len(c.backing_names)} backing, "
                     f"used {used}, io errors {errs}")
    for w in snap.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


__all__ = ["dirty_text", "human", "status_table"]
