"""Safe replacement of a bcache cache SSD under running VMs: the bcache kind's steps.

The source site's procedure, done while VMs kept writing: switch the cache mode to none, wait
for the dirty data to reach 0, SCSI-remove the SSD, SCSI-insert it (or a new one), add it back.
The kernel's own cookbook (bcache.rst) adds what makes it safe: detach every backing device
(which flushes), unregister the set, make a fresh cache, register, attach to the new set.

Each step below is idempotent: it first checks whether its effect is already there (so a
resumed run does not repeat or undo work), then acts, then the journal under
/var/lib/cachemgr/replace/<id>.json records it (atomically) before the next step starts. A run
killed at any point is finished by ``--resume ID``; before the old cache set is unregistered it
can instead be rolled back (``--rollback ID``: modes and tunables put back). A lock per cache
set stops two runs on one cache. The VMs' /dev/bcacheN devices stay up throughout: detached
backing devices keep running in passthrough.

Every step that could lose data refuses instead: dirty data that will not drain stops the run
before the cache set is touched (the data stays safe on the SSD); the wrong disk (in use,
carrying a filesystem or another cache set, too small, or the old SSD when a new one was
asked for) is refused before it is formatted.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict
from typing import Any

from cachemgr.backends import bcache, bcache_super, hotplug, signatures, snapshot
from cachemgr.backends.targets import resolve_cache_set
from cachemgr.core import signals
from cachemgr.core.errors import AlreadyError, CacheMgrError, CommandError, UnsafeError, UsageError
from cachemgr.core.model import (
    BcacheBacking,
    CacheMode,
    CacheSet,
    CacheState,
    DrainProgress,
    Snapshot,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain, keys
from cachemgr.procedures.replace import steps
from cachemgr.procedures.replace.base import Ctx, Kind
from cachemgr.procedures.replace.journal import Journal, Options, new_run_id
from cachemgr.procedures.replace.shared import (
    check_new_spec,
    drain_reporter,
    find_new,
    hotplug_disk,
    old_match,
    old_present,
    refuse_unpullable,
    s_identify_new,
    s_remove_old,
    s_wait_new,
    ssd_words,
    super_fields,
    warm_step,
)

# the package's one logger, named as before the package was split into modules
log = logging.getLogger(__package__)

STEPS = steps.BCACHE
STEP_NAMES = tuple(name for name, _ in STEPS)
# Steps after which a rollback is no longer possible (the old set is gone).
POINT_OF_NO_RETURN = "unregister"


def _stable(b: BcacheBacking) -> str:
    if not b.uuid:
        raise UnsafeError(f"{b.device or b.identity.node} has no bcache UUID to follow it by")
    return b.uuid


# --------------------------------------------------------------------------------- planning


def plan(sysfs: Sysfs, cache: str, opts: Options) -> Journal:
    """Preflight and remember: everything is checked before anything is changed."""
    if opts.interim_mode not in (CacheMode.NONE.value, CacheMode.WRITETHROUGH.value,
                                 CacheMode.WRITEAROUND.value):
        raise UsageError(f"interim mode {opts.interim_mode!r} would keep making dirty data",
                         hint="use none (default), writearound or writethrough")
    snap = snapshot.take(sysfs, probe_unregistered=True)
    cset = resolve_cache_set(snap, cache, sysfs)
    bcache_super.refuse_orphaned_dirt(snap, cset.uuid)
    bcache_super.refuse_unreadable(sysfs, cset.uuid, "replacing the SSD")
    if len(cset.caches) != 1:
        raise UnsafeError(f"cache set {cset.uuid} has {len(cset.caches)} cache devices; "
                          "replace-ssd handles sets with exactly one")
    ssd = cset.caches[0]
    disk = hotplug_disk(sysfs, ssd.identity.name, ssd.identity.node)
    refuse_unpullable(sysfs, disk, ssd.identity.name)
    if cset.flash_volumes:
        raise UnsafeError(f"cache set {cset.uuid} holds {cset.flash_volumes} flash volume(s): "
                          "their data lives only on the SSD",
                          hint="move their data off and remove them first")
    attached = [b for b in snap.backings if b.cset_uuid == cset.uuid]
    names = set(cset.backing_names)
    if {b.identity.name for b in attached} != names:
        raise UnsafeError(f"cache set {cset.uuid} lists backing devices {sorted(names)} that "
                          "are not all readable here")
    for b in attached:
        _stable(b)
        if b.state == CacheState.INCONSISTENT:
            raise UnsafeError(f"{b.device}: state inconsistent; do not touch its cache")
        if b.writeback_running is False:
            raise UnsafeError(f"{b.device}: writeback is switched off, so it cannot drain",
                              hint=f"cachemgr tune {b.device} writeback_running=1")
    if ssd.io_errors:
        log.warning("%s has %d IO errors (a worn SSD: replacing it is right)",
                    ssd.identity.node, ssd.io_errors)
    old_id = old_match(disk)
    twins = [d.node for d in hotplug.disks(sysfs) if old_id.matches(d) and d.name != disk.name]
    if twins:
        raise UnsafeError(f"{disk.node} cannot be told apart from {', '.join(twins)}: they "
                          f"share its {old_id}; the replacement finds the old SSD again by it "
                          "after the cache set is gone",
                          hint="replace this SSD by hand (docs/admin-guide.md, the runbook)")
    check_new_spec(sysfs, opts.new, disk, cset.uuid, ssd.bucket_size.low
                    if ssd.bucket_size else None)
    if opts.new == "any" and not opts.yes and not sys.stdin.isatty():
        raise UsageError("--new any needs an operator to swap the disk",
                         hint="run it on a terminal, or pass --yes once the disk is in")
    run_id = new_run_id(cset.uuid[:8])
    j = Journal(
        id=run_id,
        cset=cset.uuid,
        options=asdict(opts),
        old={**hotplug.record(disk),
             "bucket": ssd.bucket_size.low if ssd.bucket_size else None},
        backings=[{
            "uuid": _stable(b), "name": b.identity.name, "node": b.identity.node,
            "device": b.device, "mode": b.mode.value if b.mode else None,
            "tunables": _tunables(b),
        } for b in attached],
        congested={k: v for k, v in (
            ("congested_read_threshold_us", cset.congested_read_threshold_us),
            ("congested_write_threshold_us", cset.congested_write_threshold_us),
        ) if v is not None},
    )
    return j


def _tunables(b: BcacheBacking) -> dict[str, int]:
    vals: dict[str, int | None] = {
        "writeback_percent": b.writeback_percent,
        "writeback_delay": b.writeback_delay,
        "writeback_rate_minimum": b.writeback_rate_minimum,
        "sequential_cutoff": b.sequential_cutoff.low if b.sequential_cutoff else None,
        "writeback_running": None if b.writeback_running is None else int(b.writeback_running),
    }
    return {k: v for k, v in vals.items() if v is not None}


def _head(j: Journal) -> list[str]:
    old = j.old
    devs = ", ".join(f"{b['device'] or b['node']} ({b['mode']})" for b in j.backings) or "none"
    return [f"replace the cache SSD {ssd_words(old)} of cache set {j.cset}",
            f"backing devices: {devs}"]


# --------------------------------------------------------------------------------- steps


def s_mode_interim(c: Ctx) -> None:
    snap = c.snap()
    mode = CacheMode(c.opts.interim_mode)
    for e in c.j.backings:
        b = c.backing(e["uuid"], snap)
        if b.cset_uuid != c.j.cset:
            continue  # already detached in an earlier run
        try:
            bcache.set_mode(c.sysfs, b, mode)
            c.say(f"{c.dev(e)}: mode {b.mode} -> {mode}")
        except AlreadyError:
            pass


class _Stopped(Exception):
    """A drain stopped because another one failed (or the run was interrupted)."""


def s_drain(c: Ctx) -> None:
    """Drain every attached device at the same time, each in its own thread: a drain is mostly
    waiting (for bcache's writeback thread, then the clean confirmation), and one after the
    other those waits added up (~4-6 s per device on the lab). The first failure, Ctrl-C, or
    the face's ``say`` raising (the TUI's cancel) stops the other drains at their next
    progress report (every 0.5 s); each drain restores its own tunables on the way out. So do
    SIGTERM and SIGHUP; the run's journal stays resumable (the step is not marked done)."""
    snap = c.snap()
    todo = [(e, b) for e in c.j.backings
            if (b := c.backing(e["uuid"], snap)).cset_uuid == c.j.cset]
    if not todo:
        return
    stop = threading.Event()
    say_lock = threading.Lock()

    def say(msg: str) -> None:
        with say_lock:
            c.say(msg)

    def one(e: dict[str, Any], b: BcacheBacking) -> None:
        report = drain_reporter(say)

        def prog(p: DrainProgress) -> None:
            if stop.is_set():
                raise _Stopped
            report(p)

        try:
            res = drain.drain(c.sysfs, b, timeout=c.opts.drain_timeout,
                              stall_timeout=c.opts.stall_timeout, progress=prog)
            say(f"{c.dev(e)}: clean after {res.elapsed_s:.1f} s")
        except AlreadyError:
            say(f"{c.dev(e)}: already clean")

    # SIGTERM/SIGHUP reach the main thread, waiting here, as Ctrl-C does (signals.Terminated);
    # the handlers stay until every drain has stopped and put its tunables back
    with signals.terminate_as_interrupt(), \
            ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="drain") as pool:
        # each drain acts for the run (its locks: state.acting_as, a context variable)
        futures = [pool.submit(contextvars.copy_context().run, one, e, b) for e, b in todo]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # Ctrl-C, SIGTERM or SIGHUP while waiting
            stop.set()
            raise
        errors = [exc for f in futures if f.done() and (exc := f.exception()) is not None]
        if errors:
            stop.set()  # leaving the with block waits for the others to stop and restore
            raise errors[0]


