"""LVM-owned caches on the lab kernel with real lvm2 (issue #16): lvmcache (cache pool and
cachevol) and lvm writecache, built with lvm2's own commands on scratch disks, shown by
``cachemgr status`` (checked against ``lvs --reportformat json``) and changed by cachemgr
through lvm2 only.

The origin PV is a dm-delay device over the first disk (an "HDD": writeback takes time); the
raw disk is filtered out of lvm2's view (it carries the same PV label). The lab writes
lvmlocal.conf for a guest without udevd (cachemgr/lab/stage2.sh)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.core import runner, state
from tests.kernel import clirun, scenarios
from tests.kernel.scenarios import sha256

cm = clirun.in_process
VG = "vg0"
LV = f"{VG}/vm1"
DM = "vg0-vm1"

FIO = ["fio", "--bs=4k", "--direct=1", "--random_distribution=zipf:1.2", "--size=192M",
       "--output-format=json"]


def sh(*argv: str, timeout: float = 300) -> str:
    return runner.run(list(argv), timeout=timeout).stdout


def lvm(*args: str) -> str:
    return sh("lvm", *args)


def lvs(name: str, fields: str) -> dict[str, str]:
    out = json.loads(lvm("lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                         "-o", fields, name))
    rows = out["report"][0]["lv"]
    assert len(rows) == 1, rows
    return rows[0]


def dirty_blocks() -> int:
    f = sh("dmsetup", "status", DM).split()
    if f[2] == "writecache":
        return int(f[4]) - int(f[5])
    return int(f[13])


def vg(lab_disks: list[str], delay_ms: int = 5) -> None:
    hdd, ssd = lab_disks[0], lab_disks[1]
    sectors = sh("blockdev", "--getsz", hdd).strip()
    sh("dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 {delay_ms}")
    with open("/etc/lvm/lvmlocal.conf", "a") as f:
        f.write(f'devices {{ global_filter = [ "r|^{hdd}$|" ] }}\n')
    lvm("pvcreate", "-y", "/dev/mapper/hdd", ssd)
    lvm("vgcreate", VG, "/dev/mapper/hdd", ssd)
    lvm("lvcreate", "-y", "-n", "vm1", "-L", "192M", VG, "/dev/mapper/hdd")


def start_reads(trigger: str) -> subprocess.Popen[str]:
    """QD1 random reads until ``trigger`` appears: the cache is never idle, so smq writes no
    dirty block back (it does only when idle, docs/kernel-notes.md, "dm-cache modes, smq and
    the cleaner") and the dirty count holds still while it is compared."""
    return subprocess.Popen(
        [*FIO, "--name=reads", f"--filename=/dev/{LV}", "--rw=randread", "--time_based",
         "--runtime=600", f"--trigger-file={trigger}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")


def cache_pool(ssd: str, mode: str = "writeback") -> None:
    lvm("lvcreate", "-y", "-n", "pool", "-L", "64M", VG, ssd)
    lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "64k", f"{VG}/pool")
    lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"{VG}/pool", "--cachemode", mode,
        LV)


def fill(io_size: str = "16M") -> None:
    sh(*FIO, "--name=fill", f"--filename=/dev/{LV}", "--rw=randwrite", f"--io_size={io_size}",
       timeout=600)


def start_load(trigger: str, rw: str = "randwrite") -> subprocess.Popen[str]:
    return scenarios.verify_load(FIO, f"/dev/{LV}", trigger, rw)


def stop_load(p: subprocess.Popen[str], trigger: str) -> dict[str, object]:
    return scenarios.stop_load(p, trigger, timeout=180)


def device(name: str = LV) -> dict[str, object]:
    r = cm("status", "--json")
    assert r.returncode == 0, r.stderr
    devs = [d for d in json.loads(r.stdout)["devices"]
            if isinstance(d.get("lvm"), dict) and d["lvm"]["name"] == name]
    assert len(devs) == 1, r.stdout
    return devs[0]


