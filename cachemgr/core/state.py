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

Nothing under the state directory is reached through a symbolic link (issue #30): the
directory is opened ``O_DIRECTORY|O_NOFOLLOW``, each directory below it and each file by
``openat`` from its parent's descriptor with ``O_NOFOLLOW``, temporary files made
``O_EXCL`` and renamed within that descriptor. Run as root, cachemgr also refuses (exit 2,
:class:`UnsafeStateError`, one line with the fix) a state directory, or a directory in or
above it, that another user owns or could write to (a sticky root-owned directory such as
``/tmp`` is allowed above it): its owner could plant links that turn root's writes against
root's own files. The primitives that do this are cachemgr/core/safefs.py's (the udev
handler, cachemgr/ops/udev.py, uses the same ones without this module's imports).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from cachemgr.core import safefs
from cachemgr.core.errors import UnsafeError, UsageError

DEFAULT_STATE_DIR = safefs.DEFAULT_STATE_DIR
T = TypeVar("T")

# what the policy loader (and anyone else root trusts a file of) checks: cachemgr/core/safefs.py
loose = safefs.loose
loose_parent = safefs.loose_parent


def _configured() -> Path:
    return Path(safefs.configured())


def state_dir(*, create: bool = True) -> Path:
    """The state directory; made (mode 0700) unless ``create`` is false (a reader that may
    run in a read-only sandbox, like the metrics). Refused (:class:`UnsafeStateError`, exit
    2) when it is a symbolic link or, run as root, when another user could change it or a
    directory in or above it (see the module docstring)."""
    fd = _open_state_dir(create=create)
    if fd is not None:
        os.close(fd)
    return _configured()


def exists() -> bool:
    """Whether the state directory is there (an lstat: neither opened nor checked; a
    reader that must not create it, run as another user, asks this first)."""
    return os.path.lexists(_configured())


class UnsafeStateError(UsageError):
    """A state directory or file that another user could turn against root, or a symbolic
    link where cachemgr keeps its own files (exit 2): one line, the path and the fix."""

    def __init__(self, path: Path | str, problem: str, fix: str) -> None:
        super().__init__(safefs.refusal(path, problem, fix))
        self.path = Path(path)
        self.problem = problem


@contextlib.contextmanager
def _checked() -> Iterator[None]:
    """safefs's refusals as this module's errors (exit 2)."""
    try:
        yield
    except safefs.UnsafePathError as exc:
        if exc.unsafe:
            raise UnsafeStateError(exc.path, exc.problem, exc.fix) from None
        raise UsageError(f"{exc.path}: {exc.problem}", hint=exc.fix) from None


def _open_state_dir(*, create: bool) -> int | None:
    """The state directory's descriptor, checked (see :func:`state_dir`); None when it is
    missing and ``create`` is false."""
    with _checked():
        return safefs.open_state_dir(create=create)


def _at(path: Path, *, create: bool) -> tuple[int, str, bool] | None:
    """``path`` as (its directory's descriptor, its name, whether it is in the state
    directory): see :func:`cachemgr.core.safefs.at`. The caller closes the descriptor."""
    with _checked():
        return safefs.at(str(path), create=create)


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
    """Write ``data`` to ``path`` atomically: a temporary file beside it (made ``O_EXCL``,
    never through a link), fsync, rename within the directory's descriptor, fsync the
    directory. On any failure (ENOSPC, a signal) the temporary file is removed and the old
    ``path`` is untouched; the OSError names ``path`` (not the temporary file). Under the
    state directory every directory is checked on the way (:func:`state_dir`)."""
    _write_atomic(path, data, mode=mode, create=False)


def _write_atomic(path: Path, data: bytes, *, mode: int, create: bool) -> None:
    try:
        at = _at(path, create=create)
        if at is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        dfd, name, _ = at
        try:
            safefs.write_at(dfd, name, data, mode=mode)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_json(path: Path, data: dict[str, Any]) -> None:
    data = {SCHEMA_KEY: SCHEMA, **data}
    _write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
                  mode=0o600, create=True)


def _read_bytes(path: Path) -> bytes | None:
    """The content of ``path`` (under the state directory: never through a link, and only
    a regular file); None when it or its directory is missing."""
    at = _at(path, create=False)
    if at is None:
        return None
    dfd, name, inside = at
    try:
        return _read_in(dfd, name, path, nofollow=inside)
    finally:
        os.close(dfd)


def _read_in(dfd: int, name: str, path: Path, *, nofollow: bool = True) -> bytes | None:
    """The content of ``name`` in the directory ``dfd`` (``path`` to name it): never through
    a link when ``nofollow`` (refused: :class:`StateFileError`), and only a regular file;
    None when it is missing."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP and nofollow:
            try:
                target = os.readlink(name, dir_fd=dfd)
            except OSError:
                target = "?"
            raise StateFileError(path, f"a symbolic link (to {target}); cachemgr does "
                                       "not follow links in its state directory") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise StateFileError(path, "not a regular file")
        return f.read()


def read_json(path: Path, *, schema: int = SCHEMA) -> dict[str, Any] | None:
    """A state file's object without its ``schema`` key; None if there is no file.
    Raises :class:`StateFileError` for a file that cannot be read or is newer than
    ``schema``."""
    try:
        raw = _read_bytes(path)
    except OSError as exc:
        raise StateFileError(path, exc.strerror or str(exc)) from None
    if raw is None:
        return None
    return parse_json(path, raw, schema=schema)


def parse_json(path: Path, raw: bytes, *, schema: int = SCHEMA) -> dict[str, Any]:
    """:func:`read_json`'s object from the bytes ``raw`` read from ``path``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(path, f"not UTF-8 text ({exc.reason})") from None
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
    return state_dir() / kind / journal_name(key)


def journal_name(key: str) -> str:
    """The file name of ``key``'s journal in its kind's directory (:func:`journal_path`
    without opening the state directory: a reader that lists the directory once)."""
    return f"{_safe(key)}.json"


def journal_names(kind: str) -> set[str]:
    """The journal files of ``kind`` now (one listing; empty when there is no state
    directory or none of that kind: never created here)."""
    root = state_dir(create=False)
    try:
        return {n for n in os.listdir(root / kind) if n.endswith(".json")}
    except OSError:
        return set()


# Locks this process holds: key -> _Held. A command takes the lock of the object it acts on,
# and the procedure it calls (a drain, a flush) takes the same lock again: the same owner
# re-enters. The owner is the thread, or one :func:`acting_as` block (a replace-ssd run
# holds its devices for the whole run, and the drains it starts in worker threads act for
# it); another thread of this process (the TUI runs each operation in a worker thread) is
# refused exactly like another process, even one acting for a token equal to the owner's
# (the TUI's resume or rollback of a run it is running in another worker).
@dataclasses.dataclass
class _Held:
    owner: object
    depth: int
    fd: int
    holder: dict[str, Any]


_held: dict[str, _Held] = {}
_held_mutex = threading.Lock()


class _Acting:
    """One :func:`acting_as` block: the owner of the locks taken inside it. Compared by
    identity, never by its token: two blocks acting for equal tokens are two owners."""

    __slots__ = ("token",)

    def __init__(self, token: object) -> None:
        self.token = token

    def __repr__(self) -> str:
        return f"acting as {self.token!r}"


_acting: contextvars.ContextVar[_Acting | None] = contextvars.ContextVar("cachemgr_acting",
                                                                        default=None)


def _me() -> object:
    acting = _acting.get()
    return acting if acting is not None else threading.get_ident()


def _owner_word(me: object) -> str:
    """An owner (a thread's ident, or an _Acting block) as the lock files name it."""
    return f"t{me:x}" if isinstance(me, int) else f"a{id(me):x}"


@contextlib.contextmanager
def acting_as(token: object) -> Iterator[None]:
    """Locks taken (or re-entered) inside act for this block, named ``token``: a
    procedure's worker threads run ``contextvars.copy_context().run(...)`` inside it to
    share its locks. Another block, in another thread, acting for an equal token is another
    owner (refused); a block nested in one acting for an equal token stays that owner."""
    cur = _acting.get()
    reset = _acting.set(cur if cur is not None and cur.token == token else _Acting(token))
    try:
        yield
    finally:
        _acting.reset(reset)


def holder_words(holder: dict[str, Any]) -> str:
    """What a lock file says of its holder, in words: "drain of /dev/bcache0 since 10:42,
    pid 123" (older cachemgr versions wrote "pid N" only)."""
    what = holder.get("procedure")
    run = holder.get("run")
    parts = [str(what) if what else "a cachemgr run"]
    if run:
        parts[0] += f" run {run}"
    since = holder.get("since")
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        parts.append("since " + time.strftime("%H:%M:%S", time.localtime(since)))
    if holder.get("step"):
        parts.append(f"step {holder['step']}")
    if holder.get("pid"):
        parts.append(f"pid {holder['pid']}")
    return ", ".join(parts)


def parse_holder(text: str) -> dict[str, Any]:
    """A lock file's content: the JSON object this version writes, or an older "pid N"."""
    text = text.strip()
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        try:  # a record being rewritten in place: the new one, then the old one's tail
            data = json.JSONDecoder().raw_decode(text)[0]
        except ValueError:
            m = re.fullmatch(r"pid (\d+)", text)
            return {"pid": int(m.group(1))} if m else {"raw": text[:200]}
    return data if isinstance(data, dict) else {"raw": text[:200]}


class BusyError(UnsafeError):
    """Another run holds the lock of the object (exit 3): ``holder`` is what its lock file
    says of it (procedure, run, step, since, pid)."""

    def __init__(self, what: str, holder: dict[str, Any]) -> None:
        if holder.get("procedure"):
            msg = f"{what} is held by {holder_words(holder)}"
        else:
            msg = (f"another cachemgr run is acting on {what} "
                   f"({holder_words(holder) if holder else 'pid unknown'})")
        hint = "wait for it to finish; two runs on one cache at once could lose data"
        if holder.get("procedure") == "governor":  # it does not finish: it runs until stopped
            hint = ("the writeback governor holds it until stopped: systemctl stop "
                    "cachemgr-governor.service (or stop the cachemgr governor you started), "
                    "then run this again; its settings are put back when it stops")
        super().__init__(msg, hint=hint)
        self.what = what
        self.holder = holder


def _write_holder(fd: int, holder: dict[str, Any], path: Path | None = None) -> None:
    """Say who holds the lock, in place: the new record over the old one, then the file cut
    to it. Never empty on the way (emptied then written, a reader in between, status or a
    command's check before its question, saw nobody holding a lock a run held: its step
    and its drains' progress are rewritten every few seconds); a reader in between sees the
    new record followed by the old one's tail (:func:`parse_holder` takes the first). An
    OSError (ENOSPC: the state directory's filesystem is full) names the file ``path``."""
    data = (json.dumps(holder, sort_keys=True) + "\n").encode()
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError as exc:
        if path is None or exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def open_lock(path: Path) -> int:
    """The lock file ``path`` opened read-write (made if missing), never through a link;
    run as root, refused unless it is a regular file of root's with one link (a hard link
    to another file would have that file truncated). The caller flocks and closes it."""
    at = _at(path, create=True)
    assert at is not None
    dfd, name, _ = at
    try:
        with _checked():
            return safefs.open_file(dfd, name, str(path), os.O_RDWR | os.O_CREAT
                                    | os.O_NONBLOCK)
    finally:
        os.close(dfd)


_open_lock = open_lock


def append(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (made, mode 0600, if missing: a log such as the
    auto-attach action journal) with one write, never through a link; run as root, refused
    unless it is a regular file of root's with one link (see :func:`open_lock`)."""
    at = _at(path, create=True)
    assert at is not None
    dfd, name, _ = at
    try:
        with _checked():
            fd = safefs.open_file(dfd, name, str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    finally:
        os.close(dfd)
    try:
        os.write(fd, data)
    except OSError as exc:  # ENOSPC: name the file, not only the errno
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(key: str, what: str, *, holder: dict[str, Any] | None = None) -> Iterator[None]:
    """Hold the lock for cache object ``key``; refuse (exit 3, :class:`BusyError` naming the
    holder) if another run holds it. ``holder`` (procedure, run, step...) is written into
    the lock file with this pid and the time, for the refusal of the next one and for
    status. Re-entrant for the same owner (see above); another thread is refused.

    The lock is let go when the last block of its owner ends, not the first one that took
    it: a procedure's worker thread acting for it (a replace-ssd run's drain) that is still
    in its block when the procedure's own block ends (a second Ctrl-C while it waits for
    its drains to put their tunables back) still owns the device; a second admin gets in
    only once that thread is out."""
    me = _me()
    with _held_mutex:
        mine = _held.get(key)
        if mine is not None:
            if mine.owner != me:
                raise BusyError(what, {**mine.holder, "pid": os.getpid(),
                                       "note": "another operation of this process"})
            mine.depth += 1
    if mine is not None:
        try:
            yield
        finally:
            _leave(key, mine)
        return
    lock_path = _configured() / "locks" / f"{_safe(key)}.lock"
    fd = _open_lock(lock_path)
    try:
        _flock_or_refuse(fd, what)
        # "owner": which run of this process (a thread, or a procedure's workers acting as
        # one): the locks one run holds are one owner to status, however far apart taken
        info = {"pid": os.getpid(), "owner": _owner_word(me), "since": round(time.time(), 3),
                "object": what, "key": key, **(holder or {})}
        with _held_mutex:
            if key in _held:  # another thread of ours won the race for the same key
                raise BusyError(what, {**_held[key].holder,
                                       "note": "another operation of this process"})
            mine = _held[key] = _Held(me, 1, fd, info)
    except BaseException:
        os.close(fd)
        raise
    try:
        _write_holder(fd, info, lock_path)
        yield
    finally:
        _leave(key, mine)


# how long a refusal waits for the holder's record when the lock file is empty: a holder
# writes it right after its flock, a release empties it right before its close
SAID_WITHIN = 0.2


def _flock_or_refuse(fd: int, what: str) -> None:
    """Take the lock open at ``fd``, or refuse (:class:`BusyError`) with what its holder's
    record says. An empty record is a holder that took the lock this instant and says so
    next, or one letting it go: asked again (the flock, then the record) for up to
    :data:`SAID_WITHIN` seconds, so that a refusal names the run that holds the device
    (seen in the lab: a second admin refused "another cachemgr run ... (pid unknown)"
    while a replace-ssd run held it)."""
    deadline = time.monotonic() + SAID_WITHIN
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = parse_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
        if holder or time.monotonic() >= deadline:
            raise BusyError(what, holder)
        time.sleep(0.005)


def _leave(key: str, h: _Held) -> None:
    """One block of ``h``'s owner ends; the last one lets the lock go: the file emptied
    (nobody holds it; a SIGKILL leaves the text) and closed, which releases the flock, before
    the key is free again in this process (a new block of ours would be refused by our own
    flock otherwise)."""
    with _held_mutex:
        h.depth -= 1
        if h.depth > 0:
            return
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(h.fd, 0)
            os.close(h.fd)
        finally:
            if _held.get(key) is h:
                del _held[key]


def update_holder(**fields: Any) -> None:
    """Update what the locks this owner holds say of it (a procedure's current step)."""
    me = _me()
    with _held_mutex:
        mine = [h for h in _held.values() if h.owner == me]
        for h in mine:
            h.holder.update(fields)
            with contextlib.suppress(OSError):
                _write_holder(h.fd, h.holder)


def _flocks() -> dict[int, set[int]] | None:
    """Every inode number a process holds a flock on, with the pids holding it, from
    /proc/locks (fs/locks.c lock_get_status: "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0
    EOF"); None when it cannot be read. Read, not probed: taking the lock to test it would
    make a concurrent run's LOCK_NB fail. Inodes, not devices: overlayfs (the lab's root)
    reports another device number through fstat than the one /proc/locks prints; so the
    pid the lock file names must be one holding that inode (see :func:`lock_file_holder`)."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    found: dict[int, set[int]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK":
            m = re.fullmatch(r"[0-9a-f]+:[0-9a-f]+:(\d+)", f[5])
            if m:
                pid = int(f[4]) if f[4].lstrip("-").isdigit() else 0
                found.setdefault(int(m.group(1)), set()).add(pid)
    return found


def current_holder(key: str) -> dict[str, Any] | None:
    """Who holds the lock of ``key`` now (its lock file's content), None when nobody does
    or there is no state directory; never creates anything and never takes the lock."""
    return lock_file_holder(state_dir(create=False) / "locks" / f"{_safe(key)}.lock")


def lock_file_holder(path: Path, locks: dict[int, set[int]] | None = None
                     ) -> dict[str, Any] | None:
    """What the lock file ``path`` says of its holder while it is held (None otherwise).
    ``locks``: :func:`_flocks` read once for many files.

    Held means: /proc/locks lists a flock on its inode number, by the pid the file names
    (a holder writes its record right after it takes the lock, and a release empties the
    file). The inode number alone is not enough: a SIGKILLed holder leaves its record
    behind, and a flock another process holds on a file of another filesystem can have the
    same number; that record, or an emptied file, is nobody's. Where /proc/locks cannot be
    read, a record is taken at its word."""
    at = _at(path, create=False)
    if at is None:
        return None
    dfd, name, _ = at
    try:
        fd = _open_lock_file(dfd, name)
    finally:
        os.close(dfd)
    if fd is None:
        return None
    try:
        return _holder_of(fd, os.fstat(fd), locks)
    finally:
        os.close(fd)


def _open_lock_file(dfd: int, name: str) -> int | None:
    """The lock file ``name`` in ``dfd`` opened to read, never through a link (None: it
    cannot be)."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=dfd)
    except OSError:
        return None


def _holder_of(fd: int, st: os.stat_result, locks: dict[int, set[int]] | None
               ) -> dict[str, Any] | None:
    """What the lock file open at ``fd`` (``st``: its fstat) says of its holder while it is
    held (:func:`lock_file_holder`)."""
    if locks is None:
        locks = _flocks()
    pids = locks.get(st.st_ino) if locks is not None else None
    if locks is not None and pids is None:
        return None
    holder = parse_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
    if not holder:
        return None  # released (emptied), or taken this instant and said so next
    pid = holder.get("pid")
    if pids and 0 not in pids and isinstance(pid, int) and pid not in pids:
        return None  # a killed holder's record; the flock is another file's
    return holder


def held_locks() -> list[dict[str, Any]]:
    """What every held lock file says of its holder (/proc/locks read once)."""
    d = state_dir(create=False) / "locks"
    try:
        names = sorted(p.name for p in d.iterdir() if p.name.endswith(".lock"))
    except OSError:
        return []
    locks = _flocks()
    found = [lock_file_holder(d / n, locks) for n in names]
    return [h for h in found if h is not None]


# ------------------------------------------------------------------ a poller's reads
# A poller (the TUI, status --watch) asks every second who owns what: the journals, the lock
# files and their holders, the protect pass's state. Read as every command reads them, that
# is a walk of the state directory from / for each file (about 900 system calls a poll on a
# host with 64 devices: docs/benchmarks.md, "The idle TUI against htop"). A poller's
# :class:`Kept` (its ScanCache's ``state``) makes it one walk a poll (:func:`polled`: the
# state directory opened and checked once, as :func:`state_dir` checks it, each of its
# directories opened once from it), and keeps between polls what cannot have changed:
#
# * a directory's listing while its mtime and ctime, inode and size stay the same (a file
#   made, renamed or removed in it changes them; cachemgr writes every journal by renaming
#   a new file into place);
# * a file's bytes while its own lstat (inode, size, mtime, ctime) stays the same (one
#   fstatat a file and poll; ctime moves with every change and nobody can set it);
# * which lock file has which inode number, to find the held ones in /proc/locks.
#
# What is never kept: /proc/locks (read every poll: a holder that dies changes no file, only
# the kernel's list of locks), and the text of a held lock file (the holder updates it in
# place: its step, its progress). Nothing is kept that changed less than RECENT_NS before the
# poll (a second change within the file system's timestamp tick would leave the times as
# they were: "racy git"), nor longer than ``keep`` seconds (read again then whatever the
# times say). A value read again is parsed as every command parses it; without a Kept
# (a one-shot command) nothing of this runs.

RECENT_NS = 2_000_000_000


def _sig(st: os.stat_result) -> tuple[int, ...]:
    """What moves when a directory's entries or a file's content change."""
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Transient(Exception):
    """A read that failed for now (EMFILE, ENOMEM, EIO): :meth:`Kept.file` returns its
    ``value`` without keeping it, so the next poll reads the file again."""

    def __init__(self, value: object) -> None:
        super().__init__(value)
        self.value = value


class Kept:
    """A poller's reads of its state directories, kept from one poll to the next while
    they did not change (see above). ``keep``: seconds at most; ``clock``: monotonic
    seconds, ``wall``: the time the file system's timestamps are in, ns (tests)."""

    def __init__(self, *, keep: float = 15.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], int] = time.time_ns) -> None:
        self.keep = keep
        self.clock = clock
        self.wall = wall
        # key -> (the directory's signature, when listed, the names)
        self._dirs: dict[Hashable, tuple[tuple[int, ...], float, list[str]]] = {}
        # (key, name) -> (the file's signature, when read, what was read)
        self._files: dict[tuple[Hashable, str], tuple[tuple[int, ...], float, Any]] = {}
        self._inos: dict[Hashable, dict[str, int]] = {}  # lock files: name -> inode number
        self._others: dict[int, frozenset[int]] | None = None  # /proc/locks: not ours
        self._now = 0.0
        self._recent = 0
        self.reads = 0  # listings, files read and lock files stat'd again (tests, benches)

    def begin(self) -> None:
        """At the start of a poll: its time, once."""
        self._now = self.clock()
        self._recent = self.wall() - RECENT_NS

    def clear(self) -> None:
        self._dirs.clear()
        self._files.clear()
        self._inos.clear()
        self._others = None

    def _keeps(self, st: os.stat_result) -> bool:
        return max(st.st_mtime_ns, st.st_ctime_ns) < self._recent

    def _fresh(self, at: float) -> bool:
        return self._now - at < self.keep

    def listing(self, key: Hashable, dfd: int, suffix: str) -> tuple[list[str], bool]:
        """The names in the directory open at ``dfd`` that end with ``suffix``, sorted; and
        whether they were listed now (not kept)."""
        st = os.fstat(dfd)
        sig = _sig(st)
        hit = self._dirs.get(key)
        if hit is not None and hit[0] == sig and self._fresh(hit[1]):
            return hit[2], False
        self.reads += 1
        names = sorted(n for n in os.listdir(dfd) if n.endswith(suffix))
        self._inos.pop(key, None)
        for gone in [k for k in self._files if k[0] == key and k[1] not in names]:
            del self._files[gone]
        if self._keeps(st):
            self._dirs[key] = (sig, self._now, names)
        else:
            self._dirs.pop(key, None)
        return names, True

    def file(self, key: Hashable, dfd: int, name: str, read: Callable[[], T]) -> T:
        """What ``read()`` gives for the file ``name`` in ``dfd``: kept while the file's
        lstat stays the same. ``read`` returns what to keep (bytes, or why not), never
        raises for the file's content."""
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            st = None
        k = (key, name)
        hit = self._files.get(k)
        if st is not None and hit is not None and hit[0] == _sig(st) and self._fresh(hit[1]):
            return hit[2]  # type: ignore[no-any-return]
        self.reads += 1
        try:
            value = read()
        except Transient as exc:
            self._files.pop(k, None)
            return exc.value  # type: ignore[return-value]
        if st is not None and self._keeps(st):
            self._files[k] = (_sig(st), self._now, value)
        else:
            self._files.pop(k, None)
        return value

    def inos(self, key: Hashable, dfd: int, names: list[str], *, again: bool
             ) -> dict[str, int]:
        """The inode number of each of ``names`` in ``dfd`` (lstat; kept with the listing,
        looked up ``again`` when asked)."""
        got = self._inos.get(key)
        if got is None or again:
            self.reads += 1
            got = {}
            for n in names:
                with contextlib.suppress(OSError):
                    got[n] = os.stat(n, dir_fd=dfd, follow_symlinks=False).st_ino
            self._inos[key] = got
        return got


class View:
    """The state directory for one poll (:func:`polled`): opened and checked once, each of
    its directories opened once from it; what did not change taken from the :class:`Kept`.
    Reads what :func:`read_json`, :func:`held_locks` and the journal listings read, with
    the same results and refusals."""

    def __init__(self, kept: Kept, fd: int, root: bool) -> None:
        self.kept = kept
        self.fd = fd
        self.root = root
        self.base = _configured()
        self._subs: dict[str, int | None] = {}

    def close(self) -> None:
        for fd in self._subs.values():
            if fd is not None:
                os.close(fd)
        self._subs.clear()
        os.close(self.fd)

    def _sub(self, kind: str) -> int | None:
        """The directory ``kind`` opened without following a link and checked (None: there
        is none, or it is not a directory: nothing of that kind)."""
        if kind not in self._subs:
            try:
                with _checked():
                    self._subs[kind] = safefs.open_sub(self.fd, kind, str(self.base / kind),
                                                       create=False, root=self.root)
            except UsageError as exc:
                if isinstance(exc, UnsafeStateError):
                    raise
                self._subs[kind] = None
        return self._subs[kind]

    def path(self, kind: str, name: str) -> Path:
        return self.base / kind / name

    def names(self, kind: str, suffix: str = ".json") -> list[str]:
        """The files of ``kind`` ending with ``suffix``, sorted (none when there is no such
        directory)."""
        fd = self._sub(kind)
        return [] if fd is None else self.kept.listing(("state", kind), fd, suffix)[0]

    def read_json(self, kind: str, name: str) -> dict[str, Any] | None:
        """:func:`read_json` of the file ``name`` of ``kind``."""
        fd = self._sub(kind)
        if fd is None:
            return None
        path = self.path(kind, name)

        def read() -> bytes | str | None:
            try:
                return _read_in(fd, name, path)
            except StateFileError as exc:
                return exc.reason
            except OSError as exc:  # for now, perhaps: read again at the next poll
                raise Transient(exc.strerror or str(exc)) from None

        raw = self.kept.file(("state", kind), fd, name, read)
        if isinstance(raw, str):
            raise StateFileError(path, raw)
        return None if raw is None else parse_json(path, raw)

    def held_locks(self) -> list[dict[str, Any]]:
        """:func:`held_locks`: /proc/locks read now; of the lock files only those whose
        inode number it lists are opened."""
        fd = self._sub("locks")
        if fd is None:
            return []
        key = ("state", "locks")
        try:
            names, listed = self.kept.listing(key, fd, ".lock")
        except OSError:
            return []
        locks = _flocks()
        if locks is None:  # every file read, as held_locks reads them
            found = [self._holder(fd, n, None) for n in names]
            return [h for h in found if h is not None]
        inos = self.kept.inos(key, fd, names, again=False)
        others = _others(locks, inos)
        # a flock on an inode number that is not a known lock file's, or a known one held
        # by other pids than at the last poll: a lock file may have another inode now
        # (overlayfs copies a file up when it is opened to write): look again
        if not listed and others != self.kept._others:
            inos = self.kept.inos(key, fd, names, again=True)
            others = _others(locks, inos)
        self.kept._others = others
        found = [self._holder(fd, n, locks, inos[n]) for n in names
                 if inos.get(n) in locks]
        return [h for h in found if h is not None]

    def _holder(self, dfd: int, name: str, locks: dict[int, set[int]] | None,
                ino: int | None = None) -> dict[str, Any] | None:
        fd = _open_lock_file(dfd, name)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if ino is not None and st.st_ino != ino:
                self.kept._inos.pop(("state", "locks"), None)  # looked up at the next poll
            return _holder_of(fd, st, locks)
        finally:
            os.close(fd)


def _others(locks: dict[int, set[int]], inos: dict[str, int]) -> dict[int, frozenset[int]]:
    """The flocks of /proc/locks on inode numbers that are none of ``inos``', with pids."""
    ours = set(inos.values())
    return {i: frozenset(p) for i, p in locks.items() if i not in ours}


@contextlib.contextmanager
def polled(kept: Kept) -> Iterator[View]:
    """The state directory for one poll of a poller that keeps ``kept``: made if missing
    and checked as :func:`state_dir` makes and checks it (the same refusals), euid asked
    once, every descriptor closed at the end."""
    kept.begin()
    root = os.geteuid() == 0
    with _checked():
        fd = safefs.open_state_dir(create=True, root=root)
    assert fd is not None
    view = View(kept, fd, root)
    try:
        yield view
    finally:
        view.close()
