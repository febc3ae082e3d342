"""The one gate every change passes.

Every command that changes a device or its cache (mode, tune, drain, attach, detach, create,
register, assemble, remove, force-run, stop-set, each replace-ssd run, bench, warm,
invalidate, scrub, autoattach's actions, vm-cache, scheduler set) enters :func:`gate` with
the objects it acts on (a :class:`Subject`). The gate

1. refuses, exit 2, what a cache kind of the subject does not declare: :data:`NEEDS` is the
   one capability table, every action it lets in with the capability it needs (an action
   missing there is a defect, refused, never let through unchecked); an object yet to be
   made (create, register, assemble) is asked of its kind's class;
2. takes the lock of every object (the device's and its cache's: procedures/owners.py has the
   keys), recording in each lock file who holds it (the procedure, its run ID and step, since
   when): another run holding one of them is refused, exit 3, by a message naming it
   (core/state.py ``BusyError``);
3. refuses, exit 3, while a procedure whose process is gone still owns one of them (its
   journal is there: an interrupted drain left tunables changed, a replace-ssd run left its
   devices in mode none): the message names it and the command that resumes (or rolls back)
   it; only that procedure's own resume passes (``takes_over``);
4. logs the change (who, what, on what) at INFO on the ``cachemgr.gate`` logger, and
   records it for the system journal's trail (cachemgr/ops/trail.py: the command's changes,
   refusals and failures, written when the command ends).

A command that asks first makes the same checks before its question (:func:`precheck`, in
the same order and words, taking no lock).

Procedures that run for a while own their objects for the whole run: a replace-ssd run enters
the gate once, for every device of its cache, and its steps (and the drains it runs in worker
threads, which act for it: ``state.acting_as``) re-enter the same locks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.core import state, undo
from cachemgr.core.errors import UnsafeError
from cachemgr.core.model import BcacheBacking, CacheSet, Owner, Snapshot
from cachemgr.ops import trail
from cachemgr.procedures import kinds
from cachemgr.procedures import owners as owners_mod
from cachemgr.procedures.kinds import Kind

log = logging.getLogger("cachemgr.gate")


@dataclass(frozen=True)
class Subject:
    """What a change acts on: its name in messages, the locks it needs (key, words) and the
    cache kinds whose capabilities the gate checks (:data:`NEEDS`): each object of a kind it
    acts on, or a kind's class where the object is yet to be (a create, a register)."""

    what: str
    locks: tuple[tuple[str, str], ...]
    kinds: tuple[Kind | type[Kind], ...] = ()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(k for k, _ in self.locks)

    def __add__(self, other: Subject) -> Subject:
        seen = dict(self.locks)
        return Subject(self.what, self.locks + tuple(
            (k, w) for k, w in other.locks if k not in seen),
            self.kinds + tuple(k for k in other.kinds if k not in self.kinds))


def of_kind(k: Kind) -> Subject:
    """One object of a cache kind: its own lock and its cache's, and its capabilities."""
    return Subject(k.node, tuple(k.locks), (k,))


def of_backing(b: BcacheBacking) -> Subject:
    """A bcache backing device (the udev worker's actions name it so)."""
    return of_kind(kinds.Bcache(b))


def of_cache_set(c: CacheSet, snap: Snapshot | None = None) -> Subject:
    """A cache set, with every backing device attached to it (a set-wide change reaches
    them all)."""
    out = of_kind(kinds.BcacheSet(c))
    if snap is not None:
        for b in snap.backings:
            if b.cset_uuid == c.uuid:
                out = out + Subject(c.uuid, kinds.Bcache(b).locks[:1])
    return out


def of_names(what: str, keys: Sequence[str], *made: type[Kind]) -> Subject:
    """Objects named by their keys alone (a disk being formatted, a VM's disk); ``made``:
    the kinds of the objects the command makes or assembles there."""
    return Subject(what, tuple((k, what) for k in keys), made)


def of_disks(nodes: Sequence[str], *made: type[Kind]) -> Subject:
    """Disks a command formats or assembles (create): keyed by their kernel names, so two
    commands that would format one disk never run at once; ``made``: the kinds whose
    objects the command makes of them (their capability is checked)."""
    names = [os.path.basename(os.path.realpath(n)) for n in nodes if n]
    return Subject(", ".join(n for n in nodes if n),
                   tuple((f"disk-{n}", f"/dev/{n}") for n in dict.fromkeys(names)), made)


