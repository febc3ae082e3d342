"""Benchmark: the bench's own cost and its ceiling (issue #20 item 3; runs in the lab).

    cachemgr lab run --disks 2G,1G,1G --timeout 1800 -- \\
        .venv/bin/python benchmarks/bench_fidelity_bench.py [--repeat R] [--runtime S]
        [--size 32M] [--modes off,on,on_10x,old,old_10x] [--no-ceiling]

Builds bench demo's devices (two "HDDs": halves of the first disk behind dm-delay, 8 ms per
IO; bcache in writeback over the second, cached by the second disk) and keeps the third disk
bare: the reference SSD, a disk of the same kind as the cache's. Then:

1. **The sampler's effect**: the same QD1 4k Zipf(1.2) random-write job (over the first
   ``--size``, 32M) on the bcache device with the cache sampled not at all, every second
   (the default), every 0.1 s (10x), and, for comparison, with the sampler as it was before
   issue #20 (a whole snapshot and a reread of the backing device a sample) at 1 s and
   0.1 s; R repetitions, every mode once per repetition, the order rotated. Per mode: the
   sampler's own wall and CPU time, median IOPS and p99, and their change against "off" of
   the same repetition (median of the pairs and their middle half).
2. **The ceiling**: ``bench compare hdd ssd bcache --reference bcache=ssd`` with the same job
   (R repetitions, interleaved): bcache's IOPS as a fraction of the bare SSD's and its
   speed-up over the HDD.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from cachemgr.backends import bcache, snapshot
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import bench
from cachemgr.procedures.bench import comparison, sampling


class OldSampler(sampling._Sampler):
    """The sampler before issue #20, for comparison: each sample read the device's stat
    through a fresh device listing, the backing device in full (bcache.reread: ~60 files)
    and a whole snapshot for the cache set's free space (every bcache and dm file, dmsetup)."""

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            t, c = time.monotonic(), time.thread_time()
            try:
                st = sampling.read_block_stat(self.sysfs, self.name)
                dirty = None
                if self.backing_name:
                    b = bcache.reread(self.sysfs, self.backing_name)
                    dirty = b.dirty.bytes if b.dirty else None
                    cs = snapshot.take(self.sysfs).cache_set(b.cset_uuid or "")
                    if cs and cs.cache_available_percent is not None:
                        self.avail.append(cs.cache_available_percent)
            except CacheMgrError:
                return
            self.samples += 1
            self.busy_s += time.monotonic() - t
            self.cpu_s += time.thread_time() - c
            if st is not None and self.start_stat is not None:
                done = st.minus(self.start_stat)
                self.points.append((round(time.monotonic() - self.t0, 2), dirty,
                                    done.reads + done.writes))


