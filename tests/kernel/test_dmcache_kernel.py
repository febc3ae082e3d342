"""dm-cache on the lab kernel: create, status, mode switches, flush under load, remove with
the data checked on the origin, refusals. Each test builds a dm-cache device over a dm-delay
"HDD" (the first disk), the second disk as the cache and the third as metadata.

Every value asserted is cross-checked against ``dmsetup`` itself, parsed here by position
independently of cachemgr (``0 <len> cache <md bs> <md> <bs> <used>/<total> <rh> <rm> <wh>
<wm> <demotions> <promotions> <dirty> ...``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import runner, state
from cachemgr.core.sysfs import Sysfs
from tests.kernel import clirun, scenarios
from tests.kernel.scenarios import sha256, stop_load

DISKS = "512M,128M,16M"
HOLD = "1"  # a migration_threshold below one block: smq never sees "idle", never writes back


cm = clirun.process  # the CLI as its own process (killed, or run alongside the test)
run_cm = clirun.run_process


def dm(*args: str) -> str:
    return runner.run(["dmsetup", *args], timeout=60).stdout


def table(name: str = "vc") -> str:
    return dm("table", name).strip()


def fields(name: str = "vc") -> list[str]:
    return dm("status", name).split()


def dirty(name: str = "vc") -> int:
    return int(fields(name)[13])


def tail(name: str = "vc") -> dict[str, object]:
    """The status after the 11 numbers, walked by its counts: features, core args, policy."""
    f = fields(name)
    i = 14
    nf = int(f[i])
    features = f[i + 1:i + 1 + nf]
    i += 1 + nf
    nc = int(f[i])
    core = dict(zip(f[i + 1:i + 1 + nc:2], f[i + 2:i + 1 + nc:2], strict=True))
    i += 1 + nc
    return {"features": features, "core": core, "policy": f[i], "rest": f[i + 1:]}


def hold_writeback(name: str = "vc", value: str = HOLD) -> None:
    dm("message", name, "0", "migration_threshold", value)
    # promotions already queued still finish: wait until used and dirty stand still
    last: list[str] = []
    for _ in range(50):
        cur = fields(name)[6:14]
        if cur == last:
            return
        last = cur
        time.sleep(0.3)


def suspended(name: str = "vc") -> bool:
    return "SUSPENDED" in dm("info", name)


def journals() -> list[Path]:
    return list((Path(state.state_dir()) / "dmcache-flush").glob("*.json"))


def make(lab_disks: list[str], *, delay_ms: int = 5, mode: str = "writeback",
         name: str = "vc") -> None:
    """A dm-delay 'HDD' over the first disk, and cachemgr's own create over it."""
    hdd, ssd, meta = lab_disks
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    dm("create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 {delay_ms}")
    rc, out, err = run_cm("create", "dm-cache", name, "--origin", "/dev/mapper/hdd",
                          "--cache", ssd, "--metadata", meta, "--mode", mode)
    assert rc == 0, err
    assert f"/dev/mapper/{name}: create" in out


FIO = ["fio", "--bs=4k", "--direct=1", "--random_distribution=zipf:1.2", "--size=256M",
       "--output-format=json"]


def fill(node: str = "/dev/mapper/vc", io_size: str = "16M", *extra: str) -> None:
    runner.run([*FIO, "--name=fill", f"--filename={node}", "--rw=randwrite",
                f"--io_size={io_size}", *extra], timeout=300, cwd="/tmp")


def start_load(trigger: str, node: str = "/dev/mapper/vc",
               rw: str = "randwrite") -> subprocess.Popen[str]:
    """VM-like load until ``trigger`` appears: QD1 Zipf writes, verified as they go."""
    return scenarios.verify_load(FIO, node, trigger, rw)


def status_json(name: str = "vc") -> dict[str, object]:
    rc, out, err = run_cm("status", "--json")
    assert rc == 0, err
    devs = [d for d in json.loads(out)["devices"] if d.get("name") == name]
    assert len(devs) == 1, out
    return devs[0]


