"""Cache sizing (issue #21): the trace file, SHARDS sampling, reuse distances against an exact
LRU cache, the curve's JSON, the iolog for replay, blktrace's stream parser."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import blktrace
from cachemgr.core.errors import UsageError
from cachemgr.procedures import sizing
from cachemgr.procedures import trace as tr
from tests.kernel.clirun import in_process


def make_trace(path: Path, refs: list[tuple[int, int]], *, rate: float = 1.0,
               devices: int = 1, block: int = 4096, trailer: bool = True,
               diskstats: dict[str, dict[str, int]] | None = None, dev: int = 0,
               counts: int | None = tr.COUNT_TABLE) -> Path:
    """A trace file of ``refs`` (block, op) on device ``dev`` at ``rate``, as the recorder
    writes it: totals of every reference, records of the sampled ones, the counts of at most
    ``counts`` blocks (None: none, as an older recorder). (The hash takes the device index:
    another index samples other blocks.)"""
    devices = max(devices, dev + 1)
    thr = tr.threshold(rate)
    h = tr.Header(block=block, rate=rate, started=0.0, devices=[
        tr.Device(i, f"/dev/vd{'abcdefgh'[i]}", f"vd{'abcdefgh'[i]}", f"254:{16 * i}", 1 << 30)
        for i in range(devices)])
    w = tr.Writer(path, h)
    tot = tr.Totals()
    cnt = tr.Counts(thr=1 << tr.RATE_BITS, floor=thr, limit=counts or 0)
    for i, (b, op) in enumerate(refs):
        cnt.add(dev, b, op)
        tot.requests[op] += 1
        tot.blocks[op] += 1
        tot.bytes[op] += block
        if tr.sampled(dev, b, thr):
            tot.sampled_blocks[op] += 1
            tot.kept += 1
            w.add(i * 1e-4, b * block, block, dev, op)
    if trailer:
        extra = {"block_counts": cnt.to_json()} if counts and rate < 1 else {}
        w.close({"seconds": 10.0, **tot.to_json(), "diskstats": diskstats or {}, **extra})
    else:
        w.abandon()
        w.tmp.rename(path)
    return path


def zipf_refs(n: int, count: int, theta: float, seed: int, writes: float = 0.3
              ) -> list[tuple[int, int]]:
    rnd = random.Random(seed)
    weights = [1 / (i ** theta) for i in range(1, n + 1)]
    perm = list(range(n))
    rnd.shuffle(perm)
    blocks = rnd.choices(perm, weights=weights, k=count)
    return [(b, 1 if rnd.random() < writes else 0) for b in blocks]


def lru_hits(refs: list[tuple[int, int]], size: int) -> tuple[int, int]:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = [0, 0]
    for b, op in refs:
        if b in cache:
            hits[op] += 1
            cache.move_to_end(b)
        else:
            cache[b] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return hits[0], hits[1]


def test_reuse_distances_give_exactly_the_lru_hit_ratios(tmp_path: Path) -> None:
    refs = zipf_refs(4096, 30_000, 0.9, seed=3)
    h = sizing.histogram(tr.read(make_trace(tmp_path / "t", refs)))
    reads = sum(1 for _, op in refs if op == 0)
    writes = len(refs) - reads
    for size in (1, 2, 7, 64, 500, 1024, 3000, 5000):
        r_hits, w_hits = lru_hits(refs, size)
        assert h.hit_ratio(size * 4096, 0) == pytest.approx(r_hits / reads, abs=1e-12), size
        assert h.hit_ratio(size * 4096, 1) == pytest.approx(w_hits / writes, abs=1e-12), size
        assert h.hit_ratio(size * 4096) == pytest.approx((r_hits + w_hits) / len(refs),
                                                         abs=1e-12)


def test_shards_samples_follow_the_full_curve(tmp_path: Path) -> None:
    """Four independent 10 % samples (the hash takes the device index) of a Zipf(0.8) stream
    over 2^16 blocks: from the size a sample resolves (100 / rate blocks) up, each is within
    0.07 of the full curve and their mean within 0.02 (unbiased: the rest is the sampling's
    variance, which a small footprint makes large; benchmarks/sizing_bench.py measures it)."""
    refs = zipf_refs(1 << 16, 120_000, 0.8, seed=5, writes=0.0)
    full = tr.read(make_trace(tmp_path / "full", refs))
    hf = sizing.histogram(full)
    sizes = [s for s in sizing.grid(hf) if s >= sizing.resolved_blocks(0.1) * 4096]
    assert len(sizes) > 100
    errors = {s: [] for s in sizes}  # type: dict[int, list[float]]
    for dev in range(4):
        t = tr.read(make_trace(tmp_path / f"s{dev}", refs, rate=0.1, dev=dev))
        hs = sizing.histogram(t)
        # weighed to the whole trace's references (SHARDS_adj)
        assert hs.refs[0] == pytest.approx(len(refs))
        assert 0.05 < hs.sampled_refs / len(refs) < 0.2
        for s in sizes:
            errors[s].append((hs.hit_ratio(s) or 0) - (hf.hit_ratio(s) or 0))
    assert max(abs(e) for errs in errors.values() for e in errs) < 0.07
    assert max(abs(sum(errs) / len(errs)) for errs in errors.values()) < 0.02


def test_standard_errors_match_the_spread_of_independent_samples(tmp_path: Path) -> None:
    """The jackknife's standard error of a sample's curve against the spread of 8
    independent 10 % samples (the hash takes the device index) of one Zipf(0.9) stream, at the
    sizes a sample resolves: the mean standard error is within a factor of 2 of the samples'
    root-mean-square error, and two standard errors cover most errors. At rate 1 it is 0."""
    refs = zipf_refs(1 << 13, 40_000, 0.9, seed=11, writes=0.0)
    full = tr.read(make_trace(tmp_path / "full", refs))
    hf = sizing.histogram(full)
    assert hf.stderr([64 * 4096, 1024 * 4096]) == [0.0, 0.0]
    assert sizing.point(hf, 1 << 20).to_json()["hit_ratio_se"] == 0.0
    sizes = [s for s in sizing.grid(hf) if s >= sizing.resolved_blocks(0.1) * 4096][::10]
    ses, sq, inside, n = [], 0.0, 0, 0
    for dev in range(8):
        hs = sizing.histogram(tr.read(make_trace(tmp_path / f"s{dev}", refs, rate=0.1,
                                                 dev=dev)))
        for s, se in zip(sizes, hs.stderr(sizes), strict=True):
            err = (hs.hit_ratio(s) or 0) - (hf.hit_ratio(s) or 0)
            ses.append(se)
            sq += err * err
            inside += abs(err) <= 2 * se
            n += 1
    rms = (sq / n) ** 0.5
    mean_se = sum(ses) / n
    assert rms > 0.003  # the samples do differ: a test of the spread, not of zeros
    assert 0.5 < mean_se / rms < 2.0, (mean_se, rms)
    assert inside / n >= 0.7, (inside / n, mean_se, rms)


def test_a_lower_rate_afterwards_keeps_the_same_blocks(tmp_path: Path) -> None:
    refs = zipf_refs(4096, 20_000, 0.8, seed=6, writes=0.2)
    sampled = sizing.histogram(tr.read(make_trace(tmp_path / "s", refs, rate=0.1)))
    later = sizing.histogram(tr.read(make_trace(tmp_path / "f", refs)), rate=0.1)
    assert sampled.sample == later.sample and sampled.cold == later.cold


def _errors(hs: sizing.Histogram, hf: sizing.Histogram, sizes: list[int]) -> list[float]:
    return [(hs.hit_ratio(s) or 0) - (hf.hit_ratio(s) or 0) for s in sizes]


def test_block_counts_bring_a_sample_closer_to_the_full_curve(tmp_path: Path) -> None:
    """Eight independent 5 % samples of a Zipf(0.9) stream, each analysed twice: as an older
    recorder left it (no block counts: SHARDS_adj alone), and weighed to the recorder's
    counts per frequency class. The counted curves are closer to the full one: their root-
    X, and each sample's
    largest error is smaller or within 0.005 of it."""
    refs = zipf_refs(1 << 14, 100_000, 0.9, seed=21, writes=0.0)
    hf = sizing.histogram(tr.read(make_trace(tmp_path / "full", refs)))
    sizes = [s for s in sizing.grid(hf) if s >= sizing.resolved_blocks(0.05) * 4096]
    sq = {"plain": 0.0, "counted": 0.0}
    for dev in range(8):
        plain = sizing.histogram(tr.read(make_trace(tmp_path / f"p{dev}", refs, rate=0.05,
                                                    dev=dev, counts=None)))
        counted = sizing.histogram(tr.read(make_trace(tmp_path / f"c{dev}", refs, rate=0.05,
                                                      dev=dev)))
        assert plain.strata is None and counted.strata is not None
        assert counted.strata.rate == 1.0 and counted.strata.source == "recorder"
        assert plain.sample == counted.sample  # the same sampled references, weighed apart
        ep, ec = _errors(plain, hf, sizes), _errors(counted, hf, sizes)
        sq["plain"] += sum(e * e for e in ep)
        sq["counted"] += sum(e * e for e in ec)
        assert max(map(abs, ec)) < max(map(abs, ep)) + 0.005, dev
    ratio = (sq["counted"] / sq["plain"]) ** 0.5
    print(f"root-mean-square error, counted / plain: {ratio:.3f}")
    assert ratio < 0.7, ratio


def test_counts_from_the_recorder_or_from_a_full_trace_weigh_alike(tmp_path: Path) -> None:
    """A 10 % trace whose recorder counted every block, and a rate-1 trace analysed at 10 %
    (its own references are the counts): the same strata, distances and curve."""
    refs = zipf_refs(4096, 30_000, 1.0, seed=8, writes=0.3)
    a = sizing.histogram(tr.read(make_trace(tmp_path / "s", refs, rate=0.1)))
    b = sizing.histogram(tr.read(make_trace(tmp_path / "f", refs)), rate=0.1)
    said = in_process("size", "--trace", str(tmp_path / "s")).stdout
    assert "sample weighed to the recorder's counts of every block" in said
    said = in_process("size", "--trace", str(tmp_path / "f"), "--rate", "0.1").stdout
    assert "sample weighed to the trace's own counts of every block" in said
    assert a.strata is not None and b.strata is not None
    assert (a.strata.source, b.strata.source) == ("recorder", "trace")
    assert a.strata.cells == b.strata.cells and a.strata.rate == b.strata.rate == 1.0
    assert a.distances == b.distances and a.refs == pytest.approx(b.refs)
    for s in (100, 1000, 3000):
        assert a.hit_ratio(s * 4096, 0) == pytest.approx(b.hit_ratio(s * 4096, 0))
        assert a.hit_ratio(s * 4096, 1) == pytest.approx(b.hit_ratio(s * 4096, 1))


def test_counts_table_halves_its_rate_and_keeps_exact_counts() -> None:
    """A table of at most 300 blocks over a stream of 4096: the threshold halves until the
    blocks under it fit; those are counted from their first reference (nested sampling);
    at the recorded sample's own threshold counting stops."""
    refs = zipf_refs(4096, 20_000, 0.8, seed=9)
    c = tr.Counts(thr=1 << tr.RATE_BITS, floor=tr.threshold(0.01), limit=300)
    for b, op in refs:
        c.add(0, b, op)
    assert 0 < c.thr < 1 << tr.RATE_BITS and len(c.table) <= 300
    seen = {b for b, _ in refs}
    assert {k & (1 << 48) - 1 for k in c.table} == {b for b in seen if tr.sampled(0, b, c.thr)}
    assert len({b for b in seen if tr.sampled(0, b, c.thr * 2)}) > 300  # halved no further
    for k, v in c.table.items():
        b = k & (1 << 48) - 1
        assert tr.value_counts(v) == (sum(1 for x, op in refs if x == b and op == 0),
                                      sum(1 for x, op in refs if x == b and op == 1))
    doc = c.to_json()
    assert doc["rate"] == c.thr / (1 << tr.RATE_BITS) and doc["groups"] == tr.GROUPS
    assert sum(row[3] for row in doc["cells"]) == len(c.table)
    tiny = tr.Counts(thr=1 << tr.RATE_BITS, floor=tr.threshold(0.5), limit=10)
    for b, op in refs[:5000]:
        tiny.add(0, b, op)
    assert tiny.thr == 0 and tiny.table == {}


