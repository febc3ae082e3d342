"""Hostile device-supplied text on a real kernel (issue #15 item 1): a bcache label written
through /sys/block/bcache0/bcache/label with markup and escape sequences, a dm-cache device
whose dm name holds an escape sequence and a bidi override. The TUI must stay up and show the
text literally (no markup, no hyperlink); ``cachemgr status`` and the CLI's messages must show
control characters as escapes; ``status --json`` keeps the name exact."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.core.text import printable
from tests.kernel.clirun import in_process

BAD = "[/][bold red]x[/"
LINK = "[link=http://x]y[/link]"
ESC = "e\x1b[31mr\u202e"


@pytest.mark.kernel(disks="1G,256M", timeout=300)
def test_markup_label_in_the_tui_on_the_kernel(lab_disks: list[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_tui_hostile import no_links, on_screen
    from tests.unit.tui_helpers import settle
    from tui.app import CacheMgrApp
    from tui.screens.detail import DetailScreen
    from tui.widgets.devices import DeviceTable

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="128k",
                  mode=CacheMode.WRITEBACK)
    label = Path("/sys/block/bcache0/bcache/label")
    label.write_text(BAD)
    b = snapshot.take(sysfs).backings[0]
    assert b.label == BAD  # the kernel keeps it as written
    key = b.key

    def label_read(want: str) -> bool:
        return snapshot.take(sysfs).backings[0].label == want

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 40)) as pilot:
            table = app.query_one(DeviceTable)
            await settle(pilot, lambda: key in table.keys, tries=200)
            table.select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
            await pilot.press("enter")
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            detail = app.screen.query_one("#detail")
            await settle(pilot, lambda: BAD in on_screen(detail), tries=200)
            # the detail view is re-rendered from each poll: a label changed meanwhile
            label.write_text(LINK)
            assert label_read(LINK)
            await settle(pilot, lambda: LINK in on_screen(detail), tries=200)
            assert no_links(detail)
            label.write_text(ESC)
            assert label_read(ESC)
            await settle(pilot, lambda: printable(ESC) in on_screen(detail), tries=200)
            assert "\x1b" not in on_screen(detail)
            await pilot.press("escape")
            assert app.is_running and app.return_code is None
            await pilot.press("q")

    asyncio.run(go())


@pytest.mark.kernel(disks="1G,256M,64M", timeout=300)
def test_escape_in_a_dm_name_on_the_kernel(lab_disks: list[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel takes any dm name without '/': a dm-cache device renamed (dmsetup rename
    --manglename none) to one holding an SGR sequence and U+202E. dmsetup's answers, the
    status warning and the CLI's refusal name it: shown escaped, in the TUI too; status
    --json keeps it exact."""
    from tests.unit.test_tui_hostile import on_screen
    from tests.unit.tui_helpers import settle
    from tui.app import CacheMgrApp

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    name = "vm" + ESC + "[bold]"
    shown = printable(name)
    origin, cache, meta = lab_disks
    r = in_process("create", "dm-cache", "vc", "--origin", origin, "--cache", cache,
                   "--metadata", meta, "--mode", "writethrough")
    assert r.returncode == 0, r.stderr
    runner.run(["dmsetup", "rename", "--manglename", "none", "vc", name])
    assert any(Path(p).read_text().rstrip("\n") == name
               for p in Path("/sys/block").glob("dm-*/dm/name"))  # the kernel kept it
    st = in_process("status")
    assert st.returncode == 0
    assert shown in st.stdout and "\x1b" not in st.stdout and "\u202e" not in st.stdout
    js = json.loads(in_process("status", "--json").stdout)
    assert any(name in w for w in js["warnings"])  # JSON: the exact name
    refused = in_process("mode", name, "writethrough")
    assert refused.returncode == 2, refused
    assert shown in refused.stderr and "\x1b" not in refused.stderr

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: app.polls > 0, tries=200)
            banner = app.query_one("#banner")
            await pilot.pause(0.2)
            assert shown in str(banner.render())
            assert "\x1b" not in on_screen(banner)
            await pilot.press("q")

    asyncio.run(go())
