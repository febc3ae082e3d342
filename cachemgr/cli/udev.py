"""``cachemgr udev-event``, ``cachemgr autoattach`` and ``cachemgr policy check``: parsing
and calls. What the handler and its worker do (the queue, the worker loop, its locks and
syslog) is cachemgr/ops/udev.py.

This module is also the rule's fast entry point (``python -m cachemgr.cli.udev udev-event``,
and ``... worker`` for the worker the handler starts). Its top level imports the standard
library and cachemgr.ops.udev only, which imports nothing more than cachemgr.core.safefs
(standard library only): on the rule's own command line :func:`main` takes the policy
without argparse and calls the handler (the reasons and the numbers are in
cachemgr/ops/udev.py's docstring).
"""

from __future__ import annotations

import os
import sys

from cachemgr.ops import udev as udev_ops

TYPE_CHECKING = False  # typing's import costs what the handler saves; mypy reads it as True
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

DEFAULT_POLICY = udev_ops.DEFAULT_POLICY


def cmd_udev_event(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.action:
        env["ACTION"] = args.action
    if args.devname:
        env["DEVNAME"] = args.devname
        env.setdefault("SUBSYSTEM", "block")
    return udev_ops.handle_event(env, args.policy, how=args.spawn)


def cmd_worker(args: argparse.Namespace) -> int:
    udev_ops.prioritise()
    return udev_ops.worker(udev_ops.resolve_policy(args.policy), settle=args.settle,
                           linger=args.linger)


def cmd_policy_check(args: argparse.Namespace) -> int:
    import json

    from cachemgr.core.text import printable
    from cachemgr.procedures import policy

    pol = policy.load(udev_ops.resolve_policy(args.policy))
    if args.json:
        print(json.dumps({"schema": 1, "path": pol.path, "valid": True,
                          "caches": [c.name for c in pol.caches],
                          "backings": [b.name for b in pol.backings],
                          "lvm": [m.name for m in pol.lvms],
                          "schedulers": [sp.name for sp in pol.schedulers]}))
    else:
        lines = [f"{pol.path}: valid; {len(pol.caches)} cache(s), {len(pol.backings)} "
                 f"backing device(s), {len(pol.lvms)} LVM cache(s), {len(pol.schedulers)} "
                 "IO scheduler(s)"]
        for c in pol.caches:
            lines.append(f"  cache {c.name}: {c.device or ''}"
                         f"{' cset ' + c.cset if c.cset else ''}"
                         f"{' (formats a blank SSD)' if c.format_blank_ssd else ''}")
        for b in pol.backings:
            tun = " ".join(f"{k}={v}" for k, v in b.tunables)
            lines.append(f"  backing {b.name}: {b.device} -> {b.cache}"
                         f"{' mode ' + b.mode.value if b.mode else ''}{' ' + tun if tun else ''}")
        for m in pol.lvms:
            lines.append(f"  lvm {m.name}: {m.cache} -> {m.lv} "
                         f"({'writecache' if m.writecache else 'cache'}"
                         f"{', mode ' + m.mode.value if m.mode else ''}"
                         f"{', erases a plain LV' if m.erase_cachevol else ''})")
        for sp in pol.schedulers:
            lines.append(f"  scheduler {sp.name}: {sp.device} -> {sp.scheduler}")
        # policy names and device strings as written in the file: control characters escaped
        print("\n".join(printable(line) for line in lines))
    return 0


def cmd_autoattach(args: argparse.Namespace) -> int:
    """A full pass over every device the policy names (boot-time assembly)."""
    from cachemgr.cli.render import emit
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops import autoattach as autoattach_ops

    udev_ops.setup_logging(stderr=False)
    return emit(args, autoattach_ops.boot_pass(Sysfs(args.sysfs_root),
                                               udev_ops.resolve_policy(args.policy),
                                               dry_run=args.dry_run))


def cmd_protect(args: argparse.Namespace) -> int:
    """One protect pass (the policy's [protect] table): ops/protect.py."""
    from cachemgr.cli.render import emit
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops import protect as protect_ops

    udev_ops.setup_logging(stderr=False)
    if args.clear is not None:
        return emit(args, protect_ops.clear(Sysfs(args.sysfs_root), args.clear,
                                            udev_ops.resolve_policy(args.policy),
                                            dry_run=args.dry_run))
    return emit(args, protect_ops.run(Sysfs(args.sysfs_root),
                                      udev_ops.resolve_policy(args.policy),
                                      dry_run=args.dry_run))


def register(sub: Any) -> None:
    s = sub.add_parser("udev-event", help="queue a udev block event for auto-attach "
                                          "(called from udev/90-cachemgr.rules)")
    s.add_argument("action", nargs="?", help="add|change|remove (default: $ACTION)")
    s.add_argument("devname", nargs="?", help="/dev/sdX (default: $DEVNAME)")
    s.add_argument("--policy", metavar="PATH", help=f"default {DEFAULT_POLICY}")
    s.add_argument("--spawn", choices=("auto", "systemd", "fork"), default="auto",
                   help="how to start the worker (auto: systemd-run if systemd is PID 1)")
    s.set_defaults(func=cmd_udev_event)

    a = sub.add_parser("autoattach", help="attach every device the policy names (boot pass)")
    a.add_argument("--policy", metavar="PATH", help=f"default {DEFAULT_POLICY}")
    a.add_argument("--dry-run", action="store_true", help="say what would be done")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_autoattach)

    pr = sub.add_parser("protect", help="the protect policy: a cache SSD failing (IO errors "
                                        "rising, SMART critical, worn) has its devices "
                                        "switched to writethrough and drained")
    pr.add_argument("--policy", metavar="PATH", help=f"default {DEFAULT_POLICY}")
    pr.add_argument("--dry-run", action="store_true", help="say what would be done")
    pr.add_argument("--clear", metavar="DEV",
                    help="undo what the passes did to the cache SSD DEV (as the finding "
                         "names it): put back the mode each device had before protect "
                         "switched it, then forget the SSD's record and count its errors "
                         "from now (root; journaled, through the gate)")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_protect)

    p = sub.add_parser("policy", help="the auto-attach policy: policy check [--policy PATH]")
    psub = p.add_subparsers(dest="policy_cmd", metavar="SUBCOMMAND", required=True)
    c = psub.add_parser("check", help="validate the policy file (line-precise errors)")
    c.add_argument("--policy", metavar="PATH", help=f"default {DEFAULT_POLICY}")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_policy_check)


