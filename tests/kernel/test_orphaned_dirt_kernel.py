"""Orphaned dirt on the lab kernel (issue #14): a backing device that bcache stopped while
dirty is gone from its cache set's listing, but its dirty data still lives on the set's SSD
(only its superblock says so). Unregistering that cache set would lose the data, so both faces
(the CLI's ``remove CSET`` and the TUI's Remove on the cache set's row) must refuse it; the
data must then come back whole once the backing device is repaired and registered again.

The backing device is a dm device over the first scratch disk: a linear table, swapped for
dm-flakey with ``error_writes`` (every write fails, reads still work: a disk that can no
longer write) once the data is dirty. Writeback then fails on every key; after
``io_error_limit``-ish errors bcache stops the device ("stop bcache0: too many IO errors on
backing device dm-0") and keeps the cache set registered, with the dirty keys in it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from cachemgr.backends import bcache, bcache_super, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs
from tests.kernel import clirun

HDD = "hdd"  # /dev/mapper/hdd: the backing device bcache sees
NODE = f"/dev/mapper/{HDD}"
OFFSET = 16 << 20  # where the pattern goes on /dev/bcache0
LENGTH = 8 << 20  # 128 extents of 64 KiB: more failed writebacks than the error limit


def dm(*args: str) -> str:
    return runner.run(["dmsetup", *args], timeout=60).stdout


def swap_table(table: str) -> None:
    dm("suspend", HDD)
    dm("load", HDD, "--table", table)
    dm("resume", HDD)


def read_direct(node: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of ``node``, read with O_DIRECT (no page cache)."""
    import mmap

    buf = mmap.mmap(-1, length)  # page-aligned, as O_DIRECT wants
    fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], offset) == length
    finally:
        os.close(fd)
    return bytes(buf)


def dmesg_bcache() -> list[str]:
    return [line for line in runner.run(["dmesg"], timeout=30).stdout.splitlines()
            if "bcache" in line]


def wait_for(what: str, until, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.25)


def orphan_dirt(lab_disks: list[str], tmp_path: Path, *, reads_fail: bool = False,
                ) -> tuple[Sysfs, str, str, str]:
    """bcache (writeback) over /dev/mapper/hdd, ``LENGTH`` bytes of random data written dirty,
    then the backing device failing writes until bcache stops it. Returns (sysfs, cache set
    UUID, sha256 of the pattern, the linear table that repairs the device).

    ``reads_fail``: the device fails reads too (an ``error`` table: a dead disk), and it
    starts 1 MiB into the scratch disk, so the disk beneath carries no superblock of its own
    at sector 0 for a probe to find in its place."""
    hdd, ssd = lab_disks[0], lab_disks[1]
    sysfs = Sysfs()
    start = 2048 if reads_fail else 0
    sectors = int(runner.run(["blockdev", "--getsz", hdd]).stdout) - start
    linear = f"0 {sectors} linear {hdd} {start}"
    dm("create", HDD, "--table", linear)
    bcache.create(sysfs, backings=[NODE], cache=ssd, bucket="128k", mode=CacheMode.WRITEBACK)
    b = snapshot.take(sysfs).backings[0]
    assert b.device == "/dev/bcache0" and b.cset_uuid is not None
    cset = b.cset_uuid
    rel = "block/bcache0/bcache"
    sysfs.write(f"{rel}/writeback_running", "0")  # the data stays dirty
    sysfs.write(f"{rel}/sequential_cutoff", "0")  # and goes to the cache, not around it
    pattern = os.urandom(LENGTH)
    (tmp_path / "pattern").write_bytes(pattern)
    runner.run(["dd", f"if={tmp_path / 'pattern'}", "of=/dev/bcache0", "bs=64k",
                f"seek={OFFSET}", "oflag=direct,seek_bytes", "conv=fsync", "status=none"],
               timeout=120)
    b = snapshot.take(sysfs).backings[0]
    assert b.state == CacheState.DIRTY and b.dirty is not None and b.dirty.bytes >= LENGTH // 2

    # the disk stops taking writes; writeback (fast) fails on every dirty key
    swap_table(f"0 {sectors} error" if reads_fail
               else f"0 {sectors} flakey {hdd} {start} 0 1 1 error_writes")
    sysfs.write(f"{rel}/writeback_rate_minimum", "65536")
    sysfs.write(f"{rel}/writeback_running", "1")
    wait_for("bcache stopping bcache0", lambda: not sysfs.is_dir("block/bcache0"))
    print("\n".join(dmesg_bcache()[-6:]))
    assert any("stop bcache0: too many IO errors on backing device" in line
               for line in dmesg_bcache())

    # gone from the set's listing, the set still registered, the superblock says dirty
    snap = snapshot.take(sysfs, probe_unregistered=True)
    assert snap.backings == ()
    c = snap.cache_set(cset)
    assert c is not None and c.backing_names == ()
    print(f"cache set {cset}: dirty_data {c.dirty}; unregistered {snap.unregistered}")
    if reads_fail:
        return sysfs, cset, hashlib.sha256(pattern).hexdigest(), linear
    sb = bcache_super.super_show(NODE) or {}
    assert sb.get("dev.data.cache_state") == "dirty" and sb.get("cset.uuid") == cset, sb
    assert [(u.identity.node, u.sb_state, u.cset_uuid) for u in snap.unregistered] == \
        [(NODE, "dirty", cset)]
    return sysfs, cset, hashlib.sha256(pattern).hexdigest(), linear


