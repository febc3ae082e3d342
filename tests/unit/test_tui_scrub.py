"""The TUI's scrub (``v`` on a cache's row): ``cachemgr scrub`` through the command layer,
paced as the weekly timer is, whose refusals come first in the command line's words (a
writeback or dirty cache), whose plan is the question (Cancel has the focus; cancelled:
exit 3's words, nothing read or written), and whose comparison runs with a progress bar.
What a scrub finds on the kernel is tests/kernel/test_scrub_kernel.py's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import scrub
from cachemgr.procedures.kinds.bcache import Bcache
from tests.unit.guards import mutations_refused
from tests.unit.test_scrub import cli
from tests.unit.test_tui_coherence import clean_writethrough
from tests.unit.tui_helpers import app_on, copy_capture, kernel_writes, settle, shown
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.dialogs.progress import ProgressDialog
from tui.widgets.devices import DeviceTable


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The device nodes opened (a scrub's reads)."""
    seen: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (seen.append(str(p)),
                                                       real_open(p, *a, **k))[1])
    return seen


async def press_v(pilot: Any, app: Any, key: str) -> None:
    await settle(pilot, lambda: app.polls > 0)
    app.query_one(DeviceTable).select_key(key)
    await settle(pilot, lambda: app.selected_key == key)
    assert app.check_action("scrub", ()) is True
    await pilot.press("v")


def test_a_dirty_writeback_cache_is_refused_in_the_cli_s_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: list[str]) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    ran = mutations_refused(monkeypatch)
    writes = kernel_writes(monkeypatch)
    rc, _, err = cli(root, ["scrub", "/dev/bcache0"])
    assert rc == 3
    refusal = "/dev/bcache0 is in writeback with 4.4 MiB of dirty data"
    hint = "cachemgr mode /dev/bcache0 writethrough --drain && cachemgr scrub /dev/bcache0"
    assert refusal in err and hint in err, err
    key = snapshot.take(Sysfs(str(root))).backings[0].key
    asked: list[object] = []

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            await press_v(pilot, app, key)
            await settle(pilot, lambda: asked.append(app.screen) or shown(app, MessageDialog))
            body = app.screen.body  # type: ignore[attr-defined]
            assert refusal in body and hint in body, body
            assert "refused as unsafe" in app.screen.title_text  # type: ignore[attr-defined]

    asyncio.run(go())
    assert not [s for s in asked if isinstance(s, ConfirmDialog)]  # no question first
    assert writes == [] and ran == []
    assert not [p for p in opened if p.startswith("/dev/")]  # nothing read


def test_the_question_is_the_plan_and_cancel_reads_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: list[str],
        state_dir: Path) -> None:
    root = clean_writethrough(tmp_path)
    ran = mutations_refused(monkeypatch)
    writes = kernel_writes(monkeypatch)
    key = snapshot.take(Sysfs(str(root))).backings[0].key

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            await press_v(pilot, app, key)
            await settle(pilot, lambda: shown(app, ConfirmDialog))
            dialog = app.screen
            assert isinstance(dialog, ConfirmDialog)
            assert dialog.title_text == "cachemgr scrub /dev/bcache0 (nothing is changed yet):"
            body = dialog.body.splitlines()
            assert body[0].startswith("would read each block /dev/bcache0's cache holds")
            assert body[1] == "paced: the other IO on /dev/bcache0 keeps its p99 under 20 ms"
            assert "would drop every block that differs from the cache" in body[2]
            await settle(pilot, lambda: dialog.focused is not None)
            assert dialog.focused is not None and dialog.focused.id == "b-cancel"
            await pilot.press("escape")
            await settle(pilot, lambda: shown(app, MessageDialog))
            assert "scrub /dev/bcache0: not confirmed; nothing was changed" in \
                app.screen.body  # type: ignore[attr-defined]

    asyncio.run(go())
    assert writes == [] and ran == []
    assert not [p for p in opened if p.startswith("/dev/")]
    assert not (state_dir / scrub.RECORD).exists()


def test_go_compares_with_a_progress_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         state_dir: Path) -> None:
    """Yes: the command's comparison, its progress in the dialog, its lines in the log (two
    files stand for the device and its origin: the bcache kind's source of them)."""
    root = clean_writethrough(tmp_path)
    monkeypatch.delattr(os, "O_DIRECT", raising=False)  # tmpfs refuses it
    data = os.urandom(3 << 20)
    (tmp_path / "origin").write_bytes(b"\0" * 8192 + data)
    (tmp_path / "served").write_bytes(data)
    monkeypatch.setattr(Bcache, "scrub_source", lambda self, sysfs: scrub.Source(
        str(tmp_path / "served"), str(tmp_path / "origin"), 8192, scrub.CHUNK, 3 << 20, None,
        "the whole device", meter="bcache0"))
    progress: list[object] = []
    real = scrub.compare

    def compare(src: scrub.Source, **kw: Any) -> scrub.Scrubbed:
        report = kw["progress"]

        def seen(p: object) -> None:
            progress.append(p)
            report(p)

        return real(src, **{**kw, "progress": seen})

    monkeypatch.setattr(scrub, "compare", compare)
    key = snapshot.take(Sysfs(str(root))).backings[0].key

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            await press_v(pilot, app, key)
            await settle(pilot, lambda: shown(app, ConfirmDialog))
            # the operation's progress dialog, under the question (cancellable)
            under = [x for x in app.screen_stack if isinstance(x, ProgressDialog)]
            assert len(under) == 1 and "scrub /dev/bcache0" in under[0].title_text
            app.screen.query_one("#b-go").press()
            await settle(pilot, lambda: any(
                "scrub /dev/bcache0: 3 blocks (3.0 MiB) compared" in x
                for x in app.log_history))
            assert not shown(app, MessageDialog)  # no error

    asyncio.run(go())
    assert progress and all(isinstance(p, scrub.ScrubProgress) for p in progress)
    assert progress[-1].fraction == 1.0  # type: ignore[attr-defined]
    assert [x.device for x in scrub.lasts()] == ["/dev/bcache0"]  # recorded, as the CLI's
