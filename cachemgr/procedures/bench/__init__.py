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

The package, along its seams (each name below is also available here, as ``bench.X``):

* :mod:`~cachemgr.procedures.bench.job`: :class:`JobSpec`, its validation and fio job file,
  job sizes;
* :mod:`~cachemgr.procedures.bench.fio`: running fio, :func:`parse_fio` and fio's JSON types;
* :mod:`~cachemgr.procedures.bench.targets`: ``[LABEL=]DEVICE[:MODE]`` -> :class:`Target`,
  the write refusals;
* :mod:`~cachemgr.procedures.bench.sampling`: block-layer and bcache counters sampled around
  and during a run, hit ratios, the cache's capacity;
* :mod:`~cachemgr.procedures.bench.hygiene`: tunables set and restored, a fresh cache set;
* :mod:`~cachemgr.procedures.bench.stats`: medians, spreads, ratios over repetitions;
* :mod:`~cachemgr.procedures.bench.comparison`: one measured run, the summaries, the
  interleaved :func:`compare`;
* :mod:`~cachemgr.procedures.bench.reference`: references measured apart, read-only
  (``--reference cache-ssd``: a cache's own SSD; a device path);
* :mod:`~cachemgr.procedures.bench.explain`: why a cache is no faster than the bare disk
  (its SSD is no faster, its mode, its hit ratio, bcache's bypass);
* :mod:`~cachemgr.procedures.bench.report`: the result document, save/load, the table.
"""

from __future__ import annotations

from cachemgr.backends.blockdev import BlockStat
from cachemgr.procedures.bench.comparison import (
    DEFAULT_TOLERANCE,
    CompareOptions,
    Comparison,
    Progress,
    RunResult,
    TargetSummary,
    compare,
    parse_reference,
    parse_warmup,
    predict_for,
    region_items,
    run_one,
    short_for_hit_ratio,
    summarize,
    warmup_requests,
)
from cachemgr.procedures.bench.explain import NO_GAIN, explanation
from cachemgr.procedures.bench.fio import (
    DirStats,
    FioFormatError,
    FioResult,
    Latency,
    SteadyState,
    fio_version,
    parse_fio,
    run_fio,
)
from cachemgr.procedures.bench.hygiene import (
    Hygiene,
    fresh_cache,
)
from cachemgr.procedures.bench.job import (
    PERCENTILES,
    RW_MODES,
    JobSpec,
    fio_size,
    parse_size,
)
from cachemgr.procedures.bench.reference import CACHE_SSD, reference_spec
from cachemgr.procedures.bench.report import (
    DEFAULT_RESULTS_DIR,
    SCHEMA,
    load,
    run_json,
    save,
    summary_json,
    table,
    to_json,
    with_explanations,
)
from cachemgr.procedures.bench.sampling import (
    CacheSample,
    cache_capacity_bytes,
    counted_served,
    read_block_stat,
    wait_accounting_tick,
)
from cachemgr.procedures.bench.stats import (
    Spread,
    disagreeing,
    ratio,
    spread,
)
from cachemgr.procedures.bench.targets import (
    Target,
    parse_target,
    resolve_target,
    scheduler_disks,
    split_scheduler,
    write_refusal,
)

__all__ = [
    "CACHE_SSD",
    "DEFAULT_RESULTS_DIR",
    "DEFAULT_TOLERANCE",
    "NO_GAIN",
    "PERCENTILES",
    "RW_MODES",
    "SCHEMA",
    "BlockStat",
    "CacheSample",
    "CompareOptions",
    "Comparison",
    "DirStats",
    "FioFormatError",
    "FioResult",
    "Hygiene",
    "JobSpec",
    "Latency",
    "Progress",
    "RunResult",
    "Spread",
    "SteadyState",
    "Target",
    "TargetSummary",
    "cache_capacity_bytes",
    "compare",
    "counted_served",
    "disagreeing",
    "explanation",
    "fio_size",
    "fio_version",
    "fresh_cache",
    "load",
    "parse_fio",
    "parse_reference",
    "parse_size",
    "parse_target",
    "parse_warmup",
    "predict_for",
    "ratio",
    "read_block_stat",
    "reference_spec",
    "region_items",
    "resolve_target",
    "run_fio",
    "run_json",
    "run_one",
    "save",
    "scheduler_disks",
    "short_for_hit_ratio",
    "split_scheduler",
    "spread",
    "summarize",
    "summary_json",
    "table",
    "to_json",
    "wait_accounting_tick",
    "warmup_requests",
    "with_explanations",
    "write_refusal",
]
