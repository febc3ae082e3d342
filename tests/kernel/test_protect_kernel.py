"""Protect before the SSD dies (issue #31 item 6), on the lab kernel.

bcache in writeback over a dm-delay "HDD", its cache SSD a scsi_debug disk, dirty data on it
and a VM-like fio verify load running. The SSD starts failing reads (scsi_debug medium
errors, ``opts=2``) in a few sectors that hold clean cached data: bcache serves those reads
from the backing device and counts the errors. The protect pass (``cachemgr protect``, the
policy's ``[protect]`` on) sees the count rise, switches bcache0 to writethrough and drains
it; then the SSD is pulled (``device/delete``) and nothing is lost: the load saw no error,
the device reads the same bytes without its cache, and fio's verify of the data that was
dirty when the errors began passes.

Then (issue #41 item 4) protect that can be trusted: on a healthy SSD under load, smartctl
and cachemgr's own SMART probes raise the disk's ``ioerr_cnt`` and no pass acts; real
medium errors after that act; ``enabled = false`` acts on nothing and ``--clear`` puts the
admin's writeback back, which stays over passes off and on again. The issue's run probed
for 10 minutes; the test runs 25 rounds by default (about a minute on UML; 300 with
CACHEMGR_PROTECT_PROBES=300), each with every probe (smartctl by hand, cachemgr's own SMART
probe, ``status --json``) and a pass: a pass that counted the raw ``ioerr_cnt`` acted in the
first round (docs/kernel-notes.md, "What smartctl does to ioerr_cnt").

Why clean sectors: bcache fails the whole set once its error count reaches ``io_error_limit``
(8), and a read error on dirty data cannot be served from anywhere else: an SSD failing
every read of its dirty data takes the set down in about 4 s (docs/kernel-notes.md,
"Alerts on real faults"), faster than any pass. Protection works when the first errors fall
where the data is clean (what this test sets up, by finding the sectors that hold the clean
data on the SSD itself); the figures go to stdout (docs/kernel-notes.md, "Protect before
the SSD dies").
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from tests.kernel import clirun, measure, scenarios

B = "block/bcache0/bcache"
LOG = "CACHEMGR_PROTECT_LOG"  # figures appended here when set (tests/kernel/measure.py)
MARK = b"PROTECTA"
BLOCK = 4096
CLEAN_SIZE = 16 << 20  # the clean data, at the start of bcache0 (written in writethrough)
PARAMS = Path("/sys/module/scsi_debug/parameters")
FIO = ["fio", "--bs=4k", "--direct=1", "--random_distribution=zipf:1.2", "--offset=256M",
       "--size=128M", "--output-format=json"]
DIRTY = ["fio", "--name=dirty", "--filename=/dev/bcache0", "--rw=write", "--bs=64k",
         "--direct=1", "--offset=512M", "--size=32M", "--verify=crc32c",
         "--verify_state_save=0"]


def marked(off: int) -> bytes:
    return MARK + struct.pack("<Q", off) + bytes(BLOCK - len(MARK) - 8)


def write_clean(node: str) -> None:
    """CLEAN_SIZE of 4 KiB blocks, each starting with MARK and its own offset (O_DIRECT)."""
    fd = os.open(node, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 64 << 10)
    try:
        for off in range(0, CLEAN_SIZE, 64 << 10):
            buf.seek(0)
            buf.write(b"".join(marked(off + i) for i in range(0, 64 << 10, BLOCK)))
            os.pwrite(fd, buf, off)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_block(node: str, off: int) -> bytes:
    fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BLOCK)
    try:
        assert os.preadv(fd, [buf], off) == BLOCK
        return bytes(buf)
    finally:
        os.close(fd)


def clean_run_on_ssd(node: str) -> tuple[int, int, int]:
    """Where the clean data sits on the SSD: (SSD byte offset, bcache0 byte offset, blocks)
    of the longest run of consecutive SSD blocks holding consecutive marked blocks."""
    best = (0, 0, 0)
    start = prev = None
    with subprocess.Popen(["dd", f"if={node}", "bs=1M", "iflag=direct", "status=none"],
                          stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        pos = 0
        while chunk := p.stdout.read(1 << 20):
            for i in range(0, len(chunk), BLOCK):
                blk = chunk[i:i + BLOCK]
                at = pos + i
                if blk.startswith(MARK):
                    logical = struct.unpack("<Q", blk[8:16])[0]
                    if start is not None and prev is not None and logical == prev[1] + BLOCK \
                            and at == prev[0] + BLOCK:
                        prev = (at, logical)
                    else:
                        start, prev = (at, logical), (at, logical)
                    n = (prev[0] - start[0]) // BLOCK + 1
                    if n > best[2]:
                        best = (start[0], start[1], n)
                else:
                    start = prev = None
            pos += len(chunk)
    return best


def sha256_except(node: str, skip_off: int, skip_len: int) -> str:
    """sha256 of ``node`` read with O_DIRECT in 8 MiB requests, the range ``skip_off`` +
    ``skip_len`` (4 KiB aligned) read as zeros, never from the device."""
    size = int(runner.run(["blockdev", "--getsize64", node]).stdout)
    h = hashlib.sha256()
    fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 8 << 20)
    try:
        off = 0
        while off < size:
            end = min(size, off + (8 << 20))
            if off < skip_off + skip_len and skip_off < end:  # the chunk around the skip
                for at in range(off, end, BLOCK):
                    if skip_off <= at < skip_off + skip_len:
                        h.update(bytes(BLOCK))
                    else:
                        h.update(read_block(node, at))
            else:
                view = memoryview(buf)[:end - off]
                assert os.preadv(fd, [view], off) == end - off
                h.update(view)
            off = end
    finally:
        os.close(fd)
    return h.hexdigest()


def cache_errors(sysfs: Sysfs) -> int:
    snap = snapshot.take(sysfs)
    return sum(x.io_errors or 0 for c in snap.cache_sets for x in c.caches)


@pytest.mark.kernel(disks="1G", timeout=600)
def test_protect_switches_and_drains_before_the_ssd_is_pulled(lab_disks: list[str],
                                                              tmp_path: Path) -> None:
    sysfs = Sysfs()
    ssd = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)[0]
    hdd = lab_disks[0]
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 4"])
    bcache.create(sysfs, backings=["/dev/mapper/hdd"], cache=ssd.node, bucket="64k",
                  mode=CacheMode.WRITETHROUGH)
    sysfs.write(f"{B}/sequential_cutoff", "0")
    write_clean("/dev/bcache0")  # cached clean (writethrough)
    sysfs.write(f"{B}/cache_mode", "writeback")
    sysfs.write(f"{B}/writeback_running", "0")  # dirty data stays on the SSD
    runner.run([*DIRTY, "--do_verify=0"], timeout=300)
    trigger = str(tmp_path / "stop-load")
    load = scenarios.verify_load(FIO, "/dev/bcache0", trigger)
    time.sleep(5)
    b = snapshot.take(sysfs).backings[0]
    dirty_before = b.dirty_bytes
    assert dirty_before is not None and dirty_before >= 32 << 20, b.dirty

    ssd_off, logical, n = clean_run_on_ssd(ssd.node)
    assert n >= 16, (ssd_off, logical, n)
    bad_ssd, bad_logical, bad_blocks = ssd_off + 4 * BLOCK, logical + 4 * BLOCK, 8
    policy = tmp_path / "cachemgr.toml"
    policy.write_text("version = 1\n[protect]\nenabled = true\n")
    os.chmod(policy, 0o644)
    # the pass before the fault (the timer's, a minute apart): the counts' baseline
    base = clirun.in_process("protect", "--policy", str(policy))
    assert base.returncode == 0 and "none failing" in base.stdout, base.stdout + base.stderr

    # the SSD fails reads of a few sectors of clean data
    t0 = time.monotonic()
    (PARAMS / "medium_error_start").write_text(str(bad_ssd // 512))
    (PARAMS / "medium_error_count").write_text(str(bad_blocks * BLOCK // 512))
    (PARAMS / "opts").write_text("2")
    reads = 3
    for i in range(reads):  # a VM reading them: served from the backing device
        off = bad_logical + i * BLOCK
        assert read_block("/dev/bcache0", off) == marked(off)
    errors = cache_errors(sysfs)
    assert 1 <= errors < 8, errors
    dry = clirun.in_process("protect", "--dry-run", "--policy", str(policy))
    assert "dry-run  protect /dev/bcache0: mode writethrough, then drain" in dry.stdout, \
        dry.stdout
    t1 = time.monotonic()
    rc, out, err = clirun.run_process("protect", "--policy", str(policy), timeout=400)
    t_pass = time.monotonic() - t1
    assert rc == 0, out + err
    assert "done     protect /dev/bcache0" in out, out + err
    b = snapshot.take(sysfs).backings[0]
    assert b.mode == CacheMode.WRITETHROUGH and b.dirty_bytes == 0, (b.mode, b.dirty)
    check = clirun.in_process("check")
    assert check.returncode == 2 and "protected: SSD" in check.stdout, check.stdout
    job = scenarios.stop_load(load, trigger)
    assert b.cset_uuid is not None and sysfs.is_dir(f"fs/bcache/{b.cset_uuid}")

    # the whole device but the failing sectors' blocks (a read of them now counts more
    # errors, and at io_error_limit bcache fails the set: a read in flight then gets EIO)
    skip = (bad_logical, bad_blocks * BLOCK)
    before = sha256_except("/dev/bcache0", *skip)
    t2 = time.monotonic()
    scsi.remove(sysfs, ssd.name, force_in_use=True)  # the SSD pulled
    # the first reads find the SSD gone: bcache fails the set (the device is clean: it keeps
    # bcache0); a read in flight at that moment may get EIO, so probe with small reads
    eio = 0
    deadline = time.monotonic() + 60
    while sysfs.is_dir(f"fs/bcache/{b.cset_uuid}"):
        assert time.monotonic() < deadline, "the set outlived its SSD by 60 s"
        try:
            read_block("/dev/bcache0", 0)
        except OSError:
            eio += 1
        time.sleep(0.2)
    t_failed = time.monotonic() - t2
    assert sysfs.is_dir("block/bcache0")
    assert sha256_except("/dev/bcache0", *skip) == before  # now from the HDD
    for off in range(0, CLEAN_SIZE, BLOCK):  # the clean data, the failing sectors' too
        assert read_block("/dev/bcache0", off) == marked(off), off
    verify = subprocess.run([*DIRTY, "--verify_only"], capture_output=True, text=True,
                            timeout=300, check=False)
    assert verify.returncode == 0 and "verify: bad" not in verify.stdout + verify.stderr, \
        verify.stdout + verify.stderr
    for i in range(reads):
        off = bad_logical + i * BLOCK
        assert read_block("/dev/bcache0", off) == marked(off)
    measure.report(LOG, "protect", dirty_before_bytes=dirty_before, clean_run_blocks=n,
                   bad_sectors=bad_blocks * BLOCK // 512, read_errors_served=reads,
                   cache_io_errors=errors, fault_to_pass_start_s=round(t1 - t0, 1),
                   pass_s=round(t_pass, 1), load_ios=job["write"]["total_ios"],  # type: ignore[index]
                   pull_to_set_failed_s=round(t_failed, 1), probe_reads_eio=eio)


# rounds of smartctl + ssd-health --refresh + status --json + a pass (module doc); the
# issue's 10 minutes: CACHEMGR_PROTECT_PROBES=300. Such a run on 2026-11-28 (UML, a loaded
# host) failed after 286 rounds while probes were told by counter arithmetic (iodone_cnt
# less the block layer's requests in stat): ioerr_cnt rose 1144 -> 1148 within one second
# and the pass acted on the healthy SSD. A disk's errors count now only as failed requests
# the kernel logged for it (procedures/protect.py, docs/kernel-notes.md)
PROBES = int(os.environ.get("CACHEMGR_PROTECT_PROBES", "25"))


def _ioerr(sysfs: Sysfs, name: str) -> int:
    return int(sysfs.read(f"block/{name}/device/ioerr_cnt").strip(), 0)


def _mode(sysfs: Sysfs) -> CacheMode | None:
    return snapshot.take(sysfs).backings[0].mode


def _codes() -> list[str]:
    import json

    r = clirun.in_process("check", "--json")
    return [f["code"] for f in json.loads(r.stdout)["findings"]]


def _policy(path: Path, enabled: bool) -> str:
    path.write_text(f"version = 1\n[protect]\nenabled = {'true' if enabled else 'false'}\n")
    os.chmod(path, 0o644)
    return str(path)


def _passes(sysfs: Sysfs, ssd: str, policy: str, n: int, words: str) -> None:
    """``n`` passes, each after a smartctl run: each says ``words``, changes no mode."""
    for _ in range(n):
        runner.run(["smartctl", "--json", "-a", ssd], check=False, timeout=60)
        r = clirun.in_process("protect", "--policy", policy)
        assert r.returncode == 0 and words in r.stdout, r.stdout + r.stderr
        assert _mode(sysfs) == CacheMode.WRITEBACK


@pytest.mark.kernel(disks="1G", timeout=max(900, 300 + 4 * PROBES))
def test_protect_ignores_probes_acts_on_real_errors_and_can_be_undone(
        lab_disks: list[str], tmp_path: Path) -> None:
    import json

    sysfs = Sysfs()
    ssd = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)[0]
    bcache.create(sysfs, backings=[lab_disks[0]], cache=ssd.node, bucket="64k",
                  mode=CacheMode.WRITETHROUGH)
    sysfs.write(f"{B}/sequential_cutoff", "0")
    write_clean("/dev/bcache0")  # cached clean (writethrough)
    sysfs.write(f"{B}/cache_mode", "writeback")  # the admin's writeback
    on = _policy(tmp_path / "on.toml", True)
    disabled = _policy(tmp_path / "off.toml", False)
    first = clirun.in_process("protect", "--policy", on)
    assert first.returncode == 0 and "none failing" in first.stdout, first.stdout
    assert "first seen" in first.stdout, first.stdout

    # a healthy SSD under VM-like load, probed: smartctl by hand, cachemgr's own SMART
    # probe (ssd-health --refresh) and status --json, a pass after each round
    trigger = str(tmp_path / "stop-load")
    load = scenarios.verify_load(FIO, "/dev/bcache0", trigger)
    start, t0 = _ioerr(sysfs, ssd.name), time.monotonic()
    for _ in range(PROBES):
        runner.run(["smartctl", "--json", "-a", ssd.node], check=False, timeout=60)
        assert clirun.in_process("ssd-health", "--refresh").returncode in (0, 1)
        assert clirun.in_process("status", "--json").returncode == 0
        r = clirun.in_process("protect", "--policy", on)
        assert r.returncode == 0 and "none failing" in r.stdout, r.stdout + r.stderr
        assert _mode(sysfs) == CacheMode.WRITEBACK
    probed = _ioerr(sysfs, ssd.name) - start
    t_probe = time.monotonic() - t0
    job = scenarios.stop_load(load, trigger)
    # the probing did raise the count (2 a smartctl -a run, docs/kernel-notes.md); the
    # cache set's own count stayed 0: no probe reaches it
    assert probed >= 2 * 2 * PROBES, probed
    assert cache_errors(sysfs) == 0
    assert "protected" not in _codes()

    # real medium errors in clean cached data, read by a VM: the pass acts
    ssd_off, logical, n = clean_run_on_ssd(ssd.node)
    assert n >= 16, (ssd_off, logical, n)
    bad_ssd, bad_logical = ssd_off + 4 * BLOCK, logical + 4 * BLOCK
    (PARAMS / "medium_error_start").write_text(str(bad_ssd // 512))
    (PARAMS / "medium_error_count").write_text(str(8 * BLOCK // 512))
    (PARAMS / "opts").write_text("2")
    before = _ioerr(sysfs, ssd.name)
    for i in range(3):  # served from the backing device
        off = bad_logical + i * BLOCK
        assert read_block("/dev/bcache0", off) == marked(off)
    real = _ioerr(sysfs, ssd.name) - before
    (PARAMS / "opts").write_text("0")  # the SSD turns out sound: no more errors
    r = clirun.in_process("protect", "--json", "--policy", on)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    (row,) = doc["ssds"]
    assert "bcache's IO error count on the cache device rose from 0 to" in row["why"], row
    assert "the disk's ioerr_cnt rose from" in row["why"], row
    assert [(a["device"], a["result"]) for a in doc["actions"]] == [("/dev/bcache0", "done")]
    assert _mode(sysfs) == CacheMode.WRITETHROUGH
    check = clirun.in_process("check")
    assert check.returncode == 2 and "protect --clear" in check.stdout, check.stdout

    # protect off: nothing done, the CRITICAL becomes a warning naming --clear
    r = clirun.in_process("protect", "--policy", disabled)
    assert r.returncode == 0 and "protect is off" in r.stdout, r.stdout
    codes = _codes()
    assert "protect-off" in codes and "protected" not in codes, codes
    assert _mode(sysfs) == CacheMode.WRITETHROUGH  # left as the pass left it
    # --clear: the admin's writeback back, the record gone
    r = clirun.in_process("protect", "--clear", ssd.node, "--policy", disabled)
    assert r.returncode == 0 and "done     /dev/bcache0: back to writeback" in r.stdout, \
        r.stdout + r.stderr
    assert _mode(sysfs) == CacheMode.WRITEBACK
    assert not {"protect-off", "protected"} & set(_codes())
    # several passes, off and then on again, smartctl between: the writeback stays
    _passes(sysfs, ssd.node, disabled, 3, "protect is off")
    _passes(sysfs, ssd.node, on, 3, "none failing")
    measure.report(LOG, "protect-trust", probe_rounds=PROBES, probe_s=round(t_probe, 1),
                   ioerr_from_probes=probed, load_ios=job["write"]["total_ios"],  # type: ignore[index]
                   ioerr_from_reads=real, cache_io_errors=cache_errors(sysfs))