def s_detach(c: Ctx) -> None:
    for e in c.j.backings:
        b = c.backing(e["uuid"])
        if b.cset_uuid is None:
            continue
        if b.cset_uuid != c.j.cset:
            raise UnsafeError(f"{c.dev(e)} is attached to another cache set {b.cset_uuid}")
        # drained already, so the detach is quick: poll its state often (0.5 s cost ~0.5 s
        # per device on every replacement)
        bcache.detach(c.sysfs, b, timeout=c.opts.drain_timeout, interval=0.1)
        c.say(f"{c.dev(e)}: detached (passthrough, still serving IO)")


def s_unregister(c: Ctx) -> None:
    snap = snapshot.take(c.sysfs, probe_unregistered=True)
    cset = snap.cache_set(c.j.cset)
    if cset is None:
        return
    bcache_super.refuse_orphaned_dirt(snap, cset.uuid)
    bcache_super.refuse_unreadable(c.sysfs, cset.uuid, "replacing the SSD")
    bcache.unregister_cache_set(c.sysfs, cset, snap.backings)
    # The set's directory goes first; the cache device's own bcache/ directory, its holders
    # link and last its exclusive claim on the device follow a little later (a loaded lab
    # host showed each gap; wipefs then failed with EBUSY): wait for all three, or the next
    # steps would find the SSD still "in use" and refuse.
    name = c.j.old["name"]

    def released() -> bool:
        return not c.sysfs.is_dir(f"block/{name}/bcache") and not c.sysfs.listdir(
            f"block/{name}/holders") and not (c.sysfs.live and bcache.claimed(f"/dev/{name}"))

    if not bcache.wait_for(released, 60, 0.2):
        raise CacheMgrError(f"{c.j.old['node']} is still held by bcache 60 s after its cache "
                            "set was unregistered")
    c.say(f"cache set {c.j.cset} unregistered")


