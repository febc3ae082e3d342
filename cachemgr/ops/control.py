"""What every command takes and gives: a :class:`Control` in (progress out, cancellation
in, operator prompts), a :class:`Result` out, and the words every face shows for them.

Cancelling is cooperative and safe: :meth:`Control.report` raises
:class:`~cachemgr.core.errors.Cancelled` at the library's next progress report, that is between two
polls of its own loop, so the library's ``finally`` blocks run as for Ctrl-C in the CLI (a drain
restores its tunables, a dm-cache flush reloads the original table, bench restores its
hygiene). A thread is never killed from outside.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cachemgr.core.change import Change
from cachemgr.core.errors import Cancelled, UnsafeError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.model import human
from cachemgr.ops import trail


def _no_progress(_p: object) -> None:
    pass


@dataclass(frozen=True)
class Plan:
    """A change a command is about to make and has not made: what a face shows before it
    asks (docs/cli.md, "Confirmations"). ``command``: the command as typed, in words
    ("remove /dev/bcache0"); ``lines``: what it would do, each in the conditional ("would
    stop /dev/bcache0: ...") or as a plan step, never as done."""

    command: str
    lines: tuple[str, ...]


def not_confirmed(plan: Plan, why: str = "not confirmed", hint: str | None = None
                  ) -> UnsafeError:
    """The refusal of a change nobody confirmed (exit 3, refused as unsafe)."""
    return UnsafeError(f"{plan.command}: {why}; nothing was changed", hint=hint)


@dataclass
class Control:
    """What a running command gets from its face."""

    progress: Callable[[Any], None] = _no_progress
    cancel: threading.Event = field(default_factory=threading.Event)
    what: str = "operation"
    # an operator prompt (the SSD swap): returns True when the operator confirmed; None: no
    # operator (the command proceeds on its own, as --yes)
    prompt: Callable[[str], bool] | None = None
    # free-text step reports (replace-ssd's step log); default: to progress
    say: Callable[[str], None] | None = None
    # the question before a change that can lose data or disrupt a VM (remove, detach, a
    # mode that drops the cache, stop-set, force-run, create over a signature): shown the
    # plan, True to go ahead; False refuses (exit 3, nothing changed). None: no question
    # here (the TUI asked in its own dialog before it called; the CLI with --yes)
    confirm: Callable[[Plan], bool] | None = None

    def check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled(f"{self.what} cancelled by the operator",
                            hint="what the library changed for it was put back")

    def report(self, p: object) -> None:
        self.check()
        self.progress(p)

    def note(self, line: str) -> None:
        self.check()
        (self.say or self.progress)(line)

    @property
    def asks(self) -> bool:
        """Whether :meth:`ask` puts a question (the plan is worth computing)."""
        return self.confirm is not None

    def ask(self, plan: Plan) -> bool:
        """Ask the face to confirm ``plan``; raises :func:`not_confirmed` when it says no.
        True when a question was put and answered yes (the command reads its device again
        before it acts: the answer may have taken a while), False when there is none."""
        if self.confirm is None:
            return False
        if not self.confirm(plan):
            raise not_confirmed(plan)
        return True


@dataclass
class Result:
    """What a command did. ``lines`` are its data (the CLI's stdout), ``notes`` its remarks
    (stderr); ``data`` is the ``--json`` document (schema 1)."""

    changes: list[Change] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    already: bool = False  # "already so" (exit 4): nothing changed
    failed: bool = False  # done, but with failures the lines/data describe (exit 1)
    # done, but something was refused as unsafe (the lines/data say what): exit 3 unless
    # something failed too (the boot pass: everything else it could do is done)
    refused: bool = False
    data: dict[str, Any] | None = None
    value: Any = None  # the typed result for callers that want more than words

    def __post_init__(self) -> None:
        trail.saw(self)  # the journal trail's outcome: the last Result a command built

    @property
    def exit_code(self) -> ExitCode:
        if self.failed:
            return ExitCode.FAILED
        if self.refused:
            return ExitCode.UNSAFE
        return ExitCode.ALREADY if self.already else ExitCode.OK

    def text(self) -> list[str]:
        return change_lines(self.changes) + self.lines

    def json(self) -> dict[str, Any]:
        if self.data is not None:
            return self.data
        doc: dict[str, Any] = {"schema": 1, "changes": [
            {"target": c.target, "what": c.what, "before": c.before, "after": c.after}
            for c in self.changes]}
        if self.already:  # docs/json.md, "Errors and already so"
            doc.update(already=True, message="; ".join(
                n.removeprefix("cachemgr: ") for n in self.notes))
        return doc


# a change that is an act rather than a value that changed, in the words of what was done:
# (when there was nothing before, when nothing is left); None: not said that way
ACTS: dict[str, tuple[str | None, str | None]] = {
    "register": ("{after}", None),
    "unregister": (None, "unregistered (was {before})"),
    "stop": (None, "stopped (was {before})"),
    "format": ("formatted as {after}", None),
    "create": ("created: {after}", None),
    "attach": ("attached to cache set {after}", None),
    "detach": (None, "detached from cache set {before}"),
    "remove": (None, "removed (was {before})"),
}
# what None stands for in a value that changed: an LV's cache (lvm2) is "none" before an
# attach and after an uncache; anything else None is a value the kernel did not say
NONE_WORDS = {"cache": "none"}


def change_words(c: Change) -> str:
    """One change after it was made, in words: ``TARGET: what before -> after``, or what was
    done (``/dev/ubdb: registered``, ``/dev/bcache0: detached from cache set X``). Never
    Python's ``None``: JSON keeps the null (Result.json)."""
    if c.before is None and c.after is None:
        return f"{c.target}: {c.what} done"
    on_after, on_before = ACTS.get(c.what, (None, None))
    if c.before is None and on_after is not None:
        return f"{c.target}: " + on_after.format(after=c.after)
    if c.after is None and on_before is not None:
        return f"{c.target}: " + on_before.format(before=c.before)
    none = NONE_WORDS.get(c.what, "unknown")
    before = none if c.before is None else c.before
    after = none if c.after is None else c.after
    return f"{c.target}: {c.what} {before} -> {after}"


def change_lines(changes: list[Change]) -> list[str]:
    """One line per change (:func:`change_words`)."""
    return [change_words(c) for c in changes]


def progress_line(p: object, *, note: bool = True) -> str:
    """One line for a progress report, the same in the CLI (stderr) and the TUI; ``note``
    False leaves out the report's words of why (a terminal prints them on a line of their
    own when they change)."""
    if isinstance(p, str):
        return p
    action = getattr(p, "action", "drain")
    device = getattr(p, "device", None)
    if device is None or action in ("warm", "scrub"):  # says itself (WarmProgress, ScrubProgress)
        return str(p)
    dirty = getattr(p, "dirty_bytes", None)
    if action == "detach":
        shown = human(dirty) if dirty is not None else "?"
        return f"detach {device}: {getattr(p, 'state', '?')}, dirty {shown}"
    frac = getattr(p, "fraction", None)
    rate_bps = getattr(p, "rate_bps", None)
    eta_s = getattr(p, "eta_s", None)
    pct = f"{100 * frac:5.1f}%" if frac is not None else "   ?% "
    rate = f"{human(int(rate_bps))}/s" if rate_bps else "-"
    eta = f"{eta_s:.0f} s" if eta_s is not None else "-"
    why = getattr(p, "note", None) if note else None
    return (f"drain {device}: {pct} dirty {human(dirty)} rate {rate} "
            f"ETA {eta} ({getattr(p, 'elapsed_s', 0.0):.0f} s)" + (f"; {why}" if why else ""))
