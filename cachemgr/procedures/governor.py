"""The writeback governor: keep, for each cached device in writeback, the VMs' read p99 on
the backing disk under a bound, dirty data under a ceiling and the oldest dirty data under an
age, by turning the paced drain's knobs (issue #46 item 1; the policy's ``[writeback]``).

What it reads each tick (``PERIOD`` seconds; the counters every ``pace.SLICE`` between):

* the read latency the VMs see: the paced drain's measure (core/pace.py ``LatencyMeter``:
  the bcache device's block layer counters, which hold the VMs' IO and not the writeback's);
* dirty data: bcache's ``dirty_data`` (backends/bcache.py);
* the oldest dirty data's age, an estimate: bcache does not give it (no per-key timestamp in
  its sysfs files: drivers/md/bcache/sysfs.c). Every block dirty now was written after the
  last time dirty data read 0, so the time since that reading is an upper bound of the
  oldest dirty block's age; the governor keeps it per device, reading ``dirty_data`` with the
  counters (every ``pace.SLICE``: bursts of writes leave it at 0 for moments a tick every
  ``PERIOD`` would miss). Before its first reading of 0
  (dirty data since before the governor started) the age is unknown and counts as over the
  ceiling: the governor writes back until a reading of 0, rather than report an age it does
  not know.

What it decides (:class:`Governor`, pure): the pace of the paced drain's :class:`Pacer`
(slower while the VMs' p99 is over the bound, faster under half of it, unpaced when no VM
reads), except while dirty data or its age is near its ceiling (``NEAR`` of it): then
unpaced, until dirty data is down to ``CALM`` of its ceiling and the age back under
``NEAR``. The ceilings come first (dirty data that sits on one SSD is data a failing SSD
loses; a slow read is only slow): when the three cannot all hold, the read bound is the one
given up, and said (:class:`Tick` ``gave_up``, with the reason); a ceiling broken even
unpaced (the VMs write faster than the disk writes back) is said too.

How a pace is applied to bcache (:class:`BcacheKnobs`), as the paced drain does
(procedures/drain.py ``Paced``): unpaced, ``writeback_percent`` 0; paced at P sectors/s,
``writeback_rate_minimum`` P, ``writeback_rate`` P and ``writeback_percent`` 40 (the PI
controller's output then stays at its floor P). Besides, ``writeback_delay`` 1 (bcache's
writeback thread sleeps that long after each pass, 30 s by default: the age would grow by
that much) and ``writeback_running`` 1. Each setting's old value is journaled
(core/undo.py) before it is first changed: put back when the governor stops (SIGTERM,
SIGINT, SIGHUP, an error), and after a SIGKILL by the gate of the next command on the
device (the governor's next start included) or ``cachemgr restore``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.backends import bcache, blockdev
from cachemgr.core import pace, state, undo
from cachemgr.core.errors import AlreadyError, CacheMgrError
from cachemgr.core.model import BcacheBacking, CacheMode, Size, human
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import protect

PERIOD = 2.0  # seconds between two decisions (the paced drain's pacer's period)
NEAR = 0.8  # dirty data or age at this share of its ceiling: write back unpaced
CALM = 0.5  # ...until dirty data is down to this share of its ceiling
PACED_PERCENT = 40  # procedures/drain.py PACED_PERCENT: the PI controller stays at its floor
FIXED = {"writeback_delay": 1, "writeback_running": 1}
STATE = "governor"  # <state dir>/governor/state.json: what the last tick saw and did


@dataclass(frozen=True)
class Bounds:
    """The policy's ``[writeback]`` bounds; None: not bounded."""

    read_p99_ms: float | None = None
    max_dirty: int | None = None  # bytes
    max_age_s: float | None = None

    def words(self) -> str:
        out = []
        if self.read_p99_ms is not None:
            out.append(f"read p99 <= {self.read_p99_ms:g} ms")
        if self.max_dirty is not None:
            out.append(f"dirty <= {human(self.max_dirty)}")
        if self.max_age_s is not None:
            out.append(f"oldest dirty <= {self.max_age_s:g} s")
        return ", ".join(out) or "no bound"