def s_wipe_old(c: Ctx) -> None:
    if not c.opts.wipe_old:
        c.say(f"{c.j.old['node']}: bcache signature kept (--keep-old-signature)")
        return
    d = old_present(c)
    if d is None:
        c.say(f"the old SSD ({old_match(c.j.old)}) is not there any more: nothing to wipe")
        return
    if not bcache.wait_for(lambda: not c.sysfs.exists(f"block/{d.name}/bcache"), 30, 0.2):
        raise UnsafeError(f"{d.node} is still registered with bcache; refusing to wipe it")
    if c.sysfs.live and not bcache.wait_for(lambda: not bcache.claimed(d.node), 30, 0.2):
        raise UnsafeError(f"{d.node} is still held by another user (an exclusive open fails "
                          "with EBUSY); refusing to wipe it")
    if signatures.first(d.node) is None:
        c.say(f"{d.node}: no signature left to wipe")
        return
    signatures.wipe(d.node)
    c.say(f"{d.node}: old bcache signature wiped")


def s_make_cache(c: Ctx) -> None:
    d = find_new(c)
    if d is None:
        raise CacheMgrError("the new SSD vanished before it was formatted")
    if c.j.new.get("cset"):
        sb = super_fields(d.node)
        if sb.get("cset.uuid") == c.j.new["cset"]:
            return  # formatted by an earlier run
    if signatures.first(d.node) is not None:
        signatures.wipe(d.node)  # the re-inserted old cache
    bucket = int(c.j.old.get("bucket") or 512 * 1024)
    try:
        bcache.make_bcache(cache=d.node, bucket=f"{bucket // 1024}k", wipe=True, force=True)
    except CommandError as exc:
        raise CacheMgrError(f"make-bcache failed on {d.node}: {exc}") from exc
    sb = super_fields(d.node)
    if not sb.get("cset.uuid"):
        raise CacheMgrError(f"{d.node}: no cset.uuid after make-bcache")
    c.j.new["cset"] = sb["cset.uuid"]
    c.j.save()
    c.say(f"{d.node}: new cache set {c.j.new['cset']}")


