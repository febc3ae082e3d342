"""Benchmark a device or compare modes (cachemgr/ops/bench.py, fio), with progress and charts:
IOPS bars and latency percentiles in the terminal, every target labelled apart
(``/dev/bcache0 (none)``, ``/dev/bcache0 (writeback)``; a reference measured apart beside
them); why a cache is no faster than the bare disk; PNG/SVG plots
(cachemgr/procedures/plot.py) saved next to the result JSON."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
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
# the widest label column of the charts (a longer label is shortened in its middle); the
# IOPS bars give up the width a label takes beyond 24 (down to 24: label, bar and figures
# fit 80 columns)
LABEL_MAX = 32
_SPEC = re.compile(r"(?P<dev>/[^:@]*)(?::(?P<mode>[a-z]+))?(?:@(?P<sched>[a-z-]+))?")


def _pretty(label: str, target: Mapping[str, Any] | None) -> str:
    """A target's chart label: one given by its spec (``/dev/bcache0:writeback@bfq``) as
    ``/dev/bcache0 (writeback @bfq)``; one the user gave (``wb=...``) as it is."""
    if target is not None and target.get("spec") == label and target.get("device"):
        dev, mode, sch = str(target["device"]), target.get("mode"), target.get("scheduler")
    else:
        m = _SPEC.fullmatch(label)
        if m is None:
            return label
        dev, mode, sch = m["dev"], m["mode"], m["sched"]
    parts = [str(mode)] if mode else []
    parts += [f"@{sch}"] if sch else []
    return f"{dev} ({' '.join(parts)})" if parts else dev


def _shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut in the middle of its device part so that
    what tells targets apart (the end: ``(writeback)``, ``sdc``) stays."""
    if len(text) <= width:
        return text
    head, sep, tail = text.partition(" (")
    tail = sep + tail
    room = width - len(tail) - 1
    if room < 4:  # the suffix alone is too long: cut the whole in its middle
        half = (width - 1) // 2
        return text[:half] + "…" + text[len(text) - (width - 1 - half):]
    keep = room // 2
    return head[:keep] + "…" + head[len(head) - (room - keep):] + tail


def chart_labels(doc: Mapping[str, Any]) -> list[str]:
    """The charts' labels of the results, then of the references measured apart: each target
    apart (the mode and IO scheduler a spec names, which a cut to 12 characters lost:
    ``/dev/bcache0`` twice), at most :data:`LABEL_MAX` wide while that keeps them apart."""
    targets = [t for t in doc.get("targets") or [] if isinstance(t, Mapping)]
    by_label = {str(t.get("label")): t for t in targets}
    full = [_pretty(str(r.get("label")), by_label.get(str(r.get("label"))))
            for r in doc.get("results") or []]
    full += [f"{r.get('device')} ({r.get('role') or 'reference'}, "
             f"{'reads' if r.get('rw') in ('randread', 'read') else r.get('rw')})"
             for r in doc.get("references") or []]
    width = min(max((len(x) for x in full), default=0), LABEL_MAX)
    while True:
        short = [_shorten(x, width) for x in full]
        if len(set(short)) == len(short) or width >= max(len(x) for x in full):
            break
        width += 1
    seen: dict[str, int] = {}
    out = []
    for x in short:  # equal labels (a user's "wb" twice cannot be): numbered
        seen[x] = seen.get(x, 0) + 1
        out.append(x if seen[x] == 1 else f"{x} #{seen[x]}")
    return out


def _rows(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], bool]]:
    """(chart label, figures, measured apart) of every result, then every reference."""
    res = [r for r in doc.get("results") or [] if isinstance(r, Mapping)]
    refs = [r for r in doc.get("references") or [] if isinstance(r, Mapping)]
    labels = chart_labels({**doc, "results": res, "references": refs})
    return [(lab, r, i >= len(res)) for i, (lab, r) in enumerate(zip(labels, [*res, *refs],
                                                                      strict=True))]


