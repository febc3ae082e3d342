"""``cachemgr governor``: the writeback governor (procedures/governor.py decides and turns).

It reads the policy's ``[writeback]`` table (off, or no policy: nothing is done, exit 0),
takes the host's snapshot once, and governs every bcache device in writeback found then
(a device attached or switched to writeback later is governed from the next start:
``systemctl restart cachemgr-governor``). It enters the gate once for all of them (action
``governor``) and holds their locks while it runs, as a drain does for its device: a command
that would change one of them (``mode``, ``drain``, ``snapshot``, ``replace-ssd``...) is
refused meanwhile (exit 3, naming the governor); stop it first. It steps aside for the
protect pass: a device whose cache SSD the pass recorded as failing is not governed, and
once one it governs is recorded so (checked each tick), every setting is put back and every
lock released, and the others are governed again (the pass's next run switches the device
to writethrough, which its lock refused). Every setting it changes is
journaled first (core/undo.py): put back when it stops (SIGTERM, SIGINT, SIGHUP, an error);
after a SIGKILL the gate of the next command on a device (the governor's own next start
included) or ``cachemgr restore`` puts it back.

Each tick it writes ``<state dir>/governor/state.json`` (what it saw and did, the bounds it
gave up: the health model's ``governor-gave-up`` warning) and says on stderr (the unit's
journal) each device whose pace changed or that gave up or got back a bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cachemgr.core import pace, signals, undo
from cachemgr.core.errors import CacheMgrError, require_root
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import gate
from cachemgr.ops.control import Control, Result
from cachemgr.procedures import governor as gov
from cachemgr.procedures import policy

log = logging.getLogger("cachemgr.governor")

REPORT_EVERY = 60.0  # seconds between two status lines of a device that did not change


def bounds_of(wb: policy.WritebackPolicy) -> gov.Bounds:
    return gov.Bounds(wb.read_p99_ms, wb.max_dirty, wb.max_age_s)


def run(sysfs: Sysfs, policy_path: str | None, *, once: bool = False,
        ctl: Control | None = None, ticks: int | None = None, period: float = gov.PERIOD,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> Result:
    """Govern until stopped (SIGTERM: exit 0, every setting put back); ``once``: one tick
    (``period`` seconds measured, one decision applied, everything put back: what it would
    do now). ``ticks``: stop after that many (tests)."""
    ctl = ctl or Control(what="governor")
    pol = policy.load_if_present(policy_path)
    if pol is None or not pol.writeback.enabled:
        why = "no policy file" if pol is None else "its [writeback] table is not enabled"
        return Result(lines=[f"the writeback governor is off ({why}): nothing done"],
                      data={"schema": 1, "enabled": False, "devices": []})
    bounds = bounds_of(pol.writeback)
    require_root("governor")
    left_aside: list[str] = []
    while True:
        res, stepped = _govern(sysfs, bounds, ctl, left_aside, once=once, ticks=ticks,
                               period=period, clock=clock, sleep=sleep)
        if not stepped or once:
            return res
        # a governed device's SSD failing: every setting is back and every lock released
        # (the protect pass's next run switches it); the others are governed again


def _govern(sysfs: Sysfs, bounds: gov.Bounds, ctl: Control, left_aside: list[str], *,
            once: bool, ticks: int | None, period: float, clock: Callable[[], float],
            sleep: Callable[[float], None]) -> tuple[Result, bool]:
    """One stretch of governing: every bcache device in writeback but those the protect
    pass claimed; ``True`` with the result when it stepped aside for one it claimed since."""
    snap = cache_ops.status(sysfs, probe_unregistered=False, stats=False)
    claimed = gov.claimed_by_protect()
    backs = []
    for b in snap.backings:
        if not gov.bcache_governed(b):
            continue
        node = b.device or b.identity.node
        if node in claimed:
            words = f"{node}: not governed: {claimed[node]}"
            if words not in left_aside:
                left_aside.append(words)
                ctl.note(words)
            continue
        backs.append(b)
    if not backs:
        return Result(lines=[*left_aside, "no bcache device in writeback: nothing to govern"],
                      data={"schema": 1, "enabled": True, "bounds": _bounds_json(bounds),
                            "devices": [], "left_to_protect": left_aside}), False
    subject = gate.of_backing(backs[0])
    for b in backs[1:]:
        subject = subject + gate.of_backing(b)
    said: list[str] = []
    stopped = ""
    stepped: list[str] = []
    with signals.terminate_as_interrupt(), gate.gate(subject, "governor", said=said), \
            undo.recording("governor", subject.what, subject.keys, sysfs) as j:
        for line in said:
            ctl.note(f"put back first: {line}")
        devices: list[gov.Device] = []
        devices = [gov.Device(sysfs, b, bounds, j, clock(), clock=clock) for b in backs]
        ctl.note(f"governing {', '.join(d.dev for d in devices)}: {bounds.words()}")
        try:
            for d in devices:
                d.knobs.start()
            stopped = _loop(sysfs, devices, bounds, ctl, once=once, ticks=ticks,
                            period=period, clock=clock, sleep=sleep, stepped=stepped)
        except signals.Terminated as exc:
            stopped = f"stopped by {exc.name}"
        finally:
            with signals.deferred():  # a signal now waits until every setting is back
                back = _put_back(j)
                try:
                    gov.write_state(bounds, devices, running=False)
                except CacheMgrError as exc:
                    log.warning("governor: its state file was not written: %s", exc)
    lines = [d.last.words(d.dev) for d in devices if d.last is not None]
    lines.append(f"{stopped}; put back: " + ("; ".join(back) or "nothing was changed"))
    if stepped:
        ctl.note(lines[-1])
    return Result(lines=[*left_aside, *lines], data={
        "schema": 1, "enabled": True, "bounds": _bounds_json(bounds),
        "devices": [d.record() for d in devices], "put_back": back, "stopped": stopped,
        "left_to_protect": left_aside}), bool(stepped)


def _put_back(j: undo.Journal) -> list[str]:
    try:
        return undo.put_back(j) if j.entries else []
    except CacheMgrError as exc:  # the journal keeps the rest: restore tries again
        log.error("%s", exc.message)
        return [exc.message]


def _bounds_json(b: gov.Bounds) -> dict[str, object]:
    return {"read_p99_ms": b.read_p99_ms, "max_dirty": b.max_dirty, "max_age_s": b.max_age_s}


def _loop(sysfs: Sysfs, devices: list[gov.Device], bounds: gov.Bounds, ctl: Control, *,
          once: bool, ticks: int | None, period: float, clock: Callable[[], float],
          sleep: Callable[[float], None], stepped: list[str] | None = None) -> str:
    said_at: dict[str, float] = {}
    n = 0
    while True:
        claimed = gov.claimed_by_protect()
        aside = [d.dev for d in devices if d.dev in claimed]
        if aside and stepped is not None:  # its settings back and its lock free, now
            stepped.extend(aside)
            return ("stepped aside for the protect pass: "
                    + "; ".join(f"{dev}: {claimed[dev]}" for dev in aside))
        end = clock() + period
        while True:  # every device's counters every SLICE (core/pace.py)
            at = clock()
            for d in devices:
                d.watch(sysfs, at)
            left = end - clock()
            if left <= 0:
                break
            sleep(min(pace.SLICE, left))
        now = clock()
        for d in list(devices):
            before = dict(d.last.gave_up) if d.last is not None else {}
            try:
                t = d.tick(sysfs, now)
            except CacheMgrError as exc:  # stopped, detached: nothing of it to govern
                ctl.note(f"{d.dev}: no longer governed ({exc.message})")
                devices.remove(d)
                continue
            if (t.changed or t.gave_up.keys() != before.keys()
                    or now - said_at.get(d.dev, -1e18) >= REPORT_EVERY):
                said_at[d.dev] = now
                ctl.note(t.words(d.dev))
                for k in before.keys() - t.gave_up.keys():
                    ctl.note(f"{d.dev}: {k} held again")
        if not devices:
            return "no device left to govern"
        gov.write_state(bounds, devices, running=True)
        n += 1
        if once:
            return "one tick (--once)"
        if ticks is not None and n >= ticks:
            return f"stopped after {n} ticks"
