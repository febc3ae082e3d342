"""Capture the fio outputs of tests/fixtures/fio that the bench's explanation reads (issue #32):
bcache over a slow "HDD" whose cache "SSD" is just as slow, and the SSD itself read as
``--reference cache-ssd`` reads it. In the lab, from the checkout:

    cachemgr lab run --disks 1G,512M,512M -- .venv/bin/python scripts/capture-fio-slow-ssd.py

The first disk under dm-delay (8 ms per IO) is the HDD, the second under dm-delay (8 ms) the
cache SSD of bcache0 (writeback, 128 KiB buckets, congestion thresholds 0 as the bench sets
them), the third bare: a fast SSD. The jobs are the bench's own job files
(JobSpec.jobfile; reference_spec for the read-only reference runs). Writes into
tests/fixtures/fio:

* randwrite-qd1-bcache-none-slow-ssd.json: QD1 Zipf(1.2) 4 KiB random writes over 256 MiB
  of /dev/bcache0 in mode none (the bare HDD through bcache),
* randwrite-qd1-bcache-writeback-slow-ssd.json: the same in writeback,
* randread-qd1-readonly-slow-ssd.json: the reference job on the slow cache SSD,
* randread-qd1-readonly-bare-ssd.json: the reference job on the bare third disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cachemgr.backends import bcache  # noqa: E402
from cachemgr.core.model import CacheMode  # noqa: E402
from cachemgr.core.sysfs import Sysfs  # noqa: E402
from cachemgr.procedures.bench import JobSpec  # noqa: E402
from cachemgr.procedures.bench.reference import reference_spec  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "fio"


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def delayed(name: str, disk: str, ms: int) -> str:
    sectors = sh("blockdev", "--getsz", disk).strip()
    sh("dmsetup", "create", name, "--table", f"0 {sectors} delay {disk} 0 {ms}")
    return f"/dev/mapper/{name}"


def fio(spec: JobSpec, device: str, name: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.fio"
        job.write_text(spec.jobfile(name, device, seed=1001))
        done = subprocess.run(["fio", "--output-format=json",
                               *(["--readonly"] if spec.readonly else []), str(job)],
                              capture_output=True, text=True, cwd=tmp)
        if done.returncode:
            sys.exit(f"fio failed: {done.stderr} {done.stdout[-2000:]}\n{job.read_text()}")
    (OUT / out).write_text(done.stdout)
    print(out, file=sys.stderr)


def main() -> int:
    if os.environ.get("CACHEMGR_IN_LAB") != "1":
        print("run it in the lab (see the docstring)", file=sys.stderr)
        return 2
    hdd_raw, ssd_raw, fast = os.environ["LAB_DISKS"].split()[:3]
    hdd = delayed("hdd", hdd_raw, 8)
    ssd = delayed("slowssd", ssd_raw, 8)
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=ssd, bucket="128k", mode=CacheMode.WRITEBACK)
    b = next(x for x in bcache.scan(sysfs).backings if x.identity.node == hdd)
    assert b.device and b.cset_uuid
    for k in ("congested_read_threshold_us", "congested_write_threshold_us"):
        sysfs.write(f"fs/bcache/{b.cset_uuid}/{k}", "0")
    spec = JobSpec(rw="randwrite", iodepth=1, distribution="zipf:1.2", size="256M", runtime=5)
    mode = f"block/{b.device_name}/bcache/cache_mode"
    sysfs.write(mode, "none")
    fio(spec, b.device, "bcache-none", "randwrite-qd1-bcache-none-slow-ssd.json")
    sysfs.write(mode, "writeback")
    fio(spec, b.device, "bcache-writeback", "randwrite-qd1-bcache-writeback-slow-ssd.json")
    ref = reference_spec(spec)
    fio(ref, ssd, ssd, "randread-qd1-readonly-slow-ssd.json")
    fio(ref, fast, fast, "randread-qd1-readonly-bare-ssd.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