def s_register(c: Ctx) -> None:
    if c.sysfs.is_dir(f"fs/bcache/{c.j.new['cset']}"):
        return
    d = find_new(c)
    if d is None:
        raise CacheMgrError("the new SSD vanished before it was registered")
    try:
        bcache.register(c.sysfs, d.node)
    except AlreadyError:
        pass
    if not bcache.wait_for(lambda: c.sysfs.is_dir(f"fs/bcache/{c.j.new['cset']}"), 30):
        raise CacheMgrError(f"cache set {c.j.new['cset']} did not appear after register")


def _new_set(c: Ctx, snap: Snapshot) -> CacheSet:
    cset = snap.cache_set(c.j.new["cset"])
    if cset is None:
        raise CacheMgrError(f"the new cache set {c.j.new['cset']} is not registered")
    return cset


def s_attach(c: Ctx) -> None:
    snap = c.snap()
    cset = _new_set(c, snap)
    for e in c.j.backings:
        b = c.backing(e["uuid"], snap)
        try:
            bcache.attach(c.sysfs, b, cset)
            c.say(f"{c.dev(e)}: attached to {cset.uuid}")
        except AlreadyError:
            pass


def s_restore(c: Ctx) -> None:
    snap = c.snap()
    cset = _new_set(c, snap)
    for name, value in c.j.congested.items():
        try:
            bcache.set_cache_set_tunable(c.sysfs, cset, name, int(value))
        except AlreadyError:
            pass
    for e in c.j.backings:
        # set_mode compares with the mode read here (nothing else changes it meanwhile: the
        # run holds the lock); set_tunable reads each current value itself
        b = c.backing(e["uuid"], snap)
        if e["mode"]:
            try:
                bcache.set_mode(c.sysfs, b, CacheMode(e["mode"]))
                c.say(f"{c.dev(e)}: mode {e['mode']} restored")
            except AlreadyError:
                pass
        for name, value in e["tunables"].items():
            try:
                bcache.set_tunable(c.sysfs, b, name, int(value))
            except AlreadyError:
                pass


