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

A third, beside them and never an owner of the device: ``warm/KEY.json``, the warm an
arrival started after it dropped the device's copies (the policy's ``[migration]
warm_after``: ops/migrate.py ``warm_after``), from the moment the hook leaves it running to
its end: waiting for the VM to run here, running (the warm's own journal and the gate's
locks are what protect the device meanwhile), then done, failed or skipped, with its words.
It stays until the next arrival's warm replaces it; a record that says waiting or running
whose process is gone was cut short (status says so; nothing is left to put back that the
warm's undo journal does not hold).
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
WARM = "warm"
# a warm record's states: the first two while its process runs
WARM_ACTIVE = ("waiting", "running")
WARM_ENDED = ("done", "failed", "skipped")


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
    for k in ((kind,) if kind else (PENDING, LEFT)):  # a warm record owns nothing: asked alone
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


# ----------------------------------------------------------------------- the warm after an arrival


@dataclass(frozen=True)
class WarmRecord:
    """The warm an arrival left running for one device (``warm/KEY.json``)."""

    key: str
    device: str
    state: str  # WARM_ACTIVE or WARM_ENDED, or "interrupted" (active, its process gone)
    data: dict[str, Any]

    @property
    def domain(self) -> str | None:
        d = self.data.get("domain")
        return d if isinstance(d, str) else None

    def words(self) -> str:
        said = self.data.get("words")
        said = f": {said}" if isinstance(said, str) and said else ""
        who = f" after VM '{self.domain}' arrived" if self.domain else ""
        since = self.data.get("started")
        when = (time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(since))
                if isinstance(since, (int, float)) else "")
        what = {"waiting": "waiting for the VM to run here before it reads",
                "running": "running", "done": "done", "failed": "FAILED",
                "skipped": "not run",
                "interrupted": "cut short (its process is gone)"}.get(self.state, self.state)
        return f"{self.device}: the warm started{when}{who} is {what}{said}"

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "domain": self.domain, "state": self.state,
                "trace": self.data.get("trace"), "started": self.data.get("started"),
                "ended": self.data.get("ended"), "words": self.data.get("words"),
                "admitted_fraction": self.data.get("admitted_fraction")}


def warm_path(key: str) -> Path:
    return _path(WARM, key)


def warm_record(key: str, device: str, state_word: str, **extra: Any) -> Path:
    """Write (replace) the warm record of ``key``: ``state_word`` and what goes with it.
    The fields of the record before are kept unless ``extra`` names them again."""
    p = warm_path(key)
    old: dict[str, Any] = {}
    with contextlib.suppress(FileNotFoundError, state.StateFileError):
        old = state.read_json(p) or {}
    doc = {**old, "key": key, "device": device, "state": state_word}
    if state_word in WARM_ACTIVE:
        doc["pid"] = os.getpid()
    doc.update(extra)
    state.write_json(p, doc)
    return p


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def warms() -> list[WarmRecord]:
    """Every warm record; an active one whose process is gone reads "interrupted"."""
    out: list[WarmRecord] = []
    for m in marks(WARM):
        st = m.data.get("state")
        st = st if isinstance(st, str) else "unknown"
        if st in WARM_ACTIVE and not _alive(m.data.get("pid")):
            st = "interrupted"
        out.append(WarmRecord(m.key, m.device, st, m.data))
    return out


def warm_json() -> list[dict[str, object]]:
    """The warm records for ``status --json`` and ``vms --json`` (docs/json.md, ``warms``)."""
    return [w.to_json() for w in warms()]
