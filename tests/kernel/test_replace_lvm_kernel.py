"""SSD replacement under LVM-owned caches (issue #16 item 4) on the lab kernel with real lvm2:
the cache SSD is a scsi_debug disk (a PV of the VG), the origin lies on a dm-delay "HDD" PV, and
a VM-like fio load writes and verifies on the cached LV throughout. The killed-at-every-step
test has two LVs cached on the one SSD PV (issue #35 item 4): one run replaces both caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.backends import scsi
from cachemgr.core import runner, state
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace
from cachemgr.procedures.replace import lvm as replace_lvm
from tests.kernel import clirun, scenarios

VG = "vg0"
LV = f"{VG}/vm1"
DM = "vg0-vm1"
# the load writes the LV's first 96 MiB; 128-160 MiB is written before the replacement (dirty
# in the cache when it starts) and read back after it
FIO = ["fio", "--bs=4k", "--direct=1", "--random_distribution=zipf:1.2", "--size=96M",
       "--output-format=json"]
LV2 = f"{VG}/vm2"  # the second LV cached on the same SSD PV (128 MiB: the load's 96 MiB + 32)


def pre(lv: str = LV, size: str = "32M") -> list[str]:
    """Data written before the replacement (dirty in the cache when it starts) and read back
    after it: beyond the load's 96 MiB (vm1: 128 MiB on, vm2: 96 MiB on)."""
    offset = "128M" if lv == LV else "96M"
    return ["fio", "--name=pre", f"--filename=/dev/{lv}", "--rw=randwrite", "--bs=4k",
            "--direct=1", f"--offset={offset}", f"--size={size}", "--verify=crc32c",
            "--verify_state_save=0", "--output-format=json"]

cm_here = clirun.in_process