@dataclass(frozen=True)
class Tick:
    """One decision: the pace (sectors/s; None unpaced), why, what was measured, and the
    bounds given up (``gave_up``: bound name -> why)."""

    pace: int | None
    note: str
    p99_ms: float | None
    ios: int
    dirty: int | None
    age_s: float | None  # None: unknown (dirty since before the governor started)
    pressed: str | None  # why it writes back unpaced for a ceiling ("" when not)
    gave_up: dict[str, str] = field(default_factory=dict)
    changed: bool = False

    def words(self, dev: str) -> str:
        """The status line of one device."""
        p99 = "-" if self.p99_ms is None else f"{self.p99_ms:.0f} ms"
        dirty = "?" if self.dirty is None else human(self.dirty)
        age = "unknown" if self.age_s is None else f"{self.age_s:.0f} s"
        line = (f"{dev}: {pace.pace_words(self.pace)}; read p99 {p99}, dirty {dirty}, "
                f"oldest dirty {age}; {self.note}")
        for what, why in self.gave_up.items():
            line += f"; GAVE UP {what}: {why}"
        return line


class Governor:
    """The decisions for one device (module docstring)."""

    def __init__(self, bounds: Bounds, now: float, *, period: float = PERIOD) -> None:
        self.bounds = bounds
        self.pacer = (pace.Pacer(bounds.read_p99_ms, period=period)
                      if bounds.read_p99_ms is not None else None)
        if self.pacer is not None:  # its first judgement on what comes after the start
            self.pacer.changed_at = now
        self.zero_at: float | None = None  # monotonic time dirty data last read 0
        self.started = now
        self.dirty_pressed = False
        self.pace: int | None = self.pacer.pace if self.pacer is not None else None
        self.period = period
        self.last_at: float | None = None

    def saw_clean(self, now: float) -> None:
        """Dirty data read 0 at ``now`` (between two decisions): the age starts again."""
        self.zero_at = now

    def age(self, now: float) -> float | None:
        return None if self.zero_at is None else now - self.zero_at

    def decide(self, now: float, p99: float | None, ios: int, drain_rate: float | None,
               dirty: int | None) -> Tick:
        """``p99``/``ios``: the VMs' reads since the pacer's last change
        (``LatencyMeter.p99``); ``drain_rate``: the writeback's writes, sectors/s;
        ``dirty``: dirty bytes now (None: unknown)."""
        b = self.bounds
        if dirty == 0:
            self.zero_at = now
        age = self.age(now)
        if self.pacer is not None:
            d = self.pacer.decide(now, p99, ios, drain_rate)
            # the pacer's words are a drain's; here it is the writeback
            paced, note = d.pace, d.note.replace("the drain", "the writeback")
        else:
            paced, note = None, "unpaced: no read bound"
        # the ceilings: near one, unpaced (module docstring)
        pressed = []
        if b.max_dirty is not None and dirty is not None:
            if dirty >= NEAR * b.max_dirty:
                self.dirty_pressed = True
            elif dirty <= CALM * b.max_dirty:
                self.dirty_pressed = False
            if self.dirty_pressed:
                pressed.append(f"dirty {human(dirty)} near its ceiling {human(b.max_dirty)}")
        if b.max_age_s is not None and dirty != 0:
            if age is None:
                pressed.append("oldest dirty data's age unknown (dirty since before the "
                               "governor started): writing back until a reading of 0")
            elif age >= NEAR * b.max_age_s:
                pressed.append(f"oldest dirty data {age:.0f} s near its ceiling "
                               f"{b.max_age_s:g} s")
        gave_up: dict[str, str] = {}
        why = "; ".join(pressed)
        new = None if pressed else paced
        if pressed:
            note = f"unpaced: {why}"
            if b.read_p99_ms is not None and p99 is not None and p99 > b.read_p99_ms:
                gave_up["read_p99"] = (f"read p99 {p99:.0f} ms > {b.read_p99_ms:g} ms while "
                                       f"writing back unpaced for the ceiling ({why})")
        elif (self.pacer is not None and p99 is not None and b.read_p99_ms is not None
              and p99 > b.read_p99_ms and self.pacer.over_at_floor
              and self.pace is not None and self.pace <= self.pacer.floor):
            gave_up["read_p99"] = (f"read p99 {p99:.0f} ms > {b.read_p99_ms:g} ms at the "
                                   "slowest writeback: the disk cannot serve these reads "
                                   "beside any writeback")
        if b.max_dirty is not None and dirty is not None and dirty > b.max_dirty:
            gave_up["max_dirty"] = (f"dirty {human(dirty)} > {human(b.max_dirty)}"
                                    + (": the VMs write faster than the disk writes back "
                                       "unpaced" if self.pace is None else
                                       ": writing back unpaced from now"))
        if b.max_age_s is not None and age is not None and age > b.max_age_s and dirty != 0:
            gave_up["max_age_s"] = (f"oldest dirty data {age:.0f} s > {b.max_age_s:g} s"
                                    + (": dirty data has not read 0 since, writing back "
                                       "unpaced" if self.pace is None else
                                       ": writing back unpaced from now"))
        changed = new != self.pace
        self.pace = new
        self.last_at = now
        return Tick(new, note, p99, ios, dirty, age, why, gave_up, changed)


