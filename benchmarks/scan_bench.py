"""Benchmark: one status scan of N bcache backing devices on one cache set (runs in the lab).

    cachemgr lab run --disks 2G,256M -- .venv/bin/python benchmarks/scan_bench.py [N]

Builds N dm-linear slices of the first scratch disk, formats them all as backing devices of
one cache set on the second disk, then times snapshot.take() and counts the sysfs reads it
makes (a counting Sysfs). Prints one JSON line: devices, reads per scan, reads per device,
milliseconds per scan (median of 20). Times are UML's (HZ=100, hostfs): compare ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from cachemgr.backends import bcache

from cachemgr.core import runner

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs


class CountingSysfs(Sysfs):
    reads = 0

    def read(self, rel: str) -> str:
        CountingSysfs.reads += 1
        return super().read(rel)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    disk, ssd = os.environ["LAB_DISKS"].split()[:2]
    total = int(runner.run(["blockdev", "--getsz", disk]).stdout)
    slice_sectors = total // n
    names = []
    for i in range(n):
        name = f"vm{i:03d}"
        runner.run(["dmsetup", "create", name, "--table",
                    f"0 {slice_sectors} linear {disk} {i * slice_sectors}"])
        names.append(f"/dev/mapper/{name}")
    bcache.make_bcache(backing=names, cache=ssd, bucket="128k")
    sysfs = Sysfs()
    for d in [ssd, *names]:
        bcache.register(sysfs, d)
    ok = bcache.wait_for(lambda: len(snapshot.take(sysfs).backings) == n and all(
        b.cset_uuid for b in snapshot.take(sysfs).backings), 60, 0.5)
    if not ok:
        print("not all devices attached", file=sys.stderr)
        return 1
    cs = CountingSysfs()
    times = []
    for _ in range(20):
        CountingSysfs.reads = 0
        t0 = time.perf_counter()
        snap = snapshot.take(cs)
        times.append((time.perf_counter() - t0) * 1000)
        assert len(snap.backings) == n
    reads = CountingSysfs.reads
    print(json.dumps({"devices": n, "reads_per_scan": reads, "reads_per_device": reads / n,
                      "ms_per_scan_median": round(statistics.median(times), 1),
                      "ms_per_scan_min": round(min(times), 1),
                      "kernel": os.uname().release}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
