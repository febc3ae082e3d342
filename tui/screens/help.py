"""`?`: every key, and what the words on the screen mean (from docs/admin-guide.md)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
cachemgr: bcache and dm-cache on this host.  Keys (also in the footer and in Ctrl+P):

  ↑/↓ or mouse   select a cache set, a cached device or a dm-cache device
  Enter          detail of the selection: identities, every tunable, stats, errors
  g              go to the device with the most dirty data
  m  Mode        change the cache mode (says what happens to dirty data)
  d  Drain       write all dirty data back fast, with progress and ETA (cancellable)
  x  Detach      detach a backing device (bcache flushes its dirty data first)
  a  Attach      attach a backing device to a cache set
  t  Tune        set a tunable (writeback_percent, sequential_cutoff, ...)
  c  Create      create a bcache or dm-cache device (formats devices: confirmed)
  Del Remove     safe decommission: flush, detach, stop / unregister (confirmed)
  s  SSD         replace the cache SSD of a set: plan, steps, swap prompt, resume
  b  Bench       benchmark a device or compare modes (fio), with charts
  z  Sizing      hit ratio against cache size from a recorded trace (cachemgr trace)
  o              operations hidden with Esc: show their progress again, cancel there
  r  refresh now   +/-  refresh interval   l  log panel   q  quit   Esc  back

Columns: MODE and STATE are the kernel's words.  DIRTY is data that lives only on the
cache device until it is written back; "lost?" means the device says dirty but its cache
set is not registered (its dirty data is on a missing SSD).  HIT5m / HIT: hit ratio over
five minutes / since the start.  WB/s: bcache's writeback rate.  USED: cache in use.
ERR: IO errors (dm-cache: Fail, or ro metadata).

Modes:  writeback   writes go to the SSD first; dirty data is lost if the SSD dies
        writethrough  writes go to SSD and backing device; no dirty data
        writearound   writes go to the backing device only; no write wear
        none / passthrough   no caching; old dirty data keeps being written back
Switching away from writeback does not make a cache clean: drain does, fast.

Without root the view is read-only: actions are shown dimmed.  Errors and refusals show
the library's own message and hint, as `cachemgr` prints them.  Esc closes this help."""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [("escape", "close", "Close"),
                                             ("question_mark", "close", "Close"),
                                             ("q", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Static(HELP, markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
