"""``cachemgr restore [TARGET]``: put back the settings an interrupted procedure (a bench
or a drain killed outright) left changed (docs/cli.md; the command layer:
cachemgr/ops/restore.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cachemgr.cli.render import emit
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.ops import restore as restore_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    restore_ops = lazy("cachemgr.ops.restore")


def cmd_restore(args: argparse.Namespace) -> int:
    return emit(args, restore_ops.restore(Sysfs(args.sysfs_root), args.target))


def register(sub: Any) -> None:
    s = sub.add_parser(
        "restore", help="put back what an interrupted procedure left changed",
        description="A procedure that changes a device's settings for a while (bench: the "
                    "cache's mode, its congestion thresholds, sequential_cutoff, a disk's IO "
                    "scheduler) journals each old value before it changes it, and puts them "
                    "back at its end, on an error, Ctrl-C, SIGTERM or SIGHUP (a closed "
                    "terminal). One killed outright leaves the journal: status shows the "
                    "device owned by it, and the next command on the device puts the "
                    "settings back first. This command does only that: every such journal "
                    "(with TARGET, those on it), through the gate (refused, exit 3, while "
                    "its procedure still runs). Exit 4 when there is nothing to put back. "
                    "An interrupted drain or flush (a bcache drain's tunables, a dm-cache "
                    "flush's cleaner table, an LVM drain's policy) is put back too, as "
                    "drain DEV --resume does before it drains again: its dirty data is then "
                    "written back at the kernel's own pace. A replace-ssd run is finished by "
                    "replace-ssd --resume or undone by --rollback.")
    s.add_argument("target", nargs="?", metavar="TARGET",
                   help="a cached device, cache set or disk the journal names (default: all)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_restore)
