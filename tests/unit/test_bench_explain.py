"""A cache no faster than the bare disk is explained (issue #32 item 7): the cache's own SSD
measured apart, read-only (``--reference cache-ssd``), and the result saying whether the SSD
is any faster than the backing disk, in the JSON, the table and every face.

The fio outputs are lab captures (scripts/capture-fio-slow-ssd.py): bcache over an 8 ms
dm-delay HDD whose cache SSD is an 8 ms dm-delay too, in mode none and writeback; the slow
SSD and a bare disk read as the reference job reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import bench
from cachemgr.procedures.bench import comparison, reference
from cachemgr.procedures.bench.comparison import _speedups, with_apart_references
from tests.unit.test_bench import _run, load
from tests.unit.tui_helpers import copy_capture, fx, kernel_writes

NONE = "/dev/bcache0:none"
WB = "/dev/bcache0:writeback"
SLOW_NONE = "randwrite-qd1-bcache-none-slow-ssd.json"
SLOW_WB = "randwrite-qd1-bcache-writeback-slow-ssd.json"
SLOW_SSD = "randread-qd1-readonly-slow-ssd.json"
BARE_SSD = "randread-qd1-readonly-bare-ssd.json"


def _target(label: str, mode: CacheMode | None) -> bench.Target:
    return bench.Target(label=label, spec=label, device="/dev/bcache0", name="bcache0",
                        mode=mode, backing_name="ubda")


IDENTITY = {"cache_set": "7d2c", "mode_before": "writeback", "cache_devices": [
    {"node": "/dev/ubdb", "name": "ubdb"}]}


def comparison_doc(base_fio: str, cache_fio: str, ref_fio: str | None, *,
                   cache_mode: CacheMode = CacheMode.WRITEBACK,
                   rw: str = "randwrite") -> dict[str, Any]:
    """A result document as compare() makes it: the bare disk through bcache (mode none),
    the cache, and (if given) the cache SSD read apart, from the captured fio outputs."""
    spec = bench.JobSpec(rw=rw, iodepth=1, size="256M", runtime=5)
    cache_label = f"/dev/bcache0:{cache_mode.value}"
    runs = [_run(NONE, 1, base_fio), _run(cache_label, 1, cache_fio)]
    sums = _speedups(spec, [bench.summarize(r.label, "/dev/bcache0", [r]) for r in runs])
    refs, ref_runs, of = [], [], {}
    if ref_fio is not None:
        rr = _run("/dev/ubdb", 1, ref_fio)
        ref_runs = [rr]
        refs = [bench.summarize("/dev/ubdb", "/dev/ubdb", [rr])]
        refs = [comparison.replace(refs[0], role="cache SSD", rw="randread")]
        of = {"/dev/ubdb": (cache_label,)}
        sums = with_apart_references(sums, refs, of)
    c = bench.Comparison(
        spec=spec, targets=(_target(NONE, CacheMode.NONE), _target(cache_label, cache_mode)),
        runs=tuple(runs), summaries=tuple(sums),
        options=bench.CompareOptions(repeat=1, reference=(("*", "cache-ssd"),)),
        fio_version="fio-3.33", kernel="7.2.7", hygiene=(),
        identities={NONE: IDENTITY, cache_label: IDENTITY}, created=0.0,
        references=tuple(refs), reference_runs=tuple(ref_runs), reference_of=of)
    doc: dict[str, Any] = json.loads(json.dumps(bench.to_json(c)))
    return doc


def fio_of(name: str) -> bench.FioResult:
    return bench.parse_fio(load(name))


def test_a_cache_on_an_ssd_as_slow_as_the_disk_is_explained() -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, SLOW_SSD)
    base, wb = doc["results"]
    assert base["explanation"] is None  # the baseline explains nothing
    why = wb["explanation"]
    assert why is not None and why["speedup"] < bench.NO_GAIN
    assert why["speedup"] == wb["qd1_speedup"] and why["by"] == "QD1 mean latency"
    assert why["verdict"] == "ssd-no-faster"
    ssd = fio_of(SLOW_SSD)
    assert why["ssd"]["device"] == "/dev/ubdb" and why["ssd"]["role"] == "cache SSD"
    assert why["ssd"]["rw"] == "randread"
    assert why["ssd"]["iops"] == pytest.approx(ssd.iops, abs=0.1)
    assert why["ssd"]["iops_over_baseline"] == pytest.approx(
        ssd.iops / fio_of(SLOW_NONE).iops, abs=0.01)
    p99 = ssd.latency.p99_us if ssd.latency else None
    assert p99 is not None and p99 > 1000
    assert (f"the cache SSD /dev/ubdb itself does {ssd.iops:,.0f} IOPS at p99 "
            f"{p99 / 1000:,.1f} ms (randread QD1)") in why["text"]
    assert "no faster than the backing disk; a cache cannot beat its SSD" in why["text"]
    # the reference's own figures, and the share of it, as with a labelled reference
    assert wb["reference"]["role"] == "cache SSD" and wb["reference"]["rw"] == "randread"
    assert doc["references"][0]["of"] == [WB] and len(doc["reference_runs"]) == 1
    text = bench.table(doc)
    assert f"{WB}: why no faster: {why['text']}" in text
    assert "of the cache SSD /dev/ubdb's IOPS" in text and "randread, measured apart" in text


def test_a_fast_ssd_says_the_ssd_is_not_the_limit() -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, BARE_SSD)
    why = doc["results"][1]["explanation"]
    assert why["verdict"] == "ssd-faster"
    assert why["ssd"]["iops_over_baseline"] > bench.NO_GAIN
    assert "the SSD is not what holds the cache back" in why["text"]


def test_without_a_reference_the_result_says_how_to_measure_the_ssd() -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, None)
    why = doc["results"][1]["explanation"]
    assert why["verdict"] == "ssd-unmeasured" and why["ssd"] is None
    assert "--reference cache-ssd" in why["text"]
    assert doc["results"][1]["reference"] is None and doc["references"] == []


def test_a_cache_that_gains_needs_no_explanation() -> None:
    doc = comparison_doc("randwrite-qd1-dmdelay.json", "randwrite-qd1-bcache-writeback.json",
                         SLOW_SSD)
    wb = doc["results"][1]
    assert wb["qd1_speedup"] > bench.NO_GAIN and wb["explanation"] is None
    assert "why no faster" not in bench.table(doc)


def test_writethrough_writes_are_named_as_a_reason() -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, BARE_SSD, cache_mode=CacheMode.WRITETHROUGH)
    why = doc["results"][1]["explanation"]
    assert why["verdict"] == "ssd-faster"
    assert any("writethrough every write also waits for the backing disk" in r
               for r in why["reasons"])
    assert why["reasons"][0] in why["text"]


def test_mode_none_is_no_cache_to_explain() -> None:
    doc = comparison_doc(SLOW_WB, SLOW_NONE, None, cache_mode=CacheMode.NONE)
    assert doc["results"][1]["explanation"] is None


def test_a_saved_result_is_explained_again_when_loaded(tmp_path: Path) -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, SLOW_SSD)
    for r in doc["results"]:
        del r["explanation"]  # as saved by an older cachemgr
    loaded = bench.load(bench.save(doc, tmp_path))
    assert bench.with_explanations(loaded)["results"][1]["explanation"]["verdict"] == \
        "ssd-no-faster"


# ----------------------------------------------------------------------------- the job


def test_the_reference_job_reads_only_with_fios_guard() -> None:
    spec = bench.JobSpec(rw="randwrite", bs="16k", iodepth=4, distribution="zipf:0.9",
                         size="64G", runtime=30)
    ref = bench.reference_spec(spec)
    assert (ref.rw, ref.bs, ref.iodepth, ref.distribution) == ("randread", "16k", 4,
                                                               "zipf:0.9")
    assert ref.readonly and not ref.writes and ref.size is None
    assert ref.runtime == reference.REFERENCE_RUNTIME
    assert bench.reference_spec(bench.JobSpec(rw="rw")).rw == "read"
    jf = ref.jobfile("/dev/sdc", "/dev/sdc", seed=1).splitlines()
    assert jf[0].startswith("; run with fio --readonly") and "rw=randread" in jf
    with pytest.raises(UsageError):
        bench.JobSpec(rw="randwrite", readonly=True).validate()


def test_run_fio_passes_readonly_on_its_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.core import runner
    from cachemgr.procedures.bench import fio

    seen: list[list[str]] = []

    def run(argv: list[str], **kw: object) -> runner.Completed:
        seen.append(list(argv))
        return runner.Completed(argv, 0, load(SLOW_SSD), "")

    monkeypatch.setattr(runner, "run", run)
    t = bench.Target(label="/dev/ubdb", spec="/dev/ubdb", device="/dev/ubdb", name="ubdb")
    fio.run_fio(bench.reference_spec(bench.JobSpec(runtime=1)), t, seed=1)
    fio.run_fio(bench.JobSpec(runtime=1), t, seed=1)
    assert "--readonly" in seen[0] and "--readonly" not in seen[1]


# ----------------------------------------------------------------------------- planning


def test_cache_ssd_is_each_cache_targets_own_ssd() -> None:
    sysfs = Sysfs(fx("bcache-writeback-dirty"))
    snap = snapshot.take(sysfs)
    bare = bench.Target(label="hdd", spec="hdd=/dev/ubdc", device="/dev/ubdc", name="ubdc")
    wb, wt = _target(WB, CacheMode.WRITEBACK), _target("wt", CacheMode.WRITETHROUGH)
    (a,) = reference.plan(sysfs, snap, [bare, wb, wt], [("*", "cache-ssd")])
    assert (a.target.device, a.target.name, a.role, a.of) == ("/dev/ubdb", "ubdb",
                                                             "cache SSD", (WB, "wt"))
    (a,) = reference.plan(sysfs, snap, [bare, wb, wt], [("wt", "cache-ssd")])
    assert a.of == ("wt",)
    # a label reference is the comparison's own: nothing to measure apart
    assert reference.plan(sysfs, snap, [bare, wb], [("*", "hdd")]) == []
    with pytest.raises(UsageError, match="/dev/ubdc has no cache SSD"):
        reference.plan(sysfs, snap, [wb, bare], [("hdd", "cache-ssd")])
    with pytest.raises(UsageError, match="no target after the first"):
        reference.plan(sysfs, snap, [wb, bare], [("*", "cache-ssd")])


def test_reference_words_are_checked() -> None:
    comparison.check_references([("*", "cache-ssd"), ("wb", "/dev/sdc")], ["hdd", "wb"])
    with pytest.raises(UsageError, match="cache-ssd"):
        comparison.check_references([("*", "ssd")], ["hdd", "wb"])
    with pytest.raises(UsageError):
        comparison.check_references([("nope", "cache-ssd")], ["hdd", "wb"])


def test_compare_reads_the_cache_ssd_apart_and_explains(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """compare() with --reference cache-ssd on the captured bcache0: the targets' runs
    interleaved, then each repetition one read-only run of the cache SSD (ubdb), the
    result explained. fio is the captured outputs; the mode switches go to a copy."""
    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    kernel_writes(monkeypatch)
    targets = {NONE: _target(NONE, CacheMode.NONE), WB: _target(WB, CacheMode.WRITEBACK)}
    order: list[str] = []

    def run_one(sysfs_: Sysfs, spec: bench.JobSpec, t: bench.Target, rep: int,
                opts: object, hyg: object, **kw: object) -> bench.RunResult:
        order.append(t.label)
        return _run(t.label, rep, SLOW_NONE if t.mode == CacheMode.NONE else SLOW_WB)

    ref_specs: list[bench.JobSpec] = []

    def run_fio(spec: bench.JobSpec, t: bench.Target, *, seed: int,
                **kw: object) -> tuple[bench.FioResult, str]:
        order.append(t.device)
        ref_specs.append(spec)
        return fio_of(SLOW_SSD), spec.jobfile(t.label, t.device, seed=seed)

    monkeypatch.setattr(comparison, "resolve_target", lambda s, text: targets[text])
    monkeypatch.setattr(comparison, "run_one", run_one)
    monkeypatch.setattr(comparison, "run_fio", run_fio)
    monkeypatch.setattr(comparison, "fio_version", lambda: "fio-3.33")
    monkeypatch.setattr(comparison, "write_refusal", lambda *a: ("", True))
    c = bench.compare(sysfs, bench.JobSpec(rw="randwrite", runtime=5), [NONE, WB],
                      bench.CompareOptions(repeat=2, settle=False,
                                           reference=(("*", "cache-ssd"),)))
    assert order == [NONE, WB, "/dev/ubdb"] * 2
    assert all(s.readonly and s.rw == "randread" for s in ref_specs)
    doc = bench.to_json(c)
    assert doc["results"][1]["explanation"]["verdict"] == "ssd-no-faster"
    assert doc["results"][1]["reference"]["device"] == "/dev/ubdb"
    assert [r["label"] for r in doc["reference_runs"]] == ["/dev/ubdb"] * 2
    assert "--readonly" in doc["reference_runs"][0]["jobfile"]


def test_io_errors_reading_the_reference_fail_the_result(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An SSD that returns IO errors to the reference reads (captured: an EIO run) makes the
    command fail, and the table names the reference's flag."""
    from cachemgr.ops import bench as bench_ops

    doc = comparison_doc(SLOW_NONE, SLOW_WB, "error-eio.json")
    assert doc["reference_runs"][0]["error"] != 0
    assert "/dev/ubdb (cache SSD): ! IO errors in run(s) 1" in bench.table(doc)

    class C:
        def __init__(self) -> None:
            self.doc = doc

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(bench_ops.bench, "compare", lambda *a, **k: C())
    monkeypatch.setattr(bench_ops.bench, "to_json", lambda c: c.doc)
    monkeypatch.setattr(bench_ops, "_bench_subject",
                        lambda *a, **k: bench_ops.gate.Subject("the benchmark's targets", ()))
    res = bench_ops.compare(Sysfs(fx("bcache-writeback-dirty")), bench.JobSpec(),
                            [NONE, WB], bench.CompareOptions(), save=False)
    assert res.failed and not any(r["error"] for r in doc["runs"])


