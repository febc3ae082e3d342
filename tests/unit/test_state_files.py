"""Journals and state files (issue #15 item 3): a schema version in each; a file that cannot
be read is reported (its path, why) and skipped by listings, refused by the command on its
object (exit 2), and never a traceback; journals are read under the lock they guard; lock
and journal keys never collide after their file names are made."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, UnsafeError, UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import replace as ops_replace
from cachemgr.procedures import autoattach, drain, replace
from cachemgr.procedures.replace import journal as replace_journal
from cachemgr.procedures.replace import run as replace_run
from tests.unit.guards import held_elsewhere, mutations_refused
from tests.unit.tui_helpers import app_on, copy_capture, fx, kernel_writes, settle, shown

REPO = Path(__file__).resolve().parents[2]
GOOD = "20261122-040812-c2958027"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def cli(root: Path, argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["--sysfs-root", str(root), *argv])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


# ----------------------------------------------------------------------------- the files


def test_keys_never_collide_and_plain_keys_keep_their_file_names(state_dir: Path) -> None:
    keys = ["a/b", "a_b", "a:b", "a b", "vg-a+b", "vg-a_b", ".", "..", "", "x" * 300,
            "x" * 301]
    paths = {state.journal_path("drain", k) for k in keys}
    assert len(paths) == len(keys)
    assert all(len(p.name) < 128 and p.parent == state_dir / "drain" for p in paths)
    # run ids, bcache UUIDs, kernel and LVM names: the file names of older versions
    for k in (GOOD, "fb5bd09d-aace-4719-84d5-79fbb9e849bf", "sdb", "vg0-vm_disk"):
        assert state.journal_path("replace", k).name == f"{k}.json"
    # the lock of "a/b" held by another process does not stop "a_b" (nor the reverse)
    with held_elsewhere("a/b", state_dir), state.locked("a_b", "a_b"), \
            pytest.raises(UnsafeError, match="another cachemgr run is acting on a/b"), \
            state.locked("a/b", "a/b"):
        pass


BAD_FILES = {
    "truncated": lambda good: good[: len(good) // 2],
    "empty": lambda good: "",
    "not-json": lambda good: "{this is not json",
    "not-an-object": lambda good: "[1, 2, 3]\n",
    "newer-schema": lambda good: json.dumps({**json.loads(good), "schema": 99}),
    "schema-not-a-number": lambda good: json.dumps({**json.loads(good), "schema": "one"}),
    "unknown-fields": lambda good: json.dumps({**json.loads(good), "from_the_future": 1}),
    "missing-fields": lambda good: json.dumps({"schema": 1, "id": "x"}),
    "wrong-types": lambda good: json.dumps({**json.loads(good), "backings": "none"}),
    "bad-seconds": lambda good: json.dumps({**json.loads(good), "seconds": {"drain": "long"}}),
    "not-utf8": lambda good: "\udcff",
}
REASONS = {
    "truncated": "not valid JSON (truncated?)", "empty": "empty (truncated?)",
    "not-json": "not valid JSON", "not-an-object": "not a JSON object (a list)",
    "newer-schema": "written by a newer cachemgr (schema 99; this one reads up to 1)",
    "schema-not-a-number": "schema 'one' is not a version number",
    "unknown-fields": "unknown fields ['from_the_future']",
    "missing-fields": "no 'cset'", "wrong-types": "'backings' is a str",
    "bad-seconds": "'seconds' is not a map of step names to seconds",
    "not-utf8": "not UTF-8 text",
}


def test_schema_is_written_and_files_without_one_still_read(state_dir: Path) -> None:
    p = state.journal_path("drain", "x")
    state.write_json(p, {"original": {"writeback_percent": 10}})
    assert json.loads(p.read_text())["schema"] == state.SCHEMA
    assert state.read_json(p) == {"original": {"writeback_percent": 10}}
    p.write_text('{"original": {"writeback_percent": 10}}')  # written before versions
    assert state.read_json(p) == {"original": {"writeback_percent": 10}}


def write_good(state_dir: Path, status: str = "failed") -> replace.Journal:
    """A real plan on the captured scsi_debug set, journaled as stopped after 'drain'."""
    sysfs = Sysfs(fx("scsi-ssd-in-use"))
    ssd = snapshot.take(sysfs).cache_sets[0].caches[0].identity.node
    j = replace.plan(sysfs, ssd, replace.Options(yes=True))
    j.id = GOOD
    j.done = ["preflight", "remember", "mode-interim", "drain"]
    j.status, j.error = status, "detach: test"
    j.save()
    return j


def write_bad(state_dir: Path, kind: str) -> Path:
    good = state.journal_path("replace", GOOD).read_text()
    path = state.journal_path("replace", f"20261121-000000-{kind}")
    path.write_bytes(BAD_FILES[kind](good).encode("utf-8", "surrogateescape"))
    return path


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_journal_is_listed_apart_refused_by_resume_and_skipped_by_the_tui(
        kind: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_good(state_dir)
    bad = write_bad(state_dir, kind)
    root = fx("scsi-ssd-in-use")

    # --list: the good run on stdout, the bad file on stderr (path and why), exit 0
    rc, out, err = cli(root, ["replace-ssd", "--list"])
    assert rc == 0, err
    assert out.startswith(GOOD) and len(out.splitlines()) == 1
    assert f"replace-ssd: skipped {bad}: " in err and REASONS[kind] in err
    rc, out, err = cli(root, ["replace-ssd", "--list", "--json"])
    doc = json.loads(out)
    assert rc == 0 and [r["id"] for r in doc["runs"]] == [GOOD]
    assert [u["path"] for u in doc["unreadable"]] == [str(bad)]

    # --resume / --rollback of the bad one: exit 2, its path and why, nothing else done
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    commands = mutations_refused(monkeypatch)
    before = bad.read_bytes()
    for flag in ("--resume", "--rollback"):
        rc, _out, err = cli(root, ["replace-ssd", flag, bad.stem])
        assert rc == 2, err
        assert "Traceback" not in err and str(bad) in err and REASONS[kind] in err
    assert bad.read_bytes() == before and commands == []

    # the TUI's resume picker (ops.replace.runs) offers the good run only
    assert [j.id for j in ops_replace.runs(unfinished=True)] == [GOOD]
    assert [e.path for e in ops_replace.unreadable()] == [bad]


def test_tui_resume_picker_skips_a_bad_journal(state_dir: Path) -> None:
    from tui.dialogs.choose import ChoiceDialog
    from tui.screens.replace import ReplaceScreen

    write_good(state_dir)
    write_bad(state_dir, "truncated")
    app = app_on(fx("scsi-ssd-in-use"))

    async def go() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            from tui.widgets.devices import DeviceTable

            cset = "cset:" + snapshot.take(Sysfs(fx("scsi-ssd-in-use"))).cache_sets[0].uuid
            app.query_one(DeviceTable).select_key(cset)
            await settle(pilot, lambda: app.selected_key == cset)
            await pilot.press("s")
            await settle(pilot, lambda: isinstance(app.screen, ReplaceScreen))
            await pilot.press("r")
            await settle(pilot, lambda: shown(app, ChoiceDialog))
            screen = app.screen
            assert isinstance(screen, ChoiceDialog)
            assert [c for c, _ in screen.choices] == [GOOD]

    asyncio.run(go())


def test_a_bad_journal_does_not_stop_autoattach(state_dir: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    j = write_good(state_dir)
    bad = write_bad(state_dir, "not-json")
    busy = autoattach._busy_from_journals()
    assert busy[j.cset].startswith(f"replace-ssd run {GOOD} is unfinished")
    assert str(bad) in caplog.text


# ----------------------------------------------------------------------------- under the lock


def test_resume_and_rollback_read_the_journal_under_the_lock(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal read before the lock is stale once another run moved it on: the steps and
    the rollback act on the journal as it is on disk when the lock is held."""
    j = write_good(state_dir)
    stale = replace.Journal.load(GOOD)
    j.done += ["detach", "unregister"]
    j.save()  # another run went past the point of no return meanwhile
    sysfs = Sysfs(fx("scsi-ssd-in-use"))
    with pytest.raises(UnsafeError, match="past 'unregister'"):
        replace.rollback(sysfs, stale)
    j.status = "done"
    j.save()
    with pytest.raises(AlreadyError, match="already done"):
        replace.execute(sysfs, stale)
    assert replace.Journal.load(GOOD).status == "done"


