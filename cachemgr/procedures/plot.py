"""Pictures of saved bench results: a latency-percentile plot and an IOPS comparison chart.

Drawn with matplotlib (the one plotting dependency: wheels for every platform, no system
libraries, the Agg backend needs no display, and it writes PNG and SVG itself). Everything is
drawn from the saved JSON document (``bench.to_json``), never from live objects, so a result
can be re-plotted anywhere; the TUI can call :func:`latency_figure` / :func:`iops_figure` or
show the written files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cachemgr.core.errors import CacheMgrError

_missing: ImportError | None = None
try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display in the lab, on servers or in CI

    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter
except ImportError as exc:
    _missing = exc


class PlotsUnavailable(CacheMgrError, ImportError):
    """matplotlib is not installed: it is an extra (``cachemgr[plots]``), about two thirds of
    an installation's size, needed only here. An ImportError too, so a caller for whom plots
    are optional (ops.bench) can carry on without them."""


if _missing is not None:
    raise PlotsUnavailable(f"plots need matplotlib, which is not installed ({_missing})",
                           hint="install cachemgr's 'plots' extra (matplotlib) into its "
                                "environment, or the distribution's python3-matplotlib"
                           ) from _missing

FORMATS = ("png", "svg")


def _median_run(doc: Mapping[str, Any], label: str) -> Mapping[str, Any] | None:
    """The repetition of ``label`` whose p99 is the median one (a real curve, not a blend)."""
    runs = [r for r in doc.get("runs", []) if r.get("label") == label
            and r.get("clat_percentiles_us")]
    if not runs:
        return None
    runs.sort(key=lambda r: r.get("lat_p99_us") or 0.0)
    chosen: Mapping[str, Any] = runs[(len(runs) - 1) // 2]
    return chosen


def _nines(p: float) -> float:
    """Percentile -> "nines" axis position: 90 -> 1, 99 -> 2, 99.9 -> 3."""
    import math

    return -math.log10(max(1e-9, 1 - p / 100))


def latency_figure(doc: Mapping[str, Any]) -> Figure:
    """Completion-latency percentiles per target (the median repetition), log latency over a
    "nines" axis so the tail (p99, p99.9, p99.99) gets the room it deserves."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    ticks: set[float] = set()
    for res in doc["results"]:
        run = _median_run(doc, res["label"])
        if run is None:
            continue
        pts = [(float(p), float(v)) for p, v in run["clat_percentiles_us"] if v > 0]
        xs = [_nines(p) for p, _ in pts]
        ax.plot(xs, [v for _, v in pts], marker="o", markersize=3, label=res["label"])
        ticks.update(p for p, _ in pts if p in (50.0, 90.0, 99.0, 99.9, 99.99))
    ax.set_yscale("log")
    tick_ps = sorted(ticks) or [50.0, 90.0, 99.0, 99.9, 99.99]
    ax.xaxis.set_major_locator(FixedLocator([_nines(p) for p in tick_ps]))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _pos: next((f"p{p:g}" for p in tick_ps if abs(_nines(p) - x) < 1e-6), "")))
    ax.set_xlabel("completion latency percentile")
    ax.set_ylabel("latency (µs, log scale)")
    ax.set_title(_title(doc, "latency percentiles"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def iops_figure(doc: Mapping[str, Any]) -> Figure:
    """Median IOPS per target with the min-max range of the repetitions, and the ratio to the
    first target written on each bar."""
    results: Sequence[Mapping[str, Any]] = doc["results"]
    labels = [r["label"] for r in results]
    med = [float(r["iops"] or 0) for r in results]
    lo, hi = [], []
    for r, m in zip(results, med, strict=True):
        s = (r.get("spread") or {}).get("iops") or {}
        lo.append(max(0.0, m - float(s.get("min", m))))
        hi.append(max(0.0, float(s.get("max", m)) - m))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(labels) + 2), 5), dpi=100)
    bars = ax.bar(labels, med, yerr=[lo, hi], capsize=6, color="tab:blue", alpha=0.85)
    ax.set_yscale("log" if min(med) > 0 and max(med) / max(min(med), 1e-9) > 20 else "linear")
    for bar, r, up in zip(bars, results, hi, strict=True):
        ratio = r.get("iops_ratio")
        text = f"{r['iops']:,.0f}" + (f"\n{ratio:.1f}x" if ratio is not None else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height() + up),
                    ha="center", va="bottom", fontsize=9, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_ylabel("IOPS (median; bars: min-max of the runs)")
    ax.set_title(_title(doc, "IOPS"))
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def _title(doc: Mapping[str, Any], what: str) -> str:
    job = doc.get("job_description") or ""
    n = (doc.get("options") or {}).get("repeat")
    return f"{what}: {job}" + (f" ({n} runs each)" if n else "")


def write_plots(doc: Mapping[str, Any], out_dir: str | Path, *, stem: str = "bench"
                ) -> list[Path]:
    """Write ``<stem>-latency.{png,svg}`` and ``<stem>-iops.{png,svg}``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in (("latency", latency_figure), ("iops", iops_figure)):
        fig = make(doc)
        try:
            for fmt in FORMATS:
                p = out / f"{stem}-{name}.{fmt}"
                fig.savefig(p, format=fmt)
                paths.append(p)
        finally:
            plt.close(fig)
    return paths


def mrc_figure(doc: Mapping[str, Any]) -> Figure:
    """The miss-ratio curve of ``cachemgr size --json``: hit ratio against cache size."""
    pts = [p for p in doc["curve"] if p["hit_ratio"] is not None]
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    xs = [p["cache_bytes"] / 2**20 for p in pts]
    ax.plot(xs, [p["hit_ratio"] for p in pts], label="all requests", color="black")
    for key, label, color in (("read_hit_ratio", "reads", "tab:blue"),
                              ("write_hit_ratio", "writes", "tab:orange")):
        ys = [p[key] for p in pts]
        if any(y is not None for y in ys):
            ax.plot(xs, [float("nan") if y is None else y for y in ys], label=label,
                    color=color, linewidth=1)
    k = doc.get("knee")
    if k:
        ax.axvline(k["cache_bytes"] / 2**20, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"knee {k['cache_bytes'] / 2**20:.0f} MiB", (k["cache_bytes"] / 2**20, 0.02),
                    color="grey", fontsize=8)
    for s in doc.get("sizes") or []:
        if s["hit_ratio"] is not None:
            ax.plot([s["cache_bytes"] / 2**20], [s["hit_ratio"]], "o", color="tab:red")
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("cache size (MiB, log scale)")
    ax.set_ylabel("hit ratio (LRU)")
    devs = ", ".join(d["path"] for d in doc["trace"]["devices"])
    ax.set_title(f"Hit ratio against cache size: {devs} (sampling rate {doc['rate']:g})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def write_mrc(doc: Mapping[str, Any], out: Path) -> list[Path]:
    """``out`` with a .png or .svg suffix: that file; otherwise ``out``.png and ``out``.svg."""
    fig = mrc_figure(doc)
    try:
        paths = [out] if out.suffix in (".png", ".svg") else [
            out.with_name(out.name + f".{fmt}") for fmt in FORMATS]
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(p, format=p.suffix[1:])
    finally:
        plt.close(fig)
    return paths
