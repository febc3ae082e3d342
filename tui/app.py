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
import dataclasses
import os
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

from cachemgr.core import checks
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    Cancelled,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import (
    BcacheBacking,
    CacheMode,
    CacheSet,
    DmCacheDevice,
    DmWritecacheDevice,
    Snapshot,
    VmScan,
)
from cachemgr.core.sysfs import DEFAULT_ROOT, Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control, Result, progress_line
from tui import history, view
from tui.dialogs import when
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.dialogs.form import FormDialog
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
                 "bench"}
# actions about the selected device, and the kinds they apply to
DEVICE_ACTIONS: dict[str, set[str]] = {
    "mode": {view.BCACHE, view.DM},
    "drain": {view.BCACHE, view.DM, view.WC},
    "detach": {view.BCACHE, view.DM, view.WC},
    "attach": {view.BCACHE, view.CSET},
    "tune": {view.BCACHE, view.CSET, view.DM, view.WC},
    "remove": {view.BCACHE, view.CSET, view.DM, view.WC},
    "replace": {view.CSET, view.BCACHE, view.DM, view.WC},
    "bench": {view.BCACHE, view.DM, view.WC},
    "detail": {view.BCACHE, view.CSET, view.DM, view.WC},
}
# actions on a dm device that only an LVM-owned one has (lvm2 splits, rebuilds and tunes
# it; a dmsetup-made writecache is shown, not run); a plain dm-cache's SSD is replaced by
# replace-ssd's dm-cache kind
LVM_ONLY = {view.DM: {"detach"},
            view.WC: {"drain", "detach", "tune", "remove", "replace"}}
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
        self._vms_at: float | None = None  # when libvirt was last asked (poll worker only)
        self._vms: VmScan | None = None
        self._poll_timer: Any = None
        # poll worker only: identities and the like kept until a uevent (ScanCache), the last
        # snapshot with every stats interval and when it was taken
        self._scan_cache = cache_ops.ScanCache()
        self._stats_at: float | None = None
        self._with_stats: Snapshot | None = None
        self.polls = 0
        self.poll_error: str | None = None
        self.log_history: list[str] = []

    # ------------------------------------------------------------------ screens & layout

    def get_default_screen(self) -> Screen[Any]:
        return DashboardScreen()

    def on_mount(self) -> None:
        self.sub_title = self._subtitle()

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
        # libvirt is asked every VM_EVERY seconds (a virsh call per domain); the polls between
        # keep the last answer
        now = self.clock()
        ask = self._vms_at is None or now - self._vms_at >= VM_EVERY
        stats = (self._stats_at is None or now - self._stats_at >= STATS_EVERY
                 or any(isinstance(s, DetailScreen) for s in list(self.screen_stack)))
        snap = cache_ops.status(self.sysfs, vms=ask, stats=stats, cache=self._scan_cache)
        if stats:
            self._stats_at, self._with_stats = now, snap
        else:
            snap = cache_ops.carry_stats(snap, self._with_stats)
        if ask:
            self._vms_at, self._vms = now, snap.vms
        elif self._vms is not None:
            snap = dataclasses.replace(snap, vms=self._vms)
        ios = history.io_counts(self.sysfs, snap)
        self.post_message(SnapshotReady(snap, ios, self.clock()))

    def _rearm(self) -> None:
        self._polling = False
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_timer(self.interval, self.start_poll)

    def on_snapshot_ready(self, msg: SnapshotReady) -> None:
        self.polls += 1
        self.poll_error = None
        self.snap = msg.snap
        self.history.add(msg.t, msg.snap, msg.ios)
        self.rows = view.rows(msg.snap)
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
        try:
            d.query_one(TrendPanel).show(self.history, self.selected_key)
            d.query_one("#summary", Static).update(literal(self._summary()))
            d.query_one("#banner", Static).update(literal(self._banner()))
        except NoMatches:  # the app is quitting (a poll or progress message came late)
            return
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
            bits += [f"! {w}" for w in snap.warnings]
            if snap.vms is not None:
                warned = [f"{v.name} {d.target}" for v in snap.vms.vms for d in v.disks
                          if d.warnings]
                if warned:
                    bits.append(f"! VM disk cache-mode warnings: {', '.join(warned[:3])}"
                                + (f" (+{len(warned) - 3})" if len(warned) > 3 else "")
                                + " (enter on their cache)")
        running = [o for o in self.ops.values() if o.last_line]
        bits += [f"» {o.last_line}" for o in running]
        bits.append(f"refresh {self.interval:g}s (+/-)  q quit")
        return "  ".join(bits)

    def _summary(self) -> str:
        r = self.selected_row()
        if r is None:
            return "nothing selected"
        kind = view.KIND_WORDS[r.kind]
        name = r.target[:8] if r.kind == view.CSET else r.target
        line2 = {view.BCACHE: f"on {r.disk}", view.CSET: f"SSD {r.disk}"}.get(
            r.kind, f"origin {r.disk}")
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
        own = WRITE_ACTIONS | set(DEVICE_ACTIONS) | {"most_dirty", "refresh", "interval",
                                                     "toggle_log", "help", "operations",
                                                     "sizing"}
        if isinstance(self.screen, ModalScreen) and action in own:
            return False  # a dialog is open: its keys only (Tab, Escape, ... still work)
        if (action in WRITE_ACTIONS or action in DEVICE_ACTIONS) and not isinstance(
                self.screen, DashboardScreen | DetailScreen):
            return False
        if action in WRITE_ACTIONS and self.read_only:
            return None
        kinds = DEVICE_ACTIONS.get(action)
        if kinds is not None:
            sel = self.selected()
            if sel is None or sel[0].kind not in kinds:
                return None
            obj = sel[1]
            if action in LVM_ONLY.get(sel[0].kind, ()) and getattr(obj, "lvm", None) is None:
                return None
            if action == "detach" and isinstance(obj, BcacheBacking) and not obj.cset_uuid:
                return None
            if action == "attach" and isinstance(obj, BcacheBacking) and obj.cset_uuid:
                return None
            if action == "replace" and isinstance(obj, BcacheBacking) and not obj.cset_uuid:
                return None
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

    def _target(self) -> tuple[view.Row, Obj] | None:
        sel = self.selected()
        if sel is None:
            self.notify("select a device first", severity="warning")
        return sel

    def action_mode(self) -> None:
        sel = self._target()
        if sel is None:
            return
        r, obj = sel
        if isinstance(obj, DmCacheDevice):
            modes = [CacheMode.WRITEBACK, CacheMode.WRITETHROUGH, CacheMode.PASSTHROUGH]
        else:
            modes = [CacheMode.WRITETHROUGH, CacheMode.WRITEBACK, CacheMode.WRITEAROUND,
                     CacheMode.NONE]
        current = r.mode
        choices = [(m.value, m.value + ("  (current)" if m.value == current else ""))
                   for m in modes]

        def explain(m: str) -> str:
            return cache_ops.dirty_consequence(obj, CacheMode(m))

        def chosen(mode: str | None) -> None:
            if not mode:
                return
            body = (f"Switch {r.target} from {current} to {mode}.\n\n{explain(mode)}\n\n"
                    "Switch + drain also writes every dirty block back now (cachemgr mode "
                    "--drain), with progress.")
            self.push_screen(
                ConfirmDialog(f"Cache mode of {r.target}", body,
                              [("switch", f"Switch to {mode}", "primary"),
                               ("drain", "Switch + drain", "warning")]),
                lambda b: self._do_mode(r.target, mode, b))

        self.push_screen(ChoiceDialog(f"Cache mode of {r.target} (now {current})", choices,
                                      explain=explain, current=current), chosen)

    def _do_mode(self, target: str, mode: str, button: str | None) -> None:
        if button is None:
            return
        drain = button == "drain"
        self.start_op(f"mode {target} {mode}" + (" --drain" if drain else ""),
                      lambda ctl: cache_ops.mode(self.sysfs, target, mode, drain=drain, ctl=ctl),
                      progress=drain, cancel_note=self._drain_cancel_note(target))

    @staticmethod
    def _drain_cancel_note(target: str) -> str:
        return ("Cancel stops the drain at its next poll; the tunables it changed are "
                "restored and the dirty data stays safe in the cache.")

    def action_drain(self) -> None:
        sel = self._target()
        if sel is None:
            return
        r, obj = sel
        if isinstance(obj, DmWritecacheDevice):
            how = ("cachemgr sets lvm2's cleaner=1 (lvchange --cachesettings) until every "
                   "block is written back, then cleaner=0; on cancel or error too.")
        elif isinstance(obj, DmCacheDevice) and obj.lvm is not None:
            how = ("cachemgr loads lvm2's cleaner policy (lvchange --cachepolicy cleaner: "
                   "writethrough while it drains) until every block is clean, then puts "
                   f"the {obj.lvm.policy or 'original'} policy back; on cancel or error too.")
        elif isinstance(obj, DmCacheDevice):
            how = ("cachemgr loads the cleaner policy (in writethrough) until every block is "
                   "clean, then reloads the original table; on cancel or error the original "
                   "table is put back.")
        else:
            how = ("cachemgr sets writeback_percent=0, writeback_delay=1 and "
                   "writeback_running=1 (saved first) and puts every value back at the end, "
                   "on error and on cancel.")
        body = (f"Drain {r.target}: write its {r.dirty} of dirty data back to {r.disk} as fast "
                f"as that device allows, with progress and ETA.\n\n{how}")
        self.push_screen(ConfirmDialog(f"Drain {r.target}", body, [("go", "Drain", "primary")]),
                         when(lambda b: self._do_drain(r.target)))

    def _do_drain(self, target: str) -> None:
        self.start_op(f"drain {target}", lambda ctl: cache_ops.drain(self.sysfs, target, ctl=ctl),
                      progress=True, cancel_note=self._drain_cancel_note(target))

    def action_detach(self) -> None:
        sel = self._target()
        if sel is None:
            return
        r, b = sel
        if isinstance(b, DmCacheDevice | DmWritecacheDevice) and b.lvm is not None:
            body = (f"Detach the cache {b.lvm.vg}/{b.lvm.pool_name} from {r.target}.\n\n"
                    f"cachemgr drains its {r.dirty} of dirty data through lvm2's cleaner "
                    "(with progress), then runs lvconvert --splitcache: the LV goes on "
                    "uncached, the cache pool or cachevol is kept for a later attach.")
            note = ("Cancel stops the drain at its next poll; the policy is put back and the "
                    "cache stays attached.")
        elif isinstance(b, BcacheBacking):
            body = (f"Detach {r.target} from cache set {b.cset_uuid}.\n\nbcache writes its "
                    f"{r.dirty} of dirty data back first, then the state reads 'no cache'; "
                    f"{r.target} stays up without a cache (passthrough).")
            note = "Cancel stops waiting; the kernel finishes the detach by itself."
        else:
            return
        self.push_screen(ConfirmDialog(f"Detach {r.target}", body,
                                       [("go", "Detach", "warning")]),
                         when(lambda x: self.start_op(
                             f"detach {r.target}",
                             lambda ctl: cache_ops.detach(self.sysfs, r.target, ctl=ctl),
                             progress=True, cancel_note=note)))

    def action_attach(self) -> None:
        sel = self._target()
        if sel is None or self.snap is None:
            return
        r, obj = sel
        snap = self.snap
        if isinstance(obj, BcacheBacking):
            choices = [(c.uuid, f"{c.uuid[:8]}  SSD {','.join(x.identity.node for x in c.caches)}"
                        f"  {len(c.backing_names)} backing") for c in snap.cache_sets]
            self.push_screen(
                ChoiceDialog(f"Attach {r.target} to which cache set?", choices,
                             empty="no cache set is registered"),
                when(lambda c: self.start_op(
                    f"attach {r.target} {c[:8]}",
                    lambda ctl: cache_ops.attach(self.sysfs, r.target, c))))
        elif isinstance(obj, CacheSet):
            free = [b for b in snap.backings if b.cset_uuid is None]
            choices = [(b.device or b.identity.node,
                        f"{b.device or '-'}  on {b.identity.node}  {b.state.value}")
                       for b in free]
            self.push_screen(
                ChoiceDialog(f"Attach which backing device to {obj.uuid[:8]}?", choices,
                             empty="no detached backing device"),
                when(lambda t: self.start_op(
                    f"attach {t} {obj.uuid[:8]}",
                    lambda ctl: cache_ops.attach(self.sysfs, t, obj.uuid))))

    def action_tune(self) -> None:
        sel = self._target()
        if sel is None:
            return
        r, obj = sel
        names = cache_ops.tunables_of(obj)

        def current(name: str) -> str:
            if isinstance(obj, DmCacheDevice | DmWritecacheDevice) and obj.lvm is not None \
                    and obj.lvm.setting(name) is not None:
                return str(obj.lvm.setting(name))
            if isinstance(obj, DmWritecacheDevice):
                return obj.table.settings().get(name, "default")
            if isinstance(obj, DmCacheDevice):
                return str(obj.status.migration_threshold if obj.status else "?")
            v = getattr(obj, name, None)
            if v is None:
                return "?"
            if isinstance(v, bool):
                return str(int(v))
            return str(v.low if hasattr(v, "low") else v)

        choices = [(n, f"{n} = {current(n)}  ({lo}..{hi})") for n, (lo, hi) in names.items()]

        def picked(name: str | None) -> None:
            if not name:
                return
            self.push_screen(
                FormDialog(f"Tune {r.target}: {name}",
                           [("value", f"{name} (now {current(name)})", current(name),
                             "an integer")]),
                when(lambda v: self.start_op(
                    f"tune {r.target} {name}={v['value']}",
                    lambda ctl: cache_ops.tune(self.sysfs, r.target, [f"{name}={v['value']}"]))))

        self.push_screen(ChoiceDialog(f"Tune {r.target}", choices), picked)

    def action_remove(self) -> None:
        sel = self._target()
        if sel is None:
            return
        r, obj = sel
        if isinstance(obj, BcacheBacking):
            body = (f"Decommission {r.target}: detach it from its cache set (bcache flushes "
                    f"its {r.dirty} of dirty data first), then stop it. {r.target} disappears: "
                    f"whatever uses it loses the disk. The data stays on {r.disk}.")
            buttons = [("go", f"Remove {r.target}", "error")]
        elif isinstance(obj, CacheSet):
            body = (f"Unregister cache set {obj.uuid} (SSD {r.disk}). Refused while backing "
                    "devices are attached or hold dirty data.")
            buttons = [("go", "Unregister", "error")]
        elif isinstance(obj, DmCacheDevice | DmWritecacheDevice) and obj.lvm is not None:
            body = (f"Remove the cache of {r.target}: drain its {r.dirty} of dirty data "
                    f"through lvm2's cleaner (with progress), then lvconvert --uncache: the "
                    f"cache {obj.lvm.vg}/{obj.lvm.pool_name} is deleted, {r.target} goes on "
                    "uncached with every byte on its origin. 'Keep the pool' splits it off "
                    "instead (lvconvert --splitcache).")
            buttons = [("go", "Remove the cache", "error"),
                       ("keep", "Keep the pool (split)", "warning")]
        elif isinstance(obj, DmCacheDevice):
            body = (f"Remove dm-cache {obj.node}: flush every dirty block to {r.disk}, swap "
                    "the table for a linear mapping of the origin, then remove the device. "
                    "'Keep device' leaves it as that linear mapping so its users keep "
                    "running.")
            buttons = [("go", f"Remove {obj.name}", "error"),
                       ("keep", "Keep device (linear)", "warning")]
        else:
            return

        def go(b: str | None) -> None:
            if not b:
                return
            keep = b == "keep"
            self.start_op(f"remove {r.target}" + (" --keep-device" if keep else ""),
                          lambda ctl: cache_ops.remove(self.sysfs, r.target, keep_device=keep,
                                                 ctl=ctl),
                          progress=r.kind != view.CSET,
                          cancel_note="Cancel stops at the next progress report; a flush "
                                      "puts the original table back.")

        self.push_screen(ConfirmDialog(f"Remove {r.target}", body, buttons), go)

    def action_create(self) -> None:
        def kind(k: str | None) -> None:
            if k == "bcache":
                self.push_screen(FormDialog(
                    "Create bcache (make-bcache, register, attach)",
                    [("backing", "backing device(s), space-separated", "", "/dev/sdX"),
                     ("cache", "cache device (SSD)", "", "/dev/sdY"),
                     ("mode", "mode", "", "writethrough|writeback|writearound|none"),
                     ("bucket", "bucket size", "", "e.g. 128k for small SSDs")],
                    checks=[("force", "format even over an existing signature (wipes it)")],
                    ok_label="Next"), self._confirm_create_bcache)
            elif k == "dm-cache":
                self.push_screen(FormDialog(
                    "Create dm-cache (origin data kept)",
                    [("name", "dm name", "", "vmcache"),
                     ("origin", "origin (slow device, data kept)", "", "/dev/sdX"),
                     ("cache", "cache device", "", "/dev/sdY"),
                     ("metadata", "metadata device", "", "/dev/sdZ"),
                     ("mode", "mode", "writeback", "writeback|writethrough|passthrough"),
                     ("block_size", "block size", "", "multiple of 32k; default 64k")],
                    checks=[("force", "overwrite even over an existing signature")],
                    ok_label="Next"), self._confirm_create_dm)

        self.push_screen(ChoiceDialog("Create a cache", [("bcache", "bcache"),
                                                         ("dm-cache", "dm-cache")]), kind)

    def _confirm_create_bcache(self, v: dict[str, str] | None) -> None:
        if not v:
            return
        backings = v["backing"].split()
        devs = " ".join(backings + ([v["cache"]] if v["cache"] else []))
        body = (f"Format {devs or '(nothing)'} with make-bcache: whatever is on them is lost. "
                "Busy devices are refused; devices with a signature are refused unless "
                "'force' is ticked.")
        self.push_screen(ConfirmDialog("Create bcache", body, [("go", "Format", "error")]),
                         when(lambda b: self.start_op(
                             f"create bcache {devs}",
                             lambda ctl: cache_ops.create_bcache(
                                 self.sysfs, backings=backings, cache=v["cache"] or None,
                                 mode=v["mode"] or None, bucket=v["bucket"] or None,
                                 force=bool(v["force"])))))

    def _confirm_create_dm(self, v: dict[str, str] | None) -> None:
        if not v:
            return
        body = (f"Create /dev/mapper/{v['name']} over {v['origin']} (its data is kept). The "
                f"contents of {v['cache']} and {v['metadata']} are overwritten.")
        self.push_screen(ConfirmDialog("Create dm-cache", body, [("go", "Create", "error")]),
                         when(lambda b: self.start_op(
                             f"create dm-cache {v['name']}",
                             lambda ctl: cache_ops.create_dmcache(
                                 self.sysfs, name=v["name"], origin=v["origin"],
                                 cache=v["cache"], metadata=v["metadata"],
                                 mode=v["mode"] or None, block_size=v["block_size"] or None,
                                 force=bool(v["force"])))))

    def action_replace(self) -> None:
        sel = self._target()
        if sel is None:
            return
        _, obj = sel
        uuid = obj.uuid if isinstance(obj, CacheSet) else \
            obj.cset_uuid if isinstance(obj, BcacheBacking) else \
            obj.lvm.full_name if obj.lvm is not None else \
            obj.name if isinstance(obj, DmCacheDevice) else None
        if not uuid:
            return
        from cachemgr.ops import replace as replace_ops
        from tui.screens.replace import ReplaceScreen

        self.push_screen(ReplaceScreen(uuid, replace_ops.kind_for(uuid, self.sysfs)))

    def action_sizing(self) -> None:
        """Cache sizing from a trace file: reads a file, changes nothing (read-only too)."""
        from tui.screens.sizing import SizingScreen

        self.push_screen(SizingScreen())

    def action_bench(self) -> None:
        sel = self._target()
        if sel is None:
            return
        r, obj = sel
        from tui.screens.bench import BenchScreen

        dev = obj.node if isinstance(obj, DmCacheDevice | DmWritecacheDevice) else r.target
        self.push_screen(BenchScreen(dev, is_bcache=isinstance(obj, BcacheBacking)))

    def on_unmount(self) -> None:
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
