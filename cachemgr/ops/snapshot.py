"""``cachemgr snapshot TARGET --lv VG/LV --mount DIR [--name NAME] [--size SIZE]
[--max-latency MS] [--rest SIZE] [--max-freeze S]``: a consistent LVM snapshot of a writeback
cache's origin (procedures/snapshot.py has the sequence; docs/admin-guide.md, "Consistent
snapshots and backups").

Order:

1. the refusals, changing nothing: a kind the sequence is not built for (exit 2), ``--lv``
   that is not TARGET's origin (exit 2), ``--mount`` with no filesystem of TARGET mounted
   there (exit 2), a mountpoint that holds cachemgr's own state directory (exit 3: the
   journal could not be written while it is frozen), a snapshot name already in use (exit 2),
   not root;
2. under the gate (TARGET's and its cache's locks, for the whole run; an interrupted drain
   of it or snapshot of it is taken over): an interrupted snapshot of TARGET is finished first
   (its filesystem thawed: :func:`cachemgr.procedures.snapshot.recover`), then the sequence.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cachemgr.backends import fsfreeze
from cachemgr.backends.lvm import snap as lvsnap
from cachemgr.backends.lvm.command import check_vg_lv
from cachemgr.core import pace, safefs
from cachemgr.core.errors import CacheMgrError, UnsafeError, UsageError, require_root
from cachemgr.core.model import human
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate as gate_mod
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import kinds
from cachemgr.procedures import snapshot as snap_mod

DRAIN_TIMEOUT = 24 * 3600.0
STALL_TIMEOUT = 120.0


def _dev_number(sysfs: Sysfs, name: str | None) -> str | None:
    if not name:
        return None
    try:
        return sysfs.read(f"block/{name}/dev").strip()
    except CacheMgrError:  # a device that went: not known
        return None


def _checked_mount(sysfs: Sysfs, dev: kinds.Kind, mountpoint: str) -> str:
    mp = fsfreeze.check_mountpoint(mountpoint)
    m = fsfreeze.mount_at(mp)
    want = _dev_number(sysfs, dev.block_name)
    if m is None:
        raise UsageError(f"{mp}: nothing is mounted there",
                         hint=f"--mount names where {dev.node}'s filesystem is mounted "
                              "(findmnt lists them)")
    if want is None or m.dev != want:
        raise UsageError(f"{mp}: the filesystem mounted there ({m.source}, {m.fstype}) is "
                         f"not on {dev.node}",
                         hint=f"findmnt --source {dev.node} shows where it is mounted")
    here = Path(safefs.configured())  # the state directory, or what will hold it
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        st_dir, st_mp = os.stat(here), os.stat(mp)
    except OSError:
        return mp
    if st_dir.st_dev == st_mp.st_dev:
        raise UnsafeError(f"{mp} holds cachemgr's state directory: frozen, the snapshot's "
                          "journal could not be written and cachemgr would wait on itself; "
                          "nothing was changed",
                          hint="freeze only filesystems that hold VM disks, never the "
                               "host's own")
    return mp


def snapshot(sysfs: Sysfs, target: str, *, lv: str, mountpoint: str, name: str | None = None,
             size: str | None = None, max_latency_ms: float | None = None,
             rest: int = snap_mod.REST, max_freeze: float = snap_mod.MAX_FREEZE,
             ctl: Control | None = None) -> Result:
    """Drain, freeze, drain the rest, snapshot, thaw (the module docstring)."""
    from cachemgr.ops import cache as cache_ops

    if max_latency_ms is not None:
        max_latency_ms = pace.check_max_latency(max_latency_ms)
    if not 0 < max_freeze <= 600:
        raise UsageError(f"--max-freeze {max_freeze:g}: seconds above 0, at most 600")
    if rest < 0:
        raise UsageError("--rest: a size of 0 or more")
    vg, origin_lv = check_vg_lv(lv)
    snap_name = lvsnap.check_name(name or f"{origin_lv}-snap-{time.strftime('%Y%m%d-%H%M%S')}")
    ctl = ctl if ctl is not None else Control(what=f"snapshot of {target}")
    snap = cache_ops.status(sysfs, probe_unregistered=False)
    dev = kinds.resolve(snap, target, sysfs)
    if not dev.can("snapshot"):
        raise UsageError(f"{dev.node}: cachemgr snapshot is built for bcache devices so far "
                         f"(this is {dev.title}); nothing was changed",
                         hint=f"drain it, then snapshot its origin yourself: cachemgr drain "
                              f"{dev.node}")
    origin = dev.origin_node or "?"
    if not lvsnap.same_device(lv, origin):
        raise UsageError(f"{lv} is not the origin of {dev.node} (its backing device is "
                         f"{origin})",
                         hint="--lv names the LV bcache caches (lvs shows it)")
    mp = _checked_mount(sysfs, dev, mountpoint)
    require_root("freezing a filesystem and snapshotting")
    full = f"{vg}/{snap_name}"
    if lvsnap.exists(full):
        raise UsageError(f"{full} exists already: nothing was changed",
                         hint="name another with --name")
    thin = lvsnap.segtype(lv) == "thin"
    req = snap_mod.Request(dev.node, tuple(k for k, _ in dev.locks), mp, lv, full, rest,
                           max_freeze)
    with gate_mod.gate(gate_mod.of_kind(dev), "snapshot",
                       takes_over=gate_mod.resumes("drain", "snapshot"),
                       detail={"lv": lv, "snapshot": full, "mount": mp}):
        recovered: list[str] = []
        j = snap_mod.interrupted(req.key)
        if j is not None:
            recovered = snap_mod.recover(j, thaw=fsfreeze.thaw, exists=lvsnap.exists,
                                        set_mode=snap_mod.mode_setter(sysfs))
            for line in recovered:
                ctl.note(line)
        _, dev = cache_ops._again(sysfs, target)
        steps = snap_mod.LiveSteps(
            dev.snapshot_cache(sysfs, max_latency_ms=max_latency_ms, timeout=DRAIN_TIMEOUT,
                               stall_timeout=STALL_TIMEOUT),
            mountpoint=mp, origin=lv, name=full, size=size, thin=thin)
        ctl.note(f"snapshot {dev.node}: draining"
                 + (f" under p99 {max_latency_ms:g} ms of the other IO"
                    if max_latency_ms is not None else "")
                 + f" to {human(rest)} dirty, then freezing {mp}")
        taken = snap_mod.take(req, steps, report=ctl.report)
        taken.recovered = recovered
    offset = dev.origin_offset()  # the snapshot's filesystem starts there too
    return Result(lines=summary(taken, offset), data={
        "schema": 1, **taken.to_json(), "snapshot_node": lvsnap.lv_node(full),
        "data_offset": offset})


def summary(t: snap_mod.Taken, offset: int | None) -> list[str]:
    node = lvsnap.lv_node(t.snapshot)
    lines = [f"snapshot {t.snapshot} of {t.origin} ({t.device}): taken clean, {t.mountpoint} "
             f"frozen {t.freeze_s:.2f} s (lvcreate {t.snapshot_s:.2f} s)",
             f"  drained {human(t.start_dirty or 0)} dirty in {t.drain_s:.1f} s before the "
             f"freeze; {human(t.dirty_at_freeze or 0)} left at the freeze"]
    if t.drain_note:
        lines.append(f"  the drain before the freeze: {t.drain_note}")
    if offset:
        lines.append(f"  the filesystem starts at byte {offset} of {node} (bcache's "
                     f"superblock first): losetup --read-only --offset {offset} --find "
                     f"--show {node}")
    lines.append(f"  read it, never through the cache; remove it when done: lvremove {t.snapshot}")
    return lines
