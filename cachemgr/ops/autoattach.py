"""The autoattach commands: the boot pass (``cachemgr autoattach``) and the udev worker's
pass over a batch of queued events. cachemgr/procedures/autoattach.py decides (event + snapshot +
policy -> actions); the actions are carried out here, with the same locks as the cache
commands (a drain, a replace-ssd run and autoattach never act on one device at once)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cachemgr.backends import bcache
from cachemgr.backends import scheduler as sched
from cachemgr.backends.dmcache import record as dm_record
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError, KernelFormatError, require_root
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import gate
from cachemgr.ops.control import Result
from cachemgr.procedures import autoattach, owners, policy
from cachemgr.procedures.autoattach import (
    Action,
    AssembleDmCache,
    Attach,
    Format,
    LvmAttach,
    LvmSetMode,
    Register,
    SetMode,
    SetScheduler,
    SetTunable,
    View,
)

log = logging.getLogger("cachemgr.procedures.autoattach")


def act(sysfs: Sysfs, view: View, a: Action) -> None:
    """Carry out one decided action (AlreadyError: already so; UnsafeError: skipped)."""
    if isinstance(a, LvmAttach):  # through the attach and mode commands, with their locks
        cache_ops.attach(sysfs, a.device, a.cache, writecache=a.writecache, mode=a.mode)
        return
    if isinstance(a, LvmSetMode):
        cache_ops.mode(sysfs, a.device, a.mode)
        return
    if isinstance(a, AssembleDmCache):
        _assemble(sysfs, view, a)
        return
    if isinstance(a, Register):
        with gate.gate(gate.of_disks([f"/dev/{a.device}"]), "autoattach register"):
            bcache.register(sysfs, f"/dev/{a.device}")
        return
    if isinstance(a, SetScheduler):  # what `cachemgr scheduler DISK NAME` does, read back
        with gate.gate(gate.of_disks([f"/dev/{a.device}"]), "autoattach scheduler",
                       detail={"to": a.scheduler}):
            sched.set_scheduler(sysfs, a.device, a.scheduler)
        return
    if isinstance(a, Format):
        with gate.gate(gate.of_disks([f"/dev/{a.device}"]), "autoattach format"):
            _format(sysfs, a)
        return
    # the view was read just before this round; each action of a round touches another
    # file of the backing device, so its object from the view is current enough
    bk = view.backing(a.device)
    if bk is None:
        raise CacheMgrError(f"/dev/{a.device} is no longer a registered backing device")
    subject = gate.of_backing(bk)
    cset = view.snapshot.cache_set(a.cset) if isinstance(a, Attach) else None
    if isinstance(a, Attach):
        if cset is None:
            raise CacheMgrError(f"cache set {a.cset} vanished")
        subject = subject + gate.of_cache_set(cset)
    with gate.gate(subject, f"autoattach {type(a).__name__.lower()}"):
        if isinstance(a, Attach):
            assert cset is not None
            bcache.attach(sysfs, bk, cset)
        elif isinstance(a, SetMode):
            bcache.set_mode(sysfs, bk, CacheMode(a.mode))
        elif isinstance(a, SetTunable):
            bcache.set_tunable(sysfs, bk, a.name, a.value)


def _assemble(sysfs: Sysfs, view: View, a: AssembleDmCache) -> None:
    """A recorded dm-cache device, through the gate (its name's locks and its three disks'):
    the record's identities are matched again on a fresh read inside it."""
    rec = next((r for r, _ in view.dm_records if r.name == a.device), None)
    if rec is None:
        raise CacheMgrError(f"the record of {a.stable_id} vanished")
    subject = gate.of_names(rec.node, [owners.dmcache_key(rec.name), owners.cache_key(rec.name)])
    with gate.gate(subject + gate.of_disks([a.origin, a.cache, a.metadata]),
                   "autoattach assemble dm-cache"):
        log.info("%s", dm_record.assemble(sysfs, rec))


def _load_policy(path: str) -> policy.Policy:
    """The policy; with no policy file and a dm-cache record, an empty one (the records are
    assembled whatever the policy says). PolicyError otherwise."""
    try:
        return policy.load(path)
    except policy.PolicyError as exc:
        if exc.problems and exc.problems[0].line == 0 and exc.problems[0].message == \
                "no such file" and dm_record.load_all() != ([], []):
            return policy.Policy(path=path)
        raise


