"""The TUI on a real kernel: the actions that change state, run headless (App.run_test)
inside the lab, each checked through the snapshot; then the real app in tmux, driven by
keys and checked from the captured screen (mode change and drain)."""

from __future__ import annotations

import asyncio
import io
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import OptionList

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.model import BcacheBacking, CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs

pytestmark = pytest.mark.kernel(disks="1G,256M")


def make_dirty(lab_disks: list[str]) -> Sysfs:
    """bcache in writeback over the first disk, 12 MiB dirty held (writeback_running=0)."""
    hdd, ssd = lab_disks[0], lab_disks[1]
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=ssd, bucket="128k", mode=CacheMode.WRITEBACK)
    b = snapshot.take(sysfs).backings[0]
    bcache.set_tunable(sysfs, b, "writeback_running", 0)
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=64M", "--io_size=12M", "--direct=1", "--output-format=json"],
               timeout=120)
    b = snapshot.take(sysfs).backings[0]
    assert b.dirty is not None and b.dirty.bytes > 4 << 20
    return sysfs


def test_tui_actions_on_the_kernel(lab_disks: list[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.tui_helpers import settle, tune
    from tui.app import CacheMgrApp
    from tui.dialogs.confirm import ConfirmDialog

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = make_dirty(lab_disks)
    key = snapshot.take(sysfs).backings[0].key

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    def b0() -> BcacheBacking:
        return snapshot.take(sysfs).backings[0]

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, key)
            # mode: writeback -> writethrough (dirty data keeps being written back)
            await pilot.press("m")
            app.screen.query_one(OptionList).highlighted = 0
            await pilot.press("enter")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.click("#b-switch")
            await settle(pilot, lambda: "cache_mode writeback -> writethrough" in log(app),
                         tries=400)
            assert b0().mode == CacheMode.WRITETHROUGH
            # drain, with its progress dialog, until clean; tunables restored
            await pilot.press("d")
            await pilot.click("#b-go")
            await settle(pilot, lambda: "clean after" in log(app), tries=2400)
            b = b0()
            assert b.state == CacheState.CLEAN and b.dirty is not None and b.dirty.is_zero(512)
            assert b.writeback_running is False and b.writeback_percent == 10
            # tune
            await settle(pilot, lambda: app.check_action("tune", ()) is True)
            app.selected_key = key
            await tune(pilot, app, "writeback_percent", "5")
            await settle(pilot, lambda: "writeback_percent 10 -> 5" in log(app), tries=400)
            assert b0().writeback_percent == 5
            # detach, then attach again
            await pilot.press("x")
            await pilot.click("#b-go")
            await settle(pilot, lambda: "/dev/bcache0: detach" in log(app), tries=2400)
            assert b0().state == CacheState.NO_CACHE
            await settle(pilot, lambda: app.check_action("attach", ()) is True, tries=200)
            await pilot.press("a")
            await pilot.press("enter")
            await settle(pilot, lambda: "/dev/bcache0: attached to cache set " in log(app),
                         tries=400)
            assert b0().cset_uuid is not None
            # remove: detach (flush) then stop; /dev/bcache0 goes away
            await settle(pilot, lambda: app.check_action("remove", ()) is True, tries=200)
            await pilot.press("delete")
            await pilot.click("#b-go")
            await settle(pilot, lambda: "/dev/bcache0: stopped (was running)" in log(app),
                         tries=2400)
            await settle(pilot, lambda: not any(r.kind == "bcache" for r in app.rows),
                         tries=200)
            assert snapshot.take(sysfs).backings == ()

    asyncio.run(go())


def test_tui_cache_set_side_tune_and_attach(lab_disks: list[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """From the cache set's row: tune a cache-set tunable, then attach a detached backing
    device to that set (the kernel's files checked through the snapshot)."""
    from textual.widgets import Input

    from tests.unit.tui_helpers import settle
    from tui import view
    from tui.app import CacheMgrApp

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="128k")
    bcache.detach(sysfs, snapshot.take(sysfs).backings[0])
    snap = snapshot.take(sysfs)
    cset = snap.cache_sets[0]
    assert snap.backings[0].cset_uuid is None and cset.congested_read_threshold_us == 2000
    key = f"cset:{cset.uuid}"

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, key)
            assert app.selected_row() is not None and app.selected_row().kind == view.CSET
            # tune on the set: congested_read_threshold_us 2000 -> 0
            await settle(pilot, lambda: app.check_action("tune", ()) is True)
            await pilot.press("t")
            ol = app.screen.query_one(OptionList)
            ids = [str(ol.get_option_at_index(i).id) for i in range(ol.option_count)]
            assert "congested_read_threshold_us" in ids and "writeback_percent" not in ids
            ol.highlighted = ids.index("congested_read_threshold_us")
            await pilot.press("enter")
            app.screen.query_one(Input).value = "0"
            await pilot.press("enter")
            await settle(pilot, lambda: "congested_read_threshold_us 2000 -> 0" in log(app),
                         tries=400)
            assert snapshot.take(sysfs).cache_sets[0].congested_read_threshold_us == 0
            # attach from the set's side: the detached backing device is offered
            app.selected_key = key
            await settle(pilot, lambda: app.check_action("attach", ()) is True, tries=200)
            await pilot.press("a")
            ol = app.screen.query_one(OptionList)
            assert ol.option_count == 1
            await pilot.press("enter")
            await settle(pilot, lambda: snapshot.take(sysfs).backings[0].cset_uuid == cset.uuid,
                         tries=400)
            await settle(pilot, lambda: "attach" in log(app) and "->" in log(app), tries=200)

    asyncio.run(go())


def test_tui_in_tmux_mode_and_drain(lab_disks: list[str], tmp_path: Path) -> None:
    """The real app (`cachemgr tui`) on a 100x30 tmux pane, keys sent like a person would."""
    sysfs = make_dirty(lab_disks)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TERM": "xterm-256color",
           "CACHEMGR_STATE_DIR": str(tmp_path / "state")}
    rc_file = tmp_path / "rc"
    cmd = (f"cd {shlex.quote(os.getcwd())} && {shlex.quote(sys.executable)} -m cachemgr tui; "
           f"echo rc=$? > {rc_file}; sleep 30")

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", *args], env=env, capture_output=True, text=True,
                              timeout=30, check=True).stdout

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", "t")

    def wait(text: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while True:
            s = screen()
            if text in s:
                return s
            if time.monotonic() > end:
                raise AssertionError(f"{text!r} not on the screen:\n{s}")
            time.sleep(0.3)

    tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", cmd)
    try:
        wait("bcache0")
        tmux("send-keys", "-t", "t", "Down")  # from the cache set to bcache0
        time.sleep(0.5)
        tmux("send-keys", "-t", "t", "m")
        wait("Cache mode of /dev/bcache0")
        tmux("send-keys", "-t", "t", "Up", "Enter")  # writeback (current) -> writethrough
        wait("Switch to writethrough")
        tmux("send-keys", "-t", "t", "BTab", "BTab", "Enter")  # Cancel has the focus
        s = wait("cache_mode writeback -> writethrough")
        print(s)
        assert snapshot.take(sysfs).backings[0].mode == CacheMode.WRITETHROUGH
        tmux("send-keys", "-t", "t", "d")
        wait("Drain /dev/bcache0")
        tmux("send-keys", "-t", "t", "BTab", "Enter")
        s = wait("clean after", timeout=180)
        print(s)

        def flat(text: str) -> str:  # the log wraps the line, its border between the parts
            return " ".join(text.replace("\u258c", " ").split())

        end = time.monotonic() + 30  # the summary's line may come a poll after the dialog's
        while "tunables restored" not in flat(s) and time.monotonic() < end:
            time.sleep(0.3)
            s = screen()
        assert "tunables restored" in flat(s), s
        b = snapshot.take(sysfs).backings[0]
        assert b.state == CacheState.CLEAN and b.dirty is not None and b.dirty.is_zero(512)
        tmux("send-keys", "-t", "t", "q")
        end = time.monotonic() + 30
        while not rc_file.exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert rc_file.read_text().strip() == "rc=0"
        after = screen()
        print(after)
        assert "Traceback" not in after and "Error" not in after
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, timeout=30, check=False)


