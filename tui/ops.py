"""The TUI's operations: the same library calls, checks and words as ``cachemgr`` (cli.py).

Each function here mirrors one ``cmd_*`` of cachemgr/cli.py step for step (a fresh snapshot,
the same resolver, the same root check, the same library function) and returns what the CLI
would print: ``lines`` (its stdout, ``TARGET: what before -> after``) and ``notes`` (its
stderr remarks). Errors are the library's own :class:`CacheMgrError`, shown verbatim (message
and hint) by the app's one error handler. No textual here: these run in thread workers.

Cancelling a long operation (drain, flush, detach wait, bench) is cooperative and safe: the
worker's progress callback raises :class:`Cancelled` at the library's next progress report,
that is between two polls of its own loop, so the library's ``finally`` blocks run as for
Ctrl-C in the CLI (drain restores its tunables, a dm-cache flush reloads the original table,
bench restores its hygiene). A thread is never killed from outside.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cachemgr import bcache, dmcache, tuning
from cachemgr import drain as drain_mod
from cachemgr import snapshot as snapshot_mod
from cachemgr.errors import AlreadyError, CacheMgrError, UsageError, require_root
from cachemgr.model import BcacheBacking, CacheMode, CacheSet, DmCacheDevice, human
from cachemgr.sysfs import Sysfs
from cachemgr.targets import find_dmcache, resolve_backing, resolve_cache_set

ProgressFn = Callable[[object], None]


class Cancelled(CacheMgrError):
    """The operator cancelled; raised inside the library's loop at a progress report."""


@dataclass
class Outcome:
    lines: list[str] = field(default_factory=list)  # what the CLI prints on stdout
    notes: list[str] = field(default_factory=list)  # what it prints on stderr
    already: bool = False  # "already so" (exit 4): nothing changed
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Control:
    """What a running operation gets from the UI: progress out, cancellation in."""

    progress: ProgressFn = lambda _p: None
    cancel: threading.Event = field(default_factory=threading.Event)
    what: str = "operation"

    def report(self, p: object) -> None:
        if self.cancel.is_set():
            raise Cancelled(f"{self.what} cancelled by the operator",
                            hint="what the library changed for it was put back")
        self.progress(p)


root = require_root  # the CLI's words


def change_lines(changes: list[bcache.Change]) -> list[str]:
    """cli._emit's text form."""
    out = []
    for c in changes:
        arrow = f"{c.before} -> {c.after}" if c.before or c.after else "done"
        out.append(f"{c.target}: {c.what} {arrow}")
    return out


def progress_line(p: object) -> str:
    """cli._DrainReporter's line (drain and dm-cache flush), or cli._progress's (detach)."""
    if isinstance(p, drain_mod.DrainProgress | dmcache.FlushProgress):
        frac = p.fraction
        pct = f"{100 * frac:5.1f}%" if frac is not None else "   ?% "
        rate = f"{human(int(p.rate_bps))}/s" if p.rate_bps else "-"
        eta = f"{p.eta_s:.0f} s" if p.eta_s is not None else "-"
        return (f"drain {p.device}: {pct} dirty {human(p.dirty_bytes)} rate {rate} "
                f"ETA {eta} ({p.elapsed_s:.0f} s)")
    if isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], BcacheBacking):
        what, b = p
        dirty = human(b.dirty.bytes) if b.dirty else "?"
        return f"{what} {b.device or b.identity.node}: {b.state}, dirty {dirty}"
    return str(p)


def _detach_progress(ctl: Control) -> bcache.Progress:
    def cb(what: str, b: BcacheBacking) -> None:
        ctl.report((what, b))
    return cb


# ----------------------------------------------------------------------------- mode


def dirty_consequence(obj: object, mode: CacheMode) -> str:
    """What happens to the dirty data when switching to ``mode`` (the confirmation text)."""
    if isinstance(obj, DmCacheDevice):
        d = obj.dirty_bytes
        if mode == CacheMode.PASSTHROUGH and (d is None or d > 0):
            return (f"{obj.node} holds {human(d)} of dirty data: dm-cache accepts passthrough "
                    "only when every block is clean, so a plain switch is refused; "
                    "'switch + drain' flushes first, then loads passthrough.")
        if mode == CacheMode.WRITEBACK:
            return ("New writes will land in the cache first: they are dirty (lost if the "
                    "cache device dies) until written back.")
        if d:
            return (f"{human(d)} of dirty data stays in the cache and keeps being written "
                    "back; 'switch + drain' writes it back now.")
        return "The cache is clean: nothing is at risk."
    if isinstance(obj, BcacheBacking):
        dev = obj.device or obj.identity.node
        dirty = obj.dirty.bytes if obj.dirty else None
        if mode == CacheMode.WRITEBACK:
            return ("New writes will land on the SSD first: they are dirty (lost if the SSD "
                    "dies) until bcache writes them back.")
        if dirty:
            return (f"{dev} has {human(dirty)} of dirty data. Switching does not make it clean: "
                    "bcache keeps writing it back, and with its defaults that is at 4 KiB/s "
                    "once below 10 % of the cache. 'switch + drain' writes it back fast "
                    "(cachemgr mode --drain).")
        return f"{dev} is clean: nothing is at risk."
    return ""


