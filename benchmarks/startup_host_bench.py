"""Command start-up on the host (docs/benchmarks.md, "Command start-up"): ``python -m
cachemgr`` from two checkouts, each command run with one then the other in turn, wall time
and the child's CPU time (getrusage). A capture stands in for devices (tests/fixtures);
"live" reads this host's /sys and asks qemu:///system, whose daemon need not run. Each
checkout needs a ``.venv`` (a link to the one of the main checkout will do).

    .venv/bin/python benchmarks/startup_host_bench.py --reps 20 OLD_CHECKOUT NEW_CHECKOUT
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("checkouts", nargs=2)
    args = ap.parse_args()
    args.checkouts = [os.path.abspath(c) for c in args.checkouts]
    cap = str(next(Path(args.checkouts[1], "tests", "fixtures").glob(
        "bcache-writeback-dirty-*")) / "sys")
    cmds = {
        "status --json (live)": ["status", "--json"],
        "vms --json (live)": ["vms", "--json"],
        "status --json (a capture)": ["--sysfs-root", cap, "status", "--json"],
        "check --json (a capture)": ["--sysfs-root", cap, "check", "--json"],
        "mode (a capture)": ["--sysfs-root", cap, "mode", "/dev/bcache0", "none"],
    }
    res: dict[str, dict[str, tuple[list[float], list[float]]]] = {
        c: {k: ([], []) for k in cmds} for c in args.checkouts}
    for _ in range(args.reps):
        for k, argv in cmds.items():
            for c in args.checkouts:
                ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run([f"{c}/.venv/bin/python", "-m", "cachemgr", *argv],
                               capture_output=True, env={**os.environ, "PYTHONPATH": c},
                               cwd=c, timeout=300, check=False)
                t1 = time.perf_counter()
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                res[c][k][0].append(t1 - t0)
                res[c][k][1].append(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
    old, new = args.checkouts
    for k in cmds:
        b, a = res[old][k], res[new][k]
        print(f"{k:30} wall {statistics.median(b[0]):.3f} -> {statistics.median(a[0]):.3f}"
              f"  cpu {statistics.median(b[1]):.3f} -> {statistics.median(a[1]):.3f}")
    print("load average", os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
