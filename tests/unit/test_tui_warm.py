"""Warming a cache from the TUI (w, issue #35 item 1): the form (trace file, size), the
confirmation, the refusals of a missing or malformed trace and of a bad size in the command
layer's own words with nothing written, the progress dialog with its bar, and Cancel, after
which every setting warm changed is back and its undo journal gone.

On a copied capture (bcache-writeback-dirty-uml: bcache0 over ubda, cache set fb5bd09d) whose
writes read back as the kernel's would. The capture has no /dev/bcache0 to read: its open
gives a file standing in for it (procedures/warm.py read_hot itself, reporting after every
read), and
each read waits for the test's go (the slow device's pacer), so that the test sees the
progress before the end and cancels in the middle."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, ProgressBar

from cachemgr.core import cancel, undo
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import warm
from tests.unit.test_tui import bcache0_key, log_text, rendered, running
from tests.unit.test_warm import CSET, admission, make_trace
from tests.unit.tui_helpers import click, copy_capture, kernel_writes, quiet, settle, shown
from tui.app import CacheMgrApp
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.dialogs.form import FormDialog
from tui.dialogs.progress import ProgressDialog
from tui.screens.help import text as help_text

K = 4096


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


class Reads:
    """read_hot on a file standing in for /dev/bcache0, a report after every read, each read
    let through once ``go`` is set, or one per ``allow.release()`` (or when the operation is
    cancelled: its next report raises Cancelled)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.go = threading.Event()
        self.allow = threading.Semaphore(0)
        self.disk = tmp_path / "bcache0.img"
        self.disk.write_bytes(bytes(64 * K))
        self.during: tuple[str, str] | None = None
        real, real_open = warm.read_hot, os.open
        monkeypatch.delattr(os, "O_DIRECT", raising=False)  # a file on tmpfs: no O_DIRECT

        def read_hot(node: str, reqs: Any, **kw: Any) -> None:
            kw["every"] = 0.0
            real(node, reqs, **kw)

        def open_(path: Any, flags: int, *a: Any, **kw: Any) -> int:
            return real_open(self.disk if path == "/dev/bcache0" else path, flags, *a, **kw)

        def wait(pacer: warm.Pacer) -> None:
            ev = cancel.current()
            self.during = admission(pacer.sysfs)
            while not self.go.is_set() and not self.allow.acquire(timeout=0.01):
                if ev is not None and ev.is_set():
                    return

        monkeypatch.setattr(warm, "read_hot", read_hot)
        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(warm.Pacer, "wait", wait)


def trace_of_bcache0(tmp_path: Path) -> Path:
    p = tmp_path / "host.trace"
    make_trace(p, [(b * K, K, 0) for b in (1, 1, 5, 9, 9, 9, 12)])
    return p


async def start_warm(pilot: Any, app: CacheMgrApp, trace: str, size: str = "") -> None:
    """w, the form filled in, Next, then Warm in the confirmation."""
    await pilot.press("w")
    await settle(pilot, lambda: isinstance(app.screen, FormDialog)
                 and bool(app.screen.query("#f-bytes")))
    app.screen.query_one("#f-trace", Input).value = trace
    app.screen.query_one("#f-bytes", Input).value = size
    await click(pilot, "#b-ok")
    await settle(pilot, lambda: shown(app, ConfirmDialog))
    body = rendered(app.screen, ".dialog-body")
    assert trace in body and "Nothing is written to the device" in body
    await click(pilot, "#b-go")


def test_warm_from_the_tui_shows_progress_and_puts_the_settings_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    kernel_writes(monkeypatch)
    sysfs = Sysfs(str(root))
    before = admission(sysfs)
    reads = Reads(tmp_path, monkeypatch)
    trace = trace_of_bcache0(tmp_path)

    async def go() -> None:
        async with running(root, at=bcache0_key(root)) as (app, pilot):
            assert "Warm" in help_text(app) and app.check_action("warm", ()) is True
            await start_warm(pilot, app, str(trace), "16k")
            await settle(pilot, lambda: isinstance(app.screen, ProgressDialog))
            await settle(pilot, lambda: "warm /dev/bcache0: 0 B of 16.0 KiB read (0%)"
                         in rendered(app.screen, "#line"))
            assert reads.during == ("0", "0")  # admission set for the reads, journaled
            assert len(undo.journals()) == 1
            reads.go.set()
            await settle(pilot, lambda: not app.ops, tries=400)
            assert "✓ warm /dev/bcache0: 16.0 KiB of its hottest blocks read" in log_text(app)

    asyncio.run(go())
    assert admission(sysfs) == before and undo.journals() == []