def s_verify(c: Ctx) -> None:
    snap = c.snap()
    problems = []
    for e in c.j.backings:
        b = c.backing(e["uuid"], snap)
        if b.cset_uuid != c.j.new["cset"]:
            problems.append(f"{c.dev(e)} is attached to {b.cset_uuid}, not the new set")
        if e["mode"] and (b.mode.value if b.mode else None) != e["mode"]:
            problems.append(f"{c.dev(e)} is in mode {b.mode}, not {e['mode']}")
        if b.state not in (CacheState.CLEAN, CacheState.DIRTY):
            problems.append(f"{c.dev(e)} is {b.state}")
        if b.device is None:
            problems.append(f"{e['node']} is not running")
    if problems:
        raise CacheMgrError("verification failed: " + "; ".join(problems))
    c.say(f"verified: {len(c.j.backings)} backing device(s) on cache set {c.j.new['cset']}")


def s_warm(c: Ctx) -> None:
    warm_step(c, [str(e.get("device") or e["node"]) for e in c.j.backings])


def _rollback(c: Ctx) -> None:
    """Reattach what was detached, put the modes back."""
    snap = snapshot.take(c.sysfs)
    for e in c.j.backings:
        b = next((x for x in snap.backings if x.uuid == e["uuid"]), None)
        if b is None:
            continue
        if b.cset_uuid is None:
            cset = snap.cache_set(c.j.cset)
            if cset is not None:
                try:
                    bcache.attach(c.sysfs, b, cset)
                except AlreadyError:
                    pass
                b = bcache.reread(c.sysfs, b.identity.name)
        if e["mode"]:
            try:
                bcache.set_mode(c.sysfs, b, CacheMode(e["mode"]))
                c.say(f"{e['device'] or e['node']}: mode {e['mode']} restored")
            except AlreadyError:
                pass


FUNCS: dict[str, Callable[[Ctx], None]] = {
    "mode-interim": s_mode_interim,
    "drain": s_drain,
    "detach": s_detach,
    "unregister": s_unregister,
    "wipe-old": s_wipe_old,
    "remove-old": s_remove_old,
    "wait-new": s_wait_new,
    "identify-new": s_identify_new,
    "make-cache": s_make_cache,
    "register": s_register,
    "attach": s_attach,
    "restore": s_restore,
    "verify": s_verify,
    "warm": s_warm,
}


def _done_line(j: Journal) -> str:
    return (f"{j.id}: done; cache set {j.new.get('cset')} on {j.new.get('node')} caches "
            + ", ".join(b["device"] or b["node"] for b in j.backings))


KIND = Kind(STEPS, FUNCS, POINT_OF_NO_RETURN, _rollback, _head, "cache set",
            name="bcache cache set", tag="cset", tag_chars=8,
            stays_up="The VMs' bcache devices stay up (passthrough while detached).",
            undoes="Put the modes back and re-attach what was detached.",
            done_line=_done_line, interim_mode=True,
            claims=lambda cache, sysfs, snap: cache,
            names_run=lambda j, spec: spec.lower() == j.cset.lower(),
            plan=lambda sysfs, cache, opts, found: plan(sysfs, cache, opts),
            json=lambda j: {"cset": j.cset, "new_cset": j.new.get("cset")}, fallback=True,
            run_keys=lambda cache, backings, lvs: {
                keys.bcache_key(str(b.get("uuid") or b.get("name"))) for b in backings},
            vm_nodes=lambda j, snap: {b["device"] for b in j.backings if b.get("device")})
