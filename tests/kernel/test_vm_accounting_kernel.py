"""Per-VM accounting on one shared cache (issue #45 item 1): each VM's read hit ratio from
its cgroup's io.stat, and the noisy neighbour named; for bcache, a dm-cache and an LVM cache.

Three libvirt domains (defined, not started: docs/kernel-notes.md, "libvirt in the lab") have
their disks on LVs of one VG whose PV is the cached device over a slow (dm-delay) disk:
bcache0; a dm-cache made by cachemgr; an LVM cache's LV (the VMs' VG on it). "A VM reading"
is fio in a cgroup scope named as libvirt names a running domain's. The jobs: a hot Zipf
reader whose set was read into the cache first, a uniform reader over a large span part of
which was cached, a sequential "backup" (bcache bypasses it past ``sequential_cutoff``; the
dm-caches below do not cache it).

Ground truth comes from the devices' own counters (/sys/block/X/stat, no cgroup involved):
each job run alone, its read hit ratio is 1 - (sectors the slow disk read / sectors the
cached device read). The jobs then run together, each in its scope; ``cachemgr vms --json``
gives each one's ratio, which must be within 0.05 of its own alone, and names as the noisy
neighbour the job that made the slow disk serve the most when alone.

For a dm-cache that truth moves: smq goes on promoting between the runs (what the backup read
alone was cached by the time it ran together, and ``migration_threshold`` 0 does not stop
it). So after smq has warmed it the cache is held still with the cleaner policy, which
promotes and demotes nothing (docs/kernel-notes.md, "A dm-cache held still"); every run then
reads the same cache, the status's promotions and demotions are asserted 0 through each, and
its read hit and miss counts, taken over each run alone, must give the same ratio as the
sectors for the 4 KiB readers. What this proves is the attribution to each VM on a cache
that does not change under it; how smq's promotions move the VMs' ratios is not measured.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.core import runner
from tests.kernel import clirun
from tests.kernel.test_vms_kernel import _scope, block_disk, define, slow_disk

# the slow disk (dm-delay'd), the SSD, dm-cache's metadata
DISKS = "768M,160M,16M"
SECONDS = 8  # each fio run
# The hot reader at its own pace: bcache tells a sequential stream by the last 64 requests to
# the bcache device (RECENT_IO, check_should_bypass() in drivers/md/bcache/request.c); with
# the hot reader's hits at full speed (2,300 a second in the lab) so many came between two of
# the backup's reads in one lab run that the backup was cached (its ratio 0.014 alone, 0.153
# together) and took the uniform reader's blocks (0.242 alone, 0.174 together). That is a
# real neighbour's effect, but not the one the test measures; the cause is inferred, not
# traced.
JOBS = {  # VM -> (LV size, fio job options)
    "vm-hot": ("48M", "--rw=randread --bs=4k --random_distribution=zipf:1.2 "
                      "--rate_iops=300"),
    "vm-uni": ("384M", "--rw=randread --bs=4k"),
    "vm-bak": ("192M", "--rw=read --bs=1M"),
}
WARM = {"vm-hot": 48, "vm-uni": 96}  # MiB read into the cache first, from each LV's start


def lvm(*args: str) -> str:
    return runner.run(["lvm", *args], timeout=120).stdout


def sectors_read(name: str) -> int:
    """Sectors read from the block device ``name`` (block/stat.rst: the third field)."""
    return int(Path(f"/sys/block/{name}/stat").read_text().split()[2])


def fio(node: str, opts: str, seed: int, scope: Path | None = None) -> subprocess.Popen[bytes]:
    """One job at QD1 with O_DIRECT for SECONDS, in ``scope`` when given; its own seed, so
    no run reads the offsets an earlier one cached (fio's randrepeat, on by default, repeats
    one sequence whatever randseed says: the lab's second run of a job hit what the first
    had cached)."""
    cmd = (f"exec fio --name=j --filename={shlex.quote(node)} {opts} --direct=1 "
           f"--iodepth=1 --time_based --runtime={SECONDS} --randrepeat=0 --randseed={seed} "
           f"--output-format=terse")
    if scope is not None:
        cmd = f"echo $$ > {shlex.quote(str(scope / 'cgroup.procs'))} && {cmd}"
    return subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL)


def kname(node: str) -> str:
    """The kernel name of the block device at ``node`` (dm-N for a /dev/mapper node: the
    lab's nodes are made without udev, not links)."""
    rdev = os.stat(node).st_rdev
    return Path(os.path.realpath(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}")).name


def vms_on(pv: str) -> None:
    """The VG vgvm on ``pv``, one LV per job, a domain on each."""
    lvm("pvcreate", "-y", pv)
    lvm("vgcreate", "vgvm", pv)
    for vm, (size, _) in JOBS.items():
        lvm("lvcreate", "-y", "-n", vm, "-L", size, "vgvm")
        define(vm, block_disk(f"/dev/vgvm/{vm}", "vda", "none"))


def lvm_filter(accept: list[str], scan_lvs: bool = False) -> None:
    """lvm2 sees only the devices in ``accept``: a dm-cache's origin (and the raw disk under
    it) carries the same PV label as the cached device, and lvm2 took the first seen (the
    origin, in the lab: vgvm's lvcreate then failed). ``scan_lvs``:
    an LV may be a PV (lvm.conf(5): off by default)."""
    rules = ", ".join([*(f'"a|^{a}$|"' for a in accept), '"r|.*|"'])
    with open("/etc/lvm/lvmlocal.conf", "a") as f:
        f.write(f"devices {{ global_filter = [ {rules} ] scan_lvs = {int(scan_lvs)} }}\n")


def warm_smq(cached: str, uni_mib: int = WARM["vm-uni"]) -> None:
    """smq (dm-cache's default policy) promotes what is read often: the first ``uni_mib`` MiB
    of the uniform reader's LV once and the hot LV twice a pass, in 64 KiB direct reads, pass
    after pass until a pass promotes next to nothing (at most 8); the promotions counted from
    ``cached``'s status (dmsetup status)."""
    def promoted() -> int:
        return int(runner.run(["dmsetup", "status", cached]).stdout.split()[12])
    last = promoted()
    for _ in range(8):
        for vm, mib in (("vm-uni", uni_mib), ("vm-hot", WARM["vm-hot"]),
                        ("vm-hot", WARM["vm-hot"])):
            runner.run(["dd", f"if=/dev/vgvm/{vm}", "of=/dev/null", "bs=64k",
                        f"count={mib * 16}", "iflag=direct", "status=none"], timeout=300)
        now = promoted()
        if now - last < 32:
            break
        last = now


def build_dmcache(lab_disks: list[str]) -> tuple[str, str, str]:
    """A dm-cache (writethrough, smq) over a 2 ms dm-delay disk, made by cachemgr, a VG on
    it with one LV per job, a domain on each, warmed by smq, then held still: its policy
    switched to the cleaner, which neither promotes nor demotes (it only writes dirty blocks
    back, and a writethrough cache has none), so every run below reads the same cache
    (docs/kernel-notes.md, "A dm-cache held still")."""
    hdd, ssd, meta = lab_disks[:3]
    slow = slow_disk("hdd", hdd, 2)
    rc = clirun.in_process("create", "dm-cache", "vc", "--origin", slow, "--cache", ssd,
                           "--metadata", meta, "--block-size", "32k", "--mode",
                           "writethrough", "-y")
    assert rc.returncode == 0, rc.stderr
    lvm_filter(["/dev/mapper/vc"])
    vms_on("/dev/mapper/vc")
    warm_smq("vc")
    table = runner.run(["dmsetup", "table", "vc"]).stdout.split()
    cut = table.index("smq")
    frozen = " ".join([*table[:cut], "cleaner", "0"])
    for step in (["suspend", "vc"], ["reload", "vc", "--table", frozen], ["resume", "vc"]):
        runner.run(["dmsetup", *step], timeout=60)
    return "/dev/mapper/vc", kname("/dev/mapper/vc"), kname(slow)


def build_lvm(lab_disks: list[str]) -> tuple[str, str, str]:
    """An LVM cache (lvconvert --type cache, writethrough, smq) of the LV vgc/big on a 2 ms
    dm-delay disk, vgvm on that LV as its PV (the VMs' LVs on the cached PV), then held
    still as the dm-cache is, through lvm2 (lvchange --cachepolicy cleaner)."""
    hdd, ssd = lab_disks[:2]
    slow = slow_disk("hdd", hdd, 2)
    lvm_filter(["/dev/mapper/hdd", ssd, "/dev/mapper/vgc-big"], scan_lvs=True)
    lvm("pvcreate", "-y", slow, ssd)
    lvm("vgcreate", "vgc", slow, ssd)
    lvm("lvcreate", "-y", "-n", "big", "-l", "100%PVS", "vgc", slow)
    lvm("lvcreate", "-y", "-n", "pool", "-L", "128M", "vgc", ssd)
    lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "32k", "vgc/pool")
    lvm("lvconvert", "-y", "--type", "cache", "--cachepool", "vgc/pool", "--cachemode",
        "writethrough", "--cachepolicy", "smq", "vgc/big")
    vms_on("/dev/mapper/vgc-big")
    # the pool's 4,096 blocks of 32 KiB hold the hot set (1,536) and 64 MiB of the uniform
    # reader's span (2,048), not 96 MiB of it: with 96 (4,608 blocks in all) smq left a tenth
    # to a quarter of the hot set out, and the Zipf reader's ratio alone and together then
    # differed by up to 0.17 in the lab: which of its offsets are hot moves with fio's seed
    # (its Zipf ranks are offset by a number drawn from the seed, shared_rand_init() in
    # fio's lib/zipf.c), a new one each run, while which of them are cached does not
    warm_smq("vgc-big", 64)
    lvm("lvchange", "--cachepolicy", "cleaner", "vgc/big")
    return "/dev/mapper/vgc-big", kname("/dev/mapper/vgc-big"), kname(
        "/dev/mapper/vgc-big_corig")


def build_bcache(lab_disks: list[str]) -> tuple[str, str, str]:
    """bcache0 over a 2 ms dm-delay disk, a VG on it with one LV per job, a domain on each,
    the hot set and part of the uniform reader's span in the cache; (the cached device's
    node, its kernel name, the backing device's kernel name)."""
    hdd, ssd = lab_disks[:2]
    slow = slow_disk("hdd", hdd, 2)
    rdev = os.stat(slow).st_rdev  # /dev/mapper/hdd is a node of its own without udev
    backing = Path(os.path.realpath(
        f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}")).name
    rc = clirun.in_process("create", "bcache", "--backing", slow, "--cache", ssd,
                           "--bucket", "128k")
    assert rc.returncode == 0, rc.stderr
    bc = Path("/sys/block/bcache0/bcache")
    cset = bc / "cache"
    # the lab's file-backed "SSD" is slower than bcache's congestion thresholds: without
    # this bcache would bypass it (docs/kernel-notes.md, "Cache-set files")
    for f in ("congested_read_threshold_us", "congested_write_threshold_us"):
        (cset / f).write_text("0")
    vms_on("/dev/bcache0")
    # the warm-up: sequential reads cached too (cutoff 0), in 64 KiB reads, twice, then
    # bcache's default again; then until the SSD's writes stop. In 1 MiB reads it did not
    # take: on the loaded lab host one pass left about a fifth of the hot set out, and six
    # passes each read the backing disk again (why bcache kept none of those misses is not
    # checked). The ground truth below is measured, not assumed.
    (bc / "sequential_cutoff").write_text("0")
    for vm, mib in WARM.items():
        for _ in range(2):
            runner.run(["dd", f"if=/dev/vgvm/{vm}", "of=/dev/null", "bs=64k",
                        f"count={mib * 16}", "iflag=direct", "status=none"], timeout=300)
    ssd_name = Path(os.path.realpath(ssd)).name
    written = -1
    for _ in range(60):
        now = int(Path(f"/sys/block/{ssd_name}/stat").read_text().split()[6])
        if now == written:
            break
        written = now
        time.sleep(1)
    (bc / "sequential_cutoff").write_text(str(4 << 20))  # its default, 4 MiB
    # the hot reader's own warm-up (not measured): its tail, cached by its misses, then
    # moves its hit ratio little from one run to the next
    fio("/dev/vgvm/vm-hot", JOBS["vm-hot"][1], 99).wait(timeout=300)
    fio("/dev/vgvm/vm-hot", JOBS["vm-hot"][1], 98).wait(timeout=300)
    return "/dev/bcache0", "bcache0", backing


def together() -> None:
    """Each job in a scope named as libvirt names a running domain's, all at once."""
    scopes = {vm: _scope(vm, i) for i, vm in enumerate(JOBS, start=1)}
    runs = [fio(f"/dev/vgvm/{vm}", opts, 10 + i, scopes[vm])
            for i, (vm, (_, opts)) in enumerate(JOBS.items())]
    for p in runs:
        p.wait(timeout=300)


BUILD = {"bcache": build_bcache, "dmcache": build_dmcache, "lvm": build_lvm}


@pytest.mark.parametrize("kind", list(BUILD))
@pytest.mark.kernel(disks=DISKS, libvirt=True, timeout=900)
def test_each_vm_hit_ratio_from_its_cgroup_and_the_noisy_one_named(
        lab_disks: list[str], kind: str) -> None:
    node, cached, slow = BUILD[kind](lab_disks)

    # ground truth: each job alone, from the devices' counters
    alone: dict[str, tuple[float, int]] = {}
    for seed, vm in enumerate(("vm-uni", "vm-bak", "vm-hot"), start=1):
        r0, s0 = sectors_read(cached), sectors_read(slow)
        st0 = dm_counts(kind, node)
        fio(f"/dev/vgvm/{vm}", JOBS[vm][1], seed).wait(timeout=300)
        read, served = sectors_read(cached) - r0, sectors_read(slow) - s0
        alone[vm] = (1 - served / read, served * 512)
        if st0 is not None:
            hits, misses, moved = dm_delta(st0, kind, node)
            print(f"{vm} alone: {node}: status read hits {hits}, read misses {misses}, "
                  f"promotions and demotions {moved}")
            assert moved == 0, moved  # the cache held still: the same cache for every run
            if "bs=4k" in JOBS[vm][1]:  # one status count per 4 KiB read: the same ratio
                assert abs(hits / (hits + misses) - alone[vm][0]) <= 0.02, (hits, misses)
    # together, each in its scope
    st0 = dm_counts(kind, node)
    s0 = sectors_read(slow)
    together()
    if st0 is not None:
        hits, misses, moved = dm_delta(st0, kind, node)
        print(f"together: {node}: status read hits {hits}, read misses {misses}, "
              f"promotions and demotions {moved}")
        assert moved == 0, moved
    check(node, alone, (sectors_read(slow) - s0) * 512)


def dm_counts(kind: str, node: str) -> list[int] | None:
    """A dm-cache's read hits, read misses, promotions and demotions (dmsetup status:
    Documentation/admin-guide/device-mapper/cache.rst); None for bcache."""
    if kind == "bcache":
        return None
    f = runner.run(["dmsetup", "status", node.removeprefix("/dev/mapper/")]).stdout.split()
    return [int(f[i]) for i in (7, 8, 12, 11)]


def dm_delta(before: list[int], kind: str, node: str) -> tuple[int, int, int]:
    """Since ``before``: a dm-cache's read hits, read misses, and promotions + demotions."""
    now = dm_counts(kind, node) or before
    hits, misses, promoted, demoted = (b - a for a, b in zip(before, now, strict=True))
    return hits, misses, promoted + demoted


def check(node: str, alone: dict[str, tuple[float, int]], served_all: int) -> None:
    """``cachemgr vms --json`` after the run together: each VM's ratio on ``node`` within
    0.05 of its own alone, the scopes charged what the slow disk read, the noisy one named
    (the one that made the slow disk serve the most alone)."""
    noisy = max(alone, key=lambda vm: alone[vm][1])
    t0 = time.monotonic()
    r = clirun.in_process("vms", "--json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {v["name"]: v for v in doc["vms"]}
    got: dict[str, tuple[float, int]] = {}
    for vm in JOBS:
        (c,) = by[vm]["cache_io"]
        assert c["cache"] == node and c["unknown"] is None, c
        got[vm] = (c["read_hit_ratio"], c["slow_read_bytes"])
    print(f"per-VM read hit ratio on {node}, alone (the device's counters) / together "
          "(cachemgr vms, io.stat):")
    for vm in JOBS:
        print(f"  {vm}: {alone[vm][0]:.3f} / {got[vm][0]:.3f}; the slow disk served "
              f"{alone[vm][1] >> 10} KiB alone, {got[vm][1] >> 10} KiB together")
    print(f"slow disk reads together {served_all >> 10} KiB, charged to the scopes "
          f"{sum(g[1] for g in got.values()) >> 10} KiB; noisy: {doc['noisy_neighbours']}; "
          f"vms --json took {took:.2f} s")
    assert alone["vm-hot"][0] > 0.8, alone  # the warm-up did cache the hot set
    for vm in JOBS:
        assert abs(got[vm][0] - alone[vm][0]) <= 0.05, (vm, alone, got)
    # what the scopes were charged is what the slow disk read, where nothing else read it
    if served_all:
        assert abs(sum(g[1] for g in got.values()) - served_all) <= 0.02 * served_all
    names = [(n["vm"], n["cache"]) for n in doc["noisy_neighbours"]]
    assert names == [(noisy, node)], (names, alone)
    text = clirun.in_process("vms").stdout
    assert f"noisy neighbour on {node}: {noisy} made" in text, text
