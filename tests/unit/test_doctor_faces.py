"""doctor's causes where the admin already looks (issue #45 item 2): ``check --verbose`` and
the TUI's detail view, both from ops/doctor.py's diagnosis of a window (one source), on the
captured lab windows of tests/fixtures/doctor-*-uml (before/ and after/ a window apart)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import logging
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import doctor as doctor_ops
from cachemgr.procedures import doctor
from tests.unit.test_doctor import FIXTURES, window
from tests.unit.tui_helpers import app_on, quiet, settle


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def check(name: str, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[int, str]:
    """``cachemgr check EXTRA`` on the window's second read; doctor's window is the
    captured one (its two reads and their time apart), not a wait on a still capture."""
    seen: list[float] = []

    def captured(sysfs: Sysfs, seconds: float) -> doctor.Window:
        seen.append(seconds)
        return window(name)

    monkeypatch.setattr(doctor_ops, "diagnose_window", captured)
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--sysfs-root", str(FIXTURES / name / "after" / "sys"), "check", *extra])
    logging.root.handlers.clear()
    assert seen == ([] if "--verbose" not in extra else [20.0 if "20" in extra else 15.0])
    return rc, out.getvalue()


def test_check_verbose_says_why_a_cache_does_not_help(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    rc0, plain = check("doctor-bcache-sequential-uml", monkeypatch)
    assert "not helping" not in plain  # without --verbose no window is taken
    rc, out = check("doctor-bcache-sequential-uml", monkeypatch, "--verbose")
    (cause,) = doctor.diagnose(window("doctor-bcache-sequential-uml"))
    lines = [x for x in out.splitlines() if x.startswith("not helping: ")]
    assert lines == [f"not helping: /dev/bcache0: sequential-bypass: {cause.what}; next: "
                     "cachemgr tune /dev/bcache0 sequential_cutoff=0"]
    # the level is check's own: a cache that does not help loses no data
    assert rc == rc0 and out.splitlines()[0] == plain.splitlines()[0]


def test_check_verbose_json_and_window(monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out = check("doctor-dmcache-cleaner-uml", monkeypatch, "--verbose", "--json",
                    "--window", "20")
    doc = json.loads(out)
    assert [(c["code"], c["level"]) for c in doc["causes"]] == [("smq-not-promoting",
                                                                "WARNING")]
    assert doc["causes"][0]["evidence"]["policy"] == "cleaner"
    assert doc["window_seconds"] == 20.0 and doc["exit_code"] == rc


def test_check_verbose_on_a_healthy_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out = check("doctor-bcache-control-uml", monkeypatch, "--verbose")
    assert rc == 0 and "not helping: nothing found in 15 s (cachemgr doctor)" in out


def sides(name: str) -> tuple[Sysfs, Sysfs, float]:
    fx = FIXTURES / name
    t0, t1 = (json.loads((fx / s / "meta.json").read_text())["uptime"]
              for s in ("before", "after"))
    return Sysfs(fx / "before" / "sys"), Sysfs(fx / "after" / "sys"), t1 - t0


def test_watch_diagnoses_the_window_of_a_face_s_polls() -> None:
    a, b, dt = sides("doctor-bcache-sequential-uml")
    w = doctor_ops.Watch(window=dt)
    assert w.update(a, snapshot.take(a), 100.0) == [] and w.seconds is None
    # a poll too soon after the first starts no window
    assert w.update(a, snapshot.take(a), 100.0 + dt / 2) == [] and w.seconds is None
    got = w.update(b, snapshot.take(b), 100.0 + dt)
    assert [(c.code, c.device) for c in got] == [("sequential-bypass", "/dev/bcache0")]
    assert got == doctor.diagnose(window("doctor-bcache-sequential-uml"))
    assert w.seconds == pytest.approx(dt)
    # the window slides: the next one starts at the newest poll old enough
    w.update(b, snapshot.take(b), 100.0 + 2 * dt)
    assert w.seconds == pytest.approx(dt) and w.causes == []  # the counters stood still


def test_the_tui_detail_shows_the_causes() -> None:
    """The app polls the window's second read; its clock puts 20 s between polls, so the
    second poll ends a doctor window: mode none is named whatever the IO."""
    from rich.console import Console
    from textual.widgets import Static

    from tui.screens.detail import DetailScreen

    root = FIXTURES / "doctor-bcache-none-uml" / "after" / "sys"
    ticks = itertools.count(0.0, 20.0)

    async def go() -> None:
        app = app_on(root, clock=lambda: next(ticks))
        async with app.run_test(size=(120, 40)) as pilot:
            await quiet(pilot)
            assert app.causes == []  # one poll: no window yet
            await pilot.press("enter")
            # the table's Enter posts RowSelected; the dashboard's handler pushes the detail:
            # a message after the key's, which the pilot's wait on the key does not cover
            await settle(pilot, lambda: isinstance(app.screen, DetailScreen))
            app.start_poll()
            await quiet(pilot)
            assert [(c.code, c.device) for c in app.causes] == [("mode-left", "/dev/bcache0")]
            con = Console(width=120, record=True, file=io.StringIO())
            con.print(app.screen.query_one("#detail", Static).content)
            text = con.export_text()
            assert ("not helping: mode-left: mode none: bcache caches nothing more" in
                    " ".join(text.split()))
            assert "next: cachemgr mode /dev/bcache0 writethrough" in " ".join(text.split())

    asyncio.run(go())