def tui_remove_cache_set(cset: str) -> tuple[str, str]:
    """The TUI's Remove on the cache set's row, confirmed: returns the MessageDialog it
    ends on (title, body)."""
    from tests.kernel.test_tui_kernel import _select, _text
    from tests.unit.tui_helpers import settle, shown
    from tui.app import CacheMgrApp
    from tui.dialogs.confirm import ConfirmDialog, MessageDialog

    seen: list[tuple[str, str]] = []

    async def go() -> None:
        app = CacheMgrApp("/sys", interval=0.5, read_only=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await _select(pilot, app, f"cset:{cset}")
            await settle(pilot, lambda: app.check_action("remove", ()) is True, tries=200)
            await pilot.press("delete")
            assert isinstance(app.screen, ConfirmDialog)
            assert f"Unregister cache set {cset}" in _text(app, ".dialog-body")
            await pilot.click("#b-go")
            await settle(pilot, lambda: shown(app, MessageDialog)
                         or any(line.startswith("✓ ") for line in app.log_history), tries=1200)
            screen = app.screen
            assert isinstance(screen, MessageDialog)
            seen.append((screen.title_text, screen.body))
            assert any(line.startswith("✗ remove ") for line in app.log_history), \
                app.log_history
            await pilot.press("escape")
            await settle(pilot, lambda: not isinstance(app.screen, MessageDialog))

    asyncio.run(go())
    return seen[0]


@pytest.mark.kernel(disks="1G,512M", timeout=300)
def test_orphaned_dirty_data_refused_by_cli_and_tui_then_recovered(
        lab_disks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs, cset, digest, linear = orphan_dirt(lab_disks, tmp_path)
    words = (f"cache set {cset} holds dirty data of {NODE}, which bcache stopped",
             "unregistering the cache set would lose it")

    # (1) the CLI refuses: exit 3, the library's words
    r = clirun.in_process("remove", cset)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert all(w in r.stderr for w in words), r.stderr
    assert f"echo {NODE} > /sys/fs/bcache/register" in r.stderr
    assert sysfs.is_dir(f"fs/bcache/{cset}")

    # (2) the TUI refuses the same way (the same function, the same words)
    title, body = tui_remove_cache_set(cset)
    assert title == f"remove {cset}: refused as unsafe", title
    assert all(w in body for w in words), body

    # (3) nothing lost: the set is still registered, its dirty data comes back whole
    assert sysfs.is_dir(f"fs/bcache/{cset}")
    swap_table(linear)  # the disk repaired
    sysfs.write("fs/bcache/register", NODE)
    wait_for("bcache0 back", lambda: sysfs.is_dir("block/bcache0/bcache"))
    b = snapshot.take(sysfs).backings[0]
    assert b.device == "/dev/bcache0" and b.cset_uuid == cset
    assert b.state == CacheState.DIRTY and b.dirty is not None and not b.dirty.is_zero(512)
    r = clirun.in_process("drain", "/dev/bcache0")
    assert r.returncode == 0, (r.stdout, r.stderr)
    b = snapshot.take(sysfs).backings[0]
    assert b.state == CacheState.CLEAN and b.dirty is not None and b.dirty.is_zero(512)
    assert hashlib.sha256(read_direct("/dev/bcache0", OFFSET, LENGTH)).hexdigest() == digest
    r = clirun.in_process("detach", "/dev/bcache0", "--yes")
    assert r.returncode == 0, (r.stdout, r.stderr)
    data_start = int((bcache_super.super_show(NODE) or {})["dev.data.first_sector"]) * 512
    on_disk = read_direct(NODE, data_start + OFFSET, LENGTH)
    assert hashlib.sha256(on_disk).hexdigest() == digest
    # the data safe on the disk, the set can go now
    r = clirun.in_process("remove", cset, "--yes")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert not sysfs.is_dir(f"fs/bcache/{cset}")
    print("\n".join(dmesg_bcache()[-6:]))


@pytest.mark.kernel(disks="1G,512M", timeout=300)
def test_orphaned_dirty_data_of_an_unreadable_device_refused(
        lab_disks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, but the stopped backing device fails reads as well: its superblock cannot
    be read, and yet its dirty data is in the set all the same."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs, cset, digest, linear = orphan_dirt(lab_disks, tmp_path, reads_fail=True)
    r = clirun.in_process("remove", cset)
    print(r.returncode, r.stdout, r.stderr)
    assert r.returncode == 3 and "would lose it" in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert f"{NODE} cannot be read" in r.stderr, r.stderr
    assert sysfs.is_dir(f"fs/bcache/{cset}")
    # the disk repaired and registered again: the dirty data was kept and comes back whole
    swap_table(linear)
    sysfs.write("fs/bcache/register", NODE)
    wait_for("bcache0 back", lambda: sysfs.is_dir("block/bcache0/bcache"))
    r = clirun.in_process("drain", "/dev/bcache0")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert hashlib.sha256(read_direct("/dev/bcache0", OFFSET, LENGTH)).hexdigest() == digest
