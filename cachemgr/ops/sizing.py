"""Cache sizing, for every face: record the host's block requests, and the miss-ratio curve
(hit ratio against cache size) computed from them. The work is in procedures/trace.py
(blktrace, SHARDS sampling, the trace file) and procedures/sizing.py (reuse distances)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cachemgr.core.defaults import SIZING_DEFAULT_RATE
from cachemgr.core.errors import UsageError
from cachemgr.core.model import human
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import sizing
from cachemgr.procedures import trace as tr

DEFAULT_RATE = SIZING_DEFAULT_RATE
COUNT_TABLE = tr.COUNT_TABLE  # blocks the recorder counts at most


def parse_sizes(text: str) -> list[int]:
    """``32M,16G``: cache sizes in bytes, for every face (UsageError for a bad one)."""
    from cachemgr.core.model import parse_size

    out = []
    for part in text.split(","):
        n = parse_size(part.strip())
        if n <= 0:
            raise UsageError(f"a cache size is more than 0, not {part.strip()!r}")
        out.append(n)
    return out


def record(sysfs: Sysfs, devices: Sequence[str], out: str, *, seconds: float | None,
           rate: float = DEFAULT_RATE, block: int = 4096, ctl: Control | None = None,
           force: bool = False) -> Result:
    """``cachemgr trace``: record ``devices`` into ``out`` (Ctrl-C ends it cleanly)."""
    ctl = ctl or Control(what="trace")
    tr.threshold(rate)
    if os.path.isdir(out):
        raise UsageError(f"{out} is a directory", hint="name the trace file, e.g. -o host.trace")
    if os.path.exists(out) and not force:
        raise UsageError(f"{out} exists", hint="name a new file, or --force to replace it")
    rec = tr.record(sysfs, devices, out, seconds=seconds, rate=rate, block=block,
                    progress=ctl.report)
    t = rec.trailer
    n = sum(t["requests"].values())
    size = Path(out).stat().st_size
    lines = [
        f"trace {out}: {human(size)}, {rec.records:,} of {n:,} requests kept "
        f"(rate {rate:g}, {block}-byte blocks), {t['seconds']:.1f} s, ended by {t['ended_by']}",
        f"  reads {t['requests']['read']:,}, writes {t['requests']['write']:,}, discards "
        f"{t['requests']['discard']:,}; recorder CPU {t['recorder_cpu_seconds']:.1f} s",
        f"next: cachemgr size --trace {out}",
    ]
    doc = {"schema": 1, "path": out, "bytes": size, "records": rec.records,
           "header": rec.header.to_json(), "trailer": t}
    return Result(lines=lines, data=doc, value=rec)


def load(path: str) -> tr.Trace:
    return tr.read(path)


def analyse(path: str, *, rate: float | None = None, block: int | None = None,
            sizes: Sequence[int] = (), hdd_ms: float | None = None, ssd_ms: float | None = None,
            device: str | None = None) -> Result:
    """``cachemgr size``: the miss-ratio curve of a trace and what given sizes would buy."""
    trace = tr.read(path)
    devices = None
    if device is not None:
        hit = [d.index for d in trace.header.named(device)]
        if not hit:
            names = ", ".join(d.path for d in trace.header.devices)
            raise UsageError(f"the trace has no device {device!r}", hint=f"it has {names}")
        devices = hit
    doc = sizing.analyse(trace, rate=rate, block=block, sizes=sizes, hdd_ms=hdd_ms,
                         ssd_ms=ssd_ms, devices=devices)
    return Result(lines=summary(doc), notes=list(doc["notes"]), data=doc)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.3f}"


def _counted(strata: dict[str, Any]) -> str:
    who = "the recorder's" if strata["from"] == "recorder" else "the trace's own"
    rate = strata["rate"]
    return (f"{who} counts of every block" if rate >= 1
            else f"{who} counts of 1 block in {1 / rate:.3g}")


def summary(doc: dict[str, Any]) -> list[str]:
    t = doc["trace"]
    refs = doc["references"]
    devs = ", ".join(d["path"] for d in t["devices"])
    lines = [f"trace of {devs}: {t['seconds'] or '?'} s, rate {doc['rate']:g}, "
             f"{refs['read']:,} read and {refs['write']:,} write block references "
             f"({refs['sampled']:,} sampled), {doc['block']}-byte blocks",
             *([f"sample weighed to {_counted(st)}, {st['classes']} frequency classes"]
               if (st := doc.get("strata")) else []),
             f"footprint (every reuse hits): {human(doc['footprint_bytes'])}, "
             f"hit ratio there {_pct(doc['max_hit_ratio'])}"]
    k = doc["knee"]
    if k:
        lines.append(f"knee of the curve: {human(k['cache_bytes'])} (hit ratio "
                     f"{_pct(k['hit_ratio'])})")
    sf = doc["size_for"]
    lines.append("size for 90% / 95% / 99% of the most the cache can hit: " + " / ".join(
        human(sf[p]) if sf[p] else "?" for p in ("90%", "95%", "99%")))
    m = doc["model"]
    sampled = doc["rate"] < 1
    if doc["sizes"]:
        lines.append("")
        lines.append(f"{'cache':>10} {'hit':>6} {'read':>6} "
                     + (f"{'±read':>6} " if sampled else "")
                     + f"{'write':>6} {'read lat':>9} "
                     f"{'gain':>6}  (disk read {m['hdd_read_ms'] or '?'} ms, SSD "
                     f"{m['ssd_ms']} ms, recorded QD {m['queue_depth'] or '?'})")
        for s in doc["sizes"]:
            lat = s.get("read_latency_ms")
            gain = s.get("read_iops_gain")
            se = s.get("read_hit_ratio_se")
            pm = (f"{2 * se:>6.3f} " if se is not None else f"{'?':>6} ") if sampled else ""
            lines.append(f"{human(s['cache_bytes']):>10} {_pct(s['hit_ratio']):>6} "
                         f"{_pct(s['read_hit_ratio']):>6} {pm}{_pct(s['write_hit_ratio']):>6} "
                         f"{(f'{lat:.3f} ms' if lat is not None else '?'):>9} "
                         f"{(f'{gain:.1f}x' if gain is not None else '?'):>6}")
    if doc["sizes"] and sampled:
        lines.append("±read: two standard errors of the sampled read hit ratio (a "
                     "jackknife over the sampled blocks)")
    return lines


def plot(doc: dict[str, Any], out: str) -> list[str]:
    from cachemgr.procedures import plot as plots

    return [str(p) for p in plots.write_mrc(doc, Path(out))]
