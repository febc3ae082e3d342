"""``cachemgr doctor``: why a cache does not help. Two scans of the host a window apart (the
snapshot and the block layer's counters), the diagnosis (procedures/doctor.py, pure) of
what changed between them, each cause with its evidence and the command that fixes it.
Exit 0 when nothing is found, 1 when a cause is named. Changes nothing."""

from __future__ import annotations

from collections import deque
from typing import Any

from cachemgr.backends import blockdev
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.backends.blockdev import BlockStat
from cachemgr.core import cancel
from cachemgr.core.errors import UsageError
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.control import Result
from cachemgr.procedures import doctor, kinds, sizing, warm
from cachemgr.procedures import trace as tr

__all__ = ["DEFAULT_WINDOW", "Watch", "block_stats", "causes", "diagnose_window",
           "doctor_cmd"]

# bcache folds its counters into stats_total every ~13.6 s (stats.c accounting_delay,
# docs/kernel-notes.md "bcache statistics"): a shorter window may see none of them move
DEFAULT_WINDOW = 15.0


def block_stats(sysfs: Sysfs) -> dict[str, BlockStat]:
    """Every disk's and partition's ``stat`` by kernel name (one that cannot be read is
    left out: its figures are unknown)."""
    out: dict[str, BlockStat] = {}
    for name, rel in blockdev.block_dirs(sysfs).items():
        s = blockdev.read_stat(sysfs, rel)
        if s is not None:
            out[name] = s
    return out


def diagnose_window(sysfs: Sysfs, seconds: float) -> doctor.Window:
    """The host read, ``seconds`` waited (a cancel cuts it short), read again."""
    before = snapshot_mod.take(sysfs, probe_unregistered=False)
    blk0 = block_stats(sysfs)
    cancel.sleep(seconds, "doctor")
    blk1 = block_stats(sysfs)
    after = snapshot_mod.take(sysfs, probe_unregistered=False)
    return doctor.Window(before, after, seconds, blk0, blk1)


def causes(sysfs: Sysfs, seconds: float = DEFAULT_WINDOW) -> list[doctor.Cause]:
    """Every cause on the host over a window of ``seconds`` (what ``doctor`` without a
    target names): ``check --verbose``'s."""
    return doctor.diagnose(diagnose_window(sysfs, seconds))


class Watch:
    """doctor's diagnosis over a face's own polls (the TUI's): each poll's snapshot, read
    with every stats interval, is kept with the block layer's counters and the time; the
    causes are those of the window from the newest kept poll at least ``window`` seconds
    old to the latest one (none before the first such window: bcache folds its counters
    every ~13.6 s). A poll's snapshot is read as the face reads it; nothing is re-read
    here but the block layer's ``stat`` files."""

    def __init__(self, window: float = DEFAULT_WINDOW) -> None:
        self.window = window
        self._kept: deque[tuple[float, Snapshot, dict[str, BlockStat]]] = deque()
        self.causes: list[doctor.Cause] = []
        self.seconds: float | None = None  # the last window's length (None: none yet)

    def update(self, sysfs: Sysfs, snap: Snapshot, t: float) -> list[doctor.Cause]:
        """The causes once ``snap`` (read at ``t``, with its stats) is the window's end."""
        self._kept.append((t, snap, block_stats(sysfs)))
        # keep only the newest poll old enough to start a window, and those after it
        while len(self._kept) > 1 and t - self._kept[1][0] >= self.window:
            self._kept.popleft()
        t0, before, blk0 = self._kept[0]
        if t - t0 >= self.window:
            _, after, blk1 = self._kept[-1]
            self.seconds = t - t0
            self.causes = doctor.diagnose(doctor.Window(before, after, t - t0, blk0, blk1))
        return self.causes


def curve(sysfs: Sysfs, kind: kinds.Kind, path: str) -> tuple[int, list[sizing.Point]]:
    """The cache's capacity and the miss-ratio curve of trace ``path``'s record of the
    device (in the cache's block size), that capacity among its sizes. Exit 2 for a trace
    of another device, or a cache whose size is not known."""
    t = tr.read(path)
    dev = warm.traced_device(t, kind.warm_trace_names(), warm.device_size(sysfs, kind.node))
    cap = kind.warm_capacity(sysfs)
    if not cap:
        raise UsageError(f"{kind.node}: the size of its cache is not known",
                         hint="cachemgr status shows the cache; is it running?")
    block = max(t.header.block, kind.warm_cache_block())
    h = sizing.histogram(t, block=block, devices=[dev.index])
    return cap, sizing.curve(h, extra=[cap])


def doctor_cmd(sysfs: Sysfs, target: str | None = None, *,
               window: float = DEFAULT_WINDOW, trace: str | None = None) -> Result:
    """Every cause found over a ``window`` of seconds, for ``target`` (any name of a cached
    device) or every cached device; with ``trace`` (a trace of ``target``), whether its
    working set is larger than its cache."""
    if not window > 0:
        raise UsageError(f"--window must be more than 0 seconds, not {window:g}")
    if trace is not None and target is None:
        raise UsageError("--trace needs the TARGET it is a trace of")
    node = None
    ws: tuple[int, list[sizing.Point]] | None = None
    cache = None
    if target is not None:  # resolved before the wait: a wrong name is said at once
        kind = kinds.resolve(snapshot_mod.take(sysfs, probe_unregistered=False), target,
                             sysfs)
        node, cache = kind.node, kind.cache_name
        if trace is not None:
            ws = curve(sysfs, kind, trace)
    w = diagnose_window(sysfs, window)
    extra = []
    if ws is not None and node is not None and trace is not None:
        found = doctor.working_set(node, ws[0], ws[1], trace, cache=cache,
                                   observed=doctor.observed_read_hit_ratio(w, node))
        extra = [found] if found is not None else []
    causes = [c for c in doctor.diagnose(w, extra) if node is None or c.device == node]
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
    notes = [f"cachemgr: {dev}: bcache's counters did not move in {window:g} s although it "
             "was read (they are published every 13.6 s): its bypasses are unknown; use "
             "--window 15 or more" for dev in doctor.unfolded(w) if node is None or dev == node]
    data: dict[str, Any] = {"schema": 1, "window_seconds": window, "devices": looked,
                            "causes": [c.to_json() for c in causes]}
    return Result(lines=lines, notes=notes, failed=bool(causes), data=data, value=causes)


def _v(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
