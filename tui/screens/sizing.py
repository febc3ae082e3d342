"""`z`: cache sizing from a recorded trace (`cachemgr trace`): the hit ratio against cache size
(cachemgr/ops/sizing.py), as a chart in the terminal, with the knee and the sizes asked for.
Reading a trace changes nothing, so the screen works in the read-only view too."""

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
from textual.widgets import Footer, Header, Input, Label, Static

from cachemgr.core.model import human
from cachemgr.ops.control import Control, Result
from tui.safe import literal

BAR = 40
ROWS = 14


def mrc_chart(doc: Mapping[str, Any]) -> Text:
    """Hit ratio at ~ROWS cache sizes, log-spaced from the smallest resolved size (or
    modelled one) to a little past the footprint; the knee and the asked-for sizes marked."""
    pts = [p for p in doc.get("curve", []) if p.get("hit_ratio") is not None]
    t = Text("hit ratio against cache size (LRU)\n", style="bold")
    if not pts:
        return t.append("no references in the trace\n")
    # a sample is read from what it resolves up, unless the reuse times model the sizes below
    resolved = 0 if doc.get("reuse_model_below_bytes") else doc.get("resolved_from_bytes") or 0
    lo = max(pts[0]["cache_bytes"], resolved)
    hi = max(pts[-1]["cache_bytes"], lo)
    sizes = sorted({round(lo * (hi / lo) ** (i / (ROWS - 1))) for i in range(ROWS)}
                   if hi > lo else {lo})
    knee = (doc.get("knee") or {}).get("cache_bytes")
    marks = {s["cache_bytes"] for s in doc.get("sizes") or []}
    rows = sorted(set(sizes) | marks | ({knee} if knee else set()))
    for size in rows:
        # the curve's value at ``size``: its last point not above it (the curve is a step)
        p = max((q for q in pts if q["cache_bytes"] <= size), key=lambda q: q["cache_bytes"],
                default=pts[0])
        h = p["hit_ratio"]
        n = round(BAR * h)
        t.append(f"{human(size):>10} ")
        t.append("█" * n, style="green" if size in marks else "cyan")
        t.append(" " * (BAR - n) + f" {h:.3f}")
        if size == knee:
            t.append("  ◀ knee", style="bold")
        if size in marks:
            t.append("  ◀ asked", style="bold")
        t.append("\n")
    if not math.isclose(lo, pts[0]["cache_bytes"]):
        t.append(f"(a sample at rate {doc.get('rate')} is read from {human(lo)} up)\n",
                 style="dim")
    return t


def result_view(res: Result) -> RenderableType:
    parts: list[RenderableType] = [literal("\n".join(res.lines)), Text("")]
    if res.data is not None:
        parts.append(mrc_chart(res.data))
    for n in res.notes:
        parts.append(literal(n, style="yellow"))
    return Group(*parts)


class SizingScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "run", "Compute", priority=True),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, path: str = "") -> None:
        super().__init__()
        self.path = path
        self.result: Result | None = None

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with VerticalScroll(id="sizing-form"):
            with Horizontal(classes="row"):
                yield Label("trace")
                yield Input(self.path, id="trace", placeholder="a file from `cachemgr trace`")
            with Horizontal(classes="row"):
                yield Label("sizes")
                yield Input("", id="sizes", placeholder="cache sizes to price, e.g. 64G,256G")
        with VerticalScroll(id="sizing-result"):
            yield Static("Ctrl+R reads the trace and draws its curve here. Record one with "
                         "`cachemgr trace DEVICE... -o FILE` (admin guide: \"Sizing a cache "
                         "from the host's own IO\").", id="result", markup=False)
        yield Footer(compact=True, show_command_palette=False)

    def action_run(self) -> None:
        from cachemgr.ops import sizing as sizing_ops

        path = self.query_one("#trace", Input).value.strip()
        text = self.query_one("#sizes", Input).value.strip()
        app: Any = self.app

        def fn(ctl: Control) -> Result:
            return sizing_ops.analyse(path, sizes=sizing_ops.parse_sizes(text) if text else [])

        def done(out: Result) -> None:
            self.result = out
            self.query_one("#result", Static).update(result_view(out))

        app.start_op(f"size {path}", fn, cancellable=False, on_done=done)
