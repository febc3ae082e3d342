"""Benchmark: cache sizing from a recorded trace (cachemgr trace / size / bench replay).

    # in the lab (qemu: the UML kernel has no block tracing), one run, one JSON line
    cachemgr lab run --backend qemu --disks 1G,32M --timeout 1800 -- \\
        .venv/bin/python benchmarks/sizing_bench.py lab
    # on the host: SHARDS sampling against the full trace (no kernel needed)
    .venv/bin/python benchmarks/sizing_bench.py sampling
    # on the host: does recording the most referenced blocks whole remove a sample's error?
    .venv/bin/python benchmarks/sizing_bench.py oracle
    # on the host: how close is a 1 % sample, weighed to the recorder's block counts or not,
    # and do size's standard errors describe its real error?
    .venv/bin/python benchmarks/sizing_bench.py stderr
    # on the host: the recorder's CPU per event, with and without the block counts
    .venv/bin/python benchmarks/sizing_bench.py recorder

``lab``: a Zipf(1.2) 4 KiB random-read job at QD1 over 256 MiB of the bare disk, run alone and
under ``cachemgr trace`` (rate 0.01 and rate 1), interleaved, for the recorder's cost; the rate-1
trace is analysed (``cachemgr size``) for the data capacity of a 32 MiB bcache cache (32 KiB
buckets), and so is the last rate-0.01 trace (below what its sample resolves: from the reuse
times), then bcache is built over the disk and the trace replayed on it (``cachemgr bench
replay``); the same job then runs on a fresh cache (``bench run --fresh-cache``). Prints the
IOPS alone and traced, the predicted and the measured read hit ratios.

``sampling``: Zipf streams (Python's generator, seed 1) analysed whole and at rates 0.1 and
0.01, four independent samples each (the hash takes the device index); prints the largest
difference of a sampled curve from the full one, and of the four samples' mean, from the size
the rate resolves (100/rate blocks), from 1 % and from 10 % of the footprint.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REGION = "256M"
THETA = 1.2
RUNTIME = int(os.environ.get("SIZING_RUNTIME", "20"))
REPS = int(os.environ.get("SIZING_REPS", "3"))
PY = sys.executable


def fio(dev: str, seed: int) -> float:
    out = subprocess.run(
        ["fio", "--name=z", f"--filename={dev}", "--rw=randread", "--bs=4k", "--direct=1",
         "--ioengine=libaio", "--iodepth=1", f"--size={REGION}", "--norandommap=1",
         f"--random_distribution=zipf:{THETA}", "--randrepeat=0", f"--randseed={seed}",
         "--time_based=1", f"--runtime={RUNTIME}", "--output-format=json"],
        capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


def traced(dev: str, seed: int, rate: str, out: str) -> tuple[float, dict]:
    """The job's IOPS while ``cachemgr trace`` records it, and the trace's trailer."""
    p = subprocess.Popen([PY, "-m", "cachemgr", "trace", dev, "--rate", rate, "-o", out,
                          "--force", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    part = Path(out + ".part")
    t0 = time.monotonic()
    while not part.exists() and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    time.sleep(2)  # blktrace's set-up
    iops = fio(dev, seed)
    p.send_signal(signal.SIGINT)
    so, se = p.communicate(timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"trace failed: {p.returncode} {se}")
    return iops, json.loads(so)["trailer"]


def cm(*argv: str) -> dict:
    p = subprocess.run([PY, "-m", "cachemgr", *argv], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"cachemgr {' '.join(argv)}: {p.returncode} {p.stderr}")
    return json.loads(p.stdout)


def lab() -> dict:
    from cachemgr.backends import bcache
    from cachemgr.core.sysfs import Sysfs

    subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
    disks = sorted(p for p in Path("/dev").iterdir() if p.name in ("vda", "vdb"))
    hdd, ssd = str(disks[0]), str(disks[1])
    tmp = tempfile.mkdtemp()
    full = f"{tmp}/full.trace"
    alone, t001, t1, cpu001, cpu1 = [], [], [], [], []
    for rep in range(REPS):  # interleaved: a drift of the host touches all three alike
        alone.append(fio(hdd, 10 + rep))
        iops, tr001 = traced(hdd, 20 + rep, "0.01", f"{tmp}/s.trace")
        t001.append(iops)
        cpu001.append(tr001["recorder_cpu_seconds"] / tr001["seconds"])
        iops, tr1 = traced(hdd, 40 + rep, "1", full)
        t1.append(iops)
        cpu1.append(tr1["recorder_cpu_seconds"] / tr1["seconds"])
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=ssd, bucket="32k")
    time.sleep(2)
    rep_doc = cm("bench", "replay", "/dev/bcache0:writethrough", "--trace", full, "--json",
                 "--no-save")
    cap = rep_doc["replay"]["cache_bytes"]
    size_doc = cm("size", "--trace", full, "--sizes", str(cap), "--json")
    # the last 1 % trace (the same job, another seed): a 32 MiB cache is below what its
    # sample resolves (40 MiB), so its figure comes from the recorder's reuse times
    small_doc = cm("size", "--trace", f"{tmp}/s.trace", "--sizes", str(cap), "--json")
    job = cm("bench", "run", "/dev/bcache0:writethrough", "--rw", "randread", "--size", REGION,
             "--zipf", str(THETA), "--runtime", str(RUNTIME), "--fresh-cache", "--json",
             "--no-save", "--no-plot")
    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    return {
        "bench": "sizing_lab", "kernel": os.uname().release, "runtime_s": RUNTIME,
        "iops_alone": [round(x) for x in alone], "iops_traced_rate_0.01": [round(x) for x in t001],
        "iops_traced_rate_1": [round(x) for x in t1],
        "cost_rate_0.01_of_median": round(1 - med(t001) / med(alone), 4),
        "cost_rate_1_of_median": round(1 - med(t1) / med(alone), 4),
        "recorder_cpu_share_rate_0.01": [round(x, 4) for x in cpu001],
        "recorder_cpu_share_rate_1": [round(x, 4) for x in cpu1],
        "trace_requests": rep_doc["replay"]["requests"],
        "cache_bytes": cap,
        "predicted_read_hit_ratio": size_doc["sizes"][0]["read_hit_ratio"],
        "predicted_read_hit_ratio_1pct": small_doc["sizes"][0]["read_hit_ratio"],
        "predicted_1pct_se": small_doc["sizes"][0]["read_hit_ratio_se"],
        "predicted_1pct_by_reuse_model": small_doc["reuse_model_below_bytes"] is not None
        and cap < small_doc["reuse_model_below_bytes"],
        "replay_measured_read_hit_ratio": rep_doc["replay"]["measured_read_hit_ratio"],
        "replay_difference": rep_doc["replay"].get("difference"),
        "same_job_measured_hit_ratio": job["results"][0]["hit_ratio"],
    }


def zipf_stream(n: int, refs: int, theta: float, seed: int) -> list[int]:
    w = list(itertools.accumulate(1 / (i ** theta) for i in range(1, n + 1)))
    rnd = random.Random(seed)
    perm = list(range(n))
    rnd.shuffle(perm)
    return [perm[bisect.bisect_left(w, rnd.random() * w[-1])] for _ in range(refs)]


STREAMS = ((1 << 18, 2_000_000, 1.2), (1 << 18, 2_000_000, 0.9), (1 << 20, 4_000_000, 0.9))


def sampling() -> list[dict]:
    from cachemgr.procedures import sizing
    from cachemgr.procedures import trace as tr

    out = []
    for n, refs, theta in STREAMS:
        blocks = zipf_stream(n, refs, theta, seed=1)
        with tempfile.TemporaryDirectory() as tmp:
            # four copies of the stream on four device indexes: the hash takes the index, so
            # each is an independent sample of the same requests
            h = tr.Header(block=4096, rate=1.0, started=0.0,
                          devices=[tr.Device(i, f"/dev/x{i}", f"x{i}", "0:0", n * 4096)
                                   for i in range(4)])
            w = tr.Writer(f"{tmp}/t", h)
            for i, b in enumerate(blocks):
                for d in range(4):
                    w.add(i * 1e-4, b * 4096, 4096, d, 0)
            # the totals the recorder writes: all devices', and each one's (--device)
            tot = tr.Totals(requests=[4 * refs, 0, 0], blocks=[4 * refs, 0, 0],
                            device_blocks=[[refs, 0, 0] for _ in range(4)])
            w.close({"seconds": 0, **tot.to_json(), "diskstats": {}})
            trace = tr.read(f"{tmp}/t")
        t0 = time.process_time()
        hf = sizing.histogram(trace, devices=[0])
        full_s = time.process_time() - t0
        grid = sizing.grid(hf)
        for rate in (0.1, 0.01):
            t0 = time.process_time()
            # the full trace analysed at a lower rate: weighed to its own counts (all blocks)
            samples = [sizing.histogram(trace, rate=rate, devices=[d]) for d in range(4)]
            s_s = (time.process_time() - t0) / 4

            def err(lo: float, samples: list = samples, grid: list = grid,
                    hf: sizing.Histogram = hf) -> tuple[float, float]:
                xs = [x for x in grid if x >= lo]
                each = max(abs((hs.hit_ratio(x) or 0) - (hf.hit_ratio(x) or 0))
                           for hs in samples for x in xs)
                mean = max(abs(sum((hs.hit_ratio(x) or 0) for hs in samples) / len(samples)
                               - (hf.hit_ratio(x) or 0)) for x in xs)
                return round(each, 4), round(mean, 4)

            r100, r100m = err(sizing.resolved_blocks(rate) * 4096)
            f1, f1m = err(0.01 * hf.footprint_bytes)
            f10, f10m = err(0.1 * hf.footprint_bytes)
            out.append({"bench": "sizing_sampling", "blocks": n, "refs": refs, "theta": theta,
                        "rate": rate, "footprint_bytes": hf.footprint_bytes,
                        "max_err_from_resolved": r100, "mean_of_4_err_from_resolved": r100m,
                        "max_err_from_1pct_footprint": f1, "mean_of_4_err_1pct": f1m,
                        "max_err_from_10pct_footprint": f10, "mean_of_4_err_10pct": f10m,
                        "sampled_refs": [hs.sampled_refs for hs in samples],
                        "cpu_s_full": round(full_s, 2), "cpu_s_sampled": round(s_s, 2)})
    return out


def recorder_strata(stream: list[int], dev: int, rate: float, limit: int):  # -> Strata
    """What the recorder's block counts hold at the end of recording ``stream`` (reads) on
    device index ``dev`` at ``rate`` with a table of ``limit`` blocks: trace.Counts fed every
    reference, read back as ``size`` reads a trailer."""
    from cachemgr.procedures import sizing
    from cachemgr.procedures import trace as tr

    c = tr.Counts(thr=1 << tr.RATE_BITS, floor=tr.threshold(rate), limit=limit)
    for b in stream:
        c.add(dev, b, 0)
    return sizing._recorded_strata(c.to_json(), dev + 1, None)


def stderr(samples: int = 8, rate: float = 0.01) -> list[dict]:
    """How close a 1 % sample's curve is to the full one, and how well ``size``'s standard
    errors (the jackknife of Histogram.stderr) describe its real error: the three streams of
    ``sampling``, ``samples`` independent samples each (the hash takes the device index), at
    the sizes the rate resolves (every tenth point of the curve's grid for the standard
    errors, every point for the largest error; and the largest error from 1 % of the
    footprint, below what the rate resolves, and from 0.1 % and from one block: there the
    curve comes from the counts' reuse times, by the AET model). Three estimators:
    SHARDS_adj alone, and
    weighed to the recorder's block counts (trace.Counts) with its default table and with a
    table of 2^16 blocks. Per estimator: the largest error of each sample, the root-mean-
    square error, the mean standard error and the share of (sample, size) pairs within two
    standard errors."""
    from cachemgr.procedures import sizing
    from cachemgr.procedures import trace as tr

    out = []
    for n, refs, theta in STREAMS:
        stream = zipf_stream(n, refs, theta, seed=1)
        thr = tr.threshold(rate)
        full = sizing._count(stream, [0] * refs, 4096, 1.0, 0, None)
        every = [x for x in sizing.grid(full) if x >= sizing.resolved_blocks(rate) * 4096]
        low = [x for x in sizing.grid(full) if x >= 0.01 * full.footprint_bytes]
        lower = [x for x in sizing.grid(full) if x >= 0.001 * full.footprint_bytes]
        allsizes = sizing.grid(full)  # from one block
        sizes = every[::10]
        kinds = {"shards_adj": None, f"counts_{tr.COUNT_TABLE}": tr.COUNT_TABLE,
                 "counts_65536": 1 << 16}
        acc = {k: {"worst": [], "low": [], "lower": [], "all": [], "ses": [], "sq": 0.0,
                   "inside": 0, "cpu": [], "r1": []}
               for k in kinds}
        sum_refs = 0
        for d in range(samples):
            sample = [tr.key(d, b) for b in stream if tr.sampled(d, b, thr)]
            sum_refs += len(sample)
            for kind, limit in kinds.items():
                st = None if limit is None else recorder_strata(stream, d, rate, limit)
                a = acc[kind]
                t0 = time.process_time()
                hs = sizing._count(sample, [0] * len(sample), 4096, rate, 0,
                                   (float(refs), 0.0), st)
                hs.sample = (sample, [0] * len(sample))
                sizing.curve(hs)  # what size computes: every point with its standard errors
                a["cpu"].append(time.process_time() - t0)
                a["r1"].append(None if st is None else st.rate)
                a["worst"].append(round(max(abs((hs.hit_ratio(x) or 0)
                                                - (full.hit_ratio(x) or 0)) for x in every), 4))
                a["low"].append(max(abs((hs.hit_ratio(x) or 0) - (full.hit_ratio(x) or 0))
                                    for x in low))
                a["lower"].append(max(abs((hs.hit_ratio(x) or 0) - (full.hit_ratio(x) or 0))
                                      for x in lower))
                a["all"].append(max(abs((hs.hit_ratio(x) or 0) - (full.hit_ratio(x) or 0))
                                    for x in allsizes))
                errs = [abs((hs.hit_ratio(x) or 0) - (full.hit_ratio(x) or 0)) for x in sizes]
                se = hs.stderr(sizes)
                a["ses"] += se
                a["sq"] += sum(e * e for e in errs)
                a["inside"] += sum(e <= 2 * s for e, s in zip(errs, se, strict=True))
        for kind, a in acc.items():
            m = len(a["ses"])
            out.append({"bench": "sizing_stderr", "blocks": n, "refs": refs, "theta": theta,
                        "rate": rate, "samples": samples, "estimator": kind,
                        "counted_rate": a["r1"][0], "sizes_se": len(sizes),
                        "sizes_max": len(every),
                        "max_error_per_sample": a["worst"], "max_error": max(a["worst"]),
                        "max_error_from_1pct_footprint": round(max(a["low"]), 4),
                        "max_error_from_0.1pct_footprint": round(max(a["lower"]), 4),
                        "max_error_every_size": round(max(a["all"]), 4),
                        "rms_error": round((a["sq"] / m) ** 0.5, 4),
                        "mean_se": round(sum(a["ses"]) / m, 4),
                        "coverage_2se": round(a["inside"] / m, 3),
                        "sampled_refs_mean": round(sum_refs / samples),
                        "cpu_s_curve_with_se_mean": round(sum(a["cpu"]) / samples, 2)})
    return out


def recorder(events: int = 200_000, reps: int = 3) -> list[dict]:
    """The recorder's CPU per event: ``events`` synthetic 4 KiB read events (Zipf(0.9) over
    2^20 blocks, blktrace's own record layout) through ``trace.record()`` from a stream in
    memory, on the captured sysfs of the unit tests; at rate 0.01 without block counts
    (a table of 0 blocks: counting stops at the first event), with the default table and with
    one of 2^16 blocks, and at rate 1. Repetitions interleaved; the median is printed."""
    from cachemgr.backends import blktrace
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import trace as tr

    root = Path(__file__).resolve().parent.parent / "tests/fixtures/schedulers-uml/sys"
    Sysfs.block_name_of = lambda self, node: node.rsplit("/", 1)[-1]  # type: ignore[method-assign]
    sysfs = Sysfs(root)
    major, minor = ((root / "block/ubdc/dev").read_text().strip().split(":"))
    dev = int(major) << 20 | int(minor)
    action = (blktrace.TC_READ << blktrace.TC_SHIFT) | blktrace.TA_QUEUE
    data = b"".join(blktrace.EVENT.pack(blktrace.MAGIC | blktrace.VERSION, i, 1000 * i,
                                        b * 8, 4096, action, 1, dev, 0, 0, 0)
                    for i, b in enumerate(zipf_stream(1 << 20, events, 0.9, seed=2)))

    class Source:
        def __init__(self, devices: list[str]) -> None:
            self.chunks = [data[i:i + (1 << 16)] for i in range(0, len(data), 1 << 16)]

        def read(self, size: int = 0) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

        def stop(self) -> None:
            pass

        def finish(self) -> None:
            pass

        def kill(self) -> None:
            pass

    kinds = {"rate 0.01, no counts": (0.01, 0), "rate 0.01, counts (default table)":
             (0.01, tr.COUNT_TABLE), "rate 0.01, counts (table 2^16)": (0.01, 1 << 16),
             "rate 1": (1.0, tr.COUNT_TABLE)}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    last: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(reps):
            for kind, (rate, table) in kinds.items():
                t0 = time.process_time()
                rec = tr.record(sysfs, ["/dev/ubdc"], f"{tmp}/t", seconds=None, rate=rate,
                                source=Source, count_table=table)  # type: ignore[arg-type]
                cpu[kind].append(time.process_time() - t0)
                last[kind] = rec.trailer
    return [{"bench": "sizing_recorder", "events": events, "kind": kind,
             "us_per_event_median": round(sorted(xs)[len(xs) // 2] / events * 1e6, 3),
             "us_per_event": [round(x / events * 1e6, 3) for x in xs],
             "counted_rate": (last[kind].get("block_counts") or {}).get("rate"),
             "sampled_blocks": last[kind]["sampled_blocks"]["read"]}
            for kind, xs in cpu.items()]


def oracle(hot_counts: tuple[int, ...] = (1000, 10000, 30000), samples: int = 4) -> list[dict]:
    """Where a 1 % sample's error comes from (the 2^20-block, θ 0.9 stream of ``sampling``):
    each sample of SHARDS against the same sample with the K most referenced blocks recorded
    whole (an oracle that knows the popularity in advance; weights 1 for those, 1/rate for
    the others, in the distinct counts and in the references). If the hottest blocks caused
    the error, a small K would remove it."""
    import collections
    import math

    from cachemgr.procedures import sizing
    from cachemgr.procedures import trace as tr

    n, refs, theta, rate = 1 << 20, 4_000_000, 0.9, 0.01
    stream = zipf_stream(n, refs, theta, seed=1)

    def distances(weight: list[float]) -> list[tuple[float, float]]:
        pos: dict[int, int] = {}
        tree = [0.0] * (len(stream) + 1)

        def add(i: int, v: float) -> None:
            i += 1
            while i < len(tree):
                tree[i] += v
                i += i & -i

        def prefix(i: int) -> float:
            r = 0.0
            while i > 0:
                r += tree[i]
                i -= i & -i
            return r

        out = []
        for t, b in enumerate(stream):
            w = weight[b]
            if not w:
                continue
            p = pos.get(b)
            if p is None:
                out.append((math.inf, w))
            else:
                out.append((prefix(t) - prefix(p + 1), w))
                add(p, -w)
            add(t, w)
            pos[b] = t
        return out

    def curve_at(ds: list[tuple[float, float]], sizes: list[int]) -> list[float]:
        adj = refs - sum(w for _, w in ds)  # SHARDS_adj: at distance 0
        ds = sorted(ds)
        keys = [d for d, _ in ds]
        cum = list(itertools.accumulate(w for _, w in ds))
        out = []
        for c in sizes:
            k = bisect.bisect_left(keys, c)
            out.append(max(0.0, min(1.0, ((cum[k - 1] if k else 0.0) + adj) / refs)))
        return out

    sizes = [int(sizing.resolved_blocks(rate) * 1.25 ** k) for k in range(40)]
    sizes = [c for c in sizes if c < n]
    full = curve_at(distances([1.0] * n), sizes)
    counts = collections.Counter(stream)
    thr = tr.threshold(rate)
    rows = []
    for k in (0, *hot_counts):
        hot = {b for b, _ in counts.most_common(k)}
        errs = []
        for d in range(samples):
            weight = [1.0 if b in hot else (1 / rate if tr.sampled(d, b, thr) else 0.0)
                      for b in range(n)]
            est = curve_at(distances(weight), sizes)
            errs.append(round(max(abs(a - b) for a, b in zip(est, full, strict=True)), 4))
        rows.append({"bench": "sizing_oracle", "blocks": n, "refs": refs, "theta": theta,
                     "rate": rate, "hot_blocks_whole": k,
                     "hot_share_of_refs": round(sum(counts[b] for b in hot) / refs, 3),
                     "max_err_from_resolved_per_sample": errs})
    return rows


if __name__ == "__main__":
    if sys.argv[1:] == ["lab"]:
        print(json.dumps(lab()))
    elif sys.argv[1:] == ["sampling"]:
        for line in sampling():
            print(json.dumps(line))
    elif sys.argv[1:] == ["stderr"]:
        for line in stderr():
            print(json.dumps(line), flush=True)
    elif sys.argv[1:] == ["recorder"]:
        for line in recorder():
            print(json.dumps(line), flush=True)
    elif sys.argv[1:] == ["oracle"]:
        for line in oracle():
            print(json.dumps(line), flush=True)
    else:
        raise SystemExit(__doc__)
