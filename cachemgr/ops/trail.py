"""The journal trail: who changed which cache, when, from what to what (docs/admin-guide.md,
"The journal trail").

Every change passes the gate (cachemgr/ops/gate.py), which records each entry into it here
(:func:`gated`: the action, the object, a procedure's run ID, and whether the gate's block
ended by an exception). A command's outcome is known to whoever ran it:

* the CLI opens a frame for the whole command (:func:`command`, in cachemgr/cli/main.py) and
  tells it the exit code and the error; the Result it prints is the last one built;
* anything else (the TUI, which runs ops functions in worker threads; the udev worker) has
  no frame of its own: the outermost gate of a thread opens one and writes it when the
  gate's block ends (the Result built inside the block is the one written, so the ops
  functions build theirs there: tune's names each setting's old and new value; one built
  after the gate would be written with the gate's words only).

A long action (a drain, a flush, a bench, a replace-ssd run: gate.LONG_ACTIONS, or any with
a run ID) also writes a ``started`` entry when the gate lets it in (:func:`started`), so a
run killed outright still leaves its start in the journal.

Written to the system journal (cachemgr/backends/journal.py), one entry per change:
MESSAGE, PRIORITY (NOTICE a change, INFO a refusal, WARNING a failure), SYSLOG_IDENTIFIER
``cachemgr`` and CACHEMGR_* fields. A command that entered no gate (a read-only one) writes
nothing, except a refusal (exit 3): who tried what, refused why. "Already so" (exit 4) and
usage errors (exit 2) changed nothing and are not written. Never fails a command.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachemgr.backends import journal
from cachemgr.core.change import Change
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.text import printable

log = logging.getLogger("cachemgr.trail")


class Result(Protocol):
    """What the trail reads of a command's result (``cachemgr.ops.control.Result``, which
    calls :func:`saw` as it is built: a protocol here, so the trail stays below it)."""

    @property
    def changes(self) -> list[Change]: ...
    @property
    def already(self) -> bool: ...
    @property
    def failed(self) -> bool: ...
    @property
    def exit_code(self) -> ExitCode: ...


@dataclass
class Attempt:
    """One entry into the gate: ``error`` is what ended its block, if anything did."""

    action: str
    what: str
    run: str | None = None
    detail: dict[str, Any] | None = None
    error: BaseException | None = None


@dataclass
class Frame:
    """One command's trail: its gate entries, the Result it built, settings the gate put
    back for an interrupted procedure, and its end (exit code, error)."""

    command: str
    target: str | None = None  # the face's words for what it acts on (a refusal's target)
    attempts: list[Attempt] = field(default_factory=list)
    result: Result | None = None
    put_back: list[tuple[str, str, list[str]]] = field(default_factory=list)
    exit: int | None = None
    error: BaseException | None = None
    plan: bool = False  # a dry run: it changes nothing, and its refusals are not attempts


_local = threading.local()


def current() -> Frame | None:
    stack: list[Frame] = getattr(_local, "stack", [])
    return stack[-1] if stack else None


@contextlib.contextmanager
def _pushed(frame: Frame) -> Iterator[Frame]:
    stack: list[Frame] = _local.__dict__.setdefault("stack", [])
    stack.append(frame)
    try:
        yield frame
    finally:
        stack.remove(frame)


@contextlib.contextmanager
def command(words: str, *, target: str | None = None, plan: bool = False
            ) -> Iterator[Frame]:
    """A face's frame for one command: the caller sets ``exit`` (and ``error``) on it; the
    trail is written when the block ends."""
    with _pushed(Frame(words, target=target, plan=plan)) as frame:
        try:
            yield frame
        finally:
            write(frame)


@contextlib.contextmanager
def gated(action: str, what: str, *, run: str | None = None,
          detail: dict[str, Any] | None = None) -> Iterator[None]:
    """The gate's entry (recorded before its refusals, which are attempts too). With no
    frame in this thread, the outermost gate's is the command's: written at its end."""
    attempt = Attempt(action, what, run, detail)
    frame = current()
    own = frame is None
    with contextlib.ExitStack() as stack:
        if frame is None:
            frame = stack.enter_context(_pushed(Frame(action)))
        frame.attempts.append(attempt)
        try:
            yield
        except BaseException as exc:
            attempt.error = exc
            if own:
                frame.error, frame.exit = exc, exit_of(exc)
            raise
        finally:
            if own:
                if frame.exit is None:
                    frame.exit = int(frame.result.exit_code) if frame.result else 0
                write(frame)


def started(action: str, what: str, *, run: str | None = None,
            detail: dict[str, Any] | None = None) -> None:
    """A long action was let in by the gate: written at once (INFO, outcome ``started``),
    so that a run killed outright (SIGKILL, a power cut) leaves who started what, when.
    Its end is written as every change's is."""
    frame = current()
    f: Fields = [("MESSAGE", printable(
                     f"{action} on {what} started" + (f" (run {run})" if run else "")
                     + (f" ({_words(detail)})" if detail else "") + f" (by {user()})")),
                 ("PRIORITY", str(journal.INFO)), ("SYSLOG_IDENTIFIER", "cachemgr"),
                 ("CACHEMGR_COMMAND", frame.command if frame else action),
                 ("CACHEMGR_OUTCOME", "started"), ("CACHEMGR_USER", user()),
                 ("CACHEMGR_ACTION", action), ("CACHEMGR_TARGET", what)]
    if run:
        f.append(("CACHEMGR_RUN", run))
    try:
        journal.send(f)
    except Exception as exc:  # the trail never fails the command it records
        log.debug("journal trail not written: %s", exc)


