"""The runs and their orchestration: one measured run with the hygiene asked for
(:func:`run_one`: warm-up, fresh cache, settle, sampling, flags), the medians and flags over
repetitions (:func:`summarize`), Che's prediction for a target, and :func:`compare`, which
runs every target interleaved (A B A B ...) and computes the QD1 speed-ups."""

from __future__ import annotations

import math
import platform
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cachemgr.backends import bcache, snapshot
from cachemgr.core import checks
from cachemgr.core.defaults import DEFAULT_TOLERANCE as DEFAULT_TOLERANCE
from cachemgr.core.errors import UnsafeError, UsageError
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import che
from cachemgr.procedures.bench import reference
from cachemgr.procedures.bench.fio import FioResult, fio_version, run_fio
from cachemgr.procedures.bench.hygiene import Hygiene, _backing_rel, fresh_cache
from cachemgr.procedures.bench.job import JobSpec, parse_size
from cachemgr.procedures.bench.sampling import (
    CacheSample,
    _backing,
    _cache_set,
    _sample_result,
    _Sampler,
    cache_capacity_bytes,
    read_block_stat,
    wait_accounting_tick,
)
from cachemgr.procedures.bench.stats import Spread, disagreeing, ratio, spread
from cachemgr.procedures.bench.targets import (
    Target,
    resolve_target,
    scheduler_disks,
    write_refusal,
)

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
    # the bare reference device (a cache's own kind of SSD) measured in the same comparison
    reference: TargetSummary | None = None
    # a reference measured apart (reference.py): what it is ("cache SSD") and the job it ran
    # ("randread"); None for targets
    role: str | None = None
    rw: str | None = None


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
    # seconds between two samples of the cache while fio runs (dirty data, free space,
    # progress); 0: none
    sample_interval: float = 1.0
    # (cache target label or "*" for every other target, REF): each cache's IOPS and latency
    # as a fraction of REF's. REF is a target's label (it runs the job), or "cache-ssd" (each
    # cache target's own SSD) or a device path: measured apart, read-only (reference.py)
    reference: tuple[tuple[str, str], ...] = ()

    def validate(self) -> None:
        """Refuse (UsageError, exit 2) counts and durations that are not finite or out of
        range (a nan warm-up or tolerance compares false with every bound)."""
        checks.count(self.repeat, "--repeat")
        checks.seconds_or_zero(self.warmup, "--warmup")
        if self.warmup_ios is not None:
            checks.count(self.warmup_ios, "--warmup", minimum=0)
        checks.number(self.tolerance, "--tolerance", minimum=0)
        checks.count(self.seed, "--seed", minimum=0)
        checks.seconds_or_zero(self.sample_interval, "--sample-interval")


# a warm-up of more requests than this is a typo (a 1e999 or a day's worth at 1M IOPS)
MAX_WARMUP_IOS = 10**11


