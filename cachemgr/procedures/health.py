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
  ``cachemgr assemble NAME``. A device-mapper cache (dm-cache, LVM cache,
  dm-writecache) with dirty data whose cache SSD logged failed reads or writes in the last
  hour (the kernel log: backends/kernlog.py); a dm-cache record that cannot be read or is
  not trusted, of a device that is not assembled (its dirty data, if any, is stranded on
  its cache device); a bcache backing device last seen dirty by ``check`` that is gone
  (its dirty data is only on the set's SSD: :func:`remember`).
* WARNING: IO errors on a cache or backing device holding no dirty data; an interrupted
  drain or flush (its tunables or table left changed); an SSD that SMART says to replace
  soon (when its answer is given); a device whose kernel output cachemgr cannot read; a
  recorded writethrough or passthrough dm-cache device that is not assembled; a procedure
  journal cachemgr cannot read; a drain or flush under way that has not lowered the dirty
  data for :data:`STALLED_AFTER` seconds (its lock files say when it last did); an SSD
  protected earlier while protect is now off (``snap.protect_off``); failed
  requests logged for the cache SSD of a device-mapper cache holding no dirty data; an
  unreadable or untrusted dm-cache record of a device that is assembled (the boot pass
  will not assemble it again); a line of the scan that could not be read (the snapshot's
  ``warnings``: what cachemgr does not know may be dirty data at risk); a device whose last
  scrub found blocks its cache served unlike its origin (``scrub-mismatch``: the SSD or the
  kernel returned wrong data; cleared by a scrub that finds it clean).
* UNKNOWN (below a CRITICAL, above the rest): a cache SSD whose error count rose by errors
  the kernel log could not tell from probe commands (``snap.protect_unknown``: protect did
  nothing; procedures/protect.py).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cachemgr.core import state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import CacheMode, CacheState, GoneBacking, Snapshot, human

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
           now: float | None = None,
           gave_up: Sequence[tuple[str, str, str]] = ()) -> list[Finding]:
    """Every finding of ``snap``, worst first. ``replace_soon``: (SSD node, why) for each
    cache SSD SMART says to replace (smart.ssd_health's cached answers); ``unreadable``:
    (path, why) for each procedure journal that cannot be read (owners.unreadable);
    ``now``: the epoch time a stall is counted to (default: the clock's); ``gave_up``:
    (device, bound, why) for each bound the running writeback governor gives up now
    (procedures/governor.py)."""
    when = time.time() if now is None else now
    found = [*_protected(snap), *_bcache(snap), *_gone(snap, when), *_dm(snap),
             *_unassembled(snap), *_records(snap), *_owners(snap, when), *_scrubbed(snap)]
    found += _warnings(snap, found)
    found += [Finding(Level.WARNING, "ssd-wear", node, f"SMART: {why}",
                      f"cachemgr replace-ssd {node} --dry-run") for node, why in replace_soon]
    # whether its procedure was interrupted is unknown, and the commands on its device
    # refuse (exit 2) until it is dealt with: never OK
    found += [Finding(Level.WARNING, "unreadable-journal", path,
                      f"a cachemgr journal that cannot be read ({why}): whether a procedure "
                      "was interrupted on its device is unknown",
                      "look at it, check its device by hand, then move it away")
              for path, why in unreadable]
    # the governor could not hold all three of its bounds: the one it gave up, and why
    found += [Finding(Level.WARNING, "governor-gave-up", dev, f"writeback governor gave up "
                      f"{bound}: {why}", "raise the policy's [writeback] bound, or lower "
                      "the VMs' writes (cachemgr governor --once --json shows the figures)")
              for dev, bound, why in gave_up]
    return sorted(found, key=lambda f: -_RANK[f.level])


# a CRITICAL seen stands over what is unknown (as unseen.verdict has it); UNKNOWN over less
_RANK = {Level.OK: 0, Level.WARNING: 1, Level.UNKNOWN: 2, Level.CRITICAL: 3}


