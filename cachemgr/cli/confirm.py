"""The one confirmation rule of the command line (docs/cli.md, "Confirmations").

Every command that can lose data or disrupt a VM (remove, detach, stop-set, force-run, mode
to a mode that caches nothing, create --force over a signature, vm-cache, replace-ssd,
assemble over disks known by their place only, invalidate of a cache that holds copies)
shows its plan on stderr, each change not made yet said as "would ...", then:

* on a terminal (stdin is one) asks ``Go ahead? [y/N]`` and goes on only on ``y`` or
  ``yes``; anything else (Enter, EOF) is no: exit 3, nothing changed;
* without a terminal (a script, cron, a pipe, ``</dev/null``) refuses, exit 3 (refused as
  unsafe), nothing changed, unless ``--yes`` was given;
* with ``--yes`` asks nothing and shows no plan (the command's own output says what it did).

The command layer puts the question (``Control.confirm``) after every check it can make
without acting, so a refusal, "already so" (exit 4) or a bad target (exit 2) comes first.
The TUI asks in its own dialogs and passes no ``confirm``: nothing here runs under it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from cachemgr.core.lazy import lazy
from cachemgr.core.text import printable

if TYPE_CHECKING:
    from cachemgr.ops import control
    from cachemgr.ops.control import Plan
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    control = lazy("cachemgr.ops.control")

YES_HELP = ('confirm without asking (needed when stdin is not a terminal: '
            'docs/cli.md, "Confirmations")')

# what the commands' --help and docs/cli.md say of the rule (the main parser's epilog)
RULE = ("Confirmations: remove, detach, stop-set, force-run, vm-cache, replace-ssd, a mode "
        "that caches nothing (none, passthrough), create --force over a signature and "
        "assemble over disks known by their place only and invalidate show "
        "what they would do and ask on a terminal (Go ahead? [y/N]); without a terminal "
        "they refuse (exit 3, nothing changed) unless given --yes.")


def add_yes(p: argparse.ArgumentParser) -> None:
    """``-y/--yes`` on a command that asks (the one spelling everywhere)."""
    p.add_argument("-y", "--yes", action="store_true", help=YES_HELP)


def show(plan: Plan) -> None:
    """The plan on stderr: the command, then what it would do."""
    print(printable(f"cachemgr {plan.command} (nothing is changed yet):"), file=sys.stderr)
    for line in plan.lines:
        print(printable(f"  {line}".rstrip(), newlines=True), file=sys.stderr)
    sys.stderr.flush()


def ask(plan: Plan) -> bool:
    """The question on a terminal, after the plan; no terminal: the refusal (exit 3)."""
    show(plan)
    if not _interactive():
        raise control.not_confirmed(plan, "not confirmed: stdin is not a terminal, so there was "
                                  "nobody to ask",
                            hint="run it on a terminal to be asked, or pass --yes "
                                 '(docs/cli.md, "Confirmations")')
    print("Go ahead? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()  # "" at EOF (Ctrl-D): no
    if not answer.endswith("\n"):
        print(file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):  # stdin closed
        return False


def confirmer(args: argparse.Namespace) -> Callable[[Plan], bool] | None:
    """What a command passes the command layer as ``Control.confirm``: none with --yes,
    else :func:`ask`."""
    return None if getattr(args, "yes", False) else ask


def require(args: argparse.Namespace, plan: Plan) -> None:
    """For the commands that plan in the CLI (vm-cache, replace-ssd): the same rule, raising
    the same refusal (exit 3) when not confirmed."""
    c = confirmer(args)
    if c is not None and not c(plan):
        raise control.not_confirmed(plan)

