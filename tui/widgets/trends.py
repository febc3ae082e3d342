"""Sparklines of the selected device: hit ratio, dirty data, IOPS and the bytes written
back per second (measured between polls: procedures/traffic.py; never bcache's
writeback_rate setting, which the detail view shows by its name) over the last minutes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from cachemgr.core.model import human
from tui.history import History

TRENDS = (("hit", "hit"), ("dirty", "dirty"), ("iops", "IOPS"), ("wb", "WB/s"))


class TrendPanel(Vertical):
    """Four labelled sparklines; ``n`` samples (the width of the panel)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.shown: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        for key, label in TRENDS:
            with Horizontal(classes="trend"):
                yield Label(label, classes="trend-label")
                yield Sparkline([], id=f"spark-{key}", classes="trend-spark")
                yield Label("-", id=f"now-{key}", classes="trend-now")

    def show(self, history: History, key: str | None, n: int = 120) -> None:
        last = history.last(key) if key else None
        for what, _ in TRENDS:
            data = history.series(key, what, n) if key else []
            spark = self.query_one(f"#spark-{what}", Sparkline)
            spark.data = data if len(data) >= 2 else []
            now = self.query_one(f"#now-{what}", Label)
            v = getattr(last, what) if last else None
            if v is None:
                text = "-"
            elif what == "hit":
                text = f"{100 * v:.0f}%"
            elif what == "dirty":
                text = human(int(v))
            elif what == "wb":
                text = f"{human(round(v))}/s"
            else:
                text = f"{v:.0f}/s"
            if self.shown.get(what) != text:  # the same text: no update, no layout
                now.update(text)
                self.shown[what] = text
