"""Sizing flows into warm (issue #45 item 3) on the lab kernel: a trace taken before the
cache existed warms it. bcache: the bare disk traced (hot blocks tagged with their own
content), bcache made on it, the data found at the disk's offsets less the data offset
(bcache-super-show's dev.data.first_sector, the sizes' difference), warm from that trace
admits the hot set: a read of it through /dev/bcache0 hits (bcache's own counters), a cold
set of the same size does not. LVM: the LV traced before lvconvert makes it an LVM cache,
then warmed through its cache. A trace that cannot map (the LVM cache's PV) is refused,
exit 2, saying why.

The UML lab kernel has no block tracing: the traces are written with the recorder's own
writer (tests/kernel/test_warm_kernel.py's write_trace), as `cachemgr trace --rate 1`
would write them of the device named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from tests.kernel import clirun
from tests.kernel.test_warm_kernel import (
    BLOCK,
    bcache_hit_ratios,
    hot_sets,
    no_undo_journals,
    write_trace,
)


def tag(i: int) -> bytes:
    return f"hot block {i:08d}".encode().ljust(BLOCK, b".")


@pytest.mark.kernel(disks="1G,256M")
def test_warm_bcache_from_a_trace_of_the_bare_disk(lab_disks: list[str],
                                                   tmp_path: Path) -> None:
    backing, ssd = lab_disks
    sysfs = Sysfs()
    disk_size = int(runner.run(["blockdev", "--getsize64", backing]).stdout)
    # the hot set in the disk's own blocks, away from its first 1 MiB (where make-bcache
    # writes its superblock); the VM's data is at these offsets of the bare disk
    a_disk, cold_disk = hot_sets(disk_size - (1 << 20), 2048)
    a_disk = [b + 256 for b in a_disk]
    cold_disk = [b + 256 for b in cold_disk]
    fd = os.open(backing, os.O_WRONLY)
    try:
        for i, b in enumerate(a_disk[:32]):
            os.pwrite(fd, tag(i), b * BLOCK)
        os.fsync(fd)
    finally:
        os.close(fd)
    trace = tmp_path / "disk.trace"
    write_trace(sysfs, backing, a_disk, trace)  # the bare disk, before bcache

    bcache.make_bcache(backing=[backing], cache=ssd, bucket="128k")
    for d in (backing, ssd):
        bcache.register(sysfs, d)
    assert bcache.wait_for(lambda: sysfs.exists("block/bcache0/bcache/cache"), 10)
    b = snapshot.take(sysfs).backings[0]
    sb = runner.run(["bcache-super-show", backing]).stdout
    first = next(int(x.split()[1]) for x in sb.splitlines()
                 if x.startswith("dev.data.first_sector"))
    size = int(runner.run(["blockdev", "--getsize64", "/dev/bcache0"]).stdout)
    assert disk_size - size == first * 512, (disk_size, size, first)
    shift = first * 512 // BLOCK
    # the data stayed where it was on the disk: /dev/bcache0 shows it less the offset
    fd = os.open("/dev/bcache0", os.O_RDONLY)
    try:
        for i, blk in enumerate(a_disk[:32]):
            assert os.pread(fd, BLOCK, (blk - shift) * BLOCK) == tag(i), (i, blk)
    finally:
        os.close(fd)

    r = clirun.in_process("warm", "/dev/bcache0", "--trace", str(trace), "--bytes", "16M",
                          "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["trace_device"] == backing and doc["trace_shift_bytes"] == first * 512, doc
    r = clirun.in_process("warm", "/dev/bcache0", "--trace", str(trace), "--bytes", "4M")
    assert r.returncode == 0, r.stderr
    assert (f"the trace is of {backing}, /dev/bcache0's backing device: its offsets read "
            f"less bcache's data offset") in r.stdout, r.stdout
    assert no_undo_journals()

    a = [x - shift for x in a_disk]
    cold = [x - shift for x in cold_disk]
    warmed, unwarmed = bcache_hit_ratios(sysfs, b.identity.name, a, cold)
    print(f"bcache from the bare disk's trace: read hit ratio of the warmed set "
          f"{warmed:.3f}, of a cold set {unwarmed:.3f} (data offset {first} sectors)")
    assert warmed >= 0.9 and unwarmed <= 0.2, (warmed, unwarmed)


def lvm(*args: str) -> str:
    return runner.run(list(args), timeout=120,
                      env={**os.environ, "DM_DISABLE_UDEV": "1"}).stdout


@pytest.mark.kernel(disks="512M,128M", timeout=600)  # smq's passes: 2-6 s each, loaded
def test_warm_lvm_cache_from_a_trace_of_the_lv_before_it_was_cached(
        lab_disks: list[str], tmp_path: Path) -> None:
    pv, fast = lab_disks
    sysfs = Sysfs()
    lvm("pvcreate", "-y", pv, fast)
    lvm("vgcreate", "vg", pv, fast)
    lvm("lvcreate", "-y", "-n", "lv", "-L", "256M", "vg", pv)
    size = int(runner.run(["blockdev", "--getsize64", "/dev/vg/lv"]).stdout)
    # one 4k block in each 64 KiB cache block (lvm2's default chunk here): 256 of them
    a, _ = hot_sets(size, 256, spacing=16)
    trace = tmp_path / "lv.trace"
    write_trace(sysfs, "/dev/vg/lv", a, trace)  # the plain LV, before it is cached
    pv_trace = tmp_path / "pv.trace"
    write_trace(sysfs, pv, a, pv_trace)
    lvm("lvcreate", "-y", "--type", "cache-pool", "-n", "cp", "-L", "64M", "vg", fast)
    lvm("lvconvert", "-y", "--type", "cache", "--cachemode", "writethrough",
        "--cachepool", "vg/cp", "vg/lv")

    r = clirun.in_process("warm", "vg/lv", "--trace", str(pv_trace))
    assert r.returncode == 2 and "the trace is of another device" in r.stderr, r.stderr
    assert pv in r.stderr, r.stderr

    r = clirun.in_process("warm", "vg/lv", "--trace", str(trace), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ad = doc["admitted"]
    print(f"LVM cache from the LV's trace before lvconvert: {ad}, {doc['passes']} passes "
          f"ended by {doc['passes_ended_by']}")
    assert doc["trace_shift_bytes"] == 0 and ad is not None and ad["of"] == len(a), doc
    assert ad["blocks"] > 0, doc  # smq admits part of a set: as for a trace of the cache
    assert no_undo_journals()
