"""The udev handler, its worker and the auto-attach pass cannot be turned against root either
(issue #30 item 4): they open what they keep under the state directory as
cachemgr/core/state.py does (cachemgr/core/safefs.py), never through a link.

Each hole is a file planted as a symbolic link to a file outside (a root-only file with
content, or a name that does not exist yet): the auto-attach pending lock, the queue's
temporary file, worker.log, the run lock and the action journal. The call is refused (or,
for the temporary file, never opens the planted name) and the file outside keeps its
content or is never made. And the handler, run as root, refuses (one line on stderr and to
syslog, exit 1, nothing written) a state directory that is a link or another user's.

Before the fix each opened the planted link: the lock files and worker.log made the file
outside, the queue's temporary file was truncated and overwritten through it, the action
journal appended to it, and the handler queued into any state directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cachemgr.cli import udev as udev_cli
from cachemgr.core import safefs
from cachemgr.core.errors import UsageError
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.ops import udev as udev_ops
from cachemgr.procedures import autoattach

NOBODY = 65534
SECRET = b"root's own secret\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the checks are root's: run as root")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Where planted links point: ``secret`` (a root-only file) and ``new`` (not made)."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret").write_bytes(SECRET)
    (d / "secret").chmod(0o600)
    return d


@pytest.fixture
def sd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory as root makes it, with the auto-attach directories."""
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    for sub in ("locks", "autoattach/queue"):
        (d / sub).mkdir(parents=True, mode=0o700)
    d.chmod(0o700)
    (d / "autoattach").chmod(0o700)
    return d


def untouched(outside: Path) -> None:
    assert (outside / "secret").read_bytes() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def refused(call: Callable[[], Any], planted: Path, outside: Path) -> None:
    """``call`` is refused naming ``planted``, for a link to the secret and for a link to a
    name that does not exist; the link stays, nothing outside changes."""
    for target in (outside / "secret", outside / "new"):
        planted.unlink(missing_ok=True)
        planted.symlink_to(target)
        with pytest.raises((safefs.UnsafePathError, UsageError),
                           match=rf"{planted}: a symbolic link \(to {target}\).*fix: rm "
                                 rf"{planted}"):
            call()
        assert planted.is_symlink()
        untouched(outside)


def test_the_pending_lock(sd: Path, outside: Path) -> None:
    refused(udev_ops.worker_pending, sd / "locks" / "autoattach-pending.lock", outside)


def test_the_pending_lock_refuses_the_worker(sd: Path, outside: Path) -> None:
    refused(lambda: udev_ops.worker(str(outside / "none.toml"), linger=0),
            sd / "locks" / "autoattach-pending.lock", outside)


def test_the_run_lock_of_the_worker_and_the_boot_pass(sd: Path, outside: Path) -> None:
    lock = sd / "locks" / "autoattach-run.lock"
    refused(lambda: os.close(udev_ops._lock_fd("autoattach-run")), lock, outside)

    def boot_pass_lock() -> None:
        with autoattach_ops._run_lock():
            pass

    refused(boot_pass_lock, lock, outside)


def test_a_hard_linked_run_lock_is_refused(sd: Path, outside: Path) -> None:
    lock = sd / "locks" / "autoattach-run.lock"
    os.link(outside / "secret", lock)
    with pytest.raises(UsageError, match=rf"{lock}: a file with 2 links"), \
            autoattach_ops._run_lock():
        pass
    with pytest.raises(safefs.UnsafePathError, match=rf"{lock}: a file with 2 links"):
        udev_ops._lock_fd("autoattach-run")
    untouched(outside)


def test_the_action_journal(sd: Path, outside: Path) -> None:
    journal = sd / "autoattach" / "actions.jsonl"
    assert Path(autoattach.actions_log()) == journal
    refused(lambda: autoattach.record({"kind": "pass"}), journal, outside)
    journal.unlink()
    autoattach.record({"kind": "pass"})  # a file of its own: written
    assert '"kind": "pass"' in journal.read_text()
    assert not journal.is_symlink() and oct(journal.stat().st_mode & 0o777) == "0o600"


