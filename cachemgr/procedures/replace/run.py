"""The engine every kind of replacement runs on: the kinds by name (:data:`KINDS`,
:func:`kind_of`), which kind a cache is (:func:`recognise`: each kind asked), the plan
in words (:func:`describe`), and :func:`execute` and :func:`rollback`, which hold the cache's
lock, read the journal again under it, and run (or undo) the steps not yet journaled as done.
A run's context (:class:`Ctx`) and what a kind is (:class:`Kind`) are in base.py, below the
kinds' modules, and re-exported here."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from cachemgr.backends import hotplug
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.replace.base import Ctx as Ctx
from cachemgr.procedures.replace.base import Kind as Kind
from cachemgr.procedures.replace.base import Prompt as Prompt
from cachemgr.procedures.replace.base import Say as Say
from cachemgr.procedures.replace.journal import Journal as Journal
from cachemgr.procedures.replace.journal import Options as Options

# the package's one logger, named as before the package was split into modules
log = logging.getLogger(__package__)

def _bcache() -> Kind:
    from cachemgr.procedures.replace import bcache

    return bcache.KIND


def _lvm() -> Kind:
    from cachemgr.procedures.replace import lvm

    return lvm.KIND


def _dmcache() -> Kind:
    from cachemgr.procedures.replace import dmcache

    return dmcache.KIND


# The kinds, by the name a journal gives its kind (journal.KIND_NAMES, in that order: the
# order faces list them in), each module loaded when first asked for. Everything a face or
# the command layer decides by kind is asked of these (:func:`recognise`, :func:`plan_cache`,
# a kind's fields): a new kind is its module and its line here.
KINDS: dict[str, Callable[[], Kind]] = {"bcache": _bcache, "lvm": _lvm, "dmcache": _dmcache}


def kinds() -> tuple[Kind, ...]:
    """Every kind, in :data:`KINDS`' order (each module loaded)."""
    return tuple(load() for load in KINDS.values())


def fallback() -> Kind:
    """The kind of a cache no other kind claims (``Kind.fallback``)."""
    return next(k for k in kinds() if k.fallback)


def kind_of(name: str) -> Kind:
    """The kind a journal's ``kind`` names (:data:`KINDS`; the fallback kind, bcache, for
    any other name). Only that kind's module is loaded."""
    load = KINDS.get(name)
    return load() if load is not None else fallback()


def recognise(cache: str, sysfs: Sysfs | None = None,
              snap: Snapshot | None = None) -> tuple[Kind, object]:
    """The kind of replacement ``cache`` (replace-ssd's CACHE) takes, and what that kind
    found it names: each kind asked in turn (``Kind.claims``), the fallback kind last.
    Without ``sysfs`` (and ``snap``) only what the name's spelling tells."""
    for k in kinds():
        if not k.fallback:
            found = k.claims(cache, sysfs, snap)
            if found is not None:
                return k, found
    k = fallback()
    return k, k.claims(cache, sysfs, snap)


def plan_cache(sysfs: Sysfs, cache: str, opts: Options) -> Journal:
    """The plan of a run on ``cache``, made by the kind that claims it (:func:`recognise`):
    everything checked, what is to be restored recorded; nothing changed."""
    kind, found = recognise(cache, sysfs)
    return kind.plan(sysfs, cache, opts, found)


def named_by(j: Journal, spec: str) -> bool:
    """``spec``, spelt as replace-ssd takes its CACHE, names run ``j``'s cache (its kind
    says: ``Kind.names_run``) or its old SSD; told from the journal alone, so it holds once
    the old SSD is gone."""
    spec = spec.strip()
    return bool(spec) and (kind_of(j.kind).names_run(j, spec) or j.names_old_ssd(spec))


def json_fields(j: Journal) -> dict[str, Any]:
    """The kinds' own fields of ``replace-ssd --json`` (docs/json.md): those of run ``j``'s
    kind filled, every other kind's null, in :data:`KINDS`' order."""
    mine = kind_of(j.kind)
    out: dict[str, Any] = {}
    for k in kinds():
        out.update(k.json(j) if k is mine else dict.fromkeys(k.json(j)))
    return out


# --------------------------------------------------------------------------------- the plan


def new_words(j: Journal) -> str:
    """What --new asks for, in words."""
    old = j.old
    new = str(j.options["new"])
    return {"same": f"the same SSD re-inserted ({old['wwid'] or 'serial ' + str(old['serial'])})",
            "any": f"a new disk in the same slot ({hotplug.slot_words(old)}) (operator swap)",
            }.get(new, new)