def cm(*args: str, env: dict[str, str] | None = None,
       timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``python -m cachemgr ARGS`` as its own process (a run that must die of SIGKILL)."""
    return subprocess.run([sys.executable, "-m", "cachemgr", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})})


def sh(*argv: str, timeout: float = 300) -> str:
    return runner.run(list(argv), timeout=timeout).stdout


def lvm(*args: str) -> str:
    return sh("lvm", *args)


def lvs(name: str, fields: str) -> dict[str, str]:
    out = json.loads(lvm("lvs", "-a", "--reportformat", "json", "--units", "b", "--nosuffix",
                         "-o", fields, name))
    rows = out["report"][0]["lv"]
    assert len(rows) == 1, rows
    return dict(rows[0])


def dirty_blocks(dm: str = DM) -> int:
    f = sh("dmsetup", "status", dm).split()
    if f[2] == "writecache":
        return int(f[4]) - int(f[5])
    return int(f[13])


def setup(lab_disks: list[str], hosts: int = 1) -> list[scsi.ScsiDisk]:
    """vg0 over a dm-delay HDD and scsi_debug SSD(s) (the first one in the VG), with vm1 on
    the HDD."""
    ssds = sorted(scsi.load_scsi_debug(Sysfs(), dev_size_mb=160, per_host_store=1,
                                       add_host=hosts), key=lambda d: int(d.host[4:]))
    hdd = lab_disks[0]
    sectors = sh("blockdev", "--getsz", hdd).strip()
    sh("dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 2")
    with open("/etc/lvm/lvmlocal.conf", "a") as f:
        f.write(f'devices {{ global_filter = [ "r|^{hdd}$|" ] }}\n')
    lvm("pvcreate", "-y", "/dev/mapper/hdd", ssds[0].node)
    lvm("vgcreate", VG, "/dev/mapper/hdd", ssds[0].node)
    lvm("lvcreate", "-y", "-n", "vm1", "-L", "192M", VG, "/dev/mapper/hdd")
    return ssds


def pre_write(lv: str = LV, size: str = "32M") -> None:
    sh(*pre(lv, size), "--do_verify=0", timeout=600)


def pre_verify(lv: str = LV, size: str = "32M") -> None:
    sh(*pre(lv, size), "--verify_only", "--verify_fatal=1", "--ioengine=libaio",
       "--iodepth=32", timeout=600)


def cached_on(ssd_node: str, lv: str = LV) -> dict[str, str]:
    """``lv``'s cache, checked to lie on ``ssd_node``; lvs's fields of it."""
    got = lvs(lv, "segtype,pool_lv,cache_mode,cache_policy,cache_settings")
    pool = got["pool_lv"].strip("[]")
    where = lvs(f"{VG}/{pool}", "devices")["devices"]
    if got["segtype"] == "cache" and pool.endswith("_cpool"):
        where = lvs(f"{VG}/{pool}_cdata", "devices")["devices"]
    assert where.startswith(ssd_node + "("), (got, where)
    return got


@pytest.mark.kernel(disks="1G", timeout=1500, mem=1024)
def test_lvmcache_replacement_killed_after_every_step_under_verify_load(
        lab_disks: list[str]) -> None:
    ssds = setup(lab_disks)
    lvm("lvcreate", "-y", "-n", "pool", "-L", "64M", VG, ssds[0].node)
    lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "64k", f"{VG}/pool")
    lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"{VG}/pool", "--cachemode",
        "writeback", "--cachesettings", "migration_threshold=4096", LV)
    # the usual layout: one SSD PV caching several VM LVs (vm2: another pool, its own mode)
    lvm("lvcreate", "-y", "-n", "vm2", "-L", "128M", VG, "/dev/mapper/hdd")
    lvm("lvcreate", "-y", "-n", "pool2", "-L", "16M", VG, ssds[0].node)
    lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "128k", f"{VG}/pool2")
    lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"{VG}/pool2", "--cachemode",
        "writeback", LV2)
    trig, trig2 = "/tmp/stop-load", "/tmp/stop-load2"
    load = scenarios.verify_load(FIO, f"/dev/{LV}", trig)
    load2 = scenarios.verify_load(FIO, f"/dev/{LV2}", trig2)
    try:
        pre_write()
        pre_write(LV2, "8M")  # seconds of fio: its 16 MiB cache holds it dirty
        assert dirty_blocks() > 0 and dirty_blocks("vg0-vm2") > 0, "no dirty data to protect"
        before = cached_on(ssds[0].node)
        before2 = cached_on(ssds[0].node, LV2)
        r = cm_here("replace-ssd", LV, "--dry-run")
        assert r.returncode == 0, r.stderr
        assert "lvmcache (cachepool) vg0/vm1" in r.stdout and "vgreduce" in r.stdout, r.stdout
        assert "chunk 64.0 KiB" in r.stdout or "chunk 64 KiB" in r.stdout, r.stdout
        assert "and of vg0/vm2" in r.stdout, r.stdout
        assert not replace.list_runs() and cached_on(ssds[0].node) == before

        # killed after the split, rolled back: both pools are attached again as they were
        r = cm("replace-ssd", LV, "--yes", env={replace.KILL_AFTER_ENV: "split"})
        assert r.returncode == -9, r.stderr
        run = next(j for j in replace.list_runs() if j.status == "running")
        assert run.kind == "lvm" and run.done[-1] == "split"
        assert run.lvs() == [LV, LV2]
        # uncached, still serving IO
        assert lvs(LV, "segtype")["segtype"] == lvs(LV2, "segtype")["segtype"] == "linear"
        # the second LV is the run's: a plan naming it is refused while the run is unfinished
        r = cm_here("replace-ssd", LV2, "--dry-run")
        assert r.returncode == 3 and run.id in r.stderr, r.stderr
        r = cm_here("replace-ssd", "--rollback", run.id)
        assert r.returncode == 0, r.stderr
        assert cached_on(ssds[0].node) == before and cached_on(ssds[0].node, LV2) == before2
        assert not list((state.state_dir() / "lvm-drain").glob("*.json"))

        # one replacement killed after every step in turn, each time resumed by a new process
        names = [n for n, _ in replace_lvm.STEPS]
        r = cm("replace-ssd", LV, "--yes", env={replace.KILL_AFTER_ENV: names[0]})
        assert r.returncode == -9, r.stderr
        run = next(j for j in replace.list_runs() if j.status == "running")
        for step in names[1:-1]:
            r = cm("replace-ssd", "--resume", run.id, env={replace.KILL_AFTER_ENV: step})
            assert r.returncode == -9, (step, r.returncode, r.stderr)
            assert replace.Journal.load(run.id).done[-1] == step
        r = cm_here("replace-ssd", "--resume", run.id, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["status"] == "done" and doc["kind"] == "lvm" and doc["lv"] == LV
        assert [s["name"] for s in doc["steps"]] == names and all(s["done"]
                                                                   for s in doc["steps"])
    finally:
        job = scenarios.stop_load(load, trig, timeout=180)
        job2 = scenarios.stop_load(load2, trig2, timeout=180)
    assert job["write"]["total_ios"] > 0 and job2["write"]["total_ios"] > 0  # type: ignore[index]
    # the same SSD came back: both caches lie on it alone now, with the old settings
    node = next(d.node for d in scsi.disks(Sysfs()) if d.wwid == ssds[0].wwid)
    after = cached_on(node)
    assert after == before, (before, after)
    assert after["cache_mode"] == "writeback" and "migration_threshold=4096" in \
        after["cache_settings"]
    assert cached_on(node, LV2) == before2
    assert lvs(f"{VG}/pool2_cpool", "chunk_size")["chunk_size"] == str(128 * 1024)
    assert lvs(f"{VG}/pool_cpool_cmeta", "devices")["devices"].startswith(node + "(")
    assert lvs(f"{VG}/pool2_cpool_cmeta", "devices")["devices"].startswith(node + "(")
    assert not list((state.state_dir() / "lvm-drain").glob("*.json"))
    pre_verify()
    pre_verify(LV2, "8M")


@pytest.mark.kernel(disks="1G", timeout=900, mem=1024)
def test_lvm_writecache_replaced_by_another_disk_and_refusals(lab_disks: list[str]) -> None:
    ssds = setup(lab_disks, hosts=2)
    lvm("lvcreate", "-y", "-n", "fast", "-L", "48M", VG, ssds[0].node)
    # a refusal first: another LV on the SSD's PV
    lvm("lvcreate", "-y", "-n", "other", "-L", "8M", VG, ssds[0].node)
    lvm("lvchange", "-an", f"{VG}/fast")
    lvm("lvconvert", "-y", "--type", "writecache", "--cachevol", f"{VG}/fast",
        "--cachesettings", "high_watermark=60 writeback_jobs=8", LV)
    r = cm_here("replace-ssd", LV, "--new", ssds[1].node, "--yes")
    assert r.returncode == 3 and "other" in r.stderr and "pvmove" in r.stderr, r.stderr
    lvm("lvremove", "-y", f"{VG}/other")
    # an LV that is not cached, and a new disk that carries a filesystem: refused, no run
    lvm("lvcreate", "-y", "-n", "plain", "-L", "8M", VG, "/dev/mapper/hdd")
    r = cm_here("replace-ssd", f"{VG}/plain", "--yes")
    assert r.returncode == 2 and "not a cached LV" in r.stderr, r.stderr
    sh("mkfs.ext4", "-q", "-F", ssds[1].node)
    r = cm_here("replace-ssd", LV, "--new", ssds[1].node, "--yes")
    assert r.returncode == 3 and "ext4" in r.stderr, r.stderr
    assert replace.list_runs() == []
    assert lvs(LV, "segtype")["segtype"] == "writecache"
    sh("wipefs", "-a", ssds[1].node)

    trig = "/tmp/stop-load"
    # the zipf load: under the cleaner setting dm-writecache still caches writes to blocks it
    # holds (writecache.rst, "cleaner"), so its hot block rewritten at QD1 stays dirty; the
    # drain writes such last blocks back with IO held (docs/kernel-notes.md, "dm-writecache").
    # Before that, this load stalled the drain for good (the test ran uniform writes).
    load = scenarios.verify_load(FIO, f"/dev/{LV}", trig)
    try:
        pre_write()
        assert dirty_blocks() > 0, "no dirty data to protect"
        r = cm_here("replace-ssd", LV, "--new", ssds[1].node, "--yes", "--json")
        assert r.returncode == 0, r.stderr
    finally:
        scenarios.stop_load(load, trig, timeout=180)
    doc = json.loads(r.stdout)
    assert doc["status"] == "done" and doc["new"]["wwid"] == ssds[1].wwid
    got = cached_on(ssds[1].node)
    assert got["segtype"] == "writecache", got
    assert "high_watermark=60" in got["cache_settings"] and "writeback_jobs=8" in \
        got["cache_settings"], got
    # the old SSD left the VG, its label wiped, and was removed from the SCSI bus
    assert not any(d.wwid == ssds[0].wwid for d in scsi.disks(Sysfs()))
    pvs = lvm("pvs", "--noheadings", "-o", "pv_name")
    assert ssds[0].node not in pvs.split() or ssds[0].node == ssds[1].node
    pre_verify()
    Path(trig).unlink(missing_ok=True)
