"""``cachemgr warm TARGET --trace FILE [--bytes SIZE]``: the face of cachemgr/ops/warm.py."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cachemgr.cli.render import with_progress
from cachemgr.core.errors import UsageError
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.core import model
    from cachemgr.ops import warm as warm_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    model = lazy("cachemgr.core.model")
    warm_ops = lazy("cachemgr.ops.warm")


def size(text: str) -> int:
    try:
        n = model.parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"a size is more than 0, not {text!r}")
    return n


def cmd_warm(args: argparse.Namespace) -> int:
    sysfs = Sysfs(args.sysfs_root)
    return with_progress(args, "warm", lambda ctl: warm_ops.warm(
        sysfs, args.target, args.trace, nbytes=args.bytes, ctl=ctl))


def register(sub: Any) -> None:
    s = sub.add_parser(
        "warm", help="fill a cache with the blocks a trace found hottest (after replace-ssd)",
        description="Read the blocks a trace (`cachemgr trace`) found "
                    "hottest, hottest first, through the cache, until SIZE (default: the "
                    "cache's capacity, never past it), so that a new or emptied cache SSD "
                    "holds them before the VMs ask. bcache: sequential_cutoff and the cache "
                    "set's congested_read_threshold_us are 0 for the run (journaled first, "
                    "put back at the end, on error, Ctrl-C, SIGTERM and SIGHUP); dm-cache and "
                    "LVM caches: the blocks are read in passes 1.1 s apart, at least 3, until "
                    "three in a row promote nothing, at most 24 (smq promotes a block after hits "
                    "in several of its one-second periods), nothing is changed, and the end says "
                    "how many of the blocks read are in the cache (the cache's read counters "
                    "over the last pass) and whether the passes ran out while it still admitted "
                    "(--json: admitted, passes_ended_by). The VMs' IO goes "
                    "first: idle IO class, one request in flight, none sent while the slow "
                    "device has other IO in flight (at most 0.5 s, then one goes anyway). "
                    "Exit codes: 0 warmed; 1 the cache admitted none of the blocks read; "
                    "2 TARGET is not a cached device, its cache admits "
                    "no read (bcache mode none, dm-cache passthrough or cleaner), the trace "
                    "cannot map onto TARGET (it says why) or has no IO of it, SIZE is over "
                    "the cache's capacity, "
                    "or not root (nothing changed); 3 another command holds the device; "
                    "130/143/129 stopped by a signal (the settings are put back).")
    s.add_argument("target", metavar="TARGET",
                   help="the cached device: /dev/bcacheN, /dev/mapper/NAME, VG/LV")
    s.add_argument("--trace", required=True, metavar="FILE",
                   help="a trace from cachemgr trace (best at --rate 1) of TARGET, of a "
                        "dm-cache's origin or an LV before it was cached (the same offsets), "
                        "or of a bcache device's backing disk (its offsets less bcache's data "
                        "offset, said in the output)")
    s.add_argument("--bytes", type=size, metavar="SIZE",
                   help="read at most this much, e.g. 20G (default: the cache's capacity)")
    s.add_argument("--json", action="store_true", help="what was read and changed, as JSON")
    s.set_defaults(func=cmd_warm)
