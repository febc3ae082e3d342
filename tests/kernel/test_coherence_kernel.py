"""What the cache serves is what the disk holds: an arriving VM's caches drop their copies
(issue #42 items 1 and 3).

The hazard as another host makes it: a VM's hot set read through a writethrough cache over a
shared "LUN" (dm-multipath over a lab disk: shared storage as the kernel shows it), the VM
leaves (the libvirt hook's ``release``: the cache is marked), the LUN is rewritten behind
the cache as another host would write it (for bcache past its data offset,
``bcache-super-show``'s ``dev.data.first_sector``), and the VM comes back. Each cycle counts
the 4 KiB blocks that read the old content through the cache before the hook runs (the
hazard: > 0) and after the hook ran ``migrate begin`` (0), and the hit ratio of a second
device cached on the same SSD before and after (within 0.01). The hook is run as libvirt runs
it (its four arguments, the domain XML on stdin, libvirt's environment); the libvirt daemon
itself calling the hook is tests/kernel/test_migrate_hook_kernel.py's.

benchmarks/coherence_bench.py runs the same cycles 20 times per kind (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachemgr.core import runner
from tests.kernel import clirun, measure

ROOT = Path(__file__).resolve().parents[2]
LOG = "CACHEMGR_COHERENCE_LOG"
BS = 4096
HOT = 16 << 20  # the VM's hot set
OTHER = 8 << 20  # the other device's hot set
# away-and-back cycles per kind (benchmarks/coherence_bench.py runs 20)
CYCLES = int(os.environ.get("CACHEMGR_COHERENCE_CYCLES", "3"))


def sh(*args: str) -> str:
    return runner.run(list(args), timeout=120).stdout


def multipath(dev: str, name: str) -> str:
    """A dm-multipath device over ``dev`` with multipathd's UUID form: shared storage as the
    kernel (and cachemgr's VM view) sees it."""
    runner.run(["modprobe", "dm-multipath"], check=False)
    runner.run(["modprobe", "dm-round-robin"], check=False)
    sectors = sh("blockdev", "--getsz", dev).strip()
    sh("dmsetup", "create", name, "--uuid", f"mpath-36001405lab{name}", "--table",
       f"0 {sectors} multipath 0 0 1 1 round-robin 0 1 1 {dev} 1000")
    return f"/dev/mapper/{name}"


def write(path: str, offset: int, data: bytes) -> None:
    """``data`` at ``offset`` with O_DIRECT (past every page cache)."""
    import mmap

    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 1 << 20)
        for i in range(0, len(data), 1 << 20):
            buf.seek(0)
            buf.write(data[i:i + (1 << 20)])
            os.pwrite(fd, buf, offset + i)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str, n: int) -> bytes:
    import mmap

    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    out = bytearray()
    try:
        buf = mmap.mmap(-1, 1 << 20)
        for i in range(0, n, 1 << 20):
            got = os.preadv(fd, [buf], i)
            out += buf[:got]
    finally:
        os.close(fd)
    return bytes(out)


def stale(got: bytes, old: bytes, new: bytes) -> tuple[int, int]:
    """(blocks that read the old content, blocks that read the new)."""
    olds = sum(got[i:i + BS] == old[i:i + BS] for i in range(0, len(got), BS))
    news = sum(got[i:i + BS] == new[i:i + BS] for i in range(0, len(got), BS))
    return olds, news


def domain(name: str, dev: str) -> str:
    return (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>"
            "<os><type arch='x86_64'>hvm</type></os><devices>"
            "<disk type='block' device='disk'><driver name='qemu' type='raw' cache='none'/>"
            f"<source dev='{dev}'/><target dev='vda' bus='virtio'/></disk>"
            "</devices></domain>")


def hook(name: str, op: str, xml: str) -> tuple[int, str, float]:
    """cachemgr's hook as libvirt runs it (virHookCall: NAME OP SUBOP EXTRA, the domain XML
    on stdin, LC_ALL=C and HOME): (exit status, stderr, seconds)."""
    env = {"LC_ALL": "C", "HOME": "/", "PYTHONPATH": str(ROOT),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cachemgr.cli.hook", name, op, "begin", "-"],
                       input=xml.encode(), capture_output=True, env=env, timeout=300,
                       check=False)
    dt = time.perf_counter() - t0
    assert r.stdout == b""  # libvirt would take it as a replacement XML
    return r.returncode, r.stderr.decode(errors="replace"), dt