# --------------------------------------------------------------------------- helpers


def _text(app: object, selector: str) -> str:
    from textual.widgets import Static

    return str(app.screen.query_one(selector, Static).render())  # type: ignore[attr-defined]


async def _fill_form(pilot: object, app: object, values: dict[str, str]) -> None:
    from textual.widgets import Input

    for key, value in values.items():
        app.screen.query_one(f"#f-{key}", Input).value = value  # type: ignore[attr-defined]
    await pilot.pause(0.05)  # type: ignore[attr-defined]


async def _select(pilot: object, app: object, key: str) -> None:
    """Wait for row ``key`` to be listed (polls), then select it."""
    from tests.unit.tui_helpers import settle
    from tui.widgets.devices import DeviceTable

    table = app.query_one(DeviceTable)  # type: ignore[attr-defined]
    await settle(pilot, lambda: key in table.keys, tries=200)
    table.select_key(key)
    await settle(pilot, lambda: app.selected_key == key)  # type: ignore[attr-defined]


async def _pick(pilot: object, app: object, option_id: str) -> None:
    """In a ChoiceDialog: highlight the option ``option_id`` and press Enter."""
    ol = app.screen.query_one(OptionList)  # type: ignore[attr-defined]
    ids = [str(ol.get_option_at_index(i).id) for i in range(ol.option_count)]
    ol.highlighted = ids.index(option_id)
    await pilot.press("enter")  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- create, bench


