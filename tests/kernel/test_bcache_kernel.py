"""bcache on the lab kernel: create, register, mode switch, dirty data read back."""

from __future__ import annotations

import json
import os
import time

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs


def _make(lab_disks: list[str]) -> tuple[Sysfs, str, str]:
    backing, ssd = lab_disks[0], lab_disks[1]
    sysfs = Sysfs()
    bcache.make_bcache(backing=[backing], cache=ssd, bucket="128k")
    for d in (backing, ssd):
        bcache.register(sysfs, d)
    assert bcache.wait_for(lambda: sysfs.exists("block/bcache0/bcache/cache"), 10)
    return sysfs, backing, ssd


@pytest.mark.kernel(disks="1G,256M")
def test_create_mode_switch_dirty_readback(lab_disks: list[str]) -> None:
    sysfs, backing, ssd = _make(lab_disks)
    snap = snapshot.take(sysfs)
    assert len(snap.backings) == 1 and len(snap.cache_sets) == 1
    b = snap.backings[0]
    cset = snap.cache_sets[0]
    assert b.identity.node == backing and b.device == "/dev/bcache0"
    assert b.cset_uuid == cset.uuid
    assert [c.identity.node for c in cset.caches] == [ssd]
    assert b.mode == CacheMode.WRITETHROUGH  # make-bcache's default
    assert b.state == CacheState.CLEAN and b.dirty is not None and b.dirty.is_zero(512)

    # cross-check with bcache-tools' own view of the superblocks
    sb = runner.run(["bcache-super-show", backing]).stdout
    assert b.uuid and b.uuid in sb and cset.uuid in sb

    change = bcache.set_mode(sysfs, b, CacheMode.WRITEBACK)
    assert change.after == "writeback"
    # keep writeback from draining while we look (the drain trap works for us here)
    sysfs.write("block/bcache0/bcache/writeback_running", "0")
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=64M", "--io_size=16M", "--direct=1", "--randrepeat=0",
                "--output-format=json"], timeout=120)
    snap = snapshot.take(sysfs)
    b = snap.backings[0]
    assert b.mode == CacheMode.WRITEBACK
    assert b.state == CacheState.DIRTY
    assert b.dirty is not None
    # 16 MiB written at random 4k offsets in 64 MiB: some land twice, so dirty <= 16 MiB,
    # and it must be most of it
    assert 10 << 20 <= b.dirty.bytes <= 16 << 20
    assert b.rate_debug is not None and b.rate_debug.dirty is not None
    assert abs(b.rate_debug.dirty.bytes - b.dirty.bytes) <= 1 << 20

    # a mode that is already active is "already so", not a silent success
    with pytest.raises(bcache.AlreadyError):
        bcache.set_mode(sysfs, b, CacheMode.WRITEBACK)

    # status --json says the same as the snapshot
    from cachemgr.cli.main import main

    assert main(["mode", "/dev/bcache0", "writethrough"]) == 0
    out = runner.run(["python3", "-m", "cachemgr", "status", "--json"],
                     env={"PYTHONPATH": os.getcwd()}).stdout
    data = json.loads(out)
    assert data["schema"] == 1
    dev = data["devices"][0]
    assert dev["kind"] == "bcache" and dev["device"] == "/dev/bcache0"
    assert dev["mode"] == "writethrough" and dev["cache"] == cset.uuid
    assert dev["dirty_bytes"] >= 10 << 20

    # let writeback run: the dirty data drains (idle cache set) and the state returns clean
    sysfs.write("block/bcache0/bcache/writeback_percent", "0")
    sysfs.write("block/bcache0/bcache/writeback_running", "1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        b = snapshot.take(sysfs).backings[0]
        if b.dirty is not None and b.dirty.is_zero(512):
            break
        time.sleep(0.5)
    assert b.dirty is not None and b.dirty.is_zero(512), b.dirty


@pytest.mark.kernel(disks="512M")
def test_register_rejects_non_bcache_disk(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    with pytest.raises(bcache.CacheMgrError) as exc:
        bcache.register(sysfs, lab_disks[0])
    assert lab_disks[0] in str(exc.value)
    assert not sysfs.exists(f"block/{os.path.basename(lab_disks[0])}/bcache")


@pytest.mark.kernel(disks="512M")
def test_make_bcache_refuses_disk_with_filesystem(lab_disks: list[str]) -> None:
    runner.run(["mkfs.ext4", "-q", "-F", lab_disks[0]])
    with pytest.raises(bcache.UnsafeError) as exc:
        bcache.make_bcache(backing=[lab_disks[0]])
    assert "ext4" in str(exc.value)
    # nothing changed: still ext4
    assert "ext4" in runner.run(["blkid", "-o", "value", "-s", "TYPE", lab_disks[0]]).stdout