def test_damaged_block_counts_are_refused(tmp_path: Path) -> None:
    t = tr.read(make_trace(tmp_path / "s", zipf_refs(512, 3000, 1.0, seed=4), rate=0.1))
    assert t.trailer is not None
    good = json.loads(json.dumps(t.trailer["block_counts"]))
    damages = ({"rate": 0}, {"rate": "x"}, {"rate": True}, {"rate": good["rate"] / 2},
               {"threshold": 1.5}, {"threshold": 1 << 30}, {"groups": 7},
               {"cells": [[0, 0, 0, -1, 1, 0]]}, {"cells": [[5, 0, 0, 1, 1, 0]]},
               {"cells": [[0, 0, 0, 1]]}, {"cells": 3}, {"cells": [3]},
               {"cells": [[0, 0, 0, float("inf"), 1, 0]]}, {"cells": [[0, 0, 0, 10 ** 400, 1, 0]]},
               {"cells": [[0, 0, 0, True, 1, 0]]}, {"cells": [[0, 0, 3, 1, 1, 0]]},
               {"threshold": 0, "rate": 0.0})
    for damage in damages:
        t.trailer["block_counts"] = {**good, **damage}
        with pytest.raises(tr.TraceFormatError, match="block counts are damaged"):
            sizing.histogram(t)
    t.trailer["block_counts"] = good
    t.trailer["blocks"] = {"read": "many"}
    with pytest.raises(tr.TraceFormatError, match="totals are damaged"):
        sizing.histogram(t)


