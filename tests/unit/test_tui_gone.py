"""The TUI shows a bcache backing device gone while dirty (issue #41 item d): ``check``
remembered it dirty, its disk is gone, and its dirty data is only on the cache set's SSD.
There is no /dev/bcacheN to hang it on, so it gets a row of its own under its cache set,
red, that an admin sees at 80x24; enter shows the finding with its next command and what was
remembered; no action is offered on it. Its strings (a node from the state file) are data."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import Static

from cachemgr.backends import snapshot
from cachemgr.core.model import GoneBacking
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import health
from tests.unit.test_tui_hostile import no_links, on_screen
from tests.unit.tui_helpers import app_on, copy_capture, settle
from tui import view
from tui.screens.detail import DetailScreen
from tui.widgets.devices import DeviceTable

UUID = "0b1e2f00-0000-4000-8000-00000000abcd"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def gone_tree(tmp_path: Path, node: str = "/dev/sdq") -> tuple[Path, str]:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (c,) = snapshot.take(Sysfs(str(root))).cache_sets
    health.save_remembered([GoneBacking(UUID, node, "/dev/bcache7", c.uuid, 32 << 20, 1.0)])
    return root, c.uuid


def test_a_gone_backing_device_is_a_red_row_under_its_set_at_80x24(tmp_path: Path) -> None:
    root, cset = gone_tree(tmp_path)

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            keys = [r.key for r in app.rows]
            assert keys == [f"cset:{cset}", keys[1], f"gone:{UUID}"], keys
            row = app.rows[2]
            assert (row.kind, row.device, row.disk, row.state, row.dirty, row.alert) == (
                view.GONE, "└ (gone)", "sdq", "gone", "32.0M", True)
            assert app.rows[1].device == "├ bcache0"
            table = app.query_one(DeviceTable)
            assert "(gone)" in on_screen(table) and "sdq" in on_screen(table)
            # the banner says the CRITICAL first (it is the worst finding)
            assert "! CRITICAL /dev/sdq: bcache backing device of /dev/bcache7 gone" in \
                app._banner()
            # the polls that read no superblock keep the probing poll's answer
            app.start_poll()
            await settle(pilot, lambda: app.polls > 1)
            assert f"gone:{UUID}" in [r.key for r in app.rows]
            table.select_key(f"gone:{UUID}")
            await settle(pilot, lambda: app.selected_key == f"gone:{UUID}")
            for action in ("mode", "drain", "detach", "remove", "tune", "replace", "bench",
                           "warm"):
                assert app.check_action(action, ()) is None, action
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            await pilot.pause(0.1)
            # the detail's lines wrap at 80 columns (the space at a break dropped): read
            # without spaces
            text = "".join(on_screen(app.screen.query_one("#detail", Static)).split())
            for words in ("CRITICAL /dev/sdq: bcache backing device of /dev/bcache7 gone",
                          "next: bring /dev/sdq back (reseat it, rescan its bus), then "
                          "cachemgr register /dev/sdq", UUID, "do not unregister"):
                assert "".join(words.split()) in text, words

    asyncio.run(go())


def test_a_gone_node_that_is_markup_is_shown_as_data(tmp_path: Path) -> None:
    node = "/dev/[red]x[/][link=http://e.x]y"
    root, _ = gone_tree(tmp_path, node)

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            app.query_one(DeviceTable).select_key(f"gone:{UUID}")
            await settle(pilot, lambda: app.selected_key == f"gone:{UUID}")
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            await pilot.pause(0.1)
            detail = app.screen.query_one("#detail", Static)
            assert node in on_screen(detail).replace("\n", "")
            assert no_links(detail)
            assert app.is_running

    asyncio.run(go())
