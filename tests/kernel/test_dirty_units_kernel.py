"""dirty_data as the kernel prints it, crossing k, M and G, parsed exactly (bch_hprint)."""

from __future__ import annotations

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode, Size
from cachemgr.core.sysfs import Sysfs


@pytest.mark.kernel(disks="2G,3G", timeout=600, mem=2048)
def test_dirty_data_units_k_m_g(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="512k",
                  mode=CacheMode.WRITEBACK)
    sysfs.write("block/bcache0/bcache/writeback_running", "0")
    sysfs.write("block/bcache0/bcache/sequential_cutoff", "0")  # keep big writes cached
    # and never bypass the "SSD" because it looks slow (a loaded host makes the disk file
    # slower than bcache's congestion thresholds: then only 81M of 1.2G stayed dirty)
    cset = snapshot.take(sysfs).cache_sets[0].uuid
    for f in ("congested_read_threshold_us", "congested_write_threshold_us"):
        sysfs.write(f"fs/bcache/{cset}/{f}", "0")
    seen = []
    written = 0
    for size, unit in ((8 << 10, "k"), (3 << 20, "M"), ((1 << 30) + (200 << 20), "G")):
        runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=write", "--bs=1M"
                    if size >= 1 << 20 else "--bs=4k", f"--offset={written}", f"--size={size}",
                    "--direct=1", "--ioengine=libaio", "--iodepth=8", "--output-format=json"],
                   timeout=400)
        written += size
        raw = sysfs.read("block/bcache0/bcache/dirty_data")
        b = snapshot.take(sysfs).backings[0]
        assert b.dirty == Size.parse_hprint(raw)
        assert raw.endswith(unit), (raw, unit)
        # the kernel's figure brackets what we wrote (all of it is dirty: writeback is off)
        assert b.dirty is not None and b.dirty.low <= written <= b.dirty.high + (1 << 20), raw
        seen.append(raw)
    assert [s[-1] for s in seen] == ["k", "M", "G"]
