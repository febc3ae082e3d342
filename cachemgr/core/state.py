"""Files cachemgr keeps on a host: journals under /var/lib/cachemgr and per-cache locks.

The state directory is ``/var/lib/cachemgr`` (``CACHEMGR_STATE_DIR`` overrides it, for tests
and the lab). Writes are atomic (write to a temporary file, fsync, rename, fsync the
directory), so a crash leaves either the old or the new journal, never half of one.
Locks are ``flock`` on a file per cache object: held while a procedure acts on it, released
by the kernel when the process dies, so a SIGKILLed run never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cachemgr.core.errors import UnsafeError

DEFAULT_STATE_DIR = "/var/lib/cachemgr"


def state_dir() -> Path:
    p = Path(os.environ.get("CACHEMGR_STATE_DIR", DEFAULT_STATE_DIR))
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def journal_path(kind: str, key: str) -> Path:
    return state_dir() / kind / f"{_safe(key)}.json"


# Locks this process holds: key -> (thread ident, depth). A command takes the lock of the
# object it acts on, and the procedure it calls (a drain, a flush) takes the same lock again:
# the same thread re-enters; another thread of this process (the TUI runs each operation in
# a worker thread) is refused exactly like another process.
_held: dict[str, tuple[int, int]] = {}
_held_mutex = threading.Lock()


def _busy(what: str, holder: str) -> UnsafeError:
    return UnsafeError(
        f"another cachemgr run is acting on {what} ({holder or 'pid unknown'})",
        hint="wait for it to finish; two runs on one cache at once could lose data",
    )


@contextlib.contextmanager
def locked(key: str, what: str) -> Iterator[None]:
    """Hold the lock for cache object ``key``; refuse (exit 3) if another run holds it.
    Re-entrant within one thread; another thread of this process is refused."""
    me = threading.get_ident()
    with _held_mutex:
        owner = _held.get(key)
        if owner is not None:
            if owner[0] != me:
                raise _busy(what, f"pid {os.getpid()}, another operation of this process")
            _held[key] = (me, owner[1] + 1)
    if owner is not None:
        try:
            yield
        finally:
            with _held_mutex:
                _held[key] = (me, _held[key][1] - 1)
        return
    d = state_dir() / "locks"
    d.mkdir(exist_ok=True)
    path = d / f"{_safe(key)}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            raise _busy(what, holder) from None
        with _held_mutex:
            if key in _held:  # another thread of ours won the race for the same key
                raise _busy(what, f"pid {os.getpid()}, another operation of this process")
            _held[key] = (me, 1)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
            yield
        finally:
            with _held_mutex:
                _held.pop(key, None)
    finally:
        os.close(fd)
