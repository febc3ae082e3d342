"""The help screen (?) is made from the BINDINGS of the app and of its screens: every key is
in it with its footer word and what it does, and a key added to the app shows up there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import Static

import tui.app
from tests.unit.tui_helpers import app_on, fx, settle
from tui.app import CacheMgrApp
from tui.screens import help as help_screen
from tui.screens.help import HelpScreen


def shown_help(app: CacheMgrApp) -> str:
    """The app's help as the screen shows it (opened with ?, then closed)."""
    async def go() -> str:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            await pilot.press("question_mark")
            await settle(pilot, lambda: isinstance(app.screen, HelpScreen))
            text = str(app.screen.query_one(Static).render())
            await pilot.press("escape")
            await settle(pilot, lambda: not isinstance(app.screen, HelpScreen))
            return text
    return asyncio.run(go())


def words(text: str) -> str:
    """``text`` with its wrapping undone: every run of blanks one space."""
    return " ".join(text.split())


def test_every_binding_is_in_the_help_with_its_key_and_words() -> None:
    app = app_on(fx("bcache-writeback-dirty"))
    text = shown_help(app)
    flat = words(text)
    lines = text.splitlines()
    sections = help_screen.sections(app)
    assert [t for t, _ in sections][:3] == ["Dashboard", "Detail (⏎)", "SSD replacement (s)"]
    checked = 0
    for title, bindings in sections:
        assert title in lines, title
        for b in Binding.make_bindings(bindings):
            key = app.get_key_display(b)
            row = next((line for line in lines if line.startswith("  ")
                        and key in line.split()[0].split("/")
                        and f" {b.description} " in f"{line} "), None)
            assert row is not None, f"{title}: {key} {b.description} is not in the help"
            if b.tooltip:
                assert words(b.tooltip) in flat, b.tooltip
            checked += 1
    assert checked >= len(CacheMgrApp.BINDINGS) + 6  # the app's keys and the replace screen's
    # what the keys of the dashboard do, in words (the tooltips), and the glossary
    for said in ("write all dirty data back fast, with progress and ETA (cancellable)",
                 "replace the cache SSD of a bcache cache set, LVM cache or dm-cache device",
                 "undo an interrupted run, possible before its kind's point of no return",
                 "select a cache set, a cached device or a dm-cache device",
                 "Switching away from writeback does not make a cache clean"):
        assert said in flat, said


def test_the_apps_keys_each_say_what_they_do() -> None:
    """A key of the dashboard without a tooltip would be a bare word in the help."""
    from tui.screens.replace import ReplaceScreen

    for b in Binding.make_bindings([*CacheMgrApp.BINDINGS, *ReplaceScreen.BINDINGS]):
        assert len(b.tooltip.split()) >= 3, b


class MoreKeys(CacheMgrApp):
    CSS_PATH = str(Path(tui.app.__file__).parent / "app.tcss")  # not beside this module
    BINDINGS: ClassVar[list[BindingType]] = [
        *CacheMgrApp.BINDINGS,
        Binding("k", "refresh", "Kick", show=False, tooltip="a key added to the app"),
    ]


def test_a_key_added_to_the_app_is_in_the_help_without_another_list() -> None:
    app = MoreKeys(str(fx("bcache-writeback-dirty")), interval=3600, read_only=False,
                   wallclock=lambda: 0.0)
    text = shown_help(app)
    assert any(line.split()[:2] == ["k", "Kick"] and "a key added to the app" in line
               for line in text.splitlines()), text
