"""The bench command: the same job on several targets (or modes), interleaved, saved with
plots. Job options are parsed by the faces (CLI flags, the TUI's form) into a
``bench.JobSpec`` and ``bench.CompareOptions``; running, saving and plotting happen here."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import bench

JobSpec = bench.JobSpec
CompareOptions = bench.CompareOptions
parse_warmup = bench.parse_warmup  # "SECONDS | NUMBERios | auto", for every face


def results_dir(out: str | None = None) -> str:
    return str(out or os.environ.get("CACHEMGR_BENCH_DIR") or bench.DEFAULT_RESULTS_DIR)


def compare(sysfs: Sysfs, spec: bench.JobSpec, targets: Sequence[str],
            opts: bench.CompareOptions, *, ctl: Control | None = None, out: str | None = None,
            save: bool = True, plots: bool = True, argv: Sequence[str] = ()) -> Result:
    """Run ``spec`` on every target ``opts.repeat`` times, interleaved; save the result
    document (and its plots) under ``out``. ``Result.data`` is the document (schema 1);
    ``failed`` when a run reported errors."""
    if not targets:
        from cachemgr.core.errors import UsageError

        raise UsageError("bench needs at least one TARGET")
    ctl = ctl or Control(what=f"bench {' '.join(targets)}")
    spec.validate()
    opts.validate()
    c = bench.compare(sysfs, spec, list(targets), opts, progress=ctl.report, argv=list(argv))
    doc = bench.to_json(c)
    res = Result(data=doc)
    if save:
        path = bench.save(doc, results_dir(out))
        saved = [str(path)]
        if plots:
            try:
                from cachemgr.procedures import plot
            except ImportError as exc:  # the plotting dependency is optional at run time
                res.notes.append(f"bench: no plots ({exc})")
            else:
                saved += [str(p) for p in plot.write_plots(doc, path.parent, stem=path.stem)]
        doc["saved"] = saved
    res.lines = [bench.table(doc), *(f"saved: {p}" for p in doc.get("saved", []))]
    res.failed = any(r.get("error") or r.get("total_err") for r in doc["runs"])
    return res


def table(doc: Mapping[str, Any]) -> str:
    """The comparison table of a result document, as ``bench compare`` prints it."""
    return bench.table(doc)


def latest(out: str | None = None) -> tuple[dict[str, Any], Path] | None:
    """The newest saved result under the results directory, or None."""
    d = Path(results_dir(out))
    files = sorted(d.glob("**/*.json"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    if not files:
        return None
    return bench.load(files[-1]), files[-1]
