"""Snapshot tests of the main screens at 80x24 and 200x50 (pytest-textual-snapshot),
deterministic: captured sysfs trees as input, a fixed wall clock (UTC), one poll (interval
1 h)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList

from tests.unit.tui_helpers import app_on, fx, quiet, settle
from tui.app import CacheMgrApp
from tui.widgets.devices import DeviceTable

SIZE = (80, 24)
WIDE = (200, 50)


@pytest.fixture(autouse=True)
def fixed_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))


def ready(select: int | None = None, keys: tuple[str, ...] = (),
          then: Callable[[CacheMgrApp], None] | None = None
          ) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, CacheMgrApp)
        await settle(pilot, lambda: app.polls > 0)
        if select is not None:
            app.query_one(DeviceTable).select_key(app.rows[select].key)
            await settle(pilot, lambda: app.selected_key == app.rows[select].key)
        for k in keys:
            await pilot.press(k)
            await quiet(pilot)
        if then is not None:
            then(app)
        await quiet(pilot)
    return run_before


def test_dashboard_bcache(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("bcache-writeback-dirty")), terminal_size=SIZE,
                        run_before=ready(select=1))


def test_dashboard_dmcache(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("dmcache-writeback")), terminal_size=SIZE,
                        run_before=ready(select=0))


def test_dashboard_read_only(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("bcache-missing-cache"), read_only=True),
                        terminal_size=SIZE, run_before=ready(select=0))


def test_detail_bcache(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("bcache-writeback-dirty")), terminal_size=SIZE,
                        run_before=ready(select=1, keys=("enter",)))


def _highlight_none(app: CacheMgrApp) -> None:
    app.screen.query_one(OptionList).highlighted = 3


def test_mode_dialog(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("bcache-writeback-dirty")), terminal_size=SIZE,
                        run_before=ready(select=1, keys=("m",), then=_highlight_none))


def test_help(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("bcache-writeback-dirty")), terminal_size=SIZE,
                        run_before=ready(keys=("question_mark",)))


@pytest.mark.parametrize("size", [SIZE, WIDE], ids=["80x24", "200x50"])
def test_dashboard_vms(snap_compare: Any, size: tuple[int, int]) -> None:
    """Capture vms-uml (libvirt domains on bcache0 and on dm-cache vc): the VMs in the table,
    the keys first in the banner; at 200x50 the columns and the action log take the room."""
    assert snap_compare(app_on(fx("vms")), terminal_size=size, run_before=ready())


def test_dashboard_lvm_wide(snap_compare: Any) -> None:
    assert snap_compare(app_on(fx("lvm-caches")), terminal_size=WIDE, run_before=ready())
