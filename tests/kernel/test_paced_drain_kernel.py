"""drain --max-latency on the lab kernel, over the queueing HDD (cachemgr/lab/hdd.py: one
request at a time, 5 ms each): the pace goes down while a VM's reads are over the bound,
back up when they stop, the data is written back and every tunable is put back; a bad bound
is a usage error that changes nothing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner, state
from cachemgr.core.model import CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs
from cachemgr.lab.hdd import queueing_hdd
from tests.kernel import clirun

B = "block/bcache0/bcache"
TUNABLES = ("writeback_percent", "writeback_delay", "writeback_running",
            "writeback_rate_minimum")
STOP = "/run/stop-paced-reader"
# The bound is under what the HDD gives the reader alone, so the pace must go down while the
# reader reads. A bound the reader meets alone and crosses only behind the drain's writes made
# the test depend on the host's load: a bcache device's counters time a request in jiffies (10
# ms steps at the lab's HZ=100), the pacer's p99 is that of 0.1 s slices' means (core/pace.py),
# and with 5 ms requests and a 15 ms bound the slices read 10-14 ms on a quiet host (never
# over: the pace never went down) and over 15 only when a loaded host's CPU stretched the
# reads. That a drain's writes push a reader's p99 up, and how far pacing brings it back, is
# measured by benchmarks/paced_drain_bench.py (docs/benchmarks.md, "A drain that spares the
# VMs"); the controller's rules by tests/unit/test_pace.py.
BOUND_MS = 3
SEEK_MS = 5


def setup_dirty(cache: str, dirty: str = "8M") -> Sysfs:
    """bcache in writeback over the queueing HDD, ``dirty`` of 4 KiB random writes held with
    writeback_running=0, then mode none (nothing new gets dirty)."""
    hdd = queueing_hdd(seek_ms=SEEK_MS, size_mb=128)
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=cache, bucket="128k", mode=CacheMode.WRITEBACK)
    sysfs.write(f"{B}/writeback_running", "0")
    runner.run(["fio", "--name=fill", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=64M", f"--io_size={dirty}", "--direct=1", "--iodepth=16",
                "--ioengine=libaio", "--output-format=json"], timeout=300)
    sysfs.write(f"{B}/cache_mode", "none")
    b = snapshot.take(sysfs).backings[0]
    assert b.dirty is not None and b.dirty.bytes > 4 << 20, b.dirty
    return sysfs


def reader(dev: str = "/dev/bcache0", *, offset: str = "64M", size: str = "64M",
           keep: bool = False, iops: int = 50) -> subprocess.Popen[str]:
    """A VM reading ``dev`` at QD1 (``iops`` a second) where nothing is dirty or cached: its
    reads go to the HDD (test_paced_dmcache_drain_kernel's and test_scrub_kernel's too). It
    stops when STOP appears; ``keep``: its JSON kept for :func:`reader_p99`."""
    Path(STOP).unlink(missing_ok=True)
    return subprocess.Popen(
        ["fio", "--name=vm", f"--filename={dev}", "--rw=randread", "--bs=4k",
         f"--offset={offset}", f"--size={size}", "--direct=1", "--time_based",
         "--runtime=600", f"--rate_iops={iops}", f"--trigger-file={STOP}", "--output-format=json"],
        stdout=subprocess.PIPE if keep else subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        text=True, cwd="/tmp")


def reader_p99(vm: subprocess.Popen[str]) -> float:
    """Stop a :func:`reader` started with ``keep``: its p99 completion latency in ms, as fio
    measured it (from submission to fio seeing the end)."""
    Path(STOP).touch()
    out, _ = vm.communicate(timeout=120)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    assert job["error"] == 0, job
    return float(job["read"]["clat_ns"]["percentile"]["99.000000"]) / 1e6


def tunables(sysfs: Sysfs) -> dict[str, str]:
    return {k: sysfs.read(f"{B}/{k}") for k in TUNABLES}


@pytest.mark.kernel(disks="256M", timeout=600)
def test_paced_drain_slows_for_a_reader_and_puts_everything_back(
        lab_disks: list[str]) -> None:
    sysfs = setup_dirty(lab_disks[0])
    vm = reader()
    time.sleep(0.5)  # the reader first: an idle set is written back at full speed by bcache
    sysfs.write(f"{B}/writeback_running", "1")
    before = tunables(sysfs)
    assert before["writeback_percent"] == "10" and before["writeback_rate_minimum"] == "8"

    # refusals first: nothing changes, exit 2
    for bad in ("0", "-3", "nan", "abc", "1e999"):
        rc, out, err = clirun.run_process("drain", "/dev/bcache0", "--max-latency", bad)
        assert rc == 2, (bad, out, err)
        assert "--max-latency" in err
    rc, _, err = clirun.run_process("mode", "/dev/bcache0", "none", "--max-latency", "10",
                                    "--yes")
    assert rc == 2 and "--drain" in err, err
    assert tunables(sysfs) == before

    # 5 ms a request, one at a time: the reader's reads count 0 or 10 ms each, their slices'
    # p99 is over BOUND_MS
    drain = clirun.process("drain", "/dev/bcache0", "--max-latency", str(BOUND_MS),
                           "--stall-timeout", "300")
    assert drain.stderr is not None
    lines: list[str] = []
    lowered_note = None
    try:
        # the pacer decides every 2 s, the progress line comes every 5: a line says how often
        # the pace went down so far and why the last time
        for line in drain.stderr:
            lines.append(line)
            if ("(slowed " in line and "last for other IO p99" in line
                    and f"> {BOUND_MS} ms" in line):
                lowered_note = line
                break
        # the reader stops: no other IO, the drain goes back to full speed and ends
        Path(STOP).touch()
        vm.wait(timeout=60)
        out, rest = drain.communicate(timeout=600)
    finally:
        if drain.poll() is None:
            drain.kill()
        Path(STOP).touch()
    lines += rest.splitlines()
    assert lowered_note is not None, "".join(lines)
    assert "writeback " in lowered_note and "KiB/s" in lowered_note  # the pace is shown
    assert drain.returncode == 0, (out, "".join(lines))
    assert "slowed down" in out and "slowed down 0 times" not in out, out

    b = snapshot.take(sysfs).backings[0]
    assert b.dirty is not None and b.dirty.is_zero(512) and b.state == CacheState.CLEAN
    assert tunables(sysfs) == before  # writeback_rate_minimum included
    assert not state.journal_path("drain", b.uuid or b.identity.name).exists()
