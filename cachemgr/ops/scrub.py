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

Nothing is asked: a scrub changes nothing but the cache's copies that are wrong.
"""

from __future__ import annotations

import contextlib

from cachemgr.core import pace
from cachemgr.core.errors import AlreadyError, UnsafeError, UsageError, require_root
from cachemgr.core.model import CacheMode, human
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import coherence as coherence_ops
from cachemgr.ops import gate as gate_mod
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import coherence, kinds
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
