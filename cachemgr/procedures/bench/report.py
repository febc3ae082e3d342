"""The result document and its text: :func:`to_json` (schema 1: medians per target, every
run, the job file, identities, hygiene), :func:`save` and :func:`load` under the results
directory, and :func:`table` for people."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cachemgr.core.errors import UsageError
from cachemgr.procedures.bench.comparison import Comparison, RunResult, TargetSummary
from cachemgr.procedures.bench.stats import Spread, ratio

SCHEMA = 1
DEFAULT_RESULTS_DIR = "/var/lib/cachemgr/bench"


# ----------------------------------------------------------------------------- JSON


def _spread_json(s: Spread | None, digits: int = 3) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"median": round(s.median, digits), "min": round(s.low, digits),
            "max": round(s.high, digits), "n": s.n, "rel_spread": round(s.rel_spread, 4)}


def _med(s: Spread | None, digits: int = 3) -> float | None:
    return round(s.median, digits) if s is not None else None


def summary_json(s: TargetSummary, base: TargetSummary | None) -> dict[str, Any]:
    return {
        "label": s.label,
        "device": s.device,
        "iops": _med(s.iops, 1),
        "bw_bytes": _med(s.bw_bytes, 0),
        "lat_mean_us": _med(s.lat_mean_us),
        "lat_p50_us": _med(s.lat_p50_us),
        "lat_p90_us": _med(s.lat_p90_us),
        "lat_p99_us": _med(s.lat_p99_us),
        "lat_p99_9_us": _med(s.lat_p99_9_us),
        "lat_p99_99_us": _med(s.lat_p99_99_us),
        "hit_ratio": _med(s.hit_ratio, 4),
        "expected_hit_ratio": round(s.expected_hit_ratio, 4)
        if s.expected_hit_ratio is not None else None,
        "bypassed_bytes": _med(s.bypassed_bytes, 0),
        "dirty_max_bytes": _med(s.dirty_max, 0),
        "iops_ratio": _r(ratio(s.iops.median, base.iops.median)) if base else None,
        "p99_ratio": _r(ratio(base.lat_p99_us.median if base and base.lat_p99_us else None,
                              s.lat_p99_us.median if s.lat_p99_us else None)) if base else None,
        "qd1_speedup": _r(s.speedup_measured),
        "qd1_speedup_ceiling": _r(s.speedup_ceiling),
        **reference_json(s),
        "spread": {"iops": _spread_json(s.iops, 1), "lat_p99_us": _spread_json(s.lat_p99_us),
                   "hit_ratio": _spread_json(s.hit_ratio, 4)},
        "prediction": {
            "model": "che-lru-zipf",
            "items": s.prediction.items,
            "cache_items": round(s.prediction.cache_items),
            "theta": s.prediction.theta,
            "hit_ratio": round(s.prediction.hit_ratio, 4),
            "characteristic_requests": round(s.prediction.characteristic_requests)
            if math.isfinite(s.prediction.characteristic_requests) else None,
        } if s.prediction else None,
        "flags": list(s.flags),
    }


def reference_json(s: TargetSummary) -> dict[str, Any]:
    """The bare reference device's figures in this target's result (``--reference``): its
    medians and this target's IOPS as a fraction of its IOPS (at QD1 on an SSD: how close a
    cache on that SSD comes to the SSD itself), its p99 over the reference's."""
    r = s.reference
    if r is None:
        return {"reference": None, "reference_iops_fraction": None,
                "reference_p99_ratio": None}
    return {
        "reference": {"label": r.label, "device": r.device, "iops": _med(r.iops, 1),
                      "lat_mean_us": _med(r.lat_mean_us), "lat_p50_us": _med(r.lat_p50_us),
                      "lat_p99_us": _med(r.lat_p99_us),
                      # measured apart (cache-ssd, a path): what it is and the job it ran
                      # (reads only); null for a reference that is a target (the same job)
                      "role": r.role, "rw": r.rw},
        "reference_iops_fraction": _r(ratio(s.iops.median, r.iops.median), 3),
        "reference_p99_ratio": _r(ratio(s.lat_p99_us.median if s.lat_p99_us else None,
                                        r.lat_p99_us.median if r.lat_p99_us else None), 3),
    }


def _r(v: float | None, digits: int = 2) -> float | None:
    return round(v, digits) if v is not None else None


def run_json(r: RunResult) -> dict[str, Any]:
    lat = r.fio.latency
    return {
        "label": r.label,
        "repetition": r.repetition,
        "seed": r.seed,
        "started": r.started,
        "iops": round(r.fio.iops, 2),
        "bw_bytes": round(r.fio.bw_bytes),
        "lat_mean_us": _r(r.fio.lat_mean_us, 3),
        "clat_percentiles_us": [[p, round(v, 3)] for p, v in lat.percentiles] if lat else [],
        "lat_p50_us": _r(lat.p50_us, 3) if lat else None,
        "lat_p99_us": _r(lat.p99_us, 3) if lat else None,
        "error": r.fio.error,
        "total_err": r.fio.total_err,
        "runtime_ms": r.fio.runtime_ms,
        "steadystate": asdict(r.fio.steadystate) if r.fio.steadystate else None,
        "fio": asdict(r.fio),
        "cache": asdict(r.cache) if r.cache else None,
        "hit_ratio": _r(r.cache.hit_ratio, 4) if r.cache else None,
        "warmup_s": r.warmup_s,
        "fresh_cache": r.fresh_cache,
        "jobfile": r.jobfile,
        "flags": list(r.flags),
    }


