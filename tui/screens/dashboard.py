"""The dashboard: every cache as a tree, the selected device's trends, the action log."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tui.widgets.devices import DeviceTable
from tui.widgets.logpanel import LogPanel
from tui.widgets.trends import TrendPanel


class DashboardScreen(Screen[None]):
    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        yield Static("", id="banner", markup=False)
        yield DeviceTable(id="devices")
        with Horizontal(id="bottom"):
            yield Static("", id="summary", markup=False)
            yield TrendPanel(id="trends")
        yield LogPanel(clock=self.app.wallclock, id="log")  # type: ignore[attr-defined]
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(DeviceTable).focus()
        self.app.dashboard_mounted()  # type: ignore[attr-defined]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.app.select(str(event.row_key.value))  # type: ignore[attr-defined]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.select(str(event.row_key.value))  # type: ignore[attr-defined]
            self.app.action_detail()  # type: ignore[attr-defined]
