"""``cachemgr scheduler [DEVICE [NAME]]``: the block layer's IO schedulers (docs/cli.md).

    cachemgr scheduler                  # every disk: scheduler, the others it has, its users
    cachemgr scheduler /dev/sdb         # one disk: scheduler, available ones, tunables
    cachemgr scheduler /dev/sdb bfq     # set it (exit 4: already so); read back from sysfs

The command layer (cachemgr/ops/scheduler.py) resolves, refuses and writes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cachemgr.cli.render import emit
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.ops import scheduler as sched_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    sched_ops = lazy("cachemgr.ops.scheduler")


def cmd_scheduler(args: argparse.Namespace) -> int:
    sysfs = Sysfs(args.sysfs_root)
    if args.name is None:
        return emit(args, sched_ops.show(sysfs, args.device))
    return emit(args, sched_ops.set_scheduler(sysfs, args.device, args.name))


def register(sub: Any) -> None:
    s = sub.add_parser(
        "scheduler", help="show or set a disk's IO scheduler (mq-deadline, bfq, kyber, none)",
        description="Without DEVICE: every disk with its IO scheduler, the ones it has, and "
                    "the bcache and device-mapper devices on it. With DEVICE: its scheduler, "
                    "the available ones and the active one's tunables (queue/iosched). With "
                    "NAME: set it, read back from sysfs (exit 4 when already so). A partition "
                    "stands for its disk; a bio-based device (bcacheN, dm-N) has no scheduler: "
                    "setting one is refused naming the disks under it. A scheduler built as a "
                    "module (bfq, kyber on Debian) is listed once loaded; naming it loads it.")
    s.add_argument("device", nargs="?", metavar="DEVICE",
                   help="/dev/sdb, sdb, /dev/nvme0n1, a /dev/disk/by-id link, /dev/mapper/NAME")
    s.add_argument("name", nargs="?", metavar="NAME",
                   help="the scheduler to set: mq-deadline (or deadline), bfq, kyber, none")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_scheduler)
