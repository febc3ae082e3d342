"""Benchmark: drain time for D MiB of dirty data (runs in the lab, one guest).

    cachemgr lab run --disks 1G,2G --timeout 1200 -- \
        .venv/bin/python benchmarks/drain_bench.py [MiB]

Backing "HDD": dm-delay (DELAY_MS per IO, default 50) over the first disk; cache: the second
disk. dm-delay serves any number of IOs at once, so at the 64 writes bcache keeps in flight a
50 ms "HDD" takes 1,280 IOPS, still more than a real disk; a 2 ms one would take 32,000, more
than the lab's emulated "SSD" reads under qemu/TCG (2,500-6,000 IOPS), and the drain would
then measure the SSD, not the HDD (docs/benchmarks.md has both). In one run:

(a) physical limit: fio writes the same amount (4k random, iodepth 64) to the bare backing
    device: the time the device needs to absorb those writes;
(b) cachemgr drain (time until dirty data first reads 0; the total with the clean
    confirmation, two reads 2 s apart, is reported too): D MiB of dirty data (4k random
    writes held with writeback_running=0), mode switched to none, a light QD1 read load on
    /dev/bcache0 (a VM that keeps doing IO, which also keeps bcache from declaring the set
    idle), then `cachemgr drain`;
(c) bcache's defaults with only the mode switched to none, same load, watched for W seconds:
    the drain rate observed and the projected time to drain D MiB at that rate.
Prints one JSON line with the three times and the ratios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain

B = "block/bcache0/bcache"


def fio(*args: str, timeout: float = 900) -> dict:  # type: ignore[type-arg]
    out = runner.run(["fio", "--output-format=json", *args], timeout=timeout).stdout
    return json.loads(out[out.index("{"):])  # type: ignore[no-any-return]


def fill(sysfs: Sysfs, mib: int) -> int:
    sysfs.write(f"{B}/writeback_running", "0")
    b = snapshot.take(sysfs).backings[0]
    if b.mode != CacheMode.WRITEBACK:
        bcache.set_mode(sysfs, b, CacheMode.WRITEBACK)
    fio("--name=fill", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
        "--size=512M", f"--io_size={mib}M", "--direct=1", "--ioengine=libaio",
        "--iodepth=16", "--randrepeat=0")
    b = snapshot.take(sysfs).backings[0]
    bcache.set_mode(sysfs, b, CacheMode.NONE)
    assert b.dirty is not None
    return b.dirty.bytes


def load(target: str = "/dev/bcache0") -> subprocess.Popen[str]:
    trig = Path("/run/stop-load")
    trig.unlink(missing_ok=True)
    return subprocess.Popen(
        ["fio", "--name=vm", f"--filename={target}", "--rw=randread", "--bs=4k",
         "--size=512M", "--direct=1", "--time_based", "--runtime=3600", "--rate_iops=50",
         f"--trigger-file={trig}", "--output-format=json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, cwd="/tmp")


def stop(p: subprocess.Popen[str]) -> None:
    Path("/run/stop-load").touch()
    p.wait(timeout=60)


def main() -> int:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    watch = float(os.environ.get("DEFAULT_WATCH_S", "60"))
    delay_ms = int(os.environ.get("DELAY_MS", "50"))
    hdd_raw, ssd = os.environ["LAB_DISKS"].split()[:2]
    sectors = runner.run(["blockdev", "--getsz", hdd_raw]).stdout.strip()
    runner.run(["dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd_raw} 0 {delay_ms}"])
    hdd = "/dev/mapper/hdd"

    # what bounds a drain besides the HDD: each writeback IO first reads from the cache
    # device, at most 64 at a time (writeback.c); so measure the SSD's 4k reads at QD64, and
    # the HDD's real per-IO time at QD1 (dm-delay's timer rounds up to jiffies)
    r = fio("--name=ssdread", f"--filename={ssd}", "--rw=randread", "--bs=4k", "--direct=1",
            "--ioengine=libaio", "--iodepth=64", "--time_based", "--runtime=3", "--size=256M")
    ssd_read_iops = r["jobs"][0]["read"]["iops"]
    q = fio("--name=hddqd1", f"--filename={hdd}", "--rw=randwrite", "--bs=4k", "--direct=1",
            "--size=512M", "--offset=512M", f"--io_size={max(1, 2000 // delay_ms) * 4}k")
    hdd_io_ms = q["jobs"][0]["write"]["clat_ns"]["mean"] / 1e6
    ios = mib * 256
    device_s = -(-ios // 64) * hdd_io_ms / 1000  # 64 writes in flight, each hdd_io_ms

    # (a) the backing device's own limit for the same amount of 4k random writes, under the
    #     same light VM load as the drains below
    p = load(hdd)
    j = fio("--name=limit", f"--filename={hdd}", "--rw=randwrite", "--bs=4k", "--size=512M",
            f"--io_size={mib}M", "--direct=1", "--ioengine=libaio", "--iodepth=64",
            "--offset=512M")
    limit_s = j["jobs"][0]["write"]["runtime"] / 1000
    stop(p)

    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=ssd, bucket="128k")

    # (b) cachemgr's drain
    dirty_b = fill(sysfs, mib)
    p = load()
    res = drain.drain(sysfs, snapshot.take(sysfs).backings[0], stall_timeout=120,
                      interval=0.1)
    drain_s = res.zero_s if res.zero_s is not None else res.elapsed_s
    stop(p)

    # (c) the defaults, mode switched only: watch, then project
    dirty_c = fill(sysfs, mib)
    sysfs.write(f"{B}/writeback_running", "1")
    p = load()
    t0 = time.monotonic()
    while time.monotonic() - t0 < watch:
        time.sleep(1)
        b = snapshot.take(sysfs).backings[0]
        if b.dirty is not None and b.dirty.is_zero(512):
            break
    elapsed = time.monotonic() - t0
    b = snapshot.take(sysfs).backings[0]
    left = b.dirty.bytes if b.dirty else dirty_c
    stop(p)
    done = dirty_c - left
    finished = left == 0
    rate = done / elapsed if elapsed > 0 else 0.0
    default_s = elapsed if finished else (dirty_c / rate if rate > 0 else float("inf"))
    print(json.dumps({
        "kernel": os.uname().release, "dirty_mib": mib, "hdd_delay_ms": delay_ms,
        "hdd_qd1_write_ms": round(hdd_io_ms, 2),
        "hdd_qd64_iops_theory": round(64 / hdd_io_ms * 1000),
        "hdd_qd64_iops_measured": round(ios / limit_s) if limit_s else None,
        "ssd_qd64_read_iops": round(ssd_read_iops),
        "limit_theory_s": round(device_s, 2),
        # the limit is the device's only if fio got close to 64 x QD1 speed; otherwise the
        # machine (e.g. qemu's emulated CPU) bounded fio, and the ratio is not the device's
        "limit_is_device_bound": limit_s <= 1.3 * device_s,
        "limit_s": round(limit_s, 2),
        "cachemgr_drain_s": round(drain_s, 2), "cachemgr_dirty_bytes": dirty_b,
        "cachemgr_total_s_with_confirmation": round(res.elapsed_s, 2),
        "default_watched_s": round(elapsed, 1), "default_finished": finished,
        "default_rate_bps": round(rate, 1), "default_projected_s": round(default_s, 1),
        "drain_vs_limit": round(drain_s / limit_s, 2) if limit_s else None,
        "default_vs_drain": round(default_s / drain_s, 1) if drain_s else None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
