"""``cachemgr doctor``: why a cache does not help. Two scans of the host a window apart (the
snapshot and the block layer's counters), the diagnosis (procedures/doctor.py, pure) of
what changed between them, each cause with its evidence and the command that fixes it.
Exit 0 when nothing is found, 1 when a cause is named. Changes nothing."""

from __future__ import annotations

from typing import Any

from cachemgr.backends import blockdev
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.backends.blockdev import BlockStat
from cachemgr.core import cancel
from cachemgr.core.errors import KernelFormatError, UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.control import Result
from cachemgr.procedures import doctor, kinds

__all__ = ["DEFAULT_WINDOW", "block_stats", "diagnose_window", "doctor_cmd"]

# bcache folds its counters into stats_total every ~13.6 s (stats.c accounting_delay,
# docs/kernel-notes.md "bcache statistics"): a shorter window may see none of them move
DEFAULT_WINDOW = 15.0


def block_stats(sysfs: Sysfs) -> dict[str, BlockStat]:
    """Every disk's and partition's ``stat`` by kernel name (one that cannot be read is
    left out: its figures are unknown)."""
    out: dict[str, BlockStat] = {}
    for name, rel in blockdev.block_dirs(sysfs).items():
        text = sysfs.read_opt(f"{rel}/stat")
        if text is None:
            continue
        try:
            out[name] = BlockStat.parse(text)
        except KernelFormatError:
            continue
    return out


def diagnose_window(sysfs: Sysfs, seconds: float) -> doctor.Window:
    """The host read, ``seconds`` waited (a cancel cuts it short), read again."""
    before = snapshot_mod.take(sysfs, probe_unregistered=False)
    blk0 = block_stats(sysfs)
    cancel.sleep(seconds, "doctor")
    blk1 = block_stats(sysfs)
    after = snapshot_mod.take(sysfs, probe_unregistered=False)
    return doctor.Window(before, after, seconds, blk0, blk1)


def doctor_cmd(sysfs: Sysfs, target: str | None = None, *,
               window: float = DEFAULT_WINDOW) -> Result:
    """Every cause found over a ``window`` of seconds, for ``target`` (any name of a cached
    device) or every cached device."""
    if not window > 0:
        raise UsageError(f"--window must be more than 0 seconds, not {window:g}")
    node = None
    if target is not None:  # resolved before the wait: a wrong name is said at once
        node = kinds.resolve(snapshot_mod.take(sysfs, probe_unregistered=False), target,
                             sysfs).node
    w = diagnose_window(sysfs, window)
    causes = [c for c in doctor.diagnose(w) if node is None or c.device == node]
    looked = [k.node for k in kinds.listed(w.after) if node is None or k.node == node]
    lines: list[str] = []
    for c in causes:
        lines.append(f"{c.device}: {c.code}: {c.what}")
        if c.evidence:
            lines.append("  evidence: " + ", ".join(f"{k} {_v(v)}" for k, v in c.evidence))
        lines.append(f"  next: {c.next}")
    if not causes:
        lines.append(f"{len(looked)} cached device{'s' if len(looked) != 1 else ''}: nothing "
                     f"found that keeps the cache from helping in {window:g} s")
    data: dict[str, Any] = {"schema": 1, "window_seconds": window, "devices": looked,
                            "causes": [c.to_json() for c in causes]}
    return Result(lines=lines, failed=bool(causes), data=data, value=causes)


def _v(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
