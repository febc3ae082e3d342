"""State that cannot be turned against root, on a real kernel (issue #30 item 4): the state
directory a link into a directory that uid 65534 owns, where that user planted the lock file
of /dev/bcache0 as a link to a root-only file. A root ``cachemgr mode /dev/bcache0
writethrough`` (its own process, as an admin runs it) is refused with exit 2 and one line
naming the path and the fix; the root-only file keeps its content and the cache its mode.
And the udev rule's handler, run by udevd for a hot-added disk, refuses such a state
directory (/var/lib/cachemgr a link into that user's directory, then that directory) and
writes nothing. The unit tests (tests/unit/test_state_security.py,
tests/unit/test_udev_state_security.py) cover the other cases."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from tests.kernel.clirun import run_process

ROOT = Path(__file__).resolve().parents[2]

NOBODY = 65534
SECRET = b"root's own secret\n"


def cache_mode() -> str:
    return Path("/sys/block/bcache0/bcache/cache_mode").read_text().strip()


@pytest.mark.kernel(disks="1G,256M", timeout=300)
def test_a_planted_lock_link_is_refused_on_the_kernel(lab_disks: list[str], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert os.geteuid() == 0
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="128k",
                  mode=CacheMode.WRITEBACK)
    key = snapshot.take(sysfs).backings[0].key  # the lock `mode` takes
    before = cache_mode()
    assert "[writeback]" in before

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    theirs = tmp_path / "theirs"
    (theirs / "locks").mkdir(parents=True)
    lock = theirs / "locks" / f"{key}.lock"
    lock.symlink_to(secret)
    for p in (theirs, theirs / "locks"):
        os.chown(p, NOBODY, NOBODY)
    os.lchown(lock, NOBODY, NOBODY)
    linked = tmp_path / "state"
    linked.symlink_to(theirs)

    for sd, says in ((linked, f"{linked}: a symbolic link (to {theirs})"),
                     (theirs, f"{theirs}: owned by uid {NOBODY}, not root")):
        monkeypatch.setenv("CACHEMGR_STATE_DIR", str(sd))
        rc, out, err = run_process("mode", "/dev/bcache0", "writethrough", timeout=120)
        assert rc == 2 and out == "", err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"cachemgr: {says}"), err
        assert "; fix: " in lines[0]
        assert secret.read_bytes() == SECRET
        assert lock.is_symlink()
        assert cache_mode() == before

    # the same command with a state directory only root can change: it switches
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "good"))
    rc, _, err = run_process("mode", "/dev/bcache0", "writethrough", timeout=120)
    assert rc == 0, err
    assert "[writethrough]" in cache_mode()
    assert secret.read_bytes() == SECRET


# ------------------------------------------------------------------------ the udev handler

STATE = Path("/var/lib/cachemgr")  # what the rule's handler uses: udevd passes no environment


def _settle() -> None:
    runner.run(["udevadm", "settle", "--timeout=60"], timeout=90)


@pytest.mark.kernel(udev=True, timeout=300)
def test_the_udev_handler_refuses_a_state_directory_of_another_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's handler, run by udevd for a hot-added disk, with /var/lib/cachemgr a link
    into a directory uid 65534 owns (where that user planted the pending lock as a link to a
    root-only file), and then that directory itself: refused (exit 1, one line naming the
    path and the fix), nothing written there or through the link, no worker started. With a
    state directory of root's, the same event is queued. The rule is installed with an
    interpreter that records each run's exit code and stderr, then runs the real one."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(STATE))
    sysfs = Sysfs()
    scsi.load_scsi_debug(sysfs, dev_size_mb=16, add_host=1)
    _settle()

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    # beside the state directory: renamed into its place below
    theirs = STATE.with_name("cachemgr-theirs")
    pending = theirs / "locks" / "autoattach-pending.lock"
    (theirs / "locks").mkdir(parents=True)
    (theirs / "autoattach" / "queue").mkdir(parents=True)
    pending.symlink_to(secret)
    for p in (theirs, theirs / "locks", theirs / "autoattach", theirs / "autoattach" / "queue"):
        os.chown(p, NOBODY, NOBODY)
    os.lchown(pending, NOBODY, NOBODY)
    planted = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*"))

    ran, errs = Path("/run/cachemgr-rule-ran"), Path("/run/cachemgr-rule-err")
    wrapper = Path("/run/cachemgr-wrap/python")
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\n{sys.executable} "$@" 2>>{errs}\nrc=$?\n'
                       f'echo "$ACTION $DEVNAME rc=$rc" >>{ran}\nexit $rc\n')
    wrapper.chmod(0o755)
    policy = Path("/etc/cachemgr/cachemgr.toml")
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text("version = 1\n")  # valid, names nothing: the rule runs the handler
    # the guest's root is an overlay over the host's (a directory of the lower layer cannot
    # be renamed there: EXDEV); what the guest removes stays on the host
    if STATE.is_symlink():
        STATE.unlink()
    elif STATE.exists():
        shutil.rmtree(STATE)
    STATE.symlink_to(theirs)
    runner.run([str(ROOT / "scripts" / "install-udev.sh"), "--python", str(wrapper),
                "--no-systemd"])
    _settle()

    def hot_add() -> list[str]:
        """A new scsi_debug disk: the handler's runs for its events (its add, and any change
        event udev makes of it), their stderr in errs."""
        ran.write_text("")
        errs.write_text("")
        Path("/sys/bus/pseudo/drivers/scsi_debug/add_host").write_text("1")
        _settle()
        runs = [line for line in ran.read_text().splitlines() if " /dev/" in line]
        assert [r for r in runs if r.startswith("add /dev/")], runs
        return runs

    def refused(says: str, d: Path) -> None:
        runs = hot_add()
        assert runs and all(r.endswith(" rc=1") for r in runs), (runs, errs.read_text())
        lines = errs.read_text().splitlines()
        assert len(lines) == len(runs), lines
        for line in lines:
            assert line.startswith(f"cachemgr udev: UnsafePathError: {says}"), line
            assert "; fix: " in line
        assert secret.read_bytes() == SECRET
        # nothing written: no queued event, no lock, no worker.log
        assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == planted
        assert (d / "locks" / "autoattach-pending.lock").is_symlink()

    refused(f"{STATE}: a symbolic link (to {theirs})", theirs)
    # that directory named as itself: another user's
    STATE.unlink()
    theirs.rename(STATE)
    refused(f"{STATE}: owned by uid {NOBODY}, not root", STATE)

    # root's own state directory: the same kind of event is queued (a worker takes it)
    STATE.rename(theirs)
    runs = hot_add()
    assert runs and all(r.endswith(" rc=0") for r in runs), (runs, errs.read_text())
    assert STATE.is_dir() and not STATE.is_symlink()
    assert (STATE / "autoattach" / "queue").is_dir()
    assert secret.read_bytes() == SECRET
    assert pending.is_symlink()
