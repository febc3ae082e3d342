"""Every refusal of the library, through both faces: the same outcome and the same words.

Each case runs one refusal (a) through the CLI in this process (``cachemgr.cli.main.main``, as
``cachemgr --sysfs-root CAPTURE ARGS...``) and (b) through the TUI under Textual's pilot, by
its keys and dialog buttons, on a writable copy of a capture. Both must agree (issue #14):

* the CLI's exit code is the case's, and the TUI's error word is the one for that code (the
  title of its error dialog, its log line; "already so" is a notification and a log line);
* the message and the hint are identical: the CLI's stderr without ``cachemgr: `` is the
  TUI's dialog body and the text of its log line;
* nothing was written: no sysfs write (tui_helpers.kernel_writes) and no command that
  changes anything (make-bcache, dmsetup, wipefs -a ...: refused by a guard here, so a slip
  cannot touch the host).

The refusals of the library that only one face can express (e.g. ``tune`` with a name the
TUI does not offer, ``force-run``, ``stop-set``) are not here: test_cli.py has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList, Static

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core.sysfs import Sysfs
from tests.unit.guards import held_elsewhere, mutations_refused
from tests.unit.tui_helpers import (
    app_on,
    click,
    copy_capture,
    handled,
    kernel_writes,
    quiet,
    settle,
    shown,
)
from tui.app import CacheMgrApp
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog, MessageDialog
from tui.dialogs.form import FormDialog

REPO = Path(__file__).resolve().parents[2]

# the TUI's word for each exit code of the CLI (tui/app.py ERROR_WORDS)
WORDS = {1: "failed", 2: "bad usage or input", 3: "refused as unsafe",
         4: "already so (nothing changed)"}

DIRTY_CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"  # bcache-writeback-dirty's cache set
FREE_CSET = "3a85497b-f234-4651-a39a-c547edabc679"  # bcache-unattached's (nothing attached)
NO_DEV = "/dev/cachemgr-no-such-disk"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


# ----------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """One refusal. ``at``: the row the TUI acts on ("/dev/bcacheN" or a backing node,
    "cset:UUID", "dm:NAME"; None: none); ``tui``: the steps there (see drive()); ``says``:
    words the message must hold (pins what is refused); ``lock``: held by another process
    meanwhile (a row spec as ``at``: the object's lock key)."""

    id: str
    capture: str
    argv: tuple[str, ...]
    at: str | None
    tui: tuple[tuple[str, object], ...]
    code: int
    says: str
    root: bool = True
    lock: str | None = None
    holder: str = "{}"  # what the lock's holder says of itself (JSON)
    # an interrupted procedure's journal planted first: "drain:ROW" (bcache drain) or
    # "replace:ROW" (a replace-ssd run that failed at its drain step)
    journal: str | None = None
    plan: bool = False  # the replace screen's plan: "refused: TEXT", no error word


def mode(m: str, button: str = "switch") -> tuple[tuple[str, object], ...]:
    return (("press", "m"), ("pick", m), ("click", f"#b-{button}"))


def tune(name: str, value: str) -> tuple[tuple[str, object], ...]:
    return (("press", "t"), ("pick", name), ("fill", {"#f-value": value}), ("press", "enter"))


DRAIN = (("press", "d"), ("click", "#b-go"))
REMOVE = (("press", "delete"), ("click", "#b-go"))
DETACH = (("press", "x"), ("click", "#b-go"))
ATTACH_FIRST = (("press", "a"), ("press", "enter"))  # the first (only) choice


def create_bcache(**fields: str) -> tuple[tuple[str, object], ...]:
    return (("press", "c"), ("pick", "bcache"),
            ("fill", {f"#f-{k}": v for k, v in fields.items()}), ("click", "#b-ok"),
            ("click", "#b-go"))


def create_dm(**fields: str) -> tuple[tuple[str, object], ...]:
    return (("press", "c"), ("pick", "dm-cache"),
            ("fill", {f"#f-{k}": v for k, v in fields.items()}), ("click", "#b-ok"),
            ("click", "#b-go"))


CASES = [
    # --- bcache
    Case("remove-cset-with-dirty-backing", "bcache-writeback-dirty",
         ("remove", DIRTY_CSET), f"cset:{DIRTY_CSET}", REMOVE, 3,
         "holds dirty data of /dev/bcache0"),
    Case("tune-out-of-range", "bcache-writeback-dirty",
         ("tune", "/dev/bcache0", "writeback_percent=41"), "/dev/bcache0",
         tune("writeback_percent", "41"), 2, "must be between 0 and 40, not 41"),
    Case("tune-cset-out-of-range", "bcache-writeback-dirty",
         ("tune", DIRTY_CSET, "congested_read_threshold_us=-1"), f"cset:{DIRTY_CSET}",
         tune("congested_read_threshold_us", "-1"), 2, "not -1"),
    Case("tune-not-an-integer", "bcache-writeback-dirty",
         ("tune", "/dev/bcache0", "writeback_percent=abc"), "/dev/bcache0",
         tune("writeback_percent", "abc"), 2, "'abc' is not an integer"),
    Case("mode-already-so", "bcache-writeback-dirty",
         ("mode", "/dev/bcache0", "writeback"), "/dev/bcache0", mode("writeback"), 4,
         "already in writeback mode"),
    Case("drain-no-cache", "bcache-unattached", ("drain", "/dev/bcache0"), "/dev/bcache0",
         DRAIN, 4, "nothing to drain"),
    Case("drain-cache-set-missing", "bcache-missing-cache", ("drain", "/dev/ubda"),
         "/dev/ubda", DRAIN, 1, "its cache set is not registered"),
    Case("remove-backing-cache-set-missing", "bcache-missing-cache", ("remove", "/dev/ubda"),
         "/dev/ubda", REMOVE, 3, "has dirty data in its cache"),
    Case("create-bcache-missing-device", "bcache-unattached",
         ("create", "bcache", "--backing", NO_DEV), None, create_bcache(backing=NO_DEV), 2,
         f"{NO_DEV}: no such device"),
    Case("create-bcache-unknown-mode", "bcache-unattached",
         ("create", "bcache", "--backing", NO_DEV, "--mode", "writeforward"), None,
         create_bcache(backing=NO_DEV, mode="writeforward"), 2,
         "unknown cache mode 'writeforward'"),
    Case("replace-plan-non-scsi-ssd", "bcache-writeback-dirty",
         ("replace-ssd", DIRTY_CSET, "--dry-run"), f"cset:{DIRTY_CSET}",
         (("press", "s"), ("press", "p")), 2,
         "/dev/ubdb is neither a SCSI disk nor an NVMe namespace", plan=True),
    # --- dm-cache
    Case("dm-replace-plan-non-scsi-ssd", "dmcache-writeback",
         ("replace-ssd", "vmcache", "--dry-run"), "dm:vmcache",
         (("press", "s"), ("press", "p")), 2,
         "/dev/ubdb (the SSD under /dev/mapper/vmcache) is neither a SCSI disk nor an NVMe "
         "namespace", plan=True),
    Case("dm-passthrough-while-dirty", "dmcache-writeback",
         ("mode", "vmcache", "passthrough"), "dm:vmcache", mode("passthrough"), 3,
         "dm-cache accepts passthrough only when every block is clean"),
    Case("dm-mode-already-so", "dmcache-writeback", ("mode", "vmcache", "writeback"),
         "dm:vmcache", mode("writeback"), 4, "already in writeback mode"),
    Case("dm-tune-below-one-block", "dmcache-writeback",
         ("tune", "vmcache", "migration_threshold=1"), "dm:vmcache",
         tune("migration_threshold", "1"), 2, "at least one cache block (64 sectors)"),
    Case("dm-tune-already-so", "dmcache-writeback",
         ("tune", "vmcache", "migration_threshold=2048"), "dm:vmcache",
         tune("migration_threshold", "2048"), 4, "migration_threshold is already 2048"),
    Case("dm-lvm-owned-mode", "dmcache-states", ("mode", "vg0-lv0", "writethrough"),
         "dm:vg0-lv0", mode("writethrough"), 3,
         "use LVM: lvchange --cachemode writethrough vg0/lv0"),
    Case("dm-lvm-owned-mode-drain", "dmcache-states",
         ("mode", "vg0-lv0", "writethrough", "--drain"), "dm:vg0-lv0",
         mode("writethrough", "drain"), 3, "belongs to LVM"),
    Case("dm-lvm-owned-tune", "dmcache-states", ("tune", "vg0-lv0", "migration_threshold=8192"),
         "dm:vg0-lv0", tune("migration_threshold", "8192"), 3,
         "lvchange --cachesettings migration_threshold=8192 vg0/lv0"),
    Case("dm-lvm-owned-remove", "dmcache-states", ("remove", "vg0-lv0"), "dm:vg0-lv0",
         REMOVE, 3, "lvconvert --uncache vg0/lv0"),
    Case("dm-lvm-owned-drain", "dmcache-states", ("drain", "vg0-lv0"), "dm:vg0-lv0", DRAIN,
         3, "lvchange --cachepolicy cleaner vg0/lv0"),
    Case("dm-failed-drain", "dmcache-failed", ("drain", "failing"), "dm:failing", DRAIN, 3,
         "the kernel reports the cache as Fail"),
    Case("dm-failed-mode", "dmcache-failed", ("mode", "failing", "writethrough"),
         "dm:failing", mode("writethrough"), 3, "so its mode is not changed"),
    Case("dm-failed-remove", "dmcache-failed", ("remove", "failing"), "dm:failing", REMOVE,
         3, "the kernel reports the cache as Fail"),
    Case("dm-failed-tune", "dmcache-failed", ("tune", "failing", "migration_threshold=4096"),
         "dm:failing", tune("migration_threshold", "4096"), 3,
         "its migration_threshold is not changed"),
    Case("create-dm-missing-origin", "bcache-unattached",
         ("create", "dm-cache", "pcache", "--origin", NO_DEV, "--cache", NO_DEV + "2",
          "--metadata", NO_DEV + "3"), None,
         create_dm(name="pcache", origin=NO_DEV, cache=NO_DEV + "2", metadata=NO_DEV + "3"),
         2, f"{NO_DEV} (origin): no such device"),
    Case("create-dm-bad-name", "bcache-unattached",
         ("create", "dm-cache", "p/cache", "--origin", NO_DEV, "--cache", NO_DEV + "2",
          "--metadata", NO_DEV + "3"), None,
         create_dm(name="p/cache", origin=NO_DEV, cache=NO_DEV + "2", metadata=NO_DEV + "3"),
         2, "bad dm name 'p/cache'"),
    # --- not root (os.geteuid() == 1000 in both faces)
    Case("not-root-mode", "bcache-writeback-dirty", ("mode", "/dev/bcache0", "writethrough"),
         "/dev/bcache0", mode("writethrough"), 2, "changing a cache mode needs root",
         root=False),
    Case("not-root-drain", "bcache-writeback-dirty", ("drain", "/dev/bcache0"),
         "/dev/bcache0", DRAIN, 2, "draining needs root", root=False),
    Case("not-root-detach", "bcache-writeback-dirty", ("detach", "/dev/bcache0"),
         "/dev/bcache0", DETACH, 2, "detaching needs root", root=False),
    Case("not-root-attach", "bcache-unattached", ("attach", "/dev/bcache0", FREE_CSET),
         f"cset:{FREE_CSET}", ATTACH_FIRST, 2, "attaching needs root", root=False),
    Case("not-root-remove", "bcache-unattached", ("remove", FREE_CSET), f"cset:{FREE_CSET}",
         REMOVE, 2, "removing needs root", root=False),
    Case("not-root-tune", "bcache-writeback-dirty",
         ("tune", "/dev/bcache0", "writeback_percent=5"), "/dev/bcache0",
         tune("writeback_percent", "5"), 2, "tuning needs root", root=False),
    Case("not-root-dm-mode", "dmcache-writeback", ("mode", "vmcache", "writethrough"),
         "dm:vmcache", mode("writethrough"), 2, "changing a dm-cache mode needs root",
         root=False),
    # --- another run holds the object's lock (a separate process)
    Case("locked-drain", "bcache-writeback-dirty", ("drain", "/dev/bcache0"), "/dev/bcache0",
         DRAIN, 3, "another cachemgr run is acting on /dev/bcache0", lock="/dev/bcache0"),
    Case("locked-mode", "bcache-writeback-dirty", ("mode", "/dev/bcache0", "writethrough"),
         "/dev/bcache0", mode("writethrough"), 3, "another cachemgr run is acting on",
         lock="/dev/bcache0"),
    Case("locked-remove-cset", "bcache-unattached", ("remove", FREE_CSET), f"cset:{FREE_CSET}",
         REMOVE, 3, f"another cachemgr run is acting on cache set {FREE_CSET}",
         lock=f"cset:{FREE_CSET}"),
    Case("locked-dm-mode", "dmcache-writeback", ("mode", "vmcache", "writethrough"),
         "dm:vmcache", mode("writethrough"), 3,
         "another cachemgr run is acting on /dev/mapper/vmcache", lock="dm:vmcache"),
    # --- the gate: a procedure owns the device (cachemgr/ops/gate.py)
    Case("drain-holds-tune", "bcache-writeback-dirty",
         ("tune", "/dev/bcache0", "writeback_percent=5"), "/dev/bcache0",
         tune("writeback_percent", "5"), 3, "/dev/bcache0 is held by drain",
         lock="/dev/bcache0", holder='{"procedure": "drain"}'),
    Case("replace-holds-mode", "bcache-writeback-dirty",
         ("mode", "/dev/bcache0", "writethrough"), "/dev/bcache0", mode("writethrough"), 3,
         "is held by replace-ssd run r1",
         lock=f"cset:{DIRTY_CSET}", holder='{"procedure": "replace-ssd", "run": "r1", '
                                           '"step": "drain"}'),
    Case("interrupted-drain-mode", "bcache-writeback-dirty",
         ("mode", "/dev/bcache0", "writethrough"), "/dev/bcache0", mode("writethrough"), 3,
         "owned by drain", journal="drain:/dev/bcache0"),
    Case("interrupted-replace-tune", "bcache-writeback-dirty",
         ("tune", "/dev/bcache0", "writeback_percent=5"), "/dev/bcache0",
         tune("writeback_percent", "5"), 3, "owned by replace-ssd run gate-test",
         journal="replace:/dev/bcache0"),
    Case("interrupted-replace-drain", "bcache-writeback-dirty", ("drain", "/dev/bcache0"),
         "/dev/bcache0", DRAIN, 3, "resume it (cachemgr replace-ssd --resume gate-test) or "
         "roll it back", journal="replace:/dev/bcache0"),
]


def plant(root: Path, spec: str) -> None:
    """An interrupted procedure's journal (see Case.journal), as that procedure writes it."""
    from cachemgr.core import state

    what, row = spec.split(":", 1)
    snap = snapshot.take(Sysfs(str(root)))
    b = next(b for b in snap.backings if row in (b.device, b.identity.node))
    if what == "drain":
        state.write_json(state.journal_path("drain", b.key), {
            "device": b.device, "backing": b.identity.node, "uuid": b.uuid,
            "original": {"writeback_percent": 10, "writeback_delay": 30,
                         "writeback_running": 1}, "started": 1.0})
        return
    from cachemgr.procedures import replace

    j = replace.Journal(id="gate-test", cset=b.cset_uuid or "", options={}, old={},
                        backings=[{"uuid": b.uuid, "name": b.identity.name,
                                   "node": b.identity.node, "device": b.device,
                                   "mode": "writeback"}],
                        done=["preflight", "remember", "mode-interim"], status="failed")
    j.save()


# ----------------------------------------------------------------------------- helpers


def cli(root: Path, argv: Sequence[str]) -> tuple[int, str, str]:
    """``cachemgr --sysfs-root ROOT ARGV...`` in this process: (exit code, stdout, stderr)
    (as tests/kernel/clirun.py's in_process)."""
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()  # main() binds its log handler to this call's stderr
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["--sysfs-root", str(root), *argv])
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


