"""The TUI asks the cache kinds (issue #30 items 1, 3 and 6): no branch on a kind class in
tui/, and the owner of a device (a run holding its lock, an interrupted run's journal) shown
in the table, the banner and the detail view."""

from __future__ import annotations

import ast
import asyncio
import html
import io
import re
from pathlib import Path

import pytest

from tests.unit.guards import held_elsewhere
from tests.unit.test_parity import plant, row_key
from tests.unit.tui_helpers import app_on, copy_capture, fx, quiet, settle
from tui import view
from tui.app import CacheMgrApp
from tui.widgets.devices import DeviceTable

REPO = Path(__file__).resolve().parents[2]
KIND_CLASSES = {"BcacheBacking", "CacheSet", "DmCacheDevice", "DmWritecacheDevice",
                "LvmCachedLv"}


def kind_isinstance(path: Path, base: Path = REPO) -> list[str]:
    """Every isinstance(x, C) in ``path`` whose C (alone, in a tuple or a union) names a
    snapshot class of a cache kind."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance" and len(node.args) == 2):
            continue
        names = {n.id if isinstance(n, ast.Name) else n.attr
                 for n in ast.walk(node.args[1]) if isinstance(n, ast.Name | ast.Attribute)}
        if names & KIND_CLASSES:
            found.append(f"{path.relative_to(base)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_tui_never_branches_on_a_kind_class() -> None:
    files = sorted((REPO / "tui").rglob("*.py"))
    assert len(files) > 10
    found = [hit for p in files for hit in kind_isinstance(p)]
    assert found == [], "\n".join(found)


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text(
        "a = isinstance(o, BcacheBacking)\nb = isinstance(o, DmCacheDevice | model.CacheSet)\n"
        "c = isinstance(o, (int, LvmCachedLv))\nd = isinstance(o, str)\n")
    hits = kind_isinstance(tmp_path / "x.py", tmp_path)
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3"], hits


# ------------------------------------------------------------------------------ owners


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def screen_text(app: CacheMgrApp) -> str:
    """What the terminal shows (80x24), line by line, from the app's screenshot."""
    svg = app.export_screenshot()
    lines: dict[float, str] = {}
    for y, t in re.findall(r'<text[^>]*y="([0-9.]+)"[^>]*>(.*?)</text>', svg):
        lines[float(y)] = lines.get(float(y), "") + html.unescape(re.sub("<[^>]+>", "", t))
    return "\n".join(lines[y].replace("\xa0", " ") for y in sorted(lines))


def detail_text(app: CacheMgrApp, key: str) -> str:
    from rich.console import Console

    from tui.screens import detail

    assert app.snap is not None
    con = Console(width=400, record=True, file=io.StringIO())
    con.print(detail.render(app.snap, key))
    return con.export_text()


async def owner_shown(root: Path, key: str) -> tuple[dict[str, str], str, str, str]:
    """(the owner column of every row, the banner, the detail's first line, the detail as
    the screen shows it) with the row ``key`` selected and its detail open."""
    from textual.widgets import Static

    app = app_on(root)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.polls > 0)
        app.query_one(DeviceTable).select_key(key)
        await settle(pilot, lambda: app.selected_key == key)
        marks = {r.key: r.owner for r in app.rows}
        banner = str(app.screen.query_one("#banner", Static).render())
        first = detail_text(app, key).splitlines()[0]
        await pilot.press("enter")
        await settle(pilot, lambda: bool(app.screen.query("#detail")))
        await quiet(pilot)
        return marks, banner, first, screen_text(app)


def test_a_device_held_by_another_process_shows_its_holder(tmp_path: Path,
                                                           state_dir: Path) -> None:
    """A drain in another process holds /dev/bcache0's lock: its row carries the held mark
    (its cache set's does not), the banner names it, the detail says who since when (pid)."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    key = row_key(root, "/dev/bcache0")
    with held_elsewhere(key, state_dir, '{"procedure": "drain", "step": "writeback"}'):
        marks, banner, first, shown = asyncio.run(owner_shown(root, key))
    assert marks[key] == view.HELD, marks
    assert [k for k, m in marks.items() if m] == [key], marks
    assert f"{view.HELD} bcache0 drain (enter)" in banner, banner
    assert first.startswith("held by drain (since "), first
    assert "at step writeback, pid " in first, first
    assert "held by drain (since " in shown, shown  # on the screen, at 80x24


def test_an_interrupted_drain_owns_its_device_until_resumed(tmp_path: Path,
                                                            state_dir: Path) -> None:
    """A drain killed mid-way left its journal: the row carries the owned mark, the
    banner says interrupted, the detail says what to do (the CLI's words)."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    key = row_key(root, "/dev/bcache0")
    plant(root, "drain:/dev/bcache0")
    marks, banner, first, shown = asyncio.run(owner_shown(root, key))
    assert marks[key] == view.OWNED, marks
    assert f"{view.OWNED} bcache0 drain (interrupted) (enter)" in banner, banner
    assert first == ("owned by drain (since 00:00:01, interrupted: its process is gone); "
                     "resume it first (cachemgr drain /dev/bcache0 --resume)"), first
    assert "owned by drain (since 00:00:01, interrupted" in shown, shown
    assert "cachemgr drain /dev/bcache0 --resume" in shown, shown


def test_an_interrupted_replace_run_owns_the_set_and_its_devices(tmp_path: Path) -> None:
    """A replace-ssd run stopped in step drain owns the cache set and every device on it:
    each row is marked, the detail gives both ways out (resume, roll back)."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    plant(root, "replace:/dev/bcache0")
    key = row_key(root, "/dev/bcache0")
    marks, banner, first, _ = asyncio.run(owner_shown(root, key))
    assert set(marks.values()) == {view.OWNED}, marks
    assert "replace-ssd gate-test (interrupted)" in banner, banner
    assert first.startswith("owned by replace-ssd run gate-test ("), first
    assert ("resume it (cachemgr replace-ssd --resume gate-test) or roll it back "
            "(cachemgr replace-ssd --rollback gate-test) first") in first, first


def test_no_owner_no_mark() -> None:
    async def go() -> list[str]:
        app = app_on(fx("lvm-caches"))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            return [r.owner for r in app.rows]

    assert set(asyncio.run(go())) == {""}
