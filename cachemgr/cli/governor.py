"""``cachemgr governor``: the writeback governor (the command layer: cachemgr/ops/governor.py;
the decisions: cachemgr/procedures/governor.py)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from cachemgr.cli.render import emit
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs
from cachemgr.core.text import printable
from cachemgr.ops import udev as udev_ops

if TYPE_CHECKING:
    from cachemgr.ops import governor as governor_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    governor_ops = lazy("cachemgr.ops.governor")


def cmd_governor(args: argparse.Namespace) -> int:
    from cachemgr.ops.control import Control

    def say(line: str) -> None:
        print(f"cachemgr governor: {printable(line)}", file=sys.stderr, flush=True)

    ctl = Control(what="governor", say=say)
    return emit(args, governor_ops.run(Sysfs(args.sysfs_root),
                                       udev_ops.resolve_policy(args.policy), once=args.once,
                                       ctl=ctl))


def register(sub: Any) -> None:
    s = sub.add_parser(
        "governor", help="the writeback governor: the policy's [writeback] bounds (read "
                         "p99, dirty data, its age) held by pacing bcache's writeback",
        description="Runs until stopped (cachemgr-governor.service). For each bcache device "
                    "in writeback it measures the VMs' read p99 on the device (as drain "
                    "--max-latency does), its dirty data and the age of its oldest dirty "
                    "data (an upper bound: the time since dirty data last read 0), and "
                    "paces bcache's writeback: as fast as the disk allows while no VM reads, "
                    "slower while the read p99 nears read_p99_ms, unpaced while dirty data "
                    "or its age nears max_dirty or max_age_s. When the three cannot all "
                    "hold, the read bound is given up and said (stderr, its state file, "
                    "check's governor-gave-up warning). It holds the devices' locks while "
                    "it runs: other commands on them are refused (exit 3) until it stops. "
                    "Every setting it changes is journaled first and put back when it stops "
                    "(SIGTERM: exit 0); after a SIGKILL its next start or cachemgr restore "
                    "puts them back. Off (no policy, or [writeback] not enabled): exit 0, "
                    "nothing done. See docs/admin-guide.md, 'The writeback governor'.")
    s.add_argument("--policy", metavar="PATH",
                   help=f"the policy file (default $CACHEMGR_POLICY, else "
                        f"{udev_ops.DEFAULT_POLICY})")
    s.add_argument("--once", action="store_true",
                   help="one tick: measure for 2 s, decide and apply once, print what it "
                        "saw and did, put everything back")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_governor)
