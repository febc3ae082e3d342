"""What a procedure changed for a while, kept so that a lost session leaves nothing changed.

A procedure that changes a device's settings for a while and puts them back at its end
(bench: a cache's mode, its congestion thresholds, ``sequential_cutoff``, a disk's IO
scheduler) records each setting's old value here *before* it writes the new one: a journal
under the state directory (``undo/ID.json``, written atomically) with what it is, the lock
keys of the objects it holds, its pid and the settings to put back, oldest first. It puts
them back itself at its end, on an error, on Ctrl-C, SIGTERM or SIGHUP (the terminal
closed: core/signals.py; the TUI cancels its operations on them), and the journal goes.

One killed outright (SIGKILL, a crash, a power cut) leaves its journal. Until something puts
it back, ``status`` shows each device it claims as owned by the interrupted procedure
(procedures/owners.py), ``check`` warns, and the next command that takes the device's locks
through the gate (any change, or ``cachemgr restore``) puts the settings back first and says
so (ops/gate.py): a journal whose locks the command holds has no live process any more.

The paths are relative to the sysfs root and are checked when read back: only files under
``block/`` or ``fs/bcache/`` without ``..`` are ever written (a journal is root's, in a
directory cachemgr trusts, but it is data all the same).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.core import state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import DEFAULT_ROOT, Sysfs

log = logging.getLogger(__name__)

KIND = "undo"
_PATH = re.compile(r"(?:block|fs/bcache)/[A-Za-z0-9_.:+@-]+(?:/[A-Za-z0-9_.:+@-]+)*")


@dataclass
class Journal:
    """One procedure's settings to put back (``entries``: what, sysfs path, old value)."""

    procedure: str  # "bench", "warm"
    device: str  # what it acts on, in words
    keys: frozenset[str]  # the lock keys of the objects it holds
    root: str = DEFAULT_ROOT  # the sysfs root its paths are under (a test's captured tree)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started: float = field(default_factory=time.time)
    entries: list[tuple[str, str, str]] = field(default_factory=list)
    path: Path | None = None

    def remember(self, what: str, path: str, value: str) -> None:
        """Record ``path``'s old ``value`` (once per path: the first is the original),
        written to disk before the caller changes the setting."""
        if any(p == path for _, p, _ in self.entries):
            return
        if not _PATH.fullmatch(path) or "/../" in f"/{path}/":
            raise CacheMgrError(f"undo journal: refusing to record {path!r} (not a sysfs "
                                "setting under block/ or fs/bcache/)")
        self.entries.append((what, path, value))
        self._write()

    def forget(self, path: str) -> None:
        """``path`` was put back (or its change is final): not to be restored any more."""
        before = len(self.entries)
        self.entries = [e for e in self.entries if e[1] != path]
        if len(self.entries) != before:
            self._write()

    def done(self) -> None:
        """Everything put back: the journal goes."""
        self.entries.clear()
        self._write()

    def _write(self) -> None:
        self.path = self.path or state.journal_path(KIND, self.id)
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        state.write_json(self.path, {
            "procedure": self.procedure, "device": self.device, "keys": sorted(self.keys),
            "root": self.root, "pid": os.getpid(), "started": round(self.started, 3),
            "entries": [{"what": w, "path": p, "value": v} for w, p, v in self.entries]})


_current: contextvars.ContextVar[Journal | None] = contextvars.ContextVar("undo", default=None)


def current() -> Journal | None:
    """The journal of the procedure running in this context (None: nothing records)."""
    return _current.get()


@contextlib.contextmanager
def recording(procedure: str, device: str, keys: Iterable[str],
              sysfs: Sysfs) -> Iterator[Journal]:
    """Within the block, settings changed through :func:`current`'s journal are recorded
    first. A journal still holding entries when the block ends (a put-back that failed) is
    left for the gate to finish; an empty one is gone."""
    j = Journal(procedure, device, frozenset(keys), str(sysfs.root))
    token = _current.set(j)
    try:
        yield j
    finally:
        _current.reset(token)


def load(path: Path, view: state.View | None = None) -> Journal | None:
    """A journal read back (None: not one; never raises for its content). ``view``: a
    poller's state directory for this poll (core/state.py ``polled``)."""
    try:
        d = state.read_json(path) if view is None else view.read_json(KIND, path.name)
    except state.StateFileError:
        return None
    if not isinstance(d, dict):
        return None
    entries = []
    for e in d.get("entries") or []:
        if not isinstance(e, dict):
            return None
        w, p, v = e.get("what"), e.get("path"), e.get("value")
        if not (isinstance(w, str) and isinstance(p, str) and isinstance(v, str)) \
                or not _PATH.fullmatch(p) or "/../" in f"/{p}/":
            return None
        entries.append((w, p, v))
    keys = d.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or not keys:
        return None
    started, root = d.get("started"), d.get("root", DEFAULT_ROOT)
    if not isinstance(root, str) or not root.startswith("/"):
        return None
    return Journal(str(d.get("procedure") or "a procedure"), str(d.get("device") or "?"),
                   frozenset(keys), root, id=path.stem,
                   started=float(started) if isinstance(started, int | float) else 0.0,
                   entries=entries, path=path)


def journals(view: state.View | None = None) -> list[Journal]:
    """Every undo journal in the state directory (never creates it; ``view``: a poller's,
    :func:`load`)."""
    if view is not None:
        return [j for j in (load(view.path(KIND, n), view) for n in view.names(KIND))
                if j is not None]
    d = state.state_dir(create=False) / KIND
    if not d.is_dir():
        return []
    return [j for j in (load(p) for p in sorted(d.glob("*.json"))) if j is not None]


def unreadable() -> list[tuple[str, str]]:
    """(path, why) for each file in the journal directory that is not a journal."""
    d = state.state_dir(create=False) / KIND
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        if load(p) is None:
            try:
                state.read_json(p)
                why = "not an undo journal"
            except state.StateFileError as exc:
                why = exc.reason
            out.append((str(p), why))
    return out


def put_back(j: Journal) -> list[str]:
    """Write ``j``'s old values back (under its sysfs root), newest change first; the words
    of each. The journal goes once every one is back; one that cannot be written stays in
    it (and the error is raised after the others were tried)."""
    sysfs = Sysfs(j.root)
    said, failed = [], []
    for what, path, value in reversed(list(j.entries)):
        try:
            if sysfs.exists(path):
                sysfs.write(path, value)
                said.append(f"{what}: {value} (put back)")
            else:  # the device went: nothing of it to put back
                said.append(f"{what}: gone, nothing to put back")
            j.forget(path)
        except CacheMgrError as exc:
            failed.append(f"{what}: {exc}")
    if failed:
        raise CacheMgrError(f"{j.device}: what an interrupted {j.procedure} changed was not "
                            "all put back: " + "; ".join(failed),
                            hint=f"its journal {j.path} keeps the rest; cachemgr restore "
                                 "tries again")
    return said


def words(j: Journal) -> str:
    return ", ".join(f"{w} {v}" for w, _, v in j.entries)


def to_json(j: Journal) -> dict[str, Any]:
    return {"id": j.id, "procedure": j.procedure, "device": j.device,
            "keys": sorted(j.keys), "root": j.root, "started": j.started, "journal": str(j.path),
            "entries": [{"what": w, "path": p, "value": v} for w, p, v in j.entries]}
