"""The bench command: the same job on several targets (or modes), interleaved, saved with
plots. Job options are parsed by the faces (CLI flags, the TUI's form) into a
``bench.JobSpec`` and ``bench.CompareOptions``; running, saving and plotting happen here."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cachemgr.core import signals, undo
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import bench

JobSpec = bench.JobSpec
CompareOptions = bench.CompareOptions
CACHE_SSD = bench.CACHE_SSD  # --reference's word for each cache's own SSD (read apart)
parse_warmup = bench.parse_warmup  # "SECONDS | NUMBERios | auto", for every face


def results_dir(out: str | None = None) -> str:
    return str(out or os.environ.get("CACHEMGR_BENCH_DIR") or bench.DEFAULT_RESULTS_DIR)


def _bench_subject(sysfs: Sysfs, targets: Sequence[str], *, fresh: bool = False
                   ) -> gate.Subject:
    """Every device the targets name, as its kind where it is a cached device, else as a
    disk (a bare HDD or SSD compared beside it), and every disk its hygiene changes: the
    whole disks whose IO scheduler it sets (``DEVICE@SCHEDULER``: the disk under a bcache
    or dm device) and, with ``fresh``, the cache SSD it formats again. A malformed target
    is left to the bench's own parser, which says what is wrong with it."""
    from cachemgr.ops import cache as cache_ops
    from cachemgr.procedures import kinds
    from cachemgr.procedures.bench import targets as targets_mod

    snap = cache_ops.status(sysfs)
    subject = gate.Subject("the benchmark's targets", ())
    for text in targets:
        try:
            rest, scheduler = targets_mod.split_scheduler(text)
            _, dev, _ = targets_mod.parse_target(rest)
        except CacheMgrError:
            continue
        k = kinds.find(snap, dev, sysfs)
        subject = subject + (gate.of_kind(k) if k is not None else gate.of_disks([dev]))
        name = os.path.basename(k.node if k is not None else os.path.realpath(dev))
        if scheduler is not None:
            try:
                disks, _ = targets_mod.scheduler_disks(sysfs, name)
            except CacheMgrError:
                disks = ()  # the bench refuses it with its own words
            subject = subject + gate.of_disks([f"/dev/{d}" for d in disks])
        if fresh:  # hygiene.fresh_cache: the bcache device's cache set, formatted again
            for b in snap.backings:
                c = snap.cache_set(b.cset_uuid) if b.cset_uuid else None
                if c is not None and name in (b.device_name, b.identity.name):
                    subject = subject + gate.of_disks([x.identity.node for x in c.caches])
    return subject


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
    # the gate, for the whole comparison: its hygiene switches modes, thresholds and
    # schedulers of the targets (and formats their cache SSDs again with --fresh), and puts
    # them back at the end
    subject = _bench_subject(sysfs, targets, fresh=opts.fresh)
    # what its hygiene changes is journaled before each change (core/undo.py): a session
    # lost mid-run leaves nothing changed that status does not show and the next command
    # on the device does not put back; SIGTERM and SIGHUP (a closed terminal) put it back
    # as Ctrl-C does
    with signals.terminate_as_interrupt(), gate.gate(subject, "bench"), \
            undo.recording("bench", ", ".join(targets), subject.keys, sysfs):
        c = bench.compare(sysfs, spec, list(targets), opts, progress=ctl.report,
                          argv=list(argv))
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
    res.failed = any(r.get("error") or r.get("total_err")
                     for r in [*doc["runs"], *doc.get("reference_runs", [])])
    return res


def table(doc: Mapping[str, Any]) -> str:
    """The comparison table of a result document, as ``bench compare`` prints it."""
    return bench.table(doc)


