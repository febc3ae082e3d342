"""One health model: every warning and piece of advice derived from the state.

:func:`assess` reads a snapshot (with its unregistered devices and its owners) and gives
:class:`Finding` records: what is wrong, on which device, how bad (the monitoring plugins'
levels: OK, WARNING, CRITICAL, UNKNOWN), what is known (never a loss that has not happened)
and the exact next command. ``cachemgr check`` turns them into an exit code and one line;
``status`` prints them.

The levels (docs/admin-guide.md, "Health and `cachemgr check`"):

* CRITICAL: dirty data on a cache that failed or is failing (a dm-cache that reports
  ``Fail``, read-only metadata or ``needs_check``; a bcache cache device with IO errors);
  dirty data stranded on a cache set that is not registered; a backing device running
  without the set its dirty data is on; an interrupted replace-ssd run; a recorded
  writeback dm-cache device that is not assembled (its origin is stale); a cache SSD the
  protect policy acted on (``snap.protected``: its devices switched to writethrough and
  drained; it is failing and wants replacing, or ``cachemgr protect --clear`` if sound).
  A recorded writeback dm-cache device whose devices are there but known by their place
  only (``dmcache-unproven``) is CRITICAL too, naming what to check and
  ``cachemgr assemble NAME``.
* WARNING: IO errors on a cache or backing device holding no dirty data; an interrupted
  drain or flush (its tunables or table left changed); an SSD that SMART says to replace
  soon (when its answer is given); a device whose kernel output cachemgr cannot read; a
  recorded writethrough or passthrough dm-cache device that is not assembled; a procedure
  journal cachemgr cannot read; a drain or flush under way that has not lowered the dirty
  data for :data:`STALLED_AFTER` seconds (its lock files say when it last did); an SSD
  protected earlier while protect is now off (``snap.protect_off``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cachemgr.core.model import CacheMode, CacheState, Snapshot, human

# a drain or flush under way that has not lowered the dirty data for this long is stalled
# (cachemgr's own drains give up after their --stall-timeout, 60 s by default; a longer one
# was asked for, or the drain is another tool's kill-resistant loop)
STALLED_AFTER = 600.0


class Level(enum.IntEnum):
    """The monitoring plugins' levels, which are also ``check``'s exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclass(frozen=True)
class Finding:
    level: Level
    code: str  # a stable word for automation: "stranded-dirty", "cache-io-errors", ...
    device: str  # what it is about (/dev/bcache0, /dev/sdb, cache set UUID, VG/LV)
    what: str  # what is known, in words
    next: str | None = None  # the exact next command (or step), when there is one

    def line(self) -> str:
        return f"{self.device}: {self.what}" + (f"; next: {self.next}" if self.next else "")

    def to_json(self) -> dict[str, object]:
        return {"level": self.level.name, "code": self.code, "device": self.device,
                "what": self.what, "next": self.next}


def assess(snap: Snapshot, *, replace_soon: Sequence[tuple[str, str]] = (),
           unreadable: Sequence[tuple[str, str]] = (),
           now: float | None = None) -> list[Finding]:
    """Every finding of ``snap``, worst first. ``replace_soon``: (SSD node, why) for each
    cache SSD SMART says to replace (smart.ssd_health's cached answers); ``unreadable``:
    (path, why) for each procedure journal that cannot be read (owners.unreadable);
    ``now``: the epoch time a stall is counted to (default: the clock's)."""
    found = [*_protected(snap), *_bcache(snap), *_dm(snap), *_unassembled(snap),
             *_owners(snap, time.time() if now is None else now)]
    found += [Finding(Level.WARNING, "ssd-wear", node, f"SMART: {why}",
                      f"cachemgr replace-ssd {node} --dry-run") for node, why in replace_soon]
    # whether its procedure was interrupted is unknown, and the commands on its device
    # refuse (exit 2) until it is dealt with: never OK
    found += [Finding(Level.WARNING, "unreadable-journal", path,
                      f"a cachemgr journal that cannot be read ({why}): whether a procedure "
                      "was interrupted on its device is unknown",
                      "look at it, check its device by hand, then move it away")
              for path, why in unreadable]
    return sorted(found, key=lambda f: -f.level)