def row_key(root: Path, spec: str) -> str:
    """The TUI row of ``spec``: a backing device (/dev/bcacheN or its disk), cset:UUID or
    dm:NAME."""
    if not spec.startswith("/dev/"):
        return spec
    snap = snapshot.take(Sysfs(root))
    return next(b.key for b in snap.backings if spec in (b.device, b.identity.node))


def lock_key(root: Path, spec: str) -> str:
    """The lock the library takes on ``spec`` (cachemgr/ops/cache.py,
    cachemgr/backends/dmcache/flushing.py)."""
    if spec.startswith("cset:"):
        return "replace-" + spec.removeprefix("cset:")
    if spec.startswith("dm:"):
        return "dmcache-" + spec.removeprefix("dm:")
    return row_key(root, spec)  # BcacheBacking.key


async def pick(pilot: object, app: CacheMgrApp, choice: str) -> None:
    """In the open ChoiceDialog: arrow keys to ``choice``, then Enter."""
    await settle(pilot, lambda: shown(app, ChoiceDialog))
    await handled(pilot)  # composed is not mounted: on_mount puts the highlight on the current
    screen = app.screen
    assert isinstance(screen, ChoiceDialog)
    ids = [c for c, _ in screen.choices]
    assert choice in ids, (choice, ids)
    ol = screen.query_one(OptionList)
    await settle(pilot, lambda: ol.highlighted is not None)
    at = ol.highlighted
    assert at is not None
    step = "down" if ids.index(choice) > at else "up"
    await pilot.press(*[step] * abs(ids.index(choice) - at))  # type: ignore[attr-defined]
    # the pilot's wait on a key can end before the app handled it (textual's wait_for_idle
    # takes a process starved of CPU for an idle one): wait for the highlight itself
    await settle(pilot, lambda: ol.highlighted == ids.index(choice))
    await pilot.press("enter")  # type: ignore[attr-defined]


