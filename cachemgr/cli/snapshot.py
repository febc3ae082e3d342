"""``cachemgr snapshot TARGET --lv VG/LV --mount DIR [--name NAME] [--size SIZE]
[--max-latency MS] [--rest SIZE] [--max-freeze S] [--json]``: the face of
cachemgr/ops/snapshot.py."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.cli.render import with_progress
from cachemgr.core.errors import UsageError
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.core import model
    from cachemgr.ops import snapshot as snapshot_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    model = lazy("cachemgr.core.model")
    snapshot_ops = lazy("cachemgr.ops.snapshot")


def size(text: str) -> int:
    try:
        return model.parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def cmd_snapshot(args: argparse.Namespace) -> int:
    sysfs = Sysfs(args.sysfs_root)
    return with_progress(args, f"snapshot of {args.target}", lambda ctl: snapshot_ops.snapshot(
        sysfs, args.target, lv=args.lv, mountpoint=args.mount, name=args.name,
        size=args.size, max_latency_ms=args.max_latency, rest=args.rest,
        max_freeze=args.max_freeze, ctl=ctl))


def register(sub: Any) -> None:
    s = sub.add_parser(
        "snapshot", help="a consistent LVM snapshot of a writeback cache's origin: drain at "
                         "the VMs' pace, freeze, drain the rest, snapshot, thaw",
        description="The origin of a writeback cache misses the blocks still dirty in the "
                    "cache: a snapshot of it alone is not a consistent disk. This drains "
                    "TARGET (paced with --max-latency, as drain is) until at most --rest is "
                    "dirty, freezes the filesystem mounted at --mount (fsfreeze), drains "
                    "the rest, takes an LVM snapshot of the origin --lv (lvcreate "
                    "--snapshot), thaws, and puts back every tunable the drain changed (a "
                    "device clean from the start is frozen in writethrough, then put back "
                    "to writeback). "
                    "The filesystem stays frozen at most --max-freeze seconds (else it is "
                    "thawed and nothing is snapshotted, exit 5). A run killed while frozen "
                    "is thawed at once by a guard process; its journal is finished by "
                    "the next snapshot of TARGET or by cachemgr restore. For bcache devices "
                    "whose backing device is an LVM LV. Exit codes: 0 taken; 1 failed; 2 "
                    "bad usage (TARGET, --lv or --mount do not match, the name is taken); 3 "
                    "refused (another procedure owns TARGET, or --mount holds cachemgr's "
                    "state); 5 timed out. See docs/admin-guide.md, 'Consistent snapshots "
                    "and backups'.")
    s.add_argument("target", metavar="TARGET", help="the cached device (/dev/bcacheN)")
    s.add_argument("--lv", required=True, metavar="VG/LV",
                   help="the origin: the LV that is TARGET's backing device")
    s.add_argument("--mount", required=True, metavar="DIR",
                   help="where TARGET's filesystem is mounted (frozen for the snapshot)")
    s.add_argument("--name", metavar="NAME",
                   help="the snapshot LV's name (default LV-snap-YYYYmmdd-HHMMSS)")
    s.add_argument("--size", metavar="SIZE",
                   help="the snapshot's copy-on-write area, in lvm2's words (1G, "
                        "20%%ORIGIN); default 100%%ORIGIN, none for a thin LV")
    s.add_argument("--max-latency", type=argtypes.milliseconds, metavar="MS",
                   help="pace the drain before the freeze: the other IO on TARGET keeps "
                        "its p99 latency under MS (at most 60000)")
    s.add_argument("--rest", type=size, metavar="SIZE", default=4 << 20,
                   help="freeze once at most this much is dirty (default 4M)")
    s.add_argument("--max-freeze", type=argtypes.seconds, metavar="SECONDS", default=10.0,
                   help="the longest the filesystem may stay frozen (default 10)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_snapshot)
