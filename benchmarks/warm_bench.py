"""Benchmark: the read hit ratio of the first 60 s on a new cache SSD, cold against warmed by
`cachemgr warm` from a trace, beside the steady state (issue #35 item 1), on bcache, dm-cache
(smq) and an LVM cache (lvm2's cache pool: dm-cache and smq underneath).

    # in the lab (UML): one guest per kind, 8-10 minutes each
    cachemgr lab run --backend uml --disks 1G,32M --timeout 1800 -- \\
        .venv/bin/python benchmarks/warm_bench.py lab [bcache|dmcache|lvm]

The "HDD" is a dm-delay device over the first disk (5 ms a request); the second disk (32 MiB)
is the cache, in writethrough:

* bcache: 16 KiB buckets, the whole disk the cache device;
* dm-cache: `cachemgr`'s own create (smq, writethrough, its default 64 KiB cache blocks),
  the whole disk the cache device; its metadata on an 8 MiB loop device in the guest's RAM
  (the 32 MiB stays all cache, as bcache's);
* lvm: a VG over the "HDD", the 32 MiB disk and that loop device (1 MiB extents), an LV over
  the whole "HDD", a cache pool of the whole 32 MiB disk (31 MiB once lvm2's label and
  metadata area are off; chunk 64 KiB, smq) with its metadata LV on the loop device.

The load is a VM's: 4 KiB random reads, one in flight, Zipf(1.0) over the whole device, its
hot blocks placed by one fixed permutation; each run draws its own requests (its own seed)
from that same distribution.

1. cold: the cache made fresh (bcache: procedures/bench/hygiene.py fresh_cache: detach,
   unregister, wipe, format, register, attach, a new SSD as replace-ssd leaves it; dm-cache:
   the device removed and created again over zeroed metadata; lvm: the cache pool split off
   with lvconvert --uncache and a new one made and attached; the UML lab has no disk
   replace-ssd can pull, so a fresh cache stands in for the replacement), then the load for
   COLD_S seconds: its first 60 s are the cold figure, its last 60 s the steady state (each
   minute's figure is printed too). The requests of its first TRACE_S seconds are the trace
   (written with the recorder's own writer: the UML kernel has no blktrace, so `cachemgr
   trace` cannot record there).
2. warmed: the cache made fresh again, `cachemgr warm TARGET --trace FILE`, then the load
   (another seed) for 60 s: the warmed figure.
3. dm-cache only: the same with the warm limited to one pass over the hot blocks (what a
   single read of the hot set gives smq), then the load (a third seed) for 60 s.
4. dm-cache only: the same as 2 after one 4 KiB read every PRIME_STEP over the whole device
   first (every smq hotspot touched once: does a hotspot queue full of cold entries let the
   hot set climb higher?), then the load (a fourth seed) for 60 s.

Hit ratios are the kernel's own counters over each window: bcache, reads completed on
/dev/bcache0 against reads the backing device completed (each read miss is one read of the
backing device; readahead is 0); dm-cache and lvm, the read hits and read misses of the
cache target's status (`dmsetup status`, parsed by cachemgr/backends/dmcache). Prints one
JSON line with the figures and their ratios to the steady state.
"""

from __future__ import annotations

import bisect
import itertools
import json
import mmap
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cachemgr.core.model import DmCacheStatus

BS = 4096
THETA = 1.0
DELAY_MS = 5
WINDOW_S = 60.0
COLD_S = 240.0  # the cold run: its first 60 s cold, its last 60 s the steady state
TRACE_S = 150.0  # the part of the cold run recorded as the trace
PERM_SEED = 35
META_BYTES = 8 << 20  # dm-cache's and the LVM cache pool's metadata (a loop device in RAM)
KINDS = ("bcache", "dmcache", "lvm")
PRIME_STEP = 512 << 10  # smq's hotspot blocks here: 16 cache blocks, halved to fit the origin

Counts = Callable[[], tuple[int, int]]  # cumulative (read hits, read misses)


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def reads(dev: str) -> int:
    return int(Path(f"/sys/block/{dev}/stat").read_text().split()[0])


