"""``cachemgr scrub``: what a cache serves compared with what its origin holds (issue #42
item 4).

Each test caches a hot set in writethrough on two devices sharing one SSD, then corrupts
``N`` blocks of one device's copies on the SSD behind the cache's back: each found by its
content on the SSD (every 4 KiB page written carries its device and offset) and changed
there. Reads through the cache serve the corrupted copies (the hazard, counted). The scrub
of that device must find every corrupted block and nothing else and drop them; the scrub of
the other device (the control, left alone) must find nothing; afterwards every block reads
as written and fio's verify through the cache passes; ``check`` warns (WARNING) until a scrub
finds the device clean again, and the metrics say so.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from cachemgr.core import runner
from tests.kernel import clirun

PAGE = 4096
HOT = 4 << 20  # each device's hot set
N = 5  # copies corrupted on the SSD


def sh(*args: str) -> str:
    return runner.run(list(args), timeout=120).stdout


def content(tag: bytes, n: int, seed: int) -> bytes:
    """``n`` bytes in 4 KiB pages, each starting with its device's tag and its offset (how
    it is found on the SSD), the rest random."""
    rnd = random.Random(seed)
    out = bytearray()
    for off in range(0, n, PAGE):
        head = tag + b"@%012d:" % off
        out += head + rnd.randbytes(PAGE - len(head))
    return bytes(out)


def write(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 1 << 20)
    try:
        for i in range(0, len(data), 1 << 20):
            chunk = data[i:i + (1 << 20)]
            buf.seek(0)
            buf.write(chunk)
            os.pwrite(fd, memoryview(buf)[:len(chunk)], offset + i)
        os.fsync(fd)
    finally:
        buf.close()
        os.close(fd)


def write_pages(path: str, data: bytes) -> None:
    """``data`` from byte 0 as a VM writes: 4 KiB at a time in a shuffled order (bcache
    bypasses a sequential stream past its sequential_cutoff: a 4 MiB sequential write left
    3 of 64 blocks on the SSD once)."""
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, PAGE)
    offs = list(range(0, len(data), PAGE))
    random.Random(9).shuffle(offs)
    try:
        for off in offs:
            buf.seek(0)
            buf.write(data[off:off + PAGE])
            os.pwrite(fd, buf, off)
        os.fsync(fd)
    finally:
        buf.close()
        os.close(fd)


def read(path: str, offset: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 1 << 20)
    out = bytearray()
    try:
        for i in range(0, n, 1 << 20):
            got = os.preadv(fd, [buf], offset + i)
            out += buf[:min(got, n - i)]
    finally:
        buf.close()
        os.close(fd)
    return bytes(out)


def corrupt_on_ssd(ssd: str, tag: bytes, n: int) -> list[int]:
    """Find the pages of device ``tag`` on ``ssd`` by their content and change ``n`` of them
    (each in another 64 KiB block); the device offsets of the pages changed."""
    size = int(sh("blockdev", "--getsize64", ssd))
    found: dict[int, list[int]] = {}  # device offset -> its copies' SSD offsets
    for base in range(0, size, 1 << 20):
        chunk = read(ssd, base, min(1 << 20, size - base))
        for i in range(0, len(chunk), PAGE):
            m = re.match(re.escape(tag) + rb"@(\d{12}):", chunk[i:i + 32])
            if m:
                found.setdefault(int(m.group(1)), []).append(base + i)
    blocks: dict[int, int] = {}
    for off in sorted(found):
        blocks.setdefault(off // (64 << 10), off)
    assert len(blocks) >= n, f"only {len(blocks)} blocks of {tag!r} found on {ssd}"
    chosen = random.Random(7).sample(sorted(blocks.values()), n)
    for off in chosen:
        # every copy: bcache can leave an older copy of a page in a bucket it moved it from
        # (one run changed that one, and the page was not served changed)
        for at in found[off]:
            page = bytearray(read(ssd, at, PAGE))
            page[100:116] = os.urandom(16)
            write(ssd, at, bytes(page))
    return sorted(chosen)


def promoted(dev: str, want: bytes) -> None:
    """Read ``dev``'s hot set until its dm-cache holds every block of it (smq promotes over
    several hotspot periods of a second: docs/kernel-notes.md, "Warming a cache")."""
    import time

    dm = os.path.basename(dev)  # /dev/mapper/NAME
    seen: list[int] = []
    for _ in range(30):  # a bound, not a measurement
        assert read(dev, 0, len(want)) == want
        seen.append(int(sh("dmsetup", "status", dm).split()[6].split("/")[0]))
        # all of it, or no more for three reads (smq keeps a few out: 58 of 64 once)
        if seen[-1] >= len(want) // (64 << 10) or seen[-3:] == [seen[-1]] * 3:
            break
        time.sleep(1)
    assert seen[-1] >= 2 * N, f"{dev}: {seen} blocks cached after reads of its hot set"


def disk_stat(dev: str, field: int) -> int:
    """A field of /sys/block/DEV/stat (2: sectors read, 6: sectors written)."""
    name = os.path.basename(os.path.realpath(dev))
    return int(Path(f"/sys/block/{name}/stat").read_text().split()[field])


def served_wrong(dev: str, data: bytes) -> list[int]:
    got = read(dev, 0, len(data))
    return [i for i in range(0, len(data), PAGE) if got[i:i + PAGE] != data[i:i + PAGE]]


def scrub(dev: str, *extra: str) -> dict[str, object]:
    r = clirun.in_process("scrub", dev, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def pages_of(doc: dict[str, object]) -> list[int]:
    return sorted(p for m in doc["mismatches"] for p in m["pages"])  # type: ignore[union-attr,attr-defined]


def fio_verify(dev: str) -> None:
    """fio writes, then verifies, crc32c, through the cache."""
    r = subprocess.run(["fio", "--name=v", f"--filename={dev}", "--rw=randwrite", "--bs=4k",
                        "--direct=1", "--size=8M", "--offset=16M", "--verify=crc32c",
                        "--verify_fatal=1", "--verify_state_save=0", "--do_verify=1",
                        "--output-format=json"], capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr + r.stdout
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    assert job["error"] == 0 and job.get("total_err", 0) == 0, job


def check_and_metrics(dev: str, found: bool) -> None:
    r = clirun.in_process("check", "--json")
    doc = json.loads(r.stdout)
    codes = {(f["code"], f["device"]) for f in doc["findings"]}
    assert (("scrub-mismatch", dev) in codes) == found, doc
    if found:
        assert r.returncode == 1, r.stdout
    rc, out, err = clirun.run_process("metrics")
    assert rc == 0, err
    line = [x for x in out.splitlines()
            if x.startswith("cachemgr_scrub_mismatches{") and f'device="{dev}"' in x]
    assert line and float(line[0].rsplit(" ", 1)[1]) == (N if found else 0), line


def two_bcache(hdd: str, ssd: str, hdd2: str) -> tuple[str, str]:
    """``hdd`` and ``hdd2`` cached in writethrough on one cache set on ``ssd``: their
    bcache nodes, in that order."""
    r = clirun.in_process("create", "bcache", "--backing", hdd, "--backing", hdd2, "--cache",
                          ssd, "--bucket", "128k", "--mode", "writethrough")
    assert r.returncode == 0, r.stderr
    names = {}
    for b in os.listdir("/sys/block"):
        if b.startswith("bcache"):
            under = os.path.basename(os.path.dirname(os.path.realpath(f"/sys/block/{b}/bcache")))
            names[under] = f"/dev/{b}"
    return names[os.path.basename(hdd)], names[os.path.basename(hdd2)]


def cached_blocks(name: str) -> int:
    """The cache blocks dm-cache ``name`` holds (its status's used cache blocks)."""
    return int(sh("dmsetup", "status", name).split()[6].split("/")[0])


@pytest.mark.kernel(disks="256M,160M,256M", timeout=900)
def test_dmcache_scrub_finds_every_corrupted_block_and_nothing_else(
        lab_disks: list[str]) -> None:
    hdd, ssd, hdd2 = lab_disks
    parts = {"c1": (0, 64 << 11), "c2": (64 << 11, 64 << 11), "m1": (128 << 11, 8 << 11),
             "m2": (136 << 11, 8 << 11)}
    for name, (start, length) in parts.items():
        sh("dmsetup", "create", name, "--table", f"0 {length} linear {ssd} {start}")
    for origin, name, c, m in ((hdd, "vc", "c1", "m1"), (hdd2, "vd", "c2", "m2")):
        r = clirun.in_process("create", "dm-cache", name, "--origin", origin, "--cache",
                              f"/dev/mapper/{c}", "--metadata", f"/dev/mapper/{m}",
                              "--mode", "writethrough", "--block-size", "64k")
        assert r.returncode == 0, r.stderr
    vc, vd = "/dev/mapper/vc", "/dev/mapper/vd"
    data, other = content(b"VC", HOT, 1), content(b"VD", HOT, 2)
    write(vc, 0, data)
    write(vd, 0, other)
    # smq promotes in the background (its migrations): read back until every block of the
    # hot set is cached (the full run of 2026-11-28, three guests at load 5: 20 of 64 were
    # when the scrub ran, and the scrub rightly compared those 20)
    deadline = time.monotonic() + 120
    while min(cached_blocks("vc"), cached_blocks("vd")) < HOT // (64 << 10):
        assert time.monotonic() < deadline, (cached_blocks("vc"), cached_blocks("vd"))
        assert read(vc, 0, HOT) == data and read(vd, 0, HOT) == other
        time.sleep(0.2)
    changed = corrupt_on_ssd("/dev/mapper/c1", b"VC", N)
    assert served_wrong(vc, data) == changed  # the hazard: the cache serves them
    assert read(hdd, 0, HOT) == data  # the origin holds what was written
    doc = scrub(vc)
    assert doc["dropped"] is True, doc
    assert pages_of(doc) == changed, (pages_of(doc), changed)  # 100 % found, none else
    assert len(doc["mismatches"]) == N  # type: ignore[arg-type]
    assert doc["blocks"] >= HOT // (64 << 10)  # every cached block compared
    assert served_wrong(vc, data) == []
    ctl = scrub(vd)  # the control
    assert ctl["mismatches"] == [] and ctl["dropped"] is None
    assert read(vd, 0, HOT) == other
    # the other blocks stayed cached: the drop took the mismatched ones only
    used = cached_blocks("vc")
    assert used >= HOT // (64 << 10) - N, used
    table = sh("dmsetup", "table", "vc")
    assert " writethrough " in table, table
    check_and_metrics(vc, True)
    fio_verify(vc)
    again = scrub(vc)
    assert again["mismatches"] == []
    check_and_metrics(vc, False)


@pytest.mark.kernel(disks="256M,256M,256M", timeout=900)
def test_bcache_scrub_finds_every_corrupted_block_and_nothing_else(
        lab_disks: list[str]) -> None:
    hdd, ssd, hdd2 = lab_disks
    vm, ctl_dev = two_bcache(hdd, ssd, hdd2)
    data, other = content(b"BA", HOT, 3), content(b"BB", HOT, 4)
    write_pages(vm, data)  # writethrough: bcache keeps a copy of every write
    write_pages(ctl_dev, other)
    assert read(vm, 0, HOT) == data and read(ctl_dev, 0, HOT) == other
    changed = corrupt_on_ssd(ssd, b"BA", N)
    assert served_wrong(vm, data) == changed  # the hazard: the cache serves them
    doc = scrub(vm)
    assert doc["dropped"] is True, doc
    assert pages_of(doc) == changed, (pages_of(doc), changed)
    assert served_wrong(vm, data) == []
    before = disk_stat(hdd2, 2)
    assert read(ctl_dev, 0, HOT) == other
    missed_before = (disk_stat(hdd2, 2) - before) * 512
    ssd_w, hdd2_r = disk_stat(ssd, 6), disk_stat(hdd2, 2)
    ctl = scrub(ctl_dev)
    admitted = (disk_stat(ssd, 6) - ssd_w) * 512
    assert ctl["mismatches"] == [] and ctl["dropped"] is None
    scrub_read = (disk_stat(hdd2, 2) - hdd2_r) * 512
    before = disk_stat(hdd2, 2)
    assert read(ctl_dev, 0, HOT) == other
    missed = (disk_stat(hdd2, 2) - before) * 512
    # the control's hot set is still served from the cache after a scrub of its whole device
    # (the scrub's stream is bypassed past sequential_cutoff): its reads do not reach its disk
    from tests.kernel import measure

    measure.report("CACHEMGR_SCRUB_LOG", "bcache control scrub", bytes=ctl["bytes"],
                   seconds=ctl["seconds"], ssd_written=admitted, backing_read=scrub_read,
                   hot_set_missed_before=missed_before, hot_set_missed_after=missed)
    assert missed <= missed_before, (missed_before, missed)
    assert admitted < 1 << 20, admitted  # nothing of the 256 MiB read was admitted
    assert "[writethrough]" in Path(f"/sys/block/{vm[5:]}/bcache/cache_mode").read_text()
    check_and_metrics(vm, True)
    fio_verify(vm)
    assert scrub(vm)["mismatches"] == []
    check_and_metrics(vm, False)


@pytest.mark.kernel(disks="256M,256M,256M", timeout=900)
def test_the_weekly_pass_scrubs_the_write_through_caches_and_check_says_so(
        lab_disks: list[str]) -> None:
    """``cachemgr scrub --all`` (what cachemgr-scrub.timer runs), with a policy whose
    ``[scrub]`` table leaves it unpaced: of two bcache devices on one SSD, the writethrough
    one with corrupted copies is compared, its mismatches found and dropped, and check warns
    about it; the writeback one is passed over, saying why; exit 0."""
    hdd, ssd, hdd2 = lab_disks
    vm, other = two_bcache(hdd, ssd, hdd2)
    r = clirun.in_process("mode", other, "writeback", "--yes")
    assert r.returncode == 0, r.stderr
    data = content(b"BW", HOT, 8)
    write_pages(vm, data)
    changed = corrupt_on_ssd(ssd, b"BW", N)
    assert served_wrong(vm, data) == changed  # the hazard: the cache serves them
    pol = Path("/tmp/scrub-policy.toml")
    pol.write_text("[scrub]\nmax_latency_ms = 0\n")
    pol.chmod(0o600)
    rc, out, err = clirun.run_process("scrub", "--all", "--policy", str(pol), "--json",
                                      timeout=600)
    assert rc == 0, (out, err)
    doc = json.loads(out)
    assert doc["max_latency_ms"] is None, doc
    by = {d["target"]: d for d in doc["devices"]}
    assert by[vm]["outcome"] == "compared" and by[vm]["mismatches"] == N, doc
    assert by[vm]["dropped"] is True, doc
    assert by[other]["outcome"] == "passed over" and "writeback" in by[other]["message"], doc
    assert served_wrong(vm, data) == []
    check_and_metrics(vm, True)
    # the table off: nothing compared, exit 4 (the unit's success)
    pol.write_text("[scrub]\nenabled = false\n")
    rc, out, err = clirun.run_process("scrub", "--all", "--policy", str(pol), timeout=120)
    assert rc == 4 and "scrub is off" in out, (out, err)


@pytest.mark.kernel(disks="256M,160M,256M", timeout=900)
def test_lvm_cache_scrub_finds_every_corrupted_block_and_nothing_else(
        lab_disks: list[str]) -> None:
    """An LVM cache (lvm2's own commands, both pools on one SSD): the scrub reads the
    origin sub-LV directly and drops the mismatched blocks through lvm2 (lvchange)."""
    hdd, ssd, hdd2 = lab_disks

    def lvm(*args: str) -> None:
        runner.run(["lvm", *args], timeout=300)

    lvm("pvcreate", "-y", hdd, ssd, hdd2)
    lvm("vgcreate", "vg", hdd, ssd, hdd2)
    lvm("lvcreate", "-y", "-n", "vm1", "-L", "64M", "vg", hdd)
    lvm("lvcreate", "-y", "-n", "vm2", "-L", "64M", "vg", hdd2)
    for lv, pool in (("vm1", "pool1"), ("vm2", "pool2")):
        lvm("lvcreate", "-y", "-n", pool, "-L", "48M", "vg", ssd)
        lvm("lvcreate", "-y", "-n", f"{pool}_meta", "-L", "8M", "vg", ssd)
        lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", "64k",
            "--poolmetadata", f"vg/{pool}_meta", f"vg/{pool}")
        lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"vg/{pool}", "--cachemode",
            "writethrough", f"vg/{lv}")
    v1, v2 = "/dev/mapper/vg-vm1", "/dev/mapper/vg-vm2"
    data, other = content(b"L1", HOT, 5), content(b"L2", HOT, 6)
    write(v1, 0, data)
    write(v2, 0, other)
    for dev, want in ((v1, data), (v2, other)):
        promoted(dev, want)
    changed = corrupt_on_ssd(ssd, b"L1", N)
    assert served_wrong(v1, data) == changed  # the hazard: the cache serves them
    doc = scrub("vg/vm1")
    assert doc["dropped"] is True, doc
    assert pages_of(doc) == changed, (pages_of(doc), changed)
    assert len(doc["mismatches"]) == N  # type: ignore[arg-type]
    assert served_wrong(v1, data) == []
    ctl = scrub("vg/vm2")
    assert ctl["mismatches"] == [] and ctl["dropped"] is None
    assert read(v2, 0, HOT) == other
    assert json.loads(runner.run(["lvm", "lvs", "--reportformat", "json", "-o", "cache_mode",
                                  "vg/vm1"]).stdout)["report"][0]["lv"][0]["cache_mode"] \
        == "writethrough"
    fio_verify(v1)


