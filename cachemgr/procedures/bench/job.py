"""fio jobs: :class:`JobSpec` (a few parameters), its validation, the fio job file and
options it becomes, and job sizes (``4k``, ``256M``) as bytes and as fio reads them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from cachemgr.core import checks
from cachemgr.core.defaults import RW_MODES as RW_MODES
from cachemgr.core.errors import UsageError
from cachemgr.core.model import parse_size as _parse_size

# fio's percentile list, extended at both ends for the latency plot
PERCENTILES = (1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0,
               99.5, 99.9, 99.95, 99.99)
# fio's random_distribution: a name and its numbers (zipf:1.2, zoned:60/10:30/20, normal:5:10)
_DISTRIBUTION = re.compile(r"[a-z_]+(:[0-9A-Za-z.:/%,]+)?")
_OPTION = re.compile(r"[a-z][a-z0-9_]*")  # a fio option's name (and an ioengine's)


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
    # replay: a fio iolog (version 2) of recorded requests instead of a pattern; every
    # request goes to the target (replay_redirect); rw says only whether it reads/writes
    iolog: str | None = None
    # run fio with --readonly (its own guard: it refuses to issue a write or a trim; a
    # command-line option, not a job option): references measured apart, e.g. a cache's SSD
    readonly: bool = False

    def validate(self) -> None:
        """Refuse (UsageError, exit 2) what fio would misread or what would add lines to the
        job file: every string is checked for control characters (a newline in
        ``--distribution`` would add e.g. ``exec_prerun=``, a shell command), and every
        number is finite and in range (``nan`` compares false with every bound)."""
        for what, text in (("--rw", self.rw), ("--bs", self.bs),
                           ("--distribution", self.distribution), ("--size", self.size),
                           ("--offset", self.offset), ("--steadystate", self.steadystate),
                           ("ioengine", self.ioengine), ("iolog", self.iolog)):
            if text is not None:
                checks.plain_text(text, what)
        if self.rw not in RW_MODES:
            raise UsageError(f"unknown --rw {self.rw!r}", hint="one of " + ", ".join(RW_MODES))
        if self.readonly and self.writes:
            raise UsageError(f"a read-only job cannot be {self.rw}")
        if parse_size(self.bs) == 0:
            raise UsageError("bad --bs '0': a block size is at least one byte",
                             hint="e.g. --bs 4k")
        if self.size is not None:
            parse_size(self.size)
        if self.offset is not None:
            parse_size(self.offset)
        if not _DISTRIBUTION.fullmatch(self.distribution):
            raise UsageError(f"bad --distribution {self.distribution!r}",
                             hint="fio's random_distribution: zipf:1.2, pareto:0.9, normal:5, "
                                  "random, zoned:60/10:30/20:8/30:2/40")
        if not _OPTION.fullmatch(self.ioengine):
            raise UsageError(f"bad ioengine {self.ioengine!r}")
        for k, v in self.extra:
            if not _OPTION.fullmatch(k):
                raise UsageError(f"bad fio option name {k!r}")
            checks.plain_text(v, f"fio option {k}")
        checks.count(self.iodepth, "--iodepth")
        checks.count(self.numjobs, "--jobs")
        checks.seconds(self.runtime, "--runtime")
        checks.seconds_or_zero(self.ramp, "--ramp")
        checks.count(self.rwmixread, "--rwmixread", minimum=0, maximum=100)
        if self.ss_dur is not None:
            checks.seconds(self.ss_dur, "--ss-dur")
        if self.ss_ramp is not None:
            checks.seconds_or_zero(self.ss_ramp, "--ss-ramp")
        if self.rate_iops is not None:
            checks.count(self.rate_iops, "--rate-iops")
        theta = self.zipf_theta
        if theta is not None and (not math.isfinite(theta) or theta <= 0 or theta == 1.0):
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
        if self.iolog:
            return [("read_iolog", self.iolog), ("replay_redirect", filename),
                    ("direct", "1"), ("ioengine", self.ioengine),
                    ("iodepth", str(iodepth or self.iodepth)), ("group_reporting", "1"),
                    ("percentile_list", ":".join(f"{p:g}" for p in PERCENTILES)),
                    *self.extra]
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
        self.validate()
        lines = [f"[{_jobname(name)}]"]
        if self.readonly:
            lines.insert(0, "; run with fio --readonly: no write or trim can be issued")
        for k, v in self.options(filename, seed=seed, runtime=runtime, iodepth=iodepth, ss=ss,
                                 ios=ios):
            # the last guard: one option per line, whatever it came from (the device too)
            checks.plain_text(v, "the target" if k == "filename" else f"fio option {k}")
            lines.append(f"{k}={v}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        if self.iolog:
            return f"replay of a recorded trace, QD{self.iodepth}"
        d = self.distribution if self.rw.startswith("rand") else "sequential"
        return (f"{self.rw} {self.bs} QD{self.iodepth}"
                f"{f' x{self.numjobs} jobs' if self.numjobs > 1 else ''} {d}, "
                f"{self.runtime:g} s")


def _secs(v: float) -> str:
    return f"{int(v)}s" if float(v).is_integer() else f"{int(v * 1000)}ms"


def _jobname(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "job"