@pytest.mark.kernel(disks="512M,128M", timeout=400)
def test_tui_create_bench_and_remove_bcache(lab_disks: list[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """From an empty host: create a bcache (form, confirmation, make-bcache), run the bench
    form's default comparison on it, the bare disk (mode none) vs writeback with the cache SSD
    read for reference (progress, charts labelled apart, PNG/SVG plots written, mode
    restored), then remove the backing device and unregister the cache set."""
    from tests.unit.tui_helpers import settle
    from tui import view
    from tui.app import CacheMgrApp
    from tui.dialogs.choose import ChoiceDialog
    from tui.dialogs.confirm import ConfirmDialog
    from tui.dialogs.form import FormDialog
    from tui.screens.bench import BenchScreen
    from tui.widgets.devices import DeviceTable

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    bench_dir = tmp_path / "bench"
    monkeypatch.setenv("CACHEMGR_BENCH_DIR", str(bench_dir))
    hdd, ssd = lab_disks
    sysfs = Sysfs()

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: app.polls > 0, tries=200)
            assert "No caches on this host (c: create one)" in _text(app, "#banner")
            # create: kind, form, confirmation naming the devices to be formatted
            await pilot.press("c")
            assert isinstance(app.screen, ChoiceDialog)
            await _pick(pilot, app, "bcache")
            assert isinstance(app.screen, FormDialog)
            await _fill_form(pilot, app, {"backing": hdd, "cache": ssd, "mode": "writeback",
                                          "bucket": "128k"})
            await pilot.click("#b-ok")
            assert isinstance(app.screen, ConfirmDialog)
            assert f"Format {hdd} {ssd} with make-bcache" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: any(r.kind == view.BCACHE and r.mode == "writeback"
                                            for r in app.rows), tries=600)
            snap = snapshot.take(sysfs)
            assert len(snap.backings) == 1 and len(snap.cache_sets) == 1
            b = snap.backings[0]
            assert b.cset_uuid == snap.cache_sets[0].uuid and b.mode == CacheMode.WRITEBACK
            assert b.identity.node == hdd and snap.cache_sets[0].caches[0].identity.node == ssd
            assert "✗" not in log(app)
            # bench: the bare disk (none) vs writeback on bcache0, a short run, the cache SSD
            # read apart for reference
            app.query_one(DeviceTable).select_key(b.key)
            await settle(pilot, lambda: app.selected_key == b.key)
            await pilot.press("b")
            assert isinstance(app.screen, BenchScreen)
            from textual.widgets import Checkbox, Input, RichLog, Static

            for k, v in {"runtime": "2", "repeat": "1", "zipf": "1.2"}.items():
                app.screen.query_one(f"#{k}", Input).value = v
            app.screen.query_one("#reference", Checkbox).value = True
            bench = app.screen
            await pilot.press("ctrl+r")
            await settle(pilot, lambda: len(bench.query_one("#oplog", RichLog).lines) > 0,
                         tries=600)  # progress lines while it runs
            await settle(pilot, lambda: ": saved " in log(app) or "✗" in log(app), tries=3000)
            assert "✗" not in log(app), log(app)
            assert bench.doc is not None
            assert [r["label"] for r in bench.doc["results"]] == [
                "/dev/bcache0:none", "/dev/bcache0:writeback"]
            assert all(r["iops"] > 0 for r in bench.doc["results"])
            (ref,) = bench.doc["references"]
            assert ref["device"] == ssd and ref["role"] == "cache SSD" and ref["iops"] > 0
            from rich.console import Console

            con = Console(width=100, record=True, file=io.StringIO())
            con.print(bench.query_one("#result", Static).content)
            shown = con.export_text()
            assert "IOPS (median)" in shown and "completion latency" in shown
            assert "saved:" in shown
            # every bar labelled apart (both read "/dev/bcache0" when cut to 12 characters)
            for label in ("/dev/bcache0 (none)", "/dev/bcache0 (writeback)",
                          f"{ssd} (cache SSD, reads)"):
                assert any(line.startswith(label + " ") and "█" in line
                           for line in shown.splitlines()), (label, shown)
            # the mode the bench switched is back
            assert snapshot.take(sysfs).backings[0].mode == CacheMode.WRITEBACK
            await pilot.press("escape")
            # remove the backing device, then unregister the (now empty) cache set
            await settle(pilot, lambda: app.check_action("remove", ()) is True, tries=200)
            await pilot.press("delete")
            assert "Decommission /dev/bcache0" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: "/dev/bcache0: stopped (was running)" in log(app),
                         tries=2400)
            await settle(pilot, lambda: [r.kind for r in app.rows] == [view.CSET], tries=200)
            app.query_one(DeviceTable).select_key(app.rows[0].key)
            await settle(pilot, lambda: app.selected_key == app.rows[0].key)
            await pilot.press("delete")
            assert "Unregister cache set" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: not app.rows, tries=600)
            assert "✗" not in log(app), log(app)
        print(log(app))

    asyncio.run(go())
    snap = snapshot.take(sysfs)
    assert snap.backings == () and snap.cache_sets == ()
    files = sorted(p.name for p in bench_dir.rglob("*") if p.is_file())
    for suffix in (".json", "-iops.png", "-iops.svg", "-latency.png", "-latency.svg"):
        assert any(f.endswith(suffix) for f in files), (suffix, files)


# --------------------------------------------------------------------------- dm-cache


def _dm(*args: str) -> str:
    return runner.run(["dmsetup", *args], timeout=60).stdout


def _dm_dirty(name: str = "vc") -> int:
    return int(_dm("status", name).split()[13])


def _dm_fill_and_hold(io_size: str) -> None:
    """Dirty blocks that stay: writes, then migration_threshold 1 (below one block: smq is
    never told the device is idle, so it never writes back) until the counts stand still."""
    runner.run(["fio", "--name=fill", "--filename=/dev/mapper/vc", "--rw=randwrite",
                "--bs=4k", "--direct=1", "--size=128M", f"--io_size={io_size}",
                "--random_distribution=zipf:1.2", "--output-format=json"],
               timeout=300, cwd="/tmp")
    _dm("message", "vc", "0", "migration_threshold", "1")
    last = ""
    for _ in range(50):
        cur = " ".join(_dm("status", "vc").split()[6:14])
        if cur == last:
            break
        last = cur
        time.sleep(0.3)
    assert _dm_dirty() > 0


