"""Benchmark: bcache's read hit ratio under fio's Zipf against LRU models, per bucket size.

    # in the lab (UML): one guest per bucket size, the cache made fresh each time
    for b in 4k 8k 16k 32k; do
        cachemgr lab run --disks 1G,32M --timeout 600 -- \\
            .venv/bin/python benchmarks/hit_ratio_bench.py lab $b
    done
    # on the host (no kernel needed): the same request stream, replayed on models
    .venv/bin/python benchmarks/hit_ratio_bench.py models

``lab BUCKET``: makes bcache from the two scratch disks (32 MiB cache, BUCKET buckets), runs
`cachemgr bench run` (256 MiB region, Zipf 1.2, QD1 reads for 10 s, `--warmup auto`) and
prints one JSON line: measured and Che-predicted hit ratio, and the cache's occupancy from
priority_stats (read once, after the run: never on a normal scan).

``models``: has fio (null engine: no device) write the request log of the same job, then
replays it on an exact LRU cache of 8,192 4 KiB items and on a bucket-granular LRU (buckets of
1, 8 and 16 items, evicted whole, a hit refreshing its bucket) and prints each hit ratio after
the same warm-up: what fio's own generator and bucket granularity cost against Che's figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

REGION = 256 << 20
CACHE = 32 << 20
BS = 4096
THETA = 1.2
WARMUP = 210_000  # 3x Che's characteristic time, as `--warmup auto` issues


def lab(bucket: str) -> dict[str, object]:
    from cachemgr.backends import bcache
    from cachemgr.core.sysfs import Sysfs

    disks = sorted(p for p in Path("/dev").iterdir()
                   if p.name in ("ubda", "ubdb", "vda", "vdb"))
    hdd, ssd = str(disks[0]), str(disks[1])
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=ssd, bucket=bucket)
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, "-m", "cachemgr", "bench", "run", "/dev/bcache0",
                            "--rw", "randread", "--size", "256M", "--zipf", str(THETA),
                            "--runtime", "10", "--warmup", "auto", "--json", "--out", out,
                            "--no-plot"], capture_output=True, text=True, check=True)
    doc = json.loads(p.stdout)
    res, run = doc["results"][0], doc["runs"][0]
    cset = next(Path("/sys/fs/bcache").glob("*-*-*-*-*"))
    prio = {}
    for line in (cset / "cache0" / "priority_stats").read_text().splitlines():
        k, _, v = line.partition(":")
        if v.strip().endswith("%"):
            prio[k.strip().lower()] = int(v.strip().rstrip("%"))
    return {"bucket": bucket, "nbuckets": int((cset / "cache0" / "nbuckets").read_text()),
            "hit_ratio": res["hit_ratio"], "che": res["expected_hit_ratio"],
            "source": run["cache"]["hit_ratio_source"], "occupancy_percent": prio}


def fio_trace(n: int) -> list[int]:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "io.log"
        subprocess.run(["fio", "--name=z", "--ioengine=null", f"--size={REGION}",
                        f"--io_size={n * BS}", f"--filename={d}/f", "--rw=randread",
                        f"--bs={BS}", f"--random_distribution=zipf:{THETA}", "--randrepeat=0",
                        f"--write_iolog={log}", "--output=/dev/null"], check=True)
        return [int(f[3]) // BS for f in (x.split() for x in log.read_text().splitlines())
                if len(f) == 5 and f[2] == "read"]


def bucket_lru(trace: list[int], cache_items: int, bucket_items: int, warmup: int) -> float:
    """Misses fill an open bucket in arrival order; a full bucket joins an LRU of buckets; a
    hit refreshes its bucket; eviction drops the least recently used bucket whole."""
    nb = cache_items // bucket_items
    where: dict[int, int] = {}
    lru: OrderedDict[int, list[int]] = OrderedDict()
    open_items: list[int] = []
    open_id, next_id, hits = -1, 0, 0
    for k, item in enumerate(trace):
        b = where.get(item)
        if b is not None:
            if b in lru:
                lru.move_to_end(b)
            hits += k >= warmup
            continue
        if open_id < 0 or len(open_items) >= bucket_items:
            if open_id >= 0:
                lru[open_id] = open_items
            while len(lru) + 1 > nb:
                for old in lru.popitem(last=False)[1]:
                    where.pop(old, None)
            open_id, open_items, next_id = next_id, [], next_id + 1
        open_items.append(item)
        where[item] = open_id
    return hits / (len(trace) - warmup)


def models() -> dict[str, object]:
    from cachemgr.procedures import che

    trace = fio_trace(WARMUP + 200_000)
    items = CACHE // BS
    out: dict[str, object] = {
        "requests": len(trace), "distinct": len(set(trace)),
        "che_ideal_zipf": round(che.che_hit_ratio(REGION // BS, items, THETA), 4)}
    for bi in (1, 8, 16):
        out[f"lru_bucket_{bi}"] = round(bucket_lru(trace, items, bi, WARMUP), 4)
    return out


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "models":
        print(json.dumps(models()))
    elif len(sys.argv) == 3 and sys.argv[1] == "lab":
        print(json.dumps(lab(sys.argv[2])))
    else:
        sys.exit(__doc__)
