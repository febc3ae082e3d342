"""Helpers for the TUI's pilot tests: captures, a copied capture that answers writes the way
the kernel does, and waiting on the app."""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cachemgr.core.errors import SysfsError
from cachemgr.core.sysfs import Sysfs, note_write
from tests.unit.captures import FIXTURES as FIXTURES  # re-exported: tests import it from here
from tests.unit.captures import captures, fx
from tui.app import CacheMgrApp


def unpack(prefix: str, dest: Path) -> Path:
    """A capture stored packed (tests/fixtures/<scenario>-<backend>.tar.xz: the large ones,
    e.g. 64 backing devices) unpacked under ``dest``; returns its sys/ tree."""
    import tarfile

    packed = captures(prefix, ".tar.xz")[0]
    with tarfile.open(packed) as tar:
        tar.extractall(dest)  # trusted: the repository's own capture
    return dest / packed.name.removesuffix(".tar.xz") / "sys"


_UNPACKED: dict[str, Path] = {}


def unpacked(prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed capture unpacked once per test process and shared, READ ONLY, by every module
    that reads it (a test that writes copies it first): the 64-device one is 14,611 files,
    about 3 s of CPU to unpack (20 s of wall on a loaded machine), which five modules paid
    each."""
    if prefix not in _UNPACKED:
        _UNPACKED[prefix] = unpack(prefix, tmp_path_factory.mktemp(f"packed-{prefix}"))
    return _UNPACKED[prefix]


def copy_capture(tmp_path: Path, prefix: str) -> Path:
    """A writable copy of a capture (links kept), named like the original."""
    src = fx(prefix).parent
    dst = tmp_path / src.name
    shutil.copytree(src, dst, symlinks=True)
    return dst / "sys"


def kernel_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Make writes to a copied capture read back as the kernel's would: a choice file
    (cache_mode, a disk's queue/scheduler) shows the written word in brackets (a scheduler
    the list lacks is refused with EINVAL, as by a kernel that cannot load it), other
    attributes read back the value written (the real write(2) keeps the old tail: "0" over
    "10" reads "00"). Returns the writes, in order, as (relative path, value)."""
    done: list[tuple[str, str]] = []
    real = Sysfs.write

    def write(self: Sysfs, rel: str, value: str) -> None:
        if rel.endswith("/queue/scheduler") and self.exists(rel):
            text = self.path(rel).read_text()
            if "[" in text and value not in text.replace("[", " ").replace("]", " ").split():
                # elevator_change: a name the kernel has neither built in nor as a module
                raise SysfsError(str(self.path(rel)), f"write {value!r} to", errno.EINVAL,
                                 "Invalid argument")
        p = self.path(rel)
        old = p.read_text() if p.is_file() else ""  # the choices, before the write over them
        real(self, rel, value)  # the same error paths (missing file: SysfsError)
        done.append((rel, value))
        if rel.endswith("/cache_mode") or (rel.endswith("/queue/scheduler") and "[" in old):
            words = [w.strip("[]") for w in old.split()]
            p.write_text(" ".join(f"[{w}]" if w == value else w for w in words) + "\n")
        elif rel.endswith("/detach"):
            base = p.parent
            (base / "state").write_text("no cache\n")
            (base / "dirty_data").write_text("0.0k\n")
            # the same counter in writeback_rate_debug (what a poll reads: bcache.read_backing)
            dbg = base / "writeback_rate_debug"
            if dbg.is_file():
                dbg.write_text(re.sub(r"(?m)^(dirty:\s*)\S+", r"\g<1>0.0k", dbg.read_text()))
            if (base / "cache").is_symlink():
                os.unlink(base / "cache")
        else:
            p.write_text(value + "\n")
        note_write()  # counted again once the value reads back as the kernel's would

    monkeypatch.setattr(Sysfs, "write", write)
    return done


SETTLE_FLOOR_S = 60.0  # the least a settle waits before it fails: a hang guard, never a bound


async def settle(pilot: object, until: Callable[[], bool], tries: int = 100,
                 step: float = 0.05) -> None:
    """Until ``until()`` holds, polled every ``step`` s; fails after ``tries`` polls and at
    least SETTLE_FLOOR_S seconds. The app's answer is awaited, not timed: at load 18 on 2
    CPUs a confirmation took more than 100 polls (5 s) to show (test_tui_warm, 2026-11-28),
    and nothing the tests assert depends on how fast it comes."""
    t0 = time.monotonic()
    n = 0
    while n < tries or time.monotonic() - t0 < SETTLE_FLOOR_S:
        if until():
            return
        n += 1
        await pilot.pause(step)  # type: ignore[attr-defined]
    app = getattr(pilot, "app", None)
    raise AssertionError("the app did not get there in time; screen "
                         f"{getattr(app, 'screen', None)!r}; log:\n"
                         + "\n".join(getattr(app, "log_history", [])))


async def quiet(pilot: object) -> None:
    """Until no worker of the app is pending or running (a poll, an operation, the detail's
    SSD health read, a replace plan) and the app and its screen have handled what they
    posted: what a fixed pause (0.05-0.2 s) only hoped for, and a loaded host did not always
    give in time (test_dashboard_read_only failed so at load 10-15, git log a05bf84)."""
    from textual.worker import WorkerState

    app = pilot.app  # type: ignore[attr-defined]
    await settle(pilot, lambda: not any(
        w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in app.workers))
    await pilot.pause()  # type: ignore[attr-defined]


def placed(app: CacheMgrApp, selector: str) -> bool:
    """The screen shown has ``selector`` composed AND laid out: a click at its region's
    corner reaches it. A screen pushed by a key is composed, then laid out when it handles
    its ScreenResume (or at its update timer), all after the key's own handling."""
    from textual.errors import NoWidget

    screen = app.screen
    found = screen.query(selector)
    if not found:
        return False
    widget = found.first()
    try:
        region = screen.find_widget(widget).region
    except NoWidget:
        return False
    return bool(region.area) and screen.get_widget_at(*region.offset)[0] is widget


async def click(pilot: object, selector: str) -> None:
    """Click ``selector`` on the screen shown once it is there to be clicked (placed()), and
    fail if the click reached something else. Pilot.press's wait can end before the app has
    handled the key (textual's wait_for_idle takes "little CPU used while asleep" for "idle",
    and a process starved of CPU uses little either way), so the dialog the key opens may not
    be composed or laid out yet; Pilot.click aims at the region the widget has at the call,
    (0,0) before the layout, lands on whatever is there, and the dialog waits forever
    (test_parity, test_tui, test_tui_warm failed so at load 11-20 on 2 CPUs, 2026-11-28)."""
    app = pilot.app  # type: ignore[attr-defined]
    await settle(pilot, lambda: placed(app, selector))
    assert await pilot.click(selector), (  # type: ignore[attr-defined]
        f"the click on {selector} reached another widget; screen {app.screen!r}")
    await handled(pilot)  # what the click opens, composed (Pilot.click waits as press does)


async def tune(pilot: object, app: CacheMgrApp, name: str, value: str) -> None:
    """On the selected object: ``t``, the tunable ``name`` highlighted in the choice dialog,
    Enter, ``value`` in the form, Enter (what the change does is for the caller to wait for)."""
    from textual.widgets import Input, OptionList

    from tui.dialogs.choose import ChoiceDialog
    from tui.dialogs.form import FormDialog

    await pilot.press("t")  # type: ignore[attr-defined]
    assert isinstance(app.screen, ChoiceDialog)
    ol = app.screen.query_one(OptionList)
    names = [str(ol.get_option_at_index(i).id) for i in range(ol.option_count)]
    ol.highlighted = names.index(name)
    await pilot.press("enter")  # type: ignore[attr-defined]
    assert isinstance(app.screen, FormDialog)
    app.screen.query_one(Input).value = value
    await pilot.press("enter")  # type: ignore[attr-defined]


def shown(app: object, cls: type) -> bool:
    """The app shows a dialog of type ``cls``, composed (its body is there to read)."""
    screen = getattr(app, "screen", None)
    return isinstance(screen, cls) and bool(screen.query(".dialog-body"))


def app_on(root: Path, **kw: object) -> CacheMgrApp:
    kw.setdefault("read_only", False)
    kw.setdefault("interval", 3600)
    kw.setdefault("wallclock", lambda: 0.0)
    return CacheMgrApp(str(root), **kw)  # type: ignore[arg-type]


def _handled_now(app: CacheMgrApp) -> bool:
    """The app and every node of the screen shown are mounted, none has a message waiting,
    and the screen needs no layout."""
    from textual.app import ScreenStackError

    if app._closing or app._closed or not app.is_running:  # a key that quit the app
        return True
    try:
        screen = app.screen
    except ScreenStackError:
        return True
    nodes = [app, *screen.walk_children(with_self=True)]
    return (all(n.is_attached and n._is_mounted and n._message_queue.empty() for n in nodes)
            and not screen._layout_required)


async def handled(pilot: object) -> None:
    """Until the app has handled what the last key started: the screen it pushed composed,
    mounted and laid out, the messages its handlers posted handled (twice in a row, a turn
    of the loop apart). What Pilot.press's own wait only guesses: textual's wait_for_idle
    takes "little CPU used while asleep" for "the app is done", and a process starved of CPU
    (load 10-20 on 2 CPUs) uses little either way, so the wait ended with the key unhandled
    and the test looked at the screen before (issue #43 item 1)."""
    import asyncio

    app = pilot.app  # type: ignore[attr-defined]
    t0 = time.monotonic()
    calm = 0
    while calm < 2:
        calm = calm + 1 if _handled_now(app) else 0
        if time.monotonic() - t0 > SETTLE_FLOOR_S:
            raise AssertionError("the app did not handle the key in time; screen "
                                 f"{app.screen!r}")
        await asyncio.sleep(0.01)
