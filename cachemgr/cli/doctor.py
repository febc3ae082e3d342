"""``cachemgr doctor [TARGET] [--window SECONDS] [--json]``: the face of
cachemgr/ops/doctor.py."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.cli.render import emit
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.ops import doctor as doctor_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    doctor_ops = lazy("cachemgr.ops.doctor")


def cmd_doctor(args: argparse.Namespace) -> int:
    return emit(args, doctor_ops.doctor_cmd(Sysfs(args.sysfs_root), args.target,
                                            window=args.window, trace=args.trace))


def register(sub: Any) -> None:
    s = sub.add_parser(
        "doctor", help="why a cache does not help: the cause, its evidence, the fix "
                       "(0 none found, 1 found)",
        description="Reads the host twice, --window seconds apart (the cache's counters, "
                    "its tunables and the block layer's counters of each device), and names "
                    "each reason a cache is not helping, with the figures it saw and the "
                    "exact command that fixes it, in the order to fix them: a mode that "
                    "caches nothing left behind (bcache none, or writearound under writes; "
                    "dm-cache or LVM cache passthrough); bcache bypassing a sequential "
                    "stream (sequential_cutoff); bcache bypassing a congested cache device "
                    "(its requests slower than congested_read/write_threshold_us); a "
                    "bcache writeback cache full of dirty data; a dm-cache that promotes "
                    "nothing (the cleaner policy left behind); with --trace, a working set "
                    "larger than the cache (from the trace's miss-ratio curve: the size that "
                    "would do); a write-through dm-cache reading dirty (after an unclean "
                    "shutdown). Changes nothing. Exit codes: 0 nothing found; 1 a cause named; 2 "
                    "TARGET names no cached device, a bad --window, or a trace that is not "
                    "of TARGET. See docs/admin-guide.md, 'Why is my cache not helping?'.")
    s.add_argument("target", metavar="TARGET", nargs="?",
                   help="one cached device (/dev/bcacheN, /dev/mapper/NAME, VG/LV); "
                        "default: every one")
    s.add_argument("--window", type=argtypes.seconds, metavar="SECONDS",
                   default=15.0,
                   help="seconds between the two reads (default 15: bcache folds its "
                        "counters every 13.6 s, so a shorter window may see none move)")
    s.add_argument("--trace", metavar="FILE",
                   help="a trace of TARGET (cachemgr trace): also say whether its working "
                        "set is larger than the cache, and what size would do")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_doctor)
