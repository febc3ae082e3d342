"""The TUI's replace screen takes every word about a kind of replacement (bcache cache set,
LVM cache, dm-cache device) from its ``replace.Kind``: the screen, its run picker, the
confirmations before a run and before a rollback (pilot tests on captured trees, with journals
of interrupted runs of each kind; issue #30 items 5 and 6)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from textual.widgets import Input, Static

from cachemgr.ops.control import Control, Plan
from cachemgr.procedures import replace
from cachemgr.procedures.replace import dmcache as replace_dmcache
from cachemgr.procedures.replace import lvm as replace_lvm
from tests.unit.tui_helpers import app_on, fx, settle, shown
from tui.app import CacheMgrApp
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog
from tui.screens.replace import ReplaceScreen
from tui.widgets.devices import DeviceTable

DM_RUN = "20261122-000001-vc"
LVM_RUN = "20261122-000002-vg0-vm1"
BCACHE_RUN = "20261122-000003-fb5bd09d"
DM_PAST = "20261122-000004-vc2"


@pytest.fixture(autouse=True)
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted runs of each kind, journaled: a dm-cache run stopped in 'release-old', an
    LVM run stopped after 'split', a bcache run after 'drain', and a dm-cache run past its
    point of no return."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    replace.Journal(id=DM_RUN, cset="vc", kind="dmcache", options={}, old={}, backings=[],
                    done=["preflight", "remember", "drain"], status="failed",
                    error="release-old: the SSD is busy").save()
    replace.Journal(id=LVM_RUN, cset="vg0/vm1", kind="lvm", options={}, old={}, backings=[],
                    done=["preflight", "remember", "drain", "split"]).save()
    replace.Journal(id=BCACHE_RUN, cset="fb5bd09d-1111-2222-3333-444455556666", options={},
                    old={}, backings=[], done=["preflight", "remember", "drain"]).save()
    replace.Journal(id=DM_PAST, cset="vc2", kind="dmcache", options={}, old={}, backings=[],
                    done=["preflight", "remember", "drain", "release-old"]).save()


def body(app: CacheMgrApp) -> str:
    return str(app.screen.query_one(".dialog-body", Static).render())


async def rollback_dialog(pilot: object, app: CacheMgrApp, run_id: str) -> str:
    """u on the replace screen, ``run_id`` picked: the confirmation's words (then closed)."""
    await pilot.press("u")  # type: ignore[attr-defined]
    await settle(pilot, lambda: isinstance(app.screen, ChoiceDialog))
    assert isinstance(app.screen, ChoiceDialog)
    app.screen.dismiss(run_id)
    await settle(pilot, lambda: shown(app, ConfirmDialog))
    text = body(app)
    await pilot.press("escape")  # type: ignore[attr-defined]
    await settle(pilot, lambda: isinstance(app.screen, ReplaceScreen))
    return text


async def replace_screen(pilot: object, app: CacheMgrApp, key: str) -> ReplaceScreen:
    """The replace screen (s) of row ``key``, once the app's first poll is in."""
    await settle(pilot, lambda: app.polls > 0)
    app.query_one(DeviceTable).select_key(key)
    await settle(pilot, lambda: app.selected_key == key)
    await pilot.press("s")  # type: ignore[attr-defined]
    await settle(pilot, lambda: isinstance(app.screen, ReplaceScreen))
    assert isinstance(app.screen, ReplaceScreen)
    return app.screen


def test_dmcache_rollback_says_release_old_never_unregister() -> None:
    """The dm-cache run's rollback: its own steps, its point of no return."""
    async def go() -> None:
        app = app_on(fx("dmcache-writeback"))
        async with app.run_test(size=(80, 24)) as pilot:
            await replace_screen(pilot, app, "dm:vmcache")
            text = await rollback_dialog(pilot, app, DM_RUN)
            assert "possible only before step 4 of 11, 'release-old'" in text, text
            for word in ("unregister", "cset", "re-attach", "cache set"):
                assert word not in text, (word, text)
            assert "dm-cache device vc (failed): 3 of 11 steps done" in text, text
            assert "release-old  (point of no return)" in text, text
            assert "✗  4 release-old" in text and "✓  3 drain" in text, text
            assert "Put the cache back on the old SSD's areas" in text, text

            text = await rollback_dialog(pilot, app, DM_PAST)
            assert "this run is past 'release-old': resume it (r)" in text, text
            assert "unregister" not in text

    asyncio.run(go())


