"""The cancel event of the operation running in this context, for the waits that a
progress report does not cut short.

A face that runs operations in worker threads (the TUI) sets each one's cancel event with
:func:`scope`; within it, :func:`sleep` and :func:`check` raise Cancelled once the event is
set, and core/runner.py stops a ``cancellable`` program (fio). The CLI needs none of it:
Ctrl-C, SIGTERM and SIGHUP interrupt its main thread wherever it waits."""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator

from cachemgr.core.errors import Cancelled

_event: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "cancel", default=None)


@contextlib.contextmanager
def scope(event: threading.Event) -> Iterator[None]:
    token = _event.set(event)
    try:
        yield
    finally:
        _event.reset(token)


def current() -> threading.Event | None:
    return _event.get()


def check(what: str = "the operation") -> None:
    """Raise Cancelled when the operation of this context was cancelled."""
    ev = _event.get()
    if ev is not None and ev.is_set():
        raise Cancelled(f"{what} cancelled")


def sleep(seconds: float, what: str = "the operation") -> None:
    """time.sleep, cut short by a cancel (then Cancelled)."""
    ev = _event.get()
    if ev is None:
        time.sleep(seconds)
        return
    if ev.wait(seconds):
        raise Cancelled(f"{what} cancelled")
