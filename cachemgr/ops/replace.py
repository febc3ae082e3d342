"""The replace-ssd commands: plan, run, resume, rollback, list (cachemgr/procedures/replace/
does the steps; the journal, the cache set's lock and every refusal live there or here, never
in a face)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from cachemgr.backends import smart
from cachemgr.core import state
from cachemgr.core.errors import Cancelled, UnsafeError, UsageError, require_root
from cachemgr.core.model import Snapshot
from cachemgr.core.state import StateFileError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import gate
from cachemgr.ops.control import Control, Plan, Result
from cachemgr.procedures import kinds, owners, replace

Options = replace.Options
Journal = replace.Journal
Kind = replace.Kind
kind_of = replace.kind_of
KINDS = replace.kinds()
STEPS = replace.STEPS
STEP_NAMES = replace.STEP_NAMES
describe = replace.describe


def kind_for(cache: str, sysfs: Sysfs | None = None,
             snap: Snapshot | None = None) -> replace.Kind:
    """The kind of replacement ``cache`` (a cset UUID, SSD, cached LV or dm-cache device)
    takes: its steps, its point of no return and its words; each kind asked, as the plan
    asks them (``replace.recognise``; ``snap``: a snapshot the caller has, read instead of
    taking one)."""
    return replace.recognise(cache, sysfs, snap)[0]


def steps_for(cache: str, sysfs: Sysfs | None = None) -> tuple[tuple[str, str], ...]:
    """The steps a replacement of ``cache`` will take (:func:`kind_for`)."""
    return kind_for(cache, sysfs).steps


def journal_json(j: replace.Journal) -> dict[str, Any]:
    """A run as ``replace-ssd --json`` prints it (schema 1, docs/json.md)."""
    return {"schema": 1, "id": j.id, "kind": j.kind, "status": j.status, "error": j.error,
            **replace.json_fields(j),  # each kind's own: cset, lv, dm_name...
            "old": j.old, "new": j.new,
            "steps": [{"name": n, "done": n in j.done, "seconds": j.seconds.get(n)}
                      for n, _ in j.steps],
            "wall_s": round(sum(j.seconds.values()), 3) if j.seconds else None,
            "drain_s": j.seconds.get("drain"),
            "backings": [{"uuid": b["uuid"], "device": b["device"], "backing": b["node"],
                          "mode": b["mode"]} for b in j.backings]}


def runs(*, unfinished: bool = False) -> list[replace.Journal]:
    """Journaled runs, oldest first; ``unfinished``: only those that can be resumed or
    rolled back (not done, not rolled back). Journals that cannot be read are left out
    (:func:`unreadable` lists them)."""
    found = replace.list_runs()
    if unfinished:
        found = [j for j in found if j.status not in ("done", "rolled-back")]
    return found


def unreadable() -> list[StateFileError]:
    """The replace-ssd journals that cannot be read: each with its path and why."""
    return replace.scan_runs()[1]


def list_runs(cache: str | None = None) -> Result:
    """Every run (``cache``: only the runs on that cache or its old SSD, spelt as replace-ssd
    takes its CACHE); a journal that cannot be read is reported (stderr, ``unreadable`` in
    the JSON) and skipped: the others are listed all the same."""
    found, bad = replace.scan_runs()
    if cache:
        found = [j for j in found if replace.named_by(j, cache)]
    return Result(
        lines=[f"{j.id}  {j.status:<11} {replace.kind_of(j.kind).label(j.cset)}  "
               f"done: {', '.join(j.done[-1:])}"
               + (f"  error: {j.error}" if j.error else "") for j in found],
        notes=[f"replace-ssd: skipped {e.path}: {e.reason}" for e in bad],
        data={"schema": 1, "runs": [journal_json(j) for j in found],
              "unreadable": [{"path": str(e.path), "reason": e.reason} for e in bad]},
        value=found)


def plan(sysfs: Sysfs, cache: str | None, opts: replace.Options, *,
         for_run: bool = False) -> replace.Journal:
    """Check everything and record what will be restored; changes nothing. ``for_run``:
    the plan is to be run (root is required before anything else)."""
    if for_run:
        require_root("replace-ssd")
    if not cache:
        raise UsageError("replace-ssd needs the CACHE (its SSD, cset UUID, cached LV or "
                         "dm-cache device)",
                         hint="or --resume ID / --list")
    if opts.warm:
        # the trace is read now (exit 2 for one that is not a trace), and kept by its full
        # path: a resumed run may start in another directory
        import dataclasses
        import os

        from cachemgr.procedures import trace as tr

        tr.read(opts.warm)
        opts = dataclasses.replace(opts, warm=os.path.abspath(opts.warm))
    _capable(sysfs, cache)
    j = _planned(sysfs, cache, opts)
    # a drain or another change running on one of its devices: said now, not after the
    # operator confirmed (the run enters the gate again, for real, when it starts). An
    # interrupted drain or flush is refused too, not taken over: it left its interim
    # tunables (writeback_percent=0) or table (the cleaner policy), which the plan has just
    # recorded as the ones the run restores at its end, and the run's drain step would
    # consume the journal that holds the real ones
    gate.check(subject(j), "replace-ssd")
    return j


def _capable(sysfs: Sysfs, cache: str) -> None:
    """The object ``cache`` names, as its cache kind, must declare ``replace`` (the gate's
    capability table, gate.NEEDS): refused by name (exit 2, nothing changed) before the
    replacement's own kinds are asked, which know the built-in caches only. A name no kind
    owns is left to them (an SSD's node, a cached LV: they say what is wrong with it)."""
    k = kinds.find(cache_ops.status(sysfs), cache, sysfs)
    if k is not None:
        gate.refuse_incapable(gate.of_kind(k), "replace-ssd")


def _planned(sysfs: Sysfs, cache: str, opts: replace.Options) -> replace.Journal:
    """The plan without the look at who owns its devices (the gate's, which a run holding
    them makes itself): another unfinished run on the cache is refused, then the kind plans."""
    unfinished = runs(unfinished=True)
    for r in unfinished:
        if replace.named_by(r, cache):
            _refuse_second(r)
    j = _plan(sysfs, cache, opts)
    for r in unfinished:
        if r.same_cache(j):
            _refuse_second(r)
    return j


def _refuse_second(r: replace.Journal) -> None:
    """A new plan on a cache with an unfinished run would remember the interim state (mode
    none, a cleaner policy) as the one to restore: the run must be finished or undone."""
    kind = replace.kind_of(r.kind)
    last = r.done[-1] if r.done else "none"
    undo = kind.point_of_no_return not in r.done
    raise UnsafeError(
        f"run {r.id} on {kind.label(r.cset)} is unfinished ({r.status}, last "
        f"step done: {last}); a new run would take its interim state for the one to restore",
        hint=f"cachemgr replace-ssd --resume {r.id}"
             + (f" (or --rollback {r.id})" if undo else ""))


def _plan(sysfs: Sysfs, cache: str, opts: replace.Options) -> replace.Journal:
    """The plan of the kind that claims ``cache`` (an LV's /dev/dm-N or dm name is an LVM
    cache's all the same)."""
    return replace.plan_cache(sysfs, cache, opts)


def vm_lines(sysfs: Sysfs, j: replace.Journal) -> list[str]:
    """The VMs whose disks sit on the devices the run takes out of caching (mode none, a
    linear table, an uncached LV) until it ends: they run at the backing disk's speed."""
    from cachemgr.ops import vms

    snap = vms.scan(sysfs)
    if snap.vms is None or not snap.vms.vms:
        return []
    nodes = replace.kind_of(j.kind).vm_nodes(j, snap)  # its kind's module says which
    served = [f"{v.name} ({d.target} on {n})" for n in sorted(nodes)
              for v, d in vms.serving(snap.vms, n)]
    if not served:
        return []
    return ["VMs that run at the backing disk's speed until the run ends: " + ", ".join(served)]


def plan_lines(sysfs: Sysfs, j: replace.Journal) -> list[str]:
    """The plan as every face shows it: the steps and what they restore, then the VMs and
    the old SSD's health."""
    return replace.describe(j) + vm_lines(sysfs, j) + health_lines(sysfs, j)


def health_lines(sysfs: Sysfs, j: replace.Journal) -> list[str]:
    """The old SSD's SMART health (cached; smartctl against the live /sys only)."""
    if not j.old.get("node"):
        return []
    got = smart.of_records([j.old], refresh=sysfs.live)
    if not got:
        return []
    node, h = got[0]
    return [f"old SSD {node} health: " + (h.words() if h is not None else "not read")]


def subject(j: replace.Journal) -> gate.Subject:
    """Every object run ``j`` owns: its cache and each device on it."""
    kind = replace.kind_of(j.kind)
    words = {owners.cache_key(j.cset): f"{kind.what} {j.cset}"}
    for b in j.backings:
        words[owners.bcache_key(str(b.get("uuid") or b.get("name")))] = str(
            b.get("device") or b.get("node"))
    for x in j.lvs()[1:]:
        words[owners.lvm_key(x)] = f"LV {x} (cached on the same SSD)"
    keys = owners.replace_keys(j.kind, j.cset, j.backings, j.lvs())
    return gate.Subject(words[owners.cache_key(j.cset)],
                        tuple((k, words.get(k, j.cset)) for k in sorted(keys)))


@contextlib.contextmanager
def _owning(j: replace.Journal, action: str = "replace-ssd", *,
            fresh: bool = False) -> Iterator[None]:
    """Run ``j`` owns its cache and every device on it for its whole run (the gate), and its
    drains, in worker threads, act for it (state.acting_as). A ``fresh`` run (nothing done
    yet) takes over nothing: a drain or flush interrupted on one of its devices left interim
    settings that its plan would record as the ones to restore (refused, exit 3, as the
    plan refuses it); a resumed run or a rollback takes over its own drains."""
    takes_over = gate.resumes(run=j.id) if fresh else gate.resumes(
        "drain", "dm-cache flush", "lvm drain", run=j.id)
    with state.acting_as(("replace-ssd", j.id)), gate.gate(
            subject(j), action, run=j.id, takes_over=takes_over):
        yield


def _record_again(sysfs: Sysfs, j: replace.Journal) -> list[str]:
    """Plan fresh run ``j`` again, now that it holds its devices, and take that plan (its
    id kept): what it checks and records (its first steps, preflight and remember: the
    modes and tunables it restores at its end) is read while no other command can change
    them. A plan made before the locks were taken (to know which devices to lock, and to
    show it) is only a forecast: a second admin's change in between was lost, the run
    putting back what it had read before. The words of what changed since (for the face);
    refused (exit 3, nothing changed) when the cache now has devices the run does not
    hold."""
    again = _planned(sysfs, j.cset, replace.Options(**j.options))
    held = subject(j).keys
    more = sorted(subject(again).keys - held)
    if (again.kind, again.cset) != (j.kind, j.cset) or more:
        what = replace.kind_of(j.kind).label(j.cset)
        raise UnsafeError(
            f"{what} changed while run {j.id} was starting (now also: "
            f"{', '.join(more) or again.cset}); nothing was changed",
            hint="plan again: cachemgr replace-ssd --dry-run shows the new plan")
    said = _changed_words(j, again)
    for f in dataclasses.fields(replace.Journal):
        if f.name != "id":
            setattr(j, f.name, getattr(again, f.name))
    return said


def _changed_words(before: replace.Journal, now: replace.Journal) -> list[str]:
    """What the plan read again under the locks found changed since the plan shown."""
    out = []
    was = {str(b.get("uuid") or b.get("name")): b for b in before.backings}
    for b in now.backings:
        old = was.get(str(b.get("uuid") or b.get("name")))
        if old is None:
            continue
        dev = b.get("device") or b.get("node")
        diffs = [f"mode {old.get('mode')} -> {b.get('mode')}"] if old.get("mode") != b.get(
            "mode") else []
        o_t, n_t = old.get("tunables") or {}, b.get("tunables") or {}
        diffs += [f"{k} {o_t.get(k)} -> {n_t.get(k)}" for k in sorted(set(o_t) | set(n_t))
                  if o_t.get(k) != n_t.get(k)]
        if diffs:
            out.append(f"{dev}: changed since the plan was made ({', '.join(diffs)}); the "
                       "run restores what it holds now")
    for name in ("congested", "lvm", "dm"):
        if getattr(before, name) != getattr(now, name):
            out.append(f"the {replace.kind_of(now.kind).what} {now.cset} changed since the "
                       "plan was made; the run restores what it holds now")
            break
    return out


def dry_run(sysfs: Sysfs, cache: str | None, opts: replace.Options) -> Result:
    j = plan(sysfs, cache, opts)
    lines = plan_lines(sysfs, j)
    return Result(lines=lines, value=j,
                  data={**journal_json(j), "status": "planned", "plan": lines})


def _hooks(ctl: Control) -> dict[str, Any]:
    def say(line: str) -> None:
        if ctl.cancel.is_set():
            raise Cancelled("replacement cancelled by the operator",
                            hint="the journal keeps its place")
        ctl.note(line)

    prompt = None
    if ctl.prompt is not None:
        ask = ctl.prompt

        def prompt(text: str) -> None:
            if not ask(text):
                raise Cancelled("the operator did not confirm the swap")

    return {"say": say, "prompt": prompt}


def run(sysfs: Sysfs, j: replace.Journal, *, ctl: Control | None = None,
        command: str | None = None) -> Result:
    """Execute (or continue) the journaled run ``j``, step by step. A fresh run (``j`` a
    plan) takes its locks, plans again under them and only then asks ``ctl.confirm`` (the
    plan it shows is the one it runs: ``command``, the command in words), so that nothing
    between the question and the run's last step is another command's: a second admin's
    change or second replace-ssd run on its devices while the question waits is refused
    (exit 3, naming this run), not let through to be found changed after the answer."""
    require_root("replace-ssd")
    ctl = ctl or Control(what=f"replace-ssd {replace.kind_of(j.kind).short(j.cset)}")
    fresh = not j.done  # a plan: a journaled run has preflight and remember done
    with _owning(j, fresh=fresh):
        if fresh:
            for line in _record_again(sysfs, j):
                ctl.note(line)
            ctl.ask(Plan(command or f"replace-ssd {j.cset}", tuple(plan_lines(sysfs, j))))
        done = replace.execute(sysfs, j, **_hooks(ctl))
    return Result(lines=[replace.kind_of(done.kind).done_line(done), timing_line(done)],
                  data=journal_json(done), value=done)


def timing_line(j: replace.Journal) -> str:
    """Where a run's time went: its steps' wall time, the drain's part, and the slowest
    other steps (a resumed run counts every attempt; the operator's swap is in wait-new)."""
    total = sum(j.seconds.values())
    drain = j.seconds.get("drain", 0.0)
    others = sorted(((v, k) for k, v in j.seconds.items() if k != "drain"), reverse=True)
    slow = ", ".join(f"{k} {v:.1f} s" for v, k in others[:3] if v >= 0.05)
    return (f"took {total:.1f} s: drain {drain:.1f} s, the other steps "
            f"{total - drain:.1f} s" + (f" ({slow})" if slow else ""))


def load(run_id: str) -> replace.Journal:
    """Run ``run_id``'s journal; exit 2 if there is none or it cannot be read (its path and
    why). Only to show it: run, resume and rollback read it again under the set's lock."""
    return replace.Journal.load(run_id)


def resume(sysfs: Sysfs, run_id: str, *, ctl: Control | None = None) -> Result:
    """Finish an interrupted run; one already done is "already so". A journal that cannot
    be read is refused (exit 2, its path and why); the journal is read again under the cache
    set's lock before any step (replace.execute)."""
    require_root("replace-ssd")
    j = replace.Journal.load(run_id)
    if j.status == "done":
        return Result(lines=[f"{j.id}: already done"], already=True, data=journal_json(j),
                      value=j)
    return run(sysfs, j, ctl=ctl)


def rollback(sysfs: Sysfs, run_id: str, *, ctl: Control | None = None) -> Result:
    """Undo a run that stopped before its kind's point of no return (``Kind``: bcache's
    'unregister', LVM's 'remove-old-cache', dm-cache's 'release-old')."""
    require_root("replace-ssd")
    ctl = ctl or Control(what=f"replace-ssd rollback {run_id}")
    say = ctl.say or ctl.progress  # not ctl.note: a rollback is not cut short halfway
    j = replace.Journal.load(run_id)
    with _owning(j, "replace-ssd rollback"):
        j = replace.rollback(sysfs, j, say=say)
    return Result(lines=[f"{j.id}: rolled back"], data=journal_json(j), value=j)

