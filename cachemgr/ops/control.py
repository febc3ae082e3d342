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
from cachemgr.core.errors import Cancelled
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.model import human
from cachemgr.ops import trail


def _no_progress(_p: object) -> None:
    pass


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


@dataclass
class Result:
    """What a command did. ``lines`` are its data (the CLI's stdout), ``notes`` its remarks
    (stderr); ``data`` is the ``--json`` document (schema 1)."""

    changes: list[Change] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    already: bool = False  # "already so" (exit 4): nothing changed
    failed: bool = False  # done, but with failures the lines/data describe (exit 1)
    data: dict[str, Any] | None = None
    value: Any = None  # the typed result for callers that want more than words

    def __post_init__(self) -> None:
        trail.saw(self)  # the journal trail's outcome: the last Result a command built

    @property
    def exit_code(self) -> ExitCode:
        if self.failed:
            return ExitCode.FAILED
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


def change_lines(changes: list[Change]) -> list[str]:
    """``TARGET: what before -> after`` (or ``done``), one line per change."""
    out = []
    for c in changes:
        arrow = f"{c.before} -> {c.after}" if c.before or c.after else "done"
        out.append(f"{c.target}: {c.what} {arrow}")
    return out


def progress_line(p: object, *, note: bool = True) -> str:
    """One line for a progress report, the same in the CLI (stderr) and the TUI; ``note``
    False leaves out the report's words of why (a terminal prints them on a line of their
    own when they change)."""
    if isinstance(p, str):
        return p
    action = getattr(p, "action", "drain")
    device = getattr(p, "device", None)
    if device is None:
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
