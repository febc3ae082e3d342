"""State that cannot be turned against root (issue #30 item 4).

A state directory (``/var/lib/cachemgr`` or ``CACHEMGR_STATE_DIR``) that another user owns,
can write to or has turned into a symbolic link, a lock file or journal planted as a link to
a root-only file, and a policy file that another user could change: cachemgr run as root
refuses each (exit 2, one line naming the path and the fix) before it writes anything, and
the file a planted link points at keeps its content. The tests run as root (as the unit
suite does); uid 65534 (nobody) stands for the other user.

Each of these passes only with the checks: before them, a lock file was opened through a
planted link (and the file it named truncated and overwritten), a journal was read through
one, and a state directory or policy file of any owner and mode was used.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core import state
from cachemgr.core.errors import UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import policy
from tests.unit.guards import mutations_refused
from tests.unit.tui_helpers import copy_capture, kernel_writes

NOBODY = 65534
SECRET = b"root's own secret\n"
POLICY = 'version = 1\n\n[defaults]\nmode = "writethrough"\n'

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the checks are root's: run as root")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A root-only file that a planted link points at."""
    p = tmp_path / "secret"
    p.write_bytes(SECRET)
    p.chmod(0o600)
    return p


@pytest.fixture
def sd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The state directory (not made yet)."""
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def take(key: str) -> None:
    with state.locked(key, "/dev/bcache0"):
        pass


def tree(d: Path) -> list[str]:
    """Every name under ``d`` (links not followed)."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def everything_refused(d: Path, says: str) -> None:
    """Each way in to the state directory is refused, with ``says`` in the message, and
    nothing is written under ``d``."""
    before = tree(d)
    for attempt in (lambda: state.state_dir(),
                    lambda: state.write_json(state.journal_path("drain", "k"), {"a": 1}),
                    lambda: state.read_json(state.journal_path("drain", "k")),
                    lambda: state.locked("k", "k").__enter__(),
                    lambda: state.current_holder("k")):
        with pytest.raises(UsageError, match=says) as exc:
            attempt()
        assert "\n" not in exc.value.message and "fix: " in exc.value.message
        assert exc.value.exit_code == 2
    assert tree(d) == before


# ------------------------------------------------------------------- the state directory


def test_a_state_directory_of_another_user_is_refused(sd: Path) -> None:
    sd.mkdir(mode=0o700)
    os.chown(sd, NOBODY, NOBODY)
    everything_refused(sd, rf"{sd}: owned by uid {NOBODY}, not root.*fix: chown root:root "
                           rf"{sd} && chmod 0700 {sd}")


def test_a_group_writable_state_directory_is_refused(sd: Path) -> None:
    sd.mkdir()
    sd.chmod(0o770)
    everything_refused(sd, rf"{sd}: writable by group or others \(mode 0770\).*"
                           rf"chmod 0700 {sd}")


def test_a_loose_subdirectory_is_refused(sd: Path) -> None:
    (sd / "locks").mkdir(parents=True)
    (sd / "locks").chmod(0o777)
    everything_refused(sd, rf"{sd / 'locks'}: writable by group or others \(mode 0777\)")
    (sd / "locks").chmod(0o700)
    os.chown(sd / "locks", NOBODY, 0)
    everything_refused(sd, rf"{sd / 'locks'}: owned by uid {NOBODY}")


def test_a_state_directory_in_a_directory_others_can_write_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory above it that another user could change could be swapped for a link to
    elsewhere between two runs: refused; a root-owned sticky one (/tmp) is fine."""
    up = tmp_path / "up"
    (up / "state").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(up / "state"))
    up.chmod(0o777)
    everything_refused(up, rf"{up}: writable by group or others \(mode 0777\), and the "
                           rf"state directory {up / 'state'} is in it")
    up.chmod(0o1777)
    state.write_json(state.journal_path("drain", "k"), {"a": 1})
    assert state.read_json(state.journal_path("drain", "k")) == {"a": 1}


def test_a_symlinked_state_directory_is_refused(sd: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    sd.symlink_to(real)
    everything_refused(real, rf"{sd}: a symbolic link \(to {real}\); cachemgr does not "
                             "follow links")
    assert tree(real) == []


def test_the_attack_a_state_directory_linked_into_a_users_directory(
        sd: Path, tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: the state directory a link into a directory another user owns,
    where that user planted the lock file as a link to a root-only file."""
    theirs = tmp_path / "theirs"
    (theirs / "locks").mkdir(parents=True)
    (theirs / "locks" / "k.lock").symlink_to(secret)
    for p in (theirs, theirs / "locks"):
        os.chown(p, NOBODY, NOBODY)
    os.lchown(theirs / "locks" / "k.lock", NOBODY, NOBODY)
    sd.symlink_to(theirs)
    with pytest.raises(UsageError, match=f"{sd}: a symbolic link"):
        take("k")
    assert secret.read_bytes() == SECRET
    # the same directory named as itself: another user's
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(theirs))
    with pytest.raises(UsageError, match=f"{theirs}: owned by uid {NOBODY}"):
        take("k")
    assert secret.read_bytes() == SECRET


