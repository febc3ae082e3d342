"""``cachemgr protect``: protect before the SSD dies (procedures/protect.py decides).

A pass reads the host once (the snapshot with its owners), the cache SSDs' cached SMART
answers (smartctl is cachemgr-smart.timer's job) and each SCSI SSD's error counter, decides
with the policy's ``[protect]`` table and the counts the last pass recorded, then carries the
actions out through the command layer: first every switch to writethrough (the ``mode``
command), then every drain (the ``drain`` command), each through the gate, so a device a
replacement or a drain owns is skipped with the gate's words. Each action is journaled in
``<state dir>/autoattach/actions.jsonl`` (``kind: protect``) and said on stderr (the unit's
journal); the state (counts, the SSDs protected) is kept in ``<state dir>/protect/``.
Run by ``cachemgr-protect.timer`` every minute and by the boot pass (``cachemgr
autoattach``); ``--dry-run`` says what it would do.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from typing import Any

from cachemgr.backends import smart
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, require_root
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import autoattach, policy, protect

log = logging.getLogger("cachemgr.protect")

STALL_TIMEOUT = 120.0  # a drain that makes no progress for this long gives up (and says so)


def _ioerr(sysfs: Sysfs, name: str) -> int | None:
    """A SCSI disk's ``device/ioerr_cnt`` (commands that completed with an error), else None."""
    raw = sysfs.read_opt(f"block/{name}/device/ioerr_cnt")
    try:
        return int(raw.strip(), 0) if raw else None
    except ValueError:
        return None


def gather(sysfs: Sysfs, snap: Snapshot) -> list[protect.Ssd]:
    """The SSDs of ``snap`` with what a decision reads: never runs smartctl."""
    rows = smart.ssd_health(sysfs, snap, refresh=False)
    errors = {s.name: n for s, _ in rows if (n := _ioerr(sysfs, s.name)) is not None}
    return protect.ssds(snap, rows, errors)


def _load(policy_path: str) -> policy.Policy | None:
    try:
        return policy.load(policy_path)
    except policy.PolicyError as exc:
        if exc.problems and exc.problems[0].line == 0 and \
                exc.problems[0].message == "no such file":
            return None
        raise


def run(sysfs: Sysfs, policy_path: str, *, dry_run: bool = False,
        pol: policy.Policy | None = None, ctl: Control | None = None,
        stall_timeout: float = STALL_TIMEOUT, drains: bool = True) -> Result:
    """One protect pass. A malformed policy is a usage error (nothing is done); no policy or
    ``[protect]`` off: nothing is read or done. Root unless ``dry_run``. ``drains`` False
    (the boot pass, which must not hold the boot for hours): the switches only, the drains
    left to the next pass (cachemgr-protect.timer)."""
    pol = pol if pol is not None else _load(policy_path)
    if pol is None or not pol.protect.enabled:
        why = "no policy file" if pol is None else "[protect] enabled = false"
        return Result(lines=[f"protect is off ({why}): nothing decided"],
                      data={"schema": 1, "enabled": False, "ssds": [], "actions": []})
    if not dry_run:
        require_root("protect")
        with _pass_lock() as got:
            if not got:  # the timer's pass while a long drain of the last one runs
                return Result(lines=["another protect pass is running: nothing done"],
                              data={"schema": 1, "enabled": True, "busy": True,
                                    "ssds": [], "actions": []})
            return _run(sysfs, pol, dry_run=False, ctl=ctl, stall_timeout=stall_timeout,
                        drains=drains)
    return _run(sysfs, pol, dry_run=True, ctl=ctl, stall_timeout=stall_timeout, drains=drains)


