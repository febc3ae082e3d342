"""``cachemgr doctor`` on the lab kernel (issue #45 item 2): each cause planted under a VM-like
fio load, doctor names it (exit 1) with its evidence and next command; following that
command, doctor names nothing (exit 0); and a healthy control names nothing. The figures
each cause is named from are the kernel's own counters (docs/kernel-notes.md, "Why a cache
does not help").

* bcache: a random reader (the control); a sequential reader (sequential_cutoff's bypass);
  mode none; a cache device slower than the congestion thresholds (dm-delay) but faster
  than its backing device; a writeback cache filled with dirty data past the writeback
  cutoff (writeback stopped).
* dm-cache: a random reader (the control); mode passthrough; the cleaner policy left
  behind (no promotion); with a trace, a working set four times the cache (and one that
  fits: the control). UML has no block tracing, so the trace is written with the
  recorder's own writer (procedures/trace.py), as `cachemgr trace --rate 1` would write it
  for a reader of that span.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import subprocess
import time
from typing import Any

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.bench.sampling import wait_accounting_tick
from tests.kernel.clirun import in_process as cm
from tests.kernel.scenarios import LOAD_IOPS

# bcache folds its counters every ~13.6 s: doctor's default window covers one fold
WINDOW = 15
DM_WINDOW = 5  # dm-cache's counters are live


def doctor(*args: str, window: int = WINDOW) -> tuple[int, list[dict[str, Any]], str]:
    r = cm("doctor", *args, "--window", str(window), "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)["causes"], r.stdout + r.stderr


def load(node: str, *opts: str, seconds: float) -> subprocess.Popen[bytes]:
    """A VM's IO on ``node`` for ``seconds`` (fio, direct, time based)."""
    return subprocess.Popen(
        ["fio", "--name=vm", f"--filename={node}", "--direct=1", "--time_based",
         f"--runtime={seconds:.0f}", "--output-format=terse", *opts],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def under(node: str, *opts: str, window: int = WINDOW, target: str | None = None
          ) -> tuple[int, list[dict[str, Any]], str]:
    """doctor over a window in which ``node`` has fio's ``opts`` load throughout."""
    p = load(node, *opts, seconds=window + 4)
    try:
        time.sleep(1)
        seen = counters()
        out = doctor(*([target] if target else []), window=window)
        print(f"doctor under fio {' '.join(opts)}: {out[2].strip()}; counters before "
              f"and after: {seen} {counters()}")
        return out
    finally:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        settle()


def settle() -> None:
    """bcache's counts of the load just ended folded (every ~13.6 s), so that the next
    window counts only its own load."""
    sysfs = Sysfs()
    for b in snapshot.take(sysfs).backings:
        wait_accounting_tick(sysfs, b.identity.name)


def counters() -> list[object]:
    """bcache's stats_total and dm-cache's status counters, for the test's log."""
    snap = snapshot.take(Sysfs())
    return [*(b.stats.get("total") for b in snap.backings),
            *((c.cache_available_percent, c.congested) for c in snap.cache_sets),
            *(b.dirty for b in snap.backings),
            *(d.status and d.status.read_misses for d in snap.dmcaches)]


def follow(cause: dict[str, Any]) -> None:
    """Run the cause's next command as an admin would."""
    nxt = cause["next"]
    if nxt.startswith("cachemgr "):
        r = cm(*shlex.split(nxt)[1:], "--yes") if " mode " in f" {nxt} " else \
            cm(*shlex.split(nxt)[1:])
        assert r.returncode in (0, 4), (nxt, r.stdout + r.stderr)
        print(f"followed {nxt}: exit {r.returncode}: {r.stdout}{r.stderr}")
    else:
        subprocess.run(["sh", "-c", nxt], check=True, timeout=60)


RANDREAD = ("--rw=randread", "--bs=4k", "--size=64M", "--random_distribution=zipf:1.2",
            f"--rate_iops={LOAD_IOPS}")


def make_bcache(backing: str, ssd: str) -> tuple[Sysfs, str, str]:
    """/dev/bcache0 (writethrough) over ``backing`` with ``ssd``: (sysfs, its backing
    device's kernel name, its cache set UUID)."""
    sysfs = Sysfs()
    bcache.make_bcache(backing=[backing], cache=ssd, bucket="128k")
    for d in (backing, ssd):
        bcache.register(sysfs, d)
    assert bcache.wait_for(lambda: sysfs.exists("block/bcache0/bcache/cache"), 10)
    b = snapshot.take(sysfs).backings[0]
    assert b.cset_uuid is not None
    return sysfs, b.identity.name, b.cset_uuid


@pytest.mark.kernel(disks="1G,256M", timeout=500)
def test_doctor_bcache_control_sequential_and_mode_none(lab_disks: list[str]) -> None:
    backing, ssd = lab_disks
    sysfs, _, cset = make_bcache(backing, ssd)
    dev = "/dev/bcache0"
    # one cause at a time: under host load the lab's file-backed SSD is slower than the
    # congestion thresholds (lab, load 16: 3.5 ms a read, the backing file 2.2 ms), and
    # bcache bypasses it for that (docs/kernel-notes.md, "Why a cache does not help")
    for t in ("congested_read_threshold_us", "congested_write_threshold_us"):
        sysfs.write(f"fs/bcache/{cset}/{t}", "0")

    rc, causes, text = under(dev, *RANDREAD)  # the control: a random reader
    assert (rc, causes) == (0, []), text

    # a sequential reader: bypassed past sequential_cutoff (4 MiB)
    seq = ("--rw=read", "--bs=128k", "--size=512M", "--rate_iops=100")
    rc, causes, text = under(dev, *seq)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"]) == ("sequential-bypass", dev), text
    assert c["evidence"]["bypassed_share"] >= 0.5 and c["evidence"]["sequential_cutoff"] \
        == 4 << 20, c
    assert c["next"] == f"cachemgr tune {dev} sequential_cutoff=0"
    follow(c)
    rc, causes, text = under(dev, *seq)
    assert (rc, causes) == (0, []), text

    # mode none left behind
    r = cm("mode", dev, "none", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    rc, causes, text = under(dev, *RANDREAD, target=dev)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"], c["evidence"]["mode"]) == ("mode-left", dev, "none"), c
    assert c["next"] == f"cachemgr mode {dev} writethrough"
    follow(c)
    rc, causes, text = under(dev, *RANDREAD)
    assert (rc, causes) == (0, []), text


def delayed(disk: str, name: str, read_ms: int) -> str:
    """A dm-delay device over ``disk`` whose reads take ``read_ms`` more; its node."""
    sectors = runner.run(["blockdev", "--getsz", disk]).stdout.strip()
    runner.run(["dmsetup", "create", name, "--table",
                f"0 {sectors} delay {disk} 0 {read_ms} {disk} 0 0"])
    kname = runner.run(["dmsetup", "info", "-c", "--noheadings", "-o", "blkdevname",
                        name]).stdout.strip()
    return f"/dev/{kname}"


@pytest.mark.kernel(disks="1G,256M", timeout=400)
def test_doctor_bcache_congestion(lab_disks: list[str]) -> None:
    """The cache device's reads take 3 ms more (over bcache's 2 ms read threshold), the
    backing device's 30 ms: bcache bypasses the cache, and the fix is the thresholds. (UML
    runs at HZ=100: dm-delay's timer rounds each delay up to a 10 ms tick.)"""
    hdd = delayed(lab_disks[0], "hdd", 30)
    slow_ssd = delayed(lab_disks[1], "ssd", 3)
    _, _, cset = make_bcache(hdd, slow_ssd)
    dev = "/dev/bcache0"
    # the hot set written once (writethrough caches writes; writes are not delayed)
    runner.run(["fio", "--name=fill", f"--filename={dev}", "--direct=1", "--rw=randwrite",
                "--bs=4k", "--size=16M", "--output-format=terse"], timeout=120)
    hot = ("--rw=randread", "--bs=4k", "--size=16M", f"--rate_iops={LOAD_IOPS}")
    rc, causes, text = under(dev, *hot)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"]) == ("congestion-bypass", dev), text
    ev = c["evidence"]
    assert ev["cache_read_us"] > ev["congested_read_threshold_us"] == 2000, ev
    # the backing device, when read in the window at all (the hot set is cached), is slower
    assert ev.get("backing_read_us", ev["cache_read_us"] + 1) > ev["cache_read_us"], ev
    assert c["next"] == (f"cachemgr tune {cset} congested_read_threshold_us=0 "
                         "congested_write_threshold_us=0")
    follow(c)
    rc, causes, text = under(dev, *hot)
    assert (rc, causes) == (0, []), text


@pytest.mark.kernel(disks="1G,256M", timeout=400)
def test_doctor_bcache_full_of_dirty_data(lab_disks: list[str]) -> None:
    """Writeback stopped, random writes until more than 70 % of the set's buckets are in
    use: bcache then sends every write to the backing device."""
    backing, ssd = lab_disks
    sysfs, name, cset = make_bcache(backing, ssd)
    dev = "/dev/bcache0"
    rel = bcache.backing_rel(sysfs, name)
    sysfs.write(f"{rel}/cache_mode", "writeback")
    sysfs.write(f"{rel}/writeback_running", "0")
    fill = load(dev, "--rw=randwrite", "--bs=4k", "--size=900M", seconds=120)
    try:
        assert bcache.wait_for(lambda: int(sysfs.read(
            f"fs/bcache/{cset}/cache_available_percent")) < 30, 110)
    finally:
        fill.terminate()
        fill.wait(timeout=30)
    writes = ("--rw=randwrite", "--bs=4k", "--size=900M", f"--rate_iops={LOAD_IOPS}")
    rc, causes, text = under(dev, *writes)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"]) == ("dirty-full", dev), text
    ev = c["evidence"]
    assert ev["in_use_percent"] >= 65 and ev["writeback_running"] is False, ev
    # writeback stopped, every write of the backing device is one bcache sent around the
    # cache (at the cutoff's edge, not all of them: bypassed writes replace dirty data and
    # free buckets; lab, 216 of 375 a second)
    assert ev["writes_per_s"] >= ev["backing_writes_per_s"] > 0.2 * ev["writes_per_s"], ev
    assert c["next"] == f"cachemgr drain {dev}"
    follow(c)
    rc, causes, text = doctor(window=WINDOW)
    assert (rc, causes) == (0, []), text


def dm_status(name: str = "vc") -> list[str]:
    return runner.run(["dmsetup", "status", name]).stdout.split()


@pytest.mark.kernel(disks="512M,64M,16M", timeout=400)
def test_doctor_dmcache_control_passthrough_and_cleaner(lab_disks: list[str]) -> None:
    origin, ssd, meta = lab_disks
    r = cm("create", "dm-cache", "vc", "--origin", origin, "--cache", ssd, "--metadata", meta,
           "--mode", "writethrough", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    dev = "/dev/mapper/vc"
    rand = ("--rw=randread", "--bs=4k", "--size=32M", f"--rate_iops={LOAD_IOPS}")

    rc, causes, text = under(dev, *rand, window=DM_WINDOW)  # the control
    assert (rc, causes) == (0, []), text

    r = cm("mode", dev, "passthrough", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    rc, causes, text = under(dev, *rand, window=DM_WINDOW)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"], c["evidence"]["mode"]) == ("mode-left", dev,
                                                               "passthrough"), c
    follow(c)
    rc, causes, text = under(dev, *rand, window=DM_WINDOW)
    assert (rc, causes) == (0, []), text

    # the cleaner policy left behind (a flush that did not finish): reads of blocks not in
    # the cache promote nothing
    table = runner.run(["dmsetup", "table", "vc"]).stdout.split()
    i = table.index("smq")
    runner.run(["dmsetup", "suspend", "vc"])
    runner.run(["dmsetup", "reload", "vc", "--table", " ".join([*table[:i], "cleaner", "0"])])
    runner.run(["dmsetup", "resume", "vc"])
    far = ("--rw=randread", "--bs=4k", "--size=32M", "--offset=256M",
           f"--rate_iops={LOAD_IOPS}")
    promotions = int(dm_status()[12])
    rc, causes, text = under(dev, *far, window=DM_WINDOW)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"], c["evidence"]["policy"]) == ("smq-not-promoting", dev,
                                                                 "cleaner"), c
    assert c["evidence"]["read_misses"] >= 64 and c["evidence"]["promotions"] == 0, c
    assert int(dm_status()[12]) == promotions
    follow(c)
    assert "smq" in runner.run(["dmsetup", "table", "vc"]).stdout.split()
    rc, causes, text = under(dev, *far, window=DM_WINDOW)
    assert (rc, causes) == (0, []), text


def write_trace(node: str, path: str, span: int, n: int, seed: int = 45) -> None:
    """A rate-1 trace of ``n`` random 4 KiB reads of ``node``'s first ``span`` bytes."""
    from cachemgr.procedures import trace as tr

    (dev, _), = tr.resolve(Sysfs(), [node])
    w = tr.Writer(path, tr.Header(block=4096, rate=1.0, devices=[dev], started=time.time()))
    rnd = random.Random(seed)
    t = 0.0
    for _ in range(n):
        w.add(t, rnd.randrange(span // 4096) * 4096, 4096, 0, 0)
        t += 0.0025
    w.close({"seconds": t, "ended_by": "time"})


@pytest.mark.kernel(disks="512M,64M,16M", timeout=400)
def test_doctor_dmcache_working_set(lab_disks: list[str], tmp_path: Any) -> None:
    origin, ssd, meta = lab_disks
    r = cm("create", "dm-cache", "vc", "--origin", origin, "--cache", ssd, "--metadata", meta,
           "--mode", "writethrough", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    dev = "/dev/mapper/vc"
    st = dm_status()  # start, length, "cache", md block, md used/total, block, used/total
    cache = int(st[6].split("/")[1]) * int(st[5]) * 512
    small, large = str(tmp_path / "small.trace"), str(tmp_path / "large.trace")
    write_trace(dev, small, 32 << 20, 20_000)  # half the cache
    write_trace(dev, large, 256 << 20, 20_000)  # four times the cache

    def reads(span: int) -> tuple[str, ...]:
        return ("--rw=randread", "--bs=4k", f"--size={span}", f"--rate_iops={LOAD_IOPS}")

    r = cm("doctor", dev, "--trace", small, "--window", str(DM_WINDOW), "--json")
    assert (r.returncode, json.loads(r.stdout)["causes"]) == (0, []), r.stdout + r.stderr
    p = load(dev, *reads(256 << 20), seconds=DM_WINDOW + 4)
    try:
        time.sleep(1)
        r = cm("doctor", dev, "--trace", large, "--window", str(DM_WINDOW), "--json")
    finally:
        p.communicate(timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    (c,) = json.loads(r.stdout)["causes"]
    ev = c["evidence"]
    assert (c["code"], c["device"], ev["cache_bytes"]) == ("working-set", dev, cache), c
    assert ev["best_read_hit_ratio"] - ev["trace_read_hit_ratio"] >= 0.1, ev
    # the size that would do: about the span read (256 MiB), not the cache's 64 MiB
    assert 192 << 20 <= ev["size_that_would_do"] <= 288 << 20, ev
    # what the kernel counted in the window is no better than the curve says
    assert ev["observed_read_hit_ratio"] <= ev["trace_read_hit_ratio"] + 0.15, ev
    print(f"working set: {c['what']}")
    # a trace of the origin is one of the same blocks (taken, as warm takes it); a trace of
    # another device (here the cache device) is refused, exit 2
    write_trace(origin, str(tmp_path / "origin.trace"), 256 << 20, 20_000)
    r = cm("doctor", dev, "--trace", str(tmp_path / "origin.trace"), "--window", "1",
           "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert [c["code"] for c in json.loads(r.stdout)["causes"]] == ["working-set"], r.stdout
    write_trace(ssd, str(tmp_path / "ssd.trace"), 32 << 20, 100)
    r = cm("doctor", dev, "--trace", str(tmp_path / "ssd.trace"), "--window", "1")
    assert r.returncode == 2 and "the trace is of another device" in r.stderr, r.stderr


def unclean_writethrough(lab_disks: list[str]) -> str:
    """A write-through dm-cache "vc2" started on a copy of a live one's metadata (what a crash
    leaves: not closed cleanly), ``migration_threshold`` 1 in its table; its node."""
    origin, ssd, meta, meta2 = lab_disks
    r = cm("create", "dm-cache", "vc", "--origin", origin, "--cache", ssd, "--metadata", meta,
           "--mode", "writethrough", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    runner.run(["fio", "--name=r", "--filename=/dev/mapper/vc", "--direct=1",
                "--rw=randread", "--bs=4k", "--size=32M", "--runtime=6", "--time_based",
                f"--rate_iops={LOAD_IOPS}", "--output-format=terse"], timeout=120)
    used = dm_status("vc")[6]
    assert not used.startswith("0/"), used
    time.sleep(2)  # dm-cache commits its metadata every second
    table = runner.run(["dmsetup", "table", "vc"]).stdout.split()
    runner.run(["dd", f"if={meta}", f"of={meta2}", "bs=1M", "iflag=direct", "oflag=direct",
                "status=none"], timeout=120)
    r = cm("remove", "/dev/mapper/vc", "--keep-device", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    st = os.stat(meta2)
    i = table.index("smq")
    table = [*table[:3], f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}", *table[4:i],
             "smq", "2", "migration_threshold", "1"]
    runner.run(["dmsetup", "create", "vc2", "--table", " ".join(table)])
    f = dm_status("vc2")
    assert "writethrough" in f and int(f[13]) > 0, " ".join(f)  # dirty in writethrough
    return "/dev/mapper/vc2"


def digest(node: str) -> str:
    """sha256 of the first 32 MiB read through ``node`` (direct IO)."""
    return hashlib.sha256(subprocess.run(
        ["dd", f"if={node}", "bs=1M", "count=32", "iflag=direct", "status=none"],
        check=True, capture_output=True, timeout=120).stdout).hexdigest()


@pytest.mark.kernel(disks="512M,64M,16M,16M", timeout=400)
def test_doctor_dmcache_writethrough_dirty_after_an_unclean_shutdown(
        lab_disks: list[str]) -> None:
    """An unclean shutdown, made here by copying the metadata device of a live write-through
    dm-cache (its superblock not marked clean) and starting a device on the copy: dm-cache
    loads every cached block as dirty. smq writes them back in seconds at this size (lab:
    259 blocks, gone within 3 s of reads); migration_threshold 1 in the table holds them,
    as a cache of millions of blocks would for hours, and still holds them after the drain
    (the flush puts the live value back): a block dirty after it stays so.

    The drain doctor names ends clean for real: 0 dirty blocks read at once after it, after
    a further reload of the same table, and after the device is removed and created again
    (what a clean reboot does). A plain reload at the flush's end marked them all dirty
    again (the metadata object is kept, with the clean-shutdown flag of its first open)."""
    dev = unclean_writethrough(lab_disks)
    rand = ("--rw=randread", "--bs=4k", "--size=32M", f"--rate_iops={LOAD_IOPS}")
    rc, causes, text = under(dev, *rand, window=DM_WINDOW)
    assert rc == 1, text
    (c,) = causes
    assert (c["code"], c["device"]) == ("writethrough-dirty", dev), c
    assert c["evidence"]["dirty_blocks"] == int(dm_status("vc2")[13]) > 0, c
    assert c["next"] == f"cachemgr drain {dev}"
    print(f"writethrough dirty: {c['what']}")
    table = runner.run(["dmsetup", "table", "vc2"]).stdout.strip()
    before = digest(dev)
    follow(c)  # the flush writes every dirty block back (lab: 2.7 s) and reports clean
    after = " ".join(dm_status("vc2"))
    print(f"status right after the drain: {after}")
    assert int(dm_status("vc2")[13]) == 0, after
    # the same table, on the same metadata device; no stand-in left behind
    assert runner.run(["dmsetup", "table", "vc2"]).stdout.strip() == table
    assert not [x for x in runner.run(["dmsetup", "ls"]).stdout.split()
                if x.startswith("cachemgr-md-")]
    # any reload of the same table keeps it clean now
    runner.run(["dmsetup", "suspend", "vc2"])
    runner.run(["dmsetup", "reload", "vc2", "--table", table])
    runner.run(["dmsetup", "resume", "vc2"])
    again = int(dm_status("vc2")[13])
    print(f"dirty blocks after a reload of the drained device: {again}")
    assert again == 0
    # closed cleanly and opened again (a clean reboot): clean, every byte as it was
    runner.run(["dmsetup", "remove", "vc2"])
    runner.run(["dmsetup", "create", "vc2", "--table", table])
    assert int(dm_status("vc2")[13]) == 0, " ".join(dm_status("vc2"))
    assert digest(dev) == before
    runner.run(["dmsetup", "message", "vc2", "0", "migration_threshold", "2048"])
    rc, causes, text = under(dev, *rand, window=DM_WINDOW)
    assert (rc, causes) == (0, []), text


@pytest.mark.kernel(disks="512M,64M,16M,16M", timeout=400)
def test_mode_passthrough_drain_of_metadata_opened_unclean(lab_disks: list[str]) -> None:
    """``mode passthrough --drain`` on a write-through device started after an unclean
    shutdown (every cached block loaded dirty), a VM writing to it throughout with fio's
    verify headers: the flush writes them back and the device ends in passthrough with 0
    dirty blocks (a plain closing reload marks them all dirty again, and dm-cache refuses
    passthrough over dirty blocks at resume); every block written reads back."""
    dev = unclean_writethrough(lab_disks)
    assert int(dm_status("vc2")[13]) > 0
    w = ["fio", "--name=vm", f"--filename={dev}", "--direct=1", "--rw=randwrite", "--bs=4k",
         "--offset=64M", "--size=32M", "--verify=crc32c", "--verify_state_save=0",
         "--output-format=terse"]
    p = subprocess.Popen([*w, "--time_based", "--runtime=8", "--do_verify=0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1)
        r = cm("mode", dev, "passthrough", "--drain", "--yes")
    finally:
        _, err = p.communicate(timeout=120)
    print(f"mode passthrough --drain: exit {r.returncode}: {r.stdout}{r.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert p.returncode == 0, err
    st = dm_status("vc2")
    assert "passthrough" in st and int(st[13]) == 0, " ".join(st)
    assert not [x for x in runner.run(["dmsetup", "ls"]).stdout.split()
                if x.startswith("cachemgr-md-")]
    v = subprocess.run([*w, "--verify_only", "--time_based", "--runtime=8"],
                       capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stdout + v.stderr