def test_worker_log(sd: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forked worker's log is opened before the fork, by the handler: a refusal is the
    handler's (exit 1, said on stderr and syslog), and no worker starts."""
    def no_fork() -> int:
        raise AssertionError("forked a worker with its log planted as a link")

    monkeypatch.setattr(os, "fork", no_fork)
    refused(lambda: udev_ops.spawn(str(outside / "none.toml"), how="fork"),
            sd / "autoattach" / "worker.log", outside)


def test_the_queues_temporary_file(sd: Path, outside: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file had a name known in advance (``.<ns>-<seqnum>-<pid>.env``),
    opened O_TRUNC through a link. Now it is made O_EXCL|O_NOFOLLOW under a random name: a
    link planted at the old name is never opened, and the event lands in the queue."""
    monkeypatch.setattr(time, "time_ns", lambda: 1234)
    q = sd / "autoattach" / "queue"
    planted = q / f".1234-5-{os.getpid()}.env"
    planted.symlink_to(outside / "secret")
    path = udev_ops.enqueue({"ACTION": "add", "DEVNAME": "/dev/sdq", "SEQNUM": "5"})
    assert path == str(q / f"1234-5-{os.getpid()}.env")
    assert Path(path).read_bytes() == b"ACTION=add\0DEVNAME=/dev/sdq\0SEQNUM=5\0"
    assert not Path(path).is_symlink() and oct(Path(path).stat().st_mode & 0o777) == "0o600"
    assert planted.is_symlink()
    assert sorted(p.name for p in q.iterdir()) == sorted([planted.name, Path(path).name])
    untouched(outside)


def test_a_queued_link_is_dropped_not_read(sd: Path, outside: Path) -> None:
    """The worker reads the queue without following links (only root can put one there)."""
    q = sd / "autoattach" / "queue"
    (q / "1-1-1.env").symlink_to(outside / "secret")
    assert udev_ops.oldest_queued() is not None
    assert udev_ops.drain() == []
    assert list(q.iterdir()) == []
    untouched(outside)


# ------------------------------------------------------------------ the handler's refusal


def handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    """The rule's call for an add event: (exit code, stderr, the workers it started)."""
    policy = tmp_path / "cachemgr.toml"
    policy.write_text("version = 1\n")
    for k, v in {"ACTION": "add", "SUBSYSTEM": "block", "DEVNAME": "/dev/sdq",
                 "SEQNUM": "5", "CACHEMGR_POLICY": str(policy)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(udev_ops, "SYSLOG_SOCKET", str(tmp_path / "no-syslog"))
    spawned: list[str] = []
    monkeypatch.setattr(udev_ops, "spawn", lambda p, **kw: spawned.append(p))
    capsys.readouterr()
    rc = udev_cli.main(["udev-event"])
    return rc, capsys.readouterr().err, spawned


def tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_the_handler_refuses_a_state_directory_linked_into_a_users_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "locks").mkdir(parents=True)
    for p in (theirs, theirs / "locks"):
        os.chown(p, NOBODY, NOBODY)
    linked = tmp_path / "state"
    linked.symlink_to(theirs)
    for sd, says in ((linked, f"{linked}: a symbolic link (to {theirs})"),
                     (theirs, f"{theirs}: owned by uid {NOBODY}, not root")):
        monkeypatch.setenv("CACHEMGR_STATE_DIR", str(sd))
        rc, err, spawned = handler(tmp_path, monkeypatch, capsys)
        assert rc == 1 and spawned == []
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"cachemgr udev: UnsafePathError: {says}"), err
        assert "; fix: " in lines[0]
        assert tree(theirs) == ["locks"]  # nothing written


def test_the_handler_refuses_a_loose_state_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    sd.chmod(0o777)
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(sd))
    rc, err, spawned = handler(tmp_path, monkeypatch, capsys)
    assert rc == 1 and spawned == [] and tree(sd) == []
    assert f"{sd}: writable by group or others (mode 0777)" in err
    # and a directory above it that others can write to
    sd.chmod(0o700)
    tmp_path.chmod(0o777)
    try:
        rc, err, spawned = handler(tmp_path, monkeypatch, capsys)
    finally:
        tmp_path.chmod(0o700)
    assert rc == 1 and spawned == [] and tree(sd) == []
    assert f"{tmp_path}: writable by group or others (mode 0777), and the state " \
           f"directory {sd} is in it" in err
    # root's own: queued, and a worker started
    rc, err, spawned = handler(tmp_path, monkeypatch, capsys)
    assert rc == 0 and spawned, err
    assert len(os.listdir(sd / "autoattach" / "queue")) == 1
    assert oct(sd.stat().st_mode & 0o777) == "0o700"
