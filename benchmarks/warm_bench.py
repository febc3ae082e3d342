"""Benchmark: the read hit ratio of the first 60 s on a new cache SSD, cold against warmed by
`cachemgr warm` from a trace, beside the steady state (issue #35 item 1).

    # in the lab (UML): one guest, about 8 minutes
    cachemgr lab run --backend uml --disks 1G,32M --timeout 1200 -- \\
        .venv/bin/python benchmarks/warm_bench.py lab

The "HDD" is a dm-delay device over the first disk (5 ms a request), under bcache with the
second disk as its cache (writethrough). The load is a VM's: 4 KiB random reads, one in
flight, Zipf(1.0) over the whole device, its hot blocks placed by one fixed permutation;
each run draws its own requests (its own seed) from that same distribution.

1. cold: the cache made fresh (procedures/bench/hygiene.py fresh_cache: detach, unregister,
   wipe, format, register, attach: a new SSD as replace-ssd leaves it; the UML lab has no
   disk replace-ssd can pull, so a fresh cache stands in for the replacement), then the load
   for COLD_S seconds: its first 60 s are the cold figure, its last 60 s the steady state.
   The requests of its first TRACE_S seconds are the trace (written with the recorder's own
   writer: the UML kernel has no blktrace, so `cachemgr trace` cannot record there).
2. warmed: the cache made fresh again, `cachemgr warm /dev/bcache0 --trace FILE`, then the
   load (another seed) for 60 s: the warmed figure.

Hit ratios are the kernel's own counters over each window: reads completed on /dev/bcache0
against reads the backing device completed (each read miss is one read of the backing
device; readahead is 0). Prints one JSON line with the figures and their ratios to the
steady state.
"""

from __future__ import annotations

import bisect
import itertools
import json
import mmap
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BS = 4096
THETA = 1.0
DELAY_MS = 5
WINDOW_S = 60.0
COLD_S = 240.0  # the cold run: its first 60 s cold, its last 60 s the steady state
TRACE_S = 150.0  # the part of the cold run recorded as the trace
PERM_SEED = 35


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def reads(dev: str) -> int:
    return int(Path(f"/sys/block/{dev}/stat").read_text().split()[0])


class Load:
    """Zipf(THETA) 4 KiB reads over ``nblocks``, rank r at block perm[r], QD1, O_DIRECT."""

    def __init__(self, nblocks: int) -> None:
        w = [1.0 / (i + 1) ** THETA for i in range(nblocks)]
        total = sum(w)
        self.cdf = list(itertools.accumulate(x / total for x in w))
        self.perm = random.Random(PERM_SEED).sample(range(nblocks), nblocks)

    def run(self, node: str, seconds: float, seed: int, *, marks: list[float],
            record: list[tuple[float, int]] | None = None, record_s: float = 0.0,
            devs: tuple[str, str]) -> list[tuple[float, int, int]]:
        """Read for ``seconds``; the counters of ``devs`` (cached device, backing device)
        at each of ``marks`` (seconds from the start); the requests of the first
        ``record_s`` seconds into ``record``."""
        rnd = random.Random(seed)
        fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, BS)
        out = [(0.0, reads(devs[0]), reads(devs[1]))]
        todo = sorted(marks)
        t0 = time.monotonic()
        try:
            while True:
                t = time.monotonic() - t0
                while todo and t >= todo[0]:
                    out.append((todo.pop(0), reads(devs[0]), reads(devs[1])))
                if t >= seconds:
                    break
                b = self.perm[min(bisect.bisect(self.cdf, rnd.random()), len(self.cdf) - 1)]
                os.preadv(fd, [buf], b * BS)
                if record is not None and t < record_s:
                    record.append((t, b))
        finally:
            buf.close()
            os.close(fd)
        return out


def window(counts: list[tuple[float, int, int]], start: float, end: float) -> float:
    a = next(c for c in counts if c[0] == start)
    b = next(c for c in counts if c[0] == end)
    total, misses = b[1] - a[1], b[2] - a[2]
    return 1 - misses / total if total else float("nan")


def lab() -> dict[str, object]:
    from cachemgr.backends import bcache, snapshot
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import trace as tr
    from cachemgr.procedures.bench.hygiene import fresh_cache

    disks = sorted(p for p in Path("/dev").iterdir()
                   if p.name in ("ubda", "ubdb", "vda", "vdb"))
    hdd, ssd = str(disks[0]), str(disks[1])
    sectors = sh("blockdev", "--getsz", hdd).strip()
    sh("dmsetup", "create", "slow", "--table",
       f"0 {sectors} delay {hdd} 0 {DELAY_MS}")
    sysfs = Sysfs()
    bcache.create(sysfs, backings=["/dev/mapper/slow"], cache=ssd, bucket="16k")
    b = snapshot.take(sysfs).backings[0]
    backing = b.identity.name  # dm-0
    node = "/dev/bcache0"
    devs = ("bcache0", backing)
    size = int(sh("blockdev", "--getsize64", node))
    load = Load(size // BS)
    cs = snapshot.take(sysfs).cache_set(b.cset_uuid or "")
    assert cs is not None and cs.caches
    cap = (cs.caches[0].nbuckets or 0) * (cs.caches[0].bucket_size.bytes
                                           if cs.caches[0].bucket_size else 0)

    # 1. cold, then steady, in one run from a fresh cache; its first TRACE_S s traced
    fresh_cache(sysfs, backing)
    rec: list[tuple[float, int]] = []
    cold_counts = load.run(node, COLD_S, 1, marks=[WINDOW_S, COLD_S - WINDOW_S, COLD_S],
                           record=rec, record_s=TRACE_S, devs=devs)
    cold = window(cold_counts, 0.0, WINDOW_S)
    steady = window(cold_counts, COLD_S - WINDOW_S, COLD_S)
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "host.trace"
        (dev, _), = tr.resolve(sysfs, [node])
        w = tr.Writer(trace, tr.Header(block=BS, rate=1.0, devices=[dev],
                                       started=time.time()))
        for t, blk in rec:
            w.add(t, blk * BS, BS, 0, 0)
        w.close({"seconds": TRACE_S, "ended_by": "time"})
        # 2. warmed: a fresh cache, cachemgr warm, the load again (another seed)
        fresh_cache(sysfs, backing)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "cachemgr", "warm", node, "--trace",
                            str(trace), "--json"], capture_output=True, text=True)
        warm_s = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"cachemgr warm failed ({p.returncode}): {p.stderr}")
        warmed_doc = json.loads(p.stdout)
    warm_counts = load.run(node, WINDOW_S, 2, marks=[WINDOW_S], devs=devs)
    warmed = window(warm_counts, 0.0, WINDOW_S)
    return {"cache_bytes": cap, "device_bytes": size, "zipf": THETA, "hdd_delay_ms": DELAY_MS,
            "trace_requests": len(rec), "trace_blocks": len({blk for _, blk in rec}),
            "warm_seconds": round(warm_s, 1), "warm_bytes_read": warmed_doc["bytes_read"],
            "warm_passes": warmed_doc["passes"],
            "hit_ratio_first_60s_cold": round(cold, 4),
            "hit_ratio_first_60s_warmed": round(warmed, 4),
            "hit_ratio_steady": round(steady, 4),
            "cold_to_steady": round(cold / steady, 3),
            "warmed_to_steady": round(warmed / steady, 3)}


if __name__ == "__main__":
    if sys.argv[1:] != ["lab"]:
        raise SystemExit(__doc__)
    print(json.dumps(lab()))
