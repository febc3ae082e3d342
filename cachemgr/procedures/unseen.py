"""What a run without root cannot read of cachemgr's own files, in the words every reader
(``status``, ``check``, the metrics) reports once: :class:`~cachemgr.core.model.Unseen`.

cachemgr keeps two directories only root may read: the state directory (``/var/lib/cachemgr``,
mode 0700: the journals of drains, flushes, replace-ssd runs and undo records, the lock files
that say who runs what, the protect policy's state and the cached SMART answers) and the
dm-cache records (``/etc/cachemgr/dmcache``, mode 0700). A monitoring agent's user (nagios,
prometheus) can stat either but not list it (EACCES). The readers then leave out what those
files say and list the directory here; they never create either, and never write.

The scans of the kernel's side (dmsetup, the superblocks of unclaimed disks) add their own
entries in backends/snapshot.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TypeVar

from cachemgr.core import safefs
from cachemgr.core.model import Unseen
from cachemgr.procedures.health import Level

T = TypeVar("T")

STATE = "state-directory"
RECORDS = "dmcache-records"

STATE_HIDES = ("interrupted or running procedures (drain, flush, replace-ssd, restore), the "
               "protect policy's actions and the cache SSDs' SMART answers")
RECORDS_HIDES = ("dm-cache devices cachemgr created that are not assembled (in writeback "
                 "their origin is stale)")


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _denied(path: str) -> str | None:
    """Why this process cannot read the directory ``path`` and everything in it (None: it
    can, or it is missing). Opens directories to list them and reads no file: a file it
    may not read (root's files are made mode 0600) is found by its mode
    (``os.access``). Never follows a link (cachemgr makes none there)."""
    errors: list[OSError] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except PermissionError as exc:
        return _why(exc)
    except OSError:
        return None  # missing, or not a directory: the readers say so themselves
    os.close(fd)
    for top, _, files in os.walk(path, onerror=errors.append):
        for name in files:
            if not os.access(os.path.join(top, name), os.R_OK, follow_symlinks=False):
                return f"{os.path.join(top, name)}: {os.strerror(errno.EACCES)}"
    denied = [e for e in errors if isinstance(e, PermissionError)]
    if denied:
        return f"{denied[0].filename}: {_why(denied[0])}"
    return None


def state_directory(why: str | None = None) -> Unseen:
    """The state directory as unseen (``why``: the error's words; EACCES's by default)."""
    return Unseen(STATE, safefs.configured(), why or "Permission denied", STATE_HIDES)


def records(why: str | None = None) -> Unseen:
    """The dm-cache record directory as unseen."""
    return Unseen(RECORDS, safefs.dmcache_dir(), why or "Permission denied", RECORDS_HIDES)


def own_files() -> list[Unseen]:
    """cachemgr's directories this process cannot read: none when run as root."""
    if os.geteuid() == 0:
        return []
    out = []
    why = _denied(safefs.configured())
    if why is not None:
        out.append(state_directory(why))
    why = _denied(safefs.dmcache_dir())
    if why is not None:
        out.append(records(why))
    return out


def guarded(found: list[Unseen], make: Callable[[str], Unseen], read: Callable[[], T],
            default: T) -> T:
    """``read()``; when it is refused (EACCES, EPERM: a file or directory below the one
    :func:`own_files` looked at, made by root mode 0600/0700) ``default``, and ``make(why)``
    added to ``found`` unless an entry of its kind is there already."""
    try:
        return read()
    except PermissionError as exc:
        u = make(_why(exc))
        if all(x.what != u.what for x in found):
            found.append(u)
        return default


def blind(found: list[Unseen], what: str) -> bool:
    """Is ``what`` (:data:`STATE`, :data:`RECORDS`) among ``found``?"""
    return any(u.what == what for u in found)


def words(found: list[Unseen] | tuple[Unseen, ...]) -> str:
    """The one line that says what this run could not read and what that means: each
    :class:`Unseen` can hide a CRITICAL finding."""
    return ("not root: not read: " + "; ".join(u.line() for u in found)
            + "; a CRITICAL finding there would not be seen")


def verdict(level: Level, found: list[Unseen] | tuple[Unseen, ...]) -> Level:
    """The level to report when ``found`` could not be read and the findings seen say
    ``level``: each :class:`Unseen` can hide a CRITICAL, so only a CRITICAL seen anyway
    stands; anything less is UNKNOWN, never OK or WARNING."""
    if found and level != Level.CRITICAL:
        return Level.UNKNOWN
    return level
