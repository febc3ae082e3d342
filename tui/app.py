"""cachemgr's Textual app: a live dashboard of every cache and the CLI's operations.

Structure (after harlequin, frogmouth, toolong and posting):

* ``view.py`` / ``history.py``: plain data, no textual; every operation is a call into the
  command layer (``cachemgr.ops``), the same calls, checks and words as the CLI's.
* ``screens/``: dashboard, detail, SSD replacement, bench, help; ``dialogs/``: confirmations,
  choices, forms, progress; ``widgets/``: the device tree, trends, the log panel.
* All IO runs in thread workers (``@work(thread=True, exclusive=True, exit_on_error=False)``);
  the poll is re-armed only after the previous one finished; results come back as typed
  messages (messages.py); every worker failure lands in :meth:`on_worker_state_changed`, the
  one place errors are handled (the library's message and hint, verbatim).
* Quitting leaves the exit code 0 and writes nothing to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from cachemgr.core import cancel, checks
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    Cancelled,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import (
    GoneBacking,
    Snapshot,
    UnregisteredBcache,
    VmScan,
)
from cachemgr.core.sysfs import DEFAULT_ROOT, Sysfs
from cachemgr.core.version import version
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import coherence as coherence_ops
from cachemgr.ops import doctor as doctor_ops
from cachemgr.ops import health as health_ops
from cachemgr.ops.control import Control, Result, progress_line
from cachemgr.ops.health import Finding
from tui import actions, history, view
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import MessageDialog
from tui.dialogs.progress import ProgressDialog
from tui.messages import OpFinished, OpProgress, OpSaid, SnapshotReady
from tui.safe import literal, plain
from tui.screens.dashboard import DashboardScreen
from tui.screens.detail import DetailScreen
from tui.screens.help import HelpScreen
from tui.widgets.devices import DeviceTable
from tui.widgets.logpanel import LogPanel
from tui.widgets.trends import TrendPanel

Obj = view.Obj

# actions that change something: disabled (shown dimmed) in the read-only view
VM_EVERY = 15.0  # seconds between two looks at libvirt's domains (the VMs on each cache)
# seconds between two reads of bcache's five-minute/hour/day stats (HIT5m, the detail's table):
# the kernel folds them every ~13.6 s (stats.c); every poll while a detail screen is open
STATS_EVERY = 15.0
WRITE_ACTIONS = {"mode", "drain", "detach", "attach", "tune", "create", "remove", "replace",
                 "bench", "warm", "invalidate", "scrub"}
ERROR_WORDS: list[tuple[type[BaseException], str]] = [
    (Cancelled, "cancelled"),
    (AlreadyError, "already so (nothing changed)"),
    (UsageError, "bad usage or input"),
    (UnsafeError, "refused as unsafe"),
    (TimeoutExpired, "timed out"),
    (CacheMgrError, "failed"),
]


def error_word(exc: BaseException) -> str:
    return next((w for t, w in ERROR_WORDS if isinstance(exc, t)), "internal error")


class Op:
    """A running operation: its control (progress out, cancel in) and how it is shown."""

    def __init__(self, op_id: int, title: str, ctl: Control,
                 on_done: Callable[[Result], None] | None) -> None:
        self.id = op_id
        self.title = title
        self.ctl = ctl
        self.on_done = on_done
        self.dialog: ProgressDialog | None = None
        self.worker: Worker[Any] | None = None
        self.last_line = ""
        # (cancellable, cancel note) of an operation shown with a progress dialog: hidden, it
        # can be shown again ("o") and cancelled from there
        self.progress: tuple[bool, str] | None = None


class CacheMgrApp(App[int]):
    TITLE = "cachemgr"
    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = True
    # the help (screens/help.py) lists these with their tooltips: say there what a key does
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "mode", "Mode",
                tooltip="change the cache mode (says what happens to dirty data)"),
        Binding("d", "drain", "Drain",
                tooltip="write all dirty data back fast, with progress and ETA (cancellable)"),
        Binding("x", "detach", "Detach",
                tooltip="detach a backing device (bcache flushes its dirty data first)"),
        Binding("a", "attach", "Attach", tooltip="attach a backing device to a cache set"),
        Binding("t", "tune", "Tune",
                tooltip="set a tunable (writeback_percent, sequential_cutoff, ...)"),
        Binding("c", "create", "Create",
                tooltip="create a bcache or dm-cache device (formats devices: confirmed)"),
        Binding("delete", "remove", "Remove", key_display="Del",
                tooltip="safe decommission: flush, detach, stop / unregister (confirmed)"),
        Binding("s", "replace", "SSD",
                tooltip="replace the cache SSD of a bcache cache set, LVM cache or dm-cache "
                        "device: plan, steps, swap prompt, resume, rollback"),
        Binding("b", "bench", "Bench",
                tooltip="benchmark a device or compare modes (fio), with charts"),
        # not in the footer (full at 80 columns): in the help and Ctrl+P
        Binding("w", "warm", "Warm", show=False,
                tooltip="warm a new or emptied cache: read the blocks a trace (cachemgr "
                        "trace) found hottest through it, with progress (cancellable: puts "
                        "back what it changed)"),
        Binding("i", "invalidate", "Invalidate", show=False,
                tooltip="drop every copy the cache holds of the device (a VM's shared disk "
                        "was written on another host: cachemgr invalidate); asks first, with "
                        "the command line's words"),
        Binding("v", "scrub", "Scrub", show=False,
                tooltip="verify a write-through or clean cache: compare what it serves with "
                        "its origin, paced (20 ms p99 for the VMs), and drop every block that "
                        "differs (cachemgr scrub); asks first, with progress (cancellable)"),
        Binding("question_mark", "help", "Help", key_display="?",
                tooltip="this help: every key, and what the words on the screen mean"),
        # q is in the banner and the help: the footer has room for the actions at 80 columns
        Binding("q", "quit", "Quit", show=False,
                tooltip="quit (running operations are cancelled: they put back what they "
                        "changed)"),
        Binding("enter", "detail", "Detail", show=False,
                tooltip="detail of the selection: identities, every tunable, stats, errors"),
        Binding("g", "most_dirty", "Most dirty", show=False,
                tooltip="go to the device with the most dirty data"),
        Binding("r", "refresh", "Refresh", show=False, tooltip="read every cache again now"),
        Binding("plus,equals_sign", "interval(1)", "Slower", show=False,
                tooltip="refresh less often (up to every 60 s)"),
        Binding("minus", "interval(-1)", "Faster", show=False,
                tooltip="refresh more often (down to every 0.5 s)"),
        Binding("l", "toggle_log", "Log", show=False, tooltip="show or hide the log panel"),
        Binding("o", "operations", "Operations", show=False,
                tooltip="operations hidden with Esc: show their progress again, cancel there"),
        Binding("z", "sizing", "Sizing", show=False,
                tooltip="hit ratio against cache size from a recorded trace (cachemgr trace)"),
    ]
    INTERVALS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

    def __init__(self, sysfs_root: str = DEFAULT_ROOT, interval: float = 1.0, *,
                 read_only: bool | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wallclock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.sysfs_root = str(sysfs_root)
        self.sysfs = Sysfs(sysfs_root)
        # 0, negative or nan: a busy loop, a crash or no refresh at all (UsageError, exit 2)
        self.interval = checks.seconds(interval, "--interval")
        self.read_only = os.geteuid() != 0 if read_only is None else read_only
        self.clock = clock
        self.wallclock = wallclock
        self.snap: Snapshot | None = None
        self.rows: list[view.Row] = []
        self.selected_key: str | None = None
        self.history = history.History()
        self.ops: dict[int, Op] = {}
        self._next_op = 1
        self._polling = False
        # the widget and text each panel shows (update_panels)
        self._shown: dict[str, tuple[int, str]] = {}
        self._offered: tuple[object, ...] = ()  # what the footer's keys offered last
        self._vms_at: float | None = None  # when libvirt was last asked (poll worker only)
        self._vms: VmScan | None = None
        self._unregistered: tuple[UnregisteredBcache, ...] = ()
        self._gone: tuple[GoneBacking, ...] = ()
        self._poll_timer: Any = None
        # poll worker only: identities and the like kept until a uevent (ScanCache), the last
        # snapshot with every stats interval and when it was taken. The files a poll does not
        # read (the tunables and bypass counters neither the table nor the findings use:
        # backends/scancache.py) are the last full read's, which comes every STATS_EVERY
        # seconds (every poll while a detail screen is open); the cache's own bound is
        # longer, so that it is always that full read that reads them again
        self._scan_cache = cache_ops.ScanCache(keep=2 * STATS_EVERY, clock=clock)
        self._wb_meter = cache_ops.WritebackMeter()  # WB/s: measured, never the setting
        self._stats_at: float | None = None
        self._with_stats: Snapshot | None = None
        self.polls = 0
        self.poll_error: str | None = None
        self.findings: list[Finding] = []  # the health model's, of the last snapshot
        # why a cache does not help: doctor's diagnosis over the polls that read every stats
        # interval, a window of at least STATS_EVERY seconds (poll worker only)
        self._doctor = doctor_ops.Watch(STATS_EVERY)
        self.causes: list[Finding] = []  # its causes, of the last window
        self.left: list[view.Left] = []  # the "a VM left" marks, of the last poll
        self._signals: list[int] = []  # the signals the event loop handles (hang_up)
        self._quitting = False  # quit asked while operations ran: exit when they end
        self._terminal_gone = False  # SIGHUP: no terminal to restore at the end
        self._quit_code = 0
        self.log_history: list[str] = []

    # ------------------------------------------------------------------ screens & layout

    def get_default_screen(self) -> Screen[Any]:
        return DashboardScreen()

    def on_mount(self) -> None:
        self.sub_title = self._subtitle()
        # a closed terminal (SIGHUP) or a kill (SIGTERM) quits as "q" does: the running
        # operations are cancelled and put back what they changed before the process ends
        # (Python's default for both is to die at once, leaving a bench's mode switched)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(sig, self.hang_up, sig)
                self._signals.append(sig)

    def panic(self, *renderables: Any) -> None:
        """Textual panics when its input thread's read fails; on a hung-up terminal that is
        EIO, which can come before the SIGHUP: a hang-up then, not a crash (its shutdown
        would block writing to the dead terminal, with operations still running)."""
        for r in renderables:
            stacks = getattr(getattr(r, "trace", None), "stacks", None) or []
            if any(st.exc_type == "OSError" and "Input/output error" in st.exc_value
                   for st in stacks):
                self.hang_up(signal.SIGHUP)
                return
        super().panic(*renderables)

    def hang_up(self, sig: int) -> None:
        """SIGHUP or SIGTERM: quit, putting back first what the running operations changed
        (their own restores, which the process waits for)."""
        if self._terminal_gone:
            return  # the input thread's EIO came first, then the SIGHUP itself
        name = signal.Signals(sig).name
        self.log_line(f"{name}: quitting; running operations put back what they changed")
        # the terminal is gone: Textual's own shutdown would block writing its reset
        # sequences to it (seen in the lab: the process stayed on after tmux kill-server)
        self._terminal_gone = sig == signal.SIGHUP
        if self._terminal_gone:
            # and whatever still writes to it (Textual's writer thread, the log) writes to
            # /dev/null, never blocking or failing on a hung-up terminal
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.close(null)
        self.quit_putting_back(128 + sig)

    def quit_putting_back(self, code: int = 0) -> None:
        """Quit; the running operations first cancelled, with a word of what is being put
        back while they do (no blank wait), the app ending when the last one has."""
        running = list(self.ops.values())
        if not running:
            self._end(code)
            return
        self._quit_code = code
        for op in running:
            op.ctl.cancel.set()
        body = "\n".join(f"{op.title}: cancelled; putting back what it changed"
                         for op in running)
        if not self._quitting:
            self._quitting = True
            self.push_screen(MessageDialog("Quitting", body + "\n\ncachemgr quits when they "
                                           "are done."))

    def _end(self, code: int) -> None:
        """End the app; with its terminal gone (SIGHUP), end the process at once: every
        operation has put back what it changed by now (their workers ended), the locks go
        with the process, and there is no screen to restore."""
        if self._terminal_gone:
            logging.shutdown()
            os._exit(code)
        self.exit(return_code=code)

    async def action_quit(self) -> None:
        self.quit_putting_back()

    def dashboard_mounted(self) -> None:
        """Called by the dashboard once its widgets exist: the first poll starts then."""
        self.log_line(f"cachemgr TUI started on {self.root_name}"
                      + (" (read-only: not root)" if self.read_only else ""))
        self.start_poll()

    @property
    def root_name(self) -> str:
        """/sys, or a capture's scenario name (tests/fixtures/<scenario>/sys)."""
        p = Path(self.sysfs_root)
        if self.sysfs_root == DEFAULT_ROOT:
            return self.sysfs_root
        return p.parent.name if p.name == "sys" else p.name

    def _subtitle(self) -> str:
        parts = []
        if self.sysfs_root != DEFAULT_ROOT:
            parts.append(f"capture {self.root_name}")
        if self.read_only:
            parts.append("READ-ONLY")
        return plain(" · ".join(parts))

    def dashboard(self) -> DashboardScreen | None:
        for s in self.screen_stack:
            if isinstance(s, DashboardScreen):
                return s
        return None

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification of the app and its screens: the text is data (device names,
        the library's messages), never markup, control characters shown as escapes."""
        super().notify(plain(message), title=plain(title), severity=severity, timeout=timeout,
                       markup=False)

    def log_line(self, line: str, style: str = "") -> None:
        """The log panel: what was done, refused or failed (kept for tests as text)."""
        self.log_history.append(line)
        d = self.dashboard()
        if d is not None:
            try:
                d.query_one(LogPanel).add(line, style)
            except NoMatches:
                pass

    # ------------------------------------------------------------------ polling

    def start_poll(self) -> None:
        if self._polling:
            return
        self._polling = True
        self.poll()

    @work(thread=True, exclusive=True, exit_on_error=False, group="poll", name="poll")
    def poll(self) -> None:
        # libvirt is asked every VM_EVERY seconds (one call through the binding; a virsh call
        # per domain without it); the polls between keep the last answer
        now = self.clock()
        ask = self._vms_at is None or now - self._vms_at >= VM_EVERY
        # the unregistered devices' superblocks (stranded dirty data: the health model's
        # worst findings) are read at libvirt's pace too; the polls between keep them
        stats = (self._stats_at is None or now - self._stats_at >= STATS_EVERY
                 or any(isinstance(s, DetailScreen) for s in list(self.screen_stack)))
        snap = cache_ops.status(self.sysfs, vms=ask, stats=stats, cache=self._scan_cache,
                                probe_unregistered=ask)
        if stats:
            self._stats_at, self._with_stats = now, snap
            self._doctor.update(self.sysfs, snap, now)
        else:
            snap = cache_ops.carry_stats(snap, self._with_stats)
        if ask:
            self._vms_at, self._vms, self._unregistered = now, snap.vms, snap.unregistered
            self._gone = snap.gone
        else:
            # the backing devices gone while dirty too: only a scan that read the superblocks
            # tells gone from stopped (ops.cache.status), so the polls between keep its answer
            snap = dataclasses.replace(snap, vms=self._vms, unregistered=self._unregistered,
                                       gone=self._gone)
        # the rows once, here: the table, the history and the IO counts all use them
        findings = health_ops.findings(snap)
        # the caches a VM's departure marked (procedures/coherence.py; none when the state
        # directory cannot be read: its one line says so)
        left = coherence_ops.left_marks()
        rows = view.rows(snap, findings, left)
        t = self.clock()
        wb = self._wb_meter.update(self.sysfs, snap.backings, t, self._scan_cache)
        # a bcache device's IO count from the stat file the meter has just read
        ios = history.io_counts(self.sysfs, snap, rows, self._wb_meter.completed)
        self.post_message(SnapshotReady(snap, ios, t, findings, rows, wb, left,
                                        self._doctor.causes))

    def _rearm(self) -> None:
        self._polling = False
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_timer(self.interval, self.start_poll)

    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        self.polls += 1
        self.poll_error = None
        self.snap = msg.snap
        self.findings = msg.findings
        self.left = msg.left
        if msg.causes is not None:
            self.causes = msg.causes
        self.rows = msg.rows if msg.rows is not None else view.rows(msg.snap, msg.findings,
                                                                      msg.left)
        self.history.add(msg.t, msg.snap, msg.ios, msg.wb, self.rows)
        d = self.dashboard()
        # no table while the app quits (its screens' widgets go away; a poll can come late)
        table = next(iter(d.query(DeviceTable)), None) if d is not None else None
        if table is not None:
            table.show(self.rows)
            if self.selected_key not in table.keys:
                self.selected_key = table.selected_key
        for s in self.screen_stack:
            if isinstance(s, DetailScreen):
                s.show(msg.snap)
        self.update_panels()
        self._rearm()

    def update_panels(self) -> None:
        d = self.dashboard()
        if d is None or self.snap is None:
            return
        # an idle poll changes nothing on screen: a widget is updated (and laid out again) only
        # when its text changed, the footer's keys only when what they offer changed
        try:
            d.query_one(TrendPanel).show(self.history, self.selected_key)
            for wid, text in (("#summary", self._summary()), ("#banner", self._banner())):
                w = d.query_one(wid, Static)
                if self._shown.get(wid) != (id(w), text):
                    w.update(literal(text))
                    self._shown[wid] = (id(w), text)
        except NoMatches:  # the app is quitting (a poll or progress message came late)
            return
        offered = (id(self.screen), self.read_only, tuple(
            self.check_action(b.action.split("(")[0], ())
            for b in self.BINDINGS if isinstance(b, Binding)))
        if offered != self._offered:
            self._offered = offered
            self.refresh_bindings()

    def _banner(self) -> str:
        snap = self.snap
        bits: list[str] = []
        if self.read_only:
            bits.append("READ-ONLY (not root): actions disabled.")
        if self.poll_error:
            bits.append(f"poll failed: {self.poll_error}")
        if snap is not None:
            if not snap.bcache_loaded:
                bits.append("bcache module not loaded.")
            if not self.rows:
                bits.append("No caches on this host (c: create one).")
            md = view.most_dirty(snap)
            if md:
                r = next(r for r in self.rows if r.key == md)
                bits.append(f"most dirty: {r.device.lstrip('├└ ')} {r.dirty} (g)")
            if self.findings:  # the health model's, worst first (what cachemgr check says)
                f, n = self.findings[0], len(self.findings)
                bits.append(f"! {f.level.name} {f.device}: {f.what}"
                            + (f" (+{n - 1})" if n > 1 else "") + " (enter on a red row: "
                            "what to do)")
            bits += [f"! {w}" for w in snap.warnings]
            if self.left:  # copies of a disk a VM took elsewhere (i: invalidate)
                bits.append(f"! {len(self.left)} cache(s) hold copies of a disk a VM took "
                            f"elsewhere: {', '.join(d for d, _, _ in self.left[:2])}"
                            + (f" (+{len(self.left) - 2})" if len(self.left) > 2 else "")
                            + " (i on its row: invalidate)")
            owned = [f"{r.owner} {r.device.lstrip('├└ ')} {view.owner_short(o)}"
                     for r in self.rows if r.owner
                     for o in [cache_ops.owner_of(snap, view.find(snap, r.key))] if o]
            if owned:
                bits.append(", ".join(owned[:3]) + (f" (+{len(owned) - 3})"
                                                    if len(owned) > 3 else "") + " (enter)")
            if snap.vms is not None:
                warned = [f"{v.name} {d.target}" for v in snap.vms.vms for d in v.disks
                          if d.warnings]
                if warned:
                    bits.append(f"! VM disk cache-mode warnings: {', '.join(warned[:3])}"
                                + (f" (+{len(warned) - 3})" if len(warned) > 3 else "")
                                + " (enter on their cache)")
        running = [o for o in self.ops.values() if o.last_line]
        # the keys first: the banner is two lines at most, and what does not fit is cut at
        # its end, never "q quit" (a running drain's line is long)
        keys = f"refresh {self.interval:g}s (+/-)  q quit"
        return "  ".join([keys, *(f"» {o.last_line}" for o in running), *bits])

    def _summary(self) -> str:
        r = self.selected_row()
        if r is None:
            return "nothing selected"
        kind = view.KIND_WORDS[r.kind]
        name = r.target[:8] if r.kind == view.CSET else r.target
        line2 = {view.BCACHE: f"on {r.disk}", view.CSET: f"SSD {r.disk}",
                 view.GONE: f"was {r.disk}, dirty {r.dirty}"}.get(r.kind, f"origin {r.disk}")
        line3 = f"{r.mode} {r.state}" if r.kind != view.CSET else f"used {r.used} err {r.errors}"
        return f"{kind} {name}\n{line2}\n{line3}"

    # ------------------------------------------------------------------ selection

    def select(self, key: str) -> None:
        if key != self.selected_key:
            self.selected_key = key
            self.update_panels()

    def selected_row(self) -> view.Row | None:
        return next((r for r in self.rows if r.key == self.selected_key), None)

    def selected(self) -> tuple[view.Row, Obj] | None:
        r = self.selected_row()
        if r is None or self.snap is None:
            return None
        obj = view.find(self.snap, r.key)
        return (r, obj) if obj is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        own = WRITE_ACTIONS | actions.DEVICE_ACTIONS | {"most_dirty", "refresh", "interval",
                                                        "toggle_log", "help", "operations",
                                                        "sizing"}
        if isinstance(self.screen, ModalScreen) and action in own:
            return False  # a dialog is open: its keys only (Tab, Escape, ... still work)
        if (action in WRITE_ACTIONS or action in actions.DEVICE_ACTIONS) and not isinstance(
                self.screen, DashboardScreen | DetailScreen):
            return False
        if action in WRITE_ACTIONS and self.read_only:
            return None
        if action in actions.DEVICE_ACTIONS and not actions.offers(self, action):
            return None  # nothing selected, or its kind does not offer it now
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            name = binding.action.split("(")[0]
            if self.check_action(name, ()) is not True or name == "quit":
                continue
            yield SystemCommand(f"{binding.description} ({binding.key_display or binding.key})",
                                f"cachemgr: {binding.description.lower()}",
                                partial(self.run_action, binding.action))

    # ------------------------------------------------------------------ simple actions

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_refresh(self) -> None:
        self.start_poll()

    def action_interval(self, step: int) -> None:
        i = min(range(len(self.INTERVALS)), key=lambda k: abs(self.INTERVALS[k] - self.interval))
        self.interval = self.INTERVALS[max(0, min(len(self.INTERVALS) - 1, i + step))]
        self.log_line(f"refresh every {self.interval:g} s")
        self.update_panels()

    def action_toggle_log(self) -> None:
        d = self.dashboard()
        if d is not None:
            panel = d.query_one(LogPanel)
            panel.display = not panel.display

    def action_most_dirty(self) -> None:
        if self.snap is None:
            return
        key = view.most_dirty(self.snap)
        if key is None:
            self.notify("no device holds dirty data")
            return
        d = self.dashboard()
        if d is not None:
            d.query_one(DeviceTable).select_key(key)
        self.select(key)

    def action_detail(self) -> None:
        if self.selected_key:
            self.push_screen(DetailScreen(self.selected_key))

    # ------------------------------------------------------------------ operations

    def start_op(self, title: str, fn: Callable[[Control], Result], *,
                 progress: bool = False, cancellable: bool = True, cancel_note: str = "",
                 on_done: Callable[[Result], None] | None = None) -> Op:
        """Run ``fn`` in a thread worker; progress (if any) in a dialog that can cancel or
        hide; the result or the error is shown and logged by the one handler."""
        op_id = self._next_op
        self._next_op += 1

        def report(p: object) -> None:
            frac = getattr(p, "fraction", None)
            eta = getattr(p, "eta_s", None)
            self.post_message(OpProgress(op_id, progress_line(p), frac, eta))

        op = Op(op_id, title, Control(progress=report, what=title), on_done)
        self.ops[op_id] = op
        self.log_line(f"▶ {title}")
        if progress:
            op.progress = (cancellable, cancel_note)
            self._show_progress(op)
        op.worker = self._run_op(op, fn)
        return op

    def _show_progress(self, op: Op) -> None:
        assert op.progress is not None
        op.dialog = ProgressDialog(op.id, op.title, *op.progress,
                                   line=op.last_line or "starting...")
        self.push_screen(op.dialog, lambda r: self._progress_closed(op, r))

    def action_operations(self) -> None:
        """Show again the progress of an operation hidden in the background (Escape on its
        dialog), where it can be cancelled; with several, pick one."""
        hidden = [op for op in self.ops.values() if op.progress and op.dialog is None]
        if not hidden:
            self.notify("no operation is running in the background")
            return
        if len(hidden) == 1:
            self._show_progress(hidden[0])
            return

        def picked(op_id: str | None) -> None:
            op = self.ops.get(int(op_id)) if op_id else None
            if op is not None and op.dialog is None:
                self._show_progress(op)

        self.push_screen(ChoiceDialog(
            "Operations in the background",
            [(str(op.id), f"{op.title}: {op.last_line or 'starting...'}") for op in hidden]),
            picked)

    @work(thread=True, exit_on_error=False, group="ops")
    def _run_op(self, op: Op, fn: Callable[[Control], Result]) -> Result:
        # a cancel stops the programs it runs that may be stopped (fio) and its waits, not
        # only its next progress report: quitting does not wait out a benchmark's run
        with cancel.scope(op.ctl.cancel):
            return fn(op.ctl)

    def _progress_closed(self, op: Op, result: str | None) -> None:
        op.dialog = None
        if result == "cancel":
            op.ctl.cancel.set()
            self.log_line(f"cancelling {op.title}...")
        elif result == "hide" and op.id in self.ops:
            self.notify(f"{op.title} goes on in the background")

    def on_op_progress(self, msg: OpProgress) -> None:
        op = self.ops.get(msg.op_id)
        if op is None:
            return
        op.last_line = msg.line
        if op.dialog is not None and op.dialog.is_attached:
            op.dialog.update_progress(msg.line, msg.fraction, msg.eta_s)
        elif self.snap is not None:
            self.update_panels()

    def on_op_said(self, msg: OpSaid) -> None:
        op = self.ops.get(msg.op_id)
        self.log_line(f"  {msg.line}" if op else msg.line)

    def _finish_op(self, op: Op) -> None:
        self.ops.pop(op.id, None)
        if op.dialog is not None and op.dialog.is_attached and self.screen is op.dialog:
            op.dialog.dismiss(None)
        op.dialog = None
        if self._quitting and not self.ops:
            self._end(self._quit_code)
            return
        self.start_poll()

    def op_done(self, op: Op, outcome: Result) -> None:
        self._finish_op(op)
        lines = outcome.text()
        for line in outcome.notes:
            self.log_line(f"  {line}", "yellow")
        for line in lines:
            self.log_line(f"✓ {line}", "green")
        if outcome.already:
            self.log_line(f"= {op.title}: already so (nothing changed)")
        if not lines and not outcome.notes and not outcome.already:
            self.log_line(f"✓ {op.title}: done", "green")
        text = "\n".join(lines + outcome.notes) or f"{op.title}: done"
        self.notify(text, title=op.title, timeout=6)
        if op.on_done:
            op.on_done(outcome)
        self.post_message(OpFinished(op.id, op.title, True, lines, outcome))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker results and failures are handled."""
        w = event.worker
        if w.group == "poll":
            if event.state == WorkerState.ERROR:
                self.poll_error = str(w.error)
                self.log_line(f"poll failed: {w.error}", "red")
                self._rearm()
                self.update_panels()
            return
        if w.group != "ops" or event.state not in (WorkerState.SUCCESS, WorkerState.ERROR):
            return
        op = self._op_of(w)
        if op is None:
            return
        if event.state == WorkerState.SUCCESS:
            assert isinstance(w.result, Result)
            self.op_done(op, w.result)
        else:
            self.op_failed(op, w.error)

    def _op_of(self, w: Worker[Any]) -> Op | None:
        return next((o for o in self.ops.values() if o.worker is w), None)

    def op_failed(self, op: Op, exc: BaseException | None) -> None:
        self._finish_op(op)
        assert exc is not None
        word = error_word(exc)
        if isinstance(exc, CacheMgrError):
            text = str(exc)  # message and hint, as `cachemgr` prints them
        else:
            text = "".join(traceback.format_exception(exc)).strip()
        style = "yellow" if isinstance(exc, AlreadyError | Cancelled) else "red"
        self.log_line(f"✗ {op.title}: {word}: {text}", style)
        if isinstance(exc, AlreadyError):
            self.notify(text, title=f"{op.title}: already so", timeout=6)
        else:
            self.push_screen(MessageDialog(f"{op.title}: {word}", text, error=True))
        self.post_message(OpFinished(op.id, op.title, False, [text], exc))

    # ------------------------------------------------------------------ device actions

    # the per-kind flows are in tui/actions.py: the dialogs from the selection's kind

    def action_mode(self) -> None:
        actions.mode(self)

    def action_drain(self) -> None:
        actions.drain(self)

    def action_detach(self) -> None:
        actions.detach(self)

    def action_attach(self) -> None:
        actions.attach(self)

    def action_tune(self) -> None:
        actions.tune(self)

    def action_invalidate(self) -> None:
        actions.invalidate(self)

    def action_scrub(self) -> None:
        actions.scrub(self)

    def action_remove(self) -> None:
        actions.remove(self)

    def action_create(self) -> None:
        actions.create(self)

    def action_replace(self) -> None:
        actions.replace(self)

    def action_sizing(self) -> None:
        """Cache sizing from a trace file: reads a file, changes nothing (read-only too)."""
        from tui.screens.sizing import SizingScreen

        self.push_screen(SizingScreen())

    def action_bench(self) -> None:
        actions.bench(self)

    def action_warm(self) -> None:
        actions.warm(self)

    def on_unmount(self) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in self._signals:
                loop.remove_signal_handler(sig)
        """Quitting while operations run cancels them, as their Cancel button does (the
        library puts back what it changed at its next progress report; a prompt waiting for
        the operator gives up): otherwise the process could not end until they finished, or
        never, for a prompt nobody can answer any more."""
        for op in list(self.ops.values()):
            op.ctl.cancel.set()

    # ------------------------------------------------------------------ thread helpers

    def ask_from_thread(self, screen: ModalScreen[Any], cancel: threading.Event) -> Any:
        """From a worker thread: show ``screen`` and wait for its answer (operator prompts).
        Raises Cancelled when the operation is cancelled meanwhile."""
        done = threading.Event()
        box: list[Any] = []

        def answered(result: Any) -> None:
            box.append(result)
            done.set()

        self.call_from_thread(self.push_screen, screen, answered)
        while not done.wait(0.2):
            if cancel.is_set():
                raise Cancelled("cancelled while waiting for the operator")
        return box[0]


def main(argv: list[str] | None = None) -> int:
    """``cachemgr-tui``: the same as ``cachemgr tui``."""
    p = argparse.ArgumentParser(prog="cachemgr-tui", description="cachemgr's dashboard")
    p.add_argument("--version", action="version", version=f"cachemgr {version()}")
    p.add_argument("--interval", type=checks.argtype("seconds", above=0), default=1.0,
                   metavar="S", help="refresh interval in seconds (default 1)")
    p.add_argument("--sysfs-root", default=os.environ.get("CACHEMGR_SYSFS", DEFAULT_ROOT),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return run(args.sysfs_root, args.interval)


def run(sysfs_root: str = DEFAULT_ROOT, interval: float = 1.0) -> int:
    app = CacheMgrApp(sysfs_root, interval)
    app.run()
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