def iops_bars(doc: Mapping[str, Any]) -> Text:
    rows = _rows(doc)
    top = max((r.get("iops") or 0 for _, r, _ in rows), default=0) or 1
    width = max((len(lab) for lab, _, _ in rows), default=0)
    bar = max(24, BAR - max(0, width - 24))
    t = Text("IOPS (median)\n", style="bold")
    for lab, r, apart in rows:
        v = r.get("iops") or 0
        n = max(1 if v else 0, round(bar * v / top))
        ratio = f"  {r['iops_ratio']:.1f}x" if r.get("iops_ratio") else ""
        t.append(f"{plain(lab):<{width}} ")
        t.append("█" * n, style="yellow" if apart else "green")
        t.append(f" {v:,.0f}{ratio}\n")
    return t


def latency_chart(doc: Mapping[str, Any]) -> Text:
    """Completion-latency percentiles per target on a log scale (µs)."""
    keys = (("p50", "lat_p50_us"), ("p90", "lat_p90_us"), ("p99", "lat_p99_us"),
            ("p99.9", "lat_p99_9_us"))
    rows = _rows(doc)
    vals = [float(r[k]) for _, r, _ in rows for _, k in keys if r.get(k)]
    t = Text("completion latency, µs (log scale)\n", style="bold")
    if not vals:
        return t.append("no latency percentiles\n")
    lo, hi = math.log10(min(vals)), math.log10(max(vals))
    span = max(hi - lo, 1e-9)
    for lab, r, apart in rows:
        t.append(f"{plain(lab)}\n")
        for name, k in keys:
            v = r.get(k)
            if not v:
                continue
            n = 1 + round((BAR - 1) * (math.log10(v) - lo) / span)
            t.append(f"  {name:<6}")
            t.append("▇" * n, style="yellow" if apart else "cyan")
            t.append(f" {v:,.1f}\n")
    return t


WHY = ": why no faster: "


def explanations(doc: Mapping[str, Any]) -> Text:
    """Why each cache that gained nothing did not (the result's ``explanation``), set apart
    from the table: the first thing to read when a cache is no faster than the bare disk."""
    labels = chart_labels(doc)
    t = Text()
    for lab, r in zip(labels, doc.get("results") or [], strict=False):
        why = r.get("explanation") if isinstance(r, Mapping) else None
        if isinstance(why, Mapping) and why.get("text"):
            t.append(f"{plain(lab)}: no faster than the bare disk\n", style="bold yellow")
            t.append(f"  {plain(why['text'])}\n", style="yellow")
    return t


def result_view(doc: Mapping[str, Any], saved: Sequence[str]) -> RenderableType:
    from cachemgr.ops import bench as bench_ops

    table = "\n".join(line for line in bench_ops.table(doc).splitlines() if WHY not in line)
    parts: list[RenderableType] = [literal(table), Text("")]
    why = explanations(doc)
    if why.plain:
        parts += [why, Text("")]
    parts += [iops_bars(doc), latency_chart(doc)]
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
                                    force=bool(values["force"]),
                                    reference=(("*", bench_ops.CACHE_SSD),)
                                    if values.get("reference") else ())
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
        # a bcache device: the bare disk under it (mode none, the baseline) and its cache
        targets = (f"{self.device}:none {self.device}:writeback"
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
            yield Checkbox("reference: read each cache's own SSD too, to tell whether it is "
                           "faster than the disk (--reference cache-ssd)", id="reference")
        yield RichLog(id="oplog", wrap=True, markup=False, max_lines=200)
        with VerticalScroll(id="bench-result"):
            yield Static("Ctrl+R runs the benchmark (fio); results and charts show here.",
                         id="result")
        yield Footer(compact=True, show_command_palette=False)

    def values(self) -> dict[str, str]:
        keys = ("targets", "rw", "bs", "iodepth", "zipf", "runtime", "repeat")
        out = {k: self.query_one(f"#{k}", Input).value.strip() for k in keys}
        out["force"] = "1" if self.query_one("#force", Checkbox).value else ""
        out["reference"] = "1" if self.query_one("#reference", Checkbox).value else ""
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
