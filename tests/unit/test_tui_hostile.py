"""Hostile device-supplied text in the TUI and the CLI (issue #15 item 1).

A bcache label, a dm name, SCSI vendor/model/serial come from the device or the kernel and
can hold markup (``[/]`` ends the TUI with MarkupError; ``[link=...]`` makes a terminal
hyperlink) and control characters (an escape sequence drives the terminal). Each test writes
such text into a copied capture and drives the app: it must stay up and show the text
literally, control characters as visible escapes.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.segment import Segment
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import OptionList, RichLog, Static

from cachemgr.core.text import printable
from tests.unit.tui_helpers import app_on, click, copy_capture, quiet, settle, shown
from tui.app import CacheMgrApp
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.screens.detail import DetailScreen
from tui.widgets.devices import DeviceTable
from tui.widgets.logpanel import LogPanel

# closes a tag never opened: Rich and Textual markup both raise MarkupError on it
BAD = "[/][bold red]x[/"
LINK = "[link=http://x]y[/link]"
ESC = "e\x1b[31mr\u202e"  # an SGR sequence and a bidi override
ESC_SHOWN = "e\\x1b[31mr\\u202e"
CONTROL = set(range(0x20)) | set(range(0x7f, 0xa0)) | set(range(0x202a, 0x202f)) | \
    set(range(0x2066, 0x206a))


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@asynccontextmanager
async def running(root: Path, at: str | None = None
                  ) -> AsyncIterator[tuple[CacheMgrApp, Pilot[Any]]]:
    app = app_on(root)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot, lambda: app.polls > 0)
        if at is not None:
            app.query_one(DeviceTable).select_key(at)
            await settle(pilot, lambda: app.selected_key == at)
        yield app, pilot


def segments(w: Widget) -> list[Segment]:
    """What ``w`` puts on the screen now, as segments (text and style)."""
    out: list[Segment] = []
    for strip in w.render_lines(Region(0, 0, w.size.width, w.size.height)):
        out += list(strip)
    return out


def on_screen(w: Widget) -> str:
    return "".join(s.text for s in segments(w))


def no_links(w: Widget) -> bool:
    return not any(s.style is not None and s.style.link for s in segments(w))


def text_of(node: Any, selector: str) -> str:
    return str(node.query_one(selector, Static).render())


def hostile_label(tmp_path: Path, label: str) -> Path:
    """bcache-writeback-dirty with ``label`` in bcache0's label (the kernel keeps 32 bytes)."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (root / "block/ubda/bcache/label").write_text(label + "\n")
    return root


def hostile_dm(tmp_path: Path, name: str) -> Path:
    """dmcache-writeback with its cache device renamed ``name`` (sysfs and dmsetup's
    answers)."""
    root = copy_capture(tmp_path, "dmcache-writeback")
    (root / "block/dm-1/dm/name").write_text(name + "\n")
    for f in root.parent.glob("dmsetup-*.txt"):
        f.write_text(f.read_text().replace("vmcache", name))
    return root


def backing_key(root: Path) -> str:
    from cachemgr.backends import snapshot
    from cachemgr.core.sysfs import Sysfs

    return snapshot.take(Sysfs(root)).backings[0].key


# ------------------------------------------------------------------------- printable()


@given(st.text())
def test_printable_leaves_no_control_character(s: str) -> None:
    out = printable(s)
    assert not any(ord(c) in CONTROL for c in out)
    kept = printable(s, newlines=True)
    assert not any(ord(c) in CONTROL - {10} for c in kept)
    assert printable(out) == out  # idempotent: escapes are printable


@given(st.text(st.characters(blacklist_categories=("Cc",),
                             blacklist_characters="".join(map(chr, CONTROL)))))
def test_printable_keeps_printable_text(s: str) -> None:
    assert printable(s) == s
    assert printable(s, newlines=True) == s


def test_printable_escapes() -> None:
    assert printable(ESC) == ESC_SHOWN
    assert printable("a\nb\x7f\x9b") == "a\\x0ab\\x7f\\x9b"
    assert printable("a\nb\tc", newlines=True) == "a\nb\\x09c"
    assert printable(BAD) == BAD


# ------------------------------------------------------------------------- TUI


@pytest.mark.parametrize("label", [BAD, LINK])
def test_markup_label_in_the_detail_view(tmp_path: Path, label: str) -> None:
    """Enter on a device whose bcache label is markup: the detail shows it literally (the
    issue's crash: MarkupError from the detail view's table), no hyperlink."""
    root = hostile_label(tmp_path, label)

    async def go() -> None:
        async with running(root, at=backing_key(root)) as (app, pilot):
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            await quiet(pilot)
            detail = app.screen.query_one("#detail", Static)
            assert label in on_screen(detail)
            assert no_links(detail)
            await pilot.press("escape")
            assert app.is_running and app.return_code is None

    asyncio.run(go())


def test_control_characters_in_a_label_are_shown_escaped(tmp_path: Path) -> None:
    root = hostile_label(tmp_path, ESC)

    async def go() -> None:
        async with running(root, at=backing_key(root)) as (app, pilot):
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            await quiet(pilot)
            text = on_screen(app.screen.query_one("#detail", Static))
            assert ESC_SHOWN in text and "\x1b" not in text

    asyncio.run(go())


