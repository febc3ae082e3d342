"""``cachemgr restore [TARGET]``: put back what an interrupted procedure left changed.

A procedure that changes a device's settings for a while (bench: a cache's mode, its
congestion thresholds, a disk's IO scheduler) journals each old value first
(core/undo.py). One killed outright leaves its journal; the gate puts it back at the next
command on the device, and this command does only that, through the gate: for every such
journal (with TARGET: those claiming it), the locks of its devices are taken (refused, exit
3, while its procedure still runs), its settings written back, the journal removed. Exit 4
when there is nothing to put back.

An interrupted drain (a bcache drain's tunables, a dm-cache flush's cleaner table, an LVM
drain's policy) is put back the same way: what ``drain DEV --resume`` does before it drains
again, alone, through the same gate (refused while the drain still runs); ``status`` and
``check`` name ``drain DEV --resume``, which also finishes the drain, and stop naming it
once its journal is gone. The dirty data is then written back at the kernel's own pace.
An interrupted ``cachemgr snapshot`` is finished the same way: the filesystem it may have
left frozen is thawed and its journal removed (procedures/snapshot.py ``recover``)."""

from __future__ import annotations

from typing import Any

from cachemgr.core import undo
from cachemgr.core.errors import UsageError
from cachemgr.core.model import Owner, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Result
from cachemgr.procedures import kinds, owners

# the procedures whose journal ``drain DEV --resume`` puts back (procedures/owners.py)
DRAINS = ("drain", "dm-cache flush", "lvm drain")


def restore(sysfs: Sysfs, target: str | None = None) -> Result:
    from cachemgr.ops import cache as cache_ops

    journals = undo.journals()
    drains = [o for o in owners.interrupted() if o.procedure in DRAINS]
    snapshots = [o for o in owners.interrupted() if o.procedure == "snapshot"]
    snap = cache_ops.status(sysfs) if drains or target is not None else None
    if target is not None:
        assert snap is not None
        k = kinds.find(snap, target, sysfs, kinds.REGISTRY)
        keys = {key for key, _ in k.locks} if k is not None else set()
        journals = [j for j in journals if j.keys & keys or target in j.device.split(", ")]
        drains = [o for o in drains if o.keys & keys or target == o.device]
        snapshots = [o for o in snapshots if o.keys & keys or target == o.device]
        if k is None and not journals and not drains and not snapshots:
            raise UsageError(f"{target}: no cached device or cache set of that name, and no "
                             "interrupted procedure's journal names it")
    done: list[dict[str, object]] = []
    lines: list[str] = []
    for j in journals:
        said: list[str] = []
        with gate.gate(gate.of_names(j.device, sorted(j.keys)), "restore", said=said):
            pass
        lines += [f"{j.device}: {w}" for w in said]
        done.append({**undo.to_json(j), "put_back": said})
    for o in snapshots:
        said = _snapshot(sysfs, o)
        lines += said
        done.append({"procedure": o.procedure, "device": o.device, "keys": sorted(o.keys),
                     "started": o.since, "journal": o.journal, "put_back": said})
    missing = False
    for o in drains:
        assert snap is not None
        entry, said, ok = _drain(sysfs, snap, o)
        lines += said
        missing = missing or not ok
        done.append(entry)
    if not journals and not drains and not snapshots:
        return Result(lines=["nothing to put back: no interrupted procedure left a setting "
                             "changed" + (f" on {target}" if target else "")],
                      already=True, data={"schema": 1, "restored": []})
    return Result(lines=lines, data={"schema": 1, "restored": done}, failed=missing)


def _drain(sysfs: Sysfs, snap: Snapshot, o: Owner) -> tuple[dict[str, Any], list[str], bool]:
    """Put back what the interrupted drain ``o`` left, as ``drain DEV --resume`` does first
    (the kind's own restore, under the gate, which takes over only that drain): its JSON
    entry, the words, and whether it was put back (False: its device is not here; the
    journal stays)."""
    entry: dict[str, Any] = {"procedure": o.procedure, "device": o.device,
                             "keys": sorted(o.keys), "started": o.since,
                             "journal": o.journal, "put_back": []}
    k = next((x for x in (kinds.find(snap, n, sysfs, kinds.devices_only())
                          for n in (o.device, *sorted(o.keys))) if x is not None), None)
    if k is None and o.procedure == "lvm drain":
        # an LV whose cache lvm2 had split off before the drain was killed: what
        # drain --resume does for it (one implementation of that resume)
        from cachemgr.ops import cache as cache_ops

        notes = cache_ops.drain(sysfs, o.device, resume=True).notes
        entry["put_back"] = list(notes)
        return entry, list(notes), True
    if k is None:
        return entry, [f"{o.device}: an interrupted {o.procedure} left settings changed, but "
                       f"the device is not here; its journal {o.journal} stays: "
                       f"{o.resume} once it is back"], False
    with gate.gate(gate.of_kind(k), "restore", takes_over=gate.resumes(o.procedure)):
        restored = k.restore_interrupted(sysfs)
    entry["put_back"] = [f"{name}={value}" for name, value in restored.items()]
    if not restored:
        return entry, [f"{k.node}: the interrupted {o.procedure} had nothing left to put "
                       "back"], True
    return entry, [f"{k.restored_note(restored)}, left by an interrupted {o.procedure}; its "
                   "dirty data is written back at the kernel's own pace now (cachemgr drain "
                   f"{k.node} makes that fast)"], True


def _snapshot(sysfs: Sysfs, o: Owner) -> list[str]:
    """Finish an interrupted ``cachemgr snapshot`` (procedures/snapshot.py ``recover``: its
    filesystem thawed, whether its snapshot was taken), under the gate, which takes over only
    that run: the words."""
    from pathlib import Path

    from cachemgr.backends import fsfreeze
    from cachemgr.backends.lvm import snap as lvsnap
    from cachemgr.core import state
    from cachemgr.procedures import snapshot as snap_mod

    with gate.gate(gate.of_names(o.device, sorted(o.keys)), "restore",
                   takes_over=gate.resumes("snapshot", "drain")):  # the drain's is next
        d = state.read_json(Path(o.journal or ""))
        j = snap_mod.load(d, o.journal or "") if d is not None else None
        if j is None:
            return [f"{o.device}: the interrupted snapshot's journal is gone or unreadable"]
        said = snap_mod.recover(j, thaw=fsfreeze.thaw, exists=lvsnap.exists,
                                set_mode=snap_mod.mode_setter(sysfs))
        return [f"{o.device}: {w}" for w in said]