def saw(result: Result) -> None:
    """A Result was built (control.Result): the last one built is the command's."""
    frame = current()
    if frame is not None:
        frame.result = result


def put_back(device: str, procedure: str, said: list[str]) -> None:
    """The gate put back what an interrupted ``procedure`` left changed on ``device``."""
    frame = current()
    if frame is not None:
        frame.put_back.append((device, procedure, list(said)))
    else:
        _send_put_back(device, procedure, said, "", 0)


def exit_of(exc: BaseException) -> int:
    if isinstance(exc, CacheMgrError):
        return int(exc.exit_code)
    code = getattr(exc, "exit_code", None)  # core/signals.py Terminated: 128 + the signal
    if isinstance(code, int):
        return code
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return int(ExitCode.FAILED)


def user() -> str:
    """Who asked: the sudo user when there is one, else the process's user."""
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, ImportError):
        return str(os.geteuid())


def _reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, CacheMgrError) else (str(exc) or type(exc).__name__)


def write(frame: Frame) -> None:
    """Write the frame's entries; a failure here is logged at debug and swallowed."""
    try:
        for fields in entries(frame):
            journal.send(fields)
    except Exception as exc:  # the trail never fails the command it records
        log.debug("journal trail not written: %s", exc)


Fields = list[tuple[str, str]]


def entries(frame: Frame) -> list[Fields]:
    """The journal entries of ``frame`` (each a list of fields)."""
    code = frame.exit if frame.exit is not None else 0
    run = next((a.run for a in frame.attempts if a.run), None)
    who = user()
    out: list[Fields] = []

    def entry(priority: int, outcome: str, message: str, target: str | None,
              exit_code: int, **extra: str | None) -> None:
        f: Fields = [("MESSAGE", printable(f"{message} (by {who}, exit {exit_code})")),
                     ("PRIORITY", str(priority)), ("SYSLOG_IDENTIFIER", "cachemgr"),
                     ("CACHEMGR_COMMAND", frame.command), ("CACHEMGR_OUTCOME", outcome),
                     ("CACHEMGR_USER", who), ("CACHEMGR_EXIT", str(exit_code))]
        if target:
            f.append(("CACHEMGR_TARGET", target))
        if run:
            f.append(("CACHEMGR_RUN", run))
        f += [(f"CACHEMGR_{k.upper()}", v) for k, v in extra.items() if v is not None]
        out.append(f)

    def failed(exc: BaseException, target: str | None, action: str) -> None:
        c = exit_of(exc)
        if c in (ExitCode.USAGE, ExitCode.ALREADY):
            return  # nothing was changed, nothing refused
        where = f" on {target}" if target else ""
        if c == ExitCode.UNSAFE:
            entry(journal.INFO, "refused", f"{action} refused{where}: {_reason(exc)}",
                  target, c, action=action, reason=_reason(exc))
        else:
            entry(journal.WARNING, "failed", f"{action} failed{where}: {_reason(exc)}",
                  target, c, action=action, reason=_reason(exc))

    for device, procedure, said in frame.put_back:
        entry(journal.NOTICE, "put-back", f"{device}: put back what an interrupted "
              f"{procedure} left changed: {'; '.join(said) or 'nothing'}", device, code,
              procedure=procedure)
    # gate entries whose own error the command got past (autoattach skips a refused action)
    for a in frame.attempts:
        if a.error is not None and a.error is not frame.error:
            failed(a.error, a.what, a.action)
    if frame.error is not None:
        if frame.plan:
            return out
        by = next((a for a in frame.attempts if a.error is frame.error), None)
        if by is not None or frame.attempts or exit_of(frame.error) == ExitCode.UNSAFE:
            failed(frame.error, by.what if by else (frame.attempts[0].what if frame.attempts
                                                    else frame.target),
                   by.action if by else frame.command)
        return out
    ok = [a for a in frame.attempts if a.error is None]
    if not ok:
        return out  # read-only: nothing to write
    res = frame.result
    changes = [c for c in (res.changes if res else []) if c.changed]
    for c in changes:
        arrow = f"{c.before} -> {c.after}" if c.before or c.after else "done"
        entry(journal.NOTICE, "changed", f"{frame.command}: {c.target} {c.what} {arrow}",
              c.target, code, attribute=c.what, **{"from": c.before, "to": c.after})
    if not changes and not (res is not None and res.already):
        for action, what, detail in dict.fromkeys(
                (a.action, a.what, _words(a.detail)) for a in ok):
            entry(journal.NOTICE, "done", f"{action} on {what}" + (f" ({detail})" if detail
                                                                   else "") + ": done",
                  what, code, action=action, detail=detail or None)
    if res is not None and res.failed:
        entry(journal.WARNING, "failed", f"{frame.command} finished with failures", frame.target
              or ok[0].what, code, action=frame.command)
    return out


def _words(detail: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (detail or {}).items())


def _send_put_back(device: str, procedure: str, said: list[str], command: str,
                   code: int) -> None:
    frame = Frame(command or "gate", exit=code)
    frame.put_back.append((device, procedure, list(said)))
    write(frame)