def test_markup_model_and_serial_in_the_cache_set_detail_and_replace_screen(
        tmp_path: Path) -> None:
    """INQUIRY strings (model and serial of the SSD) as markup and escapes: the cache
    set's detail and the SSD replacement plan show them literally."""
    from tui.screens.replace import ReplaceScreen

    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    dev = root / "block/sda/device"
    (dev / "model").write_text(LINK + "\n")
    serial = ESC + BAD
    (dev / "serial").write_text(serial + "\n")
    udev = root.parent / "udev-db.txt"
    udev.write_text(udev.read_text().replace("ID_SCSI_SERIAL=2000", "ID_SCSI_SERIAL=" + serial))

    async def go() -> None:
        async with running(root) as (app, pilot):
            cset = next(r.key for r in app.rows if r.key.startswith("cset:"))
            app.query_one(DeviceTable).select_key(cset)
            await settle(pilot, lambda: app.selected_key == cset)
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            await quiet(pilot)
            detail = app.screen.query_one("#detail", Static)
            text = on_screen(detail)
            assert LINK in text and printable(serial) in text
            assert no_links(detail) and "\x1b" not in text
            await pilot.press("escape")
            await pilot.press("s")
            assert isinstance(app.screen, ReplaceScreen)
            await pilot.press("p")
            plan = app.screen.query_one("#plan", Static)
            await settle(pilot, lambda: "replace the cache SSD" in str(plan.render()))
            shown_plan = on_screen(plan)
            assert f"serial {printable(serial)})" in str(plan.render())
            assert "\x1b" not in shown_plan
            oplog = app.screen.query_one("#oplog", RichLog)
            await quiet(pilot)
            assert "\x1b" not in "".join(s.text for line in oplog.lines for s in line)
            assert ESC_SHOWN in "".join(s.text for line in oplog.lines for s in line)

    asyncio.run(go())


def test_markup_dm_name_in_table_dialogs_notifications_and_log(tmp_path: Path) -> None:
    """A dm name with markup and an escape: the table, the mode choice and confirmation,
    the 'already so' notification, the log and the remove confirmation show it literally."""
    name = "vm[/]" + ESC
    root = hostile_dm(tmp_path, name)

    async def go() -> None:
        async with running(root, at=f"dm:{name}") as (app, pilot):
            table = app.query_one(DeviceTable)
            # cut to its column keeping its end (a name's meaningful part), shown literally
            assert printable(name)[-12:] in on_screen(table) and "\x1b" not in on_screen(table)
            await pilot.press("m")
            assert isinstance(app.screen, ChoiceDialog)
            assert f"Cache mode of {printable(name)}" in text_of(app.screen, ".dialog-title")
            ol = app.screen.query_one(OptionList)
            ol.highlighted = 0  # writeback: the current mode
            await pilot.press("enter")
            assert isinstance(app.screen, ConfirmDialog)
            assert printable(name) in text_of(app.screen, ".dialog-title")
            await click(pilot, "#b-switch")
            await settle(pilot, lambda: "already so" in "\n".join(app.log_history))
            await quiet(pilot)
            toasts = [n.message for n in app._notifications]
            assert any(f"/dev/mapper/{printable(name)} is already in writeback mode" in t
                       for t in toasts), toasts
            log = app.query_one(LogPanel)
            logged = "\n".join(log.lines_text)
            assert printable(name) in logged and "\x1b" not in logged
            assert "\x1b" not in "".join(s.text for line in log.lines for s in line)
            await pilot.press("delete")
            assert isinstance(app.screen, ConfirmDialog)
            assert f"Remove {printable(name)}" in str(app.screen.query_one("#b-go").label)
            await pilot.press("escape")
            assert app.is_running and app.return_code is None

    asyncio.run(go())


def test_link_in_an_error_message_is_not_a_hyperlink(tmp_path: Path) -> None:
    """A refusal that names a device with markup in its name: the message dialog shows it
    literally, without a hyperlink."""
    name = LINK.replace(":", "")  # dmsetup's answers are "name: ..."
    root = hostile_dm(tmp_path, name)

    async def go() -> None:
        async with running(root, at=f"dm:{name}") as (app, pilot):
            await pilot.press("m")
            app.screen.query_one(OptionList).highlighted = 2  # passthrough: refused (dirty)
            await pilot.press("enter")
            await click(pilot, "#b-switch")
            await settle(pilot, lambda: shown(app, MessageDialog))
            await quiet(pilot)
            body = app.screen.query_one(".dialog-body", Static)
            title = app.screen.query_one(".dialog-title", Static)
            assert name in on_screen(body) and name in on_screen(title)
            assert no_links(body) and no_links(title)

    asyncio.run(go())


# ------------------------------------------------------------------------- CLI


def test_status_table_escapes_control_characters(tmp_path: Path) -> None:
    from cachemgr.backends import snapshot
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops.render import status_table

    name = "vm" + ESC
    out = status_table(snapshot.take(Sysfs(hostile_dm(tmp_path, name))))
    assert "vme\\x1b[31mr" in out and "\x1b" not in out and "\u202e" not in out


def test_cli_error_and_result_escape_control_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cachemgr.cli.main import main

    name = "vm" + ESC
    root = hostile_dm(tmp_path, name)
    rc = main(["--sysfs-root", str(root), "mode", name, "writeback"])
    err = capsys.readouterr().err
    assert rc == 4 and f"/dev/mapper/{printable(name)} is already" in err
    assert "\x1b" not in err
    rc = main(["--sysfs-root", str(root), "status"])
    out = capsys.readouterr().out
    assert rc == 0 and printable(name)[:11] in out and "\x1b" not in out
    rc = main(["--sysfs-root", str(root), "status", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and "\\u001b" in out  # JSON stays exact


def test_console_check_of_segments_sees_links() -> None:
    """The link check above can fail: a Text made from markup carries a link style."""
    from rich.text import Text

    con = Console(file=io.StringIO())
    segs = list(con.render(Text.from_markup(LINK)))
    assert any(s.style is not None and s.style.link for s in segs)
