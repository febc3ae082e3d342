"""The lab demo (README's main job until the TUI opens on it): runs *inside* the lab guest.

Builds a slow "HDD" (dm-delay, a few ms per IO) over the first scratch disk, a bcache device
over it with the second scratch disk as the caching "SSD", switches it to writeback, runs a
short Zipf-distributed QD1 random-write fio job on it (and first on the bare HDD and the bare
SSD: how close bcache comes to the SSD, the lab's ceiling), and prints ``cachemgr status``. On an
interactive lab (``LabSpec(interactive=True)``: the guest has the host's terminal) it then
opens the TUI on that cache with a workload running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from cachemgr.backends import snapshot
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control
from cachemgr.ops.render import status_table
from cachemgr.procedures import bench

DELAY_MS = 8
BENCH_DELAY_MS = 8  # bench demo's two "HDDs"


def writeback_bcache(sysfs: Sysfs, backing: str, ssd: str) -> str:
    """A bcache device in writeback over ``backing``, cached by ``ssd`` (both scratch disks,
    formatted over whatever they hold): the ``create bcache`` command (ops/cache.py), so
    through the gate as an admin's would be (its capability, the disks' locks, the journal
    trail). Returns its /dev/bcacheN."""
    cache_ops.create_bcache(sysfs, backings=[backing], cache=ssd, mode="writeback",
                            bucket="128k", force=True, ctl=Control(what="demo"))
    node = os.path.realpath(backing)
    b = next(x for x in snapshot.take(sysfs, stats=False).backings
             if node in (x.identity.node, os.path.realpath(x.identity.node)))
    assert b.device is not None
    return b.device


def build_demo_devices(disks: list[str]) -> tuple[str, str]:
    """``bench demo``'s devices: two identical dm-delay "HDDs" (halves of the first disk)
    and bcache in writeback over the second one, cached by the second disk
    (:func:`writeback_bcache`). Returns (bare HDD, bcache device). A third disk, if any,
    stays bare: the reference SSD (a disk of the same kind as the cache's)."""
    raw, ssd = disks[0], disks[1]
    sectors = int(runner.run(["blockdev", "--getsz", raw]).stdout.strip())
    half = sectors // 2
    runner.run(["dmsetup", "create", "hdd", "--table",
                f"0 {half} delay {raw} 0 {BENCH_DELAY_MS}"])
    runner.run(["dmsetup", "create", "hdd2", "--table",
                f"0 {half} delay {raw} {half} {BENCH_DELAY_MS}"])
    return "/dev/mapper/hdd", writeback_bcache(Sysfs(), "/dev/mapper/hdd2", ssd)


def fio_run(target: str, seconds: int) -> bench.FioResult:
    """QD1 4k random writes, Zipf(1.2), through the bench module (job file, JSON parsing)."""
    spec = bench.JobSpec(rw="randwrite", iodepth=1, distribution="zipf:1.2", size="256M",
                         runtime=seconds)
    t = bench.Target(label="demo", spec=target, device=target, name=None)
    return bench.run_fio(spec, t, seed=1)[0]


def _p99(r: bench.FioResult) -> str:
    p = r.latency.p99_us if r.latency else None
    return f"{p / 1000:.2f} ms" if p is not None else "?"


def main() -> int:
    if os.environ.get("CACHEMGR_IN_LAB") != "1":
        print("demo: refusing to run outside the lab (it formats disks)", file=sys.stderr)
        return 3
    disks = os.environ.get("LAB_DISKS", "").split()
    if len(disks) < 2:
        print("demo: needs two scratch disks (cachemgr lab demo --disks 2G,512M)",
              file=sys.stderr)
        return 2
    hdd_raw, ssd = disks[0], disks[1]
    sysfs = Sysfs()
    sectors = runner.run(["blockdev", "--getsz", hdd_raw]).stdout.strip()
    runner.run(["dmsetup", "create", "slowhdd", "--table",
                f"0 {sectors} delay {hdd_raw} 0 {DELAY_MS}"])
    hdd = "/dev/mapper/slowhdd"
    print(f"demo: slow HDD {hdd} = {hdd_raw} + {DELAY_MS} ms per IO (dm-delay)")
    bare_r = fio_run(hdd, 5)
    bare = bare_r.iops
    print(f"demo: bare slow HDD, QD1 4k random writes (Zipf 1.2): {bare:.0f} IOPS, "
          f"p99 {_p99(bare_r)}")
    # the lab's physical ceiling: the same job on the SSD itself, before it becomes the cache
    # (bcache in writeback writes every request to it)
    ssd_r = fio_run(ssd, 5)
    print(f"demo: bare SSD {ssd}, same job: {ssd_r.iops:.0f} IOPS, p99 {_p99(ssd_r)} "
          "(the ceiling for writes through a cache on it)")
    # force: the SSD holds what the bare-SSD run just wrote (nothing else: a scratch disk)
    dev = writeback_bcache(sysfs, hdd, ssd)
    print(f"demo: {os.path.basename(dev)} = slow HDD cached by", ssd, "in writeback mode")
    cached_r = fio_run(dev, 5)
    cached = cached_r.iops
    print(f"demo: through bcache, same job: {cached:.0f} IOPS ({cached / bare:.0f}x the "
          f"HDD, {100 * cached / ssd_r.iops:.0f}% of the bare SSD), p99 {_p99(cached_r)}")
    print("demo: the full comparison (repetitions, percentiles, plots): cachemgr bench demo")
    time.sleep(0.5)
    print()
    print("$ cachemgr status")
    print(status_table(snapshot.take(sysfs)))
    # an interactive lab (LabSpec(interactive=True)) gives the command the host's terminal
    if sys.stdin.isatty() and sys.stdout.isatty():
        return tui_with_workload(dev)
    return 0


def workload(target: str) -> subprocess.Popen[bytes]:
    """A VM-like load so that the dashboard's numbers move: Zipf 1.2 random reads and
    writes at a modest rate (dirty data builds up in writeback, the hit ratio climbs)."""
    return subprocess.Popen(
        ["fio", "--name=vm", f"--filename={target}", "--rw=randrw", "--rwmixread=60",
         "--bs=4k", "--direct=1", "--ioengine=psync", "--random_distribution=zipf:1.2",
         "--size=256M", "--rate_iops=150", "--time_based", "--runtime=86400",
         "--output=/dev/null"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tui_with_workload(target: str) -> int:
    """The end of an interactive demo: the TUI (`cachemgr tui`, a separate process: the
    library never imports textual) on the demo's cache while a workload runs."""
    load = workload(target)
    try:
        return subprocess.run([sys.executable, "-m", "cachemgr", "tui"]).returncode
    finally:
        load.terminate()
        load.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