def to_json(c: Comparison) -> dict[str, Any]:
    """The saved and printed document: ``{"schema": 1, "results": [...], ...}``.

    ``results`` has one entry per target (medians over the repetitions) with at least
    label, iops, lat_p50_us, lat_p99_us, hit_ratio (null where unknown); ``runs`` has every
    repetition with fio's full numbers and the cache's counters.
    """
    base = c.summaries[0] if len(c.summaries) > 1 else None
    jobfile = c.runs[0].jobfile if c.runs else c.spec.jobfile("job", "DEVICE", seed=0)
    doc = {
        "schema": SCHEMA,
        "kind": "bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(c.created)),
        "argv": list(c.argv),
        "fio_version": c.fio_version,
        "kernel": c.kernel,
        "host": platform.node(),
        "job": asdict(c.spec),
        "job_description": c.spec.describe(),
        "jobfile": jobfile,
        "options": asdict(c.options),
        "targets": [{"label": t.label, "spec": t.spec, "device": t.device,
                     "mode": t.mode.value if t.mode else None,
                     "scheduler": t.scheduler,
                     "scheduler_disks": [f"/dev/{d}" for d in t.scheduler_disks],
                     "identity": c.identities.get(t.label)} for t in c.targets],
        "hygiene": list(c.hygiene),
        "results": [summary_json(s, base) for s in c.summaries],
        "runs": [run_json(r) for r in c.runs],
        # measured apart, read-only (--reference cache-ssd or a path), with their targets
        "references": [{**summary_json(r, None), "role": r.role, "rw": r.rw,
                        "of": list(c.reference_of.get(r.label, ()))} for r in c.references],
        "reference_runs": [run_json(r) for r in c.reference_runs],
    }
    with_explanations(doc)
    return doc


def with_explanations(doc: dict[str, Any]) -> dict[str, Any]:
    """Each result's ``explanation`` (explain.py: why a cache is no faster than the bare
    disk; null when it is faster, or is no cache), on a new document or a saved one."""
    from cachemgr.procedures.bench.explain import explanation

    for i, r in enumerate(doc.get("results") or []):
        if isinstance(r, dict):
            r["explanation"] = explanation(doc, i)
    return doc


def save(doc: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Write the document under ``out_dir`` as ``<time>-<job>.json`` (atomic)."""
    from cachemgr.core import state

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = doc.get("job", {})
    name = f"{stamp}-{job.get('rw', 'job')}-qd{job.get('iodepth', '')}"
    path = d / f"{name}.json"
    n = 1
    while path.exists():
        n += 1
        path = d / f"{name}-{n}.json"
    state.write_json(path, dict(doc))
    return path


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A saved result document; raises UsageError if it is not one (schema 1)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read a bench result: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or "results" not in doc:
        raise UsageError(f"{path}: not a cachemgr bench result (schema {SCHEMA})")
    return doc


# ----------------------------------------------------------------------------- text


def table(doc: Mapping[str, Any]) -> str:
    """The comparison as a table for people: medians, ratios to the first target."""
    rows = [("target", "IOPS", "x base", "p50 us", "p99 us", "p99.9 us", "p99 /", "hit",
             "expected", "flags")]
    for r in doc["results"]:
        rows.append((
            str(r["label"]),
            _fmt(r["iops"], 0),
            _fmt(r.get("iops_ratio"), 1, "x"),
            _fmt(r["lat_p50_us"], 1),
            _fmt(r["lat_p99_us"], 1),
            _fmt(r.get("lat_p99_9_us"), 1),
            _fmt(r.get("p99_ratio"), 1, "x"),
            _fmt(r["hit_ratio"], 3),
            _fmt(r.get("expected_hit_ratio"), 3),
            str(len(r.get("flags", []))) if r.get("flags") else "",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    out = [f"{doc.get('job_description', '')} (median of {doc['options']['repeat']} "
           f"interleaved runs; ratios against {doc['results'][0]['label']})", *lines]
    for r in doc["results"]:
        ref = r.get("reference")
        if ref and r.get("reference_iops_fraction") is not None:
            p99 = r.get("reference_p99_ratio")
            what = (f"the {ref['role']} {ref['device']}'s IOPS ({_fmt(ref['iops'], 0)}, "
                    f"{ref.get('rw') or 'the same job'}, measured apart)" if ref.get("role")
                    else f"{ref['label']}'s IOPS ({_fmt(ref['iops'], 0)}, the bare reference)")
            out.append(f"{r['label']}: {100 * r['reference_iops_fraction']:.0f}% of {what}"
                       + (f", p99 {p99:.2f}x its p99" if p99 is not None else ""))
        if r.get("qd1_speedup") is not None:
            ceil = r.get("qd1_speedup_ceiling")
            out.append(f"{r['label']}: QD1 speed-up {r['qd1_speedup']:.1f}x"
                       + (f" (ceiling {ceil:.1f}x by Little's law)" if ceil else ""))
        p = r.get("prediction")
        if p:
            steady = (f"steady after ~{p['characteristic_requests']:,} requests"
                      if p.get("characteristic_requests") else "the cache holds the region")
            out.append(f"{r['label']}: expected LRU hit ratio {p['hit_ratio']:.3f} (Che, Zipf "
                       f"{p['theta']:g}, {p['cache_items']:,} of {p['items']:,} blocks cached; "
                       f"{steady})")
        for f in r.get("flags", []):
            out.append(f"{r['label']}: ! {f}")
        why = r.get("explanation")
        if isinstance(why, dict) and why.get("text"):
            out.append(f"{r['label']}: why no faster: {why['text']}")
    for ref in doc.get("references", []):
        for f in ref.get("flags", []):
            out.append(f"{ref['device']} ({ref.get('role') or 'reference'}): ! {f}")
    for h in doc.get("hygiene", []):
        out.append(f"hygiene: {h}")
    return "\n".join(out)


def _fmt(v: Any, digits: int, suffix: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{suffix}"