def worst(findings: Iterable[Finding]) -> Level:
    return max((f.level for f in findings), key=_RANK.__getitem__, default=Level.OK)


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
    for ssd, words in snap.protect_unknown:  # neither acted on nor taken for probes
        yield Finding(Level.UNKNOWN, "protect-unknown", ssd,
                      f"protect cannot tell: SSD {ssd}: {words}",
                      f"cachemgr ssd-health --refresh, then cachemgr protect --clear {ssd}")


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
            cs = sets.get(b.cset_uuid) if b.cset_uuid else None
            ssd_errors = sum(x.io_errors or 0 for x in cs.caches) if cs is not None else 0
            # bcache counts a failed read of dirty data from the SSD as a backing device
            # error too (docs/kernel-notes.md, "Which disk a stopped drain names")
            also = (f", or failed reads of its dirty data on cache SSD "
                    f"{','.join(x.identity.node for x in cs.caches)} (bcache counts those "
                    "there too)" if cs is not None and ssd_errors else "")
            yield Finding(Level.WARNING, "backing-io-errors", dev,
                          f"{b.io_errors} IO errors on its backing device {b.identity.node}"
                          + also)
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
            continue
        yield from _ssd_errors(snap, dev, dirty)


def _ssd_errors(snap: Snapshot, dev: str, dirty: int | None) -> Iterable[Finding]:
    """A device-mapper cache whose cache SSD (a disk under its cache device) logged failed
    requests: with dirty data, reads of it may fail and it cannot all reach the origin
    (CRITICAL); without, the device reads through a failing SSD (WARNING). The kernel log
    counts no passthrough command (smartctl's probing): backends/kernlog.py."""
    errs = [e for node, e in snap.cache_errors if node == dev]
    if not errs:
        return
    words = "; ".join(e.words() for e in errs)
    ssd = ",".join(e.disk for e in errs)
    if dirty is None or dirty > 0:
        yield Finding(Level.CRITICAL, "failing-cache-dirty", dev,
                      f"{human(dirty)} of dirty data on cache SSD {ssd}, which fails IO "
                      f"({words}): reads of it may fail and it may not reach the origin",
                      f"cachemgr mode {dev} writethrough --drain")
    else:
        yield Finding(Level.WARNING, "cache-io-errors", ssd,
                      f"cache SSD of {dev} fails IO ({words}; no dirty data on it)",
                      f"cachemgr replace-ssd {dev} --dry-run")


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


def _records(snap: Snapshot) -> Iterable[Finding]:
    """A dm-cache record file that cannot be read or is not trusted: the boot pass and the
    udev worker do not assemble its device. Not assembled now, its dirty data (if it was in
    writeback) is stranded on its cache device and its origin is stale: CRITICAL; assembled
    now, the next boot leaves it unassembled: WARNING."""
    assembled = {d.name for d in snap.dmcaches}
    for path, why in snap.bad_records:
        base = path.rsplit("/", 1)[-1]
        name = base[:-5] if base.endswith(".json") else None
        if name is not None and name in assembled:
            yield Finding(Level.WARNING, "bad-record", path,
                          f"a dm-cache record cachemgr cannot use ({why}): /dev/mapper/{name} "
                          "is assembled now, but the boot pass will not assemble it again",
                          f"look at {path}; make it a regular file owned by root, mode 0600, "
                          f"with the device's table (dmsetup table {name})")
            continue
        node = f"/dev/mapper/{name}" if name else "its device"
        yield Finding(Level.CRITICAL, "bad-record", path,
                      f"a dm-cache record cachemgr cannot use ({why}): {node} is not "
                      "assembled and will not be; in writeback its dirty data is on its "
                      "cache device and its origin is stale (nothing may open the origin)",
                      f"look at {path}; make it a regular file owned by root, mode 0600, "
                      "then cachemgr autoattach")


def remember(snap: Snapshot, before: Iterable[GoneBacking], now: float) -> list[GoneBacking]:
    """What ``check`` keeps of the bcache backing devices with dirty data: each one seen
    dirty on a cache set now, and each one remembered that is not on the host now (neither
    registered nor an unregistered bcache device: ``snap`` must be a probing scan's). A
    device seen again clean is forgotten."""
    seen: dict[str, GoneBacking] = {}
    for b in snap.backings:
        if b.uuid and b.cset_uuid and (b.state == CacheState.DIRTY or b.dirty_bytes is None
                                       or b.dirty_bytes > 0):
            seen[b.uuid] = GoneBacking(b.uuid, b.identity.node, b.device, b.cset_uuid,
                                       b.dirty_bytes, now)
    present = {b.uuid for b in snap.backings} | {u.uuid for u in snap.unregistered}
    return [*seen.values(), *(g for g in before if g.uuid not in present
                              and g.uuid not in seen)]


