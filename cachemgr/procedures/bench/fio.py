"""Running fio and reading its output: :func:`run_fio` (one job through the runner, JSON
output), :func:`parse_fio` and the frozen dataclasses of fio's JSON (:class:`FioResult`,
:class:`DirStats`, :class:`Latency`, :class:`SteadyState`), :class:`FioFormatError` naming a
missing or malformed field, and :func:`fio_version`."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError, CommandError
from cachemgr.procedures.bench.job import JobSpec
from cachemgr.procedures.bench.targets import Target


class FioFormatError(CacheMgrError):
    """fio's JSON output lacked a field or had one of the wrong type; names the field."""

    def __init__(self, field_path: str, problem: str = "missing") -> None:
        super().__init__(f"fio JSON output: {field_path} is {problem}",
                         hint="is this fio's --output-format=json output (fio >= 3.x)?")
        self.field_path = field_path
        self.problem = problem


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
        # cancellable: an operation cancelled (the TUI's Cancel, q, a closed terminal) stops
        # fio at once, and the hygiene puts the cache's settings back without waiting
        done = runner.run(["fio", "--output-format=json",
                           *(["--readonly"] if spec.readonly else []), str(path)],
                          check=False, timeout=rt + timeout_extra, cwd=tmp, cancellable=True)
    if "{" not in done.stdout:
        raise CommandError(done.argv, done.returncode, done.stderr or done.stdout)
    res = parse_fio(done.stdout)
    if done.returncode != 0 and res.error == 0:
        raise CommandError(done.argv, done.returncode, done.stderr)
    return res, jf


def fio_version() -> str | None:
    try:
        return runner.run(["fio", "--version"], timeout=10).stdout.strip() or None
    except CacheMgrError:
        return None