def test_a_fresh_plan_does_not_take_over_a_journal_of_the_same_id(state_dir: Path) -> None:
    other = write_good(state_dir)
    mine = replace.Journal.load(GOOD)
    mine.done, mine.created = [], other.created + 1  # planned apart, the same id by chance
    with pytest.raises(UsageError, match="is taken by another run"):
        replace.execute(Sysfs(fx("scsi-ssd-in-use")), mine)
    assert replace.Journal.load(GOOD).done == other.done


def bcache_journal(root: Path) -> tuple[str, Path]:
    b = snapshot.take(Sysfs(root)).backings[0]
    path = state.journal_path("drain", b.key)
    state.write_json(path, {"device": b.device, "backing": b.identity.node, "uuid": b.uuid,
                            "original": {"writeback_percent": 10, "writeback_delay": 30,
                                         "writeback_running": 1}, "started": 1.0})
    return b.key, path


def dm_journal(root: Path) -> tuple[str, Path]:
    path = state.journal_path("dmcache-flush", "vmcache")
    table = (root.parent / "dmsetup-table.txt").read_text().split(": ", 1)[1].strip()
    state.write_json(path, {"device": "/dev/mapper/vmcache", "name": "vmcache", "uuid": "",
                            "original": table, "flush": table.replace("smq 0", "cleaner 0"),
                            "started": 1.0})
    return "dmcache-vmcache", path


