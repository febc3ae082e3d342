"""Benchmark: draining an lvmcache (issue #16): cachemgr vs lvm2's own flush vs the HDD's limit,
on the same amount of dirty data, in one run (runs in the lab, one guest).

    cachemgr lab run --disks 1G,512M --timeout 1800 -- \
        .venv/bin/python benchmarks/lvm_drain_bench.py [MiB]

vg0 over a dm-delay "HDD" (DELAY_MS per IO, default 20) on the first disk and the second disk
as the SSD; vm1 (512 MiB) on the HDD, cached by a 256 MiB cache pool (64 KiB chunks, writeback,
smq) on the SSD. D MiB of dirty data (64 KiB random writes: D*16 dirty chunks) are written
while a QD1 read load keeps the cache busy (smq writes back only when idle), and the read load
goes on during each measurement (a VM that keeps doing IO). In one run:

(a) limit: fio writes the same bytes (64 KiB random, iodepth 16) to a scratch LV on the HDD;
(b) ``cachemgr detach vg0/vm1 --yes``: the cleaner drain with progress (the same cleaner
    table loaded again whenever the dirty count stands still, docs/kernel-notes.md, "dm-cache
    modes, smq and the cleaner"), then lvconvert --splitcache;
(c) ``lvconvert --splitcache vg0/vm1`` on the same amount of dirty data (the pool attached again
    and refilled): lvm2 flushes inside the command ("Flushing N blocks") and then splits.
Prints one JSON line with the times and the ratios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cachemgr.core import runner

VG, LV, DM = "vg0", "vg0/vm1", "vg0-vm1"
CHUNK = 64 * 1024


def sh(*argv: str, timeout: float = 1800) -> str:
    return runner.run(list(argv), timeout=timeout).stdout


def lvm(*args: str, timeout: float = 1800) -> str:
    return sh("lvm", *args, timeout=timeout)


def fio(*args: str) -> dict:  # type: ignore[type-arg]
    out = sh("fio", "--output-format=json", *args)
    return json.loads(out[out.index("{"):])  # type: ignore[no-any-return]


def dirty_bytes() -> int:
    return int(sh("dmsetup", "status", DM).split()[13]) * CHUNK


def setup(hdd: str, ssd: str, delay_ms: int) -> None:
    sectors = sh("blockdev", "--getsz", hdd).strip()
    sh("dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 {delay_ms}")
    with open("/etc/lvm/lvmlocal.conf", "a") as f:
        f.write(f'devices {{ global_filter = [ "r|^{hdd}$|" ] }}\n')
    lvm("pvcreate", "-y", "/dev/mapper/hdd", ssd)
    lvm("vgcreate", VG, "/dev/mapper/hdd", ssd)
    lvm("lvcreate", "-y", "-n", "vm1", "-L", "512M", VG, "/dev/mapper/hdd")
    lvm("lvcreate", "-y", "-n", "scratch", "-L", "256M", VG, "/dev/mapper/hdd")
    lvm("lvcreate", "-y", "--type", "cache-pool", "-n", "pool", "-L", "256M",
        "--chunksize", "64k", VG, ssd)
    attach()


def attach() -> None:
    lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"{VG}/pool", "--cachemode",
        "writeback", LV)


def fill(mib: int) -> int:
    fio("--name=fill", f"--filename=/dev/{LV}", "--rw=randwrite", "--bs=64k",
        f"--io_size={mib}M", "--size=512M", "--direct=1", "--ioengine=libaio", "--iodepth=8",
        "--randrepeat=0")
    return dirty_bytes()


def reads(trigger: str) -> subprocess.Popen[str]:
    Path(trigger).unlink(missing_ok=True)
    return subprocess.Popen(
        ["fio", "--name=vm", f"--filename=/dev/{LV}", "--rw=randread", "--bs=4k",
         "--direct=1", "--time_based", "--runtime=3600", f"--trigger-file={trigger}",
         "--rate_iops=50", "--output-format=json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")


def stop(p: subprocess.Popen[str], trigger: str) -> None:
    Path(trigger).touch()
    p.communicate(timeout=300)


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    delay = int(os.environ.get("DELAY_MS", "20"))
    hdd, ssd = os.environ["LAB_DISKS"].split()[:2]
    setup(hdd, ssd, delay)
    trig = "/tmp/stop-reads"
    out: dict[str, object] = {"bench": "lvm_drain", "mib": mib, "delay_ms": delay,
                              "chunk_bytes": CHUNK}

    # (a) the HDD's limit for the same bytes
    load = reads(trig)
    dirty_a = fill(mib)
    out["dirty_bytes"] = dirty_a
    t0 = time.monotonic()
    fio("--name=limit", f"--filename=/dev/{VG}/scratch", "--rw=randwrite", "--bs=64k",
        f"--io_size={dirty_a}", "--size=256M", "--direct=1", "--ioengine=libaio",
        "--iodepth=16", "--randrepeat=0")
    limit = time.monotonic() - t0
    out["limit_s"] = round(limit, 2)

    # (b) cachemgr detach: drain with the cleaner (progress), then --splitcache
    dirty_b = dirty_bytes()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "cachemgr", "detach", LV, "--json", "--yes"],
                       capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    cm_s = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"cachemgr detach failed: {p.stderr}")
    out["cachemgr_dirty_bytes"] = dirty_b
    out["cachemgr_detach_s"] = round(cm_s, 2)
    stop(load, trig)

    # (c) lvm2's own: the same amount dirty again, then lvconvert --splitcache
    attach()
    load = reads(trig)
    dirty_c = fill(mib)
    t0 = time.monotonic()
    lvm("lvconvert", "-y", "--splitcache", LV, timeout=3600)
    lvm_s = time.monotonic() - t0
    stop(load, trig)
    out["lvm2_dirty_bytes"] = dirty_c
    out["lvm2_splitcache_s"] = round(lvm_s, 2)
    # per dirty byte, so unequal fills compare fairly
    per = {k: t / max(1, d) for k, t, d in (("limit", limit, dirty_a), ("cachemgr", cm_s, dirty_b),
                                           ("lvm2", lvm_s, dirty_c))}
    out["cachemgr_vs_limit"] = round(per["cachemgr"] / per["limit"], 2)
    out["lvm2_vs_limit"] = round(per["lvm2"] / per["limit"], 2)
    out["cachemgr_vs_lvm2"] = round(per["cachemgr"] / per["lvm2"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