def claims(subject: Subject) -> list[Owner]:
    """The interrupted procedures whose journals claim an object of ``subject``."""
    return [o for o in owners_mod.interrupted() if o.keys & subject.keys]


def refusal(subject: Subject, o: Owner) -> UnsafeError:
    """An interrupted procedure owns ``subject``: exit 3, one line naming it."""
    return UnsafeError(f"{subject.what} is owned by {o.words()}; nothing was changed",
                       hint=o.next_step())


# THE CAPABILITY TABLE: every action the gate lets in, and the capability (a word of
# kinds.ACTIONS) each kind of its subject must declare for it. None: it changes no cache
# object of a kind (a disk's IO scheduler, a VM's cache mode, a restore putting back what an
# interrupted procedure left). An action missing here is refused by the gate (a defect: the
# command would skip the capability check), never let through unchecked.
NEEDS: dict[str, str | None] = {
    "mode": "mode", "mode --drain": "mode", "drain": "drain", "drain --resume": "drain",
    "detach": "detach", "attach": "attach", "remove": "remove", "tune": "tune",
    "force-run": "force-run", "stop-set": "stop-set", "warm": "warm",
    "invalidate": "invalidate", "scrub": "scrub", "bench": "bench",
    "snapshot": "snapshot", "governor": "tune",
    "replace-ssd": "replace", "replace-ssd rollback": "replace",
    "create": "create", "create bcache": "create", "create dm-cache": "create",
    "register": "register", "assemble dm-cache": "assemble",
    # the udev worker's and the boot pass's actions (ops/autoattach.py)
    "autoattach attach": "attach", "autoattach setmode": "mode",
    "autoattach settunable": "tune", "autoattach register": "register",
    "autoattach format": "create", "autoattach assemble dm-cache": "assemble",
    "autoattach scheduler": None, "scheduler": None, "vm-cache": None, "restore": None,
}


def capability(action: str) -> str | None:
    """The capability ``action`` needs (:data:`NEEDS`); an action the table does not list
    is a defect of the command that names it (ValueError), not a pass."""
    try:
        return NEEDS[action]
    except KeyError:
        raise ValueError(f"the gate has no capability for the action {action!r}: "
                         "add it to cachemgr/ops/gate.py NEEDS") from None


def refuse_incapable(subject: Subject, action: str, *, needs: str | None = None) -> None:
    """Raise (exit 2, UsageError: nothing is changed) the refusal of the first kind of
    ``subject`` that does not declare the capability ``action`` needs (``needs``: that
    capability, given)."""
    cap = needs or capability(action)
    if cap is None:
        return
    for k in subject.kinds:
        err = k.refusal(cap) if isinstance(k, Kind) else k.declines(cap, subject.what)
        if err is not None:
            raise err


def precheck(subject: Subject, action: str, *,
             takes_over: Callable[[Owner], bool] | None = None, needs: str | None = None,
             check_kind: bool = True) -> list[str]:
    """The gate's refusals before a question (or a plan shown before a run), with the rules
    and words of :func:`gate` and in its order, taking no lock: what a kind of the subject
    cannot do (:func:`refuse_incapable`, exit 2); as root, a run holding one of its locks
    (exit 3, naming it) and an interrupted procedure owning one that ``takes_over`` does not
    accept (exit 3). The settings an interrupted procedure left changed for a while (its
    undo journal, core/undo.py: a bench killed mid-run) refuse nothing, as in the gate, which
    puts them back first: the lines returned say so, for the question. Another user than
    root is refused by the command itself (the gate takes no lock for it)."""
    if check_kind:
        refuse_incapable(subject, action, needs=needs)
    if os.geteuid() != 0:
        return []
    for key, words in sorted(subject.locks):
        holder = state.current_holder(key)
        if holder is not None:
            raise state.BusyError(words, holder)
    first: list[str] = []
    for o in claims(subject):
        if owners_mod.undo_journal(o):
            since = (f" (since {time.strftime('%H:%M:%S', time.localtime(o.since))})"
                     if o.since is not None else "")
            first.append(f"would first put back what an interrupted {o.procedure}{since} "
                         f"left changed on {o.device}")
        elif not (takes_over and takes_over(o)):
            raise refusal(subject, o)
    return first


