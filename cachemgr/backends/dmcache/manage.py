"""Changes to a running dm-cache device: its mode, its removal (flush, then a linear
mapping of the origin, then ``dmsetup remove``), its migration_threshold."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from cachemgr.backends.dmcache import command, discover
from cachemgr.backends.dmcache.flushing import flush_locked, lock_key, recover
from cachemgr.backends.dmcache.refusals import bad_mode, check_changeable
from cachemgr.backends.dmcache.switch import switch_table, with_threshold
from cachemgr.core import state
from cachemgr.core.change import Change
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    UnsafeError,
    UsageError,
    require_root,
)
from cachemgr.core.model import DM_CACHE_MODES, CacheMode, DmCacheDevice, DrainProgress, human
from cachemgr.core.signals import terminate_as_interrupt
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)


def set_mode(sysfs: Sysfs, d: DmCacheDevice, mode: CacheMode) -> Change:
    """Switch the mode by suspend / reload / resume. passthrough needs a clean cache: refused
    (exit 3) while dirty, with the advice to drain; writeback -> passthrough goes through
    writethrough so that no write can dirty a block between the check and the switch."""
    if mode not in DM_CACHE_MODES:
        raise bad_mode(mode)
    check_changeable(d, "mode", f"lvchange --cachemode {mode.value} VG/LV")
    if d.table.mode == mode and d.mode == mode:
        raise AlreadyError(f"{d.node} is already in {mode.value} mode")
    require_root("changing a dm-cache mode")
    with state.locked(lock_key(d), d.node):
        d = recover(sysfs, d)
        assert d.status is not None
        before = d.mode
        thr = d.status.migration_threshold
        live = d.table.line()
        via_wt = False
        if mode == CacheMode.PASSTHROUGH:
            refuse_dirty(d)
            if d.table.mode == CacheMode.WRITEBACK:
                # no write can dirty a clean block in writethrough: the check below holds
                wt = with_threshold(d.table.with_mode(CacheMode.WRITETHROUGH), thr).line()
                switch_table(d.name, live, wt)
                live, via_wt = wt, True
        new = with_threshold(d.table.with_mode(mode), thr).line()
        try:
            switch_table(d.name, live, new, require_clean=mode == CacheMode.PASSTHROUGH)
        except (UnsafeError, CommandError) as exc:
            # switch_table left ``live`` running; undo the step through writethrough too
            if via_wt:
                switch_table(d.name, live, with_threshold(d.table, thr).line())
            if mode != CacheMode.PASSTHROUGH or (isinstance(exc, CommandError)
                                                 and "resume" not in exc.argv):
                raise
            raise _dirty_refusal(discover.find(sysfs, d.name), "dirty blocks appeared") from exc
    now = discover.find(sysfs, d.name)
    if now.mode != mode:
        raise CacheMgrError(f"{d.node}: loaded {mode.value} but the kernel reports {now.mode}")
    return Change(d.node, "cache_mode", before.value, now.mode.value)


def _dirty_refusal(d: DmCacheDevice, detail: str = "") -> UnsafeError:
    n = d.status.dirty if d.status else "?"
    size = human(d.dirty_bytes) if d.dirty_bytes is not None else "?"
    msg = (f"{d.node} has {n} dirty blocks ({size}) in its cache; dm-cache accepts "
           "passthrough only when every block is clean; nothing was changed")
    if detail:
        msg += f" ({detail})"
    return UnsafeError(msg, hint=f"flush first: cachemgr mode {d.name} passthrough --drain")


def refuse_dirty(d: DmCacheDevice) -> None:
    """passthrough's refusal while a block is dirty (exit 3)."""
    if d.status is None or d.status.dirty:
        raise _dirty_refusal(d)


def in_use_reason(d: DmCacheDevice) -> str | None:
    if d.holders:
        return f"held by {', '.join(d.holders)}"
    if d.open_count:
        return f"open {d.open_count} time(s) (a VM, a mount or another program uses it)"
    return None


def in_use_refusal(d: DmCacheDevice, keep_device: bool) -> UnsafeError | None:
    """remove's refusal of a device in use (None: not in use, or kept as a linear one)."""
    why = in_use_reason(d)
    if why and not keep_device:
        return UnsafeError(
            f"{d.node} is in use ({why}); removing it would pull the disk from under its "
            "users; nothing was changed",
            hint=f"stop its users first, or keep the device as a plain mapping of the "
                 f"origin: cachemgr remove {d.name} --keep-device")
    return None