@pytest.mark.kernel(disks=DISKS)
def test_create_status_tune_and_create_refusals(lab_disks: list[str]) -> None:
    make(lab_disks)
    hdd, ssd, meta = lab_disks
    t = table().split()
    # 0 <len> cache <meta> <cache> <origin> <block> 1 writeback smq 0; 64 KiB default block
    assert t[2] == "cache" and t[6] == "128" and t[7:] == ["1", "writeback", "smq", "0"]
    fill()
    hold_writeback()
    # suspended, nothing moves (no IO, no migration): cachemgr and dmsetup must agree
    # exactly. In process: `cachemgr status` also probes unclaimed devices for bcache
    # superblocks, and a read of a suspended device blocks until it is resumed.
    dm("suspend", "vc")
    try:
        f = fields()
        (j,) = [d for d in snapshot.to_json(snapshot.take(Sysfs()))["devices"]
                if d.get("name") == "vc"]
        assert fields() == f
    finally:
        dm("resume", "vc")
    assert f[2] == "cache" and f[3] != "Fail"
    used, total = (int(x) for x in f[6].split("/"))
    assert total == (128 << 20) // (128 * 512)
    assert 0 < int(f[13]) <= used
    assert j["kind"] == "dm-cache" and j["device"] == "/dev/mapper/vc"
    assert j["mode"] == "writeback" and j["state"] == "dirty" and j["policy"] == "smq"
    assert j["dirty_blocks"] == int(f[13]) and j["used_blocks"] == used
    assert j["total_blocks"] == total and j["dirty_bytes"] == int(f[13]) * 128 * 512
    assert j["write_hits"] == int(f[9]) and j["write_misses"] == int(f[10])
    assert j["promotions"] == int(f[12]) and j["read_hits"] == int(f[7])
    assert j["cache"] == ssd and j["metadata"] == meta and j["backing"] == "/dev/mapper/hdd"
    assert j["migration_threshold"] == int(HOLD) and j["open_count"] == 0
    assert j["suspended"] is True
    assert status_json()["dirty_blocks"] == dirty()  # the CLI, once resumed
    rc, out, _ = run_cm("status")
    assert rc == 0 and "vc " in out and "writeback" in out

    # migration_threshold: set, read back by dmsetup, already so, below one block refused
    rc, out, err = run_cm("tune", "vc", "migration_threshold=4096")
    assert rc == 0, err
    assert tail()["core"] == {"migration_threshold": "4096"}
    assert run_cm("tune", "vc", "migration_threshold=4096")[0] == 4
    rc, _, err = run_cm("tune", "vc", "migration_threshold=64")
    assert rc == 2 and "at least one cache block" in err
    assert tail()["core"] == {"migration_threshold": "4096"}

    # create refusals: already so (4); devices in use (3); nothing changed
    before = dm("table")
    rc, _, err = run_cm("create", "dm-cache", "vc", "--origin", "/dev/mapper/hdd",
                        "--cache", ssd, "--metadata", meta)
    assert rc == 4, err
    rc, _, err = run_cm("create", "dm-cache", "vc2", "--origin", "/dev/mapper/hdd",
                        "--cache", ssd, "--metadata", meta)
    assert rc == 3 and "busy: it is in use by dm-1 (/dev/mapper/vc)" in err, err
    rc, _, err = run_cm("create", "dm-cache", "vc2", "--origin", hdd, "--cache", ssd,
                        "--metadata", ssd)
    assert rc == 2 and "three different devices" in err
    assert dm("table") == before


@pytest.mark.kernel(disks=DISKS)
def test_mode_switches_under_load_and_passthrough_refusal(lab_disks: list[str]) -> None:
    make(lab_disks)
    fill()
    hold_writeback()
    n = dirty()
    assert n > 0
    before = table()
    # passthrough while dirty: the kernel would refuse at resume and leave the device
    # suspended; cachemgr refuses first (exit 3) and changes nothing
    rc, out, err = run_cm("mode", "/dev/mapper/vc", "passthrough")
    assert rc == 3, err
    assert f"{n} dirty blocks" in err and "passthrough --drain" in err and out == ""
    assert table() == before and dirty() == n and not suspended()
    hold_writeback(value="2048")

    hits = int(fields()[7]) + int(fields()[9])
    load = start_load("/run/stop-load", rw="randrw")
    try:
        time.sleep(1)
        rc, _, err = run_cm("mode", "vc", "writethrough")
        assert rc == 0, err
        assert table().split()[7:9] == ["1", "writethrough"]
        assert "writethrough" in tail()["features"]  # type: ignore[operator]
        rc, _, err = run_cm("mode", "/dev/dm-1", "writeback")
        assert rc == 0, err
        assert run_cm("mode", "vc", "writeback")[0] == 4
        time.sleep(1)
        assert dirty() > 0  # writes under load dirty blocks again
        t0 = time.monotonic()
        rc, out, err = run_cm("mode", "vc", "passthrough", "--drain", "--json", "--yes")
        took = time.monotonic() - t0
        assert rc == 0, err
        assert json.loads(out)["changes"][0]["after"] == "passthrough"
        assert table().split()[7:11] == ["1", "passthrough", "smq", "0"], table()
        assert dirty() == 0 and not suspended()
        print(f"passthrough --drain under load: {took:.1f} s")
        rc, _, err = run_cm("mode", "vc", "writeback")
        assert rc == 0, err
    finally:
        job = stop_load(load, "/run/stop-load")
    assert table() == before
    # idle, smq writes the dirty blocks back by itself (after a second); then passthrough
    # without --drain is accepted (cachemgr goes writeback -> writethrough -> passthrough)
    deadline = time.monotonic() + 30
    while dirty() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert dirty() == 0
    rc, _, err = run_cm("mode", "vc", "passthrough", "--yes")
    assert rc == 0, err
    assert table().split()[7:9] == ["1", "passthrough"] and not suspended()
    assert run_cm("mode", "vc", "writeback")[0] == 0
    assert table() == before
    # suspend -> load -> resume keeps the kernel's hit counters across every switch
    assert int(fields()[7]) + int(fields()[9]) >= hits
    assert int(job["write"]["total_ios"]) > 0  # type: ignore[index]


