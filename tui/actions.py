"""The device actions of the dashboard and the detail view: each builds its dialogs from the
selected object's cache kind (``cachemgr.ops.cache.kind_of``: its modes, tunables, words and
buttons) and calls the command layer. Nothing here branches on a kind: a new kind's rows get
the actions it offers, in its own words.

The app keeps the bindings, the polling and the dispatch (``CacheMgrApp.action_*`` call these);
the operations run through ``CacheMgrApp.start_op`` (thread workers, progress, the one error
handler)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeVar

from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen

from cachemgr.core.model import CacheMode, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control, Plan, Result
from tui import view
from tui.dialogs import when
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog
from tui.dialogs.form import FormDialog

R = TypeVar("R")


class Host(Protocol):
    """What these actions use of the app (tui/app.py's CacheMgrApp, which calls them): a
    protocol here, so the actions stay below the app that dispatches to them."""

    sysfs: Sysfs
    snap: Snapshot | None

    def selected(self) -> tuple[view.Row, view.Obj] | None: ...

    def notify(self, message: str, *, severity: SeverityLevel = ...) -> None: ...

    def push_screen(self, screen: Screen[R],
                    callback: Callable[[R | None], None] | None = ...) -> Any: ...

    def start_op(self, title: str, fn: Callable[[Control], Result], *,
                 progress: bool = ..., cancellable: bool = ..., cancel_note: str = ...,
                 on_done: Callable[[Result], None] | None = ...) -> object: ...

    def ask_from_thread(self, screen: ModalScreen[Any], cancel: threading.Event) -> Any: ...

# every action about the selected device (its kind says whether it offers it now)
DEVICE_ACTIONS = frozenset({"mode", "drain", "detach", "attach", "tune", "remove", "replace",
                            "bench", "warm", "detail", "invalidate", "scrub"})


def selected_kind(app: Host) -> tuple[view.Row, cache_ops.Kind] | None:
    """The selected row and its object's kind (None: nothing selected, or no kind owns
    it)."""
    sel = app.selected()
    if sel is None:
        return None
    k = cache_ops.kind_of(sel[1])
    return (sel[0], k) if k is not None else None


def offers(app: Host, action: str) -> bool:
    """Whether the selection's kind offers ``action`` now."""
    sel = selected_kind(app)
    return sel is not None and sel[1].offers(action)


def _target(app: Host) -> tuple[view.Row, cache_ops.Kind] | None:
    sel = selected_kind(app)
    if sel is None:
        app.notify("select a device first", severity="warning")
    return sel


