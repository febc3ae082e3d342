"""Benchmarks that prove what a cache does: fio jobs, parsed results, repetitions, cache counters.

A :class:`JobSpec` (a few parameters) becomes a fio job file; fio runs through
:func:`cachemgr.core.runner.run` with JSON output; the JSON becomes frozen dataclasses right where
it is read (:func:`parse_fio`), and a field that is missing raises :class:`FioFormatError`
naming it. Runs repeat; :class:`TargetSummary` carries medians and spreads and flags runs that
missed steady state or disagree beyond a tolerance.

Cache-aware runs (a bcache device as the target): the cache's own counters are sampled from
the snapshot during the run, and the block layer's IO counts of the bcache device, its backing
device and its cache device are read around it. Lab findings that shape this (kernel 7.2):

* bcache's ``cache_hits``/``cache_misses`` count reads only; writes never appear there.
* The counters are folded from per-CPU-less collectors every ~13.6 s (``accounting_delay =
  HZ*300/22``, drivers/md/bcache/stats.c), so a run's counts show up only after the next tick;
  the bench waits for one ("settle") before reading them.
* The fold does ``unsigned int t = atomic_xchg(...); t <<= 16``: more than 65,535 events in one
  interval (about 4,800 reads/s, or 32 MiB bypassed) wrap and are lost. Measured: 100,000 hits
  in one interval read back as 34,464. So the hit ratio is also computed from the block
  layer's counts (``/sys/block/*/stat``: a read the backing device sees is a miss, partial hits
  and bypassed misses included), which do not wrap; when the kernel's counted reads disagree
  with the block layer's, the kernel's ratio is discarded and the run says so.
* fio's Zipf sequence is seeded from the file name unless ``randrepeat=0``: every run and the
  warm-up replay the same hot blocks (a measured run after a warm-up of the same sequence read
  100 % hits). Jobs here always set ``randrepeat=0`` and an explicit, recorded ``randseed``.
* A small writeback cache fills with log-structured writes (buckets are reclaimed only by GC):
  a 512 MiB cache took 18,000 IOPS for one 5 s QD1 run, then fell to 289 IOPS as writes
  bypassed it (``cutoff_writeback_sync``). Each result carries ``cache_available_percent``.

Hygiene applied to cache targets and reported in every result: congestion thresholds set to 0
(a "SSD" slower than 2 ms / 20 ms is silently bypassed), ``sequential_cutoff`` 0 during the
warm-up, the mode asked for (``/dev/bcache0:writeback``), optionally a fresh cache (the cache
set rebuilt) before each run; every changed tunable is restored at the end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import re
import statistics
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cachemgr.backends import bcache, signatures, snapshot
from cachemgr.core import runner
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import BcacheBacking, CacheMode, CacheSet, Size, Snapshot
from cachemgr.core.model import parse_size as _parse_size
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import che

log = logging.getLogger(__name__)

SCHEMA = 1
DEFAULT_RESULTS_DIR = "/var/lib/cachemgr/bench"
# fio's percentile list, extended at both ends for the latency plot
PERCENTILES = (1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0,
               99.5, 99.9, 99.95, 99.99)
RW_MODES = ("randread", "randwrite", "randrw", "read", "write", "rw")
DEFAULT_TOLERANCE = 0.2


class FioFormatError(CacheMgrError):
    """fio's JSON output lacked a field or had one of the wrong type; names the field."""

    def __init__(self, field_path: str, problem: str = "missing") -> None:
        super().__init__(f"fio JSON output: {field_path} is {problem}",
                         hint="is this fio's --output-format=json output (fio >= 3.x)?")
        self.field_path = field_path
        self.problem = problem


# ----------------------------------------------------------------------------- sizes


def parse_size(text: str) -> int:
    """A job's size (``4k``, ``256M``, ``1G``, ``4096``) in bytes (model's one grammar)."""
    return _parse_size(text, hint="use a size like 4k, 64k, 256M or 1G")


def fio_size(text: str) -> str:
    """The size for fio, in the largest binary unit that divides it (``4k``, ``1536M``):
    fio reads "4KiB" as 4000 bytes (kb_base=1024), so the admin's text never goes to fio."""
    n = parse_size(text)
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("k", 10)):
        if n and not n % (1 << shift):
            return f"{n >> shift}{unit}"
    return str(n)


# ----------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobSpec:
    """A fio job from a few parameters (fio's own option names where they exist)."""

    rw: str = "randwrite"
    bs: str = "4k"
    iodepth: int = 1
    numjobs: int = 1
    distribution: str = "zipf:1.2"  # fio's random_distribution: zipf:T, pareto:H, random, ...
    size: str | None = None  # the region addressed (fio's size); None: the whole device
    offset: str | None = None
    runtime: float = 5.0
    ramp: float = 0.0
    rwmixread: int = 70
    steadystate: str | None = None  # e.g. "iops_slope:2%"
    ss_dur: float | None = None
    ss_ramp: float | None = None
    rate_iops: int | None = None
    ioengine: str = "libaio"
    extra: tuple[tuple[str, str], ...] = ()

    def validate(self) -> None:
        if self.rw not in RW_MODES:
            raise UsageError(f"unknown --rw {self.rw!r}", hint="one of " + ", ".join(RW_MODES))
        parse_size(self.bs)
        if self.size is not None:
            parse_size(self.size)
        if self.offset is not None:
            parse_size(self.offset)
        if self.iodepth < 1 or self.numjobs < 1:
            raise UsageError("--iodepth and --jobs must be at least 1")
        if self.runtime <= 0 or self.ramp < 0:
            raise UsageError("--runtime must be positive and --ramp not negative")
        if not 0 <= self.rwmixread <= 100:
            raise UsageError("--rwmixread must be within 0..100")
        theta = self.zipf_theta
        if theta is not None and (theta <= 0 or theta == 1.0):
            # fio refuses theta 1.0 ("zipf theta must be different than 1.0")
            raise UsageError(f"Zipf theta must be positive and not 1.0, not {theta}")
        if self.steadystate is not None and not re.fullmatch(
                r"(iops|bw)(_slope)?:\d+(\.\d+)?%?", self.steadystate):
            raise UsageError(f"bad steady-state criterion {self.steadystate!r}",
                             hint="e.g. iops_slope:2% or iops:5%")

    @property
    def zipf_theta(self) -> float | None:
        kind, _, arg = self.distribution.partition(":")
        if kind != "zipf":
            return None
        try:
            return float(arg) if arg else 1.1  # fio's default theta
        except ValueError:
            raise UsageError(f"bad Zipf theta in {self.distribution!r}") from None

    @property
    def reads(self) -> bool:
        return self.rw in ("randread", "read", "randrw", "rw")

    @property
    def writes(self) -> bool:
        return self.rw in ("randwrite", "write", "randrw", "rw")

    @property
    def qd1(self) -> bool:
        return self.iodepth * self.numjobs == 1

    def options(self, filename: str, *, seed: int, runtime: float | None = None,
                iodepth: int | None = None, ss: bool = True,
                ios: int | None = None) -> list[tuple[str, str]]:
        """fio options; ``ios`` runs a number of requests instead of a time (warm-ups:
        ``time_based`` would ignore ``number_ios``)."""
        if ios:
            timing = [("number_ios", str(ios)), ("io_size", str(ios * parse_size(self.bs)))]
        else:
            timing = [("time_based", "1"),
                      ("runtime", _secs(runtime if runtime is not None else self.runtime))]
        opts: list[tuple[str, str]] = [
            ("filename", filename),
            ("rw", self.rw),
            ("bs", fio_size(self.bs)),
            ("direct", "1"),
            ("ioengine", self.ioengine),
            ("iodepth", str(iodepth or self.iodepth)),
            ("numjobs", str(self.numjobs)),
            ("group_reporting", "1"),
            *timing,
            # a fresh, recorded random sequence per run: with randrepeat=1 (fio's default) the
            # Zipf generator is seeded from the file name and ignores randseed
            ("randrepeat", "0"),
            ("randseed", str(seed)),
            ("percentile_list", ":".join(f"{p:g}" for p in PERCENTILES)),
        ]
        if self.rw in ("randread", "randwrite", "randrw"):
            opts.append(("random_distribution", self.distribution))
            opts.append(("norandommap", "1"))  # a skewed distribution repeats blocks by design
        if self.rw in ("randrw", "rw"):
            opts.append(("rwmixread", str(self.rwmixread)))
            opts.append(("unified_rw_reporting", "both"))
        if self.size:
            opts.append(("size", fio_size(self.size)))
        if self.offset:
            opts.append(("offset", fio_size(self.offset)))
        if self.ramp and not ios:
            opts.append(("ramp_time", _secs(self.ramp)))
        if self.rate_iops:
            opts.append(("rate_iops", str(self.rate_iops)))
        if ss and self.steadystate:
            opts.append(("steadystate", self.steadystate))
            opts.append(("ss_dur", _secs(self.ss_dur or max(1.0, self.runtime / 2))))
            if self.ss_ramp is not None:
                opts.append(("ss_ramp", _secs(self.ss_ramp)))
        opts.extend(self.extra)
        return opts

    def jobfile(self, name: str, filename: str, *, seed: int, runtime: float | None = None,
                iodepth: int | None = None, ss: bool = True, ios: int | None = None) -> str:
        """The job as a fio job file (what is run, and saved with the results)."""
        lines = [f"[{_jobname(name)}]"]
        lines += [f"{k}={v}" for k, v in self.options(filename, seed=seed, runtime=runtime,
                                                         iodepth=iodepth, ss=ss, ios=ios)]
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        d = self.distribution if self.rw.startswith("rand") else "sequential"
        return (f"{self.rw} {self.bs} QD{self.iodepth}"
                f"{f' x{self.numjobs} jobs' if self.numjobs > 1 else ''} {d}, "
                f"{self.runtime:g} s")


