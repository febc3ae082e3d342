"""``cachemgr restore [TARGET]``: put back what an interrupted procedure left changed.

A procedure that changes a device's settings for a while (bench: a cache's mode, its
congestion thresholds, a disk's IO scheduler) journals each old value first
(core/undo.py). One killed outright leaves its journal; the gate puts it back at the next
command on the device, and this command does only that, through the gate: for every such
journal (with TARGET: those claiming it), the locks of its devices are taken (refused, exit
3, while its procedure still runs), its settings written back, the journal removed. Exit 4
when there is nothing to put back."""

from __future__ import annotations

from cachemgr.core import undo
from cachemgr.core.errors import UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Result
from cachemgr.procedures import kinds


def restore(sysfs: Sysfs, target: str | None = None) -> Result:
    journals = undo.journals()
    if target is not None:
        from cachemgr.ops import cache as cache_ops

        k = kinds.find(cache_ops.status(sysfs), target, sysfs, kinds.REGISTRY)
        keys = {key for key, _ in k.locks} if k is not None else set()
        journals = [j for j in journals if j.keys & keys or target in j.device.split(", ")]
        if k is None and not journals:
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
    if not journals:
        return Result(lines=["nothing to put back: no interrupted procedure left a setting "
                             "changed" + (f" on {target}" if target else "")],
                      already=True, data={"schema": 1, "restored": []})
    return Result(lines=lines, data={"schema": 1, "restored": done})
