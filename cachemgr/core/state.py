"""Files cachemgr keeps on a host: journals under /var/lib/cachemgr and per-cache locks.

The state directory is ``/var/lib/cachemgr`` (``CACHEMGR_STATE_DIR`` overrides it, for tests
and the lab). Writes are atomic (write to a temporary file, fsync, rename, fsync the
directory), so a crash leaves either the old or the new journal, never half of one.
Locks are ``flock`` on a file per cache object: held while a procedure acts on it, released
by the kernel when the process dies, so a SIGKILLed run never leaves a stale lock.

Every journal carries ``"schema": N`` (:data:`SCHEMA`, the version of its layout); files
written before versions existed have none and read as version 1. A file that cannot be read
(truncated, not JSON, not an object, a newer schema, unreadable) raises
:class:`StateFileError` (exit 2) naming its path and why: listings report and skip it,
commands on its object refuse, nothing else is affected.

File names are the object's key, injectively: a key of only ``[A-Za-z0-9_.-]`` (replace
run ids, bcache UUIDs, kernel names, LVM/dm names) is its own file name, as before; any other
key (``a/b``, ``vg-a+b``) becomes its sanitised form plus ``~`` and a hash of the key, so it
can never meet the file of another key (``~`` never occurs in a plain key).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cachemgr.core.errors import UnsafeError, UsageError

DEFAULT_STATE_DIR = "/var/lib/cachemgr"


def state_dir(*, create: bool = True) -> Path:
    """The state directory; made (mode 0700) unless ``create`` is false (a reader that may
    run in a read-only sandbox, like the metrics)."""
    p = Path(os.environ.get("CACHEMGR_STATE_DIR", DEFAULT_STATE_DIR))
    if create:
        p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


# The layout version of every journal and state file this cachemgr writes (see above).
SCHEMA = 1
SCHEMA_KEY = "schema"
_PLAIN = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class StateFileError(UsageError):
    """A journal or state file that cannot be read: its path and why (exit 2)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: unreadable cachemgr state file: {reason}",
                         hint="look at it (a crash or a full disk can truncate it; a newer "
                              "cachemgr may have written it); move it away once its object "
                              "is checked by hand")
        self.path = path
        self.reason = reason


def _safe(key: str) -> str:
    """The file name of ``key``: injective (see the module docstring)."""
    if _PLAIN.fullmatch(key) and key not in (".", ".."):
        return key
    try:
        raw = key.encode("utf-8", "surrogateescape")  # a name from argv or the file system
    except UnicodeEncodeError:
        raw = key.encode("utf-8", "surrogatepass")  # a lone surrogate from a JSON escape
    digest = hashlib.sha256(raw).hexdigest()[:20]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:64] + "~" + digest


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, fsync, rename, fsync
    the directory. On any failure (ENOSPC, a signal) the temporary file is removed and the
    old ``path`` is untouched; the OSError names ``path`` (not the temporary file)."""
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {SCHEMA_KEY: SCHEMA, **data}
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: Path, *, schema: int = SCHEMA) -> dict[str, Any] | None:
    """A state file's object without its ``schema`` key; None if there is no file.
    Raises :class:`StateFileError` for a file that cannot be read or is newer than
    ``schema``."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise StateFileError(path, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise StateFileError(path, exc.strerror or str(exc)) from None
    if not text.strip():
        raise StateFileError(path, "empty (truncated?)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateFileError(path, f"not valid JSON (truncated?): {exc}") from None
    except RecursionError:
        raise StateFileError(path, "not valid JSON: nested too deeply") from None
    except ValueError as exc:  # a number of more than 4300 digits
        raise StateFileError(path, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise StateFileError(path, f"not a JSON object (a {type(data).__name__})")
    version = data.pop(SCHEMA_KEY, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StateFileError(path, f"schema {version!r} is not a version number")
    if version > schema:
        raise StateFileError(path, f"written by a newer cachemgr (schema {version}; this one "
                                   f"reads up to {schema})")
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