@pytest.mark.kernel(disks="256M,64M,8M", timeout=400)
def test_tui_dmcache_create_mode_drain_tune_remove(lab_disks: list[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """dm-cache through the TUI on the kernel: create over a dm-delay 'HDD'; passthrough
    refused while dirty (the library's words); switch + drain to passthrough; back to
    writeback; drain (cleaner policy, original table back); tune migration_threshold;
    remove. Each step checked with dmsetup."""
    from tests.unit.tui_helpers import settle, shown
    from tui.app import CacheMgrApp
    from tui.dialogs.choose import ChoiceDialog
    from tui.dialogs.confirm import ConfirmDialog, MessageDialog
    from tui.dialogs.form import FormDialog
    from tui.widgets.devices import DeviceTable

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    hdd, ssd, meta = lab_disks
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    _dm("create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 2")

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    def failed(app: CacheMgrApp) -> list[str]:
        return [line for line in app.log_history if line.startswith("✗")]

    def table() -> list[str]:
        return _dm("table", "vc").split()

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: app.polls > 0, tries=200)

            async def select_vc() -> None:
                await _select(pilot, app, "dm:vc")

            async def mode(to: str, button: str) -> None:
                await select_vc()
                await pilot.press("m")
                assert isinstance(app.screen, ChoiceDialog)
                await _pick(pilot, app, to)
                assert isinstance(app.screen, ConfirmDialog)
                await pilot.click(f"#b-{button}")

            # create (origin data kept; cache and metadata overwritten)
            await pilot.press("c")
            await _pick(pilot, app, "dm-cache")
            assert isinstance(app.screen, FormDialog)
            await _fill_form(pilot, app, {"name": "vc", "origin": "/dev/mapper/hdd",
                                          "cache": ssd, "metadata": meta})
            await pilot.click("#b-ok")
            assert isinstance(app.screen, ConfirmDialog)
            assert f"Create /dev/mapper/vc over /dev/mapper/hdd (its data is kept). The " \
                   f"contents of {ssd} and {meta} are overwritten." in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await select_vc()
            t = table()
            assert t[2] == "cache" and t[7:11] == ["1", "writeback", "smq", "0"], t
            _dm_fill_and_hold("8M")
            await settle(pilot, lambda: any(r.key == "dm:vc" and r.state == "dirty"
                                            for r in app.rows), tries=200)
            # passthrough while dirty: the confirmation says so, the switch is refused
            await mode("passthrough", "switch")
            await settle(pilot, lambda: shown(app, MessageDialog), tries=400)
            assert "refused as unsafe" in _text(app, ".dialog-title")
            assert "dm-cache accepts passthrough only when every block is clean" in \
                _text(app, ".dialog-body")
            await pilot.press("escape")
            assert len(failed(app)) == 1  # logged too
            assert table()[8] == "writeback" and _dm_dirty() > 0
            # switch + drain: flushed first, then passthrough
            await mode("passthrough", "drain")
            await settle(pilot, lambda: "cache_mode writeback -> passthrough" in log(app)
                         or len(failed(app)) > 1, tries=2400)
            assert len(failed(app)) == 1, log(app)
            assert table()[8] == "passthrough" and _dm_dirty() == 0
            # back to writeback (plain switch)
            await mode("writeback", "switch")
            await settle(pilot, lambda: "cache_mode passthrough -> writeback" in log(app),
                         tries=600)
            assert table()[8] == "writeback"
            # drain: the cleaner policy until clean, then the original table back
            _dm_fill_and_hold("4M")
            await select_vc()
            await pilot.press("d")
            assert "cleaner policy" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: "clean after" in log(app) or len(failed(app)) > 1,
                         tries=2400)
            assert len(failed(app)) == 1, log(app)
            assert "mode writeback and policy smq restored" in log(app)
            t = table()
            assert t[8:10] == ["writeback", "smq"] and _dm_dirty() == 0, t
            # tune migration_threshold (1, as the hold left it, -> 4096)
            await select_vc()
            await pilot.press("t")
            await _pick(pilot, app, "migration_threshold")
            from textual.widgets import Input

            assert isinstance(app.screen, FormDialog)
            app.screen.query_one(Input).value = "4096"
            await pilot.press("enter")
            await settle(pilot, lambda: "migration_threshold 1 -> 4096" in log(app),
                         tries=600)
            assert "migration_threshold 4096" in _dm("status", "vc")
            # remove: flush, linear table, dmsetup remove
            await select_vc()
            await pilot.press("delete")
            assert "Remove dm-cache /dev/mapper/vc" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: "dm:vc" not in app.query_one(DeviceTable).keys,
                         tries=1200)
            assert len(failed(app)) == 1, log(app)
        print(log(app))

    asyncio.run(go())
    assert "vc" not in _dm("ls").split()


