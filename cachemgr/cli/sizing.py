"""``cachemgr trace`` and ``cachemgr size``: how big the cache SSD must be, from the host's own
IO (docs/admin-guide.md, "Sizing a cache from the host's own IO").

    cachemgr trace /dev/sdb [/dev/sdc ...] --seconds 3600 -o host.trace [--rate 0.01]
    cachemgr size --trace host.trace [--sizes 32M,64G] [--json] [--plot FILE]

The command layer is cachemgr/ops/sizing.py."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.cli.render import emit, with_progress
from cachemgr.core import defaults
from cachemgr.core.errors import UsageError
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.core import model
    from cachemgr.ops import sizing as sizing_ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    model = lazy("cachemgr.core.model")
    sizing_ops = lazy("cachemgr.ops.sizing")

_LATENCY = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s)?")


def latency_ms(text: str) -> float:
    """``8ms``, ``100us``, ``0.1`` (milliseconds) as milliseconds."""
    m = _LATENCY.fullmatch(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a latency: {text!r} (e.g. 8ms, 100us)")
    v = float(m.group(1))
    return {"us": v / 1000, "s": v * 1000}.get(m.group(2) or "ms", v)


def rate(text: str) -> float:
    try:
        v = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (e.g. 0.01 or 1%)") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"a rate is in (0, 1], not {text!r}")
    return v


def sizes(text: str) -> list[int]:
    try:
        return sizing_ops.parse_sizes(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def block(text: str) -> int:
    try:
        n = model.parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    if n < 512 or n & (n - 1):
        raise argparse.ArgumentTypeError(f"a block size is a power of two >= 512, not {text!r}")
    return n


def cmd_trace(args: argparse.Namespace) -> int:
    sysfs = Sysfs(args.sysfs_root)
    return with_progress(args, "trace", lambda ctl: sizing_ops.record(
        sysfs, args.devices, args.output, seconds=args.seconds, rate=args.rate,
        block=args.block, ctl=ctl, force=args.force))


def cmd_size(args: argparse.Namespace) -> int:
    res = sizing_ops.analyse(args.trace, rate=args.rate, block=args.block,
                             sizes=args.sizes or [], hdd_ms=args.hdd_latency,
                             ssd_ms=args.ssd_latency, device=args.device)
    if args.plot:
        assert res.data is not None
        for p in sizing_ops.plot(res.data, args.plot):
            res.notes.append(f"plot: {p}")
    return emit(args, res)


def register(sub: Any) -> None:
    s = sub.add_parser(
        "trace", help="record the block requests of devices for cache sizing (blktrace)",
        description="Record the requests submitted to block devices (blktrace's queue events: "
                    "what a cache in front of them would see) into a compact trace file, "
                    "sampled by block address (SHARDS: a block is kept on every request or "
                    "never), for `cachemgr size`. An hour of a busy host at rate 0.01 is a few "
                    "MB. Below rate 1 it also counts the references of a larger sample of "
                    "blocks (all of them while they fit in a table of "
                    f"{defaults.COUNT_TABLE:,}, about 27 MiB) and times their reuses: "
                    "`size` weighs the sample to the counts, and models the caches too small "
                    "for the sample from the times. Ctrl-C or SIGTERM ends it cleanly (exit "
                    "0, the file complete). Needs root, debugfs at /sys/kernel/debug and a "
                    "kernel with "
                    "block tracing; one trace per device at a time. A partition is traced as "
                    "its disk's sectors in its range (IO sent to the disk itself there counts "
                    "too), with offsets from the partition's start.")
    s.add_argument("devices", nargs="+", metavar="DEVICE", help="/dev/sdb, /dev/bcache0, ...")
    s.add_argument("-o", "--output", required=True, metavar="FILE", help="the trace file")
    s.add_argument("--seconds", type=argtypes.seconds, metavar="N",
                   help="record this long (default: until Ctrl-C)")
    s.add_argument("--rate", type=rate, default=defaults.SIZING_DEFAULT_RATE, metavar="R",
                   help="sampling rate, 0.01 or 1%% (default 0.01; 1 keeps every request, "
                        "which `bench replay` can replay exactly)")
    s.add_argument("--block", type=block, default=4096, metavar="SIZE",
                   help="the cache block sampled and analysed (default 4k)")
    s.add_argument("--force", action="store_true", help="replace FILE if it exists")
    s.add_argument("--json", action="store_true", help="print the file's summary as JSON")
    s.set_defaults(func=cmd_trace)

    s = sub.add_parser(
        "size", help="hit ratio against cache size from a trace: how big the SSD must be",
        description="The LRU miss-ratio curve of a recorded trace (reuse distances of the "
                    "sampled blocks, scaled by the rate, SHARDS-adjusted, weighed per frequency "
                    "class to the recorder's block counts; below the sizes the sample "
                    "resolves, the counted blocks' reuse times by the AET model), for reads "
                    "and writes apart; the working set's knee; for each --sizes the expected "
                    "hit ratios, "
                    "read latency and IOPS gain (Little's law at the recorded queue depth, "
                    "with the disk's read latency measured during the trace or --hdd-latency) "
                    "and the share of writes a writeback cache absorbs.")
    s.add_argument("--trace", required=True, metavar="FILE", help="a file from cachemgr trace")
    s.add_argument("--sizes", type=sizes, metavar="LIST", help="cache sizes, e.g. 32M,16G")
    s.add_argument("--device", metavar="DEV", help="only this device of the trace")
    s.add_argument("--rate", type=rate, metavar="R",
                   help="sample further (at most the recorded rate)")
    s.add_argument("--block", type=block, metavar="SIZE",
                   help="cache block (only a trace recorded at rate 1 can change it)")
    s.add_argument("--hdd-latency", type=latency_ms, metavar="T",
                   help="the uncached disk's read latency (default: measured in the trace)")
    s.add_argument("--ssd-latency", type=latency_ms, metavar="T",
                   help="the cache SSD's read latency (default 0.1ms)")
    s.add_argument("--plot", metavar="FILE", help="write the curve: FILE.png/.svg, or both")
    s.add_argument("--json", action="store_true",
                   help='{"schema": 1, "curve": [{"cache_bytes": N, "hit_ratio": F, ...}], ...}')
    s.set_defaults(func=cmd_size)