def remove(sysfs: Sysfs, d: DmCacheDevice, *, keep_device: bool = False,
           timeout: float = 24 * 3600, stall_timeout: float = 60.0, confirm: float = 1.0,
           progress: Callable[[DrainProgress], None] | None = None) -> list[Change]:
    """Safe decommission: flush, then replace the table by a ``linear`` mapping of the
    origin (checked clean while suspended), then ``dmsetup remove``. The origin then holds
    every byte written. Refused while the device is in use unless ``keep_device`` (the
    device stays, now linear over the origin, and its users keep running)."""
    check_changeable(d, "cache", "lvconvert --uncache VG/LV")
    if d.table.start != 0:
        raise UsageError(f"{d.node}: the cache target starts at sector {d.table.start}; "
                         "cachemgr removes whole-device caches only")
    err = in_use_refusal(d, keep_device)
    if err is not None:
        raise err
    require_root("removing a dm-cache device")
    linear = f"0 {d.table.length} linear {d.table.origin_dev} 0"
    changes: list[Change] = []
    with state.locked(lock_key(d), d.node), terminate_as_interrupt():
        d = recover(sysfs, d)
        assert d.status is not None
        dirty = d.status.dirty
        res = flush_locked(d, linear, require_clean=True, timeout=timeout,
                            stall_timeout=stall_timeout, confirm=confirm, interval=0.5,
                            progress=progress)
        if dirty:
            changes.append(Change(d.node, "flush", f"{dirty} dirty blocks", "0 dirty blocks"))
        changes.append(Change(d.node, "table", "cache", f"linear {d.table.origin_dev}"))
        if not keep_device:
            command.dmsetup("remove", "--retry", d.name, timeout=60)
            changes.append(Change(d.node, "remove", "linear", None))
    log.info("%s: removed after %.1f s of flushing", d.node, res.elapsed_s)
    return changes


def set_migration_threshold(sysfs: Sysfs, d: DmCacheDevice, sectors: int) -> Change:
    """``dmsetup message NAME 0 migration_threshold N``: how many sectors of migration
    (promotion, demotion, writeback) may be in flight; read back from the status. A table
    reload resets it to the table's value: cachemgr's own reloads carry it forward."""
    check_changeable(d, "migration_threshold",
                      f"lvchange --cachesettings migration_threshold={sectors} VG/LV")
    assert d.status is not None
    if not d.table.block_sectors <= sectors <= 2**32 - 1:
        raise UsageError(
            f"migration_threshold must be at least one cache block ({d.table.block_sectors} "
            f"sectors) and at most {2**32 - 1}, not {sectors}",
            hint="below one block the policy never sees the device idle: smq never writes "
                 "dirty blocks back and a flush crawls")
    before = d.status.migration_threshold
    if before == sectors:
        raise AlreadyError(f"{d.node}: migration_threshold is already {sectors}")
    require_root("tuning a dm-cache device")
    command.dmsetup("message", d.name, "0", "migration_threshold", str(sectors))
    st = command.read_status(d.name)
    after = None if isinstance(st, str) else st.migration_threshold
    if after != sectors:
        raise CacheMgrError(f"{d.node}: wrote migration_threshold={sectors}, the kernel "
                            f"keeps {after}")
    return Change(d.node, "migration_threshold", str(before), str(after))


