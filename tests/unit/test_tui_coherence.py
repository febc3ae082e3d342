"""The TUI and a cache over a disk a VM took elsewhere (issue #42 item 3): the "a VM left"
mark on the device's row (its VMS cell), in the banner and at the top of its detail, with
the command that clears it; ``i`` runs ``cachemgr invalidate`` through the command layer,
whose refusals come first and whose question is the command line's plan, word for word
(Cancel has the focus; cancelled: exit 3's words, nothing written). A VM's name is data."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
from pathlib import Path

import pytest
from textual.widgets import Static

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import coherence, kinds
from tests.unit.guards import mutations_refused
from tests.unit.test_tui_hostile import no_links, on_screen
from tests.unit.tui_helpers import app_on, copy_capture, kernel_writes, settle, shown
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.screens.detail import DetailScreen
from tui.widgets.devices import DeviceTable

VM = "vm[red]1[/][link=http://e.x]z"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def clean_writethrough(tmp_path: Path) -> Path:
    """The captured writeback device as a clean writethrough one would read (the values
    bcache prints for them: the capture's own words)."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    b = root / "block/ubda/bcache"
    (b / "cache_mode").write_text("[writethrough] writeback writearound none\n")
    (b / "state").write_text("clean\n")
    (b / "dirty_data").write_text("0.0k\n")
    dbg = b / "writeback_rate_debug"
    dbg.write_text(re.sub(r"(?m)^(dirty:\s*)\S+", r"\g<1>0.0k", dbg.read_text()))
    return root


def mark_left(root: Path) -> None:
    """What the libvirt hook's release leaves (procedures/coherence.py ``left``)."""
    dev = kinds.resolve(snapshot.take(Sysfs(str(root))), "/dev/bcache0", Sysfs(str(root)))
    coherence.left(dev.locks[0][0], "/dev/bcache0", VM, "vda")


def cli(root: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--sysfs-root", str(root), *argv])
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


def test_the_left_mark_on_the_row_the_banner_and_the_detail(tmp_path: Path) -> None:
    root = clean_writethrough(tmp_path)
    mark_left(root)
    key = snapshot.take(Sysfs(str(root))).backings[0].key

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            row = next(r for r in app.rows if r.key == key)
            assert row.vms == f"{VM} left"
            assert "1 cache(s) hold copies of a disk a VM took elsewhere: /dev/bcache0" in \
                app._banner()
            app.query_one(DeviceTable).select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
            assert app.check_action("invalidate", ()) is True
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            await pilot.pause(0.1)
            detail = app.screen.query_one("#detail", Static)
            text = "".join(on_screen(detail).split())
            for want in (f"/dev/bcache0: VM '{VM}' left this host at",
                         "next: cachemgr invalidate /dev/bcache0 (or the VM's next arrival) "
                         "(i: invalidate)"):
                assert "".join(want.split()) in text, want
            assert no_links(detail)
            assert app.is_running

    asyncio.run(go())


def test_invalidate_asks_the_cli_s_question_and_cancel_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    root = clean_writethrough(tmp_path)
    ran = mutations_refused(monkeypatch)
    writes = kernel_writes(monkeypatch)
    # the command line's plan and question, without a terminal: refused, exit 3
    rc, _, err = cli(root, "invalidate", "/dev/bcache0")
    assert rc == 3 and "not confirmed" in err, err
    # the plan: its head line and each of its lines, indented (cli/confirm.py show)
    plan = [line for line in err.splitlines()
            if line.startswith(("cachemgr invalidate", "  ")) and not line.startswith("  hint")]
    assert plan[0] == "cachemgr invalidate /dev/bcache0 (nothing is changed yet):"
    assert any("would drop every block the cache holds of /dev/bcache0" in x for x in plan)
    key = snapshot.take(Sysfs(str(root))).backings[0].key

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            app.query_one(DeviceTable).select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
            await pilot.press("i")
            await settle(pilot, lambda: shown(app, ConfirmDialog))
            dialog = app.screen
            assert isinstance(dialog, ConfirmDialog)
            # the same words: the title is the plan's first line, the body the rest of it
            assert dialog.title_text == plan[0]
            assert dialog.body.splitlines() == [x.strip() for x in plan[1:]]
            await pilot.pause(0.1)
            assert dialog.focused is not None and dialog.focused.id == "b-cancel"
            await pilot.press("escape")
            await settle(pilot, lambda: shown(app, MessageDialog))
            body = app.screen.body  # type: ignore[attr-defined]
            assert "invalidate /dev/bcache0: not confirmed; nothing was changed" in body

    asyncio.run(go())
    assert writes == [] and ran == []
    assert coherence.marks(coherence.PENDING) == []  # nothing recorded


def test_a_dirty_writeback_cache_is_refused_before_the_question(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal the command line gives (exit 3), in the same words, and no question."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    mutations_refused(monkeypatch)
    writes = kernel_writes(monkeypatch)
    rc, _, err = cli(root, "invalidate", "/dev/bcache0", "--yes")
    assert rc == 3
    refusal = "/dev/bcache0 is in writeback with 4.4 MiB of dirty data"
    assert refusal in err
    key = snapshot.take(Sysfs(str(root))).backings[0].key

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            app.query_one(DeviceTable).select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
            await pilot.press("i")
            await settle(pilot, lambda: shown(app, MessageDialog))
            assert refusal in app.screen.body  # type: ignore[attr-defined]

    asyncio.run(go())
    assert writes == []


@pytest.mark.parametrize("action", ["invalidate", "scrub"])
def test_read_only_offers_no_invalidate_nor_scrub(tmp_path: Path, action: str) -> None:
    root = clean_writethrough(tmp_path)
    key = snapshot.take(Sysfs(str(root))).backings[0].key

    async def go() -> None:
        app = app_on(root, read_only=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            app.query_one(DeviceTable).select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
            assert app.check_action(action, ()) is None

    asyncio.run(go())