@pytest.mark.kernel(disks=DISKS)
def test_flush_under_continuous_writes(lab_disks: list[str]) -> None:
    make(lab_disks)
    assert run_cm("tune", "vc", "migration_threshold=4096")[0] == 0
    fill()
    before = table()
    load = start_load("/run/stop-load")
    try:
        time.sleep(2)
        under_load = dirty()
        assert under_load > 0  # smq writes back only after a second of idleness
        t0 = time.monotonic()
        rc, out, err = run_cm("drain", "/dev/mapper/vc", "--json", "--stall-timeout", "60")
        took = time.monotonic() - t0
        assert rc == 0, err
        res = json.loads(out)
        assert res["drained_bytes"] > 0
        # clean only as the status read after the last table change says: back in
        # writeback under these writes, blocks are dirty again at once (counted)
        after = res.get("dirty_blocks_after", 0)
        assert res["clean"] is (after == 0), res
        assert res["restored"] == {"mode": "writeback", "policy": "smq"}
        print(f"flush under load: {under_load} dirty blocks, {res['drained_bytes']} bytes, "
              f"{res['seconds']} s (wall {took:.1f} s); {after} dirty after the switch back")
        # the original table is back, with the tuned migration_threshold carried over
        t = table().split()
        assert t[:7] == before.split()[:7] and t[7:11] == ["1", "writeback", "smq", "2"]
        assert t[11:] == ["migration_threshold", "4096"]
        tl = tail()
        assert "writeback" in tl["features"]  # type: ignore[operator]
        assert tl["core"] == {"migration_threshold": "4096"} and tl["policy"] == "smq"
        assert tl["rest"] == ["0", "rw", "-"] and not suspended()
        assert journals() == []
    finally:
        stop_load(load, "/run/stop-load")


