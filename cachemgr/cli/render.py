"""How the CLI shows a command's result and progress: stdout is data (``--json``: the
result's document, schema 1), stderr is remarks and progress."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cachemgr.cli import confirm
from cachemgr.core.lazy import lazy
from cachemgr.core.text import printable

if TYPE_CHECKING:
    from cachemgr.ops import control, trail
    from cachemgr.ops.control import Control, Result
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    control = lazy("cachemgr.ops.control")
    trail = lazy("cachemgr.ops.trail")


def emit(args: argparse.Namespace, res: Result) -> int:
    """Print a command's result (stdout: data; stderr: remarks) and return its exit code.
    Text is shown with control characters escaped (device names); JSON stays exact. The
    result is the command's outcome for the journal trail (cachemgr/ops/trail.py)."""
    trail.saw(res)
    for line in res.notes:
        print(printable(line, newlines=True), file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(res.json()))
    else:
        for line in res.text():
            print(printable(line, newlines=True))
    return int(res.exit_code)


class ProgressReporter:
    """Progress on stderr: rewritten in place on a terminal, a line every 5 s if not."""

    def __init__(self, quiet: bool = False) -> None:
        self.tty = sys.stderr.isatty()
        self.quiet = quiet
        self.last = 0.0
        self.note: str | None = None

    def __call__(self, p: object) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.tty and now - self.last < 5:
            return
        self.last = now
        if self.tty:
            # the words of why, once each time they change, on a line of their own above
            # the line rewritten in place (which a long line would wrap and break)
            note = getattr(p, "note", None)
            shape = re.sub(r"\d+", "#", note) if note else None  # a countdown is one note
            if note and shape != self.note:
                print("\r" + printable(note).ljust(78), file=sys.stderr, flush=True)
            self.note = shape
            line = printable(control.progress_line(p, note=False))
            print("\r" + line.ljust(78), end="", file=sys.stderr, flush=True)
        else:
            print(printable(control.progress_line(p)), file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


def with_progress(args: argparse.Namespace, what: str,
                  fn: Callable[[Control], Result]) -> int:
    """Run a long command with progress on stderr (none with --json) and print its result.
    A command that asks first (``args.yes`` exists) gets the CLI's question
    (cachemgr/cli/confirm.py)."""
    rep = ProgressReporter(quiet=getattr(args, "json", False))
    try:
        res = fn(control.Control(progress=rep, what=what, confirm=confirm.confirmer(args)
                         if hasattr(args, "yes") else None))
    finally:
        rep.done()
    return emit(args, res)
