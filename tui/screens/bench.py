"""Benchmark a device or compare modes (cachemgr/ops/bench.py, fio), with progress and charts:
IOPS bars and latency percentiles in the terminal; PNG/SVG plots (cachemgr/procedures/plot.py) saved
next to the result JSON."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Checkbox, Footer, Header, Input, Label, RichLog, Static

from cachemgr.core import checks
from cachemgr.ops.control import Control, Result
from tui.safe import literal, plain

BAR = 36


def iops_bars(doc: Mapping[str, Any]) -> Text:
    res = doc.get("results", [])
    top = max((r.get("iops") or 0 for r in res), default=0) or 1
    t = Text("IOPS (median)\n", style="bold")
    for r in res:
        v = r.get("iops") or 0
        n = max(1 if v else 0, round(BAR * v / top))
        ratio = f"  {r['iops_ratio']:.1f}x" if r.get("iops_ratio") else ""
        t.append(f"{plain(str(r['label'])[:12]):<12} ")
        t.append("█" * n, style="green")
        t.append(f" {v:,.0f}{ratio}\n")
    return t


def latency_chart(doc: Mapping[str, Any]) -> Text:
    """Completion-latency percentiles per target on a log scale (µs)."""
    keys = (("p50", "lat_p50_us"), ("p90", "lat_p90_us"), ("p99", "lat_p99_us"),
            ("p99.9", "lat_p99_9_us"))
    vals = [r.get(k) for r in doc.get("results", []) for _, k in keys if r.get(k)]
    t = Text("completion latency, µs (log scale)\n", style="bold")
    if not vals:
        return t.append("no latency percentiles\n")
    lo, hi = math.log10(min(vals)), math.log10(max(vals))
    span = max(hi - lo, 1e-9)
    for r in doc.get("results", []):
        t.append(f"{plain(str(r['label'])[:12])}\n")
        for name, k in keys:
            v = r.get(k)
            if not v:
                continue
            n = 1 + round((BAR - 1) * (math.log10(v) - lo) / span)
            t.append(f"  {name:<6}")
            t.append("▇" * n, style="cyan")
            t.append(f" {v:,.1f}\n")
    return t


def result_view(doc: Mapping[str, Any], saved: list[str]) -> RenderableType:
    from cachemgr.ops import bench as bench_ops

    parts: list[RenderableType] = [literal(bench_ops.table(doc)), Text(""), iops_bars(doc),
                                   latency_chart(doc)]
    if saved:
        parts.append(literal("saved: " + "\n       ".join(saved), style="dim"))
    return Group(*parts)


def run_bench(sysfs: Any, values: dict[str, str], ctl: Control) -> Result:
    """``cachemgr bench compare`` from the form's words: the job is parsed here, run, saved
    and plotted by the command layer. Cancelling takes effect at the next run's progress
    report."""
    from cachemgr.ops import bench as bench_ops

    targets = values["targets"].split()
    # the CLI's checks and words: "--runtime must be a finite number greater than 0, not 'nan'"
    theta = checks.number(values["zipf"], "--zipf", above=0)
    spec = bench_ops.JobSpec(rw=values["rw"], bs=values["bs"],
                             iodepth=checks.count(values["iodepth"], "--iodepth"),
                             distribution=f"zipf:{theta:g}",
                             runtime=checks.seconds(values["runtime"], "--runtime"))
    opts = bench_ops.CompareOptions(repeat=checks.count(values["repeat"], "--repeat"),
                                    force=bool(values["force"]))
    res = bench_ops.compare(sysfs, spec, targets, opts, ctl=ctl,
                            argv=["cachemgr", "tui", "bench", *targets])
    assert res.data is not None
    saved = list(res.data.get("saved", []))
    return Result(lines=[f"bench {' '.join(targets)}: saved {saved[0]}"] if saved else [],
                  notes=res.notes, data={"doc": res.data, "saved": saved + res.notes})


class BenchScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "run", "Run", priority=True),
        Binding("ctrl+l", "load", "Last result", priority=True),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, device: str, is_bcache: bool = True) -> None:
        super().__init__()
        self.device = device
        self.is_bcache = is_bcache
        self.doc: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        targets = (f"wb={self.device}:writeback wt={self.device}:writethrough"
                   if self.is_bcache else self.device)
        yield Header(icon="≡")
        with VerticalScroll(id="bench-form"):
            with Horizontal(classes="row"):
                yield Label("targets")
                yield Input(targets, id="targets",
                            placeholder="[LABEL=]DEVICE[:MODE] ... (first = baseline)")
            with Horizontal(classes="row"):
                yield Label("rw")
                yield Input("randwrite", id="rw")
                yield Label("bs")
                yield Input("4k", id="bs")
                yield Label("QD")
                yield Input("1", id="iodepth")
            with Horizontal(classes="row"):
                yield Label("zipf")
                yield Input("1.2", id="zipf")
                yield Label("runtime s")
                yield Input("5", id="runtime")
                yield Label("repeat")
                yield Input("3", id="repeat")
            yield Checkbox("force: write even to a device that holds data (destroys it)",
                           id="force")
        yield RichLog(id="oplog", wrap=True, markup=False, max_lines=200)
        with VerticalScroll(id="bench-result"):
            yield Static("Ctrl+R runs the benchmark (fio); results and charts show here.",
                         id="result")
        yield Footer(compact=True, show_command_palette=False)

    def values(self) -> dict[str, str]:
        keys = ("targets", "rw", "bs", "iodepth", "zipf", "runtime", "repeat")
        out = {k: self.query_one(f"#{k}", Input).value.strip() for k in keys}
        out["force"] = "1" if self.query_one("#force", Checkbox).value else ""
        return out

    def action_run(self) -> None:
        try:
            import cachemgr.ops.bench  # noqa: F401
        except ImportError as exc:
            self.query_one("#result", Static).update(
                literal(f"the bench module is not available: {exc}"))
            return
        app: Any = self.app
        values = self.values()
        self.query_one("#oplog", RichLog).clear()

        def progress(line: object) -> None:
            app.call_from_thread(self.query_one("#oplog", RichLog).write, literal(line))

        def fn(ctl: Control) -> Result:
            inner = Control(progress=progress, cancel=ctl.cancel, what=ctl.what)
            return run_bench(app.sysfs, values, inner)

        def done(out: Result) -> None:
            self.doc = (out.data or {}).get("doc")
            if self.doc is not None:
                self.query_one("#result", Static).update(
                    result_view(self.doc, (out.data or {}).get("saved", [])))

        app.start_op(f"bench {values['targets']}", fn, on_done=done)

    def action_load(self) -> None:
        """Show the newest saved result, e.g. one run from the CLI."""
        from cachemgr.ops import bench as bench_ops

        found = bench_ops.latest()
        if found is None:
            self.notify(f"no saved result under {bench_ops.results_dir()}")
            return
        self.doc, path = found
        self.query_one("#result", Static).update(result_view(self.doc, [str(path)]))