def _secs(v: float) -> str:
    return f"{int(v)}s" if float(v).is_integer() else f"{int(v * 1000)}ms"


def _jobname(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "job"


# ----------------------------------------------------------------------------- fio JSON


@dataclass(frozen=True)
class Latency:
    """Completion latency (fio's clat) in microseconds: mean and percentiles."""

    mean_us: float
    percentiles: tuple[tuple[float, float], ...]  # (percentile, microseconds), ascending

    def at(self, pct: float) -> float | None:
        for p, v in self.percentiles:
            if abs(p - pct) < 1e-9:
                return v
        return None

    @property
    def p50_us(self) -> float | None:
        return self.at(50.0)

    @property
    def p90_us(self) -> float | None:
        return self.at(90.0)

    @property
    def p99_us(self) -> float | None:
        return self.at(99.0)

    @property
    def p99_9_us(self) -> float | None:
        return self.at(99.9)

    @property
    def p99_99_us(self) -> float | None:
        return self.at(99.99)


@dataclass(frozen=True)
class DirStats:
    """One direction (read, write, or fio's unified "mixed") of a fio job."""

    ios: int
    iops: float
    iops_stddev: float | None
    bw_bytes: float  # bytes per second (fio's bw is KiB/s)
    lat_mean_us: float  # total latency (submission + completion)
    clat: Latency


@dataclass(frozen=True)
class SteadyState:
    criterion: str  # "iops_slope:2.000000%"
    attained: bool
    duration_s: int | None
    measured: str | None  # fio's "criterion": the value reached


@dataclass(frozen=True)
class FioResult:
    """One fio job's result (fio's ``jobs[0]``, group_reporting on)."""

    fio_version: str | None
    jobname: str
    read: DirStats | None
    write: DirStats | None
    mixed: DirStats | None
    error: int  # fio's first error (an errno), 0 when none
    total_err: int | None  # only with continue_on_error
    runtime_ms: int
    steadystate: SteadyState | None

    @property
    def iops(self) -> float:
        return sum(d.iops for d in (self.read, self.write) if d is not None)

    @property
    def bw_bytes(self) -> float:
        return sum(d.bw_bytes for d in (self.read, self.write) if d is not None)

    @property
    def latency(self) -> Latency | None:
        """The latency to report: the mixed one for rw jobs, else the active direction's."""
        if self.mixed is not None:
            return self.mixed.clat
        active = [d for d in (self.read, self.write) if d is not None]
        if len(active) == 1:
            return active[0].clat
        return None

    @property
    def lat_mean_us(self) -> float | None:
        if self.mixed is not None:
            return self.mixed.lat_mean_us
        active = [d for d in (self.read, self.write) if d is not None]
        total = sum(d.ios for d in active)
        if not active or total == 0:
            return None
        return sum(d.lat_mean_us * d.ios for d in active) / total


def _get(obj: Any, path: str, *keys: str) -> Any:
    cur = obj
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            raise FioFormatError(f"{path}.{k}" if path else k)
        cur = cur[k]
        path = f"{path}.{k}" if path else k
    return cur


def _num(obj: Any, path: str, *keys: str) -> float:
    v = _get(obj, path, *keys)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise FioFormatError(".".join([path, *keys]), f"not a number ({v!r})")
    return float(v)


def _int(obj: Any, path: str, *keys: str) -> int:
    v = _get(obj, path, *keys)
    if isinstance(v, bool) or not isinstance(v, int):
        raise FioFormatError(".".join([path, *keys]), f"not an integer ({v!r})")
    return v


def _dir(job: Any, path: str, key: str) -> DirStats | None:
    d = _get(job, path, key)
    p = f"{path}.{key}"
    ios = _int(d, p, "total_ios")
    if ios == 0:
        return None
    completed = _int(d, p, "clat_ns", "N")
    # IOs that all failed (an EIO run) complete nothing: fio prints clat N 0 and no
    # percentiles (captured: tests/fixtures/fio/error-eio.json)
    pct_raw = _get(d, p, "clat_ns", "percentile") if completed else {}
    if not isinstance(pct_raw, dict) or (completed and not pct_raw):
        raise FioFormatError(f"{p}.clat_ns.percentile", "empty or not an object")
    pcts = []
    for k, v in pct_raw.items():
        try:
            pk = float(k)
        except ValueError:
            raise FioFormatError(f"{p}.clat_ns.percentile", f"keyed by {k!r}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise FioFormatError(f"{p}.clat_ns.percentile[{k}]", f"not a number ({v!r})")
        pcts.append((pk, float(v) / 1000))
    stddev = d.get("iops_stddev")
    return DirStats(
        ios=ios,
        iops=_num(d, p, "iops"),
        iops_stddev=float(stddev) if isinstance(stddev, (int, float)) else None,
        bw_bytes=_num(d, p, "bw") * 1024,
        lat_mean_us=_num(d, p, "lat_ns", "mean") / 1000,
        clat=Latency(mean_us=_num(d, p, "clat_ns", "mean") / 1000,
                     percentiles=tuple(sorted(pcts))),
    )


def parse_fio(text: str) -> FioResult:
    """fio's ``--output-format=json`` output -> :class:`FioResult`.

    Accepts what fio prints before the JSON (``fio: ...`` notices on stdout, e.g. after a
    SIGINT: docs/kernel-notes.md, "fio output"). Sample (fio 3.33, trimmed)::

        {"fio version": "fio-3.33", "jobs": [{"jobname": "bare", "error": 0,
          "job_runtime": 5006, "write": {"total_ios": 494, "iops": 98.86, "bw": 395,
          "lat_ns": {"mean": 10102654.7}, "clat_ns": {"mean": 10101559.3,
          "percentile": {"50.000000": 10289152, "99.000000": 19005440}}}, ...}]}

    Raises :class:`FioFormatError` naming the first missing or malformed field.
    """
    start = text.find("{")
    if start < 0:
        raise FioFormatError("the document", "missing (no JSON object in fio's output)")
    try:
        doc = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise FioFormatError("the document", f"not valid JSON ({exc.msg} at {exc.pos})") \
            from None
    if not isinstance(doc, dict):
        raise FioFormatError("the document", "not a JSON object")
    jobs = _get(doc, "", "jobs")
    if not isinstance(jobs, list) or not jobs:
        raise FioFormatError("jobs", "empty or not a list")
    job = jobs[0]
    if not isinstance(job, dict):
        raise FioFormatError("jobs[0]", "not an object")
    p = "jobs[0]"
    ss = None
    if "steadystate" in job:
        s = job["steadystate"]
        if not isinstance(s, dict):
            raise FioFormatError(f"{p}.steadystate", "not an object")
        dur = s.get("duration")
        crit = s.get("criterion")
        ss = SteadyState(criterion=str(_get(s, f"{p}.steadystate", "ss")),
                         attained=bool(_int(s, f"{p}.steadystate", "attained")),
                         duration_s=dur if isinstance(dur, int) else None,
                         measured=str(crit) if crit is not None else None)
    total_err = job.get("total_err")
    version = doc.get("fio version")
    return FioResult(
        fio_version=str(version) if version is not None else None,
        jobname=str(_get(job, p, "jobname")),
        read=_dir(job, p, "read"),
        write=_dir(job, p, "write"),
        mixed=_dir(job, p, "mixed") if "mixed" in job else None,
        error=_int(job, p, "error"),
        total_err=total_err if isinstance(total_err, int) else None,
        runtime_ms=_int(job, p, "job_runtime"),
        steadystate=ss,
    )


# ----------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Spread:
    """Median and spread of one figure over repetitions."""

    median: float
    low: float
    high: float
    n: int

    @property
    def rel_spread(self) -> float:
        """(max - min) / median: 0 when all runs agree."""
        if self.n < 2 or self.median == 0:
            return 0.0
        return (self.high - self.low) / abs(self.median)


def spread(values: Sequence[float]) -> Spread | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return Spread(median=statistics.median(vals), low=min(vals), high=max(vals), n=len(vals))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is unknown or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def disagreeing(values: Sequence[float], tolerance: float) -> list[int]:
    """Indexes of runs further than ``tolerance`` (relative) from the median."""
    s = spread(values)
    if s is None or s.n < 2 or s.median == 0:
        return []
    return [i for i, v in enumerate(values) if abs(v - s.median) / abs(s.median) > tolerance]


# ----------------------------------------------------------------------------- block stats


@dataclass(frozen=True)
class BlockStat:
    """``/sys/block/<dev>/stat`` (Documentation/block/stat.rst), the fields used here.

    Sample: ``3 0 24 30 92534 0 740272 8060 0 8090 8090 0 0 0 0 0 0``.
    """

    reads: int
    read_sectors: int
    writes: int
    write_sectors: int

    @classmethod
    def parse(cls, text: str) -> BlockStat:
        f = text.split()
        if len(f) < 8 or not all(x.isdigit() for x in f[:8]):
            from cachemgr.core.errors import KernelFormatError

            raise KernelFormatError("block device stat", text)
        return cls(int(f[0]), int(f[2]), int(f[4]), int(f[6]))

    def minus(self, other: BlockStat) -> BlockStat:
        return BlockStat(self.reads - other.reads, self.read_sectors - other.read_sectors,
                         self.writes - other.writes, self.write_sectors - other.write_sectors)


def read_block_stat(sysfs: Sysfs, name: str) -> BlockStat | None:
    rel = bcache.block_dirs(sysfs).get(name)
    text = sysfs.read_opt(f"{rel}/stat") if rel else None
    return BlockStat.parse(text) if text is not None else None


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """What one compared column runs on: a device, and for bcache devices the mode to use."""

    label: str
    spec: str  # as given: /dev/bcache0:writeback
    device: str  # the node fio opens
    name: str | None  # kernel name
    mode: CacheMode | None = None  # asked for; None keeps the current one
    backing_name: str | None = None  # set for bcache devices


def parse_target(text: str) -> tuple[str | None, str, CacheMode | None]:
    """``[LABEL=]DEVICE[:MODE]`` -> (label, device, mode)."""
    label = None
    if "=" in text and not text.startswith("/"):
        label, _, text = text.partition("=")
    mode = None
    dev, sep, m = text.rpartition(":")
    if sep and dev and m in {x.value for x in bcache.BCACHE_MODES}:
        mode, text = CacheMode(m), dev
    elif sep and dev and "/" not in m:
        raise UsageError(f"unknown cache mode {m!r} in {text}:{m}",
                         hint="use DEVICE:writethrough|writeback|writearound|none")
    return label, text, mode


def resolve_target(sysfs: Sysfs, text: str) -> Target:
    from cachemgr.backends.targets import resolve_backing

    label, dev, mode = parse_target(text)
    if not os.path.exists(dev):
        raise UsageError(f"{dev}: no such device")
    name = sysfs.block_name_of(dev)
    if name is None:
        raise UsageError(f"{dev} is not a block device")
    snap = snapshot.take(sysfs)
    backing = None
    for b in snap.backings:
        if b.device_name == name:
            backing = b
    if backing is None and mode is not None:
        # a backing device named with a mode means its bcache device
        try:
            backing = resolve_backing(snap, dev, sysfs)
        except UsageError:
            raise UsageError(f"{dev} is not a bcache device; a mode needs one") from None
        if backing.device is None:
            raise UsageError(f"{dev} has no running bcache device")
        dev, name = backing.device, backing.device_name
    if backing is not None and backing.cset_uuid is None and mode is not None:
        raise UsageError(f"{backing.device} has no cache attached; its mode means nothing")
    return Target(label=label or text, spec=text, device=dev, name=name, mode=mode,
                  backing_name=backing.identity.name if backing else None)


def write_refusal(sysfs: Sysfs, target: Target, snap: Snapshot) -> tuple[str, bool]:
    """Why writing to ``target`` would be unsafe, and whether ``--force`` may override it.

    ("", True) when it looks like a scratch device.
    """
    name = target.name or ""
    for b in snap.backings:
        if b.identity.name == name and b.device:
            return (f"{target.device} is the backing device of {b.device}: raw writes would "
                    f"overwrite its bcache superblock and bypass the cache; benchmark "
                    f"{b.device}:none for the bare device instead", False)
    for c in snap.cache_sets:
        for x in c.caches:
            if x.identity.name == name:
                return (f"{target.device} is the cache device of cache set {c.uuid}: writing "
                        "to it destroys the cache and any dirty data in it", False)
    rel = bcache.block_dirs(sysfs).get(name)
    holders = sysfs.listdir(f"{rel}/holders") if rel else []
    if holders:
        return f"{target.device} is in use by {', '.join(holders)}", True
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        if any(line.split()[0] in (target.device, f"/dev/{name}") for line in f if line):
            return f"{target.device} is mounted", True
    sig = signatures.first(target.device)
    if sig is not None:
        return f"{target.device} holds a {sig} signature (data)", True
    return "", True


# ----------------------------------------------------------------------------- cache side


def _backing(sysfs: Sysfs, name: str) -> BcacheBacking:
    return bcache.reread(sysfs, name)


def _cache_set(sysfs: Sysfs, b: BcacheBacking) -> CacheSet | None:
    if b.cset_uuid is None:
        return None
    return snapshot.take(sysfs).cache_set(b.cset_uuid)


def _kernel_counts(b: BcacheBacking) -> tuple[int, int, int, int, int] | None:
    s = b.stats.get("total")
    if s is None or None in (s.hits, s.misses, s.bypass_hits, s.bypass_misses):
        return None
    byp = s.bypassed.bytes if s.bypassed is not None else 0
    return (s.hits or 0, s.misses or 0, s.bypass_hits or 0, s.bypass_misses or 0, byp)


@dataclass(frozen=True)
class CacheSample:
    """The cache's own view of one run (deltas over the run) next to the block layer's."""

    device: str
    mode: str | None
    hit_ratio: float | None  # reads served from the cache: the figure to compare
    hit_ratio_source: str | None  # "kernel" | "block"
    hit_ratio_kernel: float | None  # bcache's hits / (hits + misses), bypassed excluded
    hit_ratio_block: float | None  # 1 - backing reads / bcache reads
    hits: int | None
    misses: int | None
    bypass_hits: int | None
    bypass_misses: int | None
    bypassed_bytes: int | None
    kernel_counters_consistent: bool | None
    reads: int
    writes: int
    backing_reads: int | None
    backing_writes: int | None
    cache_reads: int | None
    cache_writes: int | None
    dirty_start: int | None
    dirty_end: int | None
    dirty_max: int | None
    cache_available_percent_min: int | None
    timeline: tuple[tuple[float, int | None, int], ...] = ()  # (s, dirty bytes, reads so far)


class _Sampler:
    """Samples the snapshot (dirty data, cache availability) and the device's reads while fio
    runs, and reports progress. A thread: fio runs in the foreground through the runner."""

    def __init__(self, sysfs: Sysfs, name: str, backing_name: str | None, interval: float,
                 progress: Callable[[float, int, int | None], None] | None) -> None:
        self.sysfs, self.name, self.backing_name = sysfs, name, backing_name
        self.interval, self.progress = interval, progress
        self.stop = threading.Event()
        self.points: list[tuple[float, int | None, int]] = []
        self.avail: list[int] = []
        self.t0 = time.monotonic()
        self.start_stat = read_block_stat(sysfs, name)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def _loop(self) -> None:
        last = self.start_stat
        last_t = self.t0
        while not self.stop.wait(self.interval):
            try:
                st = read_block_stat(self.sysfs, self.name)
                dirty = None
                if self.backing_name:
                    b = _backing(self.sysfs, self.backing_name)
                    dirty = b.dirty.bytes if b.dirty else None
                    cs = _cache_set(self.sysfs, b)
                    if cs and cs.cache_available_percent is not None:
                        self.avail.append(cs.cache_available_percent)
            except CacheMgrError as exc:  # a vanished device ends sampling, not the run
                log.warning("sampling %s: %s", self.name, exc)
                return
            now = time.monotonic()
            if st is None or self.start_stat is None or last is None:
                continue
            done = st.minus(self.start_stat)
            self.points.append((round(now - self.t0, 2), dirty, done.reads + done.writes))
            if self.progress:
                d = st.minus(last)
                iops = int((d.reads + d.writes) / max(now - last_t, 1e-3))
                self.progress(now - self.t0, iops, dirty)
            last, last_t = st, now


def wait_accounting_tick(sysfs: Sysfs, backing_name: str, *, timeout: float = 16.0,
                         interval: float = 0.25) -> bool:
    """Wait until bcache folds its collectors into the stats (every ~13.6 s): the counts of
    IO done before the call are then visible. False if nothing changed in ``timeout``
    (nothing was pending)."""
    first = _kernel_counts(_backing(sysfs, backing_name))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(interval)
        if _kernel_counts(_backing(sysfs, backing_name)) != first:
            return True
    return False


def _sample_result(sysfs: Sysfs, target: Target, before: BcacheBacking,
                   after: BcacheBacking, blk: dict[str, tuple[BlockStat | None,
                                                              BlockStat | None]],
                   sampler: _Sampler) -> CacheSample:
    def delta(key: str) -> BlockStat | None:
        a, b = blk.get(key, (None, None))
        return b.minus(a) if a is not None and b is not None else None

    dev = delta("dev")
    bk = delta("backing")
    ca = delta("cache")
    k0, k1 = _kernel_counts(before), _kernel_counts(after)
    hits = misses = bh = bm = byp = None
    if k0 is not None and k1 is not None:
        hits, misses, bh, bm, byp = (y - x for x, y in zip(k0, k1, strict=True))
    reads = dev.reads if dev else 0
    h_kernel = ratio(hits, (hits or 0) + (misses or 0)) if hits is not None else None
    h_block = None
    if dev is not None and bk is not None and dev.reads > 0:
        h_block = max(0.0, 1 - bk.reads / dev.reads)
    consistent = None
    if hits is not None and reads > 0:
        counted = (hits or 0) + (misses or 0) + (bh or 0) + (bm or 0)
        consistent = abs(counted - reads) <= max(2, 0.01 * reads)
    hit, source = None, None
    if consistent and hits is not None and counted_served(hits, misses, bh, bm) is not None:
        hit, source = counted_served(hits, misses, bh, bm), "kernel"
    elif h_block is not None:
        hit, source = h_block, "block"
    dirty_vals = [d for _, d, _ in sampler.points if d is not None]
    return CacheSample(
        device=target.device,
        mode=after.mode.value if after.mode else None,
        hit_ratio=hit, hit_ratio_source=source, hit_ratio_kernel=h_kernel,
        hit_ratio_block=h_block, hits=hits, misses=misses, bypass_hits=bh, bypass_misses=bm,
        bypassed_bytes=byp, kernel_counters_consistent=consistent,
        reads=reads, writes=dev.writes if dev else 0,
        backing_reads=bk.reads if bk else None, backing_writes=bk.writes if bk else None,
        cache_reads=ca.reads if ca else None, cache_writes=ca.writes if ca else None,
        dirty_start=before.dirty.bytes if before.dirty else None,
        dirty_end=after.dirty.bytes if after.dirty else None,
        dirty_max=max(dirty_vals) if dirty_vals else None,
        cache_available_percent_min=min(sampler.avail) if sampler.avail else None,
        timeline=tuple(sampler.points),
    )


def counted_served(hits: int | None, misses: int | None, bh: int | None,
                   bm: int | None) -> float | None:
    """Reads served from the cache by bcache's own counters: (hits + bypass hits) / all.

    bcache counts a bypassed read that found its data in the cache as a bypass hit (it is
    still served from the cache); a partial hit counts as a miss."""
    if hits is None or misses is None:
        return None
    total = hits + misses + (bh or 0) + (bm or 0)
    return (hits + (bh or 0)) / total if total else None


# ----------------------------------------------------------------------------- hygiene


@dataclass
class Hygiene:
    """Tunables changed for the benchmark (restored at the end) and what was done."""

    sysfs: Sysfs
    notes: list[str] = field(default_factory=list)
    _restore: list[tuple[str, str, str]] = field(default_factory=list)  # (what, path, value)

    def set(self, what: str, path: str, value: str) -> None:
        before = self.sysfs.read(path).strip()
        if before.startswith("[") or " [" in before:  # bracketed choice (cache_mode)
            from cachemgr.core.model import parse_bracketed

            before = parse_bracketed(before)[0]
        if what.endswith("sequential_cutoff"):
            before = str(Size.parse_hprint(before).low)
        if before == value:
            return
        self.sysfs.write(path, value)
        if not any(p == path for _, p, _ in self._restore):
            self._restore.append((what, path, before))
            self.notes.append(f"{what}: {before} -> {value} (restored afterwards)")

    def restore(self) -> None:
        for what, path, value in reversed(self._restore):
            try:
                self.sysfs.write(path, value)
            except CacheMgrError as exc:
                log.error("could not restore %s to %s: %s", what, value, exc)
        self._restore.clear()


def _backing_rel(sysfs: Sysfs, name: str) -> str:
    return bcache.backing_rel(sysfs, name)


def fresh_cache(sysfs: Sysfs, backing_name: str, *, timeout: float = 600) -> list[str]:
    """Rebuild the cache set of one backing device: detach (flushes), unregister, wipe and
    format the cache device again with the same bucket size, register, attach, same mode.

    A reused cache gives false hits (docs/kernel-notes.md, "Benchmarking traps"). Refused
    when the set serves other backing devices or flash volumes.
    """
    b = _backing(sysfs, backing_name)
    cset = _cache_set(sysfs, b)
    if cset is None or not cset.caches:
        raise UsageError(f"{b.device}: no cache attached; nothing to refresh")
    if cset.flash_volumes or set(cset.backing_names) - {backing_name}:
        raise UnsafeError(f"cache set {cset.uuid} serves other devices too; refusing to "
                          "rebuild it for a benchmark")
    cache = cset.caches[0]
    bucket = cache.bucket_size.bytes if cache.bucket_size else None
    mode = b.mode
    steps = [f"detach {b.device}"]
    bcache.detach(sysfs, b, timeout=timeout)
    bcache.unregister_cache_set(sysfs, _cache_set_by_uuid(sysfs, cset.uuid),
                                snapshot.take(sysfs).backings)
    node = cache.identity.node
    signatures.wipe(node)
    bcache.make_bcache(cache=node, bucket=f"{bucket // 1024}k" if bucket else None, wipe=True,
                       force=True)
    bcache.register(sysfs, node)
    new = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and new is None:
        for c in snapshot.take(sysfs).cache_sets:
            if any(x.identity.name == cache.identity.name for x in c.caches):
                new = c
        time.sleep(0.1)
    if new is None:
        raise TimeoutExpired(f"the new cache set on {node} did not appear")
    bcache.attach(sysfs, _backing(sysfs, backing_name), new)
    if mode is not None:
        with contextlib.suppress(AlreadyError):
            bcache.set_mode(sysfs, _backing(sysfs, backing_name), mode)
    steps.append(f"new cache set {new.uuid} on {node}, attached, mode {mode}")
    return steps


def _cache_set_by_uuid(sysfs: Sysfs, uuid: str) -> CacheSet:
    c = snapshot.take(sysfs).cache_set(uuid)
    if c is None:
        raise CacheMgrError(f"cache set {uuid} vanished")
    return c


def cache_capacity_bytes(cset: CacheSet) -> int | None:
    """The cache device's data capacity: buckets x bucket size (the whole device less its
    superblock and alignment; btree, journal and allocator reserves live in it too)."""
    if not cset.caches:
        return None
    c = cset.caches[0]
    if c.nbuckets is None or c.bucket_size is None:
        return None
    return c.nbuckets * c.bucket_size.bytes


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunResult:
    label: str
    repetition: int
    seed: int
    started: float  # unix time
    fio: FioResult
    cache: CacheSample | None
    jobfile: str
    warmup_s: float | None = None
    fresh_cache: bool = False
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class TargetSummary:
    label: str
    device: str
    iops: Spread
    bw_bytes: Spread | None
    lat_mean_us: Spread | None
    lat_p50_us: Spread | None
    lat_p90_us: Spread | None
    lat_p99_us: Spread | None
    lat_p99_9_us: Spread | None
    lat_p99_99_us: Spread | None
    hit_ratio: Spread | None
    bypassed_bytes: Spread | None
    dirty_max: Spread | None
    flags: tuple[str, ...]
    expected_hit_ratio: float | None = None
    prediction: che.Prediction | None = None
    speedup_measured: float | None = None  # vs the baseline (first target), by QD1 latency
    speedup_ceiling: float | None = None


def summarize(label: str, device: str, runs: Sequence[RunResult], *,
              tolerance: float = DEFAULT_TOLERANCE) -> TargetSummary:
    """Medians over the repetitions, and flags for runs that cannot be trusted."""
    if not runs:
        raise ValueError("no runs to summarize")

    def sp(fn: Callable[[RunResult], float | None]) -> Spread | None:
        return spread([v for v in (fn(r) for r in runs) if v is not None])

    def lat(pct: float) -> Spread | None:
        return sp(lambda r: r.fio.latency.at(pct) if r.fio.latency else None)

    iops = sp(lambda r: r.fio.iops)
    assert iops is not None
    flags: list[str] = []
    for r in runs:
        flags += [f"run {r.repetition}: {f}" for f in r.flags]
    missed = [r.repetition for r in runs if r.fio.steadystate and not r.fio.steadystate.attained]
    if missed:
        flags.append("steady state not reached in run(s) " + ", ".join(map(str, missed)))
    off = disagreeing([r.fio.iops for r in runs], tolerance)
    if off:
        flags.append(f"IOPS of run(s) {', '.join(str(runs[i].repetition) for i in off)} "
                     f"differ from the median by more than {tolerance:.0%} "
                     f"(spread {iops.rel_spread:.0%})")
    errs = [r.repetition for r in runs if r.fio.error or r.fio.total_err]
    if errs:
        flags.append("IO errors in run(s) " + ", ".join(map(str, errs)))
    return TargetSummary(
        label=label, device=device, iops=iops,
        bw_bytes=sp(lambda r: r.fio.bw_bytes),
        lat_mean_us=sp(lambda r: r.fio.lat_mean_us),
        lat_p50_us=lat(50.0), lat_p90_us=lat(90.0), lat_p99_us=lat(99.0),
        lat_p99_9_us=lat(99.9), lat_p99_99_us=lat(99.99),
        hit_ratio=sp(lambda r: r.cache.hit_ratio if r.cache else None),
        bypassed_bytes=sp(lambda r: float(r.cache.bypassed_bytes)
                          if r.cache and r.cache.bypassed_bytes is not None else None),
        dirty_max=sp(lambda r: float(r.cache.dirty_max)
                     if r.cache and r.cache.dirty_max is not None else None),
        flags=tuple(flags),
    )


def run_fio(spec: JobSpec, target: Target, *, seed: int, runtime: float | None = None,
            iodepth: int | None = None, ss: bool = True, name: str | None = None,
            ios: int | None = None, timeout_extra: float = 120) -> tuple[FioResult, str]:
    """Run one fio job (through the runner) and parse it. Returns the result and job file."""
    jf = spec.jobfile(name or target.label, target.device, seed=seed, runtime=runtime,
                      iodepth=iodepth, ss=ss, ios=ios)
    rt = (runtime if runtime is not None else spec.runtime) + spec.ramp
    if ios:
        rt = 3600.0  # bounded by the count; the timeout only guards against a hang
    with tempfile.TemporaryDirectory(prefix="cachemgr-bench-") as tmp:
        path = Path(tmp) / "job.fio"
        path.write_text(jf)
        # cwd: fio may leave state files (verify, zipf tables) in its working directory
        done = runner.run(["fio", "--output-format=json", str(path)], check=False,
                          timeout=rt + timeout_extra, cwd=tmp)
    if "{" not in done.stdout:
        raise CommandError(done.argv, done.returncode, done.stderr or done.stdout)
    res = parse_fio(done.stdout)
    if done.returncode != 0 and res.error == 0:
        raise CommandError(done.argv, done.returncode, done.stderr)
    return res, jf


Progress = Callable[[str], None]


@dataclass(frozen=True)
class CompareOptions:
    repeat: int = 3
    warmup: float = 0.0  # seconds of warm-up (same job, QD >= 16) before each cache run
    warmup_ios: int | None = None  # or a number of requests; 0 with warmup_auto: from Che
    warmup_auto: bool = False  # warm up for 3x Che's characteristic time (in requests)
    fresh: bool = False  # rebuild the cache before each cache run
    settle: bool = True  # wait for bcache's stats tick after a cache run
    reset_stats: bool = False  # clear_stats before each measured cache run
    tolerance: float = DEFAULT_TOLERANCE
    force: bool = False  # write to devices that look in use or hold data
    seed: int = 1
    congestion_off: bool = True


def _cache_names(sysfs: Sysfs, backing_name: str) -> tuple[str | None, str | None]:
    b = _backing(sysfs, backing_name)
    cs = _cache_set(sysfs, b)
    cache = cs.caches[0].identity.name if cs and cs.caches else None
    return b.identity.name, cache


def short_for_hit_ratio(reads: int, prediction: che.Prediction | None) -> str | None:
    """A flag when a read run is too short for a steady hit ratio: fewer reads than 2x Che's
    characteristic time. In the lab, 5 s runs of 50,000-100,000 reads (Che's T: 70,000) read
    0.874-0.899 where 10 s runs read 0.903-0.910 (docs/benchmarks.md)."""
    if not reads or prediction is None or not math.isfinite(prediction.characteristic_requests):
        return None
    need = int(2 * prediction.characteristic_requests)
    if reads >= need:
        return None
    return (f"hit ratio from {reads:,} reads, fewer than 2x Che's characteristic time "
            f"({need:,}): not steady yet, run longer")


def warmup_requests(opts: CompareOptions, prediction: che.Prediction | None) -> int | None:
    """Requests to warm up with: as asked, or 3x Che's characteristic time (at least 10,000)
    when ``warmup_auto``; the LRU state is then close to its steady state."""
    if opts.warmup_ios:
        return opts.warmup_ios
    if opts.warmup_auto and prediction is not None and \
            math.isfinite(prediction.characteristic_requests):
        return max(10_000, int(3 * prediction.characteristic_requests))
    return None


def run_one(sysfs: Sysfs, spec: JobSpec, target: Target, rep: int, opts: CompareOptions,
            hyg: Hygiene, *, progress: Progress | None = None,
            prediction: che.Prediction | None = None) -> RunResult:
    """One measured run of ``spec`` on ``target`` (with the cache hygiene asked for)."""
    seed = opts.seed * 1000 + rep * 10 + zlib.crc32(target.label.encode()) % 10
    started = time.time()
    warm_s = None
    fresh = False
    flags: list[str] = []
    if target.backing_name is None:
        res, jf, _ = _run_sampled(sysfs, spec, target, seed, progress)
        return RunResult(target.label, rep, seed, started, res, None, jf)
    bname = target.backing_name
    if opts.fresh:
        for step in fresh_cache(sysfs, bname):
            if progress:
                progress(f"{target.label}: fresh cache: {step}")
        fresh = True
    b = _backing(sysfs, bname)
    rel = _backing_rel(sysfs, bname)
    if target.mode is not None and b.mode != target.mode:
        hyg.set(f"{b.device} cache_mode", f"{rel}/cache_mode", target.mode.value)
    cs = _cache_set(sysfs, b)
    if cs is not None and opts.congestion_off:
        for k in ("congested_read_threshold_us", "congested_write_threshold_us"):
            hyg.set(f"cache set {cs.uuid[:8]} {k}", f"fs/bcache/{cs.uuid}/{k}", "0")
    ios = warmup_requests(opts, prediction)
    if opts.warmup > 0 or ios:
        hyg.set(f"{b.device} sequential_cutoff", f"{rel}/sequential_cutoff", "0")
        what = f"{ios:,} requests" if ios else f"{opts.warmup:g} s"
        if progress:
            progress(f"{target.label}: warm-up, {what}")
        t0 = time.monotonic()
        run_fio(spec, target, seed=seed + 7, runtime=opts.warmup, ios=ios,
                iodepth=max(16, spec.iodepth), ss=False, name=f"{target.label}-warmup")
        warm_s = round(time.monotonic() - t0, 1)
        for item in list(hyg._restore):
            if item[1] == f"{rel}/sequential_cutoff":
                hyg.sysfs.write(item[1], item[2])
                hyg._restore.remove(item)
        note = f"{b.device}: warm-up of {what} with sequential_cutoff 0 before each run"
        if note not in hyg.notes:
            hyg.notes.append(note)
    if opts.settle:
        wait_accounting_tick(sysfs, bname)
    if opts.reset_stats:
        bcache.clear_stats(sysfs, _backing(sysfs, bname))
    bk_name, cache_name = _cache_names(sysfs, bname)
    before = _backing(sysfs, bname)
    names = {"dev": target.name, "backing": bk_name, "cache": cache_name}
    s0 = {k: read_block_stat(sysfs, n) if n else None for k, n in names.items()}
    res, jf, sampler = _run_sampled(sysfs, spec, target, seed, progress)
    s1 = {k: read_block_stat(sysfs, n) if n else None for k, n in names.items()}
    if opts.settle and spec.reads:
        if progress:
            progress(f"{target.label}: waiting for bcache's stats tick (up to 14 s)")
        wait_accounting_tick(sysfs, bname)
    after = _backing(sysfs, bname)
    blk = {k: (s0[k], s1[k]) for k in names}
    sample = _sample_result(sysfs, target, before, after, blk, sampler)
    if sample.kernel_counters_consistent is False:
        flags.append("bcache's own read counters disagree with the block layer (they wrap "
                     "above 65,535 events per ~13.6 s): hit ratio from block-layer counts")
    if sample.bypassed_bytes and sample.bypassed_bytes > 0:
        flags.append(f"bcache bypassed {sample.bypassed_bytes} bytes")
    if sample.cache_available_percent_min is not None and \
            sample.cache_available_percent_min < 50:
        flags.append(f"cache_available_percent fell to {sample.cache_available_percent_min}: "
                     "writeback stops caching between 40 and 70 % dirty buckets")
    short = short_for_hit_ratio(sample.reads if spec.reads else 0, prediction)
    if short:
        flags.append(short)
    return RunResult(target.label, rep, seed, started, res, sample, jf, warmup_s=warm_s,
                     fresh_cache=fresh, flags=tuple(flags))


def _progress_cb(target: Target, spec: JobSpec, progress: Progress | None
                 ) -> Callable[[float, int, int | None], None] | None:
    if progress is None:
        return None

    def cb(t: float, iops: int, dirty: int | None) -> None:
        d = f", dirty {dirty // (1 << 20)} MiB" if dirty is not None else ""
        progress(f"{target.label}: {min(t, spec.runtime + spec.ramp):.0f}/"
                 f"{spec.runtime + spec.ramp:g} s, {iops} IOPS{d}")
    return cb


def _run_sampled(sysfs: Sysfs, spec: JobSpec, target: Target, seed: int,
                 progress: Progress | None) -> tuple[FioResult, str, _Sampler]:
    assert target.name is not None
    with _Sampler(sysfs, target.name, target.backing_name, 1.0,
                  _progress_cb(target, spec, progress)) as sampler:
        res, jf = run_fio(spec, target, seed=seed)
    return res, jf, sampler


@dataclass(frozen=True)
class Comparison:
    """Everything one ``bench compare`` (or ``bench run``) measured, and how."""

    spec: JobSpec
    targets: tuple[Target, ...]
    runs: tuple[RunResult, ...]
    summaries: tuple[TargetSummary, ...]
    options: CompareOptions
    fio_version: str | None
    kernel: str
    hygiene: tuple[str, ...]
    identities: Mapping[str, Any]
    created: float
    argv: tuple[str, ...] = ()


def fio_version() -> str | None:
    try:
        return runner.run(["fio", "--version"], timeout=10).stdout.strip() or None
    except CacheMgrError:
        return None


def _identities(sysfs: Sysfs, targets: Sequence[Target]) -> dict[str, Any]:
    dirs = bcache.block_dirs(sysfs)
    out: dict[str, Any] = {}
    snap = snapshot.take(sysfs)
    for t in targets:
        entry: dict[str, Any] = {}
        if t.name and t.name in dirs:
            entry["device"] = asdict(bcache.identity(sysfs, t.name, dirs[t.name]))
        if t.backing_name:
            b = next((x for x in snap.backings if x.identity.name == t.backing_name), None)
            if b is not None:
                entry["backing"] = asdict(b.identity)
                entry["backing_uuid"] = b.uuid
                entry["mode_before"] = b.mode.value if b.mode else None
                cs = snap.cache_set(b.cset_uuid) if b.cset_uuid else None
                if cs is not None:
                    entry["cache_set"] = cs.uuid
                    entry["cache_devices"] = [asdict(c.identity) for c in cs.caches]
                    entry["bucket_size"] = cs.caches[0].bucket_size.bytes \
                        if cs.caches and cs.caches[0].bucket_size else None
                    entry["nbuckets"] = cs.caches[0].nbuckets if cs.caches else None
                    entry["cache_capacity_bytes"] = cache_capacity_bytes(cs)
        out[t.label] = entry
    return out


def region_items(spec: JobSpec, sysfs: Sysfs, target: Target) -> int | None:
    """How many IO blocks the job addresses (fio's nranges = size / bs)."""
    bs = parse_size(spec.bs)
    if spec.size:
        return parse_size(spec.size) // bs
    dirs = bcache.block_dirs(sysfs)
    if target.name and target.name in dirs:
        sectors = sysfs.read_int(f"{dirs[target.name]}/size")
        if sectors:
            off = parse_size(spec.offset) if spec.offset else 0
            return (sectors * 512 - off) // bs
    return None


def predict_for(spec: JobSpec, sysfs: Sysfs, target: Target) -> che.Prediction | None:
    """Che's LRU hit ratio for the job's Zipf reads on this cache (None when not Zipf or not a
    cache). bcache caches extents as written (4 KiB IO = 4 KiB cached), so one IO block is one
    cache item; the capacity is the whole cache device, shared by all its backing devices."""
    theta = spec.zipf_theta
    if theta is None or target.backing_name is None or not spec.rw.startswith("rand") \
            or not spec.reads:
        return None
    b = _backing(sysfs, target.backing_name)
    cs = _cache_set(sysfs, b)
    cap = cache_capacity_bytes(cs) if cs else None
    n = region_items(spec, sysfs, target)
    if cap is None or not n:
        return None
    return che.predict(n, cap / parse_size(spec.bs), theta)


def compare(sysfs: Sysfs, spec: JobSpec, target_specs: Sequence[str],
            opts: CompareOptions = CompareOptions(), *, progress: Progress | None = None,
            argv: Sequence[str] = ()) -> Comparison:
    """Run ``spec`` on every target, ``opts.repeat`` times, interleaved (A B A B ...), so
    that drifts (a filling cache, a busy host) touch every target alike."""
    spec.validate()
    if opts.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if not target_specs:
        raise UsageError("bench needs at least one TARGET")
    targets = [resolve_target(sysfs, t) for t in target_specs]
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise UsageError("two targets have the same label", hint="name them: LABEL=DEVICE")
    if spec.writes:
        snap = snapshot.take(sysfs)
        for t in targets:
            why, overridable = write_refusal(sysfs, t, snap)
            if why and (not overridable or not opts.force):
                raise UnsafeError(
                    f"refusing to run a write benchmark: {why}",
                    hint=("writing destroys the data on it; if it is a scratch device, "
                          "repeat with --force") if overridable else None)
    predictions = {t.label: predict_for(spec, sysfs, t) for t in targets}
    identities = _identities(sysfs, targets)
    hyg = Hygiene(sysfs)
    runs: list[RunResult] = []
    version = fio_version()
    try:
        for rep in range(1, opts.repeat + 1):
            for t in targets:
                if progress:
                    progress(f"run {rep}/{opts.repeat} {t.label}: {spec.describe()}")
                runs.append(run_one(sysfs, spec, t, rep, opts, hyg, progress=progress,
                                    prediction=predictions.get(t.label)))
    finally:
        hyg.restore()
    summaries = []
    for t in targets:
        s = summarize(t.label, t.device, [r for r in runs if r.label == t.label],
                      tolerance=opts.tolerance)
        p = predictions.get(t.label)
        if p is not None:
            s = replace(s, prediction=p, expected_hit_ratio=p.hit_ratio)
        summaries.append(s)
    summaries = _speedups(spec, summaries)
    return Comparison(spec=spec, targets=tuple(targets), runs=tuple(runs),
                      summaries=tuple(summaries), options=opts, fio_version=version,
                      kernel=platform.release(), hygiene=tuple(hyg.notes),
                      identities=identities, created=time.time(), argv=tuple(argv))


def _speedups(spec: JobSpec, summaries: list[TargetSummary]) -> list[TargetSummary]:
    """At QD1, the measured speed-up over the baseline (the first target) by mean latency,
    and the ceiling L_slow / (h L_fast + (1 - h) L_slow), with L_slow the baseline's mean
    latency, L_fast the fastest target's p50 and h the expected (else measured) hit ratio;
    for writes in writeback h is 1 (all absorbed unless bypassed)."""
    if not spec.qd1 or len(summaries) < 2 or summaries[0].lat_mean_us is None:
        return summaries
    slow = summaries[0].lat_mean_us.median
    fasts = [s.lat_p50_us.median for s in summaries if s.lat_p50_us is not None]
    fast = min(fasts) if fasts else None
    out = [summaries[0]]
    for s in summaries[1:]:
        measured = ratio(slow, s.lat_mean_us.median if s.lat_mean_us else None)
        h = s.expected_hit_ratio
        if h is None and s.hit_ratio is not None:
            h = s.hit_ratio.median
        if h is None and not spec.reads and s.dirty_max is not None:
            h = 1.0
        ceiling = None
        if h is not None and fast is not None and fast > 0 and slow > 0:
            ceiling = che.speedup_ceiling_qd1(h, slow, fast)
        out.append(replace(s, speedup_measured=measured, speedup_ceiling=ceiling))
    return out


# ----------------------------------------------------------------------------- JSON


def _spread_json(s: Spread | None, digits: int = 3) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"median": round(s.median, digits), "min": round(s.low, digits),
            "max": round(s.high, digits), "n": s.n, "rel_spread": round(s.rel_spread, 4)}


def _med(s: Spread | None, digits: int = 3) -> float | None:
    return round(s.median, digits) if s is not None else None


def summary_json(s: TargetSummary, base: TargetSummary | None) -> dict[str, Any]:
    return {
        "label": s.label,
        "device": s.device,
        "iops": _med(s.iops, 1),
        "bw_bytes": _med(s.bw_bytes, 0),
        "lat_mean_us": _med(s.lat_mean_us),
        "lat_p50_us": _med(s.lat_p50_us),
        "lat_p90_us": _med(s.lat_p90_us),
        "lat_p99_us": _med(s.lat_p99_us),
        "lat_p99_9_us": _med(s.lat_p99_9_us),
        "lat_p99_99_us": _med(s.lat_p99_99_us),
        "hit_ratio": _med(s.hit_ratio, 4),
        "expected_hit_ratio": round(s.expected_hit_ratio, 4)
        if s.expected_hit_ratio is not None else None,
        "bypassed_bytes": _med(s.bypassed_bytes, 0),
        "dirty_max_bytes": _med(s.dirty_max, 0),
        "iops_ratio": _r(ratio(s.iops.median, base.iops.median)) if base else None,
        "p99_ratio": _r(ratio(base.lat_p99_us.median if base and base.lat_p99_us else None,
                              s.lat_p99_us.median if s.lat_p99_us else None)) if base else None,
        "qd1_speedup": _r(s.speedup_measured),
        "qd1_speedup_ceiling": _r(s.speedup_ceiling),
        "spread": {"iops": _spread_json(s.iops, 1), "lat_p99_us": _spread_json(s.lat_p99_us),
                   "hit_ratio": _spread_json(s.hit_ratio, 4)},
        "prediction": {
            "model": "che-lru-zipf",
            "items": s.prediction.items,
            "cache_items": round(s.prediction.cache_items),
            "theta": s.prediction.theta,
            "hit_ratio": round(s.prediction.hit_ratio, 4),
            "characteristic_requests": round(s.prediction.characteristic_requests)
            if math.isfinite(s.prediction.characteristic_requests) else None,
        } if s.prediction else None,
        "flags": list(s.flags),
    }


def _r(v: float | None, digits: int = 2) -> float | None:
    return round(v, digits) if v is not None else None


def run_json(r: RunResult) -> dict[str, Any]:
    lat = r.fio.latency
    return {
        "label": r.label,
        "repetition": r.repetition,
        "seed": r.seed,
        "started": r.started,
        "iops": round(r.fio.iops, 2),
        "bw_bytes": round(r.fio.bw_bytes),
        "lat_mean_us": _r(r.fio.lat_mean_us, 3),
        "clat_percentiles_us": [[p, round(v, 3)] for p, v in lat.percentiles] if lat else [],
        "lat_p50_us": _r(lat.p50_us, 3) if lat else None,
        "lat_p99_us": _r(lat.p99_us, 3) if lat else None,
        "error": r.fio.error,
        "total_err": r.fio.total_err,
        "runtime_ms": r.fio.runtime_ms,
        "steadystate": asdict(r.fio.steadystate) if r.fio.steadystate else None,
        "fio": asdict(r.fio),
        "cache": asdict(r.cache) if r.cache else None,
        "hit_ratio": _r(r.cache.hit_ratio, 4) if r.cache else None,
        "warmup_s": r.warmup_s,
        "fresh_cache": r.fresh_cache,
        "jobfile": r.jobfile,
        "flags": list(r.flags),
    }


def to_json(c: Comparison) -> dict[str, Any]:
    """The saved and printed document: ``{"schema": 1, "results": [...], ...}``.

    ``results`` has one entry per target (medians over the repetitions) with at least
    label, iops, lat_p50_us, lat_p99_us, hit_ratio (null where unknown); ``runs`` has every
    repetition with fio's full numbers and the cache's counters.
    """
    base = c.summaries[0] if len(c.summaries) > 1 else None
    jobfile = c.runs[0].jobfile if c.runs else c.spec.jobfile("job", "DEVICE", seed=0)
    return {
        "schema": SCHEMA,
        "kind": "bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(c.created)),
        "argv": list(c.argv),
        "fio_version": c.fio_version,
        "kernel": c.kernel,
        "host": platform.node(),
        "job": asdict(c.spec),
        "job_description": c.spec.describe(),
        "jobfile": jobfile,
        "options": asdict(c.options),
        "targets": [{"label": t.label, "spec": t.spec, "device": t.device,
                     "mode": t.mode.value if t.mode else None,
                     "identity": c.identities.get(t.label)} for t in c.targets],
        "hygiene": list(c.hygiene),
        "results": [summary_json(s, base) for s in c.summaries],
        "runs": [run_json(r) for r in c.runs],
    }


def save(doc: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Write the document under ``out_dir`` as ``<time>-<job>.json`` (atomic)."""
    from cachemgr.core import state

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = doc.get("job", {})
    name = f"{stamp}-{job.get('rw', 'job')}-qd{job.get('iodepth', '')}"
    path = d / f"{name}.json"
    n = 1
    while path.exists():
        n += 1
        path = d / f"{name}-{n}.json"
    state.write_json(path, dict(doc))
    return path


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A saved result document; raises UsageError if it is not one (schema 1)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read a bench result: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or "results" not in doc:
        raise UsageError(f"{path}: not a cachemgr bench result (schema {SCHEMA})")
    return doc


# ----------------------------------------------------------------------------- text


def table(doc: Mapping[str, Any]) -> str:
    """The comparison as a table for people: medians, ratios to the first target."""
    rows = [("target", "IOPS", "x base", "p50 us", "p99 us", "p99 /", "hit", "expected",
             "flags")]
    for r in doc["results"]:
        rows.append((
            str(r["label"]),
            _fmt(r["iops"], 0),
            _fmt(r.get("iops_ratio"), 1, "x"),
            _fmt(r["lat_p50_us"], 1),
            _fmt(r["lat_p99_us"], 1),
            _fmt(r.get("p99_ratio"), 1, "x"),
            _fmt(r["hit_ratio"], 3),
            _fmt(r.get("expected_hit_ratio"), 3),
            str(len(r.get("flags", []))) if r.get("flags") else "",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    out = [f"{doc.get('job_description', '')} (median of {doc['options']['repeat']} "
           f"interleaved runs; ratios against {doc['results'][0]['label']})", *lines]
    for r in doc["results"]:
        if r.get("qd1_speedup") is not None:
            ceil = r.get("qd1_speedup_ceiling")
            out.append(f"{r['label']}: QD1 speed-up {r['qd1_speedup']:.1f}x"
                       + (f" (ceiling {ceil:.1f}x by Little's law)" if ceil else ""))
        p = r.get("prediction")
        if p:
            steady = (f"steady after ~{p['characteristic_requests']:,} requests"
                      if p.get("characteristic_requests") else "the cache holds the region")
            out.append(f"{r['label']}: expected LRU hit ratio {p['hit_ratio']:.3f} (Che, Zipf "
                       f"{p['theta']:g}, {p['cache_items']:,} of {p['items']:,} blocks cached; "
                       f"{steady})")
        for f in r.get("flags", []):
            out.append(f"{r['label']}: ! {f}")
    for h in doc.get("hygiene", []):
        out.append(f"hygiene: {h}")
    return "\n".join(out)


def _fmt(v: Any, digits: int, suffix: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{suffix}"