@contextlib.contextmanager
def _pass_lock() -> Iterator[bool]:
    """One protect pass at a time on a host (True: this one holds it)."""
    fd = state.open_lock(state.state_dir() / "locks" / "protect-run.lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _run(sysfs: Sysfs, pol: policy.Policy, *, dry_run: bool, ctl: Control | None,
         stall_timeout: float, drains: bool) -> Result:
    ctl = ctl if ctl is not None else Control(what="protect")
    snap = cache_ops.status(sysfs, probe_unregistered=False)
    groups = gather(sysfs, snap)
    old = protect.load_state()
    d = protect.decide(groups, pol.protect, old["counts"], protect.earlier(old))
    lines: list[str] = []
    notes: list[str] = []
    for s, why in d.triggered:
        lines.append(f"SSD {s.node} failing: {why}; {len(s.members)} device(s) on it")
        notes.append(f"cachemgr: warning: protect: SSD {s.node} failing: {why}")
    outcomes: list[dict[str, Any]] = []
    results: dict[str, str] = {}
    for a in d.acts:
        if a.what == "drain" and not drains and not dry_run:
            results.setdefault(a.device, "deferred")
            outcomes.append({**a.record(), "result": "deferred", "error": None})
            continue
        result, error = _do(sysfs, a, dry_run=dry_run, ctl=ctl, stall_timeout=stall_timeout)
        if a.what == "switch" and result in ("done", "already") and not dry_run:
            # the drain after the switch (every switch first: see procedures/protect.decide)
            result, error = "switched", None
        results.setdefault(a.device, result)
        outcomes.append({**a.record(), "result": result, "error": error})
    if not drains and not dry_run and any(o["result"] in ("switched", "deferred")
                                          for o in outcomes):
        notes.append("cachemgr: protect: the drains are left to the next cachemgr protect "
                     "(cachemgr-protect.timer): the boot pass does not wait for them")
    if not dry_run and drains:  # the drains of the devices switched, after every switch
        for o in outcomes:
            if o["what"] == "switch" and o["result"] == "switched":
                drain = protect.Act(o["ssd"], o["device"], "drain", o["why"])
                r, e = _do(sysfs, drain, dry_run=False, ctl=ctl, stall_timeout=stall_timeout)
                o["result"], o["error"] = ("done", None) if r in ("done", "already") else (r, e)
                results[o["device"]] = o["result"]
    for o in outcomes:
        a = protect.Act(o["ssd"], o["device"], o["what"], o["why"], o["note"])
        lines.append(f"{o['result']:8} {a.describe()}" + (f": {o['error']}" if o["error"]
                                                            else ""))
        if not dry_run:
            autoattach.record(o)
            (log.warning if o["result"] in ("failed", "skipped") else log.info)(
                "%s %s%s", o["result"], a.describe(), f": {o['error']}" if o["error"] else "")
            if o["result"] in ("failed", "skipped"):
                notes.append(f"cachemgr: protect: {o['device']} {o['result']}: {o['error']}")
    if not dry_run:
        state.write_json(state.state_dir() / "protect" / "state.json",
                         protect.next_state(old, d, groups, results))
    if not d.triggered:
        lines.append(f"protect: {len(groups)} cache SSD(s), none failing")
    return Result(lines=lines, notes=notes,
                  failed=any(o["result"] == "failed" for o in outcomes),
                  value=d, data={
                      "schema": 1, "enabled": True, "dry_run": dry_run,
                      "ssds": [{"ssd": s.node, "key": s.key, "io_errors": dict(s.io_errors),
                                "why": next((w for t, w in d.triggered if t is s), None),
                                "devices": [m.node for m in s.members]} for s in groups],
                      "actions": outcomes})


def _do(sysfs: Sysfs, a: protect.Act, *, dry_run: bool, ctl: Control,
        stall_timeout: float) -> tuple[str, str | None]:
    if a.what == "note":
        return "note", a.note
    if dry_run:
        return "dry-run", None
    try:
        if a.what == "switch":
            cache_ops.mode(sysfs, a.device, "writethrough", ctl=ctl)
        else:
            cache_ops.drain(sysfs, a.device, ctl=ctl, stall_timeout=stall_timeout)
    except AlreadyError:
        return "already", None
    except UnsafeError as exc:  # the gate (an owner), or a refusal: the device is left
        return "skipped", exc.message
    except CacheMgrError as exc:
        return "failed", exc.message
    return "done", None
