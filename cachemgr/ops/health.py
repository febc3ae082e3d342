"""``cachemgr ssd-health``: the SMART health of every cache SSD (backends/smart.py: smartctl
--json, cached per disk). Run by cachemgr-smart.timer with ``--refresh`` every 10 minutes,
so the metrics (whose sandbox cannot open a disk, and whose scrape never runs smartctl) have
an answer at most that old (systemd/README.md)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable

from cachemgr.backends import smart
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.core.errors import CacheMgrError, require_root
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import doctor as doctor_ops
from cachemgr.ops.control import Result
from cachemgr.procedures import governor, health, kinds, owners, unseen
from cachemgr.procedures.health import Finding, Level

__all__ = ["Finding", "Level", "check", "findings", "report"]


def report(sysfs: Sysfs, *, refresh: bool = False) -> Result:
    """Each cache SSD with its health: smartctl for an answer older than 10 minutes, or for
    every SSD with ``refresh``. A drive to replace soon, or one smartctl could not read, is
    also a note (stderr: what the timer's unit logs)."""
    if refresh and sysfs.live:
        require_root("reading SMART data (smartctl)")  # else every answer: permission denied
    snap = snapshot_mod.take(sysfs, probe_unregistered=False)
    rows = cache_ops.ssd_health(sysfs, snap, max_age=0.0 if refresh else smart.MAX_AGE)
    lines, notes = [], []
    for ssd, h in rows:
        words = h.words() if h is not None else "not read"
        lines.append(f"{ssd.node} (caches {', '.join(ssd.caches)}): {words}")
        if h is not None and (h.error or h.replace_soon):
            notes.append(f"cachemgr: warning: {ssd.node}: {words}")
    if not rows:
        lines.append("(no cache SSD: no SCSI disk or NVMe namespace holds a cache)")
    return Result(lines=lines, notes=notes,
                  data={"schema": 1, "ssd_health": cache_ops.ssd_health_json(rows)},
                  value=rows)


def findings(snap: Snapshot, rows: Iterable[tuple[smart.Ssd, smart.Health | None]] = ()
             ) -> list[Finding]:
    """The health model's findings of ``snap`` as a face shows them (status's, the TUI's,
    the metrics'): with the journals that cannot be read; with SMART's replace-soon when
    ``rows`` (each cache SSD and its cached answer) are given, as ``check`` and a scrape
    give them."""
    return health.assess(snap, replace_soon=replace_soon(rows), unreadable=_unreadable(snap),
                         gave_up=governor_gave_up())


def governor_gave_up(now: float | None = None) -> list[tuple[str, str, str]]:
    """(device, bound, why) for each bound the writeback governor gives up now: from its
    state file, while it runs and wrote it within the last minute (procedures/governor.py);
    none when it cannot be read (as another user than root)."""
    try:
        st = governor.load_state()
    except (OSError, CacheMgrError):
        return []
    when = time.time() if now is None else now
    if not st or st.get("running") is not True or not isinstance(st.get("updated"), (int, float)) \
            or when - st["updated"] > 60 or not isinstance(st.get("devices"), list):
        return []
    return [(str(d.get("device")), str(k), str(v)) for d in st["devices"]
            if isinstance(d, dict) and isinstance(d.get("gave_up"), dict)
            for k, v in d["gave_up"].items()]


def replace_soon(rows: Iterable[tuple[smart.Ssd, smart.Health | None]]
                 ) -> list[tuple[str, str]]:
    """(SSD node, why) for each SSD whose SMART answer says to replace it soon."""
    return [(ssd.node, "; ".join(h.warnings) or "replace soon") for ssd, h in rows
            if h is not None and h.replace_soon]


def _unreadable(snap: Snapshot) -> list[tuple[str, str]]:
    """The procedure journals that cannot be read; none looked for when the state directory
    itself could not be (``snap.unseen`` says so, once)."""
    if unseen.blind(list(snap.unseen), unseen.STATE):
        return []
    return owners.unreadable()


def check(sysfs: Sysfs, *, doctor_window: float | None = None) -> Result:
    """``cachemgr check``: the monitoring-plugin convention (Nagios, Icinga, Sensu, the Zabbix
    agent): one summary line with performance data, exit 0 OK, 1 WARNING, 2 CRITICAL, 3
    UNKNOWN (the CLI maps an error of its own to UNKNOWN). Reads the host once (the
    unregistered devices' superblocks included, as status does) and the SSDs' cached SMART
    answers (smartctl is the timer's job, never a check's). Changes no device; as root it
    keeps the dirty bcache backing devices it saw (health.remember), to say when one is gone.

    ``doctor_window`` (``check --verbose``): also why a cache does not help, doctor's causes
    over a window of that many seconds (ops/doctor.py, the same diagnosis), each a line
    after the findings and the list ``causes`` in the JSON. They do not change the level: a
    cache that does not help loses no data, and ``check`` says the same with or without."""
    snap = cache_ops.status(sysfs, probe_unregistered=True)
    if sysfs.live and os.geteuid() == 0:
        # remember the dirty backing devices, to say so when one is gone (health.remember)
        try:
            health.save_remembered(health.remember(snap, [*health.remembered()],
                                                   time.time()))
        except (OSError, CacheMgrError) as exc:
            snap = dataclasses.replace(snap, warnings=(
                *snap.warnings, f"the dirty backing devices not remembered: {exc}"))
    blind = list(snap.unseen)
    none: list[tuple[smart.Ssd, smart.Health | None]] = []
    rows = none if unseen.blind(blind, unseen.STATE) else unseen.guarded(
        blind, unseen.state_directory, lambda: smart.ssd_health(sysfs, snap, refresh=False),
        none)
    findings = health.assess(snap, replace_soon=replace_soon(rows),
                             unreadable=_unreadable(snap), gave_up=governor_gave_up())
    level = health.worst(findings)
    devices = list(kinds.listed(snap))
    dirty = sum(k.dirty_bytes or 0 for k in devices)
    crit = sum(f.level == health.Level.CRITICAL for f in findings)
    warn = sum(f.level == health.Level.WARNING for f in findings)
    if findings:
        head = f"{crit} critical, {warn} warning: " + findings[0].line()
    else:
        head = f"{len(devices)} cached devices, nothing wrong"
    perf = (f"devices={len(devices)} critical={crit} warning={warn} dirty_bytes={dirty}B "
            f"owners={len(snap.owners)}")
    lines = [f.line() for f in findings[1:]]
    if blind:
        # what could not be read can hide a CRITICAL (unseen.verdict)
        words = unseen.words(blind)
        level = unseen.verdict(level, blind)
        if level == health.Level.UNKNOWN:
            lines = [f.line() for f in findings]
            head = f"{words}; run it as root to see everything (sudo cachemgr check)"
        else:
            lines.append(words)
    line = f"CACHEMGR {level.name} - {head} | {perf}"
    causes = doctor_ops.causes(sysfs, doctor_window) if doctor_window is not None else None
    extra: dict[str, object] = {}
    if causes is not None:
        lines += [f"not helping: {c.device}: {c.code}: {c.what}; next: {c.next}"
                  for c in causes]
        if not causes:
            lines.append(f"not helping: nothing found in {doctor_window:g} s (cachemgr doctor)")
        extra = {"causes": [c.to_json() for c in causes], "window_seconds": doctor_window}
    return Result(lines=[line, *lines], value=level,
                  data={"schema": 1, "status": level.name, "exit_code": int(level), **extra,
                        "findings": [f.to_json() for f in findings],
                        "unseen": [cache_ops.unseen_json(u) for u in blind],
                        "perfdata": {"devices": len(devices), "critical": crit,
                                     "warning": warn, "dirty_bytes": dirty,
                                     "owners": len(snap.owners)}})