def bcache_of(dm_name: str) -> str:
    """The /dev/bcacheN whose backing device is the dm device ``dm_name``."""
    kname = os.path.basename(os.path.realpath(f"/dev/mapper/{dm_name}"))
    if not kname.startswith("dm-"):  # /dev/mapper nodes without udev: the devno
        st = os.stat(f"/dev/mapper/{dm_name}")
        kname = os.path.basename(os.path.realpath(
            f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"))
    for b in os.listdir("/sys/block"):
        if b.startswith("bcache") and os.path.realpath(
                f"/sys/block/{b}/bcache").startswith(os.path.realpath(f"/sys/block/{kname}")):
            return b
    raise AssertionError(f"no bcache device over {dm_name}")


def origin_reads(disk: str) -> int:
    """Bytes read from ``disk`` so far (/sys/block/DISK/stat, sectors read): the misses of a
    cache over it, counted where they land and at once (bcache's own counters move on a
    13.6 s timer: stats.c accounting_delay)."""
    return int(Path(f"/sys/block/{os.path.basename(disk)}/stat").read_text().split()[2]) * 512


def read_blocks(path: str, n: int) -> None:
    """The hot set read as a VM reads: 4 KiB at a time, in a shuffled order."""
    import mmap
    import random

    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, BS)
        offs = list(range(0, n, BS))
        random.Random(1).shuffle(offs)
        for off in offs:
            os.preadv(fd, [buf], off)
    finally:
        os.close(fd)


def warm(disk: str, dev: str) -> None:
    """The other device's hot set read as its VM reads it until a pass reads no more from
    its origin than the one before (smq promotes over several passes)."""
    last = None
    for _ in range(30):  # a bound, not a measurement
        before = origin_reads(disk)
        read_blocks(dev, OTHER)
        missed = origin_reads(disk) - before
        if missed == 0 or missed == last:
            return
        last = missed
        time.sleep(1)  # smq's hotspot period


def hit_ratio(missed: int) -> float:
    """The other device's read hit ratio over one read of its hot set: the bytes that did not
    come from its origin."""
    return 1 - missed / OTHER


def _cycles(kind: str, node: str, lun_disk: str, lun_offset: int, other: str,
            other_disk: str, vm: str, shown: str | None = None) -> None:
    """The away-and-back cycles on ``node`` (its LUN is ``lun_disk``, the VM's data at
    ``lun_offset`` on it); the hit ratio of ``other`` (cached on the same SSD, its origin on
    ``other_disk``) before and after each arrival. ``shown``: how status names ``node``."""
    xml = domain(vm, node)
    shown = shown or node
    rows = []
    for i in range(CYCLES):
        old, new = os.urandom(HOT), os.urandom(HOT)
        write(node, 0, old)  # the VM writes its hot set (writethrough: cached)
        for _ in range(8):  # and reads it (dm-cache's smq promotes on repeated reads)
            assert read(node, HOT) == old
        code, err, left_s = hook(vm, "release", xml)  # the VM leaves this host
        assert code == 0, err
        assert "marked" in err, err
        doc = json.loads(clirun.in_process("status", "--json", "--no-vms").stdout)
        assert any(m["device"] == shown and m["domain"] == vm for m in doc["left"]), \
            doc["left"]
        write(lun_disk, lun_offset, new)  # another host writes the LUN
        before_old, _ = stale(read(node, HOT), old, new)
        assert before_old > 0, "the hazard did not show: no block read stale"
        # the other device's hit ratio: its hot set read before and after the arrival
        h0 = origin_reads(other_disk)
        read_blocks(other, OTHER)
        r_before = hit_ratio(origin_reads(other_disk) - h0)
        code, err, arrive_s = hook(vm, "migrate", xml)  # the VM comes back
        assert code == 0, err
        assert "every cached copy dropped" in err, err
        inv = re.search(r"every cached copy dropped in ([0-9.]+) s", err)
        # counted from here: lvm2's commands in the hook read every PV's label and metadata
        h1 = origin_reads(other_disk)
        read_blocks(other, OTHER)
        h2 = origin_reads(other_disk)
        after_old, after_new = stale(read(node, HOT), old, new)
        assert (after_old, after_new) == (0, HOT // BS), (after_old, after_new)
        r_after = hit_ratio(h2 - h1)
        assert abs(r_before - r_after) <= 0.01, (r_before, r_after)
        doc = json.loads(clirun.in_process("status", "--json", "--no-vms").stdout)
        assert not [m for m in doc["left"] if m["device"] == shown]  # the mark is cleared
        rows.append({"cycle": i, "stale_without": before_old, "stale_with": after_old,
                     "fresh_with": after_new, "other_hit_ratio": [round(r_before, 4),
                                                                  round(r_after, 4)],
                     "hook_release_s": round(left_s, 3), "hook_migrate_s": round(arrive_s, 3),
                     "invalidation_s": float(inv.group(1)) if inv else None})
    # the hook's own floor: a VM with no cache under it (the interpreter's start and the
    # fast path)
    floor = sorted(hook(vm, "migrate", domain(vm, "/dev/null"))[2] for _ in range(3))
    measure.report(LOG, f"{kind} away and back", blocks=HOT // BS, cycles=rows,
                   hook_no_cache_s=[round(x, 3) for x in floor])


@pytest.mark.kernel(disks="256M,256M,256M", timeout=900)
def test_bcache_arrival_drops_the_copies_and_spares_the_other_device(
        lab_disks: list[str]) -> None:
    hdd, ssd, hdd2 = lab_disks
    lun, lun2 = multipath(hdd, "mpatha"), multipath(hdd2, "mpathb")
    r = clirun.in_process("create", "bcache", "--backing", lun, "--backing", lun2, "--cache",
                          ssd, "--bucket", "128k", "--mode", "writethrough")
    assert r.returncode == 0, r.stderr
    vm_dev, other = f"/dev/{bcache_of('mpatha')}", f"/dev/{bcache_of('mpathb')}"
    for b in (vm_dev, other):
        # whole-hot-set reads are sequential: bcache would bypass them past 4 MiB
        Path(f"/sys/block/{b[5:]}/bcache/sequential_cutoff").write_text("0")
    first = int(re.search(r"dev\.data\.first_sector\s+(\d+)",
                          sh("bcache-super-show", lun)).group(1))  # type: ignore[union-attr]
    data = os.urandom(OTHER)
    write(other, 0, data)
    assert read(other, OTHER) == data
    warm(hdd2, other)
    _cycles("bcache", vm_dev, hdd, first * 512, other, hdd2, "vm1")
    # still in writethrough, still on its set, the other device untouched
    assert "[writethrough]" in Path(f"/sys/block/{vm_dev[5:]}/bcache/cache_mode").read_text()
    assert read(other, OTHER) == data


@pytest.mark.kernel(disks="256M,160M,256M", timeout=900)
def test_dmcache_arrival_drops_the_copies_and_spares_the_other_device(
        lab_disks: list[str]) -> None:
    hdd, ssd, hdd2 = lab_disks
    lun = multipath(hdd, "mpatha")
    # one SSD for both caches: its data and metadata areas as dm linear devices
    parts = {"c1": (0, 64 << 11), "c2": (64 << 11, 64 << 11), "m1": (128 << 11, 8 << 11),
             "m2": (136 << 11, 8 << 11)}
    for name, (start, length) in parts.items():
        sh("dmsetup", "create", name, "--table", f"0 {length} linear {ssd} {start}")
    for origin, name, c, m in ((lun, "vc", "c1", "m1"), (hdd2, "vd", "c2", "m2")):
        r = clirun.in_process("create", "dm-cache", name, "--origin", origin, "--cache",
                              f"/dev/mapper/{c}", "--metadata", f"/dev/mapper/{m}",
                              "--mode", "writethrough", "--block-size", "64k")
        assert r.returncode == 0, r.stderr
    data = os.urandom(OTHER)
    write("/dev/mapper/vd", 0, data)
    assert read("/dev/mapper/vd", OTHER) == data
    warm(hdd2, "/dev/mapper/vd")
    _cycles("dm-cache", "/dev/mapper/vc", hdd, 0, "/dev/mapper/vd", hdd2, "vm2")
    table = sh("dmsetup", "table", "vc")
    assert " writethrough " in table and " smq " in table, table


@pytest.mark.kernel(disks="256M,256M", timeout=600)
def test_an_interrupted_invalidation_owns_the_device_until_it_is_finished(
        lab_disks: list[str]) -> None:
    """A cut after bcache's detach and before the attach (simulated: the record written, the
    device detached by hand): the device runs uncached (nothing stale is served), every other
    change is refused naming the invalidation, and ``cachemgr invalidate`` finishes it."""
    hdd, ssd = lab_disks
    lun = multipath(hdd, "mpatha")
    r = clirun.in_process("create", "bcache", "--backing", lun, "--cache", ssd, "--bucket",
                          "128k", "--mode", "writethrough")
    assert r.returncode == 0, r.stderr
    b = bcache_of("mpatha")
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import coherence, kinds

    snap = clirun_snapshot()
    dev = kinds.resolve(snap, f"/dev/{b}", Sysfs())
    cset = dev.cache_name
    # what ops/coherence.py records before it changes anything
    coherence.pending(dev.locks[0][0], f"/dev/{b}", mode="writethrough", kind="bcache",
                      cache=cset)
    Path(f"/sys/block/{b}/bcache/detach").write_text("1")
    deadline = time.monotonic() + 30  # a bound on the wait
    while Path(f"/sys/block/{b}/bcache/cache").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    r = clirun.in_process("mode", f"/dev/{b}", "writearound")
    assert r.returncode == 3, r.stderr
    assert "invalidation" in r.stderr and f"cachemgr invalidate /dev/{b} --yes" in r.stderr
    r = clirun.in_process("check")
    assert r.returncode == 1 and "invalidation" in r.stdout, r.stdout
    r = clirun.in_process("invalidate", f"/dev/{b}", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["resumed"] is True
    assert Path(f"/sys/block/{b}/bcache/cache").exists()
    assert cset and cset in os.path.realpath(f"/sys/block/{b}/bcache/cache")
    assert coherence.marks() == []
    # the same cut, and a reboot: the boot pass finishes it before any VM starts
    coherence.pending(dev.locks[0][0], f"/dev/{b}", mode="writethrough", kind="bcache",
                      cache=cset)
    Path(f"/sys/block/{b}/bcache/detach").write_text("1")
    deadline = time.monotonic() + 30  # a bound on the wait
    while Path(f"/sys/block/{b}/bcache/cache").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pol = Path("/run/coherence-policy.toml")
    pol.write_text("version = 1\n")
    r = clirun.in_process("autoattach", "--policy", str(pol))
    assert r.returncode == 0, r.stderr
    assert f"/dev/{b}: every cached copy dropped" in r.stdout, r.stdout
    assert Path(f"/sys/block/{b}/bcache/cache").exists()
    assert coherence.marks() == []
    # a writeback cache's copies are not dropped (exit 3, with the command that drains)
    r = clirun.in_process("mode", f"/dev/{b}", "writeback")
    assert r.returncode == 0, r.stderr
    r = clirun.in_process("invalidate", f"/dev/{b}", "--yes")
    assert r.returncode == 3, r.stderr
    assert "writethrough --drain" in r.stderr, r.stderr


def clirun_snapshot():  # type: ignore[no-untyped-def]
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops import cache as cache_ops

    return cache_ops.status(Sysfs())


@pytest.mark.kernel(disks="256M,160M,256M", timeout=900)
def test_lvm_cache_arrival_drops_the_copies_and_spares_the_other_device(
        lab_disks: list[str]) -> None:
    """An LVM cache (lvmcache, a cache pool) made with lvm2's own commands: the VM's LV on the
    shared LUN, the other LV on another disk, both pools on one SSD."""
    hdd, ssd, hdd2 = lab_disks
    lun = multipath(hdd, "mpatha")
    with open("/etc/lvm/lvmlocal.conf", "a") as f:  # the LUN's path, not the disk under it
        f.write(f'devices {{ global_filter = [ "r|^{hdd}$|" ] }}\n')

    def lvm(*args: str) -> None:
        runner.run(["lvm", *args], timeout=300)

    lvm("pvcreate", "-y", lun, ssd, hdd2)
    lvm("vgcreate", "vg", lun, ssd, hdd2)
    lvm("lvcreate", "-y", "-n", "vm1", "-L", "64M", "vg", lun)
    lvm("lvcreate", "-y", "-n", "vm2", "-L", "64M", "vg", hdd2)
    for lv, pool in (("vm1", "pool1"), ("vm2", "pool2")):
        lvm("lvcreate", "-y", "-n", pool, "-L", "48M", "vg", ssd)
        lvm("lvcreate", "-y", "-n", f"{pool}_meta", "-L", "8M", "vg", ssd)
        lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "64k",
            "--poolmetadata", f"vg/{pool}_meta", f"vg/{pool}")
        lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"vg/{pool}", "--cachemode",
            "writethrough", f"vg/{lv}")
    # where vm1's blocks are on the LUN (its origin sub-LV's linear mapping)
    offset = int(sh("dmsetup", "table", "vg-vm1_corig").split()[4]) * 512
    data = os.urandom(OTHER)
    write("/dev/mapper/vg-vm2", 0, data)
    assert read("/dev/mapper/vg-vm2", OTHER) == data
    warm(hdd2, "/dev/mapper/vg-vm2")
    _cycles("lvmcache", "/dev/mapper/vg-vm1", hdd, offset, "/dev/mapper/vg-vm2", hdd2, "vm3")
    assert json.loads(runner.run(["lvm", "lvs", "--reportformat", "json", "-o", "cache_mode",
                                  "vg/vm1"]).stdout)["report"][0]["lv"][0]["cache_mode"] \
        == "writethrough"