def set_mode(sysfs: Sysfs, target: str, mode_word: str, *, drain: bool = False,
             ctl: Control | None = None, timeout: float = 24 * 3600.0,
             stall_timeout: float = 60.0) -> Outcome:
    """cli.cmd_mode (and _dm_mode)."""
    ctl = ctl or Control(what=f"mode {mode_word} on {target}")
    try:
        mode = CacheMode(mode_word)
    except ValueError:
        raise UsageError(f"unknown cache mode {mode_word!r}",
                         hint="use writethrough, writeback, writearound or none") from None
    snap = snapshot_mod.take(sysfs)
    dm = find_dmcache(snap, target, sysfs)
    out = Outcome()
    if dm is not None:
        if not drain:
            out.lines = change_lines([dmcache.set_mode(sysfs, dm, mode)])
            return out
        if dm.mode == mode:
            return _dm_drain(sysfs, dm, ctl, timeout, stall_timeout)
        res = dmcache.flush(sysfs, dm, timeout=timeout, stall_timeout=stall_timeout,
                            progress=ctl.report, final_mode=mode)
        out.lines = change_lines([bcache.Change(dm.node, "cache_mode", dm.mode.value,
                                                mode.value)] if res.final_table else [])
        return out
    b = resolve_backing(snap, target, sysfs)
    root("changing a cache mode")
    changes: list[bcache.Change] = []
    try:
        changes = [bcache.set_mode(sysfs, b, mode)]
    except AlreadyError:
        if not drain:
            raise
    if drain:
        try:
            dres = drain_mod.drain(sysfs, bcache.reread(sysfs, b.identity.name),
                                  timeout=timeout, stall_timeout=stall_timeout,
                                  progress=ctl.report)
            out.notes.append(f"{dres.device}: clean after {dres.elapsed_s:.1f} s "
                             f"({human(dres.start_bytes)} written back); tunables restored")
        except AlreadyError:
            pass
    elif b.dirty and not b.dirty.is_zero(512) and mode != CacheMode.WRITEBACK:
        out.notes.append(f"{b.device}: {human(b.dirty.bytes)} of dirty data is still being "
                         "written back; 'cachemgr drain' (or mode --drain) makes that fast")
    out.lines = change_lines(changes)
    return out


# ----------------------------------------------------------------------------- drain


def _dm_drain(sysfs: Sysfs, dm: DmCacheDevice, ctl: Control, timeout: float,
              stall_timeout: float) -> Outcome:
    res = dmcache.flush(sysfs, dm, timeout=timeout, stall_timeout=stall_timeout,
                        progress=ctl.report)
    return Outcome(lines=[
        f"{res.device}: clean after {res.elapsed_s:.1f} s ({human(res.start_bytes)} "
        f"written back); mode {res.restored.get('mode', dm.mode.value)} and policy "
        f"{res.restored.get('policy', dm.table.policy)} restored"])


def drain(sysfs: Sysfs, target: str, *, ctl: Control | None = None, resume: bool = False,
          timeout: float = 24 * 3600.0, stall_timeout: float = 60.0) -> Outcome:
    """cli.cmd_drain."""
    ctl = ctl or Control(what=f"drain of {target}")
    snap = snapshot_mod.take(sysfs)
    dm = find_dmcache(snap, target, sysfs)
    if dm is not None:
        notes = []
        if resume:
            restored_dm = dmcache.restore_saved(sysfs, dm)
            if not restored_dm:
                raise AlreadyError(f"{dm.node}: no interrupted flush to resume")
            notes.append(f"{dm.node}: restored table {restored_dm['table']}")
            dm = dmcache.find(sysfs, dm.name)
        dm_out = _dm_drain(sysfs, dm, ctl, timeout, stall_timeout)
        dm_out.notes[:0] = notes
        return dm_out
    b = resolve_backing(snap, target, sysfs)
    root("draining")
    out = Outcome()
    if resume:
        restored = drain_mod.restore_saved(sysfs, b)
        if not restored:
            raise AlreadyError(f"{b.device}: no interrupted drain to resume")
        out.notes.append(f"{b.device}: restored tunables {restored}")
        try:
            res = drain_mod.drain(sysfs, bcache.reread(sysfs, b.identity.name),
                                  timeout=timeout, stall_timeout=stall_timeout,
                                  progress=ctl.report)
        except AlreadyError:
            out.notes.append(f"{b.device}: already clean")
            return out
    else:
        res = drain_mod.drain(sysfs, b, timeout=timeout, stall_timeout=stall_timeout,
                              progress=ctl.report)
    out.lines.append(f"{res.device}: clean after {res.elapsed_s:.1f} s "
                     f"({human(res.start_bytes)} written back); tunables restored")
    return out


