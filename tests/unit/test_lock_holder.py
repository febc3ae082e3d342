"""Who holds a lock, read without taking it (core/state.py current_holder, held_locks): the
text a SIGKILLed holder left is never read as a running holder through another file's flock.

Each test here failed on the code before its fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.core import state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    return d


# ------------------------------------------------- a killed holder's text is not "running"


def _killed_holding(key: str, state_dir: Path) -> Path:
    """A process took ``key``'s lock and was SIGKILLed: its text stays in the lock file."""
    code = ("import sys\nfrom cachemgr.core import state\n"
            "with state.locked(sys.argv[1], 'test', holder={'procedure': 'replace-ssd', "
            "'run': 'r9'}):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, key], cwd=REPO, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env={**os.environ, "CACHEMGR_STATE_DIR": str(state_dir),
                              "PYTHONPATH": str(REPO)})
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    path = state_dir / "locks" / f"{key}.lock"
    assert '"run": "r9"' in path.read_text()
    return path


@pytest.fixture
def proc_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """/proc/locks as the test writes it (read through pathlib, as state.py reads it)."""
    fake = tmp_path / "proc-locks"
    fake.write_text("")
    real = Path.read_text

    def read_text(self: Path, *a: object, **kw: object) -> str:
        return real(fake if str(self) == "/proc/locks" else self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    yield fake


def test_a_killed_holders_text_is_not_read_as_running_through_another_files_flock(
        state_dir: Path, proc_locks: Path) -> None:
    """/proc/locks is matched by inode number alone (overlayfs prints another device): a
    flock some other process holds on a file of another filesystem with the same inode
    number made the text a SIGKILLed run left read as a running holder. A running
    replace-ssd run is not reported by check, and plan refused with "held by". The
    holder's pid must be the one /proc/locks names for that inode."""
    path = _killed_holding("replace-c2958027", state_dir)
    ino = os.stat(path).st_ino
    other = os.getppid()  # some live process, not the killed holder
    proc_locks.write_text(f"1: FLOCK  ADVISORY  WRITE {other} 00:2d:{ino} 0 EOF\n")
    assert state.current_holder("replace-c2958027") is None
    assert state.held_locks() == []
    # the same inode flocked by the pid the file names: that holder is running
    pid = int(path.read_text().split('"pid": ')[1].split(",")[0])
    proc_locks.write_text(f"1: FLOCK  ADVISORY  WRITE {pid} 08:01:{ino} 0 EOF\n")
    assert (state.current_holder("replace-c2958027") or {}).get("run") == "r9"


def test_a_cleanly_released_lock_is_not_read_as_running_through_another_files_flock(
        state_dir: Path, proc_locks: Path) -> None:
    """A released lock file is empty: read while another file's flock had its inode number,
    it said {"raw": "locked"}, an anonymous run holding the device."""
    with state.locked("dmcache-vmcache", "/dev/mapper/vmcache"):
        pass
    path = state_dir / "locks" / "dmcache-vmcache.lock"
    assert path.read_text() == ""
    proc_locks.write_text(f"1: FLOCK  ADVISORY  WRITE {os.getppid()} 00:2d:"
                          f"{os.stat(path).st_ino} 0 EOF\n")
    assert state.current_holder("dmcache-vmcache") is None


def test_a_held_lock_is_read_from_the_real_proc_locks(state_dir: Path) -> None:
    """The real /proc/locks, this process holding the lock: its holder is read."""
    with state.locked("k1", "/dev/bcache0", holder={"procedure": "drain"}):
        assert (state.current_holder("k1") or {}).get("procedure") == "drain"
    assert state.current_holder("k1") is None