async def drive(pilot: object, app: CacheMgrApp, steps: Sequence[tuple[str, object]]) -> None:
    """The case's keys and buttons: ("press", key), ("pick", choice id), ("fill", {input
    selector: value}) in the open FormDialog, ("click", button selector)."""
    for what, arg in steps:
        if what == "press":
            await pilot.press(str(arg))  # type: ignore[attr-defined]
        elif what == "pick":
            await pick(pilot, app, str(arg))
        elif what == "fill":
            await settle(pilot, lambda: isinstance(app.screen, FormDialog)
                         and bool(app.screen.query(Input)))
            assert isinstance(arg, dict)
            for sel, value in arg.items():
                app.screen.query_one(sel, Input).value = value
        elif what == "click":
            sel = str(arg)
            await settle(pilot, lambda sel=sel: bool(app.screen.query(sel)))  # type: ignore[misc]
            if sel in ("#b-go", "#b-switch", "#b-drain"):
                assert isinstance(app.screen, ConfirmDialog)
            await click(pilot, sel)
        else:
            raise AssertionError(what)


@dataclass
class TuiOutcome:
    word: str | None  # the error word (None: the replace plan, which has none)
    text: str  # the message and hint as shown
    dialog: bool  # shown in an error dialog


async def outcome(pilot: object, app: CacheMgrApp, case: Case) -> TuiOutcome:
    """What the TUI says about the operation the case started (checks that the dialog and
    the log line say the same)."""
    if case.plan:
        plan = app.screen.query_one("#plan", Static)
        await settle(pilot, lambda: str(plan.render()).startswith("refused: "))
        text = str(plan.render()).removeprefix("refused: ")
        assert f"✗ replace-ssd plan: {text}" in app.log_history
        return TuiOutcome(None, text, False)
    await settle(pilot, lambda: any(line.startswith(("✗ ", "= "))
                                    for line in app.log_history))
    started = [line[2:] for line in app.log_history if line.startswith("▶ ")]
    assert len(started) == 1, app.log_history
    title = started[0]
    done = [line for line in app.log_history if line.startswith(("✗ ", "= "))]
    assert len(done) == 1, app.log_history
    line = done[0]
    if line.startswith("= "):  # a result that is "already so": its notes say why
        assert line == f"= {title}: already so (nothing changed)"
        notes = [n[2:] for n in app.log_history if n.startswith("  ")]
        return TuiOutcome("already so (nothing changed)",
                          "\n".join(n.removeprefix("cachemgr: ") for n in notes), False)
    head = f"✗ {title}: "
    assert line.startswith(head), (line, title)
    rest = line.removeprefix(head).split("\n")[0]
    word = next((w for w in WORDS.values() if rest.startswith(w + ": ")), None)
    assert word is not None, line
    text = line.removeprefix(f"{head}{word}: ")
    if word == WORDS[4]:  # a notification and the log line, no dialog
        await quiet(pilot)
        return TuiOutcome(word, text, shown(app, MessageDialog))
    await settle(pilot, lambda: shown(app, MessageDialog))
    screen = app.screen
    assert isinstance(screen, MessageDialog)
    assert str(screen.query_one(".dialog-title", Static).render()) == f"{title}: {word}"
    body = str(screen.query_one(".dialog-body", Static).render())
    assert body == text, (body, text)
    return TuiOutcome(word, body, True)