def build(disks: list[str]) -> tuple[str, str, str]:
    """bench demo's devices (two halves of the first disk behind 8 ms dm-delay, bcache in
    writeback over the second half cached by the second disk) and the third disk bare."""
    from cachemgr.cli.bench import build_demo_devices

    hdd, bc = build_demo_devices(disks[:2])
    return hdd, bc, disks[2]


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--runtime", type=float, default=5.0)
    # a region whose dirty blocks stay well under writeback_percent of the cache: over 512M
    # the 1G cache filled with dirty buckets within the first runs and the rest ran at the
    # HDD's 100 IOPS (measured)
    ap.add_argument("--size", default="32M")
    ap.add_argument("--modes", default="off,on,on_10x,old,old_10x",
                    help="which of off,on,on_10x,old,old_10x (off always)")
    ap.add_argument("--no-ceiling", action="store_true")
    a = ap.parse_args()
    hdd, bc, ref = build(os.environ["LAB_DISKS"].split())
    sysfs = Sysfs()
    spec = bench.JobSpec(rw="randwrite", iodepth=1, distribution="zipf:1.2", size=a.size,
                         runtime=a.runtime)
    target = bench.resolve_target(sysfs, f"bcache={bc}")
    modes = {"off": (0.0, sampling._Sampler), "on": (1.0, sampling._Sampler),
             "on_10x": (0.1, sampling._Sampler), "old": (1.0, OldSampler),
             "old_10x": (0.1, OldSampler)}
    modes = {m: v for m, v in modes.items() if m == "off" or m in a.modes.split(",")}
    got: dict[str, list[bench.RunResult]] = {m: [] for m in modes}
    samples: dict[str, list[int]] = {m: [] for m in modes}
    busy: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    real = getattr(comparison, "_Sampler")  # noqa: B009 (a private name, swapped per mode)
    hyg = bench.Hygiene(sysfs)
    names = list(modes)
    try:
        for rep in range(1, a.repeat + 1):
            # every mode once per repetition, the order rotated each time (no mode always
            # runs right after a given other)
            k = rep % len(names)
            for m in names[k:] + names[:k]:
                interval, cls = modes[m]
                made: list[sampling._Sampler] = []

                def make(*args: object, _cls: type = cls, **kw: object) -> sampling._Sampler:
                    s = _cls(*args, **kw)
                    made.append(s)  # noqa: B023 (called within this iteration)
                    return s  # type: ignore[no-any-return]

                setattr(comparison, "_Sampler", make)  # noqa: B010
                opts = bench.CompareOptions(repeat=1, settle=False, sample_interval=interval)
                got[m].append(bench.run_one(sysfs, spec, target, rep, opts, hyg))
                samples[m].append(made[0].samples if made else 0)
                busy[m].append(made[0].busy_s if made else 0.0)
                cpu[m].append(made[0].cpu_s if made else 0.0)
    finally:
        setattr(comparison, "_Sampler", real)  # noqa: B010
        hyg.restore()
    res: dict[str, object] = {"job": spec.describe(), "repeat": a.repeat,
                              "kernel": os.uname().release}
    sampler: dict[str, object] = {}

    def p99(r: bench.RunResult) -> float:
        v = r.fio.latency.p99_us if r.fio.latency else None
        return v if v is not None else float("nan")

    for m, rs in got.items():
        # paired with "off" of the same repetition (minutes apart at most): the host's drift
        # cancels; the median of those ratios, and their middle half
        di = sorted(r.fio.iops / o.fio.iops - 1 for r, o in zip(rs, got["off"], strict=True))
        dp = sorted(p99(r) / p99(o) - 1 for r, o in zip(rs, got["off"], strict=True))
        q = len(di) // 4
        sampler[m] = {"interval_s": modes[m][0], "samples": samples[m],
                      # the sampler's own time: wall (includes waiting for the CPU) and
                      # CPU (what it takes from fio), per run and as a share of the run
                      "sampling_wall_s_per_run": round(statistics.median(busy[m]), 4),
                      "sampling_cpu_s_per_run": round(statistics.median(cpu[m]), 4),
                      "sampling_cpu_share": round(statistics.median(cpu[m]) / a.runtime, 4),
                      "iops": med([r.fio.iops for r in rs]), "p99_us": med([p99(r) for r in rs]),
                      "iops_change": round(statistics.median(di), 4),
                      "iops_change_iqr": [round(di[q], 4), round(di[-1 - q], 4)],
                      "p99_change": round(statistics.median(dp), 4),
                      "p99_change_iqr": [round(dp[q], 4), round(dp[-1 - q], 4)],
                      "iops_runs": [round(r.fio.iops) for r in rs]}
    res["sampler"] = sampler
    if a.no_ceiling:
        print(json.dumps(res))
        return 0
    c = bench.compare(sysfs, spec, [f"hdd={hdd}", f"ssd={ref}", f"bcache={bc}"],
                      bench.CompareOptions(repeat=a.repeat, settle=False,
                                           reference=(("bcache", "ssd"),)))
    doc = bench.to_json(c)
    by = {r["label"]: r for r in doc["results"]}
    res["ceiling"] = {
        "hdd_iops": by["hdd"]["iops"], "ssd_iops": by["ssd"]["iops"],
        "bcache_iops": by["bcache"]["iops"],
        "bcache_fraction_of_ssd": by["bcache"]["reference_iops_fraction"],
        "bcache_p99_over_ssd_p99": by["bcache"]["reference_p99_ratio"],
        "bcache_speedup_over_hdd": by["bcache"]["iops_ratio"],
        "qd1_speedup": by["bcache"]["qd1_speedup"],
        "p99_us": {k: v["lat_p99_us"] for k, v in by.items()},
    }
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