class Load:
    """Zipf(THETA) 4 KiB reads over ``nblocks``, rank r at block perm[r], QD1, O_DIRECT."""

    def __init__(self, nblocks: int) -> None:
        w = [1.0 / (i + 1) ** THETA for i in range(nblocks)]
        total = sum(w)
        self.cdf = list(itertools.accumulate(x / total for x in w))
        self.perm = random.Random(PERM_SEED).sample(range(nblocks), nblocks)

    def run(self, node: str, seconds: float, seed: int, *, marks: list[float],
            counts: Counts, record: list[tuple[float, int]] | None = None,
            record_s: float = 0.0) -> list[tuple[float, int, int]]:
        """Read for ``seconds``; the cache's read (hits, misses) at each of ``marks``
        (seconds from the start); the requests of the first ``record_s`` seconds into
        ``record``."""
        rnd = random.Random(seed)
        fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, BS)
        out = [(0.0, *counts())]
        todo = sorted(marks)
        t0 = time.monotonic()
        try:
            while True:
                t = time.monotonic() - t0
                while todo and t >= todo[0]:
                    out.append((todo.pop(0), *counts()))
                if t >= seconds:
                    break
                b = self.perm[min(bisect.bisect(self.cdf, rnd.random()), len(self.cdf) - 1)]
                os.preadv(fd, [buf], b * BS)
                if record is not None and t < record_s:
                    record.append((t, b))
        finally:
            buf.close()
            os.close(fd)
        return out


def window(counts: list[tuple[float, int, int]], start: float, end: float) -> float:
    a = next(c for c in counts if c[0] == start)
    b = next(c for c in counts if c[0] == end)
    hits, misses = b[1] - a[1], b[2] - a[2]
    return hits / (hits + misses) if hits + misses else float("nan")


# --------------------------------------------------------------------------------- the caches


class Bcache:
    target = node = "/dev/bcache0"

    def __init__(self, hdd: str, ssd: str) -> None:
        from cachemgr.backends import bcache, snapshot
        from cachemgr.core.sysfs import Sysfs

        self.sysfs = Sysfs()
        bcache.create(self.sysfs, backings=[hdd], cache=ssd, bucket="16k")
        b = snapshot.take(self.sysfs).backings[0]
        self.backing = b.identity.name  # dm-0
        cs = snapshot.take(self.sysfs).cache_set(b.cset_uuid or "")
        assert cs is not None and cs.caches
        c = cs.caches[0]
        self.capacity = (c.nbuckets or 0) * (c.bucket_size.bytes if c.bucket_size else 0)

    def fresh(self) -> None:
        from cachemgr.procedures.bench.hygiene import fresh_cache

        fresh_cache(self.sysfs, self.backing)

    def counts(self) -> tuple[int, int]:
        total, misses = reads("bcache0"), reads(self.backing)
        return total - misses, misses


def dm_status(name: str) -> DmCacheStatus:
    from cachemgr.backends.dmcache import parse

    line = sh("dmsetup", "status", name).strip()
    st = parse.parse_status(line)
    assert not isinstance(st, str), line
    return st


def dm_counts(name: str) -> tuple[int, int]:
    st = dm_status(name)
    return st.read_hits, st.read_misses


def ram_loop(size: int) -> str:
    """A loop device over a file in the guest's RAM (its root is a tmpfs overlay)."""
    fd, path = tempfile.mkstemp(prefix="meta-", dir="/tmp")
    os.ftruncate(fd, size)
    os.close(fd)
    return sh("losetup", "-f", "--show", path).strip()


def zero(node: str, size: int) -> None:
    fd = os.open(node, os.O_WRONLY)
    try:
        os.write(fd, bytes(size))
        os.fsync(fd)
    finally:
        os.close(fd)


class DmCache:
    name = "vc"
    target = node = "/dev/mapper/vc"

    def __init__(self, hdd: str, ssd: str) -> None:
        self.hdd, self.ssd, self.meta = hdd, ssd, ram_loop(META_BYTES)
        self.fresh()
        st = dm_status(self.name)
        self.capacity = st.total * st.block_sectors * 512

    def fresh(self) -> None:
        from cachemgr.backends.dmcache import build
        from cachemgr.core.model import CacheMode
        from cachemgr.core.sysfs import Sysfs

        if os.path.exists(self.node):  # writethrough: nothing dirty to lose
            sh("dmsetup", "remove", self.name)
        zero(self.meta, META_BYTES)  # new metadata: an empty cache
        build.create(Sysfs(), self.name, origin=self.hdd, cache=self.ssd, metadata=self.meta,
                     mode=CacheMode.WRITETHROUGH)

    def counts(self) -> tuple[int, int]:
        return dm_counts(self.name)


