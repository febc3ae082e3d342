"""Benchmark: a drain that spares the VMs (`cachemgr drain --max-latency`), on an HDD that
queues (runs in the lab, one guest).

    cachemgr lab run --backend uml --disks 256M --timeout 1800 -- \\
        .venv/bin/python benchmarks/paced_drain_bench.py [MiB] [MS]

Backing "HDD": the lab's queueing HDD (cachemgr/lab/hdd.py: scsi_debug, one request at a time,
SEEK_MS each, default 5), the model the kernel test uses; cache: the first disk. In one run:

(0) the HDD queues: fio 4 KiB random reads at QD1 and QD8 on it, IOPS (the same when it
    serialises);
(a) idle: a "VM" reading 4 KiB at random at QD1 (READ_IOPS, default 20) on /dev/bcache0 in
    mode none (its reads go to the HDD), nothing else, for IDLE_S seconds (default 60): its p99;
    each run of the reader draws its own offsets (fio's randrepeat=0: with fio's default seed
    every run read the same blocks in the same order, and a later run hit what an earlier
    one had brought into the cache);
(b) `cachemgr drain` (unpaced) of D MiB (default 16) of dirty 4 KiB random writes, the same
    reader running through the whole drain: the drain's time and the reader's p99;
(c) `cachemgr drain --max-latency MS` (default 20), same data, same reader: the same.
SCHED names the HDD's IO scheduler (default: the kernel's, mq-deadline in the lab).
The drains run as the CLI in their own process (as an admin runs them: its CPU counts, the
guest has one). Prints one JSON line: the p99s, the times and the ratios.

KIND=dmcache runs the same on a dm-cache device instead (docs/kernel-notes.md, "Pacing a
dm-cache drain"): /dev/mapper/vc over the HDD, its metadata (8 MiB) and cache (128 MiB) on
the first disk, 32 KiB blocks; the idle reader runs in passthrough (nothing promoted), the
dirty data is D MiB of 32 KiB random writes held in writeback (smq with a migration_threshold
under one block never writes back), and the drains are the cleaner's (`cachemgr drain vc`),
the paced one through dm_cache's cache_copy_throttle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cachemgr.backends import bcache
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.lab.hdd import queueing_hdd

B = "block/bcache0/bcache"
STOP = Path("/run/stop-vm")
DM = os.environ.get("KIND", "bcache") == "dmcache"
DEV = "/dev/mapper/vc" if DM else "/dev/bcache0"
DM_BLOCK = 64  # sectors: 32 KiB cache blocks


def fio(*args: str, timeout: float = 900) -> dict:  # type: ignore[type-arg]
    out = runner.run(["fio", "--output-format=json", *args], timeout=timeout).stdout
    return json.loads(out[out.index("{"):])  # type: ignore[no-any-return]


def fill(sysfs: Sysfs, mib: int) -> str:
    """D MiB of dirty 4 KiB random writes in the first 128 MiB, held (writeback off); mode
    none after. Returns dirty_data."""
    sysfs.write(f"{B}/writeback_running", "0")
    sysfs.write(f"{B}/cache_mode", "writeback")
    fio("--name=fill", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k", "--size=128M",
        f"--io_size={mib}M", "--direct=1", "--ioengine=libaio", "--iodepth=16",
        "--randrepeat=0")
    sysfs.write(f"{B}/cache_mode", "none")
    return sysfs.read(f"{B}/dirty_data")


def vm(iops: int) -> subprocess.Popen[str]:
    """The VM: QD1 4 KiB random reads where nothing is dirty, until STOP appears."""
    STOP.unlink(missing_ok=True)
    return subprocess.Popen(
        ["fio", "--name=vm", f"--filename={DEV}", "--rw=randread", "--bs=4k",
         "--offset=128M", "--size=128M", "--direct=1", "--randrepeat=0", "--time_based",
         "--runtime=3600",
         f"--rate_iops={iops}", f"--trigger-file={STOP}", "--output-format=json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd="/tmp")


def dmsetup(*args: str) -> str:
    return runner.run(["dmsetup", *args], timeout=120).stdout


def dm_create(hdd: str, ssd: str) -> str:
    """/dev/mapper/vc over ``hdd``, in passthrough (clean, promotes nothing); the table's
    head, up to its feature arguments."""
    dmsetup("create", "meta", "--table", f"0 16384 linear {ssd} 0")
    dmsetup("create", "cdata", "--table", f"0 262144 linear {ssd} 16384")
    runner.run(["dd", "if=/dev/zero", "of=/dev/mapper/meta", "bs=4k", "count=1",
                "oflag=direct"])
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    head = f"0 {sectors} cache /dev/mapper/meta /dev/mapper/cdata {hdd} {DM_BLOCK}"
    dmsetup("create", "vc", "--table", f"{head} 1 passthrough smq 0")
    return head


def dm_fill(mib: int) -> str:
    """D MiB of dirty 32 KiB random writes in the first 128 MiB, held: writeback, smq, a
    migration_threshold under one block (never "idle", so smq writes nothing back).
    Returns the dirty blocks."""
    head = dmsetup("table", "vc").split(" cache ")[0]
    rest = dmsetup("table", "vc").split(" cache ", 1)[1].split()[:4]
    dmsetup("suspend", "vc")
    dmsetup("load", "vc", "--table", f"{head} cache {' '.join(rest)} 1 writeback smq 2 "
                                     "migration_threshold 1")
    dmsetup("resume", "vc")
    fio("--name=fill", f"--filename={DEV}", "--rw=randwrite", "--bs=32k", "--size=128M",
        f"--io_size={mib}M", "--direct=1", "--ioengine=libaio", "--iodepth=16",
        "--randrepeat=0")
    return f"{dmsetup('status', '--noflush', 'vc').split()[13]} blocks"


def vm_result(p: subprocess.Popen[str]) -> dict[str, float]:
    STOP.touch()
    out, _ = p.communicate(timeout=120)
    r = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    pct = r["clat_ns"]["percentile"]
    return {"p99_ms": round(pct["99.000000"] / 1e6, 1), "p95_ms": round(pct["95.000000"] / 1e6, 1),
            "p50_ms": round(pct["50.000000"] / 1e6, 1),
            "mean_ms": round(r["clat_ns"]["mean"] / 1e6, 1), "ios": r["total_ios"]}


def drained(sysfs: Sysfs, mib: int, iops: int, *extra: str) -> dict[str, object]:
    if DM:
        dirty = dm_fill(mib)
        p = vm(iops)
        time.sleep(1)
    else:
        dirty = fill(sysfs, mib)
        p = vm(iops)
        time.sleep(1)
        sysfs.write(f"{B}/writeback_running", "1")  # the kernel's default; the drain keeps it
    t0 = time.monotonic()
    d = subprocess.run([sys.executable, "-m", "cachemgr", "drain", DEV,
                        "--stall-timeout", "600", *extra],
                       capture_output=True, text=True, timeout=3600)
    secs = time.monotonic() - t0
    r = vm_result(p)
    assert d.returncode == 0, d.stderr[-2000:]
    notes = [ln for ln in d.stderr.splitlines() if "other IO" in ln]
    if os.environ.get("NOTES"):  # every progress line's pacing note, for a closer look
        print(json.dumps({"drain": list(extra), "notes": [
            ln.split("; ", 1)[-1][:200] for ln in notes]}), file=sys.stderr)
    return {"dirty": dirty, "drain_s": round(secs, 1), "vm": r,
            "summary": d.stdout.strip().splitlines()[-1] if d.stdout.strip() else "",
            "last_note": notes[-1].split("; ", 1)[-1] if notes else None}


def main() -> int:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    bound = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    seek_ms = float(os.environ.get("SEEK_MS", "5"))
    iops = int(os.environ.get("READ_IOPS", "20"))
    sched = os.environ.get("SCHED")  # the HDD's IO scheduler; default: the kernel's
    hdd = queueing_hdd(seek_ms=seek_ms, size_mb=320)
    qsched = f"/sys/block/{os.path.basename(hdd)}/queue/scheduler"
    if sched:
        Path(qsched).write_text(sched)
    sched_now = Path(qsched).read_text().split("[")[1].split("]")[0]
    ssd = os.environ["LAB_DISKS"].split()[0]

    # (0) it queues: QD8 gives no more IOPS than QD1
    qd = {}
    for depth in (1, 8):
        j = fio("--name=qd", f"--filename={hdd}", "--rw=randread", "--bs=4k", "--direct=1",
                "--ioengine=libaio", f"--iodepth={depth}", "--time_based", "--runtime=4")
        qd[depth] = round(j["jobs"][0]["read"]["iops"])

    sysfs = Sysfs()
    if DM:
        dm_create(hdd, ssd)
    else:
        bcache.create(sysfs, backings=[hdd], cache=ssd, bucket="128k",
                      mode=CacheMode.WRITEBACK)

    # (a) idle
    if not DM:
        sysfs.write(f"{B}/cache_mode", "none")
    p = vm(iops)
    time.sleep(float(os.environ.get("IDLE_S", "60")))
    idle = vm_result(p)
    # (b) unpaced, (c) paced
    unpaced = drained(sysfs, mib, iops)
    paced = drained(sysfs, mib, iops, "--max-latency", f"{bound:g}")

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    print(json.dumps({
        "kind": "dmcache" if DM else "bcache", "kernel": os.uname().release,
        "dirty_mib": mib, "seek_ms": seek_ms,
        "vm_read_iops": iops, "max_latency_ms": bound, "hdd_scheduler": sched_now,
        "hdd_qd1_iops": qd[1], "hdd_qd8_iops": qd[8], "qd8_vs_qd1": ratio(qd[8], qd[1]),
        "idle": idle, "unpaced": unpaced, "paced": paced,
        "unpaced_p99_vs_idle": ratio(unpaced["vm"]["p99_ms"], idle["p99_ms"]),  # type: ignore[index]
        "paced_p99_vs_idle": ratio(paced["vm"]["p99_ms"], idle["p99_ms"]),  # type: ignore[index]
        "paced_p99_vs_bound": ratio(paced["vm"]["p99_ms"], bound),  # type: ignore[index]
        "paced_time_vs_unpaced": ratio(paced["drain_s"], unpaced["drain_s"]),  # type: ignore[arg-type]
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