async def through_tui(root: Path, case: Case) -> TuiOutcome:
    app = app_on(root)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, lambda: app.polls > 0)
        if case.at is not None:
            from tui.widgets.devices import DeviceTable

            key = row_key(root, case.at)
            app.query_one(DeviceTable).select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
        await drive(pilot, app, case.tui)
        return await outcome(pilot, app, case)


# ----------------------------------------------------------------------------- the test


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refusal_is_the_same_in_the_cli_and_the_tui(case: Case, tmp_path: Path,
                                                    state_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, case.capture)
    writes = kernel_writes(monkeypatch)
    commands = mutations_refused(monkeypatch)
    if not case.root:
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with contextlib.ExitStack() as stack:
        if case.lock is not None:
            stack.enter_context(held_elsewhere(lock_key(root, case.lock), state_dir,
                                               case.holder))
        if case.journal is not None:
            plant(root, case.journal)
        rc, out, err = cli(root, case.argv)
        tui = asyncio.run(through_tui(root, case))

    # the CLI: the case's exit code, nothing on stdout, the library's words on stderr
    assert rc == case.code, (rc, err)
    assert out == ""
    assert err.startswith("cachemgr: ") and err.endswith("\n"), err
    said = err.removeprefix("cachemgr: ").removesuffix("\n")
    assert case.says in said, said
    # the TUI: the word for that exit code, the same message and hint
    if not case.plan:
        assert tui.word == WORDS[case.code]
        assert tui.dialog is (case.code != 4), "a dialog for 'already so' only"
    assert tui.text == said
    # nothing was changed in either face
    assert writes == []
    assert commands == []