def describe(j: Journal) -> list[str]:
    """The plan in full, as --dry-run prints it: the kind's own head, then what every kind
    says (the new SSD, the hotplug method), then the steps."""
    o = j.options
    lines = [*kind_of(j.kind).head(j), f"new SSD: {new_words(j)}",
             f"hotplug: {hotplug.method_words(j.old)}", ""]
    for i, (name, text) in enumerate(j.steps, 1):
        extra = ""
        if name == "mode-interim":
            extra = f" ({o['interim_mode']})"
        elif name == "wipe-old" and not o["wipe_old"]:
            extra = " (skipped: --keep-old-signature)"
        elif name == "warm":
            extra = f" (from {o['warm']})" if o.get("warm") else " (skipped: no --warm)"
        lines.append(f"{i:2d}. {name:<13} {text}{extra}")
    return lines


# --------------------------------------------------------------------------------- running


def _default_prompt(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
    try:
        input()
    except EOFError:
        raise UsageError("no operator input (stdin closed)",
                         hint="pass --yes when the new disk is already in") from None


def _reload(j: Journal) -> None:
    """Bring ``j`` up to its journal on disk, read while holding the cache set's lock (a
    journal read before the lock may be stale: another run may have moved it on since). A
    fresh plan has no journal yet; a journal of the same id from another run is refused."""
    disk = Journal.read(j.path)
    if disk is None:
        if j.done:
            raise UsageError(f"run {j.id}: its journal {j.path} is gone",
                             hint="cachemgr replace-ssd --list shows the journaled runs")
        return
    if (disk.cset, disk.created) != (j.cset, j.created):
        raise UsageError(f"run id {j.id} is taken by another run (journal {j.path})",
                         hint="plan again: the new run gets another id")
    for f in dataclasses.fields(Journal):
        setattr(j, f.name, getattr(disk, f.name))


def execute(sysfs: Sysfs, j: Journal, *, say: Say | None = None,
            prompt: Prompt | None = None) -> Journal:
    """Run (or resume) the steps not yet journaled as done, holding the cache's lock."""
    kind = kind_of(j.kind)
    with state.locked(f"replace-{j.cset}", f"{kind.what} {j.cset}"):
        _reload(j)
        opts = Options(**j.options)
        ctx = Ctx(sysfs, j, opts, say or (lambda m: log.info("%s", m)),
                  prompt or _default_prompt)
        if j.status == "done":
            raise AlreadyError(f"run {j.id} is already done")
        if j.status == "rolled-back":
            raise UsageError(f"run {j.id} was rolled back")
        j.status, j.error = "running", None
        for step in ("preflight", "remember"):
            if step not in j.done:
                j.mark(step)
        names = [name for name, _ in kind.steps]
        for i, step in enumerate(names, 1):
            if step in j.done:
                continue
            ctx.say(f"[{i}/{len(names)}] {step}")
            state.update_holder(step=step)  # what the lock files say: status, refusals
            t0 = time.monotonic()
            try:
                kind.funcs[step](ctx)
            except CacheMgrError as exc:
                j.took(step, time.monotonic() - t0)
                j.status, j.error = "failed", f"{step}: {exc.message}"
                j.save()
                safe = names.index(step) <= names.index(kind.point_of_no_return)
                exc.hint = ((exc.hint + "; ") if exc.hint else "") + (
                    f"fix the cause, then: cachemgr replace-ssd --resume {j.id}"
                    + (f" (or --rollback {j.id} to put modes back)" if safe else ""))
                raise
            j.took(step, time.monotonic() - t0)
            j.mark(step)
        j.status = "done"
        j.save()
    return j


def rollback(sysfs: Sysfs, j: Journal, *, say: Say | None = None) -> Journal:
    """Undo a run that stopped before its point of no return (the old cache still there)."""
    say = say or (lambda m: log.info("%s", m))
    kind = kind_of(j.kind)
    with state.locked(f"replace-{j.cset}", f"{kind.what} {j.cset}"):
        _reload(j)
        if kind.point_of_no_return in j.done:
            raise UnsafeError(f"run {j.id} is past '{kind.point_of_no_return}': the old cache "
                              "is gone, so only finishing it is safe",
                              hint=f"cachemgr replace-ssd --resume {j.id}")
        if j.status == "done":
            raise AlreadyError(f"run {j.id} finished; nothing to roll back")
        kind.rollback(Ctx(sysfs, j, Options(**j.options), say, _default_prompt))
        j.status = "rolled-back"
        j.save()
    return j
