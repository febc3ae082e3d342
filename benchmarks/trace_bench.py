"""Benchmark: the trace recorder's CPU per request at rate 1 against rate 0.01 (issue #34).

    .venv/bin/python benchmarks/trace_bench.py [--requests N] [--rounds R] [--before REV]

A stream of N block requests (default 4 M) as blktrace hands it out (its record layout, read
1 MiB at a time), timed at 1 M requests/s (so the recorder's 2-second reorder window holds
about two million records at rate 1), two CPUs' batches of 256 interleaved out of order,
reads and writes of 1-2 blocks over a 4 GiB footprint, goes through ``trace.record`` on the
captured sysfs of tests/fixtures/schedulers-uml (its /dev/ubdc): the parser, the counts, the
sampling, the window, the gzip'd file, as ``cachemgr trace`` runs them, without blktrace.
Each run is a fresh process; rates alternate, R rounds. The CPU is the recorder's own
(``recorder_cpu_seconds`` of the trailer: the process's CPU from the recording's start),
divided by the requests. With ``--before REV`` the cachemgr package of git revision REV
(``git archive``) is measured at rate 1 too. Prints one JSON line: per path the microseconds
of CPU per request (median and per round), and the ratio of rate 1 to rate 0.01.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURE = REPO / "tests" / "fixtures" / "schedulers-uml" / "sys"
BATCH = 256  # a CPU's batch: the other CPU's next batch comes first, out of order


def stream(n: int, dev: int) -> bytes:
    from cachemgr.backends import blktrace

    rnd = random.Random(1)
    q = blktrace.TA_QUEUE
    acts = ((blktrace.TC_READ << blktrace.TC_SHIFT) | q,
            (blktrace.TC_WRITE << blktrace.TC_SHIFT) | q)
    pack = blktrace.EVENT.pack
    magic = blktrace.MAGIC | blktrace.VERSION
    out = []
    for i in range(n):
        j = i ^ BATCH  # pairs of batches swapped
        blocks = 1 + (rnd.random() < 0.3)
        out.append(pack(magic, i, 1000 * j, 8 * rnd.randrange(1 << 20), 4096 * blocks,
                        acts[rnd.random() < 0.3], i & 1, dev, 0, 0, 0))
    return b"".join(out)


def measure(rate: float, n: int) -> dict[str, object]:
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import trace as tr

    class Fixture(Sysfs):
        def block_name_of(self, node: str) -> str:  # type: ignore[override]
            return node.rsplit("/", 1)[-1]

    major, minor = (FIXTURE / "block" / "ubdc" / "dev").read_text().strip().split(":")
    data = stream(n, int(major) << 20 | int(minor))

    class Source:
        def __init__(self, devices: list[str]) -> None:
            self.pos = 0

        def read(self, size: int = 1 << 20) -> bytes:
            chunk = data[self.pos:self.pos + size]
            self.pos += size
            return chunk

        def stop(self) -> None:
            pass

        def finish(self) -> None:
            pass

        def kill(self) -> None:
            pass

    with tempfile.TemporaryDirectory() as tmp:
        rec = tr.record(Fixture(FIXTURE), ["/dev/ubdc"], f"{tmp}/t", seconds=None, rate=rate,
                        source=Source)  # type: ignore[arg-type]
    reqs = sum(rec.trailer["requests"].values())
    assert reqs == n, (reqs, n)
    cpu = rec.trailer["recorder_cpu_seconds"]
    return {"rate": rate, "requests": reqs, "records": rec.records, "cpu_s": cpu,
            "us_per_request": 1e6 * cpu / reqs, "code": tr.__file__}


def run(rate: float, n: int, pythonpath: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", str(rate),
                          "--requests", str(n)], env=env, check=True, capture_output=True,
                         text=True).stdout
    res: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    assert str(res["code"]).startswith(pythonpath), (res["code"], pythonpath)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", metavar="REV")
    ap.add_argument("--measure", type=float)
    a = ap.parse_args()
    if a.measure is not None:
        print(json.dumps(measure(a.measure, a.requests)))
        return 0
    paths = {"rate_0.01": (0.01, str(REPO)), "rate_1": (1.0, str(REPO))}
    with tempfile.TemporaryDirectory() as tmp:
        if a.before:
            tar = subprocess.run(["git", "-C", str(REPO), "archive", a.before, "cachemgr"],
                                 check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
            paths["before_rate_1"] = (1.0, tmp)
        got: dict[str, list[float]] = {p: [] for p in paths}
        for _ in range(a.rounds):
            for p, (rate, pp) in paths.items():
                got[p].append(float(run(rate, a.requests, pp)["us_per_request"]))  # type: ignore[arg-type]
    res: dict[str, object] = {"requests": a.requests, "rounds": a.rounds, "before_rev": a.before}
    med = {p: statistics.median(v) for p, v in got.items()}
    for p, v in got.items():
        res[p] = {"us_per_request": round(med[p], 3), "rounds": [round(x, 3) for x in v]}
    res["ratio_rate_1_to_0.01"] = round(med["rate_1"] / med["rate_0.01"], 2)
    if a.before:
        res["ratio_before_rate_1_to_0.01"] = round(med["before_rate_1"] / med["rate_0.01"], 2)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
