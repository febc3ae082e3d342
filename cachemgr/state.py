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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cachemgr.errors import UnsafeError

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


@contextlib.contextmanager
def locked(key: str, what: str) -> Iterator[None]:
    """Hold the lock for cache object ``key``; refuse (exit 3) if another run holds it."""
    d = state_dir() / "locks"
    d.mkdir(exist_ok=True)
    path = d / f"{_safe(key)}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            raise UnsafeError(
                f"another cachemgr run is acting on {what} ({holder or 'pid unknown'})",
                hint="wait for it to finish; two runs on one cache at once could lose data",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
