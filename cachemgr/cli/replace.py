"""``cachemgr replace-ssd``: the face of cachemgr.procedures.replace (see its docstring)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.cli import confirm
from cachemgr.cli.render import emit
from cachemgr.core.errors import UsageError
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs
from cachemgr.core.text import printable

if TYPE_CHECKING:
    from cachemgr.ops import control
    from cachemgr.ops import replace as ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    control = lazy("cachemgr.ops.control")
    ops = lazy("cachemgr.ops.replace")


class RollbackAction(argparse.Action):
    """``--rollback ID``, stored as given. Its help names each cache kind's point of no
    return as the kinds' registry says (``ops.replace.KINDS``, each kind's own module), read
    when the help is shown: building the parser imports no kind (cli/main.py's docstring)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                  values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)

    @property
    def help(self) -> str:
        return ("undo an interrupted run that has not passed its point of no return ("
                + ", ".join(f"{k.name}: {k.point_of_no_return}" for k in ops.KINDS) + ")")

    @help.setter
    def help(self, value: str | None) -> None:
        pass  # argparse.Action.__init__ sets it: the property above is the help


def _say(msg: str) -> None:
    print(f"replace-ssd: {printable(msg, newlines=True)}", file=sys.stderr, flush=True)


def _ask_stdin(text: str) -> bool:
    """The operator's swap prompt on a terminal: Enter once the disk is in."""
    print(printable(text, newlines=True), file=sys.stderr, flush=True)
    try:
        input()
    except EOFError:
        raise UsageError("no operator input (stdin closed)",
                         hint="pass --yes when the new disk is already in") from None
    return True


def cmd_replace(args: argparse.Namespace) -> int:
    sysfs = Sysfs(args.sysfs_root)
    ctl = control.Control(what="replace-ssd", say=(lambda m: None) if args.json else _say,
                  prompt=_ask_stdin)
    if args.list:
        return emit(args, ops.list_runs(args.cache))
    if args.rollback:
        return emit(args, ops.rollback(sysfs, args.rollback, ctl=ctl))
    if args.resume:
        return emit(args, ops.resume(sysfs, args.resume, ctl=ctl))
    opts = ops.Options(new=args.new, interim_mode=args.interim_mode,
                       wipe_old=not args.keep_old_signature, yes=args.yes,
                       drain_timeout=args.drain_timeout, stall_timeout=args.stall_timeout,
                       wait_timeout=args.wait_timeout, warm=args.warm)
    if args.dry_run:
        return emit(args, ops.dry_run(sysfs, args.cache, opts))
    j = ops.plan(sysfs, args.cache, opts, for_run=True)
    # the plan, then the question (docs/cli.md, "Confirmations"), both once the run holds
    # its devices: the plan shown is the one read under its locks (ops.replace.run); then
    # the run's id
    started = f"run id {j.id} (resume with: cachemgr replace-ssd --resume {j.id})"
    ask = confirm.confirmer(args)
    if ask is None:
        _say(started)
    else:
        def asked(plan: control.Plan) -> bool:
            if not ask(plan):
                return False
            _say(started)
            return True

        ctl.confirm = asked
    return emit(args, ops.run(sysfs, j, ctl=ctl, command=f"replace-ssd {args.cache}"))


def register(sub: Any) -> None:
    s = sub.add_parser("replace-ssd", help="replace a cache SSD safely (journaled, resumable)")
    s.add_argument("cache", nargs="?", metavar="CACHE",
                   help="the SSD, its cset UUID, a cached LV (VG/LV) or a dm-cache device "
                        "(NAME, /dev/mapper/NAME)")
    s.add_argument("--new", default="same", metavar="DEV",
                   help="same (re-insert the old SSD, default), any (operator swaps the disk "
                        "in the same slot), or the new disk: /dev/sdX, /dev/nvmeXnY, wwn:..., "
                        "serial:..., a SCSI address H:C:T:L or an NVMe PCI address")
    s.add_argument("--interim-mode", default="none",
                   choices=("none", "writearound", "writethrough"))
    s.add_argument("--keep-old-signature", action="store_true",
                   help="do not wipe the old SSD's bcache signature")
    s.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    s.add_argument("-y", "--yes", action="store_true",
                   help='confirm without asking, and no operator prompts (needed when '
                        'stdin is not a terminal: docs/cli.md, "Confirmations")')
    s.add_argument("--resume", metavar="ID", help="finish an interrupted run")
    s.add_argument("--rollback", metavar="ID", action=RollbackAction)
    s.add_argument("--list", action="store_true",
                   help="list journaled runs (with CACHE: only the runs on that cache)")
    s.add_argument("--drain-timeout", type=argtypes.seconds, default=24 * 3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=argtypes.seconds, default=120.0, metavar="S")
    s.add_argument("--wait-timeout", type=argtypes.seconds, default=600.0, metavar="S")
    s.add_argument("--warm", metavar="FILE",
                   help="a trace of the cached devices (cachemgr trace): the last step reads "
                        "its hottest blocks through the new cache (cachemgr warm), journaled "
                        "and resumed like every step")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_replace)
