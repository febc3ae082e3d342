"""``cachemgr scrub TARGET [--max-latency MS]``: compare what a cache serves with what its
origin holds over the blocks it caches (procedures/scrub.py), and drop every block that
differs from the cache (issue #42 item 4; docs/admin-guide.md, "Scrubbing a cache").

Order:

1. the refusals, changing nothing: what the kind cannot do (exit 2: a writecache, a bcache
   device with no cache), a writeback cache or dirty data (exit 3: a dirty block differs
   from its origin by design, and the cache holds the only copy of it; drain it first), a
   dm-cache in passthrough (exit 4: it serves nothing from its cache), the locks and the
   journals of other procedures (exit 3);
2. under the gate (no other cachemgr command changes the device while it compares):
   the comparison, paced; the refusals checked again on the device read after it (a mode
   switched behind cachemgr's back meanwhile: the result is not trusted, exit 3);
3. with mismatches: the result recorded (``scrub/KEY.json``: status, check and the metrics
   read it), then the "invalidation pending" record of ops/coherence.py (a power cut from
   here on leaves a device whose copies the next boot or arrival drops, all of them), the
   kind's drop of the mismatched blocks (dm-cache: those blocks alone; bcache: every copy
   of the device), the pending record removed and the result recorded as dropped.

The command line asks nothing: a scrub changes nothing but the cache's copies that are
wrong. A face that asks (the TUI's ``v``) is shown :func:`plan` after the refusals and
before the gate.

``cachemgr scrub --all`` (:func:`scrub_all`, the pass cachemgr-scrub.timer runs weekly):
the same command over every write-through or clean cache on the host, or over those the
policy's ``[scrub]`` table names, one after the other, paced (``max_latency_ms``, 20 ms
unless it says otherwise).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from cachemgr.core import pace
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError, require_root
from cachemgr.core.model import CacheMode, human
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import coherence as coherence_ops
from cachemgr.ops import gate as gate_mod
from cachemgr.ops.control import Control, Plan, Result
from cachemgr.procedures import coherence, kinds, policy
from cachemgr.procedures import scrub as scrub_mod
from cachemgr.procedures.kinds.base import pacing_words


def refusal(dev: kinds.Kind) -> UnsafeError | None:
    """Why it is not scrubbed as it stands (exit 3): writeback, or dirty data (or dirty
    data of an amount the kernel does not report)."""
    return coherence_ops.dirty_refusal(
        dev, "a scrub compares a write-through or clean cache only (a dirty block differs "
             "from its origin by design, and the cache holds its only copy); nothing was "
             "read or changed", "scrub")


def _check(dev: kinds.Kind) -> None:
    err = dev.refusal("scrub")
    if err is not None:
        raise err
    if not dev.can("scrub"):
        raise UsageError(f"{dev.node} has no cache attached: nothing to scrub")
    err = refusal(dev)
    if err is not None:
        raise err
    if dev.mode == CacheMode.PASSTHROUGH:
        raise AlreadyError(f"{dev.node} is in passthrough: every read goes to its origin, "
                           "the cache serves nothing to compare")


def scrub(sysfs: Sysfs, target: str, *, max_latency_ms: float | None = None,
          ctl: Control | None = None) -> Result:
    """Compare and drop the mismatches (the module docstring)."""
    from cachemgr.backends import blockdev
    from cachemgr.ops import cache as cache_ops

    if max_latency_ms is not None:
        max_latency_ms = pace.check_max_latency(max_latency_ms)
    ctl = ctl if ctl is not None else Control(what=f"scrub of {target}")
    snap = cache_ops.status(sysfs, probe_unregistered=False)
    dev = kinds.resolve(snap, target, sysfs)
    _check(dev)
    require_root("reading a cache's device and its origin")
    ctl.ask(plan(dev, max_latency_ms))  # a face's question (the TUI's); the CLI asks none
    subject = gate_mod.of_kind(dev)
    key = coherence_ops.key_of(dev)
    changes = []
    with gate_mod.gate(subject, "scrub"):
        _, dev = cache_ops._again(sysfs, target)
        _check(dev)
        src = dev.scrub_source(sysfs)
        ctl.note(f"scrub {dev.node}: comparing {src.how}, {human(src.total_bytes)}, with "
                 f"{src.origin}" + (f" (from byte {src.origin_offset})"
                                    if src.origin_offset else "")
                 + (f", paced under p99 {max_latency_ms:g} ms of the other IO"
                    if max_latency_ms is not None else ""))
        counters, _ = blockdev.pace_sources(sysfs, src.meter, None)
        got = scrub_mod.compare(src, counters=counters, max_latency_ms=max_latency_ms,
                                progress=ctl.report)
        _, after = cache_ops._again(sysfs, target)
        err = refusal(after)
        if err is not None:  # switched behind cachemgr's back while it compared
            raise UnsafeError(f"{after.node} changed while it was compared ({err.message}); "
                              "the comparison is not trusted and nothing was changed",
                              hint=err.hint)
        mode = after.mode or CacheMode.WRITETHROUGH
        dropped: bool | None = None
        if got.mismatches:
            scrub_mod.record(key, dev.node, got, how=src.how, invalidated=None,
                             invalidate_how=dev.scrub_drop_how)
            coherence.pending(key, dev.node, mode=mode.value, kind=dev.name,
                              cache=dev.cache_name)
            try:
                changes = after.scrub_drop(sysfs, src, [m.block for m in got.mismatches])
            except BaseException:
                scrub_mod.record(key, dev.node, got, how=src.how, invalidated=False,
                                 invalidate_how=dev.scrub_drop_how)
                raise
            # the pending record only: a VM's departure mark stays unless every copy went
            with contextlib.suppress(FileNotFoundError):
                coherence.pending_path(key).unlink()
            dropped = True
        scrub_mod.record(key, dev.node, got, how=src.how, invalidated=dropped,
                         invalidate_how=dev.scrub_drop_how)
    return Result(changes=changes, lines=summary(dev.node, src, got, dev.scrub_drop_how),
                  data={"schema": 1, "device": dev.node, "kind": dev.name, "how": src.how,
                        "origin": src.origin, "origin_offset": src.origin_offset,
                        "unit": src.unit, "dropped": dropped, **got.to_json(),
                        "mismatches": [m.to_json() for m in got.mismatches],
                        "changes": [{"target": c.target, "what": c.what, "before": c.before,
                                     "after": c.after} for c in changes]})


log = logging.getLogger("cachemgr.scrub")
DEFAULT_MAX_LATENCY_MS = policy.SCRUB_MAX_LATENCY_MS  # the timer's and the TUI's pace


def plan(dev: kinds.Kind, max_latency_ms: float | None) -> Plan:
    """What a scrub of ``dev`` would do, for a face that asks first."""
    pace_line = (f"paced: the other IO on {dev.node} keeps its p99 under {max_latency_ms:g} ms"
                 if max_latency_ms is not None else
                 "unpaced: as fast as the cache and the origin answer")
    return Plan(f"scrub {dev.node}", (
        f"would read each block {dev.node}'s cache holds (bcache: the whole device) "
        "through the cache and from the origin, and compare them",
        pace_line,
        f"would drop every block that differs from the cache ({dev.scrub_drop_how}); "
        "nothing else is changed",
        "a mismatch found is reported by status and check (scrub-mismatch)"))


def _policy(path: str) -> policy.ScrubPolicy:
    """The policy's ``[scrub]`` table; the defaults when there is no policy file (a bad one
    is a usage error: nothing is scrubbed)."""
    pol = policy.load_if_present(path)
    return pol.scrub if pol is not None else policy.ScrubPolicy()


def scrub_all(sysfs: Sysfs, policy_path: str, *, max_latency_ms: float | None = None,
              ctl: Control | None = None) -> Result:
    """Every write-through or clean cache the policy's ``[scrub]`` table names (none named:
    every one on the host) scrubbed in turn (:func:`scrub`), paced by ``max_latency_ms``,
    else the table's. A cache that is not one (writeback, dirty, passthrough, a writecache,
    no cache) is passed over when none is named, and refused when named. Exit: 0 every one
    compared (mismatches found are dropped and reported by ``check``), 1 a scrub failed, 3 a
    named one refused (and none failed), 4 nothing to compare (the table's ``enabled =
    false``, or no such cache); each device's outcome on its own line, and logged."""
    from cachemgr.ops import cache as cache_ops

    conf = _policy(policy_path)
    if max_latency_ms is not None:
        max_latency_ms = pace.check_max_latency(max_latency_ms)
    bound = max_latency_ms if max_latency_ms is not None else conf.max_latency_ms
    ctl = ctl if ctl is not None else Control(what="scrub --all")
    if not conf.enabled:
        line = f"scrub is off: the [scrub] table of {policy_path} has enabled = false"
        log.info(line)
        return Result(lines=[line], already=True,
                      data={"schema": 1, "enabled": False, "devices": []})
    require_root("reading a cache's device and its origin")
    named = bool(conf.devices)
    if named:
        targets = list(conf.devices)
    else:
        snap = cache_ops.status(sysfs, probe_unregistered=False)
        targets = [k.node for k in kinds.listed(snap) if k.node]
    lines: list[str] = []
    out: list[dict[str, Any]] = []
    failed = refused = False
    for target in targets:
        entry: dict[str, Any] = {"target": target}
        try:
            if not named:
                _, dev = cache_ops._again(sysfs, target)
                _check(dev)  # not a write-through or clean cache: passed over
        except (UsageError, UnsafeError, AlreadyError) as exc:
            entry.update(outcome="passed over", message=exc.message)
            lines.append(f"{target}: passed over ({exc.message})")
            out.append(entry)
            continue
        try:
            r = scrub(sysfs, target, max_latency_ms=bound, ctl=ctl)
        except (UnsafeError, AlreadyError, UsageError) as exc:
            # named by the policy, or busy (another command's, an interrupted procedure's)
            refused = True
            entry.update(outcome="refused", message=exc.message, hint=exc.hint)
            lines.append(f"{target}: not scrubbed: {exc.message}"
                         + (f" ({exc.hint})" if exc.hint else ""))
            log.warning("%s", lines[-1])
        except CacheMgrError as exc:
            failed = True
            entry.update(outcome="failed", message=exc.message, hint=exc.hint)
            lines.append(f"{target}: scrub failed: {exc.message}")
            log.error("%s", lines[-1])
        else:
            doc = r.data or {}
            found = len(doc.get("mismatches") or [])
            entry.update(outcome="compared", mismatches=found, bytes=doc.get("bytes"),
                         seconds=doc.get("seconds"), dropped=doc.get("dropped"))
            lines += r.lines
            (log.warning if found else log.info)("%s", r.lines[0] if r.lines else target)
        out.append(entry)
    compared = [e for e in out if e["outcome"] == "compared"]
    if not compared and not failed and not refused:
        lines.append("no write-through or clean cache to scrub on this host" if not named
                     else "nothing scrubbed")
    return Result(lines=lines, failed=failed, refused=refused,
                  already=not compared and not failed and not refused,
                  data={"schema": 1, "enabled": True, "max_latency_ms": bound,
                        "devices": out})


