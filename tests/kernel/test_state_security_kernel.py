"""State that cannot be turned against root, on a real kernel (issue #30 item 4): the state
directory a link into a directory that uid 65534 owns, where that user planted the lock file
of /dev/bcache0 as a link to a root-only file. A root ``cachemgr mode /dev/bcache0
writethrough`` (its own process, as an admin runs it) is refused with exit 2 and one line
naming the path and the fix; the root-only file keeps its content and the cache its mode.
The unit tests (tests/unit/test_state_security.py) cover the other cases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from tests.kernel.clirun import run_process

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