@pytest.mark.kernel(disks="256M,256M", timeout=600)
def test_a_writeback_cache_is_not_scrubbed(lab_disks: list[str]) -> None:
    hdd, ssd = lab_disks
    r = clirun.in_process("create", "bcache", "--backing", hdd, "--cache", ssd, "--bucket",
                          "128k", "--mode", "writeback")
    assert r.returncode == 0, r.stderr
    b = next(x for x in os.listdir("/sys/block") if x.startswith("bcache"))
    r = clirun.in_process("scrub", f"/dev/{b}")
    assert r.returncode == 3, r.stderr
    assert f"cachemgr mode /dev/{b} writethrough --drain && cachemgr scrub /dev/{b}" in \
        r.stderr, r.stderr


SEEK_MS = int(os.environ.get("CACHEMGR_SCRUB_SEEK_MS", "5"))  # the queueing HDD's request
BOUND_MS = 4 * SEEK_MS  # the paced scrub's --max-latency
READ_IOPS = min(50, 500 // SEEK_MS)  # the reader's rate: a tenth of what the HDD serves


def beside_reader(dev: str, during: list[str]) -> tuple[float, dict[str, object] | None]:
    """A VM reading ``dev`` at QD1 (test_paced_drain_kernel's reader, READ_IOPS, on blocks
    the cache does not hold) while ``cachemgr ARGS`` runs (``during``; none: for 10 s): the
    reader's p99 in ms, and the command's --json."""
    import time

    from tests.kernel import test_paced_drain_kernel as paced_drain

    vm = paced_drain.reader(dev, offset="16M", size="16M", keep=True, iops=READ_IOPS)
    doc = None
    try:
        time.sleep(1)
        if during:
            rc, out, err = clirun.run_process(*during, timeout=1200)
            assert rc == 0, err
            doc = json.loads(out)
        else:
            time.sleep(10)
    finally:
        Path(paced_drain.STOP).touch()
    return paced_drain.reader_p99(vm), doc


@pytest.mark.kernel(disks="256M", timeout=1800)
def test_a_paced_scrub_keeps_a_qd1_readers_p99_under_its_bound(lab_disks: list[str]) -> None:
    """bcache in writethrough over the queueing HDD (cachemgr/lab/hdd.py: one request at a
    time, SEEK_MS each: 5, or $CACHEMGR_SCRUB_SEEK_MS), a reader at QD1 on the device: its
    p99 as fio measures it alone, beside
    a scrub paced under BOUND_MS, and beside an unpaced one (CACHEMGR_SCRUB_LOG;
    docs/benchmarks.md, "Scrubbing a cache"). Asserted: the paced scrub held the reader's p99
    under the bound, and both compared the whole device and found nothing.

    A UML guest's latencies stretch with the host's load, the disk's own as much as fio's
    (the guest's timers fire late: at host load 16-21 the reader alone read p99 52-68 ms on
    the 5 ms HDD and 186 ms on a 50 ms one, and the pacer's own estimate from the device's
    counters went over the bound with it). A reader alone over half the bound shows the host,
    not the scrub: the test is skipped then, saying so, rather than asserting what this host
    cannot show."""
    from cachemgr.lab.hdd import queueing_hdd
    from tests.kernel import measure

    hdd = queueing_hdd(seek_ms=SEEK_MS, size_mb=48)
    r = clirun.in_process("create", "bcache", "--backing", hdd, "--cache", lab_disks[0],
                          "--bucket", "128k", "--mode", "writethrough")
    assert r.returncode == 0, r.stderr
    dev = "/dev/" + next(x for x in os.listdir("/sys/block") if x.startswith("bcache"))
    load = Path("/proc/loadavg").read_text().split()[0]
    alone, _ = beside_reader(dev, [])
    if alone > BOUND_MS / 2:
        measure.report("CACHEMGR_SCRUB_LOG", "scrub beside a QD1 reader: not measurable",
                       reader_p99_ms={"alone": alone}, guest_load=load)
        pytest.skip(f"the reader alone read p99 {alone:.1f} ms, over half the {BOUND_MS} ms "
                    "bound: the host's load, not the scrub; nothing to show here now")
    paced, doc_p = beside_reader(dev, ["scrub", dev, "--json", "--max-latency", str(BOUND_MS)])
    unpaced, doc_u = beside_reader(dev, ["scrub", dev, "--json"])
    assert doc_u and doc_p
    measure.report("CACHEMGR_SCRUB_LOG", "scrub beside a QD1 reader",
                   reader_p99_ms={"alone": alone, "paced": paced, "unpaced": unpaced},
                   scrub_s={"paced": doc_p["seconds"], "unpaced": doc_u["seconds"]},
                   pacing=doc_p["pacing"], guest_load=load, seek_ms=SEEK_MS)
    size = int(sh("blockdev", "--getsize64", dev))
    for doc in (doc_u, doc_p):
        assert doc["mismatches"] == [] and doc["bytes"] == size, doc
    assert doc_u["pacing"] is None
    assert doc_p["pacing"]["max_latency_ms"] == BOUND_MS  # type: ignore[index]
    # what the pacer promises, as the paced drain's test asserts of its own: the reader held
    # under the bound, or the scrub slowed down to its floor and said it was still over
    # there. A host whose load grew after the reader alone was measured stretches the
    # guest's latencies where no pace can help (the full run of 2026-11-28: alone 9.0 ms,
    # beside the paced scrub 56 ms, the pacer lowered 9 times and over at its floor 4 times;
    # unpaced, 2 s long, 12.8 ms): the figure is reported, the quiet host's in
    # docs/benchmarks.md
    pacing = doc_p["pacing"]
    assert paced <= BOUND_MS or (pacing["lowered"] > 0 and pacing["over_at_floor"] > 0), (
        alone, paced, pacing)
