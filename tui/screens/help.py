"""`?`: every key, and what the words on the screen mean (from docs/admin-guide.md).

The keys are read from the BINDINGS of the app and of each screen (a binding's tooltip says
more than its footer word), so a key added anywhere is in the help without another list to
keep up."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

WIDTH = 74  # what the help dialog shows of a line at 80 columns
KEYS, WORD = 7, 11  # the widths of the keys' and the footer word's columns

INTRO = """\
cachemgr: bcache and dm-cache on this host.
Keys (also in the footer, and in Ctrl+P):"""

WORDS = """\
Columns: MODE and STATE are the kernel's words.  DIRTY is data that lives only on the
cache device until it is written back; "lost?" means the device says dirty but its cache
set is not registered (its dirty data is on a missing SSD).  HIT5m / RHIT: read hit ratio
over five minutes (bcache) / since the start.  USED: cache in use.  ERR: IO errors
(dm-cache: Fail, or ro metadata).  ⚑: a cachemgr run holds it now (a drain, a
replace-ssd run...); !: an interrupted run owns it (Enter: resume or roll back).  VMS:
the libvirt domains' disks on it.  A red row: the health model has a finding about it
(Enter shows it and the next command).

Modes:  writeback   writes go to the SSD first; dirty data is lost if the SSD dies
        writethrough  writes go to SSD and backing device; no dirty data
        writearound   writes go to the backing device only; no write wear
        none / passthrough   no caching; old dirty data keeps being written back
Switching away from writeback does not make a cache clean: drain does, fast.

Without root the view is read-only: actions are shown dimmed.  Errors and refusals show
the library's own message and hint, as `cachemgr` prints them.  Esc closes this help."""


def sections(app: App[object]) -> list[tuple[str, list[BindingType]]]:
    """Each screen's title in the help and its bindings: the app's (the dashboard's keys),
    then the screens it opens (imported here, when the help opens: the app imports them
    only when they are first shown)."""
    from tui.screens.bench import BenchScreen
    from tui.screens.detail import DetailScreen
    from tui.screens.replace import ReplaceScreen
    from tui.screens.sizing import SizingScreen

    return [("Dashboard", list(type(app).BINDINGS)),
            ("Detail (⏎)", list(DetailScreen.BINDINGS)),
            ("SSD replacement (s)", list(ReplaceScreen.BINDINGS)),
            ("Bench (b)", list(BenchScreen.BINDINGS)),
            ("Sizing (z)", list(SizingScreen.BINDINGS)),
            ("This help", list(HelpScreen.BINDINGS))]


def key_lines(app: App[object], bindings: Iterable[BindingType]) -> list[str]:
    """One line per action: its keys as the footer shows them, its footer word, and what it
    does (the binding's tooltip)."""
    rows: dict[tuple[str, str], tuple[list[str], str]] = {}
    for b in Binding.make_bindings(bindings):
        keys = rows.setdefault((b.action, b.description), ([], b.tooltip))[0]
        shown = app.get_key_display(b)
        if shown not in keys:
            keys.append(shown)
    return [line for (_, desc), (keys, tip) in rows.items()
            for line in row("/".join(keys), desc, tip)]


def row(keys: str, word: str, tip: str) -> list[str]:
    """A key's line(s): the keys, the footer's word, what it does (wrapped under itself)."""
    head = f"  {keys:<{KEYS}} {word:<{WORD}} "
    return textwrap.wrap(tip, WIDTH, initial_indent=head,
                         subsequent_indent=" " * len(head)) or [head.rstrip()]


def text(app: App[object]) -> str:
    """The whole help, for ``app``."""
    out = [INTRO, ""]
    for title, bindings in sections(app):
        out.append(title)
        if title == "Dashboard":  # the device table's own keys (Textual's DataTable)
            out += row("↑/↓", "mouse", "select a cache set, a cached device or a dm-cache "
                       "device")
        out += key_lines(app, bindings)
        out.append("")
    return "\n".join([*out, WORDS])


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [("escape", "close", "Close"),
                                             ("question_mark", "close", "Close"),
                                             ("q", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Static(text(self.app), markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
