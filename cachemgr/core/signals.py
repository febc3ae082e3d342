"""SIGTERM and SIGHUP stop a long operation the way Ctrl-C does.

Python turns SIGINT into KeyboardInterrupt, so every ``finally`` on the way out (a drain's
tunables, a flush's table, a lock) runs. SIGTERM (``kill``, ``systemctl stop``) and SIGHUP
(the terminal closed) kill the process outright by default, leaving what it changed in place
until the journal is restored by the next run. :func:`terminate_as_interrupt` makes them
raise :class:`Terminated` (a KeyboardInterrupt) instead, for the duration of a block:

* in the main thread only (Python runs signal handlers there; elsewhere it is a no-op, e.g.
  the TUI's worker threads, or replace-ssd's drain threads, whose main thread installs it);
* a signal already ignored (``nohup`` ignores SIGHUP) stays ignored;
* the previous handlers are put back when the block ends;
* only the first signal raises: a second one while the ``finally`` blocks put things back
  does not cut that short (it is logged; SIGKILL still kills, and the journal is there for
  the next run). :func:`deferred` holds the first one too, for a block that must not be
  cut in the middle (putting tunables back); it is raised when that block ends.

The CLI exits 128 + the signal's number (143 SIGTERM, 129 SIGHUP; 130 for SIGINT).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; raised like Ctrl-C's KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# main-thread state (handlers run in the main thread only)
_depth = 0  # open terminate_as_interrupt blocks
_deferring = 0  # open deferred blocks
_caught: Terminated | None = None  # the first signal of the outermost block
_raised = False


def _main() -> bool:
    return threading.current_thread() is threading.main_thread()


def _handler(signum: int, frame: FrameType | None) -> None:
    global _caught, _raised
    if _caught is not None:
        log.warning("%s: already stopping; putting back what this run changed first",
                    signal.Signals(signum).name)
        return
    _caught = Terminated(signum)
    if _deferring:
        return
    _raised = True
    raise _caught


def _raise_pending() -> None:
    global _raised
    if _caught is not None and not _raised:
        _raised = True
        raise _caught


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` inside the block (main thread only)."""
    global _depth, _caught, _raised
    if not _main():
        yield
        return
    old: dict[int, object] = {}
    for sig in SIGNALS:
        cur = signal.getsignal(sig)
        if cur is not signal.SIG_IGN:
            old[sig] = cur
            signal.signal(sig, _handler)
    _depth += 1
    ok = False
    try:
        yield
        ok = True
    finally:
        _depth -= 1
        for num, h in old.items():
            # None: a handler not set from Python; SIG_DFL is the closest we can put back
            signal.signal(num, signal.SIG_DFL if h is None else h)  # type: ignore[arg-type]
        pending = None if _raised else _caught
        if _depth == 0:
            _caught, _raised = None, False
    if ok and pending is not None:
        raise pending  # caught while deferred, and the deferred block did not raise it


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside :func:`terminate_as_interrupt`, hold a first SIGTERM/SIGHUP until the block
    ends (then raise it), so the block is not cut in the middle."""
    global _deferring
    if not _main():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        _raise_pending()