# ----------------------------------------------------------------------------- attach/detach


def attach(sysfs: Sysfs, backing: str, cache: str) -> Outcome:
    """cli.cmd_attach."""
    snap = snapshot_mod.take(sysfs)
    b = resolve_backing(snap, backing, sysfs)
    c = resolve_cache_set(snap, cache, sysfs)
    root("attaching")
    return Outcome(lines=change_lines([bcache.attach(sysfs, b, c)]))


def detach(sysfs: Sysfs, backing: str, *, ctl: Control | None = None,
           timeout: float = 3600.0) -> Outcome:
    """cli.cmd_detach. Cancelling stops the wait only: the kernel finishes the detach."""
    ctl = ctl or Control(what=f"detach of {backing}")
    b = resolve_backing(snapshot_mod.take(sysfs), backing, sysfs)
    root("detaching")
    return Outcome(lines=change_lines([bcache.detach(sysfs, b, timeout=timeout,
                                                     progress=_detach_progress(ctl))]))


# ----------------------------------------------------------------------------- create/remove


def create_bcache(sysfs: Sysfs, *, backings: list[str], cache: str | None,
                  mode: str | None = None, bucket: str | None = None,
                  force: bool = False) -> Outcome:
    """cli.cmd_create (bcache)."""
    m = None
    if mode:
        try:
            m = CacheMode(mode)
        except ValueError:
            raise UsageError(f"unknown cache mode {mode!r}") from None
    return Outcome(lines=change_lines(bcache.create(sysfs, backings=backings, cache=cache,
                                                    mode=m, bucket=bucket or None,
                                                    force=force)))


def create_dmcache(sysfs: Sysfs, *, name: str, origin: str, cache: str, metadata: str,
                   mode: str | None = None, block_size: str | None = None,
                   force: bool = False) -> Outcome:
    """cli._dm_create."""
    if not (name and origin and cache and metadata):
        raise UsageError("create dm-cache needs NAME, --origin DEV, --cache DEV and "
                         "--metadata DEV")
    try:
        m = CacheMode(mode or "writeback")
    except ValueError:
        raise UsageError(f"unknown cache mode {mode!r}",
                         hint="writeback, writethrough or passthrough") from None
    block = dmcache.parse_size(block_size) if block_size else None
    return Outcome(lines=change_lines(dmcache.create(
        sysfs, name, origin=origin, cache=cache, metadata=metadata, mode=m,
        block_bytes=block, force=force)))


def remove(sysfs: Sysfs, target: str, *, keep_device: bool = False,
           ctl: Control | None = None, timeout: float = 3600.0,
           stall_timeout: float = 60.0) -> Outcome:
    """cli.cmd_remove: a backing device is detached (flushes), then stopped; a cache set is
    unregistered once nothing is attached; a dm-cache device is flushed and removed."""
    ctl = ctl or Control(what=f"remove of {target}")
    snap = snapshot_mod.take(sysfs)
    dm = find_dmcache(snap, target, sysfs)
    if dm is not None:
        return Outcome(lines=change_lines(dmcache.remove(
            sysfs, dm, keep_device=keep_device, timeout=timeout, stall_timeout=stall_timeout,
            progress=ctl.report)))
    root("removing")
    try:
        b = resolve_backing(snap, target, sysfs)
    except UsageError:
        c = resolve_cache_set(snap, target, sysfs)
        return Outcome(lines=change_lines([bcache.unregister_cache_set(sysfs, c,
                                                                       snap.backings)]))
    changes = []
    if b.cset_uuid is not None:
        changes.append(bcache.detach(sysfs, b, timeout=timeout,
                                     progress=_detach_progress(ctl)))
        b = resolve_backing(snapshot_mod.take(sysfs), b.identity.node, sysfs)
    changes.append(bcache.stop_backing(sysfs, b))
    return Outcome(lines=change_lines(changes))


# ----------------------------------------------------------------------------- tune


def tunables_of(obj: object) -> dict[str, tuple[int, int]]:
    """What can be tuned on ``obj`` and the library's bounds."""
    if isinstance(obj, BcacheBacking):
        return dict(bcache.BACKING_TUNABLES)
    if isinstance(obj, CacheSet):
        return dict(bcache.SET_TUNABLES)
    if isinstance(obj, DmCacheDevice):
        return {"migration_threshold": (0, 2**31 - 1)}
    return {}


def tune(sysfs: Sysfs, target: str, settings: list[str]) -> Outcome:
    """cli.cmd_tune: NAME=VALUE settings; "already so" for each unchanged one."""
    changes, already = tuning.tune(sysfs, snapshot_mod.take(sysfs), target, settings)
    out = Outcome()
    out.notes.extend(already)
    out.lines = change_lines(changes)
    out.already = not changes and bool(already)
    return out
