"""``cachemgr warm``: read the hottest blocks of a trace through a cache (procedures/warm.py
does it; the gate, the refusals' order and the words are here)."""

from __future__ import annotations

from cachemgr.core.errors import UsageError, require_root
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import kinds
from cachemgr.procedures import warm as warm_mod


def warm(sysfs: Sysfs, target: str, trace: str, *, nbytes: int | None = None,
         ctl: Control | None = None) -> Result:
    """Warm ``target``'s cache from ``trace``: refusals first (exit 2: not a cached device, a
    cache that admits no read, a trace of another device, ``nbytes`` over the capacity),
    then root, then the gate (the device's and its cache's locks) for the run."""
    from cachemgr.backends import snapshot

    ctl = ctl or Control(what=f"warm {target}")
    if not trace:
        raise UsageError("warm needs a trace file: the IO of the device, recorded by "
                         "cachemgr trace", hint=f"cachemgr trace {target} --rate 1 -o FILE")
    snap = snapshot.take(sysfs)
    k = kinds.find(snap, target, sysfs, kinds.devices_only())
    if k is None:
        raise UsageError(f"{target} is not a cached device (a bcache device, a dm-cache "
                         "device or an LVM cache): nothing to warm",
                         hint="cachemgr status lists the cached devices on this host")
    p = warm_mod.prepare(sysfs, k, trace, nbytes)
    require_root("warm")
    with gate.gate(gate.of_kind(k), "warm", detail={"trace": trace, "bytes": p.nbytes}):
        w = warm_mod.run(sysfs, p, progress=ctl.report)
    # a warm that admitted none of what it read did not do what it is for: exit 1, said
    nothing = w.admitted is not None and w.admitted.at_most == 0
    return Result(lines=warm_mod.summary(p, w), notes=list(p.notes), failed=nothing,
                  data={"schema": 1, **w.to_json(), "trace": trace,
                        "trace_device": p.hot.device.path,
                        "trace_shift_bytes": p.hot.shift, "cache_bytes": p.capacity,
                        "bytes": p.nbytes, "hot_blocks": len(p.hot.blocks),
                        "hits_before": w.hits_before, "hits_after": w.hits_after})