def test_run_picker_labels_each_run_as_its_kind_does() -> None:
    async def go() -> None:
        app = app_on(fx("dmcache-writeback"))
        async with app.run_test(size=(80, 24)) as pilot:
            await replace_screen(pilot, app, "dm:vmcache")
            for key in ("u", "r"):
                await pilot.press(key)
                await settle(pilot, lambda: isinstance(app.screen, ChoiceDialog))
                assert isinstance(app.screen, ChoiceDialog)
                labels = dict(app.screen.choices)
                assert set(labels) == {DM_RUN, LVM_RUN, BCACHE_RUN, DM_PAST}
                assert "cset" not in labels[DM_RUN] and "cset" not in labels[DM_PAST]
                assert f"{DM_RUN}  failed  dm vc  last: drain" in labels[DM_RUN]
                assert f"{LVM_RUN}  running  lv vg0/vm1  last: split" in labels[LVM_RUN]
                assert f"{BCACHE_RUN}  running  cset fb5bd09d  last: drain" in \
                    labels[BCACHE_RUN]
                await pilot.press("escape")
                await settle(pilot, lambda: isinstance(app.screen, ReplaceScreen))

    asyncio.run(go())


def test_dmcache_screen_takes_its_words_from_the_kind() -> None:
    async def go() -> None:
        app = app_on(fx("dmcache-writeback"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await replace_screen(pilot, app, "dm:vmcache")
            steps = str(screen.query_one("#steps", Static).render())
            assert "release-old" in steps and "rebuild" in steps
            assert "unregister" not in steps and "detach" not in steps, steps
            assert screen.sub_title == "replace the SSD of dm-cache device vmcache"
            assert str(screen.query_one("#plan", Static).render()).startswith(
                "dm-cache device vmcache: press p")
            assert screen.query_one("#interim", Input).disabled
            assert screen.kind is replace_dmcache.KIND

    asyncio.run(go())


def test_lvm_and_bcache_rollback_say_their_own_words() -> None:
    async def go() -> None:
        app = app_on(fx("lvm-caches"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await replace_screen(pilot, app, "dm:vg0-vm1")
            text = await rollback_dialog(pilot, app, LVM_RUN)
            assert "possible only before step 5 of 17, 'remove-old-cache'" in text, text
            assert "Run 20261122-000002-vg0-vm1 on the LVM cache vg0/vm1 (running)" in text
            assert "4 of 17 steps done" in text, text
            assert "remove-old-cache  (point of no return)" in text, text
            assert "Attach the old cache again" in text, text
            assert "unregister" not in text and "cset" not in text, text

            text = await rollback_dialog(pilot, app, BCACHE_RUN)
            assert "on the bcache cache set fb5bd09d-1111" in text, text
            assert "possible only before step 6 of 16, 'unregister'" in text, text
            assert "Put the modes back and re-attach what was detached" in text, text

            assert screen.sub_title == "replace the SSD of LVM cache vg0/vm1"
            assert screen.kind is replace_lvm.KIND

    asyncio.run(go())


def test_start_confirmation_names_the_kind_and_its_point_of_no_return() -> None:
    """The confirmation before a run says what stays up and until when it can be rolled
    back, from the run's kind (the run asks it from its worker, with the plan it runs:
    here from a thread, with a plan of one line)."""
    async def go() -> None:
        app = app_on(fx("dmcache-writeback"))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            for run_id, words, title in (
                    (DM_RUN, "The dm-cache device stays up (a linear table over its origin "
                     "while the SSD is out). Every step is journaled: an interrupted run "
                     "resumes (r) or, before 'release-old', rolls back (u).",
                     "Replace the SSD of dm-cache device vc"),
                    (LVM_RUN, "before 'remove-old-cache', rolls back (u)",
                     "Replace the SSD of LVM cache vg0/vm1"),
                    (BCACHE_RUN, "before 'unregister', rolls back (u)",
                     "Replace the SSD of bcache cache set fb5bd09d")):
                j = replace.Journal.load(run_id)
                screen = ReplaceScreen(j.cset, replace.kind_of(j.kind))
                await app.push_screen(screen)
                asked = threading.Thread(target=screen.ask_start, args=(
                    j, Control(), Plan(f"replace-ssd {j.cset}", ("(the plan)",))))
                asked.start()
                await settle(pilot, lambda: shown(app, ConfirmDialog))
                assert isinstance(app.screen, ConfirmDialog)
                assert app.screen.title_text == title
                text = body(app)
                assert words in text, text
                if j.kind != "bcache":
                    assert "unregister" not in text, text
                assert text.startswith("(the plan)\n"), text
                await pilot.press("escape")
                await settle(pilot, lambda s=screen: app.screen is s)  # type: ignore[misc]
                asked.join(10)
                app.pop_screen()

    asyncio.run(go())
