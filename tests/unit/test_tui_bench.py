"""The TUI's bench screen (issue #32 items 7 and 3): the result chart labels every target apart
(its labels were cut to 12 characters: ``/dev/bcache0:none`` and ``/dev/bcache0:writeback``
both read ``/dev/bcache0``), a reference measured apart has its own bar, and a cache no
faster than the bare disk is explained on the screen. Result documents are built from the
captured fio outputs (tests/unit/test_bench_explain.py)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Checkbox, Static

from tests.unit.test_bench_explain import (
    BARE_SSD,
    NONE,
    SLOW_NONE,
    SLOW_SSD,
    SLOW_WB,
    WB,
    comparison_doc,
)
from tests.unit.tui_helpers import app_on, fx, settle
from tui.app import CacheMgrApp
from tui.screens import bench as screen
from tui.screens.bench import BenchScreen, chart_labels, result_view
from tui.widgets.devices import DeviceTable


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def text_of(renderable: Any, width: int = 100) -> str:
    con = Console(width=width, record=True, file=io.StringIO())
    con.print(renderable)
    return con.export_text()


def bar_labels(text: str) -> list[str]:
    """The labels of the IOPS chart's bars, as shown."""
    lines = text.split("IOPS (median)\n", 1)[1].split("completion latency")[0].splitlines()
    return [line.split(" █")[0].rstrip() for line in lines if "█" in line]


def test_spec_labels_are_told_apart_by_mode_and_scheduler() -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, None)
    assert chart_labels(doc) == ["/dev/bcache0 (none)", "/dev/bcache0 (writeback)"]
    # a document without its targets (older, or hand-made): read from the labels
    bare = {"results": [{"label": "/dev/sdb@mq-deadline"}, {"label": "/dev/sdb@bfq"},
                        {"label": "/dev/bcache0:writeback@kyber"}, {"label": "wb"}]}
    assert chart_labels(bare) == ["/dev/sdb (@mq-deadline)", "/dev/sdb (@bfq)",
                                  "/dev/bcache0 (writeback @kyber)", "wb"]


def test_long_labels_are_cut_in_the_middle_and_stay_apart() -> None:
    a = "/dev/disk/by-id/nvme-Samsung_SSD_980_PRO_2TB_S6B0NL0T123456"
    doc = {"results": [{"label": f"{a}:none"}, {"label": f"{a}:writeback"},
                       {"label": "/dev/disk/by-id/ata-WDC_WD40EFRX-68N32N0_WD-WCC7K1AAAAAA"},
                       {"label": "/dev/disk/by-id/ata-WDC_WD40EFRX-68N32N0_WD-WCC7K1AAAAAB"}]}
    labels = chart_labels(doc)
    assert len(set(labels)) == 4
    assert labels[0].endswith(" (none)") and labels[1].endswith(" (writeback)")
    assert labels[0].startswith("/dev/disk/") and "…" in labels[0]
    assert all(len(x) <= screen.LABEL_MAX for x in labels[:2])
    assert labels[2][-1] == "A" and labels[3][-1] == "B"


def test_result_view_bars_the_targets_and_the_cache_ssd_and_says_why() -> None:
    doc = comparison_doc(SLOW_NONE, SLOW_WB, SLOW_SSD)
    text = text_of(result_view(doc, ["/tmp/r.json"]))
    assert bar_labels(text) == ["/dev/bcache0 (none)", "/dev/bcache0 (writeback)",
                                "/dev/ubdb (cache SSD, reads)"]
    why = doc["results"][1]["explanation"]["text"]
    assert "/dev/bcache0 (writeback): no faster than the bare disk" in text
    flat = " ".join(text.split())
    assert " ".join(why.split()) in flat
    assert "a cache cannot beat its SSD" in flat
    assert flat.count("a cache cannot beat its SSD") == 1  # not again from the table
    # a cache that gains: no explanation on screen
    fast = comparison_doc("randwrite-qd1-dmdelay.json", "randwrite-qd1-bcache-writeback.json",
                          BARE_SSD)
    assert "no faster than the bare disk" not in text_of(result_view(fast, []))


@asynccontextmanager
async def running() -> AsyncIterator[tuple[CacheMgrApp, Pilot[Any]]]:
    app = app_on(fx("bcache-writeback-dirty"))
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot, lambda: app.polls > 0)
        key = app.rows[1].key  # bcache0 (row 0: its cache set)
        app.query_one(DeviceTable).select_key(key)
        await settle(pilot, lambda: app.selected_key == key)
        yield app, pilot


def test_the_screen_shows_a_saved_result_labelled_apart_and_explained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl+L: a result saved by `bench compare /dev/bcache0:none /dev/bcache0:writeback
    --reference cache-ssd` (saved before results carried their explanation) shows with both
    bars labelled apart and why the cache gained nothing."""
    doc = comparison_doc(SLOW_NONE, SLOW_WB, SLOW_SSD)
    for r in doc["results"]:
        del r["explanation"]
    d = tmp_path / "bench"
    d.mkdir()
    (d / "r.json").write_text(json.dumps(doc))
    monkeypatch.setenv("CACHEMGR_BENCH_DIR", str(d))

    async def go() -> None:
        async with running() as (app, pilot):
            await pilot.press("b")
            assert isinstance(app.screen, BenchScreen)
            await pilot.press("ctrl+l")
            assert app.screen.doc is not None
            text = text_of(app.screen.query_one("#result", Static).content)
            assert bar_labels(text) == ["/dev/bcache0 (none)", "/dev/bcache0 (writeback)",
                                        "/dev/ubdb (cache SSD, reads)"]
            assert "no faster than the bare disk" in text
            assert "a cache cannot beat its SSD" in " ".join(text.split())

    asyncio.run(go())


def test_the_form_asks_for_the_cache_ssd_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form's reference box is --reference cache-ssd; its default targets are the bare
    disk under the selected bcache device (mode none, the baseline) and its cache."""
    from cachemgr.ops import bench as bench_ops
    from cachemgr.ops.control import Control

    seen: list[tuple[list[str], Any]] = []

    def compare(sysfs: Any, spec: Any, targets: list[str], opts: Any, **kw: Any) -> Any:
        from cachemgr.ops.control import Result

        seen.append((list(targets), opts))
        return Result(data={"saved": []})

    monkeypatch.setattr(bench_ops, "compare", compare)

    async def go() -> None:
        async with running() as (app, pilot):
            await pilot.press("b")
            assert isinstance(app.screen, BenchScreen)
            values = app.screen.values()
            assert values["targets"].split() == [NONE, WB] and values["reference"] == ""
            app.screen.query_one("#reference", Checkbox).value = True
            assert app.screen.values()["reference"] == "1"

    asyncio.run(go())

    values = {"targets": f"{NONE} {WB}", "rw": "randwrite", "bs": "4k", "iodepth": "1",
              "zipf": "1.2", "runtime": "5", "repeat": "3", "force": "", "reference": "1"}
    screen.run_bench(None, values, Control())
    screen.run_bench(None, {**values, "reference": ""}, Control())
    assert seen[0][0] == [NONE, WB]
    assert seen[0][1].reference == (("*", "cache-ssd"),) and seen[1][1].reference == ()