def invalidate(sysfs: Sysfs, d: DmCacheDevice, *, final_mode: CacheMode | None = None,
               lvm_name: str | None = None,
               origin_blocks: Collection[int] | None = None) -> list[Change]:
    """Drop every block the cache holds: passthrough (suspend / reload / resume, checked
    clean while suspended), ``invalidate_cblocks 0-N`` over every cache block, then the mode
    it had (``final_mode``: the one an interrupted invalidation recorded). dm-cache takes the
    message in passthrough only (dm-cache-target.c, process_invalidate_cblocks_message), and
    in passthrough every read goes to the origin, so no stale block is served between the
    steps. Refused (exit 3) while a block is dirty or the device is in writeback.

    ``lvm_name``: an LVM-owned cache (VG/LV): lvm2 switches the mode (``lvchange
    --cachemode``); only the message goes to the device itself, which changes the cache's own
    metadata, not the table or anything lvm2 records (docs/kernel-notes.md, "Dropping a
    device's cached copies").

    ``origin_blocks``: only the cache blocks holding these origin blocks are dropped (a
    scrub's mismatches), found in the metadata once in passthrough (which promotes
    nothing: the mapping holds still), and checked by the count of blocks in use going down
    by as many."""
    if lvm_name is None:
        check_changeable(d, "cached blocks", "lvchange --cachemode passthrough VG/LV")
    assert d.status is not None
    back = final_mode or d.mode
    if back == CacheMode.WRITEBACK or d.mode == CacheMode.WRITEBACK or d.status.dirty:
        raise UnsafeError(
            f"{d.node} is in {d.mode.value} mode with {d.status.dirty} dirty blocks: its "
            "copies are not dropped while the cache may hold data the origin does not; "
            "nothing was changed",
            hint=f"cachemgr mode {lvm_name or d.name} writethrough --drain, then cachemgr "
                 f"invalidate {lvm_name or d.name}")
    require_root("dropping a cache's copies")
    changes: list[Change] = []
    with state.locked(lock_key(d), d.node):
        if lvm_name is None:
            d = recover(sysfs, d)
        assert d.status is not None
        thr = d.status.migration_threshold
        live = d.table.line()  # the table running now (lvm2 loads its own: not used then)
        if d.mode != CacheMode.PASSTHROUGH:
            if lvm_name is not None:
                from cachemgr.backends.lvm import command as lvm_command

                lvm_command.lvchange(lvm_name, "--cachemode", "passthrough")
            else:
                pt = with_threshold(d.table.with_mode(CacheMode.PASSTHROUGH), thr).line()
                switch_table(d.name, live, pt, require_clean=True)
                live = pt
            changes.append(Change(lvm_name or d.node, "cache_mode", d.mode.value,
                                  "passthrough"))
        # the status alone from here (one dmsetup call each: libvirt waits for the hook)
        now = command.read_status(d.name)
        if isinstance(now, str) or now.mode != CacheMode.PASSTHROUGH:
            raise CacheMgrError(f"{d.node}: loaded passthrough but the kernel reports "
                                f"{now if isinstance(now, str) else now.mode.value}; its "
                                "copies are not dropped",
                                hint=f"cachemgr invalidate {lvm_name or d.name} --yes")
        used = now.used
        if origin_blocks is not None:
            from cachemgr.backends.dmcache import mappings

            mp = mappings.mapped(d)
            cblocks = sorted({mp[o][0] for o in origin_blocks if o in mp})
            for i in range(0, len(cblocks), 256):  # a message's arguments, a batch at a time
                command.dmsetup("message", d.name, "0", "invalidate_cblocks",
                                *(str(c) for c in cblocks[i:i + 256]), timeout=600)
            want = used - len(cblocks)
        else:
            cblocks = []
            if used:
                command.dmsetup("message", d.name, "0", f"invalidate_cblocks 0-{now.total}",
                                timeout=600)
            want = 0
        after = command.read_status(d.name)
        if isinstance(after, str) or after.used != want:
            raise CacheMgrError(
                f"{d.node}: {'?' if isinstance(after, str) else after.used} cache blocks "
                f"in use after invalidate_cblocks, not {want}; it stays in passthrough "
                "(reading the origin)", hint=f"cachemgr invalidate {lvm_name or d.name} --yes")
        changes.append(Change(lvm_name or d.node, "cached blocks", str(used), str(want))
                       if origin_blocks is None else
                       Change(lvm_name or d.node, "mismatched cache blocks dropped",
                              str(used), f"{want} ({len(cblocks)} dropped: "
                              + ", ".join(map(str, cblocks[:16]))
                              + (", ..." if len(cblocks) > 16 else "") + ")"))
        if back is not None and back != CacheMode.PASSTHROUGH:
            if lvm_name is not None:
                from cachemgr.backends.lvm import command as lvm_command

                lvm_command.lvchange(lvm_name, "--cachemode", back.value)
            else:
                switch_table(d.name, live,
                             with_threshold(d.table.with_mode(back), thr).line())
            changes.append(Change(lvm_name or d.node, "cache_mode", "passthrough",
                                  back.value))
    return changes
