"""Lab set-ups that several kernel tests start from."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cachemgr.backends import bcache
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs


def bcache_holding_dirty(backing: str, cache: str, *, bucket: str, size: str,
                         io_size: str) -> Sysfs:
    """/dev/bcache0 in writeback over ``backing`` with ``cache``, writeback stopped, and
    ``io_size`` of 4k random writes over its first ``size``: dirty data that stays put."""
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[backing], cache=cache, bucket=bucket,
                  mode=CacheMode.WRITEBACK)
    sysfs.write("block/bcache0/bcache/writeback_running", "0")
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                f"--size={size}", f"--io_size={io_size}", "--direct=1",
                "--output-format=json"])
    return sysfs


def sha256(node: str) -> str:
    """Of the whole device, read with O_DIRECT in 8 MiB requests (dm-delay delays each
    request: small buffered reads through it take ten times longer)."""
    h = hashlib.sha256()
    with subprocess.Popen(["dd", f"if={node}", "bs=8M", "iflag=direct", "status=none"],
                          stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        while chunk := p.stdout.read(8 << 20):
            h.update(chunk)
    assert p.returncode == 0
    return h.hexdigest()


# A "VM" of the kernel tests does at most this many 4 KiB requests a second: a busy VM's
# pace, not the guest CPU's. Unbounded, a writer spun a CPU while its cache was in writeback
# (a write there costs only the SSD's time), and every step of the procedure under test, and
# the other tests' guests, waited for CPU: one replacement kill test took 59 CPU-seconds
# unbounded and 46 at this pace (UML, 2026-11-26).
# Under qemu's TCG every request of fio's costs ten times the CPU: 100 a second there (the
# bcache NVMe replacement took 67 host CPU-seconds at 100 against 135 at 400, alone,
# 2026-11-26); UML keeps 400 (a kill test 28-33 CPU-s either way).
LOAD_IOPS = 100 if os.environ.get("LAB_BACKEND") == "qemu" else 400


def verify_load(fio: Sequence[str], node: str, trigger: str,
                rw: str = "randwrite", rate_iops: int = LOAD_IOPS) -> subprocess.Popen[str]:
    """VM-like load on ``node`` until ``trigger`` appears: ``fio`` (its base argv) writing
    at QD1, at most ``rate_iops`` requests a second, verified as it goes."""
    return subprocess.Popen(
        [*fio, "--name=vm", f"--filename={node}", f"--rw={rw}", "--time_based",
         "--runtime=600", "--verify=crc32c", "--verify_fatal=1", "--verify_backlog=64",
         "--verify_state_save=0", f"--trigger-file={trigger}", f"--rate_iops={rate_iops}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")


def stop_load(p: subprocess.Popen[str], trigger: str, timeout: float = 120
              ) -> dict[str, object]:
    """Stop a :func:`verify_load` and check it saw no IO or verify error; its fio job."""
    Path(trigger).touch()
    out, err = p.communicate(timeout=timeout)
    job: dict[str, object] = json.loads(out[out.index("{"):])["jobs"][0]
    assert job["error"] == 0 and job.get("total_err", 0) == 0, err
    return job
