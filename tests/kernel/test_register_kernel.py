"""cachemgr register on the lab kernel: a cache set stopped with dirty data on its SSD (as a
failed boot or the kernel leaves it) comes back, cache device first, every byte of the dirty
data with it; a backing device whose dirty data sits on an SSD that is absent, or present
and not named, is refused and nothing is registered."""

from __future__ import annotations

import time

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs
from tests.kernel import clirun

here = clirun.in_process
FIO = ["--bs=4k", "--direct=1", "--verify=crc32c", "--verify_state_save=0",
       "--offset=64M", "--size=32M", "--output-format=json"]


def _gone(sysfs: Sysfs, rel: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sysfs.exists(rel):
        time.sleep(0.1)
    assert not sysfs.exists(rel), rel


@pytest.mark.kernel(disks="1G,256M", timeout=400)
def test_register_brings_back_a_stopped_set_cache_first(lab_disks: list[str]) -> None:
    hdd, ssd_disk = lab_disks[0], lab_disks[1]
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 2"])
    # the "SSD" 1 MiB into its disk: once its dm device is removed, no device on the host
    # carries the cache's superblock (the whole disk would, at offset 0)
    ssd_sectors = int(runner.run(["blockdev", "--getsz", ssd_disk]).stdout) - 2048
    ssd_table = f"0 {ssd_sectors} linear {ssd_disk} 2048"
    runner.run(["dmsetup", "create", "ssd", "--table", ssd_table])
    sysfs = Sysfs()
    bcache.create(sysfs, backings=["/dev/mapper/hdd"], cache="/dev/mapper/ssd",
                  bucket="128k", mode=CacheMode.WRITEBACK)
    b = snapshot.take(sysfs).backings[0]
    cset = b.cset_uuid
    assert cset and b.device
    sysfs.write(f"block/{b.device_name}/bcache/writeback_running", "0")  # keep the dirt
    runner.run(["fio", "--name=pre", f"--filename={b.device}", "--rw=randwrite",
                "--do_verify=0", *FIO], timeout=300)
    b = snapshot.take(sysfs).backings[0]
    assert b.dirty is not None and not b.dirty.is_zero(512)
    # the set stopped with the dirty data on its SSD (what a boot without udev's rules,
    # or the kernel after a transient SSD fault, leaves): both devices unregistered
    sysfs.write(f"fs/bcache/{cset}/stop", "1")
    _gone(sysfs, f"fs/bcache/{cset}")
    _gone(sysfs, f"block/{b.device_name}")
    hdd_name = b.identity.name
    assert not sysfs.is_dir(f"block/{hdd_name}/bcache")

    # cachemgr check, as a monitoring agent runs it: CRITICAL, naming the command
    r = here("check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("CACHEMGR CRITICAL - ") and "cachemgr register /dev/" \
        in r.stdout, r.stdout

    # the backing device alone: its SSD is present, not named: refused, nothing registered
    r = here("register", "/dev/mapper/hdd")
    assert r.returncode == 3, r.stderr
    assert "holds dirty data on cache set" in r.stderr and "was not named" in r.stderr
    assert "cachemgr register /dev/" in r.stderr, r.stderr
    assert not sysfs.is_dir(f"block/{hdd_name}/bcache")
    # the SSD gone: refused, saying so
    runner.run(["dmsetup", "remove", "ssd"])
    r = here("register", "/dev/mapper/hdd")
    assert r.returncode == 3 and "SSD is absent" in r.stderr, r.stderr
    assert not sysfs.is_dir(f"block/{hdd_name}/bcache")
    runner.run(["dmsetup", "create", "ssd", "--table", ssd_table])

    # both, the backing device named first: the SSD is registered first all the same
    r = here("register", "/dev/mapper/hdd", "/dev/mapper/ssd")
    assert r.returncode == 0, r.stderr
    snap = snapshot.take(sysfs)
    assert [c.uuid for c in snap.cache_sets] == [cset]
    b = snap.backings[0]
    assert b.cset_uuid == cset and b.device is not None and b.state == CacheState.DIRTY
    runner.run(["fio", "--name=pre", f"--filename={b.device}", "--rw=randwrite",
                "--verify_only", "--verify_fatal=1", *FIO], timeout=300)
    r = here("register", "/dev/mapper/ssd", "/dev/mapper/hdd")
    assert r.returncode == 4, r.stderr
    r = here("check")
    assert r.returncode == 0 and r.stdout.startswith("CACHEMGR OK - 1 cached devices"), \
        r.stdout