def bcache_governed(b: BcacheBacking) -> bool:
    """A bcache device the governor turns: in writeback, attached, with a device node."""
    return (b.mode == CacheMode.WRITEBACK and b.cset_uuid is not None
            and b.device_name is not None)


class BcacheKnobs:
    """A pace applied to one bcache device (module docstring), each setting journaled in
    ``journal`` before its first change."""

    def __init__(self, sysfs: Sysfs, b: BcacheBacking, journal: undo.Journal) -> None:
        self.sysfs, self.b, self.journal = sysfs, b, journal
        self.rel = bcache.backing_rel(sysfs, b.identity.name)
        self.dev = b.device or b.identity.node
        self.applied: object = ()  # the last pace applied (() none yet)

    def _set(self, name: str, value: int) -> None:
        path = f"{self.rel}/{name}"
        old = self.sysfs.read(path).strip()
        if old == str(value):
            return
        # on disk before the change: a governor killed now still has it put back
        self.journal.remember(f"{self.dev} {name}", path, old)
        try:
            bcache.set_tunable(self.sysfs, self.b, name, value)
        except AlreadyError:
            pass

    def start(self) -> None:
        for name, value in FIXED.items():
            self._set(name, value)

    def apply(self, p: int | None) -> None:
        if p is None:
            if self.applied is not None:
                self._set("writeback_percent", 0)
        else:
            self._set("writeback_rate_minimum", p)
            # the PI controller may have raised the rate since (dirty data above
            # PACED_PERCENT of the cache): back to the pace, every tick
            bcache.set_writeback_rate(self.sysfs, self.b, p)
            self._set("writeback_percent", PACED_PERCENT)
        self.applied = p

    def put_back(self) -> list[str]:
        """Every setting journaled put back (undo.put_back: newest first); the words."""
        return undo.put_back(self.journal) if self.journal.entries else []


