"""Fast drain: get a bcache device to zero dirty data as fast as its backing device allows.

The trap (docs/kernel-notes.md, "The drain trap"; writeback.c): writeback is paced by a PI
controller aiming at ``writeback_percent`` of the cache being dirty; below that target the
rate falls to ``writeback_rate_minimum`` (8 sectors/s = 4 KiB/s), a gigabyte takes ~73 hours,
and switching ``cache_mode`` to none changes nothing about it. Writeback is unthrottled when
``writeback_percent`` is 0, and ``writeback_delay`` is the sleep after each full pass. So the
drain sets ``writeback_percent=0``, ``writeback_delay=1`` and ``writeback_running=1``, watches
progress (dirty bytes, rate, ETA), detects stalls, and restores every tunable it changed: at
the end, on error, on Ctrl-C, SIGTERM or SIGHUP (cachemgr/core/signals.py), and after a crash
(the saved journal is restored by the next run or by ``--resume``).

Writeback may start only after the thread's current ``writeback_delay`` pause (the original
value, 30 s by default) ends: nothing written to sysfs cuts that sleep short.

"Clean" means state ``clean`` and dirty data certainly 0, read twice ``confirm`` seconds apart:
``state`` can lag behind ``dirty_data`` by ``writeback_delay``, and writes that overlap keys
under writeback can bring dirty data back transiently even in ``none`` mode.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachemgr.backends import bcache, blockdev, kernlog
from cachemgr.core import drainloop, pace, signals, state
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    StallError,
    TimeoutExpired,
)
from cachemgr.core.model import BcacheBacking, CacheMode, CacheState, DrainProgress, human
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

# What the drain changes, and the values it uses.
DRAIN_SETTINGS = {"writeback_percent": 0, "writeback_delay": 1, "writeback_running": 1}
# What a paced drain (--max-latency) changes besides: the floor of the PI controller's rate,
# which is the pace while writeback_percent is PACED_PERCENT (docs/kernel-notes.md, "Pacing a
# drain"). writeback_percent itself goes to PACED_PERCENT while paced, 0 while unpaced.
PACE_SETTINGS = ("writeback_rate_minimum",)
PACED_PERCENT = 40  # the kernel's highest (bch_cutoff_writeback): the PI stays at its floor


@dataclass
class DrainResult:
    device: str
    start_bytes: int | None
    elapsed_s: float
    restored: dict[str, int] = field(default_factory=dict)
    zero_s: float | None = None  # when dirty data first read 0 (before the confirmation)
    pacing: dict[str, object] | None = None  # a paced drain: its bound, how often it slowed


def _key(b: BcacheBacking) -> str:
    return b.uuid or b.identity.name


journal_key = _key  # the key of a backing device's drain journal (state.journal_name)


def _journal(b: BcacheBacking):  # type: ignore[no-untyped-def]
    return state.journal_path("drain", _key(b))


class DeviceGone(CacheMgrError):
    """The backing device stopped (vanished from sysfs) while we worked on it."""


def _reread(sysfs: Sysfs, b: BcacheBacking) -> BcacheBacking:
    try:
        return bcache.reread(sysfs, b.identity.name)
    except CacheMgrError as exc:
        raise DeviceGone(str(exc)) from exc


def _tunables(b: BcacheBacking, *, paced: bool = False) -> dict[str, int]:
    vals = {"writeback_percent": b.writeback_percent, "writeback_delay": b.writeback_delay,
            "writeback_running": None if b.writeback_running is None else int(b.writeback_running)}
    if paced:
        vals["writeback_rate_minimum"] = b.writeback_rate_minimum
    missing = [k for k, v in vals.items() if v is None]
    if missing:
        raise CacheMgrError(f"{b.device}: cannot read {', '.join(missing)}; not draining")
    return {k: int(v) for k, v in vals.items() if v is not None}


def restore_saved(sysfs: Sysfs, b: BcacheBacking) -> dict[str, int]:
    """Put back tunables a previous (crashed) drain saved; returns what was restored.

    Only while holding the device's lock (taken here; re-entrant for a drain that holds it
    already): a drain running in another process keeps its journal, and restoring its saved
    values under it would undo its settings (writeback_percent back up: the trap) and stall
    it. Refused (exit 3) while another run holds the lock, nothing changed. A journal that
    cannot be read is refused (exit 2, its path and why): its original values are unknown."""
    with state.locked(_key(b), b.device or b.identity.node):
        return _restore_saved_locked(sysfs, b)


def _restore_saved_locked(sysfs: Sysfs, b: BcacheBacking) -> dict[str, int]:
    path = _journal(b)
    saved = state.read_json(path)
    if saved is None:
        return {}
    original = saved.get("original")
    known = [*DRAIN_SETTINGS, *PACE_SETTINGS]
    if not (isinstance(original, dict) and original and all(
            k in known and isinstance(v, int) and not isinstance(v, bool)
            for k, v in original.items())):
        raise state.StateFileError(path, f"not a drain journal: 'original' is {original!r}, "
                                         f"not the values of {sorted(known)}")
    try:
        _set_all(sysfs, _reread(sysfs, b), original)
    except DeviceGone:
        # the device was stopped (by bcache or an admin), before or in the middle of the
        # restore (seen in the lab: bcache stopping a failing backing device just as the
        # drain ended); these tunables live in memory only and a re-registered device starts
        # from the kernel's defaults: nothing left to restore
        path.unlink(missing_ok=True)
        log.warning("%s is gone; dropped its saved drain tunables %s", b.device, original)
        return {}
    path.unlink(missing_ok=True)
    log.info("%s: restored tunables %s saved by an interrupted drain", b.device, original)
    return original


def _set_all(sysfs: Sysfs, b: BcacheBacking, values: dict[str, int]) -> BcacheBacking:
    """Write each tunable (one already so is fine); the device read again. DeviceGone when
    the device stopped before or during the writes (a write's own error otherwise)."""
    for name, value in values.items():
        try:
            bcache.set_tunable(sysfs, b, name, value)
        except AlreadyError:
            pass
        except CacheMgrError:
            _reread(sysfs, b)  # DeviceGone if that is why the write failed
            raise
        b = _reread(sysfs, b)
    return b


def is_clean(b: BcacheBacking) -> bool:
    return b.state in (CacheState.CLEAN, CacheState.NO_CACHE) and b.dirty is not None \
        and b.dirty.is_zero(512)


def drain(
    sysfs: Sysfs,
    backing: BcacheBacking,
    *,
    timeout: float = 24 * 3600,
    stall_timeout: float = 60.0,
    confirm: float = 2.0,
    interval: float = 0.5,
    progress: Callable[[DrainProgress], None] | None = None,
    max_latency_ms: float | None = None,
) -> DrainResult:
    """Drain ``backing`` to clean. Raises AlreadyError if already clean (nothing changed),
    StallError when dirty data stops going down for ``stall_timeout`` seconds, TimeoutExpired
    after ``timeout``. Tunables are restored in every case, Ctrl-C, SIGTERM and SIGHUP
    included (those two raise signals.Terminated, in the main thread).

    ``max_latency_ms``: a paced drain, which keeps the p99 latency of the VMs' IO on the
    device under that bound and otherwise drains as fast as the disk allows
    (cachemgr/core/pace.py); it also journals and puts back ``writeback_rate_minimum``."""
    if max_latency_ms is not None:
        max_latency_ms = pace.check_max_latency(max_latency_ms)
    dev = backing.device or backing.identity.node
    if backing.cset_uuid is None:
        if backing.state == CacheState.DIRTY:
            raise CacheMgrError(
                f"{dev} is dirty but its cache set is not registered: its dirty data is on the "
                "missing cache device and cannot be written back from here",
                hint="register the cache device again (cachemgr status shows the cset)")
        raise AlreadyError(f"{dev} has no cache attached: nothing to drain")
    with signals.terminate_as_interrupt(), state.locked(_key(backing), dev):
        restored_crash = restore_saved(sysfs, backing)
        b = _reread(sysfs, backing) if restored_crash else backing
        if is_clean(b):
            time.sleep(min(confirm, 0.2))
            if is_clean(_reread(sysfs, b)):
                raise AlreadyError(f"{dev} is already clean")
        original = _tunables(b, paced=max_latency_ms is not None)
        try:  # the journal first: a signal while it is written still reaches the except
            state.write_json(_journal(b), {"device": dev, "backing": b.identity.node,
                                           "uuid": b.uuid, "original": original,
                                           "started": time.time()})
            result = _run(sysfs, b, original, dev, timeout, stall_timeout, confirm, interval,
                          progress, max_latency_ms)
        except BaseException:
            with signals.deferred():  # a signal now waits until every tunable is back
                _restore_keeping_error(sysfs, b, dev)
            raise
        with signals.deferred():
            restore_saved(sysfs, b)
        return result


def _restore_keeping_error(sysfs: Sysfs, b: BcacheBacking, dev: str) -> None:
    """The restore after a drain that failed or was stopped. If that restore fails too, the
    drain's own error still is the one raised (it says why the drain ended and where the
    dirty data is); the restore's failure is logged and the journal kept for ``--resume``."""
    try:
        restore_saved(sysfs, b)
    except CacheMgrError as exc:
        log.error("%s: the drain's tunables were not put back (%s); they stay saved in %s: "
                  "'cachemgr drain %s --resume' puts them back", dev, exc, _journal(b), dev)


def stall_hint(original: dict[str, int], stall_timeout: float, *, progressed: bool) -> str:
    """What to check after a stall. bcache's writeback thread sleeps ``writeback_delay``
    seconds after each full pass and only a detach cuts that sleep short (writeback.c; seen in
    the lab: drains under load reached 0 only ~28 s in, at the default 30): a stall timeout
    shorter than that pause can fire before writeback even resumed."""
    hint = ("check the backing device for errors (dmesg) and whether new writes keep "
            "dirtying the cache (switch the mode to none first)")
    pause = original.get("writeback_delay", 0)
    if not progressed and pause >= stall_timeout:
        hint = (f"bcache's writeback thread may still be in its writeback_delay pause "
                f"({pause} s, not cut short by the drain): run again with --stall-timeout "
                f"above {pause}; otherwise {hint}")
    return hint


def failing_disks(sysfs: Sysfs, b: BcacheBacking, ssds: list[str]) -> tuple[str, str]:
    """Which disk fails, from the kernel log's failed requests of the last hour
    (backends/kernlog.py): (words on the cache SSDs' failures, words on the backing
    device's), each "" when it logged none. Not bcache's own counters: a failed read of
    dirty data from the cache counts as a backing device IO error too (writeback.c,
    ``read_dirty_endio`` calls ``dirty_endio``, which counts every failed bio of a dirty
    write-back against the backing device; seen in the lab, 7.2: an SSD failing reads made
    bcache stop the device for "too many IO errors on backing device ubda", the healthy HDD),
    so its ``io_errors`` and its kernel message blame the backing device for the SSD."""
    reader = kernlog.Reader(sysfs)
    try:
        logged = reader.read()
    finally:
        reader.close()
    under = [d for n in ssds for d in kernlog.disks_under(sysfs, n.removeprefix("/dev/"))]
    ssd = kernlog.summarise(logged, under, reader.now)
    backing = kernlog.summarise(logged, kernlog.disks_under(sysfs, b.identity.name),
                                reader.now)
    return "; ".join(e.words() for e in ssd), "; ".join(e.words() for e in backing)


def _ssd_fails(dev: str, b: BcacheBacking, ssd: str, what: str, why: str) -> StallError:
    return StallError(
        f"{dev}: {what}: its cache SSD {ssd} fails ({why}); the backing device "
        f"{b.identity.node} logged no failed request (bcache counts a failed read of dirty "
        f"data from the SSD as a backing device error); its dirty data ({b.dirty}) is only "
        f"on {ssd}: do not wipe or replace {ssd}",
        hint=f"once {ssd} reads again (reseat it, check its cable), register it first, then "
             f"the backing device: cachemgr register {ssd} {b.identity.node}")


def _gone(sysfs: Sysfs, b: BcacheBacking, dev: str, cset: str | None,
          ssds: list[str]) -> StallError:
    """bcache stopped the device during the drain: which disk failed decides the advice
    (:func:`failing_disks`). Seen in the lab (7.2): a backing device failing every write
    makes bcache stop it after io_error_limit errors ("too many IO errors on backing
    device"); the dirty data stays in the cache set, which stays registered. A cache SSD
    failing reads of dirty data gets the same message (:func:`failing_disks`) and the set
    is unregistered just after (docs/kernel-notes.md, "Which disk a stopped drain names")."""
    ssd = ",".join(ssds) or "its cache SSD"
    on_ssd, on_backing = failing_disks(sysfs, b, ssds)
    if on_ssd and not on_backing:
        return _ssd_fails(dev, b, ssd, "bcache stopped the device during the drain", on_ssd)
    if not on_backing and cset and not sysfs.is_dir(f"fs/bcache/{cset}"):
        return StallError(
            f"{dev}: bcache stopped the device during the drain and its cache set {cset} "
            f"is gone (see dmesg: IO errors on its cache SSD {ssd} or on the backing device "
            f"{b.identity.node}); its dirty data ({b.dirty}) is only on {ssd}: do not wipe "
            f"or replace {ssd}",
            hint=f"register the set's SSD first, then the backing device: cachemgr register "
                 f"{ssd if ssds else 'SSD'} {b.identity.node}")
    seen = f" ({on_backing})" if on_backing else " (see dmesg: most likely)"
    return StallError(
        f"{dev}: bcache stopped the device during the drain: IO errors on the backing device "
        f"{b.identity.node}{seen}; its dirty data ({b.dirty}) stays in cache set {cset} "
        f"(SSD {ssd}): do not unregister, wipe or replace that cache device",
        hint=f"repair {b.identity.node}, then register it again "
             f"(cachemgr register {b.identity.node}) to resume writeback",
    )


def _run(sysfs: Sysfs, b: BcacheBacking, original: dict[str, int], dev: str, timeout: float,
         stall_timeout: float, confirm: float, interval: float,
         progress: Callable[[DrainProgress], None] | None,
         max_latency_ms: float | None = None) -> DrainResult:
    cset = b.cset_uuid  # known now; bcache may drop the link before it stops the device
    ssds = bcache.cache_nodes(sysfs, cset)  # and the set's SSD: a failed set is gone from /sys
    paced = Paced(sysfs, b, max_latency_ms) if max_latency_ms is not None else None
    try:
        if paced is not None:  # at its first pace before writeback starts
            b = paced.apply(b, paced.pacer.pace)
        b = _set_all(sysfs, b, DRAIN_SETTINGS if paced is None else
                     {**DRAIN_SETTINGS, "writeback_percent": PACED_PERCENT})
    except DeviceGone:
        raise _gone(sysfs, b, dev, cset, ssds) from None
    if paced is not None:
        # the pacer reads its counters every pace.SLICE between two polls; rereading the
        # whole device twice a second only costs the CPU (the pacer decides every 2 s)
        interval = max(interval, 1.0)

    def sample() -> drainloop.Sample[BcacheBacking]:
        nonlocal b
        try:
            if paced is not None:
                paced.step(b)
            b = _reread(sysfs, b)
        except DeviceGone:
            raise _gone(sysfs, b, dev, cset, ssds) from None
        return _sample(b)

    def check(b: BcacheBacking) -> None:
        if b.io_errors:
            on_ssd, on_backing = failing_disks(sysfs, b, ssds)
            if on_ssd and not on_backing:
                raise _ssd_fails(dev, b, ",".join(ssds), "IO errors while draining", on_ssd)
            raise StallError(f"{dev}: the backing device {b.identity.node} reports "
                             f"{b.io_errors} IO errors while draining"
                             + (f" ({on_backing})" if on_backing else "") + f"; {b.dirty} "
                             "still dirty, kept safe in the cache",
                             hint=f"fix the backing device {b.identity.node}; the dirty data "
                                  "stays in the cache")

    incoming = WriteMeter(sysfs, b.device_name)

    def explain(b: BcacheBacking, elapsed: float, progressed: bool) -> str | None:
        why = drain_note(b, dev, original, incoming.rate(), elapsed, progressed)
        if paced is None:
            return why
        return f"{why}; {paced.words()}" if why else paced.words()

    def stalled(b: BcacheBacking, progressed: bool) -> StallError:
        why = arriving_words(b, dev, incoming.rate())
        return StallError(
            f"{dev}: no progress for {stall_timeout:g} s (dirty {b.dirty}, state "
            f"{b.state.value}" + (f"; {why}" if why else "") + "); the dirty data stays safe "
            "in the cache",
            hint=(f"cachemgr mode {dev} writethrough --drain" if why else
                  stall_hint(original, stall_timeout, progressed=progressed)))

    def timed_out(b: BcacheBacking) -> TimeoutExpired:
        return TimeoutExpired(f"{dev}: still {b.dirty} dirty after {timeout:g} s of draining")

    r = drainloop.wait_clean(sample, action="drain", device=dev, timeout=timeout,
                             stall_timeout=stall_timeout, confirm=confirm, interval=interval,
                             progress=progress, stall_error=stalled, timeout_error=timed_out,
                             check=check, explain=explain, rate="ewma", first=_sample(b),
                             sleep=paced.sampler.sleep if paced is not None else time.sleep)
    return DrainResult(dev, r.start_bytes, r.elapsed_s, original, r.zero_s,
                       paced.summary() if paced is not None else None)


class Paced:
    """A drain under ``--max-latency``: reads the VMs' IO on the bcache device and the
    drain's writes on the backing device (:class:`cachemgr.core.pace.Sampler`, while the
    loop sleeps), and sets the pace :class:`cachemgr.core.pace.Pacer` decides: unpaced,
    ``writeback_percent`` 0 (the drain's own setting); paced at P sectors/s,
    ``writeback_rate_minimum`` P, ``writeback_rate`` P (at once: the PI controller would take
    up to ``writeback_rate_update_seconds``) and ``writeback_percent`` PACED_PERCENT, with
    dirty data under that target the PI controller's output stays at its floor P."""

    def __init__(self, sysfs: Sysfs, b: BcacheBacking, bound_ms: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs, self.bound, self.clock = sysfs, bound_ms, clock
        self.pacer = pace.Pacer(bound_ms)
        self.meter = pace.LatencyMeter()
        vm, backing = blockdev.pace_sources(sysfs, b.device_name, b.identity.name)
        self.sampler = pace.Sampler(vm, backing, self.meter, clock=clock)
        self.sampler.read()
        self.slowest: int | None = None

    def step(self, b: BcacheBacking) -> None:
        now = self.clock()
        since = self.pacer.changed_at if self.pacer.changed_at is not None else -math.inf
        p99, ios = self.meter.p99(since)
        d = self.pacer.decide(now, p99, ios, self.sampler.drain_rate())
        if d.changed:
            log.info("%s: %s (%s)", b.device, pace.pace_words(d.pace), d.note)
            self.apply(b, d.pace)
        elif d.pace is not None:
            # the PI controller runs every writeback_rate_update_seconds and may have raised
            # it (dirty data above PACED_PERCENT of the cache): back to the pace
            bcache.set_writeback_rate(self.sysfs, b, d.pace)

    def apply(self, b: BcacheBacking, p: int | None) -> BcacheBacking:
        """Set pace ``p`` (None: unpaced); the device read again."""
        if p is None:
            return _set_all(self.sysfs, b, {"writeback_percent": 0})
        self.slowest = p if self.slowest is None else min(self.slowest, p)
        b = _set_all(self.sysfs, b, {"writeback_rate_minimum": p})
        bcache.set_writeback_rate(self.sysfs, b, p)
        return _set_all(self.sysfs, b, {"writeback_percent": PACED_PERCENT})

    def words(self) -> str:
        slowed = self.pacer.slowed_words()
        return (f"{self.pacer.note}; {pace.pace_words(self.pacer.pace)}"
                + (f" ({slowed})" if slowed else ""))

    def summary(self) -> dict[str, object]:
        return {**self.pacer.summary(pace.pace_words(self.pacer.pace)),
                "slowest_sectors_per_s": self.slowest}


class WriteMeter:
    """Bytes per second written to the bcache device (what the VMs write into it), over the
    last few seconds, from its block layer counters (blockdev.written_bytes)."""

    WINDOW = 3.0

    def __init__(self, sysfs: Sysfs, name: str | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs, self.name, self.clock = sysfs, name, clock
        self.seen: list[tuple[float, int]] = []

    def rate(self) -> float | None:
        n = blockdev.written_bytes(self.sysfs, self.name)
        if n is None:
            return None
        now = self.clock()
        if not self.seen or now - self.seen[-1][0] >= 0.2:
            self.seen.append((now, n))
        while len(self.seen) > 2 and now - self.seen[1][0] >= self.WINDOW:
            self.seen.pop(0)
        (t0, n0), (t1, n1) = self.seen[0], self.seen[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 and n1 >= n0 else None


def arriving_words(b: BcacheBacking, dev: str, rate: float | None) -> str | None:
    """Writes arriving into a writeback cache: each is cached dirty, so a drain (which keeps
    the mode) cannot get ahead of them. Said when they come at 4 KiB/s or more."""
    if rate is None or rate < 4096 or b.mode != CacheMode.WRITEBACK:
        return None
    return (f"writes are arriving at {human(int(rate))}/s (the VMs): in writeback each is "
            "cached dirty, so the drain cannot finish under them; switch to writethrough "
            f"first: cachemgr mode {dev} writethrough --drain")


def drain_note(b: BcacheBacking, dev: str, original: dict[str, int], rate: float | None,
               elapsed: float, progressed: bool) -> str | None:
    """What a drain's numbers alone do not say: writes arriving (:func:`arriving_words`), or
    bcache's writeback thread still in its ``writeback_delay`` pause (module docstring)."""
    why = arriving_words(b, dev, rate)
    if why:
        return why
    pause = original.get("writeback_delay", 0)
    if not progressed and pause and elapsed < pause:
        return (f"waiting for bcache: its writeback thread sleeps writeback_delay ({pause} s) "
                "between passes and nothing cuts that short; write-back starts by "
                f"{time.strftime('%H:%M:%S', time.localtime(time.time() + pause - elapsed))} "
                f"(at most {pause - elapsed:.0f} s)")
    return None


def _sample(b: BcacheBacking) -> drainloop.Sample[BcacheBacking]:
    return drainloop.Sample(b, b.dirty.bytes if b.dirty else None, b.state, is_clean(b))
