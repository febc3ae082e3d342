"""The device tree as a table: cache sets with their backing devices under them, then
backing devices on no set, then dm-cache devices. Rows are updated in place when the set of
devices did not change (cheap at 64+ devices), rebuilt when it did (hotplug)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from cachemgr.core.text import printable
from tui import view


def _fit(value: str, width: int, right: bool, *, keep_end: bool = False) -> str:
    """``value`` in ``width`` columns; cut with an ellipsis at the end, or (``keep_end``: a
    device name, whose meaningful part is its end) at the start."""
    if len(value) > width:
        value = "…" + value[len(value) - width + 1:] if keep_end else value[: width - 1] + "…"
    return value.rjust(width) if right else value.ljust(width)


# a cut name keeps its end: vg0/vm-data-7 is told from vg0/vm-data-6 by it
KEEP_END = {"device", "disk"}


class DeviceTable(DataTable[Text]):
    def __init__(self, **kw: object) -> None:
        # no cell padding: the cells carry their own one-space separator, so that ten
        # columns fit in 80
        super().__init__(cursor_type="row", zebra_stripes=False, cell_padding=0,
                         **kw)  # type: ignore[arg-type]
        self.keys: list[str] = []
        self.shown: dict[str, tuple[str, ...]] = {}
        self.view_rows: list[view.Row] = []
        self.widths: list[int] = [w for _, _, w, _ in view.COLUMNS]

    def on_mount(self) -> None:
        self._columns()

    def _columns(self) -> None:
        for (key, label, _, right), width in zip(view.COLUMNS, self.widths, strict=True):
            self.add_column(Text(_fit(label, width, right) + " "), key=key, width=width + 1)

    def on_resize(self) -> None:
        self._relayout()

    def _relayout(self) -> bool:
        """Widen (or narrow) the columns to the table's width; True when they changed (the
        table is rebuilt then)."""
        want = view.widths(self.view_rows, self.size.width)
        if want == self.widths or not self.size.width:
            return False
        self.widths = want
        selected = self.selected_key
        self.clear(columns=True)
        self._columns()
        self.keys = []
        self._rebuild(self.view_rows, selected)
        return True

    def _cells(self, r: view.Row) -> list[Text]:
        style = "bold red" if r.alert else ("bold" if r.kind == view.CSET else "")
        cells = [Text(_fit(printable(c), w, right, keep_end=key in KEEP_END) + " ",
                      style=style)
                 for c, (key, _, _, right), w in zip(r.cells(), view.COLUMNS, self.widths,
                                                     strict=True)]
        if r.state == "dirty" and not r.alert:
            cells[3].stylize("yellow")
        return cells

    def show(self, rows: list[view.Row]) -> None:
        self.view_rows = rows
        keys = [r.key for r in rows]
        if self._relayout():
            return
        if keys == self.keys:
            for r in rows:
                cells = (*r.cells(), str(r.alert))
                before = self.shown.get(r.key)
                if before == cells:
                    continue
                # only the cells that changed (each update_cell refreshes the table), all of
                # them when the row's alert style changed
                restyle = before is None or before[-1] != cells[-1]
                for i, ((ckey, *_), value) in enumerate(zip(view.COLUMNS, self._cells(r),
                                                            strict=True)):
                    if restyle or before is None or before[i] != cells[i]:
                        self.update_cell(r.key, ckey, value)
                self.shown[r.key] = cells
            return
        self._rebuild(rows, self.selected_key)

    def _rebuild(self, rows: list[view.Row], selected: str | None) -> None:
        self.clear()
        for r in rows:
            self.add_row(*self._cells(r), key=r.key)
            self.shown[r.key] = (*r.cells(), str(r.alert))
        keys = [r.key for r in rows]
        self.keys = keys
        if selected in keys:
            self.move_cursor(row=keys.index(selected), animate=False)
        elif selected is None and keys:
            # at first the first device, not the cache set above it
            first = next((i for i, r in enumerate(rows) if r.kind != view.CSET), 0)
            self.move_cursor(row=first, animate=False)

    @property
    def selected_key(self) -> str | None:
        if not self.keys or self.cursor_row < 0 or self.cursor_row >= len(self.keys):
            return None
        return self.keys[self.cursor_row]

    def select_key(self, key: str) -> None:
        if key in self.keys:
            self.move_cursor(row=self.keys.index(key), animate=False)
