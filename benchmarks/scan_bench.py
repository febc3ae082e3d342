"""Benchmark: the status scan of N bcache backing devices on one cache set (runs in the lab).

    cachemgr lab run --disks 2G,256M -- .venv/bin/python benchmarks/scan_bench.py [N]
        [--before REV] [--rounds R] [--scans S]

Builds N dm-linear slices of the first scratch disk, formats them all as backing devices of
one cache set on the second disk, then measures against those same devices, R rounds
interleaved, S scans each (a fresh process per round and path):

* ``full``: ``snapshot.take(sysfs)`` as every scan did before issue #20: every file, the four
  stats intervals, identities read again on each scan;
* ``poll``: what the pollers do now (status --watch, the TUI, between their slower stats
  reads): ``snapshot.take(sysfs, stats=False, cache=ScanCache())``, the cache warmed by one
  scan first;
* ``before`` (with ``--before REV``): ``snapshot.take(sysfs)`` of the cachemgr package as it
  was at git revision REV (``git archive`` into a temporary directory), the true before.

Reads are counted through ``Sysfs.read``. Prints one JSON line: per path the reads of a scan,
the median and minimum milliseconds of a scan (median over rounds of each round's median),
the speed-up of ``poll`` over ``before`` (or ``full``) and the issue's read budget
(28 + 16 per backing device + 3 per cache set). Times are UML's: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def measure(path: str, n: int, scans: int) -> dict[str, object]:
    """One process, one path: ``scans`` timed scans (imports whichever cachemgr is first on
    sys.path: the checkout's or an older revision's)."""
    from cachemgr.backends import snapshot
    from cachemgr.core.sysfs import Sysfs

    class Counting(Sysfs):
        reads = 0

        def read(self, rel: str) -> str:
            Counting.reads += 1
            return super().read(rel)

    sysfs = Counting()
    kw: dict[str, object] = {}
    cache = None
    if path == "poll":
        from cachemgr.backends.scancache import ScanCache

        cache = ScanCache()
        kw = {"stats": False, "cache": cache}
        snapshot.take(sysfs, **kw)  # type: ignore[arg-type]
    times, reads = [], []
    for _ in range(scans):
        Counting.reads = 0
        t0 = time.perf_counter()
        snap = snapshot.take(sysfs, **kw)  # type: ignore[arg-type]
        times.append((time.perf_counter() - t0) * 1000)
        reads.append(Counting.reads)
        assert len(snap.backings) == n, (len(snap.backings), n)
        assert all(b.cset_uuid for b in snap.backings)
    return {"reads": max(reads), "ms_median": statistics.median(times), "ms_min": min(times),
            "invalidations": cache.invalidations if cache is not None else None,
            "code": snapshot.__file__}


def build(n: int) -> None:
    from cachemgr.backends import bcache, snapshot
    from cachemgr.core import runner
    from cachemgr.core.sysfs import Sysfs

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

    def ready() -> bool:
        bs = snapshot.take(sysfs).backings
        return len(bs) == n and all(b.cset_uuid for b in bs)

    if not bcache.wait_for(ready, 60, 0.5):
        raise SystemExit("not all devices attached")


def run_path(path: str, n: int, scans: int, pythonpath: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", path,
                          str(n), "--scans", str(scans)], env=env, check=True,
                         capture_output=True, text=True).stdout
    res: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    # the revision measured is the one asked for
    assert str(res["code"]).startswith(pythonpath), (res["code"], pythonpath)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=64)
    ap.add_argument("--before", metavar="REV")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scans", type=int, default=10)
    ap.add_argument("--measure", choices=("full", "poll"))
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.n, a.scans)))
        return 0
    build(a.n)
    paths = {"full": str(REPO), "poll": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        if a.before:
            tar = subprocess.run(["git", "-C", str(REPO), "archive", a.before, "cachemgr"],
                                 check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
            paths = {"before": tmp, **paths}
        got: dict[str, list[dict[str, object]]] = {p: [] for p in paths}
        for _ in range(a.rounds):
            for p, pp in paths.items():
                got[p].append(run_path("full" if p == "before" else p, a.n, a.scans, pp))
    res: dict[str, object] = {"devices": a.n, "cache_sets": 1, "rounds": a.rounds,
                              "scans": a.scans, "before_rev": a.before,
                              "budget_reads": 28 + 16 * a.n + 3}
    for p, rs in got.items():
        res[p] = {"reads": max(int(r["reads"]) for r in rs),  # type: ignore[call-overload]
                  "ms_median": round(statistics.median(float(r["ms_median"])  # type: ignore[arg-type]
                                                       for r in rs), 1),
                  "ms_min": round(min(float(r["ms_min"]) for r in rs), 1),  # type: ignore[arg-type]
                  "invalidations": rs[-1]["invalidations"]}
    base = res["before" if a.before else "full"]
    res["speedup_median"] = round(base["ms_median"] / res["poll"]["ms_median"], 2)  # type: ignore[index]
    res["speedup_min"] = round(base["ms_min"] / res["poll"]["ms_min"], 2)  # type: ignore[index]
    res["kernel"] = os.uname().release
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
