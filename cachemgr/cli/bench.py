"""``cachemgr bench``: run, compare and plot fio benchmarks of caches (docs/cli.md).

    cachemgr bench run TARGET [job options] [--json] [--out DIR]
    cachemgr bench compare TARGET... [--rw randwrite|randread|randrw] [--bs 4k] [--iodepth N]
            [--zipf THETA] [--runtime S] [--repeat N] [--json] [--out DIR]
    cachemgr bench plot RESULT.json [--out DIR]
    cachemgr bench demo                      # in the lab: dm-delay HDD vs bcache writeback

TARGET is ``[LABEL=]DEVICE[:MODE][@SCHEDULER]``: ``/dev/mapper/hdd``, ``/dev/bcache0``,
``wb=/dev/bcache0:writeback`` (the mode is switched for those runs and restored after),
``/dev/sdb@bfq`` (the disk's IO scheduler for those runs; a bio-based device's @SCHEDULER is
set on the disks under it; restored after). The bare disk under a bcache device is
``/dev/bcache0:none`` (its backing device itself is refused for writes: they would overwrite
its bcache superblock). ``--reference cache-ssd`` measures each cache's own SSD apart, read
only, so that a cache no faster than the bare disk is explained. Results
are saved as JSON under the results directory (``/var/lib/cachemgr/bench``, or
``$CACHEMGR_BENCH_DIR``, or ``--out``) with the plots next to them; ``--json`` prints the same
document (``{"schema": 1, "results": [...], ...}``) on stdout. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.core import defaults
from cachemgr.core.errors import UsageError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.ops import bench as bench_ops
    from cachemgr.ops import control
    from cachemgr.ops.control import Result
    from cachemgr.procedures import bench
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    bench = lazy("cachemgr.procedures.bench")
    bench_ops = lazy("cachemgr.ops.bench")
    control = lazy("cachemgr.ops.control")


def job_options(s: argparse.ArgumentParser, *, rw: str = "randwrite", repeat: int = 3) -> None:
    g = s.add_argument_group("job")
    g.add_argument("--rw", default=rw, choices=defaults.RW_MODES)
    g.add_argument("--bs", default="4k", metavar="SIZE", help="block size (default 4k)")
    g.add_argument("--iodepth", type=argtypes.count, default=1, metavar="N", help="queue depth (1)")
    g.add_argument("--jobs", type=argtypes.count, default=1, metavar="N",
                   help="parallel fio jobs (1)")
    g.add_argument("--zipf", type=argtypes.positive, metavar="THETA",
                   help="Zipf theta of the random offsets (default 1.2)")
    g.add_argument("--distribution", metavar="DIST",
                   help="any fio random_distribution (pareto:0.9, normal:5, random, ...)")
    g.add_argument("--size", metavar="SIZE", help="region addressed (default: whole device)")
    g.add_argument("--offset", metavar="SIZE")
    g.add_argument("--runtime", type=argtypes.seconds, default=5.0, metavar="S", help="seconds (5)")
    g.add_argument("--ramp", type=argtypes.seconds_or_zero, default=0.0, metavar="S",
                   help="seconds run before measuring")
    g.add_argument("--rwmixread", type=argtypes.percent, default=70, metavar="PCT")
    g.add_argument("--steadystate", metavar="CRIT",
                   help="fio steady-state criterion, e.g. iops_slope:2%% (ends a run early once "
                        "reached; runs that never reach it are flagged)")
    g.add_argument("--ss-dur", type=argtypes.seconds, metavar="S")
    g.add_argument("--ss-ramp", type=argtypes.seconds_or_zero, metavar="S")
    g.add_argument("--rate-iops", type=argtypes.count, metavar="N")
    c = s.add_argument_group("repetitions and cache hygiene")
    c.add_argument("--repeat", type=argtypes.count, default=repeat, metavar="N",
                   help=f"runs per target, interleaved ({repeat})")
    c.add_argument("--tolerance", type=argtypes.non_negative, default=defaults.DEFAULT_TOLERANCE,
                   metavar="F",
                   help="flag runs whose IOPS differ from the median by more (0.2)")
    c.add_argument("--warmup", metavar="SPEC",
                   help="before each cache run: SECONDS, NUMBERios (e.g. 300000ios), or auto "
                        "(3x Che's characteristic time)")
    c.add_argument("--fresh-cache", action="store_true",
                   help="rebuild the cache set before each cache run (detach, wipe, re-create)")
    c.add_argument("--reset-stats", action="store_true", help="clear bcache's stats first")
    c.add_argument("--no-settle", action="store_true",
                   help="do not wait for bcache's ~13.6 s stats tick after read runs")
    c.add_argument("--keep-congestion", action="store_true",
                   help="leave the congestion thresholds as they are (default: 0 for the run)")
    c.add_argument("--seed", type=argtypes.whole, default=1, metavar="N",
                   help="base of fio's randseed")
    c.add_argument("--force", action="store_true",
                   help="write even to devices that look in use or hold data (destroys it)")
    c.add_argument("--sample-interval", type=argtypes.seconds_or_zero, default=1.0,
                   metavar="S", help="seconds between samples of the cache while fio runs "
                   "(dirty data, free space, progress; 0: none; default 1)")
    c.add_argument("--reference", action="append", default=[], metavar="[CACHE=]REF",
                   help="report each cache target's (or CACHE's) IOPS as a fraction of "
                        "REF's, and when a cache is no faster than the first target, whether "
                        f"its SSD is. REF: {defaults.CACHE_SSD} (each cache's own SSD) or a "
                        "device path, measured apart with reads only (fio --readonly, the "
                        "job's block size and queue depth, up to 5 s a repetition: never a "
                        "write to a device that holds a cache); or the label of a target "
                        "(a bare scratch disk like the cache's SSD, run with the job itself). "
                        "Repeat for caches on different SSDs")
    o = s.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result document (schema 1)")
    o.add_argument("--out", metavar="DIR", help="results directory")
    o.add_argument("--no-save", action="store_true", help="do not save the result")
    o.add_argument("--no-plot", action="store_true", help="do not draw the plots")


def spec_from(args: argparse.Namespace) -> bench.JobSpec:
    if args.zipf is not None and args.distribution:
        raise UsageError("give --zipf or --distribution, not both")
    dist = args.distribution or f"zipf:{args.zipf if args.zipf is not None else 1.2:g}"
    spec = bench.JobSpec(
        rw=args.rw, bs=args.bs, iodepth=args.iodepth, numjobs=args.jobs, distribution=dist,
        size=args.size, offset=args.offset, runtime=args.runtime, ramp=args.ramp,
        rwmixread=args.rwmixread, steadystate=args.steadystate, ss_dur=args.ss_dur,
        ss_ramp=args.ss_ramp, rate_iops=args.rate_iops,
    )
    spec.validate()
    return spec


def options_from(args: argparse.Namespace) -> bench.CompareOptions:
    warm_s, warm_ios, auto = bench_ops.parse_warmup(args.warmup)
    opts = bench.CompareOptions(
        repeat=args.repeat, warmup=warm_s, warmup_ios=warm_ios, warmup_auto=auto,
        fresh=args.fresh_cache, settle=not args.no_settle, reset_stats=args.reset_stats,
        tolerance=args.tolerance, force=args.force, seed=args.seed,
        congestion_off=not args.keep_congestion, sample_interval=args.sample_interval,
        reference=tuple(bench.parse_reference(r) for r in args.reference))
    opts.validate()
    return opts


class _Reporter:
    """Progress on stderr: rewritten in place on a terminal, every line otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def __call__(self, msg: str) -> None:
        if self.tty:
            print("\r" + msg[:100].ljust(100), end="", file=sys.stderr, flush=True)
        else:
            print(f"bench: {msg}", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _compare(args: argparse.Namespace, targets: list[str]) -> int:
    spec = spec_from(args)
    opts = options_from(args)
    rep = _Reporter()
    argv = ["cachemgr", *sys.argv[1:]] if sys.argv and "cachemgr" in sys.argv[0] else []
    try:
        res = bench_ops.compare(Sysfs(args.sysfs_root), spec, targets, opts,
                                ctl=control.Control(progress=rep, what="bench"), out=args.out,
                                save=not args.no_save, plots=not args.no_plot, argv=argv)
    finally:
        rep.done()
    return _print(args, res)


def _print(args: argparse.Namespace, res: Result) -> int:
    """A bench result: notes on stderr, the document (--json) or the table on stdout."""
    for note in res.notes:
        print(note, file=sys.stderr)
    assert res.data is not None
    if args.json:
        print(json.dumps(res.data, indent=2))
    else:
        print("\n".join(res.lines))
    return int(res.exit_code)


def cmd_run(args: argparse.Namespace) -> int:
    return _compare(args, [args.target])


def cmd_compare(args: argparse.Namespace) -> int:
    return _compare(args, list(args.targets))


def cmd_replay(args: argparse.Namespace) -> int:
    rep = _Reporter()
    try:
        res = bench_ops.replay(Sysfs(args.sysfs_root), args.target, args.trace,
                               device=args.device, iodepth=args.iodepth, force=args.force,
                               ctl=control.Control(progress=rep, what="bench replay"), out=args.out,
                               save=not args.no_save)
    finally:
        rep.done()
    return _print(args, res)


def cmd_plot(args: argparse.Namespace) -> int:
    from cachemgr.procedures import plot

    doc = bench.load(args.result)
    out = Path(args.out) if args.out else Path(args.result).parent
    for p in plot.write_plots(doc, out, stem=Path(args.result).stem):
        print(p)
    return ExitCode.OK


# ----------------------------------------------------------------------------- demo

def cmd_demo(args: argparse.Namespace) -> int:
    """Outside the lab: boot it and run this command there. Inside: build and compare."""
    if os.environ.get("CACHEMGR_IN_LAB") != "1":
        from cachemgr.lab import core

        spec = core.LabSpec(disks=core.parse_disks(args.disks), timeout=args.timeout)
        argv = [sys.executable, "-m", "cachemgr", "bench", "demo",
                "--runtime", f"{args.runtime:g}", "--repeat", str(args.repeat)]
        if args.out:
            argv += ["--out", os.path.abspath(args.out)]
        return core.run(argv, spec).returncode
    return run_demo(args)


def build_demo_devices(disks: list[str]) -> tuple[str, str]:
    """The demo's devices (cachemgr/lab/demo.py: its bcache device made by the create
    command, through the gate)."""
    from cachemgr.lab import demo

    return demo.build_demo_devices(disks)


def run_demo(args: argparse.Namespace) -> int:
    disks = os.environ.get("LAB_DISKS", "").split()
    if len(disks) < 2:
        raise UsageError("the demo needs two scratch disks (cachemgr bench demo --disks 4G,2G)")
    hdd, bc = build_demo_devices(disks)
    out = args.out or os.path.join(os.getcwd(), "results",
                                   time.strftime("bench-demo-%Y%m%d-%H%M%S"))
    ref = disks[2] if len(disks) > 2 else None
    from cachemgr.lab.demo import BENCH_DELAY_MS

    print(f"demo: bare HDD {hdd} (dm-delay {BENCH_DELAY_MS} ms per IO) vs {bc} (bcache "
          f"writeback over an identical HDD, cached by {disks[1]})"
          + (f" vs the bare SSD {ref} (a disk like the cache's: the lab's physical ceiling)"
             if ref else "") + f"; results in {out}")
    sysfs = Sysfs()
    rep = _Reporter()
    rc = 0
    targets = [f"hdd={hdd}", *([f"ssd={ref}"] if ref else []), f"bcache-wb={bc}:writeback"]
    reference = (("bcache-wb", "ssd"),) if ref else ()
    ceiling: list[str] = []
    for rw in ("randwrite", "randread"):
        for qd in (1, 8):
            spec = bench.JobSpec(rw=rw, iodepth=qd, distribution="zipf:1.2", size="1G",
                                 runtime=args.runtime)
            opts = bench.CompareOptions(repeat=args.repeat, warmup=10 if rw == "randread"
                                        else 0, settle=rw == "randread", reference=reference)
            try:
                res = bench_ops.compare(sysfs, spec, targets, opts,
                                        ctl=control.Control(progress=rep, what="bench demo"),
                                        out=out)
            finally:
                rep.done()
            for note in res.notes:
                print(note, file=sys.stderr)
            print()
            print("\n".join(res.lines))
            if res.failed:
                rc = 1
            assert res.data is not None
            ceiling += demo_ceiling(res.data)
    if ceiling:
        print()
        print("how close bcache comes to the lab's physical ceiling (the bare SSD, same job):")
        print("\n".join(ceiling))
    return rc


def demo_ceiling(doc: dict[str, Any]) -> list[str]:
    """One line per cache result with a reference: its share of the bare SSD's IOPS and its
    speed-up over the HDD (the first target)."""
    out = []
    for r in doc["results"]:
        frac, ref = r.get("reference_iops_fraction"), r.get("reference")
        if frac is None or not ref:
            continue
        over = r.get("iops_ratio")
        out.append(f"  {doc.get('job_description', '')}: {r['label']} "
                   f"{_num(r['iops'])} IOPS = {100 * frac:.0f}% of the bare SSD's "
                   f"{_num(ref['iops'])}"
                   + (f", {over:.1f}x the HDD's" if over is not None else ""))
    return out


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def register(sub: Any) -> None:
    """Add ``bench`` and its subcommands to the top-level parser (cli.main.GROUPS)."""
    p = sub.add_parser("bench", help="fio benchmarks of caches: run, compare, plot, demo")
    bsub = p.add_subparsers(dest="benchcmd", metavar="BENCHCOMMAND")
    bsub.required = True

    s = bsub.add_parser("run", help="benchmark one target")
    s.add_argument("target", metavar="TARGET", help="[LABEL=]DEVICE[:MODE][@SCHEDULER]")
    job_options(s, repeat=1)
    s.set_defaults(func=cmd_run)

    s = bsub.add_parser("compare", help="the same job on several targets, modes or IO "
                                        "schedulers, interleaved",
                        description="The same fio job on every TARGET, interleaved, with the "
                                    "ratios against the first. The bare disk and its cache: "
                                    "cachemgr bench compare /dev/bcache0:none "
                                    "/dev/bcache0:writeback --reference cache-ssd (writes: a "
                                    "scratch device; --rw randread --size 1G --warmup 30 "
                                    "reads only).")
    s.add_argument("targets", nargs="+", metavar="TARGET",
                   help="[LABEL=]DEVICE[:MODE][@SCHEDULER]; the first is the baseline of the "
                        "ratios (the bare disk under a bcache device: /dev/bcache0:none; its "
                        "backing device itself is refused for writes). @SCHEDULER "
                        "(mq-deadline, bfq, kyber, none) puts the device's "
                        "disk on that IO scheduler for its runs (a bcache or dm device: the "
                        "disks under it); the schedulers are restored afterwards")
    job_options(s)
    s.set_defaults(func=cmd_compare)

    s = bsub.add_parser("replay", help="replay a recorded trace on a cache: measured against "
                                       "predicted hit ratio")
    s.add_argument("target", metavar="TARGET", help="[LABEL=]DEVICE[:MODE], e.g. /dev/bcache0")
    s.add_argument("--trace", required=True, metavar="FILE", help="a file from cachemgr trace")
    s.add_argument("--device", metavar="DEV", help="the traced device to replay (if several)")
    s.add_argument("--iodepth", type=argtypes.count, default=1, metavar="N",
                   help="requests in flight (1: the recorded order exactly)")
    s.add_argument("--force", action="store_true",
                   help="replay recorded writes even on a device that looks in use or holds "
                        "data (destroys it)")
    s.add_argument("--json", action="store_true", help="the result document on stdout")
    s.add_argument("--out", metavar="DIR", help="results directory")
    s.add_argument("--no-save", action="store_true", help="do not save the result")
    s.set_defaults(func=cmd_replay)

    s = bsub.add_parser("plot", help="latency-percentile and IOPS charts from a saved result")
    s.add_argument("result", metavar="RESULT.json")
    s.add_argument("--out", metavar="DIR", help="where to write (default: next to the result)")
    s.set_defaults(func=cmd_plot)

    s = bsub.add_parser("demo", help="lab preset: dm-delay HDD vs bcache writeback, Zipf 1.2 "
                                     "random writes and reads at QD1 and QD8")
    s.add_argument("--disks", default="4G,2G,2G", metavar="SIZES",
                   help="HDD (halved), cache SSD and, if given, a bare reference SSD "
                        "(4G,2G,2G)")
    s.add_argument("--runtime", type=argtypes.seconds, default=4.0, metavar="S")
    s.add_argument("--repeat", type=argtypes.count, default=2, metavar="N")
    s.add_argument("--timeout", type=argtypes.seconds, default=1200.0, metavar="S")
    s.add_argument("--out", metavar="DIR")
    s.set_defaults(func=cmd_demo)