def test_a_halving_cut_short_by_ctrl_c_leaves_consistent_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C raises KeyboardInterrupt wherever the recorder is, also inside a halving of the
    table. Cut while the smaller table is built, nothing has changed yet; cut after the new
    threshold's store and before the table's, the counts written are still those of the
    blocks under the threshold only."""
    refs = zipf_refs(4096, 20_000, 0.8, seed=9)
    c = tr.Counts(thr=1 << tr.RATE_BITS, floor=tr.threshold(0.01), limit=1000)
    real = tr.key_sampled
    calls = [0]

    def interrupted(k: int, thr: int) -> bool:
        calls[0] += 1
        if calls[0] == 500:
            raise KeyboardInterrupt
        return real(k, thr)

    monkeypatch.setattr(tr, "key_sampled", interrupted)
    with pytest.raises(KeyboardInterrupt):
        for b, op in refs:
            c.add(0, b, op)
    monkeypatch.setattr(tr, "key_sampled", real)
    assert len(c.table) == 1001 and c.thr == 1 << tr.RATE_BITS  # nothing changed yet
    c.thr //= 2  # the other place: the threshold stored, the table not yet
    doc = c.to_json()
    kept = [v for k, v in c.table.items() if tr.key_sampled(k, c.thr)]
    assert sum(row[3] for row in doc["cells"]) == len(kept) < len(c.table)
    refs_kept = sum(sum(tr.value_counts(v)) for v in kept)
    assert sum(row[4] + row[5] for row in doc["cells"]) == refs_kept


def test_one_device_of_an_older_full_trace_is_weighed_to_its_exact_totals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rate-1 trace of two devices from a recorder without per-device totals, analysed for
    one device at 5 % with a table of 500 (its counts estimate the totals roughly): the
    totals are counted from the trace itself, exactly."""
    monkeypatch.setattr(tr, "COUNT_TABLE", 500)
    a = zipf_refs(4096, 20_000, 1.0, seed=12, writes=0.2)
    h = tr.Header(block=4096, rate=1.0, started=0.0, devices=[
        tr.Device(i, f"/dev/vd{n}", f"vd{n}", f"254:{16 * i}", 1 << 30)
        for i, n in enumerate("ab")])
    w = tr.Writer(tmp_path / "old", h)
    for i, (blk, op) in enumerate(a):
        w.add(i * 1e-4, blk * 4096, 4096, 0, op)
        w.add(i * 1e-4, (blk % 512) * 4096, 8192, 1, 1 - op)
    w.close({"seconds": 1.0, "blocks": {"read": 1, "write": 1}, "diskstats": {}})
    hs = sizing.histogram(tr.read(tmp_path / "old"), rate=0.05, devices=[0])
    assert hs.strata is not None and hs.strata.rate < 1
    assert hs.refs[0] == sum(1 for _, op in a if op == 0)
    assert hs.refs[1] == sum(1 for _, op in a if op == 1)


