"""The engine every kind of replacement runs on: the kinds by name (:func:`kind_of`), the plan
in words (:func:`describe`), and :func:`execute` and :func:`rollback`, which hold the cache's
lock, read the journal again under it, and run (or undo) the steps not yet journaled as done.
A run's context (:class:`Ctx`) and what a kind is (:class:`Kind`) are in base.py, below the
kinds' modules, and re-exported here."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

from cachemgr.backends import hotplug
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.replace.base import Ctx as Ctx
from cachemgr.procedures.replace.base import Kind as Kind
from cachemgr.procedures.replace.base import Prompt as Prompt
from cachemgr.procedures.replace.base import Say as Say
from cachemgr.procedures.replace.journal import Journal as Journal
from cachemgr.procedures.replace.journal import Options as Options

# the package's one logger, named as before the package was split into modules
log = logging.getLogger(__package__)

def kind_of(name: str) -> Kind:
    """The kind a journal's ``kind`` names (:data:`journal.KIND_NAMES`; bcache for any other
    name). Each kind's module is loaded when it is first asked for."""
    if name == "lvm":
        from cachemgr.procedures.replace import lvm

        return lvm.KIND
    if name == "dmcache":
        from cachemgr.procedures.replace import dmcache

        return dmcache.KIND
    from cachemgr.procedures.replace import bcache

    return bcache.KIND


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
