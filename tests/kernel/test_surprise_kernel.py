"""The cache SSD pulled by surprise: what bcache does, and what cachemgr reports and advises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs


def cm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cachemgr", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})


def fio(dev: str, *extra: str, check: bool = True) -> runner.Completed:
    return runner.run(["fio", "--name=vm", f"--filename={dev}", "--bs=4k", "--direct=1",
                       "--size=32M", "--output-format=json", *extra], timeout=120, check=check)


@pytest.mark.kernel(disks="512M,512M", timeout=300)
def test_ssd_pulled_while_one_device_dirty_and_one_clean(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    (ssd,) = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)
    bcache.create(sysfs, backings=lab_disks, cache=ssd.node, bucket="64k")
    snap = snapshot.take(sysfs)
    by_node = {b.identity.node: b for b in snap.backings}
    dirty_dev, clean_dev = by_node[lab_disks[0]], by_node[lab_disks[1]]
    cset = snap.cache_sets[0].uuid
    bcache.set_mode(sysfs, dirty_dev, CacheMode.WRITEBACK)
    sysfs.write(f"block/{dirty_dev.device_name}/bcache/writeback_running", "0")
    fio(dirty_dev.device or "", "--rw=randwrite")
    assert not snapshot.take(sysfs).backings[0].dirty.is_zero(512)  # type: ignore[union-attr]
    # the clean device (writethrough) has data of its own that must survive
    fio(clean_dev.device or "", "--rw=write", "--verify=crc32c", "--do_verify=0",
        "--verify_state_save=0")

    sysfs.write(f"block/{ssd.name}/device/delete", "1")  # the SSD is gone
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sysfs.is_dir(f"fs/bcache/{cset}"):
        # IO makes bcache notice (journal and data errors fail the set)
        fio(dirty_dev.device or "", "--rw=randread", "--runtime=1", "--time_based",
            check=False)
        time.sleep(0.5)
    assert not sysfs.is_dir(f"fs/bcache/{cset}"), "the cache set did not fail"

    # bcache stopped the dirty device (its /dev/bcacheN is gone) and kept the clean one
    r = cm("status", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [d["backing"] for d in data["devices"]] == [lab_disks[1]]
    clean = data["devices"][0]
    # 7.2 keeps reporting "clean" (its superblock state) once the set is gone
    assert clean["state"] in ("clean", "no cache") and clean["cache"] is None
    assert clean["device"] == clean_dev.device
    (lost,) = data["unregistered"]
    assert lost["device"] == lab_disks[0] and lost["kind"] == "bcache-backing-unregistered"
    assert lost["superblock_state"] == "dirty" and lost["cache"] == cset
    assert lost["dirty_data_lost_with_cache"] is True
    text = cm("status").stdout
    assert "whose SSD is absent" in text and "force-run" in text \
        and "next: bring the SSD back, then cachemgr register SSD" in text

    # VM IO on the clean device continues in passthrough, its data intact
    fio(clean_dev.device or "", "--rw=write", "--verify=crc32c", "--verify_only",
        "--verify_fatal=1", "--verify_state_save=0")
    out = fio(clean_dev.device or "", "--rw=randrw", "--runtime=2", "--time_based").stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    assert job["error"] == 0 and job["write"]["total_ios"] > 0
