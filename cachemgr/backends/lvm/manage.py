"""Changes to LVM-owned caches, every one through lvm2 (docs/kernel-notes.md, "lvm2").

* mode: ``lvchange --cachemode``. Leaving writeback while dirty is refused without a drain:
  lvm2 would flush inside lvchange, with no progress and no end when writes keep coming.
* drain: the cleaner policy (``lvchange --cachepolicy cleaner``; lvm2 loads it with
  writethrough, so no new dirty blocks arrive) or, for writecache, the ``cleaner`` setting;
  the dirty count is polled from the kernel's status with progress, ETA and stall detection;
  the original policy (or cleaner=0) goes back on success, error, cancel and SIGTERM, and a
  journal lets the next run put it back after a crash.
* detach: drain, then ``lvconvert --splitcache`` (the cache pool or cachevol is kept; a cache
  pool gets its original policy back); remove: drain, then ``lvconvert --uncache`` (the pool
  is deleted). The LV itself stays, with every byte on its origin.
* attach: ``lvconvert --type cache --cachepool`` / ``--cachevol``, or ``--type writecache
  --cachevol``; tune: ``lvchange --cachesettings NAME=VALUE``.

Every change holds the LV's lock (the one all cachemgr runs take) and needs root; a failed,
needs_check or suspended cache is refused with lvm2's repair advice, never repaired.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cachemgr.backends import dmwritecache, kernlog
from cachemgr.backends.dmcache import command as dm_command
from cachemgr.backends.dmcache import pacing
from cachemgr.backends.dmcache import switch as dm_switch
from cachemgr.backends.lvm import command
from cachemgr.backends.lvm.report import field
from cachemgr.core import drainloop, state
from cachemgr.core.change import Change
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    StallError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
    require_root,
)
from cachemgr.core.model import (
    CacheMode,
    CacheState,
    DmCacheDevice,
    DmWritecacheDevice,
    DrainProgress,
    LvmCachedLv,
    human,
)
from cachemgr.core.signals import terminate_as_interrupt
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

LvmDevice = DmCacheDevice | DmWritecacheDevice
# A writecache drain whose last few dirty blocks stand still this long (a writer keeps
# rewriting them: the cleaner setting still caches writes to held blocks) writes them back
# with IO held (dmwritecache.flush_held). Only for so few blocks that the hold stays short:
# 64 blocks of 4 KiB at 10 ms each is 0.64 s on a spinning disk; 0.3 s measured in the lab.
HELD_FLUSH_BLOCKS = 64
HELD_FLUSH_AFTER_S = 5.0
# A dm-cache drain whose dirty count has not fallen for REQUEUE_AFTER_S (the cleaner holds
# back the blocks touched in the last ~10 s writeback period) loads its cleaner table again,
# which lets one batch of them (migration_threshold's worth) go at once
# (dmcache.switch.requeue_cleaner); IO is held for the load (0.1-0.5 s in the lab). Each
# load not followed by a fall doubles the wait before the next (up to
# REQUEUE_MAX_WAIT_S, about the cleaner's own period), so a drain that stands still for
# another reason (a stalled origin) holds IO rarely; a fall starts again at REQUEUE_AFTER_S.
REQUEUE_AFTER_S = 0.4  # below the 0.5 s poll: the first reading that shows no new fall
REQUEUE_MAX_WAIT_S = 8.0
ProgressFn = Callable[[DrainProgress], None]
LVM_CACHE_MODES = (CacheMode.WRITEBACK, CacheMode.WRITETHROUGH, CacheMode.PASSTHROUGH)
CACHE_TUNABLES = {"migration_threshold": (0, 2**31 - 1)}
WRITECACHE_TUNABLES = {
    "high_watermark": (0, 100), "low_watermark": (0, 100), "writeback_jobs": (1, 2**31 - 1),
    "autocommit_blocks": (1, 2**31 - 1), "autocommit_time": (1, 2**31 - 1),
}


def lv_of(d: LvmDevice) -> LvmCachedLv:
    assert d.lvm is not None
    return d.lvm


def _locked(vg: str, lv: str):  # type: ignore[no-untyped-def]
    """The lock every change to the LV ``vg/lv`` takes (attach included)."""
    return state.locked(f"lvm-{vg}/{lv}", f"{vg}/{lv}")


def journal(v: LvmCachedLv) -> Path:
    return journal_for(v.full_name)


def journal_for(vg_lv: str) -> Path:
    """The drain journal of ``vg_lv``: the policy or cleaner setting to put back."""
    return state.journal_path("lvm-drain", vg_lv)


def refuse_unhealthy(d: LvmDevice, what: str) -> None:
    """A failed, needs_check or suspended cache is not changed: lvm2's repair is the admin's
    decision (its data may be on the cache only)."""
    v = lv_of(d)
    failed = d.failure or d.status is None or (isinstance(d, DmWritecacheDevice)
                                               and d.status is not None and d.status.error)
    needs_check = v.check_needed or "needs_check" in v.health or (
        isinstance(d, DmCacheDevice) and d.status is not None
        and (d.status.needs_check or d.status.metadata_mode == "ro"))
    if failed or needs_check or v.health in ("failed", "error"):
        state_word = "failed" if failed else (v.health or "needs_check")
        raise UnsafeError(
            f"{v.full_name}: the cache is {state_word}; its {what} is not changed (its dirty "
            "blocks may be on the cache only)",
            hint=f"deactivate it (lvchange -an {v.full_name}), check the metadata "
                 f"(cache_check, or lvconvert --repair {v.full_name}), then activate it "
                 "again; see dmesg")
    if d.suspended:
        raise UnsafeError(f"{v.full_name} is suspended (lvm2 or another tool is changing it); "
                          f"its {what} is not changed",
                          hint="wait for that command to finish, then retry")


# ----------------------------------------------------------------------------- reading


def reread(d: LvmDevice) -> LvmDevice:
    """The same LV read now (a new snapshot of the dm devices and LVM's report)."""
    from cachemgr.backends import snapshot
    from cachemgr.core.sysfs import Sysfs

    v = lv_of(d)
    snap = snapshot.take(Sysfs())
    for x in snap.dm_devices:
        if x.lvm is not None and (x.lvm.vg, x.lvm.lv) == (v.vg, v.lv):
            return x
    raise UsageError(f"{v.full_name} is not a cached LV (any more)",
                     hint="lvs -a shows it; cachemgr status lists the cached LVs")


def _dirty(d: LvmDevice) -> tuple[int | None, int | None]:
    """(dirty blocks, dirty bytes) read now from the kernel's status."""
    if isinstance(d, DmWritecacheDevice):
        st = dmwritecache.read_status(d.name)
        if isinstance(st, str) or st.error:
            raise CacheMgrError(f"{lv_of(d).full_name}: the writecache reports an error "
                                f"({st if isinstance(st, str) else 'error ' + str(st.error)}); "
                                "see dmesg", hint="keep the cache device: dirty blocks are on it")
        return st.dirty, st.dirty * d.table.block_bytes
    cst = dm_command.read_status(d.name)
    if isinstance(cst, str):
        raise CacheMgrError(f"{lv_of(d).full_name}: the cache failed ({cst}); see dmesg",
                            hint="keep the cache device: dirty blocks are on it")
    return cst.dirty, cst.dirty_bytes


# ----------------------------------------------------------------------------- mode


def check_mode(d: LvmDevice, mode: CacheMode) -> None:
    """A usage error (exit 2) for a mode ``d`` cannot have: any for writecache."""
    v = lv_of(d)
    if isinstance(d, DmWritecacheDevice):
        raise UsageError(f"{v.full_name} is an LVM writecache: it only has writeback",
                         hint=f"to stop caching, detach it (cachemgr detach {v.full_name}) "
                              f"or remove it (cachemgr remove {v.full_name})")
    if mode not in LVM_CACHE_MODES:
        hint = "lvmcache modes: writeback, writethrough, passthrough"
        if mode == CacheMode.NONE:
            hint += " (passthrough is its none)"
        raise UsageError(f"lvmcache has no cache mode {mode.value!r}", hint=hint)


def set_mode(d: LvmDevice, mode: CacheMode) -> Change:
    check_mode(d, mode)
    v = lv_of(d)
    refuse_unhealthy(d, "mode")
    require_root("changing a cache mode")
    with _locked(v.vg, v.lv):
        d = reread(d)
        v = lv_of(d)
        old = v.cache_mode or d.mode.value
        if old == mode.value and d.mode == mode:
            raise AlreadyError(f"{v.full_name} is already in {mode.value} mode")
        blocks, nbytes = _dirty(d)
        if mode != CacheMode.WRITEBACK and blocks:
            raise dirty_mode_refusal(v, mode, blocks, nbytes)
        command.lvchange(v.full_name, "--cachemode", mode.value)
        return Change(v.full_name, "cache_mode", old, mode.value)


def dirty_mode_refusal(v: LvmCachedLv, mode: CacheMode, blocks: int,
                       nbytes: int | None) -> UnsafeError:
    """set_mode's refusal of a mode other than writeback while blocks are dirty."""
    return UnsafeError(
        f"{v.full_name} holds {human(nbytes)} of dirty data ({blocks} blocks); "
        f"lvm2 would flush it inside lvchange with no progress, and with no end while "
        "writes keep coming; nothing was changed",
        hint=f"cachemgr mode {v.full_name} {mode.value} --drain (drains with progress, "
             "then switches)")


# ----------------------------------------------------------------------------- drain


def _cleaner_on(v: LvmCachedLv) -> None:
    if v.segtype == "writecache":
        command.lvchange(v.full_name, "--cachesettings", "cleaner=1")
    else:
        command.lvchange(v.full_name, "--cachepolicy", "cleaner")


def _cleaner_off(saved: dict[str, Any], target: str | None = None) -> None:
    """Put back what the drain changed, on the LV (or ``target``: the split-off pool)."""
    name = target or str(saved["lv"])
    if saved.get("segtype") == "writecache":
        command.lvchange(name, "--cachesettings", f"cleaner={saved.get('cleaner') or '0'}")
    else:
        command.lvchange(name, "--cachepolicy", str(saved.get("policy") or "smq"))


def _saved(vg_lv: str) -> tuple[Path, dict[str, Any] | None]:
    """``vg_lv``'s drain journal and what it holds (None: there is none); a journal that is
    not one for this LV raises StateFileError."""
    path = journal_for(vg_lv)
    saved = state.read_json(path)
    if saved is not None and saved.get("lv") != vg_lv:
        raise state.StateFileError(path, "not an LVM drain journal for this LV")
    return path, saved


def restore_saved(d: LvmDevice) -> dict[str, str]:
    """Put back the policy (or writecache cleaner setting) an interrupted drain left, from its
    journal; {} when there is none. Called under the LV's lock."""
    v = lv_of(d)
    path, saved = _saved(v.full_name)
    if saved is None:
        return {}
    _cleaner_off(saved)
    path.unlink(missing_ok=True)
    what = "cleaner" if saved.get("segtype") == "writecache" else "policy"
    value = str(saved.get("cleaner") or "0") if what == "cleaner" else str(saved.get("policy"))
    log.info("%s: %s %s restored (an interrupted drain had changed it)", v.full_name, what,
             value)
    out = {what: value}
    throttle = pacing.restore_stale(_sysfs())  # a paced drain's, killed with it
    if throttle is not None:
        out["cache_copy_throttle"] = str(throttle)
    return out


def _sysfs() -> Sysfs:
    return Sysfs()


def restore_split(vg_lv: str) -> dict[str, str]:
    """The journal of a detach or remove killed after lvm2 split (or uncached) the LV and
    before the journal went: the LV has no cache to put a policy back on. A cache pool keeps
    the cleaner in its own metadata (docs/kernel-notes.md, "lvm2"), so its policy goes back
    on the pool; then the journal goes. {} when there is none."""
    vg, lv = command.check_vg_lv(vg_lv)
    require_root("restoring an interrupted drain")
    with _locked(vg, lv):
        path, saved = _saved(vg_lv)
        if saved is None:
            return {}
        out: dict[str, str] = {}
        pool = saved.get("pool")
        if saved.get("segtype") == "cache" and saved.get("pool_kind") == "cachepool" \
                and isinstance(pool, str):
            command.check_vg_lv(f"{vg}/{pool}")
            layout = field(command.LiveLvs().report(), vg, pool, "lv_layout")
            if "pool" in layout.split(","):
                _cleaner_off(saved, target=f"{vg}/{pool}")
                out = {"policy": str(saved.get("policy") or "smq"), "on": f"{vg}/{pool}"}
        path.unlink(missing_ok=True)
        log.info("%s: the journal of an interrupted detach/remove is done with (%s)", vg_lv,
                 out or "nothing to put back")
        return out


def restore_interrupted(d: LvmDevice) -> dict[str, str]:
    v = lv_of(d)
    require_root("restoring an interrupted drain")
    with _locked(v.vg, v.lv):
        return restore_saved(d)


def drain(d: LvmDevice, *, timeout: float = 24 * 3600.0, stall_timeout: float = 60.0,
          confirm: float = 1.0, interval: float = 0.5, progress: ProgressFn | None = None,
          final_mode: CacheMode | None = None, then: Callable[[LvmDevice], Any] | None = None,
          keep_cleaner: bool = False, max_latency_ms: float | None = None,
          ) -> tuple[int | None, float, dict[str, Any], Any]:
    """Write every dirty block back to the origin LV through lvm2's cleaner, with progress.

    Returns (dirty bytes at the start, seconds, what was restored, ``then``'s result).
    ``then(d)`` runs once clean with the cleaner still on (no new dirty blocks): the split or
    uncache of detach/remove; ``keep_cleaner`` leaves the policy to it (the split-off pool gets
    it back). ``final_mode`` is switched to before the policy goes back. Raises AlreadyError
    when there was nothing to do.

    ``max_latency_ms`` (an lvmcache only): a paced drain, which keeps the p99 latency of the
    other IO on the LV under that bound through dm_cache's copy throttle (lvm2 has no setting
    for it: docs/kernel-notes.md, "Pacing a dm-cache drain"), put back at the end; the
    cleaner's table is then never loaded again to hurry its tail (that holds the LV's IO).
    The result's restored dict then has the pacing under "pacing".
    """
    v = lv_of(d)
    if max_latency_ms is not None and not isinstance(d, DmCacheDevice):
        raise UsageError(f"{v.full_name}: --max-latency paces dm-cache drains (bcache, "
                         "dm-cache, lvmcache); an LVM writecache drains at its own pace",
                         hint="drain without --max-latency")
    if final_mode is not None:
        check_mode(d, final_mode)
    refuse_unhealthy(d, "cache contents")
    require_root("draining")
    with _locked(v.vg, v.lv), terminate_as_interrupt():
        if state.read_json(journal(v)) is not None:
            restore_saved(d)
        d = reread(d)
        v = lv_of(d)
        t0 = time.monotonic()
        blocks, start = _dirty(d)
        mode_now = v.cache_mode or d.mode.value
        if not blocks and then is None:
            if final_mode is None or final_mode.value == mode_now:
                raise AlreadyError(f"{v.full_name} is already clean (0 dirty blocks)")
            command.lvchange(v.full_name, "--cachemode", final_mode.value)
            _clean_after(d, final_mode.value, None, False)
            return start, time.monotonic() - t0, {"mode": final_mode.value, "switched": True}, \
                None
        saved: dict[str, Any] = {"lv": v.full_name, "segtype": v.segtype, "policy": v.policy,
                                 "pool": v.pool_name, "pool_kind": v.pool_kind,
                                 "cleaner": v.setting("cleaner") or "0",
                                 "cache_mode": mode_now, "started": time.time()}
        path = journal(v)
        state.write_json(path, saved)
        on = done = False
        result: Any = None
        origin = d.origin.name if d.origin is not None else None
        summary: dict[str, object] | None = None
        try:
            with pacing.paced(_sysfs(), d.kernel_name, origin, max_latency_ms,
                              v.full_name) as paced:
                _cleaner_on(v)
                on = True
                _wait_clean(d, timeout=timeout, stall_timeout=stall_timeout, confirm=confirm,
                            interval=interval, progress=progress, t0=t0, start=start,
                            paced=paced)
                summary = paced.summary() if paced is not None else None
            if final_mode is not None and final_mode.value != mode_now:
                command.lvchange(v.full_name, "--cachemode", final_mode.value)
            if then is not None:
                result = then(d)
            done = True
        finally:
            if on and not (done and keep_cleaner):
                try:
                    _cleaner_off(saved)
                except CacheMgrError as exc:
                    log.error("%s: could not put the %s back (%s); the journal %s keeps it: "
                              "cachemgr drain %s --resume", v.full_name,
                              "cleaner setting" if v.segtype == "writecache" else "policy",
                              exc, path, v.full_name)
                    raise
            if not (done and keep_cleaner):
                path.unlink(missing_ok=True)
        _clean_after(d, final_mode.value if final_mode else mode_now, then, keep_cleaner)
        restored: dict[str, Any] = ({"cleaner": saved["cleaner"]} if v.segtype == "writecache"
                                    else {"policy": saved["policy"], "mode": final_mode.value
                                          if final_mode else mode_now})
        if final_mode is not None:
            restored["switched"] = final_mode.value != mode_now
        if summary is not None:
            restored["pacing"] = summary
        return start, time.monotonic() - t0, restored, result


def _clean_after(d: LvmDevice, mode: str, then: Any, keep_cleaner: bool) -> None:
    """The status read after lvm2 put the policy back: a dm-cache LV in writethrough or
    passthrough that reads dirty blocks then is not called clean (CacheMgrError, exit 1).
    lvm2's reload keeps dm-cache's metadata object, opened with the clean-shutdown flag of
    its first open: after an unclean shutdown every reload marks each cached block dirty
    again (docs/kernel-notes.md, "Why a cache does not help")."""
    if not isinstance(d, DmCacheDevice) or then is not None or keep_cleaner \
            or mode == CacheMode.WRITEBACK.value:
        return
    blocks, nbytes = _dirty(d)
    if blocks:
        name = lv_of(d).full_name
        raise CacheMgrError(
            f"{name}: every dirty block was written back, but {blocks} blocks "
            f"({human(nbytes)}) read dirty after lvm2 put the policy back ({mode}); it is "
            "not clean: its cache metadata was opened after an unclean shutdown, and each "
            "lvm2 reload marks every cached block dirty again",
            hint=f"smq writes them back when the LV idles; cachemgr doctor {name} shows the "
                 "pace")


def _requeue(d: DmCacheDevice, flat: list[Any], blocks: int,
             nbytes: int | None) -> tuple[int | None, int | None]:
    """``flat`` is [dirty blocks last seen falling to, since when, loads since the last
    fall (None: never again)]. When the count has stood still for REQUEUE_AFTER_S (doubled
    for each load since the last fall), the cleaner table is loaded again and the count read
    again."""
    now = time.monotonic()
    if flat[0] is None or blocks < flat[0]:
        flat[:] = [blocks, now, 0 if flat[2] is not None else None]
        return blocks, nbytes
    if flat[2] is None or now - flat[1] < min(REQUEUE_AFTER_S * 2 ** flat[2],
                                              REQUEUE_MAX_WAIT_S):
        return blocks, nbytes
    held = dm_switch.requeue_cleaner(d.name)
    flat[1], flat[2] = time.monotonic(), flat[2] + 1
    if held is None:
        flat[2] = None  # not the drain's table (any more): leave it alone
        return blocks, nbytes
    log.info("%s: %d dirty block(s) held back by the cleaner: its table loaded again "
             "(IO held for %.2f s)", lv_of(d).full_name, blocks, held)
    return _dirty(d)


def _wait_clean(d: LvmDevice, *, timeout: float, stall_timeout: float, confirm: float,
                interval: float, progress: ProgressFn | None, t0: float,
                start: int | None, paced: pacing.Paced | None = None) -> None:
    v = lv_of(d)
    if paced is not None:
        interval = max(interval, 1.0)  # as the dm-cache flush (flushing._poll_clean)
    hot: list[Any] = [None, time.monotonic()]  # dirty blocks standing still, since when
    flat: list[Any] = [None, time.monotonic(), 0]  # the same for dm-cache; fruitless loads

    def sample() -> drainloop.Sample[tuple[int | None, int | None]]:
        if paced is not None:
            paced.step(v.full_name)
        blocks, nbytes = _dirty(d)
        if isinstance(d, DmCacheDevice) and blocks and paced is None:
            blocks, nbytes = _requeue(d, flat, blocks, nbytes)
        if isinstance(d, DmWritecacheDevice) and blocks and blocks <= HELD_FLUSH_BLOCKS:
            now = time.monotonic()
            if blocks != hot[0]:
                hot[:] = [blocks, now]
            elif now - hot[1] >= HELD_FLUSH_AFTER_S:
                held = dmwritecache.flush_held(d.name)
                log.info("%s: %d dirty block(s) kept rewritten for %.0f s: written back with "
                         "IO held for %.2f s", v.full_name, blocks, now - hot[1], held)
                hot[:] = [None, time.monotonic()]
                blocks, nbytes = _dirty(d)
        return drainloop.Sample((blocks, nbytes), nbytes,
                                CacheState.DIRTY if blocks else CacheState.CLEAN,
                                blocks == 0, blocks)

    def stalled(raw: tuple[int | None, int | None], progressed: bool) -> StallError:
        why = ("; a writecache still caches writes to the blocks it holds while it cleans "
               "(dm-writecache's cleaner); cachemgr writes the last "
               f"{HELD_FLUSH_BLOCKS} blocks back with IO held, but more than that were "
               "rewritten all the time: pause the busiest writer and run it again"
               if v.segtype == "writecache" else "")
        return StallError(
            f"{v.full_name}: no progress for {stall_timeout:g} s ({raw[0]} dirty blocks, "
            f"{human(raw[1])}); the original settings are put back, the dirty data stays safe "
            "in the cache", hint=kernlog.stall_hint(
                _sysfs(), d.cache.name if d.cache else None,
                d.origin.name if d.origin else None,
                f"check the origin's PVs for errors (dmesg); a longer --stall-timeout waits "
                f"longer{why}"))

    def timed_out(raw: tuple[int | None, int | None]) -> TimeoutExpired:
        return TimeoutExpired(f"{v.full_name}: still {raw[0]} dirty blocks after {timeout:g} s; "
                              "the original settings are put back")

    first: drainloop.Sample[tuple[int | None, int | None]] = drainloop.Sample(
        (None, start), start,
                             CacheState.DIRTY if start else CacheState.CLEAN, not start)
    drainloop.wait_clean(sample, action="flush", device=v.full_name, timeout=timeout,
                         stall_timeout=stall_timeout, confirm=confirm, interval=interval,
                         progress=progress, stall_error=stalled, timeout_error=timed_out,
                         rate="mean", first=first, t0=t0,
                         explain=None if paced is None else lambda *_: paced.words(),
                         sleep=time.sleep if paced is None else paced.sampler.sleep,
                         moving=None if paced is None else paced.moving)


# ----------------------------------------------------------------------------- detach/remove


def detach(d: LvmDevice, *, timeout: float, stall_timeout: float,
           progress: ProgressFn | None) -> list[Change]:
    """Drain, then ``lvconvert --splitcache``: the LV goes on uncached, the cache pool or
    cachevol is kept (a cache pool gets its original policy back)."""
    v = lv_of(d)
    pool = f"{v.vg}/{v.pool_name}"

    def split(cur: LvmDevice) -> None:
        command.lvconvert("--splitcache", "--", lv_of(cur).full_name)

    start, _, _, _ = drain(d, timeout=timeout, stall_timeout=stall_timeout, progress=progress,
                           then=split, keep_cleaner=True)
    saved = state.read_json(journal(v)) or {}
    if saved and v.segtype == "cache" and v.pool_kind == "cachepool":
        _cleaner_off(saved, target=pool)  # the policy lives on in the pool's metadata
    journal(v).unlink(missing_ok=True)
    return [Change(v.full_name, "cache", pool, None),
            Change(v.full_name, "written back", human(start), "0")]


def uncache(d: LvmDevice, *, timeout: float, stall_timeout: float,
            progress: ProgressFn | None) -> list[Change]:
    """Drain, then ``lvconvert --uncache``: the LV goes on uncached and its cache pool (or
    cachevol) is deleted."""
    v = lv_of(d)

    def remove(cur: LvmDevice) -> None:
        command.lvconvert("--uncache", "--", lv_of(cur).full_name)

    start, _, _, _ = drain(d, timeout=timeout, stall_timeout=stall_timeout, progress=progress,
                           then=remove, keep_cleaner=True)
    journal(v).unlink(missing_ok=True)
    return [Change(v.full_name, "cache", f"{v.vg}/{v.pool_name}", None),
            Change(v.full_name, "written back", human(start), "0")]


# ----------------------------------------------------------------------------- attach / tune


def settings_word(settings: Sequence[tuple[str, str]]) -> str:
    for k, v in settings:
        if not re.fullmatch(r"[a-z_]{1,64}", k) or not re.fullmatch(r"[0-9A-Za-z_.]{1,64}", v):
            raise UsageError(f"cache setting {k}={v} is not NAME=VALUE")
    return " ".join(f"{k}={v}" for k, v in settings)


def attach(origin: str, cache: str, *, writecache: bool = False,
           mode: CacheMode | None = None, policy: str | None = None,
           settings: Sequence[tuple[str, str]] = ()) -> Change:
    """Attach the cache pool or cachevol ``cache`` (VG/LV) to ``origin`` (VG/LV), with
    lvm2's ``--cachemode``/``--cachepolicy``/``--cachesettings`` when given."""
    ovg, olv = command.check_vg_lv(origin)
    cvg, clv = command.check_vg_lv(cache)
    if ovg != cvg:
        raise UsageError(f"{origin} and {cache} are in different VGs",
                         hint="LVM caches an LV only with a cache pool or cachevol of its VG")
    if mode is not None and (writecache or mode not in LVM_CACHE_MODES):
        raise UsageError(f"--mode {mode.value} does not apply here",
                         hint="writecache has no modes; lvmcache: writeback, writethrough, "
                              "passthrough")
    require_root("attaching")
    rows = command.LiveLvs().report()
    olay, clay = field(rows, ovg, olv, "lv_layout"), field(rows, cvg, clv, "lv_layout")
    if not olay:
        raise UsageError(f"{origin}: no such LV", hint="lvs lists them")
    if "cache" in olay.split(",") or "writecache" in olay.split(","):
        pool = field(rows, ovg, olv, "pool_lv").strip("[]")
        raise AlreadyError(f"{origin} is cached already ({olay}, with {ovg}/{pool})")
    if not clay:
        raise UsageError(f"{cache}: no such LV", hint="lvs lists them")
    if "pool" in clay.split(",") and writecache:
        raise UsageError(f"{cache} is a cache pool: writecache takes a plain LV as cachevol")
    is_pool = "pool" in clay.split(",")
    if not is_pool:
        if clay != "linear" and "striped" not in clay:
            raise UsageError(f"{cache} ({clay}) is neither a cache pool nor a plain LV")
        if field(rows, cvg, clv, "lv_device_open") == "open":
            raise UnsafeError(f"{cache} is open (mounted or in use): attaching it as a "
                              "cachevol would overwrite it; nothing was changed")
    with _locked(ovg, olv):
        argv = ["--type", "writecache" if writecache else "cache"]
        argv += ["--cachepool" if is_pool else "--cachevol", f"{cvg}/{clv}"]
        if mode is not None:
            argv += ["--cachemode", mode.value]
        if policy is not None:
            if not re.fullmatch(r"[a-z0-9_]{1,32}", policy):
                raise UsageError(f"{policy!r} is not a cache policy name")
            argv += ["--cachepolicy", policy]
        if settings:
            argv += ["--cachesettings", settings_word(settings)]
        if writecache and field(rows, cvg, clv, "lv_active") == "active":
            command.lvchange(f"{cvg}/{clv}", "-an")  # lvm2: the cachevol must be inactive
        try:
            command.lvconvert(*argv, "--", f"{ovg}/{olv}", timeout=600)
        except CommandError as exc:
            raise CacheMgrError(f"lvm2 did not attach {cache} to {origin}: {command.why(exc)}",
                                hint="nothing else was changed") from None
    return Change(origin, "cache", None, cache)


def tunables(d: LvmDevice) -> dict[str, tuple[int, int]]:
    return dict(WRITECACHE_TUNABLES if isinstance(d, DmWritecacheDevice) else CACHE_TUNABLES)


def check_tunable(d: LvmDevice, name: str, value: int) -> None:
    t = tunables(d)
    if name not in t:
        raise UsageError(f"unknown {lv_of(d).kind} tunable {name!r}",
                         hint=f"{lv_of(d).kind} has: {', '.join(sorted(t))}")
    lo, hi = t[name]
    if not lo <= value <= hi:
        raise UsageError(f"{name}={value} is out of range ({lo}..{hi})")


def tune(d: LvmDevice, name: str, value: int) -> Change:
    """``lvchange --cachesettings NAME=VALUE``; AlreadyError when lvm2 has that value."""
    check_tunable(d, name, value)
    v = lv_of(d)
    refuse_unhealthy(d, name)
    require_root("tuning")
    with _locked(v.vg, v.lv):
        cur = lv_of(reread(d)).setting(name)
        if cur == str(value):
            raise AlreadyError(f"{v.full_name}: {name} is already {value}")
        command.lvchange(v.full_name, "--cachesettings", f"{name}={value}")
        return Change(v.full_name, name, cur, str(value))