def test_only_root_is_refused_a_directory_of_another_owner(
        sd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's run cannot be turned against root: its own state directory, of any owner
    and mode, is its business (a link is refused all the same)."""
    sd.mkdir()
    sd.chmod(0o777)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    state.write_json(state.journal_path("drain", "k"), {"a": 1})
    with state.locked("k", "k"):
        pass
    assert state.read_json(state.journal_path("drain", "k")) == {"a": 1}


# -------------------------------------------------------------- files in the state directory


@pytest.fixture
def good(sd: Path) -> Path:
    """A state directory as root makes it."""
    with state.locked("k", "k"):
        pass
    assert (sd / "locks" / "k.lock").exists()
    return sd


def test_a_planted_lock_file_link_is_refused(good: Path, secret: Path) -> None:
    lock = good / "locks" / "k2.lock"
    lock.symlink_to(secret)
    with pytest.raises(UsageError, match=rf"{lock}: a symbolic link \(to {secret}\).*"
                                         rf"fix: rm {lock}"):
        take("k2")
    assert secret.read_bytes() == SECRET
    assert lock.is_symlink()  # left for the admin to look at


def test_a_hard_linked_lock_file_is_refused(good: Path, secret: Path) -> None:
    """A hard link to a root-only file (planted while the directory was loose, on a host
    without fs.protected_hardlinks) would have that file truncated."""
    lock = good / "locks" / "k2.lock"
    os.link(secret, lock)
    with pytest.raises(UsageError, match=rf"{lock}: a file with 2 links"):
        take("k2")
    assert secret.read_bytes() == SECRET


def test_a_planted_journal_link_is_neither_read_nor_written_through(
        good: Path, tmp_path: Path) -> None:
    """A drain journal planted as a link to a file of someone's choosing: not read (its
    content would be put back as bcache tunables), and a write replaces the link, never the
    file."""
    elsewhere = tmp_path / "chosen.json"
    chosen = json.dumps({"schema": 1, "device": "/dev/bcache0",
                         "saved": {"writeback_percent": 40}})
    elsewhere.write_text(chosen)
    j = state.journal_path("drain", "k")
    j.parent.mkdir(mode=0o700)
    j.symlink_to(elsewhere)
    with pytest.raises(state.StateFileError, match=rf"{j}: .*a symbolic link \(to "
                                                   rf"{elsewhere}\)"):
        state.read_json(j)
    state.write_json(j, {"device": "/dev/bcache0"})
    assert elsewhere.read_text() == chosen
    assert not j.is_symlink() and state.read_json(j) == {"device": "/dev/bcache0"}


def test_a_fifo_as_a_journal_does_not_hang(good: Path) -> None:
    j = state.journal_path("drain", "k")
    j.parent.mkdir(mode=0o700)
    os.mkfifo(j)
    with pytest.raises(state.StateFileError, match="not a regular file"):
        state.read_json(j)


def test_atomic_writes_stay_in_the_checked_directory(good: Path) -> None:
    j = state.journal_path("replace", "r1")
    state.write_json(j, {"id": "r1"})
    assert oct(j.stat().st_mode & 0o777) == "0o600"
    assert oct(j.parent.stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in j.parent.iterdir()] == ["r1.json"]  # no temporary file left


# ---------------------------------------------------------------------------- the policy


@pytest.fixture
def pol(tmp_path: Path) -> Path:
    d = tmp_path / "etc-cachemgr"
    d.mkdir()
    p = d / "cachemgr.toml"
    p.write_text(POLICY)
    p.chmod(0o644)
    return p


def test_a_root_policy_loads(pol: Path) -> None:
    assert policy.load(str(pol)).path == str(pol)


def test_a_group_writable_policy_is_refused(pol: Path) -> None:
    pol.chmod(0o664)
    with pytest.raises(policy.PolicyError, match=rf"policy {pol}: writable by group or "
                                                 rf"others \(mode 0664\).*fix: chown "
                                                 rf"root:root {pol} && chmod 0644 {pol}"):
        policy.load(str(pol))


def test_a_policy_of_another_user_is_refused(pol: Path) -> None:
    os.chown(pol, NOBODY, NOBODY)
    with pytest.raises(policy.PolicyError, match=rf"policy {pol}: owned by uid {NOBODY}"):
        policy.load(str(pol))


def test_a_policy_in_a_directory_others_can_write_is_refused(pol: Path) -> None:
    pol.parent.chmod(0o775)
    with pytest.raises(policy.PolicyError, match=rf"its directory {pol.parent} is writable "
                                                 rf"by group or others.*chmod go-w "
                                                 rf"{pol.parent}"):
        policy.load(str(pol))
    pol.parent.chmod(0o755)
    os.chown(pol.parent, NOBODY, NOBODY)
    with pytest.raises(policy.PolicyError, match=rf"its directory {pol.parent} is owned "
                                                 rf"by uid {NOBODY}"):
        policy.load(str(pol))


def test_a_policy_link_to_another_users_file_is_refused(pol: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs.toml"
    theirs.write_text(POLICY)
    os.chown(theirs, NOBODY, NOBODY)
    link = pol.parent / "linked.toml"
    link.symlink_to(theirs)
    with pytest.raises(policy.PolicyError, match=rf"policy {link}: {theirs} is owned by uid "
                                                 rf"{NOBODY}"):
        policy.load(str(link))
    # a link another user owns, to root's good file: they could point it elsewhere
    mine = pol.parent / "mine.toml"
    mine.symlink_to(pol)
    assert policy.load(str(mine)).path == str(mine)
    os.lchown(mine, NOBODY, NOBODY)
    with pytest.raises(policy.PolicyError, match=rf"a symbolic link owned by uid {NOBODY}"):
        policy.load(str(mine))


# ------------------------------------------------------------------------- through the CLI


def cli(root: Path | None, argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([*(["--sysfs-root", str(root)] if root else []), *argv])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def guarded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    writes = kernel_writes(monkeypatch)
    commands = mutations_refused(monkeypatch)
    yield writes
    assert commands == []


def test_mode_refuses_the_attack_with_one_line_and_writes_nothing(
        sd: Path, tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    theirs = tmp_path / "theirs"
    (theirs / "locks").mkdir(parents=True)
    key = snapshot.take(Sysfs(root)).backings[0].key  # the lock mode takes
    (theirs / "locks" / f"{key}.lock").symlink_to(secret)
    os.chown(theirs, NOBODY, NOBODY)
    sd.symlink_to(theirs)
    with guarded(monkeypatch) as writes:
        rc, out, err = cli(root, ["mode", "/dev/bcache0", "writethrough"])
        assert rc == 2, err
        assert writes == []
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"cachemgr: {sd}: a symbolic link (to {theirs})")
    assert "fix: " in lines[0]
    assert secret.read_bytes() == SECRET
    # named as itself: another user's directory
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(theirs))
    with guarded(monkeypatch) as writes:
        rc, out, err = cli(root, ["mode", "/dev/bcache0", "writethrough"])
        assert rc == 2 and writes == []
    assert err.strip() == (f"cachemgr: {theirs}: owned by uid {NOBODY}, not root; cachemgr "
                           "refuses it (whoever can change it could turn root's writes "
                           f"against root's files); fix: chown root:root {theirs} && chmod "
                           f"0700 {theirs}")
    assert secret.read_bytes() == SECRET


def test_mode_with_a_good_state_directory_still_switches(
        sd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    with guarded(monkeypatch) as writes:
        rc, _, err = cli(root, ["mode", "/dev/bcache0", "writethrough"])
        assert rc == 0, err
        assert any(rel.endswith("cache_mode") for rel, _ in writes)
    assert oct(sd.stat().st_mode & 0o777) == "0o700"


def test_policy_check_and_autoattach_refuse_a_loose_policy(
        sd: Path, pol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pol.chmod(0o666)
    rc, out, err = cli(None, ["policy", "check", "--policy", str(pol)])
    assert rc == 2 and out == ""
    assert err.strip() == (f"cachemgr: policy {pol}: writable by group or others (mode "
                           "0666); cachemgr run as root reads no policy that another user "
                           "could change (it says what root does to disks); fix: chown "
                           f"root:root {pol} && chmod 0644 {pol}")
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    with guarded(monkeypatch) as writes:
        rc, out, err = cli(root, ["autoattach", "--policy", str(pol)])
        assert rc == 2 and writes == []
    assert len(err.strip().splitlines()) == 1 and f"policy {pol}: writable" in err
    assert not sd.exists()  # nothing written, not even the state directory
