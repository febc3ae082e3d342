"""The returning VM's first minute at the acceptance line's own scale (issue #42: "the
returning VM's read hit ratio in its first minute within 0.9 of what it was before it left";
docs/benchmarks.md, "Warming after an arrival"): tests/kernel/test_warm_after_kernel.py run
in the UML lab with a 60 s window and its 800-block hot set, where the kept test runs a
quarter of both (15 s, 200 blocks) so that the suite does not wait out real minutes.

    .venv/bin/python benchmarks/warm_after_bench.py [--window 60] [--kinds bcache,dmcache]

About 4.5 minutes a kind at 60 s (the steady state, then three returns, each a window
long). The test's own assertions hold at this scale too (bcache: both warmed returns within
0.9 of the steady state, the cold one below it or beaten); this prints each kind's figures,
one JSON line each: the steady state, and each return's hit ratio over the window, its
ratio to the steady state, the reads and the warm's time.
"""

from __future__ import annotations

import argparse
import json
import sys

import labtest  # benchmarks/labtest.py (this script's directory is first on sys.path)

TESTS = {"bcache": "bcache_first_minute", "dmcache": "dmcache_warm_after"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=60.0, help="seconds (default 60)")
    ap.add_argument("--kinds", default="bcache,dmcache")
    args = ap.parse_args()
    sel = " or ".join(TESTS[k] for k in args.kinds.split(","))
    rc, reports = labtest.run("tests/kernel/test_warm_after_kernel.py", sel,
                              {"CACHEMGR_WARM_AFTER_WINDOW": str(args.window)},
                              "CACHEMGR_WARM_AFTER_LOG")
    for d in reports:
        print(json.dumps({
            "test": d["test"], "window_s": d["window_s"], "hot_blocks": d["hot_blocks"],
            "steady": d["steady_hit_ratio"],
            "returns": [{"return": x["return"], "hit_ratio": x["hit_ratio_first_window"],
                         "of_steady": x["of_steady"], "reads": x["reads"],
                         "warm_s": (x["warm"] or {}).get("seconds"),
                         "warm_reads_from_s": (x["warm"] or {}).get("reads_from_s")}
                        for x in d["returns"]]}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