@pytest.mark.parametrize("capture,target,journal", [
    ("bcache-writeback-dirty", "/dev/bcache0", bcache_journal),
    ("dmcache-writeback", "vmcache", dm_journal),
], ids=["bcache", "dm-cache"])
def test_drain_resume_while_another_process_holds_the_lock_changes_nothing(
        capture: str, target: str, journal: object, tmp_path: Path, state_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The running drain's journal (its original values) stays, and nothing is written or
    run: restoring under a running drain would undo its settings and stall it."""
    root = copy_capture(tmp_path, capture)
    key, path = journal(root)  # type: ignore[operator]
    before = path.read_bytes()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    writes = kernel_writes(monkeypatch)
    commands = mutations_refused(monkeypatch)
    with held_elsewhere(key, state_dir):
        rc, _out, err = cli(root, ["drain", "--resume", target])
    assert rc == 3, err
    assert "another cachemgr run is acting on" in err
    assert path.read_bytes() == before and writes == [] and commands == []


@pytest.mark.parametrize("capture,target,journal", [
    ("bcache-writeback-dirty", "/dev/bcache0", bcache_journal),
    ("dmcache-writeback", "vmcache", dm_journal),
], ids=["bcache", "dm-cache"])
def test_drain_resume_refuses_a_journal_it_cannot_read(
        capture: str, target: str, journal: object, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, capture)
    _, path = journal(root)  # type: ignore[operator]
    path.write_text('{"schema": 1, "device": "x"}')  # no original values
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    writes = kernel_writes(monkeypatch)
    commands = mutations_refused(monkeypatch)
    rc, _out, err = cli(root, ["drain", "--resume", target])
    assert rc == 2, err
    assert str(path) in err and "'original'" in err and "Traceback" not in err
    assert writes == [] and commands == [] and path.exists()


def test_restore_saved_takes_the_device_lock(tmp_path: Path, state_dir: Path) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    key, path = bcache_journal(root)
    b = snapshot.take(Sysfs(root)).backings[0]
    with held_elsewhere(key, state_dir), pytest.raises(UnsafeError):
        drain.restore_saved(Sysfs(root), b)
    assert path.exists()


def test_each_step_is_timed_over_every_attempt(state_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal keeps each step's wall seconds, a failed attempt's added to the resumed
    one's; --json gives them per step with their sum and the drain's, and the run's last line
    says where the time went."""
    from cachemgr.core.errors import CacheMgrError

    class Clock:
        now = 1000.0

        def monotonic(self) -> float:
            return self.now

        def time(self) -> float:
            return 1.8e9 + self.now

    write_good(state_dir)  # stopped after drain, as if it took 40 s
    clock = Clock()
    monkeypatch.setattr(replace_journal, "time", clock)
    monkeypatch.setattr(replace_run, "time", clock)
    j = replace.Journal.load(GOOD)
    j.seconds = {"drain": 40.0}
    j.save()
    fail = {"detach": 1}
    cost = {"detach": 2.0, "wait-new": 7.5}

    def fake(step: str):  # type: ignore[no-untyped-def]
        def run(c: replace.Ctx) -> None:
            clock.now += cost.get(step, 0.25)
            if fail.get(step):
                fail[step] -= 1
                raise CacheMgrError(f"{step} failed once")
        return run

    for n, _ in replace.STEPS:
        monkeypatch.setitem(replace.BCACHE.funcs, n, fake(n))
    sysfs = Sysfs(fx("scsi-ssd-in-use"))
    with pytest.raises(CacheMgrError, match="detach failed once"):
        replace.execute(sysfs, replace.Journal.load(GOOD))
    assert replace.Journal.load(GOOD).seconds == {"drain": 40.0, "detach": 2.0}
    done = replace.execute(sysfs, replace.Journal.load(GOOD))
    assert done.status == "done"
    assert done.seconds["detach"] == 4.0 and done.seconds["wait-new"] == 7.5
    assert replace.Journal.load(GOOD).seconds == done.seconds
    doc = ops_replace.journal_json(done)
    rest = len(replace.STEPS) - 3 - 3  # preflight and remember are not timed here
    assert doc["drain_s"] == 40.0
    assert doc["wall_s"] == pytest.approx(40 + 4 + 7.5 + 0.25 * rest)
    steps = {x["name"]: x["seconds"] for x in doc["steps"]}
    assert steps["preflight"] is None and steps["detach"] == 4.0
    line = ops_replace.timing_line(done)
    assert line.startswith(f"took {doc['wall_s']:.1f} s: drain 40.0 s, the other steps ")
    assert "(wait-new 7.5 s, detach 4.0 s, " in line