# One guest for the two TUI proofs on a plain dm-cache device over the same disks (a guest's
# boot, its pytest and Textual's import cost ~5 host CPU-s under UML: docs/benchmarks.md,
# "A UML guest's CPU"): the bench, which must leave the device as it was, runs first; the
# remove that keeps the device, which turns it linear, last.
@pytest.mark.kernel(disks="256M,64M,8M", timeout=400)
def test_tui_dmcache_bench_then_remove_keep_device_while_in_use(
        lab_disks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`b` on a dm-cache device: a short run through the bench screen, results saved and
    shown, the device untouched (same table). Then remove with "Keep device" while a process
    holds the device open: its dirty blocks are flushed to the origin and the device stays as
    a linear mapping of it, same data."""
    from textual.widgets import Input, RichLog

    from cachemgr.backends import dmcache
    from tests.unit.tui_helpers import settle
    from tui.app import CacheMgrApp
    from tui.screens.bench import BenchScreen
    from tui.widgets.devices import DeviceTable

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    bench_dir = tmp_path / "bench"
    monkeypatch.setenv("CACHEMGR_BENCH_DIR", str(bench_dir))
    hdd, ssd, meta = lab_disks
    dmcache.create(Sysfs(), "vc", origin=hdd, cache=ssd, metadata=meta)
    table_before = _dm("table", "vc")

    async def bench_it() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, "dm:vc")
            await settle(pilot, lambda: app.check_action("bench", ()) is True, tries=200)
            await pilot.press("b")
            bench = app.screen
            assert isinstance(bench, BenchScreen)
            assert bench.query_one("#targets", Input).value == "/dev/mapper/vc"
            for k, v in {"runtime": "2", "repeat": "1", "zipf": "1.2"}.items():
                bench.query_one(f"#{k}", Input).value = v
            await pilot.press("ctrl+r")
            await settle(pilot, lambda: len(bench.query_one("#oplog", RichLog).lines) > 0,
                         tries=600)
            log = lambda: "\n".join(app.log_history)  # noqa: E731
            await settle(pilot, lambda: ": saved " in log() or "✗" in log(), tries=3000)
            assert "✗" not in log(), log()
            assert bench.doc is not None
            (res,) = bench.doc["results"]
            assert res["iops"] > 0 and res["lat_p99_us"] > 0

    asyncio.run(bench_it())
    assert _dm("table", "vc") == table_before
    assert list(bench_dir.rglob("*.json"))

    _dm_fill_and_hold("16M")
    before = runner.run(["sha256sum", "/dev/mapper/vc"], timeout=120).stdout.split()[0]
    holder = open("/dev/mapper/vc", "rb")  # a VM still using the disk  # noqa: SIM115

    async def remove_keep() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, "dm:vc")
            await settle(pilot, lambda: app.check_action("remove", ()) is True, tries=200)
            await pilot.press("delete")
            await pilot.click("#b-keep")
            await settle(pilot, lambda: "dm:vc" not in app.query_one(DeviceTable).keys,
                         tries=1200)
            await settle(pilot, lambda: not app.ops, tries=200)
            assert not [x for x in app.log_history if x.startswith("✗")], app.log_history

    try:
        asyncio.run(remove_keep())
        table = _dm("table", "vc").split()
        assert table[2] == "linear", table
    finally:
        holder.close()
    assert runner.run(["sha256sum", "/dev/mapper/vc"], timeout=120).stdout.split()[0] == before
    assert runner.run(["sha256sum", hdd], timeout=120).stdout.split()[0] == before


# --------------------------------------------------------------------------- warm


@pytest.mark.kernel(disks="1G,256M", timeout=400)
def test_tui_warm_cancel_then_warm(lab_disks: list[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`w` on a bcache device over a 5 ms dm-delay disk, from a trace of a hot set of 2,048
    blocks (10 s or more of reads): cancelled from its progress dialog mid-way, every
    setting warm changed is back and its undo journal gone; warmed again to the end, the
    8 MiB of the hot set read and every setting back. (That the hot set then hits and a set
    the trace never saw does not is the command's, the same for every face: proven by
    test_warm_kernel's test_warm_bcache_admits_the_hot_set_and_refuses; here it cost three
    of bcache's accounting ticks and 4,096 reads through the delay, about half the test.)"""
    from tests.kernel.test_warm_kernel import hot_sets, no_undo_journals, write_trace
    from tests.unit.tui_helpers import settle, shown
    from tui.app import CacheMgrApp
    from tui.dialogs.confirm import ConfirmDialog, MessageDialog
    from tui.dialogs.form import FormDialog
    from tui.dialogs.progress import ProgressDialog

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    hdd, ssd = lab_disks
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "slow", "--table", f"0 {sectors} delay {hdd} 0 5"])
    sysfs = Sysfs()
    bcache.create(sysfs, backings=["/dev/mapper/slow"], cache=ssd, bucket="128k")
    b = snapshot.take(sysfs).backings[0]
    rel = bcache.backing_rel(sysfs, b.identity.name)
    settings = [f"{rel}/sequential_cutoff",
                f"fs/bcache/{b.cset_uuid}/congested_read_threshold_us"]
    before = [sysfs.read(p) for p in settings]
    size = int(runner.run(["blockdev", "--getsize64", "/dev/bcache0"]).stdout)
    hot, _cold = hot_sets(size, 2048)
    trace = tmp_path / "vms.trace"
    write_trace(sysfs, "/dev/bcache0", hot, trace)

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    async def warm(pilot: object, app: CacheMgrApp) -> None:
        await pilot.press("w")  # type: ignore[attr-defined]
        assert isinstance(app.screen, FormDialog)
        await _fill_form(pilot, app, {"trace": str(trace)})
        await pilot.click("#b-ok")  # type: ignore[attr-defined]
        await settle(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.click("#b-go")  # type: ignore[attr-defined]
        await settle(pilot, lambda: isinstance(app.screen, ProgressDialog), tries=200)

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, b.key)
            await settle(pilot, lambda: app.check_action("warm", ()) is True, tries=200)
            await warm(pilot, app)
            await settle(pilot, lambda: "warm /dev/bcache0:" in _text(app, "#line"),
                         tries=600)
            assert sysfs.read(settings[0]).strip() in ("0", "0.0k")  # set for the reads
            await pilot.click("#b-cancel")
            await settle(pilot, lambda: shown(app, MessageDialog), tries=1200)
            assert "cancelled by the operator" in _text(app, ".dialog-body")
            assert [sysfs.read(p) for p in settings] == before and no_undo_journals()
            await pilot.press("escape")
            seen = len(app.log_history)
            await warm(pilot, app)

            def since() -> str:
                return "\n".join(app.log_history[seen:])

            await settle(pilot, lambda: "✓ warm /dev/bcache0: 8.0 MiB of its hottest" in since()
                         or "✗" in since(), tries=3000)
            assert "✗" not in since(), since()

    asyncio.run(go())
    assert [sysfs.read(p) for p in settings] == before and no_undo_journals()


# --------------------------------------------------------------------------- replace-ssd