def _gone_path() -> Path:
    return state.state_dir(create=False) / "health" / "dirty-backings.json"


def remembered() -> list[GoneBacking]:
    """What :func:`save_remembered` kept (nothing when it cannot be read: a reader without
    root, a damaged file; ``check`` as root writes it again)."""
    try:
        doc = state.read_json(_gone_path()) or {}
    except (OSError, CacheMgrError):
        return []
    out = []
    for e in doc.get("devices", []) if isinstance(doc.get("devices"), list) else []:
        try:
            out.append(GoneBacking(str(e["uuid"]), str(e["node"]),
                                   None if e.get("device") is None else str(e["device"]),
                                   str(e["cset_uuid"]),
                                   None if e.get("dirty_bytes") is None
                                   else int(e["dirty_bytes"]), float(e["seen_at"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def save_remembered(entries: Sequence[GoneBacking]) -> None:
    """Keep ``entries`` in ``<state dir>/health/dirty-backings.json`` (``check`` as root);
    nothing to keep and no file: nothing is written."""
    path = _gone_path()
    if not entries and not path.exists():
        return
    state.write_json(path, {"devices": [dataclasses.asdict(g) for g in entries]})


def gone(snap: Snapshot, remembered: Iterable[GoneBacking]) -> list[GoneBacking]:
    """The remembered dirty backing devices that ``snap`` does not show."""
    present = {b.uuid for b in snap.backings} | {u.uuid for u in snap.unregistered}
    return [g for g in remembered if g.uuid not in present]


def _gone(snap: Snapshot, now: float) -> Iterable[Finding]:
    for g in snap.gone:
        c = snap.cache_set(g.cset_uuid)
        ssd = ",".join(x.identity.node for x in c.caches) if c is not None else None
        on = f"cache set {g.cset_uuid[:8]}" + (f" (SSD {ssd})" if ssd else
                                                ", not registered now")
        ago = max(0.0, now - g.seen_at)
        yield Finding(Level.CRITICAL, "backing-gone-dirty", g.node,
                      f"bcache backing device{' of ' + g.device if g.device else ''} gone; "
                      f"{human(g.dirty_bytes)} of its data was dirty on {on} when last seen "
                      f"{ago / 60:.0f} min ago, and is only there: do not unregister, wipe "
                      "or replace that SSD",
                      f"bring {g.node} back (reseat it, rescan its bus), then cachemgr "
                      f"register {g.node}")


def _scrubbed(snap: Snapshot) -> Iterable[Finding]:
    """A device whose last scrub found blocks its cache served unlike its origin: the SSD
    (or the kernel) returned wrong data once, so it may again; WARNING until a scrub finds
    the device clean (procedures/scrub.py)."""
    for dev, words in snap.scrub_mismatches:
        yield Finding(Level.WARNING, "scrub-mismatch", dev, words,
                      f"check the cache SSD (smartctl -a, the kernel log), then cachemgr scrub "
                      f"{dev} (a scrub that finds it clean clears this)")


def _warnings(snap: Snapshot, found: Sequence[Finding]) -> Iterable[Finding]:
    """What the scan could not read, or a state it warns of: a device whose dirty data
    cachemgr cannot see may be at risk, so never OK. A warning about a device another
    finding is about already (a dm-cache the kernel failed: ``failed-cache``) is said by
    that finding."""
    said = {f.device for f in found}
    for w in snap.warnings:
        head = w.split(" ", 1)[0]
        dev = head[:-1] if head.endswith(":") else head if head.startswith("/dev/") else ""
        if dev and (dev in said or f"/dev/mapper/{dev}" in said):
            continue
        yield Finding(Level.WARNING, "scan-warning", dev or "host",
                      f"not read: {w}" if not dev else w[len(head):].strip(" :"),
                      "cachemgr status (its warning lines), then the device's own tools "
                      "(dmesg, dmsetup status, /sys/block/DEV/bcache)")


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