@pytest.mark.kernel(disks=DISKS)
def test_flush_interrupted_restores_table(lab_disks: list[str]) -> None:
    make(lab_disks)
    hdd = lab_disks[0]
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    fill()
    hold_writeback()
    before = table()
    n = dirty()
    # the origin's writes take 2 s each from now on: the flush cannot finish quickly
    dm("suspend", "hdd")
    dm("load", "hdd", "--table", f"0 {sectors} delay {hdd} 0 0 {hdd} 0 2000")
    dm("resume", "hdd")

    def started(p: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 30
        while "cleaner" not in table():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)

    # Ctrl-C: the original table comes back, the device is not left suspended
    p = cm("drain", "vc")
    started(p)
    assert table().split()[7:10] == ["1", "writethrough", "cleaner"]
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    # the original table, with the live migration_threshold carried into it
    before = f"{before.removesuffix(' 0')} 2 migration_threshold {HOLD}"
    assert table() == before and not suspended()
    assert 0 < dirty() <= n  # what was not written back yet is still safe in the cache
    assert journals() == []

    # killed outright: the flush table stays, the journal knows the original
    p = cm("drain", "vc")
    started(p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert "cleaner" in table() and len(journals()) == 1
    assert json.loads(journals()[0].read_text())["original"] == before
    dm("suspend", "hdd")
    dm("load", "hdd", "--table", f"0 {sectors} delay {hdd} 0 5")
    dm("resume", "hdd")
    rc, _, err = run_cm("drain", "vc", "--resume")
    assert rc == 0, err  # restored, then flushed (or found clean: the cleaner ran on)
    assert "restored table" in err
    assert table() == before and not suspended() and journals() == []
    assert dirty() == 0


@pytest.mark.kernel(disks="256M,64M,16M")  # smaller: every byte is read four times
def test_remove_leaves_every_byte_on_the_origin(lab_disks: list[str]) -> None:
    make(lab_disks, delay_ms=2)
    raw, ssd, meta = lab_disks  # /dev/mapper/hdd is "delay raw 0 2": the same bytes
    verify = ["--verify=crc32c", "--randseed=4242"]
    fill("/dev/mapper/vc", "24M", *verify, "--do_verify=0")
    hold_writeback()
    assert dirty() > 0
    # the dirty blocks are only in the cache so far: the origin itself differs. The origin
    # first: a whole-device read through the cache promotes blocks, and making room for them
    # writes dirty blocks back (seen on 6.1).
    origin_before = sha256(raw)
    through_cache = sha256("/dev/mapper/vc")
    assert origin_before != through_cache
    t0 = time.monotonic()
    rc, out, err = run_cm("remove", "vc", "--yes")
    assert rc == 0, err
    print(f"remove: {time.monotonic() - t0:.1f} s\n{out}")
    assert "vc: table cache -> linear" in out and "vc: removed (was linear)" in out
    assert not os.path.exists("/dev/mapper/vc") and "vc" not in dm("ls")
    assert sha256(raw) == through_cache
    # and fio's own check of every block it wrote, on the origin's disk
    runner.run([*FIO, "--name=fill", f"--filename={raw}", "--rw=randwrite",
                "--io_size=24M", *verify, "--verify_only", "--verify_fatal=1"],
               timeout=300, cwd="/tmp")
    # the metadata device still holds the old cache's superblock: a new cache on it is
    # refused (it could be another cache's dirty metadata) unless --force
    rc, _, err = run_cm("create", "dm-cache", "vc", "--origin", "/dev/mapper/hdd",
                        "--cache", ssd, "--metadata", meta)
    assert rc == 3 and "holds dm-cache metadata" in err
    rc, _, err = run_cm("create", "dm-cache", "vc", "--origin", "/dev/mapper/hdd",
                        "--cache", ssd, "--metadata", meta, "--force", "--yes")
    assert rc == 0, err
    assert fields()[6].startswith("0/")  # fresh metadata: no stale mappings
    assert sha256("/dev/mapper/vc") == through_cache


@pytest.mark.kernel(disks="256M,64M,16M")
def test_remove_refused_in_use_then_keep_device(lab_disks: list[str]) -> None:
    make(lab_disks, delay_ms=1)
    fill()
    hold_writeback()
    before = table()
    fd = os.open("/dev/mapper/vc", os.O_RDONLY)  # a VM holding its disk open
    try:
        rc, out, err = run_cm("remove", "vc")
        assert rc == 3 and "in use" in err and "--keep-device" in err, err
        assert out == "" and table() == before and dirty() > 0
        through_cache = sha256("/dev/mapper/vc")
        rc, out, err = run_cm("remove", "vc", "--keep-device", "--yes")
        assert rc == 0, err
        origin = dm("info", "-c", "--noheadings", "-o", "major,minor", "hdd").split(":")
        assert table().split() == ["0", before.split()[1], "linear",
                                   f"{origin[0].strip()}:{origin[1].strip()}", "0"]
        # the holder keeps reading, now straight from the origin, the same bytes
        with open("/dev/mapper/hdd", "rb") as f:
            assert os.pread(fd, 1 << 20, 0) == f.read(1 << 20)
        assert sha256("/dev/mapper/vc") == through_cache == sha256("/dev/mapper/hdd")
    finally:
        os.close(fd)


@pytest.mark.kernel(disks=DISKS)
def test_lvm_owned_device_is_shown_and_every_change_refused(lab_disks: list[str]) -> None:
    hdd, ssd, meta = lab_disks
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dd", "if=/dev/zero", f"of={meta}", "bs=4k", "count=1", "oflag=direct"])
    uuid = "LVM-" + "a" * 32 + "b" * 32
    dm("create", "--uuid", uuid, "vg0-lv0", "--table",
       f"0 {sectors} cache {meta} {ssd} {hdd} 64 1 writeback smq 0")
    fill("/dev/mapper/vg0-lv0", "8M")
    hold_writeback("vg0-lv0")
    j = status_json("vg0-lv0")
    assert j["lvm_owned"] is True and j["dm_uuid"] == uuid
    before, n = table("vg0-lv0"), dirty("vg0-lv0")
    for args, words in [
        (("mode", "vg0-lv0", "writethrough"), "lvchange --cachemode writethrough vg0/lv0"),
        (("mode", "/dev/mapper/vg0-lv0", "passthrough", "--drain"), "lvchange --cachemode"),
        (("drain", "vg0-lv0"), "lvchange --cachepolicy cleaner vg0/lv0"),
        (("remove", "vg0-lv0"), "lvconvert --uncache vg0/lv0"),
        (("tune", "vg0-lv0", "migration_threshold=8192"),
         "lvchange --cachesettings migration_threshold=8192 vg0/lv0"),
    ]:
        rc, out, err = run_cm(*args)
        assert rc == 3, (args, err)
        assert words in err and "belongs to LVM" in err and out == ""
    assert table("vg0-lv0") == before and dirty("vg0-lv0") == n
    assert tail("vg0-lv0")["core"] == {"migration_threshold": HOLD}
