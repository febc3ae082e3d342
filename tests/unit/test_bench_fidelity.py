"""The bench's own cost and its reference device (issue #20 item 3): the sampler reads three
files a sample (or nothing when off), and a result carries its bare reference device's
figures. Counted, never timed (benchmarks/bench_fidelity_bench.py measures the effect)."""

from __future__ import annotations

import json

import pytest

from cachemgr.core.errors import UsageError
from cachemgr.procedures import bench
from cachemgr.procedures.bench.comparison import _speedups, with_references
from cachemgr.procedures.bench.sampling import _Sampler
from tests.unit.test_bench import _run
from tests.unit.test_scan_budget import Counting
from tests.unit.tui_helpers import fx


def test_a_sample_reads_three_files() -> None:
    s = Counting(fx("bcache-writeback-dirty"))
    sampler = _Sampler(s, "bcache0", "ubda", 1.0, None)
    s.reads.clear()
    sampler.stop.wait = lambda _t: sampler.samples >= 5  # type: ignore[method-assign]
    sampler._loop()
    assert sampler.samples == 5
    assert sum(s.reads.values()) == 15, s.reads
    assert {r.rsplit("/", 1)[-1] for r in s.reads} == {
        "stat", "dirty_data", "cache_available_percent"}
    assert len(sampler.points) == 5 and sampler.points[0][1] is not None
    assert sampler.avail and all(0 <= a <= 100 for a in sampler.avail)


def test_sampling_off_starts_nothing() -> None:
    s = Counting(fx("bcache-writeback-dirty"))
    with _Sampler(s, "bcache0", "ubda", 0.0, None) as sampler:
        pass
    assert not sampler.thread.is_alive() and sampler.thread.ident is None
    assert sampler.samples == 0 and sampler.points == []


def test_reference_words() -> None:
    assert bench.parse_reference("ssd") == ("*", "ssd")
    assert bench.parse_reference("bc=ssd") == ("bc", "ssd")
    for bad in ("=ssd", "bc=", "a\nb"):
        with pytest.raises(UsageError):
            bench.parse_reference(bad)
    from cachemgr.procedures.bench.comparison import check_references

    check_references([("*", "ssd"), ("bc", "ssd")], ["hdd", "ssd", "bc"])
    for refs in ([("*", "nvme")], [("wc", "ssd")], [("ssd", "ssd")]):
        with pytest.raises(UsageError):
            check_references(refs, ["hdd", "ssd", "bc"])
    with pytest.raises(UsageError):
        bench.CompareOptions(sample_interval=float("nan")).validate()


def test_result_carries_the_reference_figures() -> None:
    """hdd (the baseline), a bare "ssd" and a bcache: the cache's result has the SSD's
    figures and its share of the SSD's IOPS next to its speed-up over the HDD; the baseline
    and the reference itself have none."""
    spec = bench.JobSpec(rw="randwrite", iodepth=1, runtime=3)
    runs = [_run("hdd", 1, "randwrite-qd1-dmdelay.json"),
            _run("ssd", 1, "randwrite-qd1-bcache-writeback.json"),
            _run("bc", 1, "randwrite-qd1-bcache-writeback.json")]
    sums = with_references(_speedups(spec, [bench.summarize(r.label, "/dev/x", [r])
                                            for r in runs]), [("*", "ssd")])
    c = bench.Comparison(spec=spec, targets=(), runs=tuple(runs), summaries=tuple(sums),
                         options=bench.CompareOptions(repeat=1, reference=(("*", "ssd"),)),
                         fio_version="fio-3.33", kernel="7.2.7", hygiene=(), identities={},
                         created=0.0)
    d = json.loads(json.dumps(bench.to_json(c)))
    hdd, ssd, bc = d["results"]
    assert hdd["reference"] is None and ssd["reference"] is None
    assert bc["reference"]["label"] == "ssd" and bc["reference"]["iops"] == ssd["iops"]
    assert bc["reference_iops_fraction"] == pytest.approx(bc["iops"] / ssd["iops"], abs=1e-3)
    assert bc["reference_p99_ratio"] == pytest.approx(1.0)
    assert bc["iops_ratio"] > 50  # and the speed-up over the HDD, as before
    assert d["options"]["reference"] == [["*", "ssd"]]
    assert d["options"]["sample_interval"] == 1.0
    assert "bc: 100% of ssd's IOPS" in bench.table(d)
