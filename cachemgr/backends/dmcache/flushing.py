"""Flush: write every dirty block back through writethrough + the ``cleaner`` policy (the
package docstring says why), then put the table back; the journal that lets the next run
restore the table after a crash."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cachemgr.backends import kernlog
from cachemgr.backends.dmcache import command, discover, pacing
from cachemgr.backends.dmcache.parse import DEFAULT_MIGRATION_THRESHOLD, parse_table
from cachemgr.backends.dmcache.refusals import bad_mode, check_changeable
from cachemgr.backends.dmcache.switch import (
    critical,
    drop_reopen,
    reopen_name,
    reopen_switch,
    switch_table,
    with_threshold,
)
from cachemgr.core import drainloop, state
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    KernelFormatError,
    StallError,
    TimeoutExpired,
    UnsafeError,
    require_root,
)
from cachemgr.core.model import (
    DM_CACHE_MODES,
    CacheMode,
    CacheState,
    DmCacheDevice,
    DmCacheStatus,
    DmCacheTable,
    DrainProgress,
    human,
)
from cachemgr.core.signals import terminate_as_interrupt
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)


@dataclass
class FlushResult:
    device: str
    start_bytes: int
    elapsed_s: float
    restored: dict[str, str] = field(default_factory=dict)
    final_table: str = ""
    pacing: dict[str, object] | None = None  # a paced flush (--max-latency): what it did
    # dirty blocks read after the last table change (0 in writethrough and passthrough, or
    # the flush fails; in writeback, the VMs' writes since)
    dirty_after: int = 0


SWITCH_TRIES = 3  # cleaned and switched: how often before dirty blocks that keep coming back
# under the suspended device refuse the switch


def lock_key(d: DmCacheDevice) -> str:
    return f"dmcache-{d.name}"


def journal(d: DmCacheDevice) -> Path:
    return state.journal_path("dmcache-flush", d.name)


def restore_saved(sysfs: Sysfs, d: DmCacheDevice) -> dict[str, str]:
    """Put back the table a crashed or killed flush left (cleaner policy, writethrough), and
    resume a device it left suspended. Returns what was restored ({} if nothing)."""
    path = journal(d)
    saved = state.read_json(path)
    if saved is None:
        return {}
    original = str(saved["original"])
    live = command.read_table(d.name)
    try:
        t = parse_table(live)
        ours = live != original and (t.policy == "cleaner" or t.metadata_dev == _reopen_devno(d))
    except KernelFormatError:
        ours = False
    restored: dict[str, str] = {}
    if d.suspended or ours:
        with critical():
            if d.suspended:
                # a switch cut short: drop its inactive table, if any
                with contextlib.suppress(CommandError):
                    command.dmsetup("clear", d.name)
            else:
                command.dmsetup("suspend", d.name)
            try:
                command.dmsetup("load", d.name, "--table", original)
            finally:
                command.dmsetup("resume", d.name)
        restored = {"table": original}
        log.info("%s: restored the table saved by an interrupted flush: %s", d.node, original)
    drop_reopen(d.name)
    path.unlink(missing_ok=True)
    throttle = pacing.restore_stale(sysfs)  # a paced flush's, killed with it
    if throttle is not None:
        restored["cache_copy_throttle"] = str(throttle)
    return restored


def _reopen_devno(d: DmCacheDevice) -> str | None:
    """major:minor of the metadata stand-in a killed :func:`reopen_switch` left, if any."""
    r = command.dmsetup("info", "-c", "--noheadings", "-o", "major,minor", "--",
                        reopen_name(d.name), timeout=30, check=False)
    if r.returncode != 0:
        return None
    return r.stdout.strip() or None


def flush(sysfs: Sysfs, d: DmCacheDevice, *, timeout: float = 24 * 3600,
          stall_timeout: float = 60.0, confirm: float = 1.0, interval: float = 0.5,
          progress: Callable[[DrainProgress], None] | None = None,
          final_mode: CacheMode | None = None,
          max_latency_ms: float | None = None) -> FlushResult:
    """Write every dirty block back to the origin, then put the table back.

    Runs writethrough + the ``cleaner`` policy (see the package docstring for why not
    writeback), polls ``#dirty`` down to 0 (read ``confirm`` seconds apart) with progress
    and ETA, then loads the original table again, or the same with ``final_mode`` (how
    ``mode --drain`` gets to passthrough without passing through writeback). On an error,
    a stall, a timeout, Ctrl-C, SIGTERM or SIGHUP the original table is restored; after a crash,
    the journal lets the next run (or ``drain --resume``) restore it.

    ``max_latency_ms``: a paced flush, which keeps the p99 latency of the other IO on the
    device under that bound through dm_cache's copy throttle (:mod:`.pacing`), put back at
    the end as the table is.

    Raises AlreadyError when the device is clean and already has the final table.
    """
    mode_cmd = f"lvchange --cachemode {final_mode.value} VG/LV" if final_mode else \
        "lvchange --cachepolicy cleaner VG/LV (and back: lvchange --cachepolicy smq VG/LV)"
    check_changeable(d, "cache contents" if not final_mode else "mode", mode_cmd)
    if final_mode is not None and final_mode not in DM_CACHE_MODES:
        raise bad_mode(final_mode)
    require_root("flushing a dm-cache device")
    with state.locked(lock_key(d), d.node), terminate_as_interrupt():
        d = recover(sysfs, d)
        final = d.table.with_mode(final_mode) if final_mode else d.table
        origin = d.origin.name if d.origin is not None else None
        with pacing.paced(sysfs, d.kernel_name, origin, max_latency_ms, d.node) as paced:
            return flush_locked(d, final, require_clean=final.mode == CacheMode.PASSTHROUGH,
                                 timeout=timeout, stall_timeout=stall_timeout,
                                 confirm=confirm, interval=interval, progress=progress,
                                 paced=paced, sysfs=sysfs)


def recover(sysfs: Sysfs, d: DmCacheDevice) -> DmCacheDevice:
    if state.read_json(journal(d)) is not None and restore_saved(sysfs, d).get("table"):
        return discover.find(sysfs, d.name)
    return d


def flush_locked(d: DmCacheDevice, final: DmCacheTable | str, *, require_clean: bool,
                  timeout: float, stall_timeout: float, confirm: float, interval: float,
                  progress: Callable[[DrainProgress], None] | None,
                  paced: pacing.Paced | None = None,
                  sysfs: Sysfs | None = None) -> FlushResult:
    """The flush of :func:`flush`, its lock held; ``paced``: its pace, set already.

    A cache ``final`` table is loaded with the metadata opened afresh (:func:`reopen_switch`:
    a plain reload of metadata first opened after an unclean shutdown marks every block
    dirty again), and the status is read once more after it: in writethrough or passthrough
    a dirty block then fails the flush (exit 1) rather than report clean."""
    assert d.status is not None
    sysfs = sysfs or Sysfs()
    original = d.table
    live_line = original.line()
    thr = d.status.migration_threshold
    final_t = None if isinstance(final, str) else with_threshold(final, thr)
    final_line = final if isinstance(final, str) else with_threshold(final, thr).line()

    def switch_final(old: str) -> None:
        if final_t is None:
            switch_table(d.name, old, final_line, require_clean=require_clean)
        else:
            reopen_switch(sysfs, d.name, old, final_t, require_clean=require_clean)

    t0 = time.monotonic()
    if d.status.dirty == 0:
        time.sleep(min(confirm, 0.2))
        st = command.read_status(d.name)
        if not isinstance(st, str) and st.dirty == 0:
            if final_line == live_line:
                raise AlreadyError(f"{d.node} is already clean (0 dirty blocks)")
            switch_final(live_line)
            return FlushResult(d.node, 0, time.monotonic() - t0, {}, final_line,
                               dirty_after=_dirty_after(d, final_t))
    keep_mode = CacheMode.WRITETHROUGH if original.mode == CacheMode.WRITEBACK else original.mode
    # migration_threshold decides whether the policy is told "idle": no IO for a second and
    # (migrations in flight + 1) x block <= threshold (spare_migration_bandwidth in
    # dm-cache-target.c). Below one block it never is, and the cleaner then only gets the
    # blocks past its writeback sentinels, a batch every 10 s. The flush uses at least two
    # blocks; the live value comes back with the restored table.
    flush_thr = max(thr or DEFAULT_MIGRATION_THRESHOLD, 2 * original.block_sectors)
    flush_args = ("migration_threshold", str(flush_thr)) \
        if flush_thr != DEFAULT_MIGRATION_THRESHOLD else ()
    flush_t = original.with_mode(keep_mode).with_policy("cleaner", flush_args)
    flush_line = flush_t.line()
    restore_line = with_threshold(original, thr).line()
    path = journal(d)
    state.write_json(path, {"device": d.node, "name": d.name, "uuid": d.uuid,
                            "original": restore_line, "flush": flush_line,
                            "started": time.time()})
    switched = done = False
    try:
        switch_table(d.name, live_line, flush_line)  # on failure the live table runs on
        switched = True
        start: int | None = None
        for attempt in range(1, SWITCH_TRIES + 1):
            got = _poll_clean(d, timeout=timeout, stall_timeout=stall_timeout,
                              confirm=confirm, interval=interval, progress=progress, t0=t0,
                              paced=paced)
            start = got if start is None else start
            try:
                switch_final(flush_line)
                break
            except UnsafeError as exc:
                # clean twice, then a dirty block under the suspended device (lab, 7.2.7,
                # replace-ssd under a writing VM): the cleaner table runs again (switch_table
                # resumed it) and cleans it; refused only when it keeps coming back
                if attempt == SWITCH_TRIES:
                    raise
                log.info("%s: %s; cleaning again (%d of %d)", d.node, exc.message, attempt,
                         SWITCH_TRIES)
        done = True
        return FlushResult(d.node, start or 0, time.monotonic() - t0,
                           {"mode": original.mode.value, "policy": original.policy},
                           final_line, paced.summary() if paced is not None else None,
                           dirty_after=_dirty_after(d, final_t))
    finally:
        if switched and not done:
            try:
                switch_table(d.name, flush_line, restore_line)
                log.info("%s: original table restored: %s", d.node, restore_line)
            except CacheMgrError as exc:
                log.error("%s: could not restore the table (%s); the journal %s keeps it: "
                          "cachemgr drain %s --resume", d.node, exc, path, d.name)
                raise
            drop_reopen(d.name)  # a reopen cut short left it; unused once restored
        path.unlink(missing_ok=True)


def _dirty_after(d: DmCacheDevice, final: DmCacheTable | None) -> int:
    """The dirty blocks the status reads after the last table change. A cache table in
    writethrough or passthrough must read 0 (no write can dirty a block there): else
    CacheMgrError (exit 1), never "clean". In writeback a count is the VMs' writes since;
    returned, for the caller to say."""
    if final is None:
        return 0
    st = command.read_status(d.name)
    if isinstance(st, str):
        raise CacheMgrError(f"{d.node}: the cache failed ({st}) after its table was put back; "
                            "see dmesg", hint="keep the cache device: it may hold data")
    if st.dirty and final.mode != CacheMode.WRITEBACK:
        raise CacheMgrError(
            f"{d.node}: every dirty block was written back, but {st.dirty} blocks "
            f"({human(st.dirty_bytes)}) read dirty after the table was put back "
            f"({final.mode.value}); it is not clean",
            hint=f"cachemgr doctor {d.node} says why; cachemgr drain {d.name} writes them "
                 "back again")
    return st.dirty


def _poll_clean(d: DmCacheDevice, *, timeout: float, stall_timeout: float, confirm: float,
                interval: float, progress: Callable[[DrainProgress], None] | None,
                t0: float, paced: pacing.Paced | None = None,
                sysfs: Sysfs | None = None) -> int:
    """Poll ``#dirty`` to 0 (twice, ``confirm`` s apart); returns the starting dirty bytes.
    ``paced``: its pacer judges at each poll and reads its counters between them."""
    if paced is not None:
        # the pacer reads its counters every pace.SLICE between two polls and decides every
        # 2 s: a dmsetup twice a second would only cost the CPU the VMs' IO waits for
        interval = max(interval, 1.0)

    def sample() -> drainloop.Sample[DmCacheStatus]:
        if paced is not None:
            paced.step(d.node)
        st = command.read_status(d.name)
        if isinstance(st, str):
            raise CacheMgrError(f"{d.node}: the cache failed ({st}) while flushing; see dmesg",
                                hint="keep the cache device: the dirty blocks are on it")
        return drainloop.Sample(st, st.dirty_bytes,
                                CacheState.DIRTY if st.dirty else CacheState.CLEAN,
                                st.dirty == 0, st.dirty)

    def stalled(st: DmCacheStatus, progressed: bool) -> StallError:
        return StallError(
            f"{d.node}: no progress for {stall_timeout:g} s ({st.dirty} dirty blocks, "
            f"{human(st.dirty_bytes)}); the original table is put back, the dirty data stays "
            "safe in the cache",
            hint=kernlog.stall_hint(
                sysfs or Sysfs(), d.cache.name if d.cache else None,
                d.origin.name if d.origin else None,
                "check the origin device for errors (dmesg); a longer --stall-timeout "
                "gives the cleaner more writeback periods"))

    def timed_out(st: DmCacheStatus) -> TimeoutExpired:
        return TimeoutExpired(f"{d.node}: still {st.dirty} dirty blocks after {timeout:g} s "
                              "of flushing; the original table is put back")

    r = drainloop.wait_clean(sample, action="flush", device=d.node, timeout=timeout,
                             stall_timeout=stall_timeout, confirm=confirm, interval=interval,
                             progress=progress, stall_error=stalled, timeout_error=timed_out,
                             rate="mean", t0=t0,
                             explain=None if paced is None else lambda *_: paced.words(),
                             sleep=time.sleep if paced is None else paced.sampler.sleep,
                             moving=None if paced is None else paced.moving)
    return r.start_bytes or 0
