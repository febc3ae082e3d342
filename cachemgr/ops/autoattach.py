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

from cachemgr.backends import identity
from cachemgr.backends import scheduler as sched
from cachemgr.backends.dmcache import discover as dm_discover
from cachemgr.backends.dmcache import record as dm_record
from cachemgr.core import state
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    KernelFormatError,
    UnsafeError,
    UsageError,
    require_root,
)
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import gate
from cachemgr.ops.control import Control, Plan, Result
from cachemgr.procedures import autoattach, kinds, owners, policy
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
    """Carry out one decided action (AlreadyError: already so; UnsafeError: skipped).

    Each goes through the gate (the capability it needs: gate.NEEDS) and is done by the
    cache kind it acts on, found in the registry: the kind that registers a disk of the
    superblock role it found (``kinds.registering``), the cached device on the disk it
    names (``kinds.on_disk``), the cache it attaches that device to."""
    if isinstance(a, LvmAttach):  # through the attach and mode commands, with their locks
        cache_ops.attach(sysfs, a.device, a.cache, writecache=a.writecache, mode=a.mode)
        return
    if isinstance(a, LvmSetMode):
        cache_ops.mode(sysfs, a.device, a.mode)
        return
    if isinstance(a, AssembleDmCache):
        _assemble(sysfs, view, a)
        return
    node = f"/dev/{a.device}"
    if isinstance(a, Register):
        made = _registering(a.role, node)
        with gate.gate(gate.of_disks([node], made), "autoattach register"):
            made.register_disk(sysfs, node)
        return
    if isinstance(a, SetScheduler):  # what `cachemgr scheduler DISK NAME` does, read back
        with gate.gate(gate.of_disks([node]), "autoattach scheduler",
                       detail={"to": a.scheduler}):
            sched.set_scheduler(sysfs, a.device, a.scheduler)
        return
    if isinstance(a, Format):  # a blank SSD made a cache (a new cache set's)
        made = _registering("cache", node)
        with gate.gate(gate.of_disks([node], made), "autoattach format"):
            made.format_disk(sysfs, node, bucket=a.bucket)
        return
    # the view was read just before this round; each action of a round touches another
    # file of the backing device, so its object from the view is current enough
    k = kinds.on_disk(view.snapshot, a.device)
    if k is None:
        raise CacheMgrError(f"{node} is no longer a registered backing device")
    subject = gate.of_kind(k)
    cache = kinds.find(view.snapshot, a.cset, None) if isinstance(a, Attach) else None
    if isinstance(a, Attach):
        if cache is None:
            raise CacheMgrError(f"cache set {a.cset} vanished")
        subject = subject + gate.of_kind(cache)
    # the gate checks the kind's capability (gate.NEEDS: attach, mode, tune) as for the
    # admin's own commands; each is the kind's own operation
    with gate.gate(subject, f"autoattach {type(a).__name__.lower()}"):
        if isinstance(a, Attach):
            assert cache is not None
            k.attach_to(sysfs, cache)
        elif isinstance(a, SetMode):
            k.set_mode(sysfs, CacheMode(a.mode))
        elif isinstance(a, SetTunable):
            k.set_tunable(sysfs, a.name, a.value)


def _registering(role: str, node: str) -> type[kinds.Kind]:
    made = kinds.registering(role)
    if made is None:
        raise CacheMgrError(f"{node}: no cache kind registers a {role} disk")
    return made


def _assemble(sysfs: Sysfs, view: View, a: AssembleDmCache) -> None:
    """A recorded dm-cache device, through the gate (its name's locks and its three disks'):
    the record's identities are matched again on a fresh read inside it."""
    rec = next((r for r, _ in view.dm_records if r.name == a.device), None)
    if rec is None:
        raise CacheMgrError(f"the record of {a.stable_id} vanished")
    subject = gate.of_names(rec.node, [owners.dmcache_key(rec.name), owners.cache_key(rec.name)],
                            kinds.DmCache)
    with gate.gate(subject + gate.of_disks([a.origin, a.cache, a.metadata]),
                   "autoattach assemble dm-cache"):
        log.info("%s", dm_record.assemble(sysfs, rec))


def _load_policy(path: str) -> policy.Policy:
    """The policy; with no policy file and a dm-cache record, an empty one (the records are
    assembled whatever the policy says). PolicyError otherwise."""
    try:
        return policy.load(path)
    except policy.PolicyError as exc:
        if exc.missing and dm_record.load_all() != ([], []):
            return policy.Policy(path=path)
        raise


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
    if res.refused:  # exit 3 (unless something failed: 1); the rest was done
        notes.append(f"cachemgr: autoattach refused {len(res.refused)} thing(s) as unsafe "
                     "(the lines above say what and what to do); everything else it could "
                     "do is done")
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
    return Result(lines=lines, notes=notes, failed=failed, refused=bool(res.refused),
                  value=res, data=data)


