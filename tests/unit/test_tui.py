from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import DataTable

from tui.app import CacheMgrApp

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_dashboard_shows_captured_device() -> None:
    root = next(FIXTURES.glob("bcache-writeback-dirty-*")) / "sys"

    async def go() -> tuple[int, tuple[object, ...]]:
        app = CacheMgrApp(str(root), interval=60)
        async with app.run_test() as pilot:
            for _ in range(50):
                await pilot.pause(0.05)
                if app.query_one(DataTable).row_count:
                    break
            table = app.query_one(DataTable)
            return table.row_count, tuple(table.get_row_at(0))

    count, row = asyncio.run(go())
    assert count == 1
    assert row[0] == "/dev/bcache0" and row[2] == "writeback" and row[3] == "dirty"