def lvm(*args: str) -> str:
    return sh("lvm", *args)


class LvmCache:
    target = "vg0/vm1"
    node = "/dev/vg0/vm1"

    def __init__(self, hdd: str, ssd: str, raw: str) -> None:
        self.ssd, self.meta = ssd, ram_loop(META_BYTES)
        with open("/etc/lvm/lvmlocal.conf", "a") as f:  # the raw disk carries the same label
            f.write(f'devices {{ global_filter = [ "r|^{raw}$|" ] }}\n')
        lvm("pvcreate", "-y", hdd, ssd, self.meta)
        lvm("vgcreate", "-s", "1M", "vg0", hdd, ssd, self.meta)
        lvm("lvcreate", "-y", "-n", "vm1", "-l", "100%PVS", "vg0", hdd)
        self.cached = False
        self.fresh()
        st = dm_status("vg0-vm1")
        self.capacity = st.total * st.block_sectors * 512

    def fresh(self) -> None:
        if self.cached:  # writethrough: nothing dirty to lose
            lvm("lvconvert", "-y", "--uncache", "vg0/vm1")
        lvm("lvcreate", "-y", "-n", "pool", "-l", "100%PVS", "vg0", self.ssd)
        lvm("lvcreate", "-y", "-n", "pmeta", "-L", "6M", "vg0", self.meta)  # lvm2: 5M at least
        # no spare metadata LV: the VG has no room for one (lvm2 wants as much again)
        lvm("lvconvert", "-y", "--type", "cache-pool", "--poolmetadata", "vg0/pmeta",
            "--poolmetadataspare", "n", "--chunksize", "64k", "--cachepolicy", "smq",
            "vg0/pool")
        lvm("lvconvert", "-y", "--type", "cache", "--cachepool", "vg0/pool", "--cachemode",
            "writethrough", "vg0/vm1")
        self.cached = True

    def counts(self) -> tuple[int, int]:
        return dm_counts("vg0-vm1")


# --------------------------------------------------------------------------------- the run

# a warm limited to one pass over the hot blocks (dm-cache reads in passes: procedures/kinds
# dm.py, warm_passes); the rest is `python -m cachemgr`
ONE_PASS = ("import sys; from cachemgr.procedures.kinds import dm; "
            "dm._DmCacheWarm.warm_passes = 1; from cachemgr.cli.main import main; "
            "sys.exit(main())")


def warm(target: str, trace: Path, *, one_pass: bool = False) -> tuple[dict[str, object], float]:
    cmd = ([sys.executable, "-c", ONE_PASS] if one_pass else [sys.executable, "-m", "cachemgr"])
    t0 = time.monotonic()
    p = subprocess.run([*cmd, "warm", target, "--trace", str(trace), "--json"],
                       capture_output=True, text=True)
    took = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"cachemgr warm failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout), took


def partial(out: dict[str, object]) -> None:
    """The figures so far, on stderr (a run cut short by the lab's timeout keeps them)."""
    print(json.dumps(out), file=sys.stderr, flush=True)


def prime(node: str, size: int) -> float:
    """One 4 KiB read every PRIME_STEP bytes of ``node``, QD1, O_DIRECT; the seconds taken."""
    fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BS)
    t0 = time.monotonic()
    try:
        for off in range(0, size, PRIME_STEP):
            os.preadv(fd, [buf], off)
    finally:
        buf.close()
        os.close(fd)
    return time.monotonic() - t0