def check(subject: Subject, action: str, *,
          takes_over: Callable[[Owner], bool] | None = None) -> list[str]:
    """:func:`precheck` for a plan shown before it runs (replace-ssd's, an assembly's)."""
    return precheck(subject, action, takes_over=takes_over)


def resumes(*procedures: str, run: str | None = None) -> Callable[[Owner], bool]:
    """A ``takes_over`` that lets through the interrupted ``procedures`` (a drain resumes a
    drain) and the replace-ssd run ``run``."""
    def ok(o: Owner) -> bool:
        return o.procedure in procedures or (run is not None and o.run == run)

    return ok


# Actions that can run for minutes (a drain, a flush before a detach or a removal, a
# bench): their start goes to the journal trail when the gate lets them in, as well as their
# end; so do procedures with a run ID (replace-ssd).
LONG_ACTIONS = frozenset({"drain", "mode --drain", "bench", "remove", "detach", "scrub"})


@contextlib.contextmanager
def gate(subject: Subject, action: str, *, takes_over: Callable[[Owner], bool] | None = None,
         run: str | None = None, detail: dict[str, Any] | None = None,
         needs: str | None = None, check_kind: bool = True,
         said: list[str] | None = None) -> Iterator[None]:
    """:func:`_gate`, its entry and its outcome recorded for the journal trail."""
    with trail.gated(action, subject.what, run=run, detail=detail), _gate(
            subject, action, takes_over=takes_over, run=run, detail=detail, needs=needs,
            check_kind=check_kind, said=said):
        if run is not None or action in LONG_ACTIONS:
            # written now, not only at its end: a run killed outright leaves its start
            trail.started(action, subject.what, run=run, detail=detail)
        yield


@contextlib.contextmanager
def _gate(subject: Subject, action: str, *, takes_over: Callable[[Owner], bool] | None = None,
          run: str | None = None, detail: dict[str, Any] | None = None,
          needs: str | None = None, check_kind: bool = True,
          said: list[str] | None = None) -> Iterator[None]:
    """Refuse (exit 2, nothing changed) what a kind of the subject cannot do (``needs``:
    the capability, by default the one :data:`NEEDS` gives ``action``); hold every lock of
    ``subject`` for ``action`` and refuse while another run holds one, or an interrupted
    procedure owns one that ``takes_over`` does not accept. ``run``: a procedure's run ID,
    recorded in the lock files. Settings an interrupted procedure left changed for a while
    (its undo journal, core/undo.py) are put back first; ``said`` gets the words."""
    if check_kind:
        refuse_incapable(subject, action, needs=needs)
    if os.geteuid() != 0:
        # changes nothing: the kernel and lvm2 take changes from root only, and the command
        # refuses with its own words (needs root) after its own checks; the locks and the
        # journals are root's
        yield
        return
    holder: dict[str, Any] = {"procedure": action}
    if run:
        holder["run"] = run
    with contextlib.ExitStack() as stack:
        # in one order for every command (the keys'): a device's command locks (device, set)
        # and a set's (set, devices); in their own orders, two at once could each take one
        # lock and, LOCK_NB, both be refused
        for key, words in sorted(subject.locks):
            stack.enter_context(state.locked(key, words, holder=holder))
        for o in claims(subject):
            if owners_mod.undo_journal(o):
                # every object it claims locked by us before anything is written: its
                # process is gone then, and no other command is on them
                for key in sorted(o.keys - subject.keys):
                    stack.enter_context(state.locked(key, o.device, holder=holder))
                back = put_back(o)
                if said is not None:
                    said.extend(back)
            elif not (takes_over and takes_over(o)):
                raise refusal(subject, o)
        log.info("%s on %s (user %s, pid %d)%s", action, subject.what, _user(), os.getpid(),
                 f" {detail}" if detail else "")
        yield


def put_back(o: Owner) -> list[str]:
    """Put back what an interrupted procedure changed for a while (its undo journal,
    core/undo.py), saying so on the log (stderr, and the system journal); the words."""
    j = undo.load(Path(o.journal or ""))
    if j is None:
        return []
    said = undo.put_back(j)
    log.warning("%s: put back what an interrupted %s (since %s) left changed: %s", j.device,
                j.procedure, time.strftime("%H:%M:%S", time.localtime(j.started)),
                "; ".join(said) or "nothing")
    trail.put_back(j.device, j.procedure, said)
    return said


_user = trail.user  # who asked: the sudo user when there is one, else the process's user