@pytest.mark.kernel(disks="1G,512M", timeout=900)
def test_lvmcache_status_and_drain_under_writes(lab_disks: list[str]) -> None:
    vg(lab_disks)
    cache_pool(lab_disks[1])
    reads = start_reads("/tmp/stop-reads")  # before the fill: the cache is never idle
    fill()
    assert dirty_blocks() > 0
    d = device()
    want = lvs(LV, "lv_full_name,cache_mode,cache_policy,cache_settings,chunk_size,"
                   "cache_total_blocks,cache_dirty_blocks,pool_lv")
    lv = d["lvm"]
    assert isinstance(lv, dict)
    assert d["kind"] == "dm-cache" and d["lvm_owned"] is True
    assert lv["vg"] == VG and lv["lv"] == "vm1" and lv["segtype"] == "cache"
    assert lv["pool"] == f"{VG}/{want['pool_lv'].strip('[]')}" == f"{VG}/pool_cpool"
    assert lv["pool_kind"] == "cachepool" and lv["pool_name_when_split"] == f"{VG}/pool"
    assert lv["cache_mode"] == want["cache_mode"] == "writeback" == d["mode"]
    assert lv["policy"] == want["cache_policy"] == "smq"
    assert lv["chunk_bytes"] == int(want["chunk_size"]) == 65536 == d["block_bytes"]
    assert d["total_blocks"] == int(want["cache_total_blocks"])
    assert lv["origin_pvs"] == ["/dev/mapper/hdd"] and lv_cache_pvs_ok(lv, lab_disks)
    assert isinstance(d["dirty_blocks"], int) and d["dirty_blocks"] > 0
    # the text status names it as an admin types it
    r = cm("status")
    assert r.returncode == 0 and LV in r.stdout and "lvmcache vg0/vm1" in r.stdout, r.stdout

    # drain under continuous writes: cleaner policy, progress, policy and mode restored
    Path("/tmp/stop-reads").touch()
    reads.communicate(timeout=120)
    trig = "/tmp/stop-drain"
    load = start_load(trig)
    # the writes dirty blocks again once fio runs (seconds on a loaded TCG guest); the drain
    # starts with dirty data
    t0 = time.monotonic()
    while (before := dirty_blocks()) == 0 and time.monotonic() - t0 < 120:
        time.sleep(0.5)
    p = clirun.process("drain", f"/dev/{LV}", "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["clean"] is True and doc["device"] == LV
    assert doc["restored"]["policy"] == "smq" and doc["restored"]["mode"] == "writeback"
    assert before > 0
    stop_load(load, trig)
    after = lvs(LV, "cache_mode,cache_policy,kernel_cache_policy")
    assert after["cache_mode"] == "writeback" and after["cache_policy"] == "smq", after
    assert after["kernel_cache_policy"] == "smq", after
    assert not list((state.state_dir() / "lvm-drain").glob("*.json"))

    # a second drain on a clean cache: "already" (exit 4), nothing changed
    sh("sync")
    r = cm("drain", LV)
    if dirty_blocks() == 0:
        assert r.returncode in (0, 4), r.stderr


def lv_cache_pvs_ok(lv: dict[str, object], lab_disks: list[str]) -> bool:
    pvs = lv["cache_pvs"]
    assert isinstance(pvs, list)
    # the pool's data on the SSD, its metadata wherever lvm2 put it (first free PV)
    return lab_disks[1] in pvs and set(pvs) <= {lab_disks[1], "/dev/mapper/hdd"}


@pytest.mark.kernel(disks="1G,512M", timeout=900)
def test_lvmcache_mode_switches_under_verify_load(lab_disks: list[str]) -> None:
    vg(lab_disks, delay_ms=2)
    cache_pool(lab_disks[1], mode="writethrough")
    r = cm("mode", LV, "writeback")
    assert r.returncode == 0, r.stderr
    assert lvs(LV, "cache_mode")["cache_mode"] == "writeback"
    # dirty blocks held: reads keep the cache from ever being idle
    reads = start_reads("/tmp/stop-reads")
    fill("16M")
    assert dirty_blocks() > 0
    for mode in ("passthrough", "writethrough"):
        r = cm("mode", LV, mode)
        assert r.returncode == 3 and "--drain" in r.stderr, r.stderr
        assert lvs(LV, "cache_mode")["cache_mode"] == "writeback"
    Path("/tmp/stop-reads").touch()
    reads.communicate(timeout=120)
    trig = "/tmp/stop-modes"
    load = start_load(trig)
    time.sleep(2)
    r = cm("mode", LV, "passthrough", "--drain", "--yes")
    assert r.returncode == 0, r.stderr
    got = lvs(LV, "cache_mode,cache_policy")
    assert got == {"cache_mode": "passthrough", "cache_policy": "smq"}, got
    r = cm("mode", LV, "passthrough")
    assert r.returncode == 4, r.stderr
    r = cm("mode", LV, "writeback")
    assert r.returncode == 0, r.stderr
    r = cm("mode", LV, "writearound")
    assert r.returncode == 2 and "lvmcache has no cache mode" in r.stderr, r.stderr
    stop_load(load, trig)
    assert lvs(LV, "cache_mode")["cache_mode"] == "writeback"


@pytest.mark.kernel(disks="1G,512M", timeout=900)
def test_split_attach_uncache_keep_every_byte(lab_disks: list[str]) -> None:
    vg(lab_disks, delay_ms=2)
    cache_pool(lab_disks[1])
    fill("24M")
    assert dirty_blocks() > 0
    want = sha256(f"/dev/{LV}")
    r = cm("detach", LV, "--yes")
    assert r.returncode == 0, r.stderr
    assert lvs(LV, "segtype")["segtype"] == "linear"
    pool = lvs(f"{VG}/pool", "lv_layout,cache_policy")
    assert pool["lv_layout"] == "cache,pool" and pool["cache_policy"] == "smq", pool
    assert sha256(f"/dev/{LV}") == want
    # attach it again through cachemgr (lvconvert --type cache --cachepool)
    r = cm("attach", LV, f"{VG}/pool", "--mode", "writeback")
    assert r.returncode == 0, r.stderr
    got = lvs(LV, "segtype,cache_mode,cache_policy")
    assert got == {"segtype": "cache", "cache_mode": "writeback", "cache_policy": "smq"}, got
    r = cm("attach", LV, f"{VG}/pool")
    assert r.returncode == 4, r.stderr
    # a detach killed after lvm2's split, before its journal went (the state such a crash
    # leaves: the cleaner in the split-off pool's metadata, the drain journal naming the LV):
    # drain --resume puts the policy back on the pool and drops the journal
    from cachemgr.backends.lvm import manage

    lvm("lvchange", "-y", "--cachepolicy", "cleaner", LV)
    state.write_json(manage.journal_for(LV), {
        "lv": LV, "segtype": "cache", "policy": "smq", "pool": "pool",
        "pool_kind": "cachepool", "cleaner": "0", "cache_mode": "writeback",
        "started": time.time()})
    lvm("lvconvert", "-y", "--splitcache", LV)
    assert lvs(f"{VG}/pool", "cache_policy")["cache_policy"] == "cleaner"
    r = cm("drain", LV, "--resume")
    assert r.returncode == 0 and "policy smq put back on vg0/pool" in r.stderr, r.stderr
    assert lvs(f"{VG}/pool", "cache_policy")["cache_policy"] == "smq"
    assert not manage.journal_for(LV).exists()
    r = cm("drain", LV, "--resume")
    assert r.returncode == 2 and "not a cached LV" in r.stderr, r.stderr
    r = cm("attach", LV, f"{VG}/pool", "--mode", "writeback")
    assert r.returncode == 0, r.stderr
    fill("24M")
    want = sha256(f"/dev/{LV}")
    r = cm("remove", LV, "--yes")
    assert r.returncode == 0, r.stderr
    assert lvs(LV, "segtype")["segtype"] == "linear"
    assert "pool" not in lvm("lvs", "--noheadings", "-o", "lv_name", VG)
    assert sha256(f"/dev/{LV}") == want


@pytest.mark.kernel(disks="1G,512M", timeout=900)
def test_writecache_status_tune_drain_and_split(lab_disks: list[str]) -> None:
    vg(lab_disks, delay_ms=2)
    lvm("lvcreate", "-y", "-an", "-n", "fast", "-L", "64M", VG, lab_disks[1])
    r = cm("attach", LV, f"{VG}/fast", "--writecache")
    assert r.returncode == 0, r.stderr
    assert lvs(LV, "segtype")["segtype"] == "writecache"
    sh(*FIO, "--name=fill", f"--filename=/dev/{LV}", "--rw=randwrite", "--io_size=16M",
       "--size=64M", timeout=600)
    d = device()
    want = lvs(LV, "writecache_total_blocks,writecache_free_blocks,writecache_block_size")
    assert d["kind"] == "dm-writecache" and d["mode"] == "writeback"
    assert d["total_blocks"] == int(want["writecache_total_blocks"])
    assert d["block_bytes"] == int(want["writecache_block_size"])
    assert d["high_watermark"] == 50 and d["low_watermark"] == 45
    assert isinstance(d["dirty_blocks"], int)
    lv = d["lvm"]
    assert isinstance(lv, dict) and lv["segtype"] == "writecache"
    assert lv["pool"] == f"{VG}/fast_cvol" and lv["pool_kind"] == "cachevol"
    # tune: lvchange --cachesettings; out of range refused before lvm2 runs
    r = cm("tune", LV, "high_watermark=60")
    assert r.returncode == 0, r.stderr
    assert "high_watermark 60" in sh("dmsetup", "table", DM)
    assert cm("tune", LV, "high_watermark=60").returncode == 4
    r = cm("tune", LV, "high_watermark=101")
    assert r.returncode == 2, r.stderr
    r = cm("mode", LV, "writethrough")
    assert r.returncode == 2 and "only has writeback" in r.stderr, r.stderr
    # drain: cleaner=1, polled to zero, cleaner=0 again
    if dirty_blocks() == 0:
        sh(*FIO, "--name=more", f"--filename=/dev/{LV}", "--rw=randwrite", "--io_size=8M",
           "--size=64M", timeout=600)
    r = cm("drain", LV, "--json")
    if r.returncode == 0:
        assert json.loads(r.stdout)["restored"] == {"cleaner": "0"}
    else:
        assert r.returncode == 4, r.stderr  # the kernel wrote it back first
    assert dirty_blocks() == 0
    assert "cleaner" not in sh("dmsetup", "table", DM).split()[7:] or \
        "cleaner 0" in sh("dmsetup", "table", DM)
    # detach (split) with dirty data: every byte on the origin
    sh(*FIO, "--name=again", f"--filename=/dev/{LV}", "--rw=randwrite", "--io_size=16M",
       "--size=64M", timeout=600)
    want_sum = sha256(f"/dev/{LV}")
    r = cm("detach", LV, "--yes")
    assert r.returncode == 0, r.stderr
    assert lvs(LV, "segtype")["segtype"] == "linear"
    assert sha256(f"/dev/{LV}") == want_sum