def test_progress_bar_follows_the_reads(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The dialog's bar and line are warm's own reports: two of the four hot blocks read,
    the bar at half; Escape hides it, the line goes on in the banner, o shows it again."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    kernel_writes(monkeypatch)
    reads = Reads(tmp_path, monkeypatch)
    trace = trace_of_bcache0(tmp_path)

    async def go() -> None:
        async with running(root, at=bcache0_key(root)) as (app, pilot):
            await start_warm(pilot, app, str(trace))
            await settle(pilot, lambda: isinstance(app.screen, ProgressDialog))
            reads.allow.release()
            reads.allow.release()
            await settle(pilot, lambda: "8.0 KiB of 16.0 KiB read (50%)"
                         in rendered(app.screen, "#line"))
            assert app.screen.query_one(ProgressBar).progress == pytest.approx(0.5)
            eta = rendered(app.screen, "#eta")
            assert eta.startswith("ETA ") and eta != "ETA unknown"
            await pilot.press("escape")
            reads.allow.release()  # the next report (a poll would do it too: one an hour here)
            await settle(pilot, lambda: "» warm /dev/bcache0: 12.0 KiB of 16.0 KiB read"
                         in rendered(app, "#banner"))
            await pilot.press("o")
            await settle(pilot, lambda: isinstance(app.screen, ProgressDialog))
            reads.go.set()
            await settle(pilot, lambda: not app.ops, tries=400)

    asyncio.run(go())


def test_cancel_stops_the_warm_and_puts_back_every_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    sysfs = Sysfs(str(root))
    before = admission(sysfs)
    reads = Reads(tmp_path, monkeypatch)
    trace = trace_of_bcache0(tmp_path)

    async def go() -> None:
        async with running(root, at=bcache0_key(root)) as (app, pilot):
            await start_warm(pilot, app, str(trace))
            await settle(pilot, lambda: isinstance(app.screen, ProgressDialog))
            await settle(pilot, lambda: "warm /dev/bcache0:" in rendered(app.screen, "#line"))
            assert "puts back every setting" in rendered(app.screen, ".dialog-note")
            await click(pilot, "#b-cancel")
            await settle(pilot, lambda: shown(app, MessageDialog), tries=400)
            assert "cancelled by the operator" in rendered(app.screen, ".dialog-body")
            assert not app.ops

    asyncio.run(go())
    assert reads.during == ("0", "0") and not reads.go.is_set()
    assert admission(sysfs) == before and undo.journals() == []
    paths = [p for p, _ in writes]
    assert set(paths) == {"block/ubda/bcache/sequential_cutoff",
                          f"fs/bcache/{CSET}/congested_read_threshold_us"}
    assert len(paths) == 4  # each set, then put back


@pytest.mark.parametrize(("trace", "size", "said"), [
    ("missing", "", "no such trace file"),
    ("bad", "", "not a cachemgr trace"),
    ("", "", "warm needs a trace file"),
    ("good", "lots", "bad size"),
    ("good", "1G", "more than /dev/bcache0's cache holds"),
])
def test_warm_refusals_are_the_command_layers_and_write_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: str, size: str,
        said: str) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    Reads(tmp_path, monkeypatch)
    path = {"missing": str(tmp_path / "no.trace"), "bad": str(tmp_path / "bad.trace"),
            "good": str(trace_of_bcache0(tmp_path)), "": ""}[trace]
    (tmp_path / "bad.trace").write_bytes(b"not a trace at all")

    async def go() -> None:
        async with running(root, at=bcache0_key(root)) as (app, pilot):
            await start_warm(pilot, app, path, size)
            await settle(pilot, lambda: shown(app, MessageDialog), tries=400)
            assert "bad usage or input" in str(app.screen.title_text)  # type: ignore[attr-defined]
            assert said in rendered(app.screen, ".dialog-body")

    asyncio.run(go())
    assert writes == [] and undo.journals() == []


def test_escape_in_the_form_or_the_confirmation_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    trace = trace_of_bcache0(tmp_path)

    async def go() -> None:
        async with running(root, at=bcache0_key(root)) as (app, pilot):
            await pilot.press("w")
            assert isinstance(app.screen, FormDialog)
            await pilot.press("escape")
            assert len(app.screen_stack) == 1
            await pilot.press("w")
            app.screen.query_one("#f-trace", Input).value = str(trace)
            await click(pilot, "#b-ok")
            await settle(pilot, lambda: shown(app, ConfirmDialog))
            await pilot.press("escape")
            await quiet(pilot)
            assert len(app.screen_stack) == 1 and not app.ops

    asyncio.run(go())
    assert writes == []