def _format(sysfs: Sysfs, a: Format) -> None:
    node = f"/dev/{a.device}"
    size = bcache.device_bytes(sysfs, node)
    # refuses (nothing formatted) a bucket the kernel would not take; picks one if unset
    bucket = bcache.check_bucket(node, size, a.bucket) if size is not None else a.bucket
    bcache.make_bcache(cache=node, bucket=bucket)
    with contextlib.suppress(AlreadyError):  # 69-bcache.rules may be first
        bcache.register(sysfs, f"/dev/{a.device}")


@contextlib.contextmanager
def _run_lock() -> Any:
    """One pass at a time on a host (the boot pass and the udev worker, cachemgr/cli/udev.py,
    share this lock); waits for the pass that is acting."""
    fd = state.open_lock(state.state_dir() / "locks" / "autoattach-run.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def boot_pass(sysfs: Sysfs, policy_path: str, *, dry_run: bool = False) -> Result:
    """Attach every device the policy names (boot-time assembly). A bad policy is a usage
    error and nothing is done; root is required unless ``dry_run``."""
    pol = _load_policy(policy_path)  # PolicyError: exit 2, acts on nothing
    if not dry_run:
        require_root("autoattach")
    with _run_lock():
        res = autoattach.reconcile(sysfs, pol, [None], act=act, dry_run=dry_run)
    lines = [f"{o.result:8} {o.action.describe()}" + (f": {o.error}" if o.error else "")
             for o in res.outcomes]
    if not res.outcomes:
        lines = ["nothing to do: everything the policy names is as it says (or absent), "
                 "every recorded dm-cache device assembled"]
    data: dict[str, Any] = {
        "schema": 1, "rounds": res.rounds, "actions": [
            {**o.action.record(), "result": o.result, "error": o.error}
            for o in res.outcomes]}
    notes: list[str] = []
    failed = bool(res.failed)
    # an invalidation a power cut interrupted: finished before any VM runs on the device
    # (ops/coherence.py; the hook would finish it too, at the VM's start or arrival)
    from cachemgr.ops import coherence as coherence_ops

    fin = coherence_ops.finish_pending(sysfs, dry_run=dry_run)
    lines += fin.lines
    failed = failed or fin.failed
    data["invalidations"] = fin.data
    if pol.protect.enabled:  # then the protect pass's switches (its drains: the timer's)
        from cachemgr.ops import protect as protect_ops

        pr = protect_ops.run(sysfs, policy_path, dry_run=dry_run, pol=pol, drains=False)
        lines += pr.lines
        notes += pr.notes
        failed = failed or pr.failed
        data["protect"] = pr.data
    return Result(lines=lines, notes=notes, failed=failed, value=res, data=data)


def event_pass(sysfs: Sysfs, policy_path: str, batch: Sequence[dict[str, Any]],
               stages: Mapping[str, float] | None = None) -> None:
    """The udev worker's pass over one batch of queued events (the caller holds the run
    lock). Every decision is logged and journaled; a bad policy is logged, never raised.

    The pass's journal record carries the time of each stage (``stages``: time.time()
    values, udev/README.md): the worker's own (``stages`` given: its start, its modules
    imported, the run lock taken or its previous pass ended, the queue drained after the
    settle wait), then the policy read, each
    round's view, decisions and actions, the end; and per event when the handler started
    and queued it."""
    events = []
    for e in batch:
        try:
            events.append(autoattach.Event.from_json(e))
        except KernelFormatError as exc:
            log.warning("dropping a queued event: %s", exc)
    t0 = time.time()
    last = max((e.received for e in events), default=t0)
    log.debug("batch of %d events: %s", len(events), ", ".join(e.describe() for e in events))
    times: dict[str, Any] = {k: round(v, 3) for k, v in (stages or {}).items()}
    try:
        pol = _load_policy(policy_path)
    except policy.PolicyError as exc:
        if exc.problems and exc.problems[0].line == 0 and exc.problems[0].message == \
                "no such file":
            log.debug("no policy at %s: nothing to do", policy_path)
            return
        log.error("not acting on %d event(s): %s", len(events), exc.message)
        autoattach.record({"kind": "policy-error", "error": exc.message,
                           "events": len(events)})
        return
    times["policy"] = round(time.time(), 3)
    res = autoattach.reconcile(sysfs, pol, events, act=act)
    done = time.time()
    autoattach.record({"kind": "pass", "events": len(events), "rounds": res.rounds,
                       "changed": len(res.changed), "failed": len(res.failed),
                       "seqnums": [e.seqnum for e in events][:50],
                       "last_event": round(last, 3), "latency_s": round(done - last, 3),
                       "pass_s": round(done - t0, 3),
                       "stages": {**times, "rounds": res.timeline, "done": round(done, 3)},
                       "event_stages": [e.stages() for e in events][:50]})
