"""The TUI's replace-ssd asks as the command line does (issue #41 item 5): the run takes
its cache's and every device's locks, plans again under them, and only then shows its
question, the plan it runs. Before, the replace screen asked in its own dialog before the
run took anything: a second admin's tune while the question waited went through (exit 0)
and was then undone by the run's restore at its end, which put back what the plan shown had
read.

Pilot tests on a copy of the scsi-ssd-in-use capture (a bcache set on a scsi_debug SSD);
the run's steps after its plan are not run (tests/unit/test_run_owns_its_devices.py's stub:
tests/kernel/test_gate_kernel.py runs them on the lab kernel)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.procedures import replace
from tests.unit.test_run_owns_its_devices import ssd_setup, steps_stubbed
from tests.unit.tui_helpers import app_on, click, quiet, settle, shown
from tui.app import CacheMgrApp
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.screens.replace import ReplaceScreen
from tui.widgets.devices import DeviceTable


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only


def second_admin(sysfs: Sysfs, device: str, value: int) -> tuple[int, str]:
    """Another admin's ``tune DEVICE writeback_percent=VALUE`` through the command layer,
    in a thread of its own (another owner of locks, as another process would be): its exit
    code and words."""
    box: list[tuple[int, str]] = []

    def go() -> None:
        try:
            cache_ops.tune(sysfs, device, [f"writeback_percent={value}"])
            box.append((0, ""))
        except CacheMgrError as exc:
            box.append((int(exc.exit_code), str(exc)))

    t = threading.Thread(target=go)
    t.start()
    t.join(60)
    return box[0]


async def replace_screen(pilot: Any, app: CacheMgrApp, key: str) -> ReplaceScreen:
    await settle(pilot, lambda: app.polls > 0)
    app.query_one(DeviceTable).select_key(key)
    await settle(pilot, lambda: app.selected_key == key)
    await pilot.press("s")
    await settle(pilot, lambda: isinstance(app.screen, ReplaceScreen))
    assert isinstance(app.screen, ReplaceScreen)
    return app.screen


def percent(j: replace.Journal, uuid: str) -> int:
    (entry,) = [e for e in j.backings if e["uuid"] == uuid]
    return int(entry["tunables"]["writeback_percent"])


def test_the_question_waits_with_the_devices_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """g: while the question is on the screen, a second admin's tune of a device on the
    SSD is refused (exit 3, naming the run); answered, the run journals the value the
    device had, which it puts back at its end."""
    root, sysfs, b, _ssd = ssd_setup(tmp_path, monkeypatch)
    ran = steps_stubbed(monkeypatch)
    tries: list[tuple[int, str]] = []

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            await replace_screen(pilot, app, b.key)
            await pilot.press("g")
            await settle(pilot, lambda: shown(app, ConfirmDialog), tries=400)
            assert "Replace the SSD of" in str(app.screen.title_text)  # type: ignore[attr-defined]
            tries.append(second_admin(sysfs, b.device, 40))
            await click(pilot, "#b-go")
            await settle(pilot, lambda: bool(ran), tries=400)
            await quiet(pilot)

    asyncio.run(go())
    ((rc, words),) = tries
    assert rc == 3 and "held by replace-ssd run" in words, (rc, words)
    (journaled,) = ran
    assert percent(journaled, b.uuid) == 10  # what the device has: the tune never landed


def test_a_change_before_the_locks_is_the_plan_asked_and_no_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """p shows a plan (a forecast: nothing held); a tune after it goes through (exit 0).
    g then plans again under the locks: the question is put with the device as it is now
    (the log says what changed since the plan shown). No to it: refused in the command's
    words, nothing run, and the devices are let go."""
    root, sysfs, b, _ssd = ssd_setup(tmp_path, monkeypatch)
    ran = steps_stubbed(monkeypatch)
    seen: dict[str, Any] = {}
    real = replace.describe

    def describe(j: replace.Journal) -> list[str]:  # the plan the question shows
        seen["asked"] = percent(j, b.uuid)
        return real(j)

    async def go() -> None:
        app = app_on(root)
        async with app.run_test(size=(100, 40)) as pilot:
            screen = await replace_screen(pilot, app, b.key)
            await pilot.press("p")
            await settle(pilot, lambda: screen.journal is not None, tries=400)
            await quiet(pilot)
            assert screen.journal is not None and percent(screen.journal, b.uuid) == 10
            seen["tune"] = second_admin(sysfs, b.device, 40)
            monkeypatch.setattr(replace, "describe", describe)
            await pilot.press("g")
            await settle(pilot, lambda: shown(app, ConfirmDialog), tries=400)
            await pilot.press("escape")
            await settle(pilot, lambda: shown(app, MessageDialog), tries=400)
            seen["refusal"] = app.screen.body  # type: ignore[attr-defined]
            await quiet(pilot)
            seen["after"] = second_admin(sysfs, b.device, 20)
            seen["log"] = "\n".join(app.log_history)

    asyncio.run(go())
    assert seen["tune"] == (0, "")
    assert seen["asked"] == 40
    assert "not confirmed; nothing was changed" in seen["refusal"], seen["refusal"]
    assert "changed since the plan was made (writeback_percent 10 -> 40)" in seen["log"]
    assert ran == []
    assert seen["after"] == (0, "")  # the run let its devices go