@pytest.mark.kernel(disks="256M", timeout=900)
def test_tui_replace_ssd_swap_prompt_cancel_and_resume(lab_disks: list[str], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The guided SSD replacement on the kernel, the cache on scsi_debug: a run cancelled
    while it drains and rolled back; then the plan, the run
    up to the physical swap prompt (the new SSD is not in yet: its disk was pulled), the
    operator cancels there (an interrupted run past 'unregister'), resumes it from the
    screen, inserts the new disk (a rescan of its host) and confirms; the run finishes with
    the backing device on a new cache set on the new SSD, its mode restored."""
    from cachemgr.backends import scsi
    from cachemgr.procedures import replace
    from tests.unit.tui_helpers import click, settle, shown
    from tui import view
    from tui.app import CacheMgrApp
    from tui.dialogs.choose import ChoiceDialog
    from tui.dialogs.confirm import ConfirmDialog, MessageDialog
    from tui.screens.replace import ReplaceScreen, SwapPrompt
    from tui.widgets.devices import DeviceTable

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs()
    old_ssd, new_ssd = scsi.load_scsi_debug(sysfs, dev_size_mb=64, per_host_store=1,
                                            add_host=2)
    assert old_ssd.wwid and new_ssd.wwid and old_ssd.wwid != new_ssd.wwid
    bcache.create(sysfs, backings=[lab_disks[0]], cache=old_ssd.node, bucket="64k",
                  mode=CacheMode.WRITEBACK)
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=64M", "--io_size=4M", "--direct=1", "--output-format=json"],
               timeout=120)
    old_cset = snapshot.take(sysfs).cache_sets[0].uuid
    scsi.remove(sysfs, new_ssd.name)  # the new SSD is still on the shelf

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: any(r.kind == view.CSET for r in app.rows), tries=200)
            cset_key = next(r.key for r in app.rows if r.kind == view.CSET)
            app.query_one(DeviceTable).select_key(cset_key)
            await settle(pilot, lambda: app.selected_key == cset_key)
            await pilot.press("s")
            screen = app.screen
            assert isinstance(screen, ReplaceScreen)
            from textual.widgets import Input, Static

            screen.query_one("#new", Input).value = new_ssd.wwid or ""
            # a first run, cancelled (c) while it drains, then rolled back (u): before
            # 'unregister' the old set is still there and the mode comes back
            await pilot.press("g")
            await settle(pilot, lambda: shown(app, ConfirmDialog), tries=400)
            await pilot.pause(0.3)
            await pilot.click("#b-go")
            await settle(pilot, lambda: f"replace-ssd: [4/{len(replace.STEPS)}] drain" in log(app),
                         tries=1200)
            await pilot.press("c")
            await settle(pilot, lambda: shown(app, MessageDialog), tries=1200)
            assert "replacement cancelled by the operator" in _text(app, ".dialog-body")
            await pilot.press("escape")
            (first,) = replace.list_runs()
            assert first.status == "failed" and "unregister" not in first.done, first
            await pilot.press("u")
            assert isinstance(app.screen, ChoiceDialog)
            await pilot.press("enter")
            await settle(pilot, lambda: shown(app, ConfirmDialog), tries=200)
            await pilot.pause(0.3)
            await pilot.click("#b-go")
            await settle(pilot, lambda: f"{first.id}: rolled back" in log(app), tries=1200)
            assert replace.Journal.load(first.id).status == "rolled-back"
            snap = snapshot.take(sysfs)
            assert [c.uuid for c in snap.cache_sets] == [old_cset]
            assert snap.backings[0].cset_uuid == old_cset
            assert snap.backings[0].mode == CacheMode.WRITEBACK  # interim none undone
            assert log(app).count("✗") == 1, log(app)
            # the real run
            await pilot.press("g")  # plan, then the confirmation showing it
            await settle(pilot, lambda: shown(app, ConfirmDialog), tries=400)
            body = _text(app, ".dialog-body")
            assert f"replace the cache SSD {old_ssd.node}" in body and new_ssd.wwid in body
            # a click lands where the button is: before the dialog is laid out that is
            # elsewhere (the full run of 755a2eb: the question stayed up for the whole wait)
            await click(pilot, "#b-go")
            # the steps run up to the swap prompt (a bound for a hang: under the suite's load
            # the drain and the steps took longer than 2 minutes, 2026-11-26)
            await settle(pilot, lambda: shown(app, SwapPrompt), tries=6000)
            assert "Insert the new SSD" in _text(app, ".dialog-body")
            steps = str(screen.query_one("#steps", Static).render())
            assert "✓  6 unregister" in steps and "✓  8 remove-old" in steps, steps
            assert "▶  9 wait-new" in steps, steps
            # the operator cancels (Escape): the run stops, journaled, past the point of no
            # return
            await pilot.pause(0.3)  # the prompt is laid out
            await pilot.press("escape")
            await settle(pilot, lambda: shown(app, MessageDialog), tries=400)
            assert "the operator did not confirm the swap" in _text(app, ".dialog-body")
            await pilot.press("escape")
            (run,) = [j for j in replace.list_runs() if j.status not in ("done", "rolled-back")]
            assert run.status == "failed" and run.done[-1] == "remove-old"
            assert snapshot.take(sysfs).cache_sets == ()  # the old set is gone
            # resume it from the screen; this time the disk goes in, then Done
            assert app.screen is screen
            await pilot.press("r")
            assert isinstance(app.screen, ChoiceDialog)
            assert run.id in str(app.screen.choices)
            await pilot.press("enter")
            await settle(pilot, lambda: shown(app, SwapPrompt), tries=2400)
            scsi.rescan(sysfs, new_ssd.host)  # the operator inserts the new SSD
            await pilot.pause(0.3)
            await pilot.click("#b-done")
            await settle(pilot, lambda: "done; cache set" in log(app)
                         or log(app).count("✗") > 2, tries=3000)
            assert log(app).count("✗") == 2, log(app)  # the two cancels
            await pilot.pause(0.6)  # the step list is redrawn every 0.5 s
            steps = str(screen.query_one("#steps", Static).render())
            assert steps.count("✓") == len(replace.STEPS), steps
        print(log(app))

    asyncio.run(go())
    snap = snapshot.take(sysfs)
    (cset,) = snap.cache_sets
    assert cset.uuid != old_cset
    assert scsi.scsi_disk(sysfs, cset.caches[0].identity.name).wwid == new_ssd.wwid
    (b,) = snap.backings
    assert b.cset_uuid == cset.uuid and b.mode == CacheMode.WRITEBACK
    assert b.writeback_percent == 10 and b.writeback_delay == 30
    assert sorted(j.status for j in replace.list_runs()) == ["done", "rolled-back"]


# --------------------------------------------------------------------------- LVM caches


def _lvs(name: str, fields: str) -> dict[str, str]:
    import json

    out = json.loads(runner.run(["lvm", "lvs", "-a", "--reportformat", "json", "-o", fields,
                                 name], timeout=120).stdout)
    (row,) = out["report"][0]["lv"]
    return dict(row)


def _sha(node: str) -> str:
    return runner.run(["bash", "-c", f"sha256sum < {node}"], timeout=120).stdout.split()[0]


@pytest.mark.kernel(disks="1G,256M", timeout=600, mem=1024)
def test_tui_lvm_cache_mode_detach_and_writecache_uncache(
        lab_disks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lvm2's caches through the TUI on the kernel: vg0/vm1 with a writeback cache pool is
    switched to writethrough (lvchange) and detached (drain + lvconvert --splitcache: the
    pool kept); vg0/vm2 with an lvm writecache holding dirty blocks has its cache removed
    (cleaner + lvconvert --uncache: the cachevol deleted). Each step checked with lvs, and
    every byte of both LVs checked after."""
    from tests.unit.tui_helpers import settle
    from tui.app import CacheMgrApp
    from tui.dialogs.choose import ChoiceDialog
    from tui.dialogs.confirm import ConfirmDialog
    from tui.dialogs.progress import ProgressDialog

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    hdd, ssd = lab_disks
    lvm = ["lvm"]
    runner.run([*lvm, "pvcreate", "-y", hdd, ssd])
    runner.run([*lvm, "vgcreate", "vg0", hdd, ssd])
    for lv in ("vm1", "vm2"):
        runner.run([*lvm, "lvcreate", "-y", "-n", lv, "-L", "96M", "vg0", hdd])
    runner.run([*lvm, "lvcreate", "-y", "--type", "cache-pool", "-n", "pool", "-L", "48M",
                "vg0", ssd])
    runner.run([*lvm, "lvconvert", "-y", "--type", "cache", "--cachepool", "vg0/pool",
                "--cachemode", "writeback", "vg0/vm1"], timeout=120)
    runner.run([*lvm, "lvcreate", "-y", "-an", "-n", "fast", "-L", "48M", "vg0", ssd])
    # a high watermark above what is written: the dirty blocks stay until the cleaner
    runner.run([*lvm, "lvconvert", "-y", "--type", "writecache", "--cachevol", "vg0/fast",
                "--cachesettings", "high_watermark=90", "vg0/vm2"], timeout=120)
    for lv in ("vm1", "vm2"):
        runner.run(["fio", "--name=w", f"--filename=/dev/vg0/{lv}", "--rw=randwrite",
                    "--bs=4k", "--size=96M", "--io_size=8M", "--direct=1",
                    "--output-format=terse"], timeout=300)
    wc = _dm("status", "vg0-vm2").split()
    assert int(wc[4]) - int(wc[5]) > 0, wc  # writecache: total - free blocks in use
    sums = {lv: _sha(f"/dev/vg0/{lv}") for lv in ("vm1", "vm2")}

    def log(app: CacheMgrApp) -> str:
        return "\n".join(app.log_history)

    def failed(app: CacheMgrApp) -> list[str]:
        return [line for line in app.log_history if line.startswith("✗")]

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, "dm:vg0-vm1")
            await pilot.press("m")
            assert isinstance(app.screen, ChoiceDialog)
            await _pick(pilot, app, "writethrough")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.click("#b-switch")
            await settle(pilot, lambda: _lvs("vg0/vm1", "cache_mode")["cache_mode"]
                         == "writethrough" or bool(failed(app)), tries=1200)
            assert not failed(app), log(app)
            await _select(pilot, app, "dm:vg0-vm1")
            await pilot.press("x")
            assert isinstance(app.screen, ConfirmDialog)
            assert "lvconvert --splitcache" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: _lvs("vg0/vm1", "segtype")["segtype"] == "linear"
                         or bool(failed(app)), tries=2400)
            # the split is done; the detach goes on (the pool's policy put back) until its
            # progress dialog closes
            await settle(pilot, lambda: not isinstance(app.screen, ProgressDialog), tries=1200)
            assert not failed(app), log(app)
            await _select(pilot, app, "wc:vg0-vm2")
            await pilot.press("delete")
            assert isinstance(app.screen, ConfirmDialog)
            assert "lvconvert --uncache" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: _lvs("vg0/vm2", "segtype")["segtype"] == "linear"
                         or bool(failed(app)), tries=2400)
            assert not failed(app), log(app)
            await settle(pilot, lambda: not {r.key for r in app.rows}
                         & {"dm:vg0-vm1", "wc:vg0-vm2"}, tries=200)

    asyncio.run(go())
    # the pool is kept (split off, without the drain's cleaner policy), the cachevol is gone
    pool = _lvs("vg0/pool", "segtype,cache_policy")
    assert pool["segtype"] == "cache-pool" and pool["cache_policy"] != "cleaner", pool
    lvs = runner.run([*lvm, "lvs", "--noheadings", "-o", "lv_name", "vg0"]).stdout.split()
    assert "fast" not in lvs and "fast_cvol" not in lvs, lvs
    for lv, want in sums.items():
        assert _sha(f"/dev/vg0/{lv}") == want, lv