def lab(kind: str) -> dict[str, object]:
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import trace as tr

    disks = sorted(p for p in Path("/dev").iterdir()
                   if p.name in ("ubda", "ubdb", "vda", "vdb"))
    raw, ssd = str(disks[0]), str(disks[1])
    sectors = sh("blockdev", "--getsz", raw).strip()
    sh("dmsetup", "create", "slow", "--table", f"0 {sectors} delay {raw} 0 {DELAY_MS}")
    hdd = "/dev/mapper/slow"
    cache: Bcache | DmCache | LvmCache
    if kind == "bcache":
        cache = Bcache(hdd, ssd)
    elif kind == "dmcache":
        cache = DmCache(hdd, ssd)
    else:
        cache = LvmCache(hdd, ssd, raw)
    node = cache.node
    size = int(sh("blockdev", "--getsize64", node))
    load = Load(size // BS)
    minutes = [WINDOW_S * i for i in range(1, int(COLD_S // WINDOW_S) + 1)]

    # 1. cold, then steady, in one run from a fresh cache; its first TRACE_S s traced
    cache.fresh()
    rec: list[tuple[float, int]] = []
    cold_counts = load.run(node, COLD_S, 1, marks=minutes, counts=cache.counts,
                           record=rec, record_s=TRACE_S)
    cold = window(cold_counts, 0.0, WINDOW_S)
    steady = window(cold_counts, COLD_S - WINDOW_S, COLD_S)
    per_minute = [round(window(cold_counts, m - WINDOW_S, m), 4) for m in minutes]
    out: dict[str, object] = {
        "kind": kind, "cache_bytes": cache.capacity, "device_bytes": size, "zipf": THETA,
        "hdd_delay_ms": DELAY_MS, "trace_requests": len(rec),
        "trace_blocks": len({blk for _, blk in rec}),
        "hit_ratio_cold_run_per_minute": per_minute}
    partial(out)
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "host.trace"
        (dev, _), = tr.resolve(Sysfs(), [node])
        w = tr.Writer(trace, tr.Header(block=BS, rate=1.0, devices=[dev],
                                       started=time.time()))
        for t, blk in rec:
            w.add(t, blk * BS, BS, 0, 0)
        w.close({"seconds": TRACE_S, "ended_by": "time"})
        # 2. warmed: a fresh cache, cachemgr warm, the load again (another seed)
        cache.fresh()
        doc, took = warm(cache.target, trace)
        warm_counts = load.run(node, WINDOW_S, 2, marks=[WINDOW_S], counts=cache.counts)
        warmed = window(warm_counts, 0.0, WINDOW_S)
        out.update({"warm_seconds": round(took, 1), "warm_bytes_read": doc["bytes_read"],
                    "warm_passes": doc["passes"],
                    "hit_ratio_first_60s_cold": round(cold, 4),
                    "hit_ratio_first_60s_warmed": round(warmed, 4),
                    "hit_ratio_steady": round(steady, 4),
                    "cold_to_steady": round(cold / steady, 3),
                    "warmed_to_steady": round(warmed / steady, 3)})
        partial(out)
        if kind == "dmcache":
            # 3. the same warm in one pass only
            cache.fresh()
            doc1, took1 = warm(cache.target, trace, one_pass=True)
            one_counts = load.run(node, WINDOW_S, 3, marks=[WINDOW_S], counts=cache.counts)
            one = window(one_counts, 0.0, WINDOW_S)
            out.update({"one_pass_warm_seconds": round(took1, 1),
                        "one_pass_passes": doc1["passes"],
                        "hit_ratio_first_60s_warmed_one_pass": round(one, 4),
                        "warmed_one_pass_to_steady": round(one / steady, 3)})
            partial(out)
            # 4. every hotspot touched once, then the same warm
            cache.fresh()
            primed_s = prime(node, size)
            doc4, took4 = warm(cache.target, trace)
            primed_counts = load.run(node, WINDOW_S, 4, marks=[WINDOW_S], counts=cache.counts)
            primed = window(primed_counts, 0.0, WINDOW_S)
            out.update({"primed_seconds": round(primed_s, 1),
                        "primed_warm_seconds": round(took4, 1),
                        "primed_warm_passes": doc4["passes"],
                        "hit_ratio_first_60s_primed_warmed": round(primed, 4),
                        "primed_warmed_to_steady": round(primed / steady, 3)})
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "lab" or len(args) > 2 or (len(args) == 2
                                                         and args[1] not in KINDS):
        raise SystemExit(__doc__)
    print(json.dumps(lab(args[1] if len(args) == 2 else "bcache")), flush=True)
