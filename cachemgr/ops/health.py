"""``cachemgr ssd-health``: the SMART health of every cache SSD (backends/smart.py: smartctl
--json, cached per disk). Run by cachemgr-smart.timer with ``--refresh`` every 10 minutes,
so the metrics (whose sandbox cannot open a disk, and whose scrape never runs smartctl) have
an answer at most that old (systemd/README.md)."""

from __future__ import annotations

from cachemgr.backends import smart
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.core.errors import require_root
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Result


def report(sysfs: Sysfs, *, refresh: bool = False) -> Result:
    """Each cache SSD with its health: smartctl for an answer older than 10 minutes, or for
    every SSD with ``refresh``. A drive to replace soon, or one smartctl could not read, is
    also a note (stderr: what the timer's unit logs)."""
    if refresh and sysfs.live:
        require_root("reading SMART data (smartctl)")  # else every answer: permission denied
    snap = snapshot_mod.take(sysfs, probe_unregistered=False)
    rows = cache_ops.ssd_health(sysfs, snap, max_age=0.0 if refresh else smart.MAX_AGE)
    lines, notes = [], []
    for ssd, h in rows:
        words = h.words() if h is not None else "not read"
        lines.append(f"{ssd.node} (caches {', '.join(ssd.caches)}): {words}")
        if h is not None and (h.error or h.replace_soon):
            notes.append(f"cachemgr: warning: {ssd.node}: {words}")
    if not rows:
        lines.append("(no cache SSD: no SCSI disk or NVMe namespace holds a cache)")
    return Result(lines=lines, notes=notes,
                  data={"schema": 1, "ssd_health": cache_ops.ssd_health_json(rows)},
                  value=rows)
