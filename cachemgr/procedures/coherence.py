"""Coherent caches over shared storage: the records an invalidation and a VM's departure leave
in the state directory (docs/admin-guide.md, "Live migration over shared storage").

Two records, one file per cached device, keyed by the device's lock key
(procedures/owners.py):

* ``invalidate/KEY.json``: an invalidation is pending. :func:`pending` writes it before the
  invalidation changes anything and :func:`done` removes it once the kernel reports the copies
  dropped (bcache: attached again; dm-cache: 0 cache blocks in use). While it is there the
  device may still hold copies the shared disk no longer has (a power cut between the two:
  a bcache detach the kernel had not written to the superblock yet, a dm-cache device whose
  table is loaded again at boot over metadata that still maps its blocks). So the record is an
  interrupted procedure (:func:`cachemgr.procedures.owners.interrupted`): every other change to
  the device is refused until ``cachemgr invalidate DEV`` (which takes it over) finishes it,
  the libvirt hook finishes it before a VM on the device runs (an arrival, or a start), and
  status and ``check`` say so.
* ``left/KEY.json``: a VM whose disk sits on this cache left the host (the libvirt hook's
  ``release``): the disk may now be written elsewhere, so the cache may hold copies that are
  no longer what the disk holds. Shown by status and ``vms``; cleared by the next
  invalidation of the device (an arrival, or ``cachemgr invalidate DEV``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemgr.core import state
from cachemgr.core.errors import CacheMgrError

PENDING = "invalidate"
LEFT = "left"


@dataclass(frozen=True)
class Mark:
    """One record: the device (its node), its lock key, and what the record says."""

    key: str
    device: str
    since: float | None
    data: dict[str, Any]
    path: Path

    @property
    def domain(self) -> str | None:
        d = self.data.get("domain")
        return d if isinstance(d, str) else None

    def words(self) -> str:
        when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
                if self.since is not None else "an unknown time")
        if self.path.parent.name == PENDING:
            return (f"{self.device}: an invalidation started at {when} did not finish: "
                    "the cache may serve copies older than the disk")
        who = f"VM '{self.domain}'" if self.domain else "a VM"
        return (f"{self.device}: {who} left this host at {when}: its disk may be written "
                "elsewhere, and the cache may hold copies older than the disk")


def _path(kind: str, key: str) -> Path:
    return state.journal_path(kind, key)


def pending(key: str, device: str, **extra: Any) -> Path:
    """Record that an invalidation of ``device`` starts (before anything changes)."""
    p = _path(PENDING, key)
    state.write_json(p, {"key": key, "device": device, "started": time.time(),
                         "pid": os.getpid(), **extra})
    return p


def pending_path(key: str) -> Path:
    """Where the pending record of ``key`` is (a scrub that dropped some blocks removes it
    alone: ops/scrub.py)."""
    return _path(PENDING, key)


def done(key: str) -> None:
    """The invalidation of ``key`` finished: its pending record and any departure mark go."""
    for kind in (PENDING, LEFT):
        with contextlib.suppress(FileNotFoundError):
            _path(kind, key).unlink()


def left(key: str, device: str, domain: str, disk: str) -> Path:
    """Record that ``domain`` (whose disk ``disk`` sits on ``device``) left this host."""
    p = _path(LEFT, key)
    state.write_json(p, {"key": key, "device": device, "domain": domain, "disk": disk,
                         "started": time.time()})
    return p


def marks(kind: str | None = None) -> list[Mark]:
    """Every record (of ``kind``: :data:`PENDING` or :data:`LEFT`), never creating the state
    directory; an unreadable one is skipped (owners.unreadable lists it). Run as another
    user than root, the state directory (mode 0700) cannot be looked into: no marks, and
    the reader's one line on what it could not read (procedures/unseen.py) says so."""
    try:
        root = state.state_dir(create=False)
    except (OSError, CacheMgrError):
        if os.geteuid() != 0:
            return []
        raise
    out: list[Mark] = []
    for k in ((kind,) if kind else (PENDING, LEFT)):
        d = root / k
        try:
            if not d.is_dir():
                continue
            files = sorted(d.glob("*.json"))
        except PermissionError:
            return []
        for p in files:
            try:
                data = state.read_json(p)
            except state.StateFileError:
                continue
            if not data or not isinstance(data.get("key"), str):
                continue
            since = data.get("started")
            out.append(Mark(str(data["key"]), str(data.get("device") or data["key"]),
                            float(since) if isinstance(since, (int, float)) else None,
                            data, p))
    return out


def marked(keys: set[str] | frozenset[str]) -> list[Mark]:
    """The records that name one of ``keys``."""
    return [m for m in marks() if m.key in keys]


def left_json() -> list[dict[str, object]]:
    """The same marks for ``status --json`` and ``vms --json`` (docs/json.md)."""
    return [{"device": m.device, "domain": m.domain, "disk": m.data.get("disk"),
             "since": m.since} for m in marks(LEFT)]