def latest(out: str | None = None) -> tuple[dict[str, Any], Path] | None:
    """The newest saved result under the results directory, or None; explained as a new
    one is (a result saved before the explanation existed gets it)."""
    d = Path(results_dir(out))
    files = sorted(d.glob("**/*.json"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    if not files:
        return None
    return bench.with_explanations(bench.load(files[-1])), files[-1]


def replay(sysfs: Sysfs, target: str, trace_path: str, *, device: str | None = None,
           iodepth: int = 1, force: bool = False, ctl: Control | None = None,
           out: str | None = None, save: bool = True, argv: Sequence[str] = ()) -> Result:
    """``bench replay``: the recorded requests of one traced device, in order, on ``target``
    (fio read_iolog), measured like any bench run; for a bcache target, next to the hit ratio
    ``cachemgr size`` predicts for its cache from the same requests."""
    import dataclasses
    import tempfile

    from cachemgr.core.errors import UsageError
    from cachemgr.procedures import sizing
    from cachemgr.procedures import trace as tr
    from cachemgr.procedures.bench.sampling import cache_capacity_bytes

    ctl = ctl or Control(what=f"bench replay {target}")
    trace = tr.read(trace_path)
    devs = trace.header.devices
    if device is None and len(devs) != 1:
        raise UsageError("the trace holds several devices: name one with --device",
                         hint="it has " + ", ".join(d.path for d in devs))
    picked = devs if device is None else trace.header.named(device)
    if not picked:
        raise UsageError(f"the trace has no device {device!r}")
    dev = picked[0]
    t = bench.resolve_target(sysfs, target)
    if t.name is None:
        raise UsageError(f"{target}: no kernel name")
    from cachemgr.backends import bcache as bcache_backend
    from cachemgr.backends import snapshot

    rel = bcache_backend.block_dirs(sysfs).get(t.name)
    size = (sysfs.read_int(f"{rel}/size") or 0) * 512 if rel else 0
    with tempfile.TemporaryDirectory(prefix="cachemgr-replay-") as tmp:
        log = tr.write_iolog(trace, dev.index, f"{tmp}/replay.iolog")
        if log.requests == 0:
            raise UsageError(f"the trace has no requests of {dev.path}")
        if size and log.end > size:
            raise UsageError(f"{target} is smaller ({size} bytes) than the recorded requests "
                             f"reach ({log.end} bytes)")
        spec = bench.JobSpec(rw="randrw" if log.writes else "randread", iolog=log.path,
                             iodepth=iodepth, distribution="random",
                             runtime=max(60.0, log.requests / 100))
        opts = bench.CompareOptions(repeat=1, force=force)
        res = compare(sysfs, spec, [target], opts, ctl=ctl, out=out, save=save, plots=False,
                      argv=argv)
    assert res.data is not None
    # the prediction for the requests as replayed: a sampled trace is replayed as it is
    # (a scaled-down workload), so it is analysed as a full one
    full = dataclasses.replace(trace, header=dataclasses.replace(trace.header, rate=1.0),
                               trailer=None)
    snap = snapshot.take(sysfs)
    cap = None
    if t.backing_name is not None:
        b = next((x for x in snap.backings if x.identity.name == t.backing_name), None)
        cs = snap.cache_set(b.cset_uuid) if b is not None and b.cset_uuid else None
        cap = cache_capacity_bytes(cs) if cs is not None else None
    hist = sizing.histogram(full, devices=[dev.index])
    measured = res.data["results"][0].get("hit_ratio")
    rep: dict[str, Any] = {"trace": trace_path, "device": dev.path, "rate": trace.header.rate,
                           "requests": log.requests, "reads": log.reads, "writes": log.writes,
                           "cache_bytes": cap, "measured_read_hit_ratio": measured}
    if cap:
        pred = hist.hit_ratio(cap, 0)
        rep["predicted_read_hit_ratio"] = None if pred is None else round(pred, 4)
        if pred is not None and measured is not None:
            rep["difference"] = round(measured - pred, 4)
    res.data["replay"] = rep
    res.lines.append(
        f"replayed {log.requests:,} requests of {dev.path} on {target}: read hit ratio "
        f"{measured if measured is not None else '?'} measured, "
        f"{rep.get('predicted_read_hit_ratio', '?')} predicted for a "
        f"{cap if cap else '?'}-byte cache")
    if trace.header.rate < 1:
        res.notes.append(f"the trace is sampled at {trace.header.rate:g}: the replay is a "
                         f"scaled-down workload (a cache of C behaves for the full one like "
                         f"a cache of C / {trace.header.rate:g})")
    return res