def worst(findings: Iterable[Finding]) -> Level:
    return max((f.level for f in findings), default=Level.OK)


def _protected(snap: Snapshot) -> Iterable[Finding]:
    for ssd, words in snap.protected:
        if snap.protect_off:  # history: nothing acts on it any more
            yield Finding(Level.WARNING, "protect-off", ssd,
                          f"protected earlier: SSD {ssd}: {words}",
                          f"cachemgr protect --clear {ssd}")
        else:
            yield Finding(Level.CRITICAL, "protected", ssd,
                          f"protected: SSD {ssd} failing: {words}",
                          f"cachemgr replace-ssd {ssd}")


def _bcache(snap: Snapshot) -> Iterable[Finding]:
    sets = {c.uuid: c for c in snap.cache_sets}
    for c in snap.cache_sets:
        errors = sum(x.io_errors or 0 for x in c.caches)
        if not errors:
            continue
        ssd = ",".join(x.identity.node for x in c.caches) or c.uuid
        at_risk = [b for b in snap.backings if b.cset_uuid == c.uuid
                   and (b.dirty_bytes is None or b.dirty_bytes > 0)]
        if at_risk:
            for b in at_risk:
                dev = b.device or b.identity.node
                yield Finding(Level.CRITICAL, "failing-cache-dirty", dev,
                              f"{human(b.dirty_bytes)} of dirty data on cache SSD {ssd}, "
                              f"which has {errors} IO errors",
                              f"cachemgr mode {dev} writethrough --drain")
        else:
            yield Finding(Level.WARNING, "cache-io-errors", ssd,
                          f"cache set {c.uuid[:8]}: {errors} IO errors on its SSD (no dirty "
                          "data on it)", f"cachemgr replace-ssd {ssd} --dry-run")
    for b in snap.backings:
        dev = b.device or b.identity.node
        if b.state == CacheState.DIRTY and (b.cset_uuid is None or b.cset_uuid not in sets):
            yield Finding(Level.CRITICAL, "dirty-without-cache", dev,
                          "its state says dirty and its cache set is not registered: its "
                          "dirty data is on that set's SSD",
                          "cachemgr register SSD (its cache set's SSD: status lists the "
                          "unregistered ones)")
        elif b.io_errors:  # with or without a cache set: its own disk fails IO
            yield Finding(Level.WARNING, "backing-io-errors", dev,
                          f"{b.io_errors} IO errors on its backing device {b.identity.node}")
    for u in snap.unregistered:
        if u.kind != "backing" or u.sb_state != "dirty":
            continue
        node = u.identity.node
        if u.cset_uuid and u.cset_uuid in sets:
            yield Finding(Level.CRITICAL, "stranded-dirty", node,
                          f"dirty data on the registered cache set {u.cset_uuid[:8]}; the "
                          "backing device is not registered", f"cachemgr register {node}")
            continue
        found = next((x.identity.node for x in snap.unregistered
                      if x.kind == "cache" and x.cset_uuid == u.cset_uuid), None)
        if found is not None:
            yield Finding(Level.CRITICAL, "stranded-dirty", node,
                          f"dirty data on an unregistered cache set; its SSD {found} is "
                          "present", f"cachemgr register {found} {node}")
        else:
            yield Finding(Level.CRITICAL, "stranded-dirty", node,
                          "dirty data on an unregistered cache set whose SSD is absent; "
                          "running it without the cache (force-run) risks filesystem "
                          "corruption", f"bring the SSD back, then cachemgr register SSD {node}")


