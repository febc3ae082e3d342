"""``cachemgr invalidate TARGET``: drop every copy a host-local cache holds of one cached
device, so that what it serves next is what the disk holds (a VM's shared disk was written on
another host: docs/admin-guide.md, "Live migration over shared storage"). The libvirt hook
runs the same function for every cache under an arriving VM's shared disks (ops/migrate.py).

Order, for a power cut at any point (procedures/coherence.py):

1. the refusals, changing nothing: what the kind cannot do (exit 2: a writecache), a
   writeback or dirty cache (exit 3: its blocks may be the only copy; drain it first), the
   locks and the journals of other procedures (exit 3);
2. the question (on a terminal; ``--yes`` without one): the cache's warmth for this device
   is lost;
3. under the gate: the "invalidation pending" record, written before anything changes; from
   now on until it is removed the device is owned by an interrupted invalidation for every
   other command (exit 3 naming ``cachemgr invalidate DEV``), status and check say so, and the
   hook finishes it before a VM on the device runs;
4. the kind's own way (kinds/*.py ``invalidate``), which ends in the device's mode;
5. the record removed, with any "a VM left" mark of the device.

A cut before 4 ends leaves the record, so the copies are dropped again by whatever comes
next on the device; a cut after 4 and before 5 costs one more (harmless) invalidation.
"""

from __future__ import annotations

import time

from cachemgr.core.errors import AlreadyError, UnsafeError, require_root
from cachemgr.core.model import CacheMode, Snapshot, human
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate as gate_mod
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import coherence, kinds
from cachemgr.procedures.coherence import left_json as left_json

# an interrupted invalidation is finished by the next one
RESUMES = gate_mod.resumes("invalidation")


def key_of(dev: kinds.Kind) -> str:
    """The key of its records: its own lock key (procedures/owners.py)."""
    return dev.locks[0][0]


def dirty_refusal(dev: kinds.Kind, why: str, command: str) -> UnsafeError | None:
    """Refused (exit 3) as long as ``dev`` is in writeback or holds dirty data (or dirty data
    of an amount the kernel does not report): ``why`` says what that forbids, ``command``
    (invalidate, scrub) is what to run once it is write-through and clean."""
    dirty = dev.dirty_bytes
    if dev.mode not in (None, CacheMode.WRITEBACK) and dirty == 0:
        return None
    mode = dev.mode.value if dev.mode else "an unknown mode"
    what = ("dirty data of an unknown amount" if dirty is None
            else f"{human(dirty)} of dirty data" if dirty else "no dirty data now")
    return UnsafeError(f"{dev.node} is in {mode} with {what}: {why}",
                       hint=f"cachemgr mode {dev.target} writethrough --drain && cachemgr "
                            f"{command} {dev.target}")


def refusal(dev: kinds.Kind) -> UnsafeError | None:
    """Why its copies are not dropped as it stands (exit 3): a writeback cache, or dirty
    data (or dirty data the kernel does not report): the cache may hold the only copy of a
    block, and an arrival on it is refused anyway (ops/migrate.py)."""
    return dirty_refusal(dev, "its cached copies are not dropped while the cache may hold "
                              "blocks the disk does not; nothing was changed", "invalidate")