def summary(node: str, src: scrub_mod.Source, got: scrub_mod.Scrubbed,
            drop_how: str) -> list[str]:
    """What a scrub found and did, in lines."""
    lines = [f"scrub {node}: {got.blocks:,} blocks ({human(got.bytes)}) compared with "
             f"{src.origin} in {got.seconds:.1f} s: {len(got.mismatches)} served unlike the "
             "origin"]
    for m in got.mismatches[:16]:
        lines.append(f"  mismatch: block {m.block} (bytes {m.offset}-{m.offset + m.length - 1}"
                     f"), {len(m.pages)} of its 4 KiB pages differ")
    if len(got.mismatches) > 16:
        lines.append(f"  ... and {len(got.mismatches) - 16} more (--json lists them all)")
    if got.mismatches:
        lines.append(f"  dropped from the cache: {drop_how}; the next reads of them come from "
                     "the origin")
    if got.rechecked:
        lines.append(f"  {got.rechecked} differed once and agreed when read again (a write "
                     "between the two reads)")
    if got.unsettled:
        lines.append(f"  {len(got.unsettled)} kept changing under every re-read (written "
                     "meanwhile): not compared; scrub again to compare them")
    if got.pacing:
        lines.append(f"  {pacing_words(got.pacing)}")
    return lines
