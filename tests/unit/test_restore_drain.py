"""``cachemgr restore`` after a drain killed outright (issue #41): it put back only a bench's
undo journals and said "nothing to put back" (exit 4) while the drain had left
writeback_percent 0, and status and check named ``drain DEV --resume``. It puts back what
the drain left, as ``drain DEV --resume`` does before it drains again, through the same gate.
On a copy of a lab capture (bcache-writeback-dirty-uml).

Each test here failed on the code before its fix."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import owners
from tests.unit.test_parity import cli, plant
from tests.unit.tui_helpers import copy_capture, kernel_writes


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    return d


def second_admin(root: Path, *argv: str) -> tuple[int, str]:
    """A command in a thread of its own (another owner of locks, as another process would
    be): its exit code and stderr."""
    box: list[tuple[int, str, str]] = []
    t = threading.Thread(target=lambda: box.append(cli(root, list(argv))))
    t.start()
    t.join()
    rc, _, err = box[0]
    return rc, err



def drain_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Sysfs, Any]:
    """bcache0 as a drain killed outright (SIGKILL) leaves it: writeback_percent 0,
    writeback_delay 1, writeback_running 1, and the drain's journal holding the originals
    (10, 30, 1: test_parity.plant)."""
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    b = snapshot.take(sysfs).backings[0]
    plant(root, f"drain:{b.device}")
    rel = f"block/{b.identity.name}/bcache"
    sysfs.write(f"{rel}/writeback_percent", "0")
    sysfs.write(f"{rel}/writeback_delay", "1")
    sysfs.write(f"{rel}/writeback_running", "1")
    return root, sysfs, b


def tunables(sysfs: Sysfs, b: Any) -> tuple[str, ...]:
    rel = f"block/{b.identity.name}/bcache"
    return tuple(sysfs.read(f"{rel}/{n}").strip() for n in
                 ("writeback_percent", "writeback_delay", "writeback_running"))


def test_restore_puts_back_what_an_interrupted_drain_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a SIGKILLed drain, status and check name ``drain DEV --resume`` while
    ``restore`` said "nothing to put back" (exit 4) with writeback_percent left at 0 (the
    drain trap's fast pace, on for good). restore puts the drain's originals back (what
    drain --resume does first), and status and check stop naming the drain."""
    root, sysfs, b = drain_killed(tmp_path, monkeypatch)
    assert tunables(sysfs, b) == ("0", "1", "1")
    rc, out, _ = cli(root, ["status"])
    assert "owned by drain" in out and f"cachemgr drain {b.device} --resume" in out, out
    rc, out, err = cli(root, ["restore", "--json"])
    assert rc == 0, (out, err)
    (done,) = json.loads(out)["restored"]
    assert done["procedure"] == "drain" and done["device"] == b.device
    assert sorted(done["put_back"]) == ["writeback_delay=30", "writeback_percent=10",
                                        "writeback_running=1"]
    assert tunables(sysfs, b) == ("10", "30", "1")
    assert not [o for o in owners.interrupted() if o.procedure == "drain"]
    rc, out, _ = cli(root, ["status"])
    assert "owned by drain" not in out and "--resume" not in out, out
    rc, out, _ = cli(root, ["check", "--json"])
    assert not [f for f in json.loads(out)["findings"] if "drain" in f["code"]], out
    rc, out, _ = cli(root, ["restore"])
    assert rc == 4 and "nothing to put back" in out, out


def test_restore_says_what_it_put_back_and_leaves_a_running_drain_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, sysfs, b = drain_killed(tmp_path, monkeypatch)
    # the drain's process still runs (it holds the device's lock): refused, nothing changed
    with state.locked(b.key, b.device, holder={"procedure": "drain"}):
        rc, err = second_admin(root, "restore")
        assert rc == 3 and "held by drain" in err, err
        assert tunables(sysfs, b) == ("0", "1", "1")
    rc, out, err = cli(root, ["restore", b.device])
    assert rc == 0, err
    assert f"{b.device}: restored tunables " in out and "writeback_percent=10" in out, out
    assert "interrupted drain" in out and f"cachemgr drain {b.device}" in out, out
    assert tunables(sysfs, b) == ("10", "30", "1")