def invalidate(sysfs: Sysfs, target: str, *, ctl: Control | None = None,
               snap: Snapshot | None = None) -> Result:
    """Drop every copy the cache of ``target`` holds of it (see the module docstring).
    ``snap``: a snapshot already taken (the hook's)."""
    from cachemgr.ops import cache as cache_ops

    ctl = ctl if ctl is not None else Control(what=f"invalidation of {target}")
    if snap is None:
        snap = cache_ops.status(sysfs, probe_unregistered=False)
    dev = kinds.resolve(snap, target, sysfs)
    subject = gate_mod.of_kind(dev)
    err = dev.refusal("invalidate")
    if err is not None:
        raise err
    key = key_of(dev)
    was = [m for m in coherence.marked({key}) if m.path.parent.name == coherence.PENDING]
    recorded = was[0].data.get("mode") if was else None
    final = CacheMode(recorded) if recorded in {m.value for m in CacheMode} else None
    cache = was[0].data.get("cache") if was else None
    cache = cache if isinstance(cache, str) and cache else None
    if not dev.can("invalidate") and cache is None:
        coherence.done(key)  # nothing cached (a bcache device with no set): no copies
        raise AlreadyError(f"{dev.node} has no cache attached: it holds no cached copies")
    err = refusal(dev) if final is None else None
    if err is not None:
        raise err
    if not dev.root_in_backend:
        require_root("dropping a cache's copies")
    if ctl.asks:
        first = cache_ops._checked(subject, "invalidate", takes_over=RESUMES)
        if cache_ops._ask(ctl, sysfs, snap, f"invalidate {target}", [
                *first, f"would drop every block the cache holds of {dev.node}: its next reads "
                f"come from the disk, as on a cold cache. {dev.invalidate_how}"],
                [dev.vm_node]):
            snap, dev = cache_ops._again(sysfs, target)
            err = refusal(dev) if final is None else None
            if err is not None:
                raise err
    t0 = time.monotonic()
    with gate_mod.gate(subject, "invalidate", takes_over=RESUMES):
        coherence.pending(key, dev.node, mode=(final or dev.mode or CacheMode.WRITETHROUGH)
                          .value, kind=dev.name, cache=cache or dev.cache_name)
        try:
            changes = dev.invalidate(sysfs, final_mode=final, cache=cache)
        except AlreadyError:
            coherence.done(key)
            raise
        coherence.done(key)
    secs = time.monotonic() - t0
    return Result(changes=changes,
                  lines=[f"{dev.node}: every cached copy dropped in {secs:.2f} s; its next "
                         "reads come from the disk"],
                  data={"schema": 1, "device": dev.node, "kind": dev.name,
                        "seconds": round(secs, 3), "resumed": bool(was),
                        "changes": [{"target": c.target, "what": c.what, "before": c.before,
                                     "after": c.after} for c in changes]})



def mark_lines() -> list[str]:
    """The caches marked as holding copies of a disk a VM took elsewhere, in words with the
    command that clears each (status and ``vms`` print them)."""
    return [line for _, _, line in left_marks()] + warm_lines()


def warm_lines() -> list[str]:
    """The warms arrivals started (the policy's ``[migration] warm_after``), running or
    ended, in words (status and ``vms`` print them after the marks)."""
    return [w.words() for w in coherence.warms()]


def warm_json() -> list[dict[str, object]]:
    """The same for ``status --json`` and ``vms --json`` (docs/json.md, ``warms``)."""
    return coherence.warm_json()


def left_marks() -> list[tuple[str, str | None, str]]:
    """Each "a VM left" mark as (the cached device's node, the VM, the words of
    :func:`mark_lines`): the TUI shows them on the device's row and in its detail."""
    return [(m.device, m.domain,
             f"{m.words()}; next: cachemgr invalidate {m.device} (or the VM's next arrival)")
            for m in coherence.marks(coherence.LEFT)]


def finish_pending(sysfs: Sysfs, *, dry_run: bool = False) -> Result:
    """Finish every invalidation left pending (the boot pass runs this): each device's copies
    dropped again, its mode and cache put back; ``failed`` when one could not be."""
    from cachemgr.core.errors import CacheMgrError

    lines: list[str] = []
    done: list[dict[str, object]] = []
    failed = False
    for m in coherence.marks(coherence.PENDING):
        if dry_run:
            lines.append(f"would finish the invalidation of {m.device} (pending since "
                         f"{m.since})")
            continue
        try:
            r = invalidate(sysfs, m.device)
            lines.extend(r.lines)
            done.append({"device": m.device, "result": "done"})
        except AlreadyError as exc:
            lines.append(exc.message)
            done.append({"device": m.device, "result": "already"})
        except CacheMgrError as exc:
            failed = True
            lines.append(f"failed   the invalidation of {m.device}: {exc.message}")
            done.append({"device": m.device, "result": "failed", "error": exc.message})
    return Result(lines=lines, failed=failed, data={"pending": done})