def assemble(sysfs: Sysfs, target: str, *, ctl: Control | None = None) -> Result:
    """``cachemgr assemble NAME``: the admin's assembly of a recorded dm-cache device that
    the boot pass leaves alone because a device of it is known by its place only
    (backends/dmcache/record.py). Every check the boot pass makes (present, the recorded
    size, the metadata superblock, not busy) is made; what proves nothing (the place) is
    put to the admin with what blkid sees on each device now beside what it saw at create
    (``ctl``'s question: the CLI asks on a terminal, needs --yes without one). Through the
    gate, in the action journal as the admin's. A record whose devices are all proven is
    assembled as the boot pass would, without a question."""
    name = target.removeprefix("/dev/mapper/")
    require_root("assembling a dm-cache device")  # the records are root's to read
    rec = dm_record.load(name)
    if rec is None:
        _, bad = dm_record.load_all()
        mine = [b for b in bad if os.path.basename(b.split(":", 1)[0]) == f"{name}.json"]
        if mine:
            raise UnsafeError(mine[0].split("; fix: ", 1)[0], hint=(
                mine[0].split("; fix: ", 1)[1] if "; fix: " in mine[0] else None))
        raise UsageError(f"no dm-cache record of {name!r} in {dm_record.records_dir()}",
                         hint="cachemgr status lists the unassembled dm-cache devices")
    if rec.name in dm_discover.dm_devices(sysfs):
        raise AlreadyError(f"{rec.node} is assembled already")
    res = dm_record.resolve(rec, dm_record.identities(sysfs))
    if not res.found:
        raise UnsafeError(f"{rec.node} not assembled: " + "; ".join(
            f"{role}: {why}" for role, why in res.problems),
            hint=f"its record: {rec.path}" + ("; the udev worker assembles it when its "
                                               "devices come" if res.missing else ""))
    subject = gate.of_names(rec.node, [owners.dmcache_key(rec.name),
                                       owners.cache_key(rec.name)], kinds.DmCache) + gate.of_disks(
        [res.nodes[r] for r in dm_record.ROLES])
    ctl = ctl if ctl is not None else Control(what=f"assemble {name}")
    if res.unproven and ctl.asks:
        gate.check(subject, "assemble dm-cache")  # the gate's refusals before the question
        probe = identity.probe_signature if sysfs.live else None
        lines = [f"would assemble {rec.node} (dm-cache {rec.mode.value}, as recorded in "
                 f"{rec.path}) over these devices, which cachemgr cannot prove are its own:"]
        for r in dm_record.ROLES:
            d = rec.device(r)
            now = probe(res.nodes[r]) if probe is not None else None
            lines.append(f"{r}: {res.nodes[r]}, {d.words().split(' (was')[0]}; blkid at "
                         f"create: {d.signature or 'not recorded'}; now: "
                         f"{now.words() if now is not None else 'not read'}")
        if rec.mode == CacheMode.WRITEBACK:
            lines.append("in writeback the cache's dirty blocks are written to the origin: "
                         "over another disk they overwrite it")
        ctl.ask(Plan(f"assemble {name}", tuple(lines)))  # not confirmed: exit 3
    with gate.gate(subject, "assemble dm-cache"):
        # matched again inside the gate, on a fresh read: the devices the admin was shown
        ids = dm_record.identities(sysfs)
        if dict(dm_record.resolve(rec, ids).nodes) != dict(res.nodes):
            raise UnsafeError(f"{rec.node} not assembled: its devices changed while the "
                              "question was put; nothing was changed",
                              hint=f"look again: cachemgr assemble {name}")
        done = dm_record.assemble(sysfs, rec, ids, admin=True)
    autoattach.record({"kind": "dmcache-assemble", "device": rec.name, "stable_id": rec.node,
                       "policy": "cachemgr assemble", "result": "done", "by": "admin",
                       "unproven": [r for r, _ in res.unproven],
                       "nodes": dict(res.nodes)})
    log.info("%s (cachemgr assemble)", done)
    return Result(lines=[done], data={"schema": 1, "device": rec.node, "name": rec.name,
                                       "mode": rec.mode.value, "nodes": dict(res.nodes),
                                       "unproven": [r for r, _ in res.unproven]})


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
        if exc.missing:
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
                       "refused": len(res.refused),
                       "seqnums": [e.seqnum for e in events][:50],
                       "last_event": round(last, 3), "latency_s": round(done - last, 3),
                       "pass_s": round(done - t0, 3),
                       "stages": {**times, "rounds": res.timeline, "done": round(done, 3)},
                       "event_stages": [e.stages() for e in events][:50]})