def mode(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    r, k = sel
    current = r.mode
    choices = [(m.value, m.value + ("  (current)" if m.value == current else ""))
               for m in k.modes]

    def explain(m: str) -> str:
        return k.dirty_consequence(CacheMode(m))

    def chosen(m: str | None) -> None:
        if not m:
            return
        asked = k.mode_words(r.target, current, CacheMode(m))
        app.push_screen(ConfirmDialog(f"Cache mode of {r.target}", asked.body,
                                      list(asked.buttons)),
                        lambda b: _do_mode(app, r.target, m, b, asked.cancel_note))

    app.push_screen(ChoiceDialog(f"Cache mode of {r.target} (now {current})", choices,
                                 explain=explain, current=current), chosen)


def _do_mode(app: Host, target: str, mode_word: str, button: str | None,
             cancel_note: str) -> None:
    if button is None:
        return
    drain = button == "drain"
    app.start_op(f"mode {target} {mode_word}" + (" --drain" if drain else ""),
                 lambda ctl: cache_ops.mode(app.sysfs, target, mode_word, drain=drain, ctl=ctl),
                 progress=drain, cancel_note=cancel_note)


def drain(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    r, k = sel
    asked = k.drain_words(r.target, r.dirty, view.disk_words(r))
    app.push_screen(ConfirmDialog(f"Drain {r.target}", asked.body, list(asked.buttons)),
                    when(lambda b: app.start_op(
                        f"drain {r.target}",
                        lambda ctl: cache_ops.drain(app.sysfs, r.target, ctl=ctl),
                        progress=True, cancel_note=asked.cancel_note)))


def detach(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    r, k = sel
    asked = k.detach_words(r.target, r.dirty)
    if asked is None:
        return
    app.push_screen(ConfirmDialog(f"Detach {r.target}", asked.body, list(asked.buttons)),
                    when(lambda x: app.start_op(
                        f"detach {r.target}",
                        lambda ctl: cache_ops.detach(app.sysfs, r.target, ctl=ctl),
                        progress=True, cancel_note=asked.cancel_note)))


def attach(app: Host) -> None:
    sel = _target(app)
    if sel is None or app.snap is None:
        return
    _, k = sel
    question, choices, empty = k.attach_choices(app.snap)

    def go(choice: str) -> None:
        dev, cache = k.attach_pair(choice)
        app.start_op(f"attach {dev} {cache[:8]}",
                     lambda ctl: cache_ops.attach(app.sysfs, dev, cache))

    app.push_screen(ChoiceDialog(question, choices, empty=empty), when(go))


def tune(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    r, k = sel
    choices = [(n, f"{n} = {k.tunable(n)}  ({lo}..{hi})")
               for n, (lo, hi) in k.tunables().items()]

    def picked(name: str | None) -> None:
        if not name:
            return
        now = k.tunable(name)
        app.push_screen(
            FormDialog(f"Tune {r.target}: {name}",
                       [("value", f"{name} (now {now})", now, "an integer")]),
            when(lambda v: app.start_op(
                f"tune {r.target} {name}={v['value']}",
                lambda ctl: cache_ops.tune(app.sysfs, r.target, [f"{name}={v['value']}"]))))

    app.push_screen(ChoiceDialog(f"Tune {r.target}", choices), picked)


def remove(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    r, k = sel
    asked = k.remove_words(r.target, r.dirty, view.disk_words(r))
    if asked is None:
        return

    def go(b: str | None) -> None:
        if not b:
            return
        keep = b == "keep"
        app.start_op(f"remove {r.target}" + (" --keep-device" if keep else ""),
                     lambda ctl: cache_ops.remove(app.sysfs, r.target, keep_device=keep,
                                                  ctl=ctl),
                     progress=k.cached_device, cancel_note=asked.cancel_note)

    app.push_screen(ConfirmDialog(f"Remove {r.target}", asked.body, list(asked.buttons)), go)


def invalidate(app: Host) -> None:
    """Drop the copies the selected device's cache holds (cachemgr invalidate). The command
    layer makes every check first (a writeback or dirty cache refused, exit 3; a device
    owned by another procedure; nothing cached: already so) and then puts its question: the
    plan the command line shows before ``Go ahead? [y/N]``, word for word, in a dialog whose
    Cancel has the focus; no answer but the button is a yes (as the CLI's refusal without
    ``--yes``: exit 3, nothing changed)."""
    sel = _target(app)
    if sel is None:
        return
    target = sel[0].target
    from cachemgr.ops import coherence as coherence_ops

    def fn(ctl: Control) -> Result:
        ctl.confirm = partial(_ask_plan, app, ctl)
        return coherence_ops.invalidate(app.sysfs, target, ctl=ctl)

    app.start_op(f"invalidate {target}", fn)


SCRUB_NOTE = ("Cancel stops the comparison: nothing is dropped or recorded (scrub again to "
              "compare).")


def scrub(app: Host) -> None:
    """Compare what the selected device's cache serves with its origin (cachemgr scrub),
    paced (the weekly timer's bound): the command layer's refusals first, in the command
    line's words (a writeback or dirty cache, exit 3; a passthrough one, exit 4), then its
    plan as the question (Cancel has the focus), then the reads with progress
    (cancellable)."""
    sel = _target(app)
    if sel is None:
        return
    target = sel[0].target
    from cachemgr.ops import scrub as scrub_ops

    def fn(ctl: Control) -> Result:
        ctl.confirm = partial(_ask_plan, app, ctl)
        return scrub_ops.scrub(app.sysfs, target, ctl=ctl,
                               max_latency_ms=scrub_ops.DEFAULT_MAX_LATENCY_MS)

    app.start_op(f"scrub {target}", fn, progress=True, cancel_note=SCRUB_NOTE)


def _ask_plan(app: Host, ctl: Control, plan: Plan) -> bool:
    """From the operation's worker: the command layer's plan as a confirmation dialog (the
    CLI's words: "cachemgr COMMAND (nothing is changed yet):" and each line); True on its
    one button."""
    body = "\n".join(plan.lines)
    answer = app.ask_from_thread(ConfirmDialog(
        f"cachemgr {plan.command} (nothing is changed yet):", body,
        [("go", plan.command.split()[0].capitalize(), "error")]), ctl.cancel)
    return bool(answer == "go")


def replace(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    cache = sel[1].cache_name
    if not cache:
        return
    from cachemgr.ops import replace as replace_ops
    from tui.screens.replace import ReplaceScreen

    app.push_screen(ReplaceScreen(cache, replace_ops.kind_for(cache, app.sysfs, app.snap)))


def bench(app: Host) -> None:
    sel = _target(app)
    if sel is None:
        return
    k = sel[1]
    from tui.screens.bench import BenchScreen

    app.push_screen(BenchScreen(k.bench_target, is_bcache=k.bench_hygiene))


WARM_NOTE = ("Cancel stops the reads and puts back every setting warm changed for them; the "
             "blocks already read stay in the cache.")


def warm(app: Host) -> None:
    """Warm the selected device's cache from a trace (cachemgr warm): a form for the trace
    file and how much to read, a confirmation, then the reads with progress (cancellable:
    what warm changed is put back). The trace and the size are checked by the command
    layer, whose refusal is shown in its own words."""
    sel = _target(app)
    if sel is None:
        return
    target = sel[0].target
    from cachemgr.ops import warm as warm_ops  # when first used, as replace's screen

    def confirm(v: dict[str, str] | None) -> None:
        if not v:
            return
        size = v["bytes"] or "the cache's capacity"
        body = (f"Read the blocks the trace {v['trace'] or '(none given)'} found hottest, "
                f"hottest first, through the cache of {target}, up to {size}: one request "
                "at a time in the idle IO class, none while the slow disk serves other IO "
                "(at most 0.5 s, then one goes anyway), so the VMs' IO goes first. Nothing is "
                "written to the device. A setting the cache needs for the reads to be cached "
                "is journaled first and put back at the end. The trace and the size are "
                "checked first: a trace of another device, or a size over the cache's "
                "capacity, is refused and nothing is read.")
        app.push_screen(ConfirmDialog(f"Warm {target}", body, [("go", "Warm", "primary")]),
                        when(lambda b: app.start_op(
                            f"warm {target}",
                            lambda ctl: warm_ops.warm(app.sysfs, target, v["trace"],
                                                      nbytes=_size(v["bytes"]), ctl=ctl),
                            progress=True, cancel_note=WARM_NOTE)))

    app.push_screen(FormDialog(
        f"Warm the cache of {target}",
        [("trace", "trace file (cachemgr trace of this device, best at --rate 1)", "",
          "/var/tmp/host.trace"),
         ("bytes", "read at most (empty: the cache's capacity)", "", "e.g. 20G")],
        ok_label="Next"), confirm)


def _size(text: str) -> int | None:
    """The form's size (empty: None, the capacity); a bad one is refused as the CLI's
    --bytes is (exit 2's words, in the operation's error dialog)."""
    from cachemgr.core.errors import UsageError
    from cachemgr.core.model import parse_size

    if not text:
        return None
    n = parse_size(text)
    if n <= 0:
        raise UsageError(f"a size is more than 0, not {text!r}")
    return n


def create(app: Host) -> None:
    """Create a bcache or dm-cache device: a form per kind, then a confirmation."""

    def kind(k: str | None) -> None:
        if k == "bcache":
            app.push_screen(FormDialog(
                "Create bcache (make-bcache, register, attach)",
                [("backing", "backing device(s), space-separated", "", "/dev/sdX"),
                 ("cache", "cache device (SSD)", "", "/dev/sdY"),
                 ("mode", "mode", "", "writethrough|writeback|writearound|none"),
                 ("bucket", "bucket size", "", "e.g. 128k for small SSDs")],
                checks=[("force", "format even over an existing signature (wipes it)")],
                ok_label="Next"), partial(_confirm_create_bcache, app))
        elif k == "dm-cache":
            app.push_screen(FormDialog(
                "Create dm-cache (origin data kept)",
                [("name", "dm name", "", "vmcache"),
                 ("origin", "origin (slow device, data kept)", "", "/dev/sdX"),
                 ("cache", "cache device", "", "/dev/sdY"),
                 ("metadata", "metadata device", "", "/dev/sdZ"),
                 ("mode", "mode", "writeback", "writeback|writethrough|passthrough"),
                 ("block_size", "block size", "", "multiple of 32k; default 64k")],
                checks=[("force", "overwrite even over an existing signature")],
                ok_label="Next"), partial(_confirm_create_dm, app))

    app.push_screen(ChoiceDialog("Create a cache", [("bcache", "bcache"),
                                                    ("dm-cache", "dm-cache")]), kind)


def _confirm_create_bcache(app: Host, v: dict[str, str] | None) -> None:
    if not v:
        return
    backings = v["backing"].split()
    devs = " ".join(backings + ([v["cache"]] if v["cache"] else []))
    body = (f"Format {devs or '(nothing)'} with make-bcache: whatever is on them is lost. "
            "Busy devices are refused; devices with a signature are refused unless "
            "'force' is ticked.")
    app.push_screen(ConfirmDialog("Create bcache", body, [("go", "Format", "error")]),
                    when(lambda b: app.start_op(
                        f"create bcache {devs}",
                        lambda ctl: cache_ops.create_bcache(
                            app.sysfs, backings=backings, cache=v["cache"] or None,
                            mode=v["mode"] or None, bucket=v["bucket"] or None,
                            force=bool(v["force"])))))


def _confirm_create_dm(app: Host, v: dict[str, str] | None) -> None:
    if not v:
        return
    body = (f"Create /dev/mapper/{v['name']} over {v['origin']} (its data is kept). The "
            f"contents of {v['cache']} and {v['metadata']} are overwritten.")
    app.push_screen(ConfirmDialog("Create dm-cache", body, [("go", "Create", "error")]),
                    when(lambda b: app.start_op(
                        f"create dm-cache {v['name']}",
                        lambda ctl: cache_ops.create_dmcache(
                            app.sysfs, name=v["name"], origin=v["origin"],
                            cache=v["cache"], metadata=v["metadata"],
                            mode=v["mode"] or None, block_size=v["block_size"] or None,
                            force=bool(v["force"])))))
