"""Monitoring as a user other than root (issue #41 item 3): ``check``, ``status`` and
``metrics`` run as uid 65534 read what they can, say once what they could not (one line on
stderr, ``unseen`` in the JSON, ``cachemgr_unseen`` in the metrics), never write, and
``check`` says root's verdict or UNKNOWN, never OK or WARNING while something it could not
read could hide a CRITICAL. The runs as another user need root to drop to it (``setpriv``),
on captured trees (tests/fixtures); the lab's real kernel: tests/kernel/test_nonroot_kernel.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.model import Unseen
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import unseen
from cachemgr.procedures.health import Level

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                             reason="runs the CLI as uid 65534 through setpriv: needs root")


def cm(*args: str, fixture: str, state: Path, uid: int | None = NOBODY,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cachemgr", "--sysfs-root", str(FIX / fixture / "sys"), *args]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    # no dm-cache record directory (beside the state directory, where uid 65534 may look)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CACHEMGR_STATE_DIR": str(state),
           "CACHEMGR_DMCACHE_DIR": str(state.parent / "dmcache")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's own tmp_path is under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="cachemgr-nonroot-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@pytest.fixture
def root_state(open_dir: Path) -> Path:
    """A state directory as cachemgr makes it (root's, mode 0700, a lock file in locks/),
    under a directory every user may enter."""
    st = open_dir / "state"
    (st / "locks").mkdir(parents=True, mode=0o700)
    st.chmod(0o700)
    (st / "locks" / "x.lock").write_text("")
    (st / "locks" / "x.lock").chmod(0o600)
    return st


def listing(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in [d, *d.rglob("*")]}


@as_root
def test_check_is_unknown_with_one_line_not_ok(root_state: Path) -> None:
    """Root says OK on this dirty writeback device; uid 65534 cannot read the state
    directory, which could hold an interrupted replacement (CRITICAL): UNKNOWN, one line."""
    fx = "bcache-writeback-dirty-uml"
    assert cm("check", fixture=fx, state=root_state, uid=None).returncode == 0
    before = listing(root_state)
    r = cm("check", fixture=fx, state=root_state)
    assert r.returncode == 3 and r.stderr == "", r
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"CACHEMGR UNKNOWN - not root: not read: state-directory "
                               f"{root_state} (Permission denied): interrupted or running "
                               "procedures"), lines[0]
    assert "Traceback" not in r.stdout and "PermissionError" not in r.stdout
    r = cm("check", "--json", fixture=fx, state=root_state)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["status"] == "UNKNOWN" and doc["exit_code"] == 3
    assert doc["unseen"] == [{"what": "state-directory", "path": str(root_state),
                              "why": "Permission denied", "hides": unseen.STATE_HIDES}]
    assert listing(root_state) == before


@as_root
def test_a_critical_seen_stays_critical(root_state: Path) -> None:
    """What it could not read cannot make a CRITICAL it sees less: root's verdict, with the
    line of what was not read after the findings."""
    for fx in ("bcache-missing-cache-uml", "dmcache-failed-uml"):
        root = cm("check", fixture=fx, state=root_state, uid=None)
        r = cm("check", fixture=fx, state=root_state)
        assert root.returncode == r.returncode == 2, (root, r)
        assert r.stdout.splitlines()[0] == root.stdout.splitlines()[0]
        assert r.stdout.splitlines()[-1].startswith("not root: not read: state-directory")


@as_root
def test_status_and_metrics_say_once_what_they_could_not_read(root_state: Path) -> None:
    fx = "bcache-writeback-dirty-uml"
    before = listing(root_state)
    root = json.loads(cm("status", "--json", fixture=fx, state=root_state, uid=None).stdout)
    r = cm("status", fixture=fx, state=root_state)
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("cachemgr: not root: not read: "
                                               "state-directory"), r.stderr
    assert "/dev/bcache0" in r.stdout
    r = cm("status", "--json", fixture=fx, state=root_state)
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["devices"] == root["devices"] and root["unseen"] == []
    assert [u["what"] for u in doc["unseen"]] == ["state-directory"]
    r = cm("metrics", "--no-vms", fixture=fx, state=root_state)
    assert r.returncode == 0, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "not root: not read" in r.stderr
    assert f'cachemgr_unseen{{path="{root_state}",what="state-directory"}} 1.0' in r.stdout
    assert "cachemgr_health_status 3.0" in r.stdout
    assert 'cachemgr_dirty_bytes{device="bcache0"' in r.stdout
    assert listing(root_state) == before


@as_root
def test_nothing_is_created_without_root(open_dir: Path) -> None:
    """A state directory that is not there stays so: not even ``status --watch`` (a poller,
    which as root makes it) or the metrics make one, where uid 65534 could."""
    home = open_dir / "theirs"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    state = home / "state"
    fx = "bcache-writeback-dirty-uml"
    for args in (("check",), ("status",), ("status", "--json"), ("metrics", "--no-vms")):
        r = cm(*args, fixture=fx, state=state)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stderr == "", (args, r.stderr)  # nothing unread: there is nothing
    try:
        cm("status", "--watch", "0.2", fixture=fx, state=state, timeout=8)
    except subprocess.TimeoutExpired:
        pass
    assert list(home.iterdir()) == []


def test_without_root_dmsetup_is_not_run_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """dmsetup needs /dev/mapper/control (root's only): another user's scan does not run it
    and lists the dm devices it could not look into; root's scan of the same tree finds the
    dm-cache device."""
    sysfs = Sysfs(FIX / "dmcache-writeback-uml" / "sys")
    assert [d.name for d in snapshot.take(sysfs).dmcaches] == ["vmcache"]
    monkeypatch.setattr(snapshot, "sees_all", lambda s: False)

    class NoDmsetup:
        def output(self, what: str) -> str:
            raise AssertionError(f"dmsetup {what} run without root")

    monkeypatch.setattr(snapshot.dmcache, "default_source", lambda s: NoDmsetup())
    snap = snapshot.take(sysfs)
    assert snap.dmcaches == () and snap.writecaches == ()
    assert [(u.what, u.path) for u in snap.unseen] == [("dmsetup", "/dev/mapper/control")]
    assert "vmcache" in snap.unseen[0].hides
    assert snapshot.to_json(snap)["devices"] == []


def test_the_verdict_is_never_better_than_what_was_not_seen() -> None:
    one = (Unseen("state-directory", "/var/lib/cachemgr", "Permission denied", "x"),)
    assert unseen.verdict(Level.OK, one) == Level.UNKNOWN
    assert unseen.verdict(Level.WARNING, one) == Level.UNKNOWN
    assert unseen.verdict(Level.CRITICAL, one) == Level.CRITICAL
    for lvl in Level:
        assert unseen.verdict(lvl, ()) == lvl
    assert unseen.words(one).startswith("not root: not read: state-directory "
                                        "/var/lib/cachemgr (Permission denied): x")