def _dm(snap: Snapshot) -> Iterable[Finding]:
    for d in snap.dm_devices:
        dev = d.node
        raw = getattr(d, "raw_status", None)
        if raw:
            yield Finding(Level.WARNING, "unreadable-status", dev,
                          f"its status line cannot be read ({raw!r}); cachemgr changes "
                          "nothing on it", "dmsetup status " + d.name)
            continue
        failure = getattr(d, "failure", None)
        st = d.status
        if failure:
            yield Finding(Level.CRITICAL, "failed-cache", dev,
                          f"the kernel reports the cache as {failure}: its dirty blocks, "
                          "if any, are unknown", "dmsetup status " + d.name)
            continue
        dirty = d.dirty_bytes
        error = getattr(st, "error", None)  # dm-writecache's own error (an errno), 0: none
        if error:
            yield Finding(Level.CRITICAL if dirty is None or dirty > 0 else Level.WARNING,
                          "writecache-error", dev,
                          f"the writecache reports error {error}; {human(dirty)} of data "
                          "not yet written back", "dmsetup status " + d.name)
            continue
        mode = getattr(st, "metadata_mode", None)
        needs = getattr(st, "needs_check", None)
        if mode == "ro" or needs:
            what = ("its metadata is read-only" if mode == "ro" else "its metadata needs a "
                    "check (needs_check)")
            lvl = Level.CRITICAL if dirty is None or dirty > 0 else Level.WARNING
            yield Finding(lvl, "failing-cache-dirty" if lvl == Level.CRITICAL else
                          "cache-metadata", dev, f"{what}; {human(dirty)} of dirty data",
                          "lvconvert --repair" if d.lvm is not None else
                          "cache_check on its metadata device (thin-provisioning-tools)")


def _unassembled(snap: Snapshot) -> Iterable[Finding]:
    """A recorded dm-cache device that is not assembled (after a reboot, before the boot
    pass; or a device of it missing or not the recorded one): in writeback its origin is
    stale (the newest blocks are on the cache device), and whatever opens the origin reads
    old data."""
    for u in snap.unassembled:
        why = "; ".join(f"{role}: {w}" for role, w in u.problems)
        if u.mode == CacheMode.WRITEBACK:
            what = ("recorded writeback dm-cache device not assembled: its origin is stale "
                    "(its newest blocks are on the cache device); nothing may open the "
                    "origin")
            lvl = Level.CRITICAL
        else:
            what = f"recorded {u.mode.value} dm-cache device not assembled"
            lvl = Level.WARNING
        if not u.problems and u.unproven:
            # every device there, but known by its place only: the boot pass leaves it to
            # the admin (backends/dmcache/record.py), whose one command assembles it
            yield Finding(lvl, "dmcache-unproven", u.node, what + "; the boot pass does not "
                          "assemble it: " + "; ".join(f"{role}: {w}" for role, w in u.unproven)
                          + (f"; {u.check}" if u.check else ""),
                          f"cachemgr assemble {u.name}")
            continue
        yield Finding(lvl, "dmcache-unassembled", u.node, what + (f" ({why})" if why else ""),
                      "bring its devices back, then cachemgr autoattach" if u.problems
                      else "cachemgr autoattach")


def _owners(snap: Snapshot, now: float) -> Iterable[Finding]:
    for o in snap.owners:
        if o.running:
            if o.progress_at is not None and now - o.progress_at >= STALLED_AFTER:
                yield Finding(Level.WARNING, "stalled-drain", o.device,
                              f"{o.words()} has not lowered the dirty data for "
                              f"{(now - o.progress_at) / 60:.0f} min (dirty "
                              f"{human(o.progress_dirty)})",
                              "find out why (writeback_running, the backing device's IO "
                              "errors, a writer rewriting the same blocks)" + (
                                  f"; to stop it: kill {o.pid} (it puts back what it "
                                  "changed)" if o.pid else ""))
            continue
        lvl = Level.CRITICAL if o.procedure == "replace-ssd" else Level.WARNING
        yield Finding(lvl, "interrupted-" + o.procedure.replace(" ", "-"), o.device,
                      o.words(), o.resume)