def parse_warmup(text: str | None) -> tuple[float, int | None, bool]:
    """``--warmup SPEC`` -> (seconds, requests or None, auto): ``SECONDS`` (``30``, ``30s``),
    ``NUMBERios`` (``300000ios``, ``300kios``, ``1.5mios``) or ``auto`` (3x Che's
    characteristic time); empty: none. UsageError (exit 2) for anything else, and for
    numbers that are negative, not finite (``nan``, ``inf``, ``1e999``) or absurd."""
    raw = (text or "").strip()
    w = raw.lower()
    hint = "SECONDS, NUMBERios (e.g. 300000ios) or auto"
    if not w:
        return 0.0, None, False
    checks.plain_text(raw, "--warmup")
    if w == "auto":
        return 0.0, None, True
    if w.endswith("ios"):
        num, scale = w[:-3], 1
        if num[-1:] in ("k", "m"):
            num, scale = num[:-1], 1000 if num[-1] == "k" else 1000_000
        n, why = checks.number_problem(num, minimum=0)
        if why is not None or n is None or n * scale > MAX_WARMUP_IOS:
            raise UsageError(f"bad --warmup {raw!r}: the number of requests "
                             f"{why or f'must be at most {MAX_WARMUP_IOS:.0e}'}", hint=hint)
        return 0.0, int(n * scale), False
    n, why = checks.number_problem(w.removesuffix("s"), minimum=0)
    if why is not None or n is None:
        raise UsageError(f"bad --warmup {raw!r}: the seconds {why}", hint=hint)
    return float(n), None, False


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
    if target.scheduler is not None:
        for disk in target.scheduler_disks:
            hyg.scheduler(disk, target.scheduler)
    if target.backing_name is None:
        res, jf, _ = _run_sampled(sysfs, spec, target, seed, progress, opts.sample_interval)
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
    caching = (target.mode or b.mode) != CacheMode.NONE
    if not caching and (opts.warmup > 0 or ios):
        # mode none caches nothing: a warm-up would only cost its time (the bare disk under
        # a bcache device, /dev/bcache0:none, is the usual baseline)
        note = f"{target.label}: no warm-up in mode none (it caches nothing)"
        if note not in hyg.notes:
            hyg.notes.append(note)
    elif opts.warmup > 0 or ios:
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
    res, jf, sampler = _run_sampled(sysfs, spec, target, seed, progress, opts.sample_interval)
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
    if caching and sample.bypassed_bytes and sample.bypassed_bytes > 0:
        # (in mode none every request bypasses the cache: that is the mode, not a flag)
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
                 progress: Progress | None, interval: float = 1.0
                 ) -> tuple[FioResult, str, _Sampler]:
    assert target.name is not None
    with _Sampler(sysfs, target.name, target.backing_name, interval,
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
    # the references measured apart (``--reference cache-ssd`` or a path), read-only, and
    # their runs (one per repetition); ``of`` their targets' labels
    references: tuple[TargetSummary, ...] = ()
    reference_runs: tuple[RunResult, ...] = ()
    reference_of: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


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
            or not spec.reads or target.mode == CacheMode.NONE:
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
    check_references(opts.reference, labels)
    apart = reference.plan(sysfs, snapshot.take(sysfs), targets, opts.reference)
    ref_spec = reference.reference_spec(spec) if apart else None
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
    for t in targets:
        if t.scheduler is not None and t.name is not None:
            note = scheduler_disks(sysfs, t.name)[1]
            if note and note not in hyg.notes:
                hyg.notes.append(note)
    runs: list[RunResult] = []
    ref_runs: list[RunResult] = []
    version = fio_version()
    try:
        # every target's scheduler once before the first run: a name the kernel cannot load
        # fails now, not after minutes of runs (Hygiene puts the originals back)
        for t in targets:
            if t.scheduler is not None:
                if progress:
                    progress(f"{t.label}: IO scheduler {t.scheduler} on "
                             f"{', '.join(t.scheduler_disks)}")
                for disk in t.scheduler_disks:
                    hyg.scheduler(disk, t.scheduler)
        for rep in range(1, opts.repeat + 1):
            for t in targets:
                if progress:
                    progress(f"run {rep}/{opts.repeat} {t.label}: {spec.describe()}")
                runs.append(run_one(sysfs, spec, t, rep, opts, hyg, progress=progress,
                                    prediction=predictions.get(t.label)))
            for a in apart:
                assert ref_spec is not None
                if progress:
                    progress(f"run {rep}/{opts.repeat} {a.role} {a.target.device} (reads "
                             f"only, for reference): {ref_spec.describe()}")
                ref_runs.append(run_reference(ref_spec, a.target, rep, opts))
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
    summaries = with_references(_speedups(spec, summaries), opts.reference)
    refs = [replace(summarize(a.target.label, a.target.device,
                              [r for r in ref_runs if r.label == a.target.label],
                              tolerance=opts.tolerance), role=a.role, rw=ref_spec.rw)
            for a in apart if ref_spec is not None]
    of = {a.target.label: a.of for a in apart}
    summaries = with_apart_references(summaries, refs, of)
    return Comparison(spec=spec, targets=tuple(targets), runs=tuple(runs),
                      summaries=tuple(summaries), options=opts, fio_version=version,
                      kernel=platform.release(), hygiene=tuple(hyg.notes),
                      identities=identities, created=time.time(), argv=tuple(argv),
                      references=tuple(refs), reference_runs=tuple(ref_runs),
                      reference_of=of)


def run_reference(spec: JobSpec, target: Target, rep: int, opts: CompareOptions) -> RunResult:
    """One read-only run of a reference measured apart (``spec`` from
    :func:`~cachemgr.procedures.bench.reference.reference_spec`: fio --readonly)."""
    assert not spec.writes and spec.readonly
    seed = opts.seed * 1000 + rep * 10 + zlib.crc32(target.label.encode()) % 10
    started = time.time()
    res, jf = run_fio(spec, target, seed=seed)
    return RunResult(target.label, rep, seed, started, res, None, jf)


def with_apart_references(summaries: list[TargetSummary], refs: Sequence[TargetSummary],
                          of: Mapping[str, tuple[str, ...]]) -> list[TargetSummary]:
    """Each target named by a reference measured apart gets its summary (a reference that is
    a target, given by label, is kept where both name one)."""
    by_target = {label: r for r in refs for label in of.get(r.label, ())}
    return [replace(s, reference=by_target[s.label])
            if s.reference is None and s.label in by_target else s for s in summaries]


def parse_reference(text: str) -> tuple[str, str]:
    """``--reference [CACHE=]REF``: (cache label or "*", reference label)."""
    checks.plain_text(text, "--reference")
    cache, sep, ref = text.partition("=")
    if not sep:
        cache, ref = "*", text
    if not cache or not ref:
        raise UsageError(f"bad --reference {text!r}", hint="REF or CACHE=REF (target labels)")
    return cache, ref


def check_references(refs: Sequence[tuple[str, str]], labels: Sequence[str]) -> None:
    """Refuse (UsageError, exit 2) a reference naming no target (nor ``cache-ssd`` nor a
    device path), or a target its own."""
    for cache, ref in refs:
        for what in (*([] if ref in labels or reference.is_apart(ref) else [ref]),
                     *([] if cache == "*" else [cache])):
            if what not in labels:
                raise UsageError(f"--reference names {what!r}, which is no target label",
                                 hint="labels: " + ", ".join(labels) + f"; or {reference.CACHE_SSD}"
                                      " (each cache's own SSD) or a device path, measured "
                                      "apart, read-only")
        if cache == ref:
            raise UsageError(f"--reference {cache}={ref}: a target is not its own reference")


def reference_of(label: str, refs: Sequence[tuple[str, str]]) -> str | None:
    """The reference label of target ``label`` (its own entry first, else ``*``)."""
    own = next((r for c, r in refs if c == label), None)
    if own is None:
        own = next((r for c, r in refs if c == "*"), None)
    return own if own != label else None


def with_references(summaries: list[TargetSummary], refs: Sequence[tuple[str, str]]
                    ) -> list[TargetSummary]:
    """Each summary with its reference's summary attached (report: fraction of its IOPS)."""
    by = {s.label: s for s in summaries}
    refd = {r for _, r in refs}
    out = []
    for s in summaries:
        ref = reference_of(s.label, refs)
        named = any(c == s.label for c, _ in refs)
        if ref is not None and ref in by and s.label not in refd and (
                named or s is not summaries[0]):  # the baseline (the HDD) only when named
            s = replace(s, reference=by[ref])
        out.append(s)
    return out


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
