"""Who owns a cache object: the lock keys of every object, and the procedures that own them.

Every change takes the locks of the objects it acts on (cachemgr/ops/gate.py). A procedure
that runs for a while (a drain, a dm-cache or LVM flush, a replace-ssd run) owns its objects
for its whole run: while its process lives it holds their locks (the lock files say who:
core/state.py); once its process is gone its journal is still there and claims them until the
procedure is resumed or rolled back. :func:`owners` lists both, as :class:`Owner` records.

The keys have one spelling each, in cachemgr/procedures/keys.py (re-exported here), below the
cache kinds that name their objects' keys and this module that reads the journals.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cachemgr.core import state, undo
from cachemgr.core.model import Owner
from cachemgr.procedures.keys import bcache_key as bcache_key
from cachemgr.procedures.keys import cache_key as cache_key
from cachemgr.procedures.keys import dmcache_key as dmcache_key
from cachemgr.procedures.keys import lvm_key as lvm_key


def _journals(kind: str, view: state.View | None = None
              ) -> Iterable[tuple[Path, dict[str, Any]]]:
    if view is not None:  # a poller's (state.polled)
        for n in view.names(kind):
            try:
                data = view.read_json(kind, n)
            except state.StateFileError:
                continue
            if data is not None:
                yield view.path(kind, n), data
        return
    d = state.state_dir(create=False) / kind
    if not d.is_dir():
        return
    for p in sorted(d.glob("*.json")):
        try:
            data = state.read_json(p)
        except state.StateFileError:
            continue  # listed by the procedure's own --list; never claims by guesswork
        if data is not None:
            yield p, data


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def interrupted(view: state.View | None = None) -> list[Owner]:
    """The procedures whose journals claim objects (running or not: :func:`owners` tells
    which are running). ``view``: a poller's state directory for this poll
    (core/state.py ``polled``)."""
    found: list[Owner] = []
    for p, d in _journals("drain", view):
        key = d.get("uuid") or os.path.basename(str(d.get("backing") or ""))
        dev = str(d.get("device") or d.get("backing") or key)
        if key:
            found.append(Owner("drain", frozenset({bcache_key(str(key))}), dev, False,
                               since=_num(d.get("started")), journal=str(p),
                               resume=f"cachemgr drain {dev} --resume"))
    for p, d in _journals("dmcache-flush", view):
        name = d.get("name")
        if isinstance(name, str) and name:
            dev = str(d.get("device") or f"/dev/mapper/{name}")
            found.append(Owner("dm-cache flush", frozenset({dmcache_key(name)}), dev, False,
                               since=_num(d.get("started")), journal=str(p),
                               resume=f"cachemgr drain {dev} --resume"))
    for p, d in _journals("lvm-drain", view):
        lv = d.get("lv")
        if isinstance(lv, str) and lv:
            found.append(Owner("lvm drain", frozenset({lvm_key(lv)}), lv, False,
                               since=_num(d.get("started")), journal=str(p),
                               resume=f"cachemgr drain {lv} --resume"))
    for p, d in _journals("invalidate", view):  # procedures/coherence.py: pending
        key = d.get("key")
        if isinstance(key, str) and key:
            dev = str(d.get("device") or key)
            found.append(Owner("invalidation", frozenset({key}), dev, False,
                               since=_num(d.get("started")), journal=str(p),
                               resume=f"cachemgr invalidate {dev} --yes"))
    for p, d in _journals("snapshot", view):  # procedures/snapshot.py: its filesystem
        keys = d.get("keys")  # may be frozen; restore thaws it
        if isinstance(keys, list) and keys and all(isinstance(k, str) and k for k in keys):
            dev = str(d.get("device") or keys[0])
            found.append(Owner("snapshot", frozenset(keys), dev, False,
                               since=_num(d.get("started")), journal=str(p),
                               step=str(d.get("phase") or "") or None,
                               resume="cachemgr restore"))
    for j in undo.journals(view):
        found.append(Owner(j.procedure, j.keys, j.device, False, since=j.started,
                           journal=str(j.path), resume="cachemgr restore"))
    found.extend(_replace_runs(view))
    return found


def undo_journal(o: Owner) -> bool:
    """``o`` is an interrupted procedure's undo journal (core/undo.py): settings it changed
    for a while, which the gate puts back for the next command on its devices."""
    return o.journal is not None and Path(o.journal).parent.name == undo.KIND


def unreadable() -> list[tuple[str, str]]:
    """(path, why) of every procedure journal that cannot be read: it claims nothing (never
    by guesswork), but whether its procedure was interrupted is unknown (cachemgr check
    warns). Never creates the state directory."""
    if not state.state_dir(create=False).is_dir():
        return []
    from cachemgr.procedures import replace

    out = [(str(e.path), e.reason) for e in replace.scan_runs()[1]] + undo.unreadable()
    for kind in ("drain", "dmcache-flush", "lvm-drain", "invalidate"):
        d = state.state_dir(create=False) / kind
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.json")):
            try:
                state.read_json(p)
            except state.StateFileError as exc:
                out.append((str(p), exc.reason))
    return out


def replace_keys(kind: str, cset: str, backings: Iterable[dict[str, Any]],
                 lvs: Iterable[str] = ()) -> frozenset[str]:
    """The objects a replace-ssd run owns for its whole run (``lvs``: an LVM run's other
    cached LVs on the same SSD, Journal.lvs): its cache's and what its kind's module
    declares (procedures/replace/, ``Kind.run_keys``)."""
    from cachemgr.procedures import replace

    return frozenset({cache_key(cset), *replace.kind_of(kind).run_keys(
        cset, tuple(backings), tuple(lvs))})


def _replace_runs(view: state.View | None = None) -> list[Owner]:
    from cachemgr.procedures import replace

    out = []
    for j in replace.list_runs(view):
        if j.status in ("done", "rolled-back"):
            continue
        kind = replace.kind_of(j.kind)
        step = next((n for n, _ in kind.steps if n not in j.done), None)
        undo = kind.point_of_no_return not in j.done
        out.append(Owner(
            "replace-ssd", replace_keys(j.kind, j.cset, j.backings, j.lvs()), j.cset, False,
            run=j.id,
            step=step, since=j.created, journal=str(j.path),
            resume=f"cachemgr replace-ssd --resume {j.id}",
            rollback=f"cachemgr replace-ssd --rollback {j.id}" if undo else None))
    return out


def owners(keys: Iterable[str] | None = None, *, view: state.View | None = None
           ) -> list[Owner]:
    """Who owns what now: each interrupted procedure's claim (marked running when its lock is
    held, as a running drain's or replace-ssd run's is), and the runs holding locks of
    ``keys`` that no journal names (a mode switch, a tune). ``keys`` None: every lock file.
    ``view``: a poller's state directory for this poll (core/state.py ``polled``: the same
    answer, read through one walk, what did not change kept from the last poll)."""
    claims = interrupted(view)
    if keys is not None:
        holders = [{"key": k, **h} for k in set(keys) for h in [state.current_holder(k)]
                   if h is not None]
    else:
        holders = state.held_locks() if view is None else view.held_locks()
    pairs = [(h, o) for h in holders for o in [_from_holder(h)] if o is not None]
    held = [o for _, o in pairs]
    out: list[Owner] = []
    for c in claims:
        live = next((h for h in held if h.keys & c.keys), None)
        if live is not None:
            c = Owner(c.procedure, c.keys, c.device, True, run=c.run,
                      step=live.step or c.step, since=c.since, pid=live.pid,
                      resume=c.resume, rollback=c.rollback, journal=c.journal,
                      progress_at=live.progress_at, progress_dirty=live.progress_dirty)
        out.append(c)
    claimed = set().union(*(c.keys for c in claims)) if claims else set()
    # one record per run: a run holds several locks (a device's and its cache's)
    runs: dict[tuple[Any, ...], Owner] = {}
    for raw, h in pairs:
        if h.keys & claimed:
            continue
        # one run: one process's owner (older lock files: the same start time)
        ident = (h.pid, raw.get("owner") or h.since, h.procedure, h.run)
        had = runs.get(ident)
        runs[ident] = h if had is None else Owner(
            h.procedure, had.keys | h.keys, had.device, True, run=h.run, step=h.step,
            since=min((x for x in (h.since, had.since) if x is not None), default=None),
            pid=h.pid, progress_at=h.progress_at or had.progress_at,
            progress_dirty=h.progress_dirty if h.progress_at else had.progress_dirty)
    return out + list(runs.values())


def _from_holder(h: dict[str, Any]) -> Owner | None:
    """A held lock's record (its key is in its content since this version)."""
    key = h.get("key")
    if not isinstance(key, str):
        return None
    return Owner(str(h.get("procedure") or ""), frozenset({key}),
                 str(h.get("object") or key), True, run=h.get("run") or None,
                 step=h.get("step") or None, since=_num(h.get("since")),
                 pid=h.get("pid") if isinstance(h.get("pid"), int) else None,
                 progress_at=_num(h.get("progress_at")),
                 progress_dirty=_int(h.get("progress_dirty")))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def running(key: str) -> Owner | None:
    """The run holding ``key``'s lock now, from its lock file (None: nobody)."""
    h = state.current_holder(key)
    if h is None:
        return None
    return _from_holder({"key": key, **h})


def owner_of(all_owners: Iterable[Owner], keys: Iterable[str]) -> Owner | None:
    """The owner (an interrupted one before a running one) of an object with ``keys``."""
    ks = set(keys)
    found = [o for o in all_owners if o.keys & ks]
    return min(found, key=lambda o: o.running) if found else None


def owner_json(o: Owner | None) -> dict[str, Any] | None:
    """docs/json.md, ``owner``."""
    if o is None:
        return None
    return {"procedure": o.procedure, "running": o.running, "run": o.run, "step": o.step,
            "since": o.since, "pid": o.pid, "resume": o.resume, "rollback": o.rollback,
            "journal": o.journal, "device": o.device, "progress_at": o.progress_at,
            "progress_dirty_bytes": o.progress_dirty}