def test_counting_that_stopped_is_said(tmp_path: Path) -> None:
    """A table too small for even the lowest rate above the sample's: the trailer says
    counting stopped, size weighs by SHARDS_adj alone and says so."""
    path = make_trace(tmp_path / "s", zipf_refs(4096, 20_000, 0.8, seed=9), rate=0.5,
                      counts=100)
    t = tr.read(path)
    assert t.trailer is not None and t.trailer["block_counts"]["threshold"] == 0
    assert sizing.histogram(t).strata is None
    r = in_process("size", "--trace", str(path), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["strata"] is None
    assert any("stopped counting blocks" in n for n in doc["notes"])


def two_device_trace(path: Path, stream: list[tuple[int, int, int]], rate: float,
                     limit: int = tr.COUNT_TABLE) -> Path:
    """A trace of two devices, vda and vdb, as the recorder writes it: ``stream`` is their
    references (device, block, op) in order; per-device totals, counts of ``limit``."""
    thr = tr.threshold(rate)
    h = tr.Header(block=4096, rate=rate, started=0.0, devices=[
        tr.Device(i, f"/dev/vd{n}", f"vd{n}", f"254:{16 * i}", 1 << 30)
        for i, n in enumerate("ab")])
    w = tr.Writer(path, h)
    tot = tr.Totals(device_blocks=[[0, 0, 0], [0, 0, 0]])
    cnt = tr.Counts(thr=1 << tr.RATE_BITS, floor=thr, limit=limit)
    for i, (dev, blk, op) in enumerate(stream):
        cnt.add(dev, blk, op)
        tot.requests[op] += 1
        tot.blocks[op] += 1
        tot.device_blocks[dev][op] += 1
        if tr.sampled(dev, blk, thr):
            w.add(i * 1e-4, blk * 4096, 4096, dev, op)
    w.close({"seconds": 1.0, **tot.to_json(), "diskstats": {},
             "block_counts": cnt.to_json()})
    return path


def test_one_device_of_a_trace_is_weighed_to_its_own_totals(tmp_path: Path) -> None:
    """Two devices in one 10 % trace; --device weighs each to its own totals (the trailer's
    per-device ones) and counts: with every block counted, its curve is the one of its
    references alone; with a table of 1000 (counted rate 1/8), its totals are still exact."""
    a = zipf_refs(4096, 20_000, 1.0, seed=12, writes=0.2)
    b = zipf_refs(2048, 8_000, 0.7, seed=13, writes=0.5)
    stream = [(dev, *ref) for pair in itertools.zip_longest(a, b)
              for dev, ref in enumerate(pair) if ref is not None]
    for limit in (tr.COUNT_TABLE, 1000):
        t = tr.read(two_device_trace(tmp_path / f"two{limit}", stream, 0.1, limit))
        for dev, refs in ((0, a), (1, b)):
            hs = sizing.histogram(t, devices=[dev])
            assert hs.strata is not None and hs.strata.rate == (1.0 if limit > 1000 else 1 / 8)
            assert hs.refs[0] == sum(1 for _, op in refs if op == 0)
            assert hs.refs[1] == sum(1 for _, op in refs if op == 1)
            if limit > 1000:
                alone = sizing.histogram(tr.read(make_trace(tmp_path / f"d{dev}", refs,
                                                            rate=0.1, dev=dev)))
                assert hs.distances == alone.distances and hs.refs == alone.refs

def test_sampling_is_per_block_and_nested() -> None:
    thr_hi, thr_lo = tr.threshold(0.1), tr.threshold(0.01)
    kept_hi = {b for b in range(100_000) if tr.sampled(0, b, thr_hi)}
    kept_lo = {b for b in range(100_000) if tr.sampled(0, b, thr_lo)}
    assert kept_lo <= kept_hi  # a lower rate keeps a subset: resampling afterwards works
    assert 9_000 < len(kept_hi) < 11_000 and 800 < len(kept_lo) < 1_200
    assert {b for b in range(1000) if tr.sampled(1, b, thr_hi)} != \
        {b for b in range(1000) if tr.sampled(0, b, thr_hi)}


def test_json_document_and_knee(tmp_path: Path) -> None:
    refs = zipf_refs(8192, 40_000, 1.2, seed=7)
    stats = {"vda": {"reads": 28000, "read_ms": 224000, "writes": 12000, "write_ms": 96000,
                     "queue_ms": 10000}}
    path = make_trace(tmp_path / "t", refs, diskstats=stats)
    r = in_process("size", "--trace", str(path), "--sizes", "4M,16M", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1
    curve = doc["curve"]
    assert len(curve) > 100
    sizes = [p["cache_bytes"] for p in curve]
    assert sizes == sorted(sizes)
    hits = [p["hit_ratio"] for p in curve]
    assert all(b >= a for a, b in itertools.pairwise(hits))  # LRU: no Belady anomaly
    assert set(curve[0]) >= {"cache_bytes", "hit_ratio", "read_hit_ratio", "write_hit_ratio",
                             "hit_ratio_se", "read_hit_ratio_se"}
    assert {p["hit_ratio_se"] for p in curve} == {0.0}  # recorded at rate 1: no sampling
    assert 0 < doc["knee"]["cache_bytes"] < doc["footprint_bytes"]
    assert doc["model"]["hdd_read_ms"] == 8.0 and doc["model"]["queue_depth"] == 1.0
    s4, s16 = doc["sizes"]
    assert s4["cache_bytes"] == 4 << 20 and s16["hit_ratio"] >= s4["hit_ratio"]
    # Little's law: the read latency is the mix of the SSD's and the disk's
    h = s16["read_hit_ratio"]
    assert s16["read_latency_ms"] == pytest.approx(h * 0.1 + (1 - h) * 8.0, abs=1e-3)
    assert s16["read_iops_gain"] == pytest.approx(8.0 / s16["read_latency_ms"], rel=1e-3)
    text = in_process("size", "--trace", str(path), "--sizes", "16M")
    assert "knee of the curve" in text.stdout and "16.0 MiB" in text.stdout


def test_plot_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="plots are the 'plots' extra")
    path = make_trace(tmp_path / "t", zipf_refs(2048, 5000, 1.2, seed=1))
    r = in_process("size", "--trace", str(path), "--plot", str(tmp_path / "mrc"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mrc.png").stat().st_size > 1000
    assert (tmp_path / "mrc.svg").read_text().lstrip().startswith("<?xml")


def test_a_trace_cut_short_is_read_and_said(tmp_path: Path) -> None:
    path = make_trace(tmp_path / "t", zipf_refs(512, 2000, 1.0 + 0.2, seed=2), trailer=False)
    t = tr.read(path)
    assert not t.complete and len(t) == 2000
    r = in_process("size", "--trace", str(path), "--json")
    assert r.returncode == 0
    assert any("no trailer" in n for n in json.loads(r.stdout)["notes"])


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("hello\n")
    with gzip.open(tmp_path / "gz", "wb") as f:
        f.write(b"not a trace\n")
    for name in ("plain", "gz"):
        with pytest.raises(UsageError, match="not a cachemgr trace"):
            tr.read(tmp_path / name)
    with pytest.raises(UsageError, match="no such trace file"):
        tr.read(tmp_path / "absent")
    good = make_trace(tmp_path / "s", zipf_refs(512, 500, 1.2, seed=2), rate=0.5)
    with pytest.raises(UsageError, match="higher rate"):
        sizing.histogram(tr.read(good), rate=0.9)
    with pytest.raises(UsageError, match="same blocks"):
        sizing.histogram(tr.read(good), block=8192)


def test_iolog_for_replay(tmp_path: Path) -> None:
    path = make_trace(tmp_path / "t", [(5, 0), (7, 1), (5, 0)])
    log = tr.write_iolog(tr.read(path), 0, tmp_path / "log")
    assert (log.requests, log.reads, log.writes, log.end) == (3, 2, 1, 8 * 4096)
    assert (tmp_path / "log").read_text().splitlines() == [
        "fio version 2 iolog", "traced add", "traced open", "traced read 20480 4096",
        "traced write 28672 4096", "traced read 20480 4096", "traced close"]


# ----------------------------------------------------------------------------- blktrace

def _event(seq: int, t: int, sector: int, nbytes: int, action: int, dev: int,
           pdu: bytes = b"") -> bytes:
    return blktrace.EVENT.pack(blktrace.MAGIC | blktrace.VERSION, seq, t, sector, nbytes,
                               action, 1, dev, 0, 0, len(pdu)) + pdu


def test_parser_on_captured_stream() -> None:
    """The first events of a real ``blktrace -a queue -o -`` on the qemu lab's /dev/vdb
    (Debian 6.1; tests/fixtures/blktrace/README.md says how it was recorded)."""
    raw = (Path(__file__).parent.parent / "fixtures" / "blktrace" / "vdb-queue.bin").read_bytes()
    p = blktrace.Parser()
    events = []
    for i in range(0, len(raw), 1000):  # fed in pieces that cut records
        events.extend(p.feed(raw[i:i + 1000]))
    # the capture was cut at 24,000 bytes: what is left is the start of the record cut there
    assert p.bad_magic == 0 and len(p.buf) < blktrace.EVENT.size + 64
    assert p.buf == raw[len(raw) - len(p.buf):]
    assert p.skipped >= 1  # the notify events (process names) are not requests
    assert len(events) > 100
    assert {e.devno for e in events} == {(254, 16)}
    assert all(e.op == blktrace.OP_READ and e.nbytes == 4096 for e in events)
    assert all(e.sector * 512 < 256 << 20 for e in events)  # the job's 256 MiB region


def test_parser_kinds_and_resync() -> None:
    q = blktrace.TA_QUEUE
    sh = blktrace.TC_SHIFT
    dev = 8 << 20 | 16
    stream = b"".join([
        _event(0, 10, 0, 0, (blktrace.TC_NOTIFY << sh) | 1, dev, b"fio\0"),
        _event(1, 20, 8, 4096, (blktrace.TC_READ << sh) | q, dev),
        _event(2, 30, 16, 8192, (blktrace.TC_WRITE << sh) | q, dev),
        _event(3, 40, 24, 4096, ((blktrace.TC_WRITE | blktrace.TC_DISCARD) << sh) | q, dev),
        b"\x00" * 13,  # garbage between records
        _event(4, 50, 32, 4096, (blktrace.TC_READ << sh) | 2, dev),  # not a Q event
        _event(5, 60, 40, 4096, (blktrace.TC_READ << sh) | q, dev),
    ])
    p = blktrace.Parser()
    evs = list(p.feed(stream))
    assert [(e.sector, e.op) for e in evs] == [(8, 0), (16, 1), (24, 2), (40, 0)]
    assert evs[0].devno == (8, 16)
    assert p.bad_magic >= 1 and p.skipped == 2


def blktrace_stream(data: bytes, chunk: int = 4096) -> type:
    """A stand-in for the blktrace wrapper that hands out ``data`` ``chunk`` bytes at a
    time (blktrace's own record layout), then its end; it expects to be stopped, not
    killed."""

    class Fake:
        def __init__(self, devices: list[str]) -> None:
            assert devices == ["/dev/ubdc"]
            self.chunks = [data[i:i + chunk] for i in range(0, len(data), chunk)]
            self.stopped = False

        def read(self, size: int = 0) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

        def stop(self) -> None:
            self.stopped = True

        def finish(self) -> None:
            assert self.stopped

        def kill(self) -> None:
            raise AssertionError("not killed when it ends by itself")

    return Fake


def ubdc_sysfs(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, int]:
    """The captured sysfs the recorder tests trace /dev/ubdc on, and ubdc's raw devno."""
    from cachemgr.core.sysfs import Sysfs

    root = Path(__file__).parent.parent / "fixtures" / "schedulers-uml" / "sys"
    monkeypatch.setattr(Sysfs, "block_name_of", lambda self, node: node.rsplit("/", 1)[-1])
    major, minor = ((root / "block" / "ubdc" / "dev").read_text().strip().split(":"))
    return Sysfs(root), int(major) << 20 | int(minor)


def test_record_with_a_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder's loop on a captured sysfs and a stream made of real event layouts: the
    totals count every request, the file holds the sampled ones in time order, out-of-order
    CPUs are sorted, other devices are ignored."""
    sysfs, dev = ubdc_sysfs(monkeypatch)
    ubdc = f"{dev >> 20}:{dev & 0xFFFFF}"
    sh, q = blktrace.TC_SHIFT, blktrace.TA_QUEUE
    # 2000 reads of 1-3 blocks from block (7 i) mod 500: blocks referenced again, so the
    # block counts hold reuse times; pairs swapped: two CPUs' batches
    spans = [(i * 7 % 500, 1 + i % 3) for i in range(2000)]
    evs = [_event(i, 1_000_000 * (i ^ 1), 8 * b, 4096 * n, (blktrace.TC_READ << sh) | q, dev)
           for i, (b, n) in enumerate(spans)]
    evs.append(_event(9999, 5, 0, 4096, (blktrace.TC_READ << sh) | q, dev + 1))  # ubdd: not ours
    data = b"".join(evs)

    Fake = blktrace_stream(data)
    out = tmp_path / "t.trace"
    rec = tr.record(sysfs, ["/dev/ubdc"], out, seconds=None, rate=0.5, source=Fake)  # type: ignore[arg-type]
    assert rec.trailer["requests"]["read"] == 2000
    assert rec.trailer["ended_by"] == "blktrace ended"
    assert out.stat().st_mode & 0o777 == 0o600  # which blocks the VMs use is private
    t = tr.read(out)
    assert t.complete and 700 < len(t) < 1700
    assert t.t == sorted(t.t)
    thr = tr.threshold(0.5)
    assert all(any(tr.sampled(0, off // 4096 + j, thr) for j in range(ln // 4096))
               for off, ln in zip(t.offset, t.length, strict=True))
    assert t.header.devices[0].name == "ubdc" and t.header.devices[0].devno == ubdc
    # the block counts the loop kept inline are Counts.add's, reuse times included (here
    # every block: 502 fit), in the order the events came (not the time order)

    def counted(c: tr.Counts) -> dict[str, object]:
        for b, n in spans:
            for x in range(b, b + n):
                c.add(0, x, 0)
        return c.to_json()

    bc = rec.trailer["block_counts"]
    assert bc == counted(tr.Counts(thr=1 << tr.RATE_BITS, floor=thr))
    assert bc["rate"] == 1.0 and bc["reuse"]["references"] == sum(n for _, n in spans)
    assert sum(row[-1] for row in bc["reuse"]["first"]) == 502
    assert len(bc["reuse"]["times"]) > 10
    # a table of 300: the loop halves the threshold as Counts does
    rec = tr.record(sysfs, ["/dev/ubdc"], tmp_path / "small", seconds=None, rate=0.01,
                    source=Fake, count_table=300)  # type: ignore[arg-type]
    bc = rec.trailer["block_counts"]
    assert bc == counted(tr.Counts(thr=1 << tr.RATE_BITS, floor=tr.threshold(0.01), limit=300))
    assert bc["rate"] in (0.5, 0.25) and bc["reuse"]["times"]


def test_a_partition_is_traced_from_its_start(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's events for a partition carry the disk's sectors (the qemu lab: a read at
    sector 80 of vda1, which starts at 2048, came as sector 2128 with vda1's device number);
    the trace holds offsets from the partition's start, and drops what lies before it."""
    from cachemgr.core.sysfs import Sysfs

    root = Path(__file__).parent.parent / "fixtures" / "schedulers-uml" / "sys"
    monkeypatch.setattr(Sysfs, "block_name_of", lambda self, node: node.rsplit("/", 1)[-1])
    part = root / "block" / "ubda" / "ubda1"
    start = int((part / "start").read_text())
    major, minor = (int(x) for x in (part / "dev").read_text().split(":"))
    sh, q = blktrace.TC_SHIFT, blktrace.TA_QUEUE
    data = b"".join(_event(i, 1000 * i, start + 8 * i, 4096, (blktrace.TC_READ << sh) | q,
                           major << 20 | minor) for i in range(50))
    data += _event(99, 10**6, 0, 4096, (blktrace.TC_READ << sh) | q, major << 20 | minor)

    class Fake:
        def __init__(self, devices: list[str]) -> None:
            self.chunks = [data]

        def read(self, size: int = 0) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

        def stop(self) -> None:
            pass

        def finish(self) -> None:
            pass

        def kill(self) -> None:
            pass

    out = tmp_path / "p.trace"
    tr.record(Sysfs(root), ["/dev/ubda1"], out, seconds=None, rate=1.0, source=Fake)  # type: ignore[arg-type]
    t = tr.read(out)
    assert t.header.devices[0].start == start
    assert t.offset == [4096 * i for i in range(50)]  # the event before the start is dropped


def test_a_blktrace_that_does_not_stop_is_killed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked to stop, the event source stays silent and does not end: after stop_wait the
    recorder kills it and still writes a complete file, saying so."""
    from cachemgr.core.sysfs import Sysfs

    root = Path(__file__).parent.parent / "fixtures" / "schedulers-uml" / "sys"
    monkeypatch.setattr(Sysfs, "block_name_of", lambda self, node: node.rsplit("/", 1)[-1])
    killed = []

    class Stuck:
        def __init__(self, devices: list[str]) -> None:
            pass

        def read(self, size: int = 0) -> bytes | None:
            return None  # nothing within the timeout, ever

        def stop(self) -> None:
            pass

        def kill(self) -> None:
            killed.append(True)

        def finish(self) -> None:
            assert killed

    out = tmp_path / "t.trace"
    rec = tr.record(Sysfs(root), ["/dev/ubdc"], out, seconds=0.2, source=Stuck,  # type: ignore[arg-type]
                    stop_wait=0.3)
    assert killed == [True] and rec.trailer["blktrace_killed"] is True
    assert rec.trailer["ended_by"] == "time" and tr.read(out).complete


def test_record_struct_is_compact() -> None:
    assert tr.RECORD.size == 22  # an hour at 10k IOPS sampled at 1 %: 7.9 MB before gzip
    assert struct.calcsize("<IIQQIIIIIHH") == 48  # struct blk_io_trace