@pytest.mark.kernel(disks="1G,256M", timeout=500)
def test_tui_killed_by_a_closed_terminal_puts_back_bench_and_drain(
        lab_disks: list[str], tmp_path: Path) -> None:
    """The real app in tmux; the terminal closed (tmux kill-server: SIGHUP) while a bench
    has switched bcache0 to none and the congestion thresholds to 0 (issue #32: 55 s
    later they were still so, and nothing said it), then while a drain has its tunables
    set: each is put back within seconds, the process ends, no journal is left."""
    hdd, ssd = lab_disks
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 20"])
    sysfs = make_dirty(["/dev/mapper/hdd", ssd])
    cset = snapshot.take(sysfs).backings[0].cset_uuid
    rel, crel = "block/bcache0/bcache", f"fs/bcache/{cset}"
    state_dir = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TERM": "xterm-256color",
           "CACHEMGR_STATE_DIR": str(state_dir), "CACHEMGR_BENCH_DIR": str(tmp_path / "b")}

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", *args], env=env, capture_output=True, text=True,
                              timeout=30, check=True).stdout

    def wait_for(what: str, cond: Callable[[], bool], timeout: float) -> float:
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > timeout:
                screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", "t"], env=env,
                                        capture_output=True, text=True).stdout
                raise AssertionError(f"{what}: not within {timeout} s\n{screen}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def tui_pid() -> int | None:
        # the pane's process: the shell exec'd the TUI
        out = tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip()
        return int(out) if out.isdigit() else None

    def start() -> None:
        cmd = (f"cd {shlex.quote(os.getcwd())} && exec {shlex.quote(sys.executable)} "
               "-m cachemgr tui")
        tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", cmd)
        wait_for("bcache0 listed", lambda: "bcache0" in tmux("capture-pane", "-p", "-t", "t"),
                 60)

    def hang_up() -> dict[str, float]:
        pid = tui_pid()
        assert pid is not None
        t0 = time.monotonic()
        subprocess.run(["tmux", "kill-server"], env=env, timeout=30, check=False)
        return {"pid": pid, "t0": t0}

    modes = lambda: sysfs.read(f"{rel}/cache_mode")  # noqa: E731
    thresholds = lambda: (sysfs.read(f"{crel}/congested_read_threshold_us").strip(),  # noqa
                          sysfs.read(f"{crel}/congested_write_threshold_us").strip())
    before = (modes(), thresholds())
    assert "[writeback]" in before[0] and before[1] != ("0", "0")
    # a bench of writeback against writethrough: killed once it has switched the mode
    start()
    try:
        tmux("send-keys", "-t", "t", "b")
        wait_for("bench screen", lambda: "Ctrl+R runs the benchmark" in tmux(
            "capture-pane", "-p", "-t", "t"), 30)
        tmux("send-keys", "-t", "t", "C-r")
        # its default targets: the bare disk (mode none) against writeback
        wait_for("bench switched to none",
                 lambda: "[none]" in modes() and thresholds() == ("0", "0"), 240)
        assert list((state_dir / "undo").glob("*.json")), "no undo journal while it runs"
        k = hang_up()
        took = wait_for("mode and thresholds back",
                        lambda: (modes(), thresholds()) == before, 30)
        wait_for("the TUI gone", lambda: not Path(f"/proc/{k['pid']}").exists(), 60)
        print(f"bench: put back {took:.1f} s after the terminal closed")
        assert not list((state_dir / "undo").glob("*.json"))
        assert subprocess.run(["pgrep", "-x", "fio"], capture_output=True).returncode != 0
        # a drain (tunables changed while it runs), killed the same way
        tun = lambda: tuple(sysfs.read(f"{rel}/{t}").strip()  # noqa: E731
                            for t in ("writeback_percent", "writeback_delay"))
        tun0 = tun()
        assert snapshot.take(sysfs).backings[0].dirty.bytes > 1 << 20  # type: ignore[union-attr]
        start()
        tmux("send-keys", "-t", "t", "Down")  # from the cache set to bcache0
        time.sleep(0.5)
        tmux("send-keys", "-t", "t", "d")
        wait_for("drain confirmation", lambda: "Drain /dev/bcache0" in tmux(
            "capture-pane", "-p", "-t", "t"), 30)
        tmux("send-keys", "-t", "t", "BTab", "Enter")
        wait_for("drain tunables set", lambda: tun() != tun0, 60)
        k = hang_up()
        took = wait_for("drain tunables back", lambda: tun() == tun0, 30)
        wait_for("the TUI gone", lambda: not Path(f"/proc/{k['pid']}").exists(), 60)
        print(f"drain: put back {took:.1f} s after the terminal closed")
        assert not list((state_dir / "drain").glob("*.json"))
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, timeout=30, check=False)