@pytest.mark.parametrize("mode,warmed", [(CacheMode.NONE, False), (CacheMode.WRITEBACK, True)])
def test_no_warm_up_in_mode_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 mode: CacheMode, warmed: bool) -> None:
    """The bare disk under a bcache device (/dev/bcache0:none, the usual baseline) caches
    nothing: its runs get no warm-up (it only cost time: 3x Che's time of reads), the cache's
    do."""
    from types import SimpleNamespace

    sysfs = Sysfs(copy_capture(tmp_path, "bcache-writeback-dirty"))
    kernel_writes(monkeypatch)
    warmups: list[str] = []
    monkeypatch.setattr(comparison, "run_fio",
                        lambda spec, t, **kw: warmups.append(t.label) or (None, ""))
    monkeypatch.setattr(comparison, "_run_sampled",
                        lambda *a, **k: (fio_of(SLOW_SSD), "jobfile", None))
    monkeypatch.setattr(comparison, "_sample_result", lambda *a: SimpleNamespace(
        kernel_counters_consistent=True, bypassed_bytes=4096, cache_available_percent_min=90,
        reads=0))
    hyg = bench.Hygiene(sysfs)
    t = _target(f"/dev/bcache0:{mode.value}", mode)
    opts = bench.CompareOptions(repeat=2, warmup=30, settle=False)
    runs = [comparison.run_one(sysfs, bench.JobSpec(rw="randread"), t, rep, opts, hyg)
            for rep in (1, 2)]
    hyg.restore()
    assert warmups == ([t.label] * 2 if warmed else [])
    assert any("no warm-up in mode none" in n for n in hyg.notes) is not warmed
    # each hygiene note once, though the warm-up's cutoff is set again for each run
    assert len(hyg.notes) == len(set(hyg.notes))
    assert sum("sequential_cutoff" in n and "->" in n for n in hyg.notes) == int(warmed)
    # what bcache bypassed is a flag of a cache; in mode none everything bypasses it
    assert all(any("bypassed 4096 bytes" in f for f in r.flags) is warmed for r in runs)
    # nor an expected hit ratio
    predicted = bench.predict_for(bench.JobSpec(rw="randread", size="64M"), sysfs, t)
    assert (predicted is not None) is warmed
