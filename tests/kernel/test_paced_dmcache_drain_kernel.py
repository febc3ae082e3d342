"""drain --max-latency of a dm-cache device on the lab kernel, over the queueing HDD
(cachemgr/lab/hdd.py: one request at a time, 5 ms each): the copy throttle goes down while a
VM's reads are over the bound, the data is written back, and the table and dm_cache's
cache_copy_throttle are put back, by the drain itself after SIGTERM and by --resume after a
SIGKILL (docs/kernel-notes.md, "Pacing a dm-cache drain")."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.backends.dmcache import pacing
from cachemgr.core import runner, state
from cachemgr.core.sysfs import Sysfs
from cachemgr.lab.hdd import queueing_hdd
from tests.kernel import clirun
from tests.kernel import test_paced_drain_kernel as paced_bcache

STOP = paced_bcache.STOP
# Under what the HDD gives the reader alone (5 ms requests counted in 10 ms jiffies), so the
# pace must go down while the reader reads: the test_paced_drain_kernel.py reasoning (a bound
# crossed only behind the drain's writes would make the test depend on the host's load).
BOUND_MS = 3
BLOCK = 64  # sectors: 32 KiB cache blocks


def dm(*args: str) -> str:
    return runner.run(["dmsetup", *args], timeout=60).stdout


def dirty() -> int:
    return int(dm("status", "--noflush", "vc").split()[13])


def throttle() -> str:
    return Sysfs().read(pacing.PARAM).strip()


def setup_dirty(ssd: str, mib: int = 8) -> str:
    """dm-cache vc over the queueing HDD, ``mib`` MiB of dirty 32 KiB blocks held (smq with a
    migration_threshold under one block never writes back); its table."""
    hdd = queueing_hdd(seek_ms=5, size_mb=160)
    dm("create", "meta", "--table", f"0 16384 linear {ssd} 0")
    dm("create", "cdata", "--table", f"0 131072 linear {ssd} 16384")
    runner.run(["dd", "if=/dev/zero", "of=/dev/mapper/meta", "bs=4k", "count=1",
                "oflag=direct"])
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    dm("create", "vc", "--table", f"0 {sectors} cache /dev/mapper/meta /dev/mapper/cdata "
                                  f"{hdd} {BLOCK} 1 writeback smq 2 migration_threshold 1")
    fill(mib)
    return dm("table", "vc").strip()


def fill(mib: int) -> None:
    runner.run(["fio", "--name=fill", "--filename=/dev/mapper/vc", "--rw=randwrite",
                "--bs=32k", f"--size={mib}M", "--direct=1", "--ioengine=libaio",
                "--iodepth=16", "--output-format=json"], timeout=300, cwd="/tmp")
    assert dirty() > (mib << 20) // (BLOCK * 512) // 2


def reader() -> subprocess.Popen[str]:
    """A VM reading at QD1 (50 IOPS) where nothing is cached: its reads go to the HDD."""
    return paced_bcache.reader("/dev/mapper/vc")


def wait_for(drain: subprocess.Popen[str], words: tuple[str, ...], lines: list[str]) -> str:
    """The first progress line of ``drain`` with every one of ``words``."""
    assert drain.stderr is not None
    for line in drain.stderr:
        lines.append(line)
        if all(w in line for w in words):
            return line
    raise AssertionError("".join(lines))


def journals() -> list[Path]:
    return [p for kind in ("dmcache-flush", "dmcache-throttle")
            for p in (Path(state.state_dir()) / kind).glob("*.json")]


@pytest.mark.kernel(disks="256M", timeout=900)
def test_paced_dmcache_drain_slows_for_a_reader_and_puts_everything_back(
        lab_disks: list[str]) -> None:
    table = setup_dirty(lab_disks[0])
    assert throttle() == "100"
    rc, _, err = clirun.run_process("drain", "vc", "--max-latency", "0")
    assert rc == 2 and "--max-latency" in err

    # 1. paced, then the reader stops: it slowed down, ends unpaced, cleans, puts back
    vm = reader()
    time.sleep(0.5)
    drain = clirun.process("drain", "vc", "--max-latency", str(BOUND_MS),
                           "--stall-timeout", "300")
    lines: list[str] = []
    try:
        note = wait_for(drain, ("(slowed ", "last for other IO p99", f"> {BOUND_MS} ms",
                                "copy time "), lines)
        assert int(throttle()) < 100  # the kernel's knob is down while paced
        Path(STOP).touch()
        vm.wait(timeout=60)
        out, rest = drain.communicate(timeout=600)
    finally:
        if drain.poll() is None:
            drain.kill()
        Path(STOP).touch()
    lines.append(rest)
    assert "%" in note, note
    assert drain.returncode == 0, (out, "".join(lines))
    assert "slowed down" in out and "slowed down 0 times" not in out, out
    assert dirty() == 0 and throttle() == "100" and not journals()
    assert dm("table", "vc").strip() == table  # the original, threshold 1 carried back

    # 2. SIGTERM while paced: the drain puts the table and the throttle back itself
    fill(8)
    vm = reader()
    drain = clirun.process("drain", "vc", "--max-latency", str(BOUND_MS))
    try:
        wait_for(drain, ("copy time ",), lines := [])
        drain.send_signal(signal.SIGTERM)
        drain.communicate(timeout=120)
    finally:
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode != 0
    assert throttle() == "100" and not journals() and dm("table", "vc").strip() == table
    left = dirty()
    assert left > 0  # what was not written back yet is still safe in the cache

    # 3. SIGKILL while paced: the throttle and the cleaner table stay, journaled, until
    # --resume puts both back (and drains)
    drain = clirun.process("drain", "vc", "--max-latency", str(BOUND_MS))
    try:
        wait_for(drain, ("copy time ",), lines := [])
        drain.kill()
        drain.wait(timeout=60)
    finally:
        Path(STOP).touch()
        vm.wait(timeout=60)
    assert throttle() != "100" and len(journals()) == 2
    rc, out, err = clirun.run_process("drain", "vc", "--resume", "--stall-timeout", "300",
                                      timeout=600)
    assert rc == 0, (out, err)
    assert "cache_copy_throttle 100" in out + err, (out, err)
    assert dirty() == 0 and throttle() == "100" and not journals()
    assert dm("table", "vc").strip() == table


@pytest.mark.kernel(disks="256M", timeout=900)
def test_paced_lvmcache_drain_slows_for_a_reader_and_puts_everything_back(
        lab_disks: list[str]) -> None:
    """The same through lvm2: its cleaner policy, and the throttle beside it (lvm2 has no
    setting for it)."""
    hdd, ssd = queueing_hdd(seek_ms=5, size_mb=200), lab_disks[0]

    def lvm(*args: str) -> str:
        return runner.run(["lvm", *args], timeout=300).stdout

    lvm("pvcreate", "-y", hdd, ssd)
    lvm("vgcreate", "vg0", hdd, ssd)
    lvm("lvcreate", "-y", "-n", "vm1", "-L", "160M", "vg0", hdd)
    lvm("lvcreate", "-y", "-n", "pool", "-L", "64M", "vg0", ssd)
    lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "64k", "vg0/pool")
    lvm("lvconvert", "-y", "--type", "cache", "--cachepool", "vg0/pool", "--cachemode",
        "writeback", "vg0/vm1")
    dm("message", "vg0-vm1", "0", "migration_threshold", "1")  # hold: smq never idle
    runner.run(["fio", "--name=fill", "--filename=/dev/vg0/vm1", "--rw=randwrite", "--bs=64k",
                "--size=8M", "--direct=1", "--ioengine=libaio", "--iodepth=16",
                "--output-format=json"], timeout=300, cwd="/tmp")
    assert int(dm("status", "--noflush", "vg0-vm1").split()[13]) > 64
    Path(STOP).unlink(missing_ok=True)
    vm = subprocess.Popen(
        ["fio", "--name=vm", "--filename=/dev/vg0/vm1", "--rw=randread", "--bs=4k",
         "--offset=64M", "--size=64M", "--direct=1", "--time_based", "--runtime=600",
         "--rate_iops=50", f"--trigger-file={STOP}", "--output-format=json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, cwd="/tmp")
    time.sleep(0.5)
    drain = clirun.process("drain", "vg0/vm1", "--max-latency", str(BOUND_MS),
                           "--stall-timeout", "300")
    lines: list[str] = []
    try:
        wait_for(drain, ("(slowed ", f"> {BOUND_MS} ms", "copy time "), lines)
        assert int(throttle()) < 100
        Path(STOP).touch()
        vm.wait(timeout=60)
        out, rest = drain.communicate(timeout=600)
    finally:
        if drain.poll() is None:
            drain.kill()
        Path(STOP).touch()
    assert drain.returncode == 0, (out, "".join(lines), rest)
    assert "slowed down" in out and "slowed down 0 times" not in out, out
    assert int(dm("status", "--noflush", "vg0-vm1").split()[13]) == 0
    assert throttle() == "100"
    assert "smq" in dm("table", "vg0-vm1")
    assert not list((Path(state.state_dir()) / "dmcache-throttle").glob("*.json"))
    assert not list((Path(state.state_dir()) / "lvm-drain").glob("*.json"))
