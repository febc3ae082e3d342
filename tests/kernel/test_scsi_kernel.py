"""SCSI hotplug on the lab kernel with scsi_debug disks: remove, rescan, wait, refusals."""

from __future__ import annotations

import json
import os

import pytest

from cachemgr.backends import bcache, scsi
from cachemgr.backends.scsi import WaitProgress
from cachemgr.core import runner
from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs

MARK = b"cachemgr: the data outlives the name"


def sd_disks() -> dict[str, str | None]:
    """lsblk's SCSI disks: name -> serial."""
    out = runner.run(["lsblk", "-J", "-d", "-o", "NAME,SERIAL"]).stdout
    return {d["name"]: d["serial"] for d in json.loads(out)["blockdevices"]
            if d["name"].startswith("sd")}


@pytest.mark.kernel()
def test_remove_then_rescan_brings_the_disk_back_under_another_name() -> None:
    sysfs = Sysfs()
    found = scsi.load_scsi_debug(sysfs, dev_size_mb=16, num_tgts=2, vpd_use_hostno=0)
    host = scsi.find_scsi_debug_host(sysfs)
    assert sysfs.read(f"class/scsi_host/{host}/proc_name") == "scsi_debug"
    assert {d.host for d in found} == {host}
    by_name = {d.name: d for d in found}
    a, b = by_name["sda"], by_name["sdb"]  # whichever addresses the async probe gave them
    assert sd_disks() == {"sda": a.serial, "sdb": b.serial}
    with open(a.node, "r+b") as f:  # scsi_debug keeps its store while the disk is out
        f.seek(1 << 20)
        f.write(MARK)
        f.flush()
        os.fsync(f.fileno())

    ra, rb = scsi.remove(sysfs, "sda"), scsi.remove(sysfs, "sdb")
    assert (ra.disk, rb.disk) == (a, b) and ra.overridden == ()
    assert not sysfs.exists("block/sda") and not os.path.exists("/dev/sda")
    assert not sysfs.exists(f"class/scsi_device/{a.hctl}") and sd_disks() == {}

    # bring b back first, at its own address only: it takes the first free name, sda
    assert scsi.rescan(sysfs, rb.disk.hctl) == scsi.Rescanned(host, f"0 {b.hctl.target} 0")
    nb = scsi.wait_for_disk(sysfs, b.wwid or "", 10)
    assert nb.name == "sda" and nb.hctl == b.hctl

    # then the whole host: a comes back as sdb; found by its WWN, not its old name
    assert scsi.rescan(sysfs, host).scan == "- - -"
    seen: list[WaitProgress] = []
    na = scsi.wait_for_disk(sysfs, ra.disk.wwid or "", 10, progress=seen.append)
    assert na.name == "sdb" != a.name
    assert (na.hctl, na.wwid, na.serial, na.size_bytes) == (a.hctl, a.wwid, a.serial,
                                                           a.size_bytes)
    assert sd_disks() == {"sda": b.serial, "sdb": a.serial}
    with open(na.node, "rb") as f:
        f.seek(1 << 20)
        assert f.read(len(MARK)) == MARK
    # and by serial and address too
    assert scsi.wait_for_disk(sysfs, f"serial:{a.serial}", 1) == na
    assert scsi.wait_for_disk(sysfs, str(a.hctl), 1) == na


def _bcache(sysfs: Sysfs, backing: str, cache: str) -> str:
    bcache.make_bcache(backing=[backing], cache=cache, bucket="64k")
    for dev in (backing, cache):
        bcache.register(sysfs, dev)
    assert bcache.wait_for(lambda: sysfs.exists("block/bcache0/bcache/cache"), 10)
    return os.path.basename(sysfs.readlink("block/bcache0/bcache/cache") or "")


@pytest.mark.kernel(disks="512M")
def test_remove_refuses_the_cache_device_of_a_registered_set(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    # 128 MiB in 64k buckets: bcache wants at least 1024 buckets ("nbuckets is too small")
    (ssd,) = scsi.load_scsi_debug(sysfs, dev_size_mb=128, num_tgts=1)
    cset = _bcache(sysfs, lab_disks[0], ssd.node)
    assert sysfs.listdir(f"block/{ssd.name}/holders") == ["bcache0"]
    with pytest.raises(UnsafeError) as exc:
        scsi.remove(sysfs, ssd.name)
    assert f"cache device of bcache cache set {cset}" in str(exc.value)
    assert exc.value.exit_code == 3
    # nothing happened: the disk and the cache set are still there
    assert sysfs.exists(f"block/{ssd.name}/bcache/set")
    assert sysfs.read("block/bcache0/bcache/state") == "clean"


@pytest.mark.kernel(disks="256M")
def test_remove_refuses_a_disk_that_holds_a_bcache_device(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    (hdd,) = scsi.load_scsi_debug(sysfs, dev_size_mb=64, num_tgts=1)
    _bcache(sysfs, hdd.node, lab_disks[0])
    with pytest.raises(UnsafeError) as exc:
        scsi.remove(sysfs, hdd.name)
    assert f"/dev/{hdd.name} is held by bcache0" in str(exc.value)
    assert "registered bcache backing device of /dev/bcache0" in str(exc.value)
    assert os.path.exists("/dev/bcache0") and sysfs.exists(f"block/{hdd.name}")


@pytest.mark.kernel()
def test_remove_refuses_a_mounted_disk_until_unmounted(tmp_path_factory: pytest.TempPathFactory,
                                                       ) -> None:
    sysfs = Sysfs()
    (d,) = scsi.load_scsi_debug(sysfs, dev_size_mb=32, num_tgts=1)
    mnt = tmp_path_factory.mktemp("mnt")
    runner.run(["mkfs.ext4", "-q", "-F", d.node])
    runner.run(["mount", d.node, str(mnt)])
    try:
        with pytest.raises(UnsafeError, match=f"mounted on {mnt}"):
            scsi.remove(sysfs, d.name)
        assert sysfs.exists(f"block/{d.name}")
    finally:
        runner.run(["umount", str(mnt)])
    removed = scsi.remove(sysfs, d.name)
    assert removed.disk == d and not sysfs.exists(f"block/{d.name}")
