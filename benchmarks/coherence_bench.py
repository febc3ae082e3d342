"""Coherent caches over shared storage, the long count (docs/benchmarks.md, "Coherent caches
over shared storage"): the kernel test's away-and-back cycles (tests/kernel/
test_coherence_kernel.py) run CYCLES times per kind in the UML lab, the figures summed.

    .venv/bin/python benchmarks/coherence_bench.py [--cycles 20] [--kinds bcache,dmcache,lvm]

Each cycle: a VM's hot set written and read through a writethrough cache over a dm-multipath
"LUN", the libvirt hook's ``release``, the LUN rewritten behind the cache, the blocks that
read stale counted, the hook's ``migrate`` (the VM back), the blocks counted again, and a
second device on the same SSD read before and after. The test asserts 0 stale blocks after
the hook and the second device's hit ratio within 0.01 in every cycle; this prints the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = {"bcache": "bcache_arrival", "dmcache": "dmcache_arrival", "lvm": "lvm_cache_arrival"}


def summary(rows: list[dict[str, object]]) -> dict[str, object]:
    def col(k: str) -> list[float]:
        return sorted(float(r[k]) for r in rows if r.get(k) is not None)  # type: ignore[arg-type]

    def spread(k: str) -> str:
        v = col(k)
        return f"median {v[len(v) // 2]:.3f} s, {v[0]:.3f}-{v[-1]:.3f} s" if v else "-"

    return {"cycles": len(rows),
            "stale_without": f"{sum(col('stale_without')):.0f} blocks "
                             f"({min(col('stale_without')):.0f}-"
                             f"{max(col('stale_without')):.0f} a cycle)",
            "stale_with": sum(col("stale_with")),
            "other_hit_ratio_change_max": max(abs(float(a) - float(b)) for a, b in
                                              (r["other_hit_ratio"] for r in rows)),  # type: ignore[misc]
            "invalidation": spread("invalidation_s"), "hook_migrate": spread("hook_migrate_s"),
            "hook_release": spread("hook_release_s")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--kinds", default="bcache,dmcache,lvm")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(dir=ROOT, prefix=".coherence-"))  # the lab guest writes it
    log = tmp / "coherence.jsonl"
    env = {**os.environ, "CACHEMGR_COHERENCE_CYCLES": str(args.cycles),
           "CACHEMGR_COHERENCE_LOG": str(log)}
    sel = " or ".join(TESTS[k] for k in args.kinds.split(","))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                        "tests/kernel/test_coherence_kernel.py", "--lab-backend=uml", "-k", sel],
                       cwd=ROOT, env=env, check=False)
    for line in log.read_text().splitlines() if log.exists() else []:
        d = json.loads(line)
        print(json.dumps({"test": d["test"], "blocks": d["blocks"], **summary(d["cycles"]),
                          "hook_no_cache_s": d["hook_no_cache_s"]}))
    shutil.rmtree(tmp, ignore_errors=True)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
