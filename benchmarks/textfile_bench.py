"""Benchmark: the CPU of node_exporter's textfile kept fresh for an hour, the timer's way (a
``cachemgr metrics --textfile`` process every 15 s) against one ``--interval`` process
(issue #34 item 1). Runs in the lab:

    cachemgr lab run --backend uml --disks 2G,256M --timeout 1200 -- \\
        .venv/bin/python benchmarks/textfile_bench.py 64 [--refreshes 20] [--interval 15]

Builds N dm-linear slices of the first scratch disk as backing devices of one cache set on
the second (scan_bench's devices), then, against those devices, without libvirt
(``--no-vms``):

* ``timer``: ``--refreshes`` runs of ``cachemgr metrics --no-vms --textfile F``, one process
  each, back to back (what cachemgr-textfile.timer started every 15 s: the interpreter's
  start-up, the imports and a full scan each time); the CPU of each from getrusage's
  children (the process and the dmsetup it waited for);
* ``loop``: one ``cachemgr metrics --no-vms --textfile G --interval S`` process, at the
  unit's own interval (so bcache's stats intervals are read at their real pace, once a
  minute), until it has rewritten G ``--refreshes`` times after its first file; its CPU
  (utime + stime of the process and its waited-for children, /proc/PID/stat) when the first
  file appears (start-up and the first, full, scan) and at the last rewrite.

An hour at 15 s is 240 refreshes: ``timer`` 240 x the mean CPU of a run; ``loop`` its start-up
plus 239 x the mean CPU of a rewrite. Prints one JSON line with both, their ratio, and
whether the two files hold the same samples (the loop's with the measured write-back traffic
too, which a one-shot cannot know). Times are UML's: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

HOUR_REFRESHES = 3600 // 15
WB = "cachemgr_bcache_written_back_bytes_per_second"


def cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (proc(5): fields 14-17)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    f = text[text.rindex(")") + 2:].split()
    return sum(int(x) for x in f[11:15])


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def timer_runs(out: Path, runs: int) -> dict[str, object]:
    cpu, wall = [], []
    for _ in range(runs):
        c0, t0 = children_cpu(), time.perf_counter()
        subprocess.run([sys.executable, "-m", "cachemgr", "metrics", "--no-vms", "--textfile",
                        str(out)], cwd=REPO, env=env(), check=True)
        wall.append(time.perf_counter() - t0)
        cpu.append(children_cpu() - c0)
    return {"runs": runs, "cpu_ms_mean": round(statistics.fmean(cpu) * 1000, 1),
            "cpu_ms_median": round(statistics.median(cpu) * 1000, 1),
            "wall_ms_median": round(statistics.median(wall) * 1000, 1),
            "hour_cpu_s": round(statistics.fmean(cpu) * HOUR_REFRESHES, 2)}


def loop_run(out: Path, refreshes: int, interval: float) -> dict[str, object]:
    hz = os.sysconf("SC_CLK_TCK")
    c0 = children_cpu()
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "cachemgr", "metrics", "--no-vms",
                          "--textfile", str(out), "--interval", str(interval)],
                         cwd=REPO, env=env(), stderr=subprocess.DEVNULL)
    try:
        ino, seen = None, -1
        first = last = 0
        deadline = t0 + 120 + (refreshes + 2) * interval
        while seen < refreshes:
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the loop stopped or stalled (exit {p.poll()}, {seen})")
            time.sleep(0.02)
            try:
                now = out.stat().st_ino
            except FileNotFoundError:
                continue
            if now != ino:
                ino, seen = now, seen + 1
                ticks = cpu_ticks(p.pid)
                if seen == 0:
                    first = ticks
                    first_s = time.monotonic() - t0
                last = ticks
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    total = children_cpu() - c0
    start = first / hz
    per = (last - first) / hz / refreshes
    return {"refreshes": refreshes, "interval_s": interval, "exit": rc,
            "first_file_s": round(first_s, 2), "startup_cpu_ms": round(start * 1000, 1),
            "cpu_ms_per_rewrite": round(per * 1000, 1), "total_cpu_s": round(total, 2),
            "hour_cpu_s": round(start + per * (HOUR_REFRESHES - 1), 2)}


def samples(path: Path) -> list[str]:
    return sorted(x for x in path.read_text().splitlines() if not x.startswith(WB))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=64)
    ap.add_argument("--refreshes", type=int, default=20)
    ap.add_argument("--interval", type=float, default=15.0)
    a = ap.parse_args()
    from scan_bench import build

    build(a.n)
    rundir = Path(os.environ.get("LAB_RUNDIR", "/tmp"))
    one, many = rundir / "timer.prom", rundir / "loop.prom"
    timer = timer_runs(one, a.refreshes)
    loop = loop_run(many, a.refreshes, a.interval)
    res = {"devices": a.n, "kernel": os.uname().release, "timer": timer, "loop": loop,
           "hour_ratio": round(loop["hour_cpu_s"] / timer["hour_cpu_s"], 3),  # type: ignore[operator]
           "same_samples": samples(one) == samples(many),
           "loop_wb_samples": many.read_text().count(WB + "{")}
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
