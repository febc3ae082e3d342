"""cachemgr's Textual app (first cut: a live dashboard of the snapshot).

All IO runs in a thread worker; a poll is re-armed only after the previous one finished;
results come back as messages (STYLE.md principle 10).
"""

from __future__ import annotations

import sys
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Static

from cachemgr import snapshot
from cachemgr.model import Snapshot, human
from cachemgr.sysfs import DEFAULT_ROOT, Sysfs


class SnapshotReady(Message):
    def __init__(self, snap: Snapshot) -> None:
        super().__init__()
        self.snap = snap


class CacheMgrApp(App[None]):
    TITLE = "cachemgr"
    BINDINGS: ClassVar[list[BindingType]] = [("q", "quit", "Quit"), ("r", "refresh", "Refresh")]

    def __init__(self, sysfs_root: str = DEFAULT_ROOT, interval: float = 1.0) -> None:
        super().__init__()
        self.sysfs = Sysfs(sysfs_root)
        self.interval = interval

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="devices", cursor_type="row")
        yield Static("", id="sets")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("device", "backing", "mode", "state", "dirty", "hit% total", "cache")
        self.poll()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def poll(self) -> None:
        self.post_message(SnapshotReady(snapshot.take(self.sysfs)))

    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for b in msg.snap.backings:
            total = b.stats.get("total")
            ratio = total.computed_hit_ratio if total else None
            table.add_row(
                b.device or "-", b.identity.node, str(b.mode or "-"), str(b.state),
                human(b.dirty.bytes) if b.dirty else "-",
                "-" if ratio is None else f"{100 * ratio:.1f}",
                (b.cset_uuid or "-")[:13], key=b.key,
            )
        sets = [f"cache set {c.uuid}: {', '.join(x.identity.node for x in c.caches)}, "
                f"{len(c.backing_names)} backing" for c in msg.snap.cache_sets]
        self.query_one("#sets", Static).update("\n".join(sets) or "no cache sets")
        self.set_timer(self.interval, self.poll)

    def action_refresh(self) -> None:
        self.poll()


def main() -> int:
    CacheMgrApp().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
