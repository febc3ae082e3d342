"""dm-cache on the lab kernel: a cache device made with dmsetup, its status line read back.

(The dm-cache backend proper is its own issue; this proves the lab has a working dm-cache.)
"""

from __future__ import annotations

import os
import stat

import pytest

from cachemgr import runner


@pytest.mark.kernel(disks="512M,128M,16M")
@pytest.mark.qemu_smoke
def test_dmcache_create_write_status(lab_disks: list[str]) -> None:
    origin, fast, meta = lab_disks
    sectors = runner.run(["blockdev", "--getsz", origin]).stdout.strip()
    runner.run(["dd", "if=/dev/zero", f"of={meta}", "bs=1M", "count=1", "oflag=direct"])
    table = f"0 {sectors} cache {meta} {fast} {origin} 64 1 writeback smq 0"
    runner.run(["dmsetup", "create", "labcache", "--table", table])
    node = "/dev/mapper/labcache"
    # without udevd this only works with DM_DISABLE_UDEV=1 (the lab sets it): a regular
    # file here would mean fio wrote into /dev, not into the device
    assert stat.S_ISBLK(os.stat(node).st_mode)
    runner.run(["fio", "--name=w", f"--filename={node}", "--rw=randwrite", "--bs=4k",
                "--size=64M", "--io_size=8M", "--direct=1", "--output-format=json"],
               timeout=120)
    status = runner.run(["dmsetup", "status", "labcache"]).stdout.split()
    # <start> <len> cache <md bs> <used>/<total md> <cache bs> <used>/<total> <rh> <rm> <wh>
    # <wm> <demotions> <promotions> <dirty> ...
    assert status[2] == "cache"
    assert status[5] == "64"
    used, total = (int(x) for x in status[6].split("/"))
    assert total == (128 << 20) // (64 * 512)
    write_hits, write_misses = int(status[9]), int(status[10])
    assert write_hits + write_misses > 0
    dirty = int(status[13])
    assert 0 < dirty <= used
    assert status[3] != "Fail"
    runner.run(["dmsetup", "remove", "labcache"])
