"""bench: fio JSON parsing on real lab captures, Hypothesis robustness, statistics, jobs."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode
from cachemgr.procedures import bench
from cachemgr.procedures.bench import FioFormatError, JobSpec, parse_fio
from cachemgr.procedures.bench.comparison import _speedups

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "fio"
CAPTURES = sorted(FIX.glob("*.json"))


def load(name: str) -> str:
    return (FIX / name).read_text()


def doc(name: str) -> dict[str, Any]:
    text = load(name)
    return json.loads(text[text.index("{"):])  # type: ignore[no-any-return]


def test_captures_exist() -> None:
    assert len(CAPTURES) >= 8
    assert "fio-3.33" in (FIX / "VERSION").read_text()


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_capture_parses(path: Path) -> None:
    r = parse_fio(path.read_text())
    assert r.fio_version == "fio-3.33"
    assert r.runtime_ms > 0
    assert r.iops >= 0


def test_qd1_writes_on_the_dm_delay_hdd() -> None:
    r = parse_fio(load("randwrite-qd1-dmdelay.json"))
    assert r.read is None and r.write is not None and r.mixed is None
    assert r.error == 0 and r.total_err is None
    lat = r.latency
    assert lat is not None
    # dm-delay 8 ms at HZ=100: one or two jiffies
    assert 8_000 < (lat.p50_us or 0) < 21_000
    assert lat.p50_us is not None and lat.p90_us is not None and lat.p99_us is not None
    assert lat.p50_us <= lat.p90_us <= lat.p99_us <= (lat.p99_9_us or 0) <= (lat.p99_99_us or 0)
    assert [p for p, _ in lat.percentiles] == list(bench.PERCENTILES)
    raw = doc("randwrite-qd1-dmdelay.json")["jobs"][0]["write"]
    assert r.write.iops == raw["iops"]
    assert r.write.bw_bytes == raw["bw"] * 1024
    assert r.write.lat_mean_us == raw["lat_ns"]["mean"] / 1000
    assert lat.p99_us == raw["clat_ns"]["percentile"]["99.000000"] / 1000


def test_bcache_writeback_is_far_faster_in_the_captures() -> None:
    hdd = parse_fio(load("randwrite-qd1-dmdelay.json"))
    bc = parse_fio(load("randwrite-qd1-bcache-writeback.json"))
    assert bc.iops / hdd.iops > 50


def test_mixed_job_reports_unified_latency() -> None:
    r = parse_fio(load("randrw-qd4-unified-both.json"))
    assert r.read is not None and r.write is not None and r.mixed is not None
    assert r.latency is r.mixed.clat
    assert math.isclose(r.iops, r.read.iops + r.write.iops)
    assert r.lat_mean_us == r.mixed.lat_mean_us


def test_group_reporting_of_several_jobs() -> None:
    r = parse_fio(load("randwrite-3jobs-pareto.json"))
    assert r.write is not None and r.write.ios > 0


def test_steady_state_verdicts() -> None:
    no = parse_fio(load("steadystate-not-attained.json")).steadystate
    yes = parse_fio(load("steadystate-attained.json")).steadystate
    assert no is not None and not no.attained and no.criterion.startswith("iops_slope")
    assert yes is not None and yes.attained and yes.duration_s == 2


def test_io_errors() -> None:
    eio = parse_fio(load("error-eio.json"))  # fio printed a notice line before the JSON
    assert eio.error == 5 and eio.total_err is None and eio.iops == 0
    assert eio.latency is not None and eio.latency.percentiles == ()
    cont = parse_fio(load("errors-continue-on-error.json"))
    assert cont.error == 5 and cont.total_err is not None and cont.total_err > 1000


@pytest.mark.parametrize("path,field", [
    (("jobs",), "jobs"),
    (("jobs", 0, "write", "iops"), "jobs[0].write.iops"),
    (("jobs", 0, "write", "clat_ns", "percentile"), "jobs[0].write.clat_ns.percentile"),
    (("jobs", 0, "write", "lat_ns"), "jobs[0].write.lat_ns"),
    (("jobs", 0, "error"), "jobs[0].error"),
    (("jobs", 0, "read", "total_ios"), "jobs[0].read.total_ios"),
    (("jobs", 0, "job_runtime"), "jobs[0].job_runtime"),
])
def test_missing_fields_are_named(path: tuple[Any, ...], field: str) -> None:
    d = doc("randwrite-qd1-dmdelay.json")
    cur: Any = d
    for k in path[:-1]:
        cur = cur[k]
    del cur[path[-1]]
    with pytest.raises(FioFormatError) as ei:
        parse_fio(json.dumps(d))
    assert ei.value.field_path.startswith(field)
    assert field in str(ei.value)


def test_not_json_at_all() -> None:
    with pytest.raises(FioFormatError, match="no JSON"):
        parse_fio("fio: failed to open /dev/nope\n")
    with pytest.raises(FioFormatError, match="not valid JSON"):
        parse_fio(load("randwrite-qd1-dmdelay.json")[:500])


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_the_typed_error(text: str) -> None:
    try:
        parse_fio(text)
    except FioFormatError:
        pass


@settings(max_examples=300, deadline=None)
@given(_json)
def test_arbitrary_json_raises_only_the_typed_error(value: Any) -> None:
    try:
        parse_fio(json.dumps(value))
    except FioFormatError:
        pass


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


REAL = doc("randrw-qd4-unified-both.json")
REAL_PATHS = _paths(REAL)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REAL_PATHS), st.sampled_from(["delete", "null", "string", "list"]))
def test_damaged_real_output_parses_or_names_the_field(path: tuple[Any, ...], how: str) -> None:
    d = copy.deepcopy(REAL)
    cur: Any = d
    for k in path[:-1]:
        cur = cur[k]
    last = path[-1]
    if how == "delete":
        if isinstance(cur, list):
            cur.pop(last)
        else:
            del cur[last]
    else:
        cur[last] = {"null": None, "string": "x", "list": []}[how]
    try:
        r = parse_fio(json.dumps(d))
    except FioFormatError as exc:
        assert exc.field_path  # names what is wrong
    else:
        assert r.iops >= 0


# ----------------------------------------------------------------------------- statistics


def test_spread_and_median() -> None:
    s = bench.spread([100.0, 120.0, 80.0])
    assert s is not None
    assert (s.median, s.low, s.high, s.n) == (100.0, 80.0, 120.0, 3)
    assert math.isclose(s.rel_spread, 0.4)
    assert bench.spread([]) is None
    one = bench.spread([5.0])
    assert one is not None and one.rel_spread == 0.0
    even = bench.spread([1.0, 2.0, 3.0, 10.0])
    assert even is not None and even.median == 2.5


def test_ratio() -> None:
    assert bench.ratio(10, 2) == 5
    assert bench.ratio(None, 2) is None
    assert bench.ratio(1, 0) is None


def test_disagreeing_runs() -> None:
    assert bench.disagreeing([100, 105, 95], 0.2) == []
    assert bench.disagreeing([100, 105, 50], 0.2) == [2]
    assert bench.disagreeing([100], 0.2) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.1, max_value=1e7), min_size=1, max_size=9))
def test_spread_properties(values: list[float]) -> None:
    s = bench.spread(values)
    assert s is not None
    assert s.low <= s.median <= s.high
    assert s.rel_spread >= 0
    # runs flagged are exactly those further than the tolerance from the median
    for i in bench.disagreeing(values, 0.2):
        assert abs(values[i] - s.median) > 0.2 * s.median


def _run(label: str, rep: int, name: str) -> bench.RunResult:
    return bench.RunResult(label=label, repetition=rep, seed=rep, started=0.0,
                           fio=parse_fio(load(name)), cache=None, jobfile="")


def test_summarize_medians_and_flags() -> None:
    runs = [_run("x", 1, "randwrite-qd1-bcache-writeback.json"),
            _run("x", 2, "randwrite-qd1-dmdelay.json"),
            _run("x", 3, "steadystate-not-attained.json")]
    s = bench.summarize("x", "/dev/x", runs, tolerance=0.2)
    iops = sorted(r.fio.iops for r in runs)
    assert s.iops.median == iops[1]
    assert s.lat_p99_us is not None and s.lat_p99_us.n == 3
    text = " | ".join(s.flags)
    assert "steady state not reached in run(s) 3" in text
    assert "differ from the median" in text


def test_summarize_flags_io_errors() -> None:
    s = bench.summarize("e", "/dev/e", [_run("e", 1, "errors-continue-on-error.json")])
    assert any("IO errors" in f for f in s.flags)


def test_comparison_json_and_table(tmp_path: Path) -> None:
    spec = JobSpec(rw="randwrite", iodepth=1, runtime=3)
    runs = [_run("hdd", 1, "randwrite-qd1-dmdelay.json"),
            _run("bc", 1, "randwrite-qd1-bcache-writeback.json")]
    sums = [bench.summarize(r.label, "/dev/x", [r]) for r in runs]
    sums = _speedups(spec, sums)
    c = bench.Comparison(spec=spec, targets=(), runs=tuple(runs), summaries=tuple(sums),
                         options=bench.CompareOptions(repeat=1), fio_version="fio-3.33",
                         kernel="7.2.7", hygiene=("x",), identities={}, created=0.0)
    d = bench.to_json(c)
    assert d["schema"] == 1
    res = d["results"]
    assert [r["label"] for r in res] == ["hdd", "bc"]
    for r in res:
        for k in ("label", "iops", "lat_p50_us", "lat_p99_us", "hit_ratio"):
            assert k in r
    assert res[1]["iops_ratio"] > 50 and res[1]["p99_ratio"] > 1
    assert res[1]["qd1_speedup"] > 50
    json.dumps(d)  # serializable
    path = bench.save(d, tmp_path)
    assert bench.load(path)["results"] == res
    text = bench.table(d)
    assert "hdd" in text and "QD1 speed-up" in text
    with pytest.raises(UsageError):
        bench.load(tmp_path / "nope.json")


# ----------------------------------------------------------------------------- jobs


def test_job_file_has_the_hygiene_options() -> None:
    jf = JobSpec(rw="randread", iodepth=8, distribution="zipf:1.2", size="256M",
                 steadystate="iops_slope:2%", ss_dur=2, runtime=5).jobfile("a b", "/dev/x",
                                                                           seed=7)
    lines = jf.splitlines()
    assert lines[0] == "[a_b]"
    for want in ("filename=/dev/x", "rw=randread", "iodepth=8", "direct=1", "randrepeat=0",
                 "randseed=7", "random_distribution=zipf:1.2", "norandommap=1", "size=256M",
                 "steadystate=iops_slope:2%", "ss_dur=2s", "time_based=1", "runtime=5s",
                 "group_reporting=1"):
        assert want in lines
    assert any(x.startswith("percentile_list=1:5:") and x.endswith(":99.99") for x in lines)


def test_mixed_job_asks_for_unified_reporting() -> None:
    jf = JobSpec(rw="randrw").jobfile("m", "/dev/x", seed=1)
    assert "unified_rw_reporting=both" in jf and "rwmixread=70" in jf


@pytest.mark.parametrize("kw", [
    {"rw": "trim"}, {"iodepth": 0}, {"distribution": "zipf:1.0"}, {"distribution": "zipf:x"},
    {"runtime": 0}, {"bs": "4q"}, {"steadystate": "latency:5"}, {"rwmixread": 101},
])
def test_bad_jobs_are_usage_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        JobSpec(**kw).validate()


def test_sizes() -> None:
    assert bench.parse_size("4k") == 4096
    assert bench.parse_size("256M") == 256 << 20
    assert bench.parse_size("1G") == 1 << 30
    with pytest.raises(UsageError):
        bench.parse_size("lots")


def test_targets() -> None:
    assert bench.parse_target("/dev/bcache0:writeback")[1:] == ("/dev/bcache0", CacheMode.WRITEBACK)
    assert bench.parse_target("hdd=/dev/mapper/hdd") == ("hdd", "/dev/mapper/hdd", None)
    assert bench.parse_target("/dev/disk/by-id/x")[2] is None
    with pytest.raises(UsageError):
        bench.parse_target("/dev/bcache0:fast")


def test_block_stat() -> None:
    s = bench.BlockStat.parse("3 0 24 30 92534 0 740272 8060 0 8090 8090 0 0 0 0 0 0")
    assert (s.reads, s.read_sectors, s.writes, s.write_sectors) == (3, 24, 92534, 740272)
    assert (s.read_ms, s.write_ms, s.queue_ms) == (30, 8060, 8090)
    d = s.minus(bench.BlockStat.parse("1 0 8 10 92500 0 740000 8000 0 8000 8000"))
    assert (d.reads, d.read_sectors, d.read_ms, d.writes, d.queue_ms) == (2, 16, 20, 34, 90)
    from cachemgr.core.errors import KernelFormatError

    with pytest.raises(KernelFormatError):
        bench.BlockStat.parse("garbage")


def test_served_ratio_counts_bypass_hits() -> None:
    assert bench.counted_served(90, 10, 0, 0) == 0.9
    assert bench.counted_served(80, 10, 5, 5) == 0.85
    assert bench.counted_served(0, 0, 0, 0) is None
    assert bench.counted_served(None, 1, 0, 0) is None


def test_short_read_run_is_flagged_against_ches_characteristic_time() -> None:
    from cachemgr.procedures import che

    p = che.predict(items=65536, cache_items=8192, theta=1.2)
    t = p.characteristic_requests
    assert 10_000 < t < 1_000_000
    flag = bench.short_for_hit_ratio(int(t), p)
    assert flag is not None and f"{int(2 * t):,}" in flag
    assert bench.short_for_hit_ratio(int(2 * t) + 1, p) is None
    assert bench.short_for_hit_ratio(0, p) is None  # a write run: no hit ratio to judge
    assert bench.short_for_hit_ratio(10, None) is None  # no Zipf prediction
