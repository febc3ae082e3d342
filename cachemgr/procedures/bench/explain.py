"""Why a cache is no faster than the bare disk: when a cache target's speed-up over the first
target (the baseline, the bare disk) is near or under 1x, its result says what may hold it
back, first of all whether the SSD under it is any faster than the disk (a cache cannot beat
its SSD: ``--reference cache-ssd`` measures the SSD itself), then what the run showed (the
mode, the hit ratio, bcache's bypass, a filling cache).

Works on a result document (``report.to_json``, or a saved one), so every face (the table,
``--json``, the TUI's bench screen) reads the same words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cachemgr.procedures.bench.reference import CACHE_SSD
from cachemgr.procedures.bench.stats import ratio

# A speed-up below this is "no faster": on random IO at QD1 a cache on an SSD gains 10-100x
# over an HDD (docs/benchmarks.md); 1.25x is within what a busy host moves a figure by.
NO_GAIN = 1.25
# below this read hit ratio most reads miss the cache
LOW_HIT = 0.5
_WRITE_RW = ("randwrite", "write")
_CACHING = ("writeback", "writethrough", "writearound")


def us(v: float | None) -> str:
    """A latency for people: ``850 us``, ``8.2 ms``."""
    if v is None:
        return "?"
    return f"{v:,.0f} us" if v < 1000 else f"{v / 1000:,.1f} ms"


def _times(v: float | None) -> str:
    return "?x" if v is None else f"{v:,.0f}x" if v >= 10 else f"{v:.1f}x"


def _iops(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def target_mode(doc: Mapping[str, Any], i: int) -> tuple[str | None, bool]:
    """Target ``i``'s cache mode during its runs (asked, else the one it had) and whether it
    has a cache attached (a bcache device over a cache set)."""
    targets = doc.get("targets") or []
    t: Mapping[str, Any] = targets[i] if i < len(targets) and isinstance(targets[i],
                                                                      Mapping) else {}
    got = t.get("identity")
    ident: Mapping[str, Any] = got if isinstance(got, Mapping) else {}
    mode = t.get("mode") or ident.get("mode_before")
    return (str(mode) if mode else None), bool(ident.get("cache_set"))


def explanation(doc: Mapping[str, Any], i: int) -> dict[str, Any] | None:
    """For result ``i``: None unless it is a cache target (a bcache device in a caching mode
    with a cache attached, or a target given a reference) other than the baseline whose
    speed-up (by QD1 mean latency, else by IOPS) is under :data:`NO_GAIN`. Else::

        {"speedup": 0.92, "by": "QD1 mean latency",
         "verdict": "ssd-no-faster" | "ssd-faster" | "ssd-unmeasured",
         "ssd": {"label", "device", "role", "rw", "iops", "lat_p99_us",
                 "iops_over_baseline"} | null,
         "reasons": ["..."], "text": "..."}

    ``ssd`` is the result's reference (``--reference``); its verdict compares the SSD's IOPS
    with the baseline's (the bare disk's, same block size and queue depth)."""
    results = doc.get("results") or []
    if i <= 0 or i >= len(results):
        return None
    r, base = results[i], results[0]
    if r.get("qd1_speedup") is not None:
        speedup, by = float(r["qd1_speedup"]), "QD1 mean latency"
    elif r.get("iops_ratio") is not None:
        speedup, by = float(r["iops_ratio"]), "IOPS"
    else:
        return None
    if speedup >= NO_GAIN:
        return None
    mode, attached = target_mode(doc, i)
    ref = r.get("reference") if isinstance(r.get("reference"), Mapping) else None
    if not ((attached and mode in _CACHING) or ref is not None):
        return None
    got = doc.get("job")
    job: Mapping[str, Any] = got if isinstance(got, Mapping) else {}
    rw = str(job.get("rw") or "")
    qd = job.get("iodepth")
    base_label = str(base.get("label"))
    ssd = None
    if ref is not None:
        gain = ratio(ref.get("iops"), base.get("iops"))
        ssd = {"label": ref.get("label"), "device": ref.get("device"),
               "role": ref.get("role"), "rw": ref.get("rw") or rw,
               "iops": ref.get("iops"), "lat_p99_us": ref.get("lat_p99_us"),
               "iops_over_baseline": round(gain, 2) if gain is not None else None}
        verdict = "ssd-no-faster" if gain is not None and gain < NO_GAIN else "ssd-faster"
    else:
        verdict = "ssd-unmeasured"
    reasons = _reasons(r, mode, rw)
    what = f"{ref.get('role') or 'the reference'} {ref.get('device')}" if ref else ""
    job_words = f"{ssd['rw']} QD{qd}" if ssd and qd else (ssd["rw"] if ssd else "")
    if verdict == "ssd-no-faster":
        assert ref is not None and ssd is not None
        head = (f"the {what} itself does {_iops(ref.get('iops'))} IOPS at p99 "
                f"{us(ref.get('lat_p99_us'))} ({job_words}), the bare {base_label} "
                f"{_iops(base.get('iops'))} IOPS at p99 {us(base.get('lat_p99_us'))}: no "
                "faster than the backing disk; a cache cannot beat its SSD")
    elif verdict == "ssd-faster":
        assert ref is not None and ssd is not None
        head = (f"the {what} itself does {_iops(ref.get('iops'))} IOPS at p99 "
                f"{us(ref.get('lat_p99_us'))} ({job_words}), "
                f"{_times(ssd['iops_over_baseline'])} the bare {base_label}'s: the SSD is not what "
                "holds the cache back"
                + ("" if reasons else "; look at the hit ratio, the mode and what bcache "
                   "bypassed (cachemgr status)"))
    else:
        head = (f"the cache SSD was not measured: --reference {CACHE_SSD} measures it (a short "
                "read-only fio run) to tell whether it is any faster than the backing disk "
                "(a cache cannot beat its SSD)")
    text = f"speed-up {speedup:.2f}x ({by}): " + "; ".join([head, *reasons])
    return {"speedup": round(speedup, 2), "by": by, "verdict": verdict, "ssd": ssd,
            "reasons": reasons, "text": text}


def _reasons(r: Mapping[str, Any], mode: str | None, rw: str) -> list[str]:
    """What the run itself showed that keeps a cache from gaining."""
    out = []
    if mode == "writethrough" and rw in _WRITE_RW:
        out.append("in writethrough every write also waits for the backing disk: a write "
                   "job cannot gain (writeback absorbs writes)")
    elif mode == "writearound" and rw in _WRITE_RW:
        out.append("in writearound writes go around the cache to the backing disk")
    hit = r.get("hit_ratio")
    if isinstance(hit, (int, float)) and hit < LOW_HIT:
        exp = r.get("expected_hit_ratio")
        out.append(f"read hit ratio {hit:.2f}"
                   + (f" (expected {exp:.2f})" if isinstance(exp, (int, float)) else "")
                   + ": most reads miss the cache (a cold cache: --warmup auto)")
    by = r.get("bypassed_bytes")
    if isinstance(by, (int, float)) and by > 0:
        out.append(f"bcache bypassed {by:,.0f} bytes of requests (sequential_cutoff, a "
                   "congested or full cache)")
    for f in r.get("flags") or []:
        if "cache_available_percent fell" in str(f):
            out.append(str(f).split(": ", 1)[-1])
            break
    return out
