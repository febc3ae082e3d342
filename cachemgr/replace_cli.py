"""``cachemgr replace-ssd``: the face of cachemgr.replace (see its docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cachemgr import replace
from cachemgr.errors import UsageError
from cachemgr.exitcodes import ExitCode
from cachemgr.sysfs import Sysfs


def _say(msg: str) -> None:
    print(f"replace-ssd: {msg}", file=sys.stderr, flush=True)


def _json(j: replace.Journal) -> dict[str, Any]:
    return {"schema": 1, "id": j.id, "status": j.status, "error": j.error, "cset": j.cset,
            "new_cset": j.new.get("cset"), "old": j.old, "new": j.new,
            "steps": [{"name": n, "done": n in j.done} for n in replace.STEP_NAMES],
            "backings": [{"uuid": b["uuid"], "device": b["device"], "backing": b["node"],
                          "mode": b["mode"]} for b in j.backings]}


def cmd_replace(args: argparse.Namespace) -> int:
    sysfs = Sysfs(args.sysfs_root)
    if args.list:
        runs = replace.list_runs()
        if args.json:
            print(json.dumps({"schema": 1, "runs": [_json(j) for j in runs]}))
        else:
            for j in runs:
                print(f"{j.id}  {j.status:<11} cset {j.cset}  done: {', '.join(j.done[-1:])}"
                      + (f"  error: {j.error}" if j.error else ""))
        return ExitCode.OK
    if os.geteuid() != 0 and not args.dry_run:
        raise UsageError("replace-ssd needs root")
    if args.rollback:
        j = replace.rollback(sysfs, replace.Journal.load(args.rollback), say=_say)
        print(json.dumps(_json(j)) if args.json else f"{j.id}: rolled back")
        return ExitCode.OK
    if args.resume:
        j = replace.Journal.load(args.resume)
        if j.status == "done":
            print(json.dumps(_json(j)) if args.json else f"{j.id}: already done")
            return ExitCode.ALREADY
    else:
        if not args.cache:
            raise UsageError("replace-ssd needs the CACHE (its SSD or cset UUID)",
                             hint="or --resume ID / --list")
        opts = replace.Options(new=args.new, interim_mode=args.interim_mode,
                               wipe_old=not args.keep_old_signature, yes=args.yes,
                               drain_timeout=args.drain_timeout,
                               stall_timeout=args.stall_timeout,
                               wait_timeout=args.wait_timeout)
        j = replace.plan(sysfs, args.cache, opts)
        if args.dry_run:
            if args.json:
                print(json.dumps({**_json(j), "status": "planned",
                                  "plan": replace.describe(j)}))
            else:
                print("\n".join(replace.describe(j)))
            return ExitCode.OK
        if not args.yes and sys.stdin.isatty():
            print("\n".join(replace.describe(j)), file=sys.stderr)
            ans = input("Go ahead? [y/N] ").strip().lower()
            if ans not in ("y", "yes"):
                print("replace-ssd: nothing done", file=sys.stderr)
                return ExitCode.UNSAFE
        _say(f"run id {j.id} (resume with: cachemgr replace-ssd --resume {j.id})")
    j = replace.execute(sysfs, j, say=None if args.json else _say)
    if args.json:
        print(json.dumps(_json(j)))
    else:
        print(f"{j.id}: done; cache set {j.new.get('cset')} on {j.new.get('node')} caches "
              + ", ".join(b["device"] or b["node"] for b in j.backings))
    return ExitCode.OK


def register(sub: Any) -> None:
    s = sub.add_parser("replace-ssd", help="replace a cache SSD safely (journaled, resumable)")
    s.add_argument("cache", nargs="?", metavar="CACHE", help="the SSD or cset UUID")
    s.add_argument("--new", default="same", metavar="DEV",
                   help="same (re-insert the old SSD, default), any (operator swaps the disk "
                        "in the same slot), or the new disk: /dev/sdX, wwn:..., serial:...")
    s.add_argument("--interim-mode", default="none",
                   choices=("none", "writearound", "writethrough"))
    s.add_argument("--keep-old-signature", action="store_true",
                   help="do not wipe the old SSD's bcache signature")
    s.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    s.add_argument("--yes", action="store_true", help="no confirmation, no operator prompts")
    s.add_argument("--resume", metavar="ID", help="finish an interrupted run")
    s.add_argument("--rollback", metavar="ID",
                   help="undo an interrupted run that has not unregistered the old set")
    s.add_argument("--list", action="store_true", help="list journaled runs")
    s.add_argument("--drain-timeout", type=float, default=24 * 3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=float, default=120.0, metavar="S")
    s.add_argument("--wait-timeout", type=float, default=600.0, metavar="S")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_replace)