class Device:
    """One governed device: its meter, governor and knobs."""

    def __init__(self, sysfs: Sysfs, b: BcacheBacking, bounds: Bounds, journal: undo.Journal,
                 now: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.b = b
        self.dev = b.device or b.identity.node
        self.meter = pace.LatencyMeter()
        vm, backing = blockdev.pace_sources(sysfs, b.device_name, b.identity.name)
        self.sampler = pace.Sampler(vm, backing, self.meter, clock=clock)
        self.sampler.read()
        self.gov = Governor(bounds, now)
        self.knobs = BcacheKnobs(sysfs, b, journal)
        self.last: Tick | None = None
        self.gave_up_ticks: dict[str, int] = {}

    def watch(self, sysfs: Sysfs, now: float) -> None:
        """Between two ticks: the counters, and whether dirty data reads 0 (the age)."""
        self.sampler.read()
        text = sysfs.read_opt(f"{self.knobs.rel}/dirty_data")
        if text is not None:
            try:
                zero = Size.parse_hprint(text.strip()).is_zero(512)
            except (ValueError, CacheMgrError):  # KernelFormatError: unread this time
                return
            if zero:
                self.gov.saw_clean(now)

    def tick(self, sysfs: Sysfs, now: float) -> Tick:
        b = bcache.reread(sysfs, self.b.identity.name, stats=False)
        self.b = self.knobs.b = b
        pacer = self.gov.pacer
        since = pacer.changed_at if pacer is not None and pacer.changed_at is not None \
            else -math.inf
        p99, ios = self.meter.p99(since)
        t = self.gov.decide(now, p99, ios, self.sampler.drain_rate(), b.dirty_bytes)
        self.knobs.apply(t.pace)
        for k in t.gave_up:
            self.gave_up_ticks[k] = self.gave_up_ticks.get(k, 0) + 1
        self.last = t
        return t

    def record(self) -> dict[str, Any]:
        t = self.last
        return {"device": self.dev, "backing": self.b.identity.node, "kind": "bcache",
                "pace_sectors_per_s": None if t is None else t.pace,
                "read_p99_ms": None if t is None or t.p99_ms is None else round(t.p99_ms, 1),
                "dirty_bytes": None if t is None else t.dirty,
                "oldest_dirty_s": None if t is None or t.age_s is None else round(t.age_s, 1),
                "note": "" if t is None else t.note,
                "gave_up": {} if t is None else dict(t.gave_up),
                "gave_up_ticks": dict(self.gave_up_ticks)}


def state_path() -> Path:
    return state.state_dir() / STATE / "state.json"


def write_state(bounds: Bounds, devices: list[Device], *, running: bool) -> None:
    """What the last tick saw and did, for ``check`` (and anyone reading): ``running`` false
    once it stopped (its settings put back)."""
    state.write_json(state_path(), {
        "schema": 1, "running": running, "updated": round(time.time(), 3),
        "bounds": {"read_p99_ms": bounds.read_p99_ms, "max_dirty": bounds.max_dirty,
                   "max_age_s": bounds.max_age_s},
        "devices": [d.record() for d in devices]})


def claimed_by_protect() -> dict[str, str]:
    """The devices the protect pass has claimed (node -> why, in words): every device cached
    on an SSD it recorded as failing (procedures/protect.py ``next_state``: a triggered SSD's
    members, whether its switch was done or refused). The governor leaves them: while it
    holds a device's lock the protect pass's switch to writethrough is refused, and dirty
    data on a failing SSD is the data at risk. Read each tick (a small file)."""
    out: dict[str, str] = {}
    for v in protect.load_state()["protected"].values():
        devs = v.get("devices")
        for node in devs if isinstance(devs, dict) else ():
            out[str(node)] = (f"its cache SSD {v.get('ssd')} is failing "
                              f"({v.get('why')}): left to the protect pass")
    return out


def load_state() -> dict[str, Any] | None:
    """The governor's last state (None: none, or unreadable)."""
    try:
        d = state.read_json(state.state_dir(create=False) / STATE / "state.json")
    except state.StateFileError:
        return None
    return d if isinstance(d, dict) else None


FRESH = 60.0  # a state file older than this: the governor is not running (killed, stopped)


def metrics(st: dict[str, Any] | None, now: float) -> list[Any]:
    """The governor's figures as Prometheus metric families, from its state file ``st``
    (:func:`load_state`): ``cachemgr_governor_running`` 1 while it runs (its state written
    within ``FRESH`` seconds), and then per device its pace, the VMs' read p99, the oldest
    dirty data's age (absent while unknown) and each bound given up now."""
    from prometheus_client.core import GaugeMetricFamily

    running = GaugeMetricFamily("cachemgr_governor_running", "1 while the writeback governor "
                                "runs (cachemgr governor; its state written within the last "
                                "minute), else 0.")
    live = bool(st and st.get("running") is True and isinstance(st.get("updated"), (int, float))
                and now - st["updated"] <= FRESH and isinstance(st.get("devices"), list))
    running.add_metric([], 1.0 if live else 0.0)
    out: list[Any] = [running]
    if not live or st is None:
        return out
    pace_ = GaugeMetricFamily("cachemgr_governor_pace_bytes_per_second", "The writeback pace "
                              "the governor set (bytes/s); 0: unpaced, as fast as the disk "
                              "allows.", labels=["path"])
    p99 = GaugeMetricFamily("cachemgr_governor_read_p99_seconds", "The VMs' read p99 the "
                            "governor measured at its last tick (the device's own counters).",
                            labels=["path"])
    age = GaugeMetricFamily("cachemgr_governor_oldest_dirty_seconds", "The age of the oldest "
                            "dirty data, an upper bound: seconds since dirty data last read 0 "
                            "(absent while unknown).", labels=["path"])
    gave = GaugeMetricFamily("cachemgr_governor_gave_up", "1 for each bound the governor "
                             "gives up now (read_p99, max_dirty, max_age_s).",
                             labels=["path", "bound"])
    for d in st["devices"]:
        if not isinstance(d, dict) or not isinstance(d.get("device"), str):
            continue
        path = d["device"]
        p = d.get("pace_sectors_per_s")
        pace_.add_metric([path], float(p) * 512 if isinstance(p, int) else 0.0)
        if isinstance(d.get("read_p99_ms"), (int, float)):
            p99.add_metric([path], float(d["read_p99_ms"]) / 1000)
        if isinstance(d.get("oldest_dirty_s"), (int, float)):
            age.add_metric([path], float(d["oldest_dirty_s"]))
        for bound in (d.get("gave_up") or {}):
            gave.add_metric([path, str(bound)], 1.0)
    return [*out, pace_, p99, age, gave]
