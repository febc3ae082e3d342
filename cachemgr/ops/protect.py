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
autoattach``); ``--dry-run`` says what it would do. With protect off (or no policy) a pass
acts on nothing: it keeps the counts as the new baseline and marks the SSDs protected
earlier as history (the health model's warning). ``cachemgr protect --clear SSD``
(:func:`clear`) undoes what the passes did to one SSD, through the gate and journaled.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from cachemgr.backends import kernlog, smart
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, require_root
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import autoattach, policy, protect

log = logging.getLogger("cachemgr.protect")

STALL_TIMEOUT = 120.0  # a drain that makes no progress for this long gives up (and says so)


def _count(sysfs: Sysfs, path: str) -> int | None:
    raw = sysfs.read_opt(path)
    try:
        return int(raw.strip(), 0) if raw else None
    except ValueError:
        return None


def read_log(sysfs: Sysfs) -> tuple[protect.Log, dict[str, list[tuple[int, float]]]]:
    """The kernel log's failed requests and what tells whether it holds them all
    (procedures/protect.py ``Log``), and each disk's failed requests, read now: after the
    counters, so that every error a counter showed of a failed request was logged before
    (the block layer logs the request when it ends, just after the SCSI command counted
    it: drivers/scsi/scsi_lib.c ``scsi_complete``, block/blk-mq.c ``blk_update_request``;
    a request ending in between logs into the next pass's window)."""
    reader = kernlog.Reader(sysfs)
    try:
        logged = reader.read()
    finally:
        reader.close()
    why = reader.why_not
    if why is None and reader.last_seq is None:
        why = "the kernel log held no record" + ("" if sysfs.live else " (none captured)")
    at = reader.now if reader.last_seq is not None else None
    by_disk: dict[str, list[tuple[int, float]]] = {}
    for x in logged:
        if x.seq is not None:
            by_disk.setdefault(x.disk, []).append((x.seq, x.at))
    return protect.Log(why_not=why, boot=kernlog.boot_id(sysfs), first=reader.first_seq,
                       last=reader.last_seq, at=at, lost=reader.lost,
                       suppressed=tuple(reader.suppressed),
                       failed=tuple((x.seq, x.at) for x in logged if x.seq is not None)
                       ), by_disk


def gather(sysfs: Sysfs, snap: Snapshot) -> tuple[list[protect.Ssd], protect.Log]:
    """The SSDs of ``snap`` with what a decision reads, and the kernel log read after their
    counters (a SCSI disk's ``device/ioerr_cnt``: commands that completed with an error;
    NVMe has no such counter): never runs smartctl."""
    rows = smart.ssd_health(sysfs, snap, refresh=False)
    errors: dict[str, int] = {}
    for s, _ in rows:
        got = _count(sysfs, f"block/{s.name}/device/ioerr_cnt")
        if got is not None:
            errors[s.name] = got
    klog, by_disk = read_log(sysfs)
    return protect.ssds(snap, rows, errors, by_disk), klog


def run(sysfs: Sysfs, policy_path: str, *, dry_run: bool = False,
        pol: policy.Policy | None = None, ctl: Control | None = None,
        stall_timeout: float = STALL_TIMEOUT, drains: bool = True) -> Result:
    """One protect pass. A malformed policy is a usage error (nothing is done); no policy or
    ``[protect]`` off: nothing is read or done. Root unless ``dry_run``. ``drains`` False
    (the boot pass, which must not hold the boot for hours): the switches only, the drains
    left to the next pass (cachemgr-protect.timer)."""
    pol = pol if pol is not None else policy.load_if_present(policy_path)
    if pol is None or not pol.protect.enabled:
        why = "no policy file" if pol is None else "its protect table has enabled = false"
        lines = [f"protect is off, {why}: nothing decided"]
        if not dry_run and os.geteuid() == 0 and state.state_dir(create=False).is_dir():
            lines += _off(sysfs)
        return Result(lines=lines,
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


def _off(sysfs: Sysfs) -> list[str]:
    """Protect off: the counts kept as the new baseline, the records marked off (only
    when a pass ever wrote a state: an idle host's state directory is left as it is)."""
    with _pass_lock() as got:
        if not got:
            return ["another protect pass is running: nothing kept"]
        old = protect.load_state()
        if not (old["counts"] or old["protected"]):
            return []
        snap = cache_ops.status(sysfs, probe_unregistered=False)
        groups, klog = gather(sysfs, snap)
        new = protect.off_state(old, groups, mark=klog.mark())
        state.write_json(state.state_dir() / "protect" / "state.json", new)
        return [f"SSD {v.get('ssd')} stays recorded as protected, nothing done while protect "
                f"is off: cachemgr protect --clear {v.get('ssd')} forgets it"
                for v in new["protected"].values()]


def _run(sysfs: Sysfs, pol: policy.Policy, *, dry_run: bool, ctl: Control | None,
         stall_timeout: float, drains: bool) -> Result:
    ctl = ctl if ctl is not None else Control(what="protect")
    snap = cache_ops.status(sysfs, probe_unregistered=False)
    groups, klog = gather(sysfs, snap)
    old = protect.load_state()
    now = time.time()
    d = protect.decide_from(groups, pol.protect, old, now, klog)
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
                         protect.next_state(old, d, groups, results, now))
    for node, words in d.unknown.values():
        lines.append(f"protect: SSD {node}: cannot tell: {words}; nothing done")
        notes.append(f"cachemgr: warning: protect: SSD {node}: cannot tell: {words}; nothing "
                     f"done: look at its SMART answer and the kernel log, then cachemgr "
                     f"protect --clear {node} if it is sound")
    if not d.triggered:
        lines.append(f"protect: {len(groups)} cache SSD(s), none failing")
    for key, why in sorted(d.ignored.items()):
        if why == "first seen":
            lines.append(f"protect: {key}: first seen at {d.counts.get(key)} errors, the "
                         "baseline" + (" the next pass counts from" if not dry_run else
                                       " a pass would keep, nothing counted from it yet"))
        elif why == "explained":
            lines.append(f"protect: {key}: rose to {d.counts.get(key)}, no failed request of "
                         "its disk in the kernel log since: probe commands (smartctl), not "
                         "counted")
    return Result(lines=lines, notes=notes,
                  failed=any(o["result"] == "failed" for o in outcomes),
                  value=d, data={
                      "schema": 1, "enabled": True, "dry_run": dry_run,
                      "ssds": [{"ssd": s.node, "key": s.key, "io_errors": dict(s.io_errors),
                                "baseline": {k: old["counts"].get(k) for k in s.io_errors},
                                "ignored": {k: d.ignored[k] for k in s.io_errors
                                            if k in d.ignored},
                                "unknown": d.unknown[s.key][1] if s.key in d.unknown
                                else None,
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


# --------------------------------------------------------------------------- --clear


def clear(sysfs: Sysfs, name: str, policy_path: str, *, dry_run: bool = False,
          ctl: Control | None = None) -> Result:
    """``cachemgr protect --clear SSD``: undo what the passes did to one SSD. Every device a
    pass switched to writethrough and that is still in writethrough goes back to the mode
    it had (the ``mode`` command: through the gate, so a device another procedure owns is
    refused with its words); then the SSD's record is forgotten and its counts read now as
    its new baseline, so only errors that rise from here count. A device switched by hand
    since is left as it is. Journaled in ``<state dir>/autoattach/actions.jsonl`` (``kind:
    protect``, ``what: clear``). Exit 4 when nothing is recorded for ``name``; 3 when a
    device could not be put back (the record stays: run it again) or a pass is running."""
    ctl = ctl if ctl is not None else Control(what="protect --clear")
    if dry_run:
        return _clear(sysfs, name, policy_path, dry_run=True, ctl=ctl)
    require_root("protect --clear")
    with _pass_lock() as got:
        if not got:
            raise UnsafeError(f"a protect pass is running (its drains): {name} is left as it "
                              "is", hint="wait for it, then run cachemgr protect --clear "
                              f"{name} again")
        return _clear(sysfs, name, policy_path, dry_run=False, ctl=ctl)


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _clear(sysfs: Sysfs, name: str, policy_path: str, *, dry_run: bool,
           ctl: Control) -> Result:
    old = protect.load_state()
    key = protect.find(old, name, _same if sysfs.live else None)
    if key is None:
        known = ", ".join(str(v.get("ssd")) for v in [*old["protected"].values(),
                                                      *old["unknown"].values()])
        raise AlreadyError(f"{name}: no SSD recorded as protected by that name"
                           + (f" (recorded: {known})" if known else ""))
    entry: Any = old["protected"].get(key) or old["unknown"].get(key) or {}
    ssd = str(entry.get("ssd"))
    snap = cache_ops.status(sysfs, probe_unregistered=False)
    groups, klog = gather(sysfs, snap)
    group = next((g for g in groups if g.key == key), None)
    now_modes = {m.node: m.mode for m in group.members} if group else {}
    modes = entry.get("modes") if isinstance(entry.get("modes"), dict) else {}
    devs = entry.get("devices") if isinstance(entry.get("devices"), dict) else {}
    lines: list[str] = []
    notes: list[str] = []
    outcomes: list[dict[str, Any]] = []
    for dev in sorted(set(devs) | set(modes)):
        to = modes.get(dev)
        cur = now_modes.get(dev)
        rec = {"kind": "protect", "what": "clear", "ssd": ssd, "device": dev, "to": to,
               "error": None}
        if to is None:
            rec["result"] = "unknown"
            rec["error"] = ("the mode it had before protect was not recorded: set it by "
                            f"hand if wanted, cachemgr mode {dev} writeback")
        elif dev not in now_modes:
            rec["result"] = "gone"
        elif cur is None or cur.value != "writethrough" or to == "writethrough":
            rec["result"] = "left"
            rec["error"] = f"it is in {cur.value if cur else 'an unknown mode'} now, left so"
        elif dry_run:
            rec["result"] = "dry-run"
        else:
            try:
                cache_ops.mode(sysfs, dev, to, ctl=ctl)
                rec["result"] = "done"
            except AlreadyError:
                rec["result"] = "already"
            except UnsafeError as exc:
                rec["result"], rec["error"] = "skipped", exc.message
            except CacheMgrError as exc:
                rec["result"], rec["error"] = "failed", exc.message
        outcomes.append(rec)
        lines.append(f"{rec['result']:8} {dev}: back to {to or 'its mode before protect'}"
                     + (f": {rec['error']}" if rec["error"] else ""))
    stuck = [o for o in outcomes if o["result"] in ("skipped", "failed")]
    if not dry_run:
        for o in outcomes:
            autoattach.record(o)
            log.info("protect --clear %s %s: %s", o["result"], o["device"], o["error"] or "")
        if not stuck:
            new = protect.forget(old, key, groups, mark=klog.mark())
            state.write_json(state.state_dir() / "protect" / "state.json", new)
            autoattach.record({"kind": "protect", "what": "forget", "ssd": ssd,
                               "device": ssd, "result": "done", "error": None})
            lines.append(f"forgot   SSD {ssd}: its record gone; its error counts now "
                         + ", ".join(f"{k} {n}" for k, n in sorted(
                             (group.io_errors if group else {}).items()))
                         + " are the baseline the next pass counts from")
    else:
        lines.append(f"dry-run  SSD {ssd}: its record would be forgotten and its counts taken "
                     "as the new baseline")
    pol = policy.load_if_present(policy_path)
    if pol is not None and pol.protect.enabled and group is not None:
        again = protect.decide([group], pol.protect, {k: n for k, n in group.io_errors.items()})
        if again.triggered:
            notes.append(f"cachemgr: warning: protect: SSD {ssd} still fails by its SMART "
                         f"answer: {again.triggered[0][1]}; the next pass protects it again "
                         "(replace it, or turn protect off)")
    if stuck:
        raise UnsafeError(f"protect --clear {ssd}: " + "; ".join(
            f"{o['device']} {o['result']}: {o['error']}" for o in stuck)
            + "; its record is kept", hint=f"then run cachemgr protect --clear {name} again")
    return Result(lines=lines, notes=notes, data={
        "schema": 1, "ssd": ssd, "key": key, "dry_run": dry_run, "actions": outcomes,
        "forgotten": not dry_run})