def _rule_call(argv: Sequence[str]) -> tuple[str | None] | None:
    """The policy of the rule's own command line (``udev-event`` with nothing but an
    optional ``--policy PATH``, as install-udev.sh writes it); None for any other."""
    if list(argv[:1]) != ["udev-event"]:
        return None
    rest = list(argv[1:])
    if not rest:
        return (None,)
    if len(rest) == 2 and rest[0] == "--policy" and not rest[1].startswith("-"):
        return (rest[1],)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The rule's fast entry: ``python -m cachemgr.cli.udev udev-event|worker``."""
    args_in = sys.argv[1:] if argv is None else list(argv)
    rule = _rule_call(args_in)
    if rule is not None:  # the rule's call: no argparse (cachemgr/ops/udev.py's docstring)
        try:
            return udev_ops.handle_event(os.environ, rule[0])
        except Exception as exc:
            return udev_ops.failed(exc)
    import argparse

    from cachemgr.cli import args as argtypes

    p = argparse.ArgumentParser(prog="cachemgr-udev")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("udev-event")
    e.add_argument("action", nargs="?")
    e.add_argument("devname", nargs="?")
    e.add_argument("--policy")
    e.add_argument("--spawn", choices=("auto", "systemd", "fork"), default="auto")
    e.set_defaults(func=cmd_udev_event)
    w = sub.add_parser("worker")
    w.add_argument("--policy")
    w.add_argument("--settle", type=argtypes.seconds_or_zero, default=udev_ops.SETTLE_S)
    w.add_argument("--linger", type=argtypes.seconds_or_zero, default=udev_ops.LINGER_S)
    w.set_defaults(func=cmd_worker)
    args = p.parse_args(args_in)
    try:
        return int(args.func(args))
    except Exception as exc:
        return udev_ops.failed(exc)


if __name__ == "__main__":
    sys.exit(main())
