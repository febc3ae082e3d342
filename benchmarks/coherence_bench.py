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
import sys

import labtest  # benchmarks/labtest.py (this script's directory is first on sys.path)

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
    sel = " or ".join(TESTS[k] for k in args.kinds.split(","))
    rc, reports = labtest.run("tests/kernel/test_coherence_kernel.py", sel,
                              {"CACHEMGR_COHERENCE_CYCLES": str(args.cycles)},
                              "CACHEMGR_COHERENCE_LOG")
    for d in reports:
        print(json.dumps({"test": d["test"], "blocks": d["blocks"], **summary(d["cycles"]),
                          "hook_no_cache_s": d["hook_no_cache_s"]}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
