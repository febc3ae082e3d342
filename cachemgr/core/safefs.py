"""Files under the state directory that cannot be turned against root (issue #30): the
primitives cachemgr/core/state.py and the udev handler (cachemgr/ops/udev.py) share.

The state directory is ``/var/lib/cachemgr`` (``CACHEMGR_STATE_DIR`` overrides it). Nothing
under it is reached through a symbolic link: the directory is opened
``O_DIRECTORY|O_NOFOLLOW`` from its parent's descriptor, each directory below it and each
file by ``openat`` from its parent's descriptor with ``O_NOFOLLOW``, temporary files made
``O_EXCL`` and renamed within that descriptor. Run as root, a state directory, a directory
in or above it, or a file cachemgr writes in it that another user owns or could write to is
refused (:class:`UnsafePathError`: one line, the path and the fix; a root-owned sticky
directory such as ``/tmp`` is allowed above it): its owner could plant links that turn
root's writes against root's own files.

This module imports the standard library's os and stat only (both loaded by every Python
start): the udev handler runs it on every block uevent (cachemgr/ops/udev.py's docstring).
cachemgr/core/state.py turns :class:`UnsafePathError` into its ``UnsafeStateError`` (exit 2).
"""

from __future__ import annotations

import os
import stat

DEFAULT_STATE_DIR = "/var/lib/cachemgr"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def refusal(path: object, problem: str, fix: str) -> str:
    """The one line that refuses ``path``."""
    return (f"{path}: {problem}; cachemgr refuses it (whoever can change it could turn "
            f"root's writes against root's files); fix: {fix}")


class UnsafePathError(Exception):
    """A path under the state directory that cachemgr refuses: a symbolic link, or (run as
    root) something another user could change (``unsafe``), or not a directory where
    cachemgr keeps its state (not ``unsafe``; ``fix`` is then a hint)."""

    def __init__(self, path: object, problem: str, fix: str, *, unsafe: bool = True) -> None:
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        self.unsafe = unsafe
        self.message = refusal(path, problem, fix) if unsafe else f"{path}: {problem}; {fix}"
        super().__init__(self.message)


def configured() -> str:
    """The state directory's path as configured (not opened, not checked)."""
    return os.path.normpath(os.environ.get("CACHEMGR_STATE_DIR") or DEFAULT_STATE_DIR)


def loose(st: os.stat_result) -> str | None:
    """Why a file or directory that root trusts could be changed by another user (owned by
    another uid, or writable by group or others), None when only root can change it."""
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def loose_parent(real: str) -> tuple[str, str] | None:
    """The first directory from ``/`` down to ``real`` (a path without symbolic links:
    ``os.path.realpath``) that another user could change, and why; None when there is
    none. A root-owned sticky directory (``/tmp``) passes: nobody else can rename what root
    owns in it."""
    parts = [p for p in real.split("/") if p]
    for i in range(len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode):
            return d, "a symbolic link (it was replaced while it was checked)"
        why = loose(st)
        if why and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
            return d, why
    return None


def dir_fix(path: object) -> str:
    return f"chown root:root {path} && chmod 0700 {path}"


def _link_target(dfd: int, name: str) -> str | None:
    """The target of ``name`` in ``dfd`` when it is a symbolic link, else None."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        return None
    try:
        return os.readlink(name, dir_fd=dfd)
    except OSError:
        return "?"


def _not_a_dir(dfd: int, name: str, shown: str, exc: OSError) -> OSError:
    """What to raise when ``name`` (in ``dfd``) could not be opened as a directory without
    following links: a link or a non-directory is refused, anything else is ``exc``."""
    target = _link_target(dfd, name)
    if target is not None:
        raise UnsafePathError(
            shown, f"a symbolic link (to {target}); cachemgr does not follow links in its "
                   "state directory",
            f"make {shown} a directory owned by root, mode 0700 (move what it holds there)")
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(shown, "not a directory; cachemgr keeps its state there",
                              "move it away; cachemgr makes the directory itself",
                              unsafe=False)
    return exc


def _root(root: bool | None) -> bool:
    """Run as root? (``root``: the caller asked once for a whole walk: a poll.)"""
    return os.geteuid() == 0 if root is None else root


def check_dir(fd: int, shown: str, *, root: bool | None = None) -> None:
    """Run as root: refuse the directory open at ``fd`` if another user could change it."""
    if not _root(root):
        return
    why = loose(os.fstat(fd))
    if why:
        raise UnsafePathError(shown, why, dir_fix(shown))


def check_entries(fd: int, shown: str, *, root: bool | None = None) -> None:
    """Run as root: every directory in the state directory is root's alone, and nothing
    in it is a symbolic link (cachemgr makes none; its callers may name a subdirectory by
    path)."""
    if not _root(root):
        return
    with os.scandir(fd) as it:
        for e in it:
            if e.is_symlink():
                _not_a_dir(fd, e.name, os.path.join(shown, e.name), OSError("a link"))
            elif e.is_dir(follow_symlinks=False):
                why = loose(e.stat(follow_symlinks=False))
                if why:
                    sub = os.path.join(shown, e.name)
                    raise UnsafePathError(sub, why, dir_fix(sub))


def open_sub(dfd: int, name: str, shown: str, *, create: bool,
             root: bool | None = None) -> int | None:
    """The directory ``name`` in ``dfd``, opened without following a link and checked
    (made, mode 0700, if missing and ``create``; else None when missing)."""
    flags = _DIR | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        if not create:
            return None
        try:
            os.mkdir(name, 0o700, dir_fd=dfd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, flags, dir_fd=dfd)
        except OSError as exc:
            raise _not_a_dir(dfd, name, shown, exc) from None
    except OSError as exc:
        raise _not_a_dir(dfd, name, shown, exc) from None
    try:
        check_dir(fd, shown, root=root)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_state_dir(*, create: bool, root: bool | None = None) -> int | None:
    """The state directory's descriptor, opened without following a link and checked (run
    as root: it, every directory in it and every directory above it only root's to
    change); made (mode 0700) when missing if ``create``, else None then. ``root``: whether
    this runs as root, when the caller asked already."""
    shown = configured()
    fd = open_trusted_dir(shown, create=create, what=f"the state directory {shown}",
                          fix=" (or set CACHEMGR_STATE_DIR to a directory only root can "
                              "change)", root=root)
    if fd is not None:
        try:
            check_entries(fd, shown, root=root)
        except BaseException:
            os.close(fd)
            raise
    return fd


def open_dir(*parts: str, create: bool = True) -> int | None:
    """The directory ``parts`` under the state directory (``"autoattach", "queue"``), every
    directory on the way opened from its parent without following links and checked (see
    :func:`open_state_dir`); made when missing if ``create``, else None then."""
    fd = open_state_dir(create=create)
    shown = configured()
    for part in parts:
        if fd is None:
            return None
        shown = os.path.join(shown, part)
        try:
            nfd = open_sub(fd, part, shown, create=create)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def components(path: str) -> tuple[str, ...] | None:
    """The components of ``path`` below the state directory, None when it is not in it."""
    base = os.path.abspath(configured())
    rel = os.path.relpath(os.path.abspath(path), base)
    if rel == "." or rel == ".." or rel.startswith(".." + os.sep):
        return None
    return tuple(rel.split(os.sep))


def at(path: str, *, create: bool) -> tuple[int, str, bool] | None:
    """``path`` as (its directory's descriptor, its name, whether it is in the state
    directory): for a path under the state directory every directory on the way is opened
    from its parent without following links and checked (:func:`open_dir`), made when
    missing if ``create``; a path elsewhere (a bench report, a metrics textfile) has its
    directory opened as named. None when a directory is missing and ``create`` is false.
    The caller closes the descriptor."""
    comps = components(path)
    if comps is None:
        parent = os.path.dirname(os.path.abspath(path))
        if create:
            os.makedirs(parent, exist_ok=True)
        try:
            return os.open(parent, _DIR), os.path.basename(path), False
        except FileNotFoundError:
            if create:
                raise
            return None
    fd = open_dir(*comps[:-1], create=create)
    if fd is None:
        return None
    return fd, comps[-1], True


def refuse_link(shown: str, dfd: int, name: str) -> None:
    """``name`` in ``dfd`` could not be opened with O_NOFOLLOW: refuse it if it is a link
    (naming its target); return otherwise."""
    target = _link_target(dfd, name)
    if target is not None:
        raise UnsafePathError(shown, f"a symbolic link (to {target}); cachemgr does not "
                                     "follow links in its state directory", f"rm {shown}")


def open_file(dfd: int, name: str, shown: str, flags: int, mode: int = 0o600) -> int:
    """The file ``name`` in ``dfd`` opened with ``flags`` (plus O_NOFOLLOW and O_CLOEXEC),
    never through a link (refused: :class:`UnsafePathError`), and only a regular file. One
    opened for writing is, run as root, refused unless it is root's with one link: a hard
    link to another file would have that file written (``O_TRUNC`` is refused: write a new
    file with :func:`write_at`)."""
    assert not flags & os.O_TRUNC, "O_TRUNC truncates before the checks: use write_at"
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    except OSError:
        refuse_link(shown, dfd, name)
        raise
    try:
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif flags & (os.O_WRONLY | os.O_RDWR) and os.geteuid() == 0:
            if st.st_uid != 0:
                why = f"owned by uid {st.st_uid}, not root"
            elif st.st_nlink != 1:
                why = f"a file with {st.st_nlink} links (another name of it is elsewhere)"
        if why:
            raise UnsafePathError(shown, f"{why}; cachemgr writes this file itself",
                                  f"rm {shown}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_at(dfd: int, name: str, data: bytes, *, mode: int = 0o600,
             fsync: bool = True) -> None:
    """Replace ``name`` in ``dfd`` by a file holding ``data``, atomically: a temporary file
    beside it (``.NAME.RANDOM.tmp``, made ``O_EXCL|O_NOFOLLOW``, never through a link),
    renamed within ``dfd``; with ``fsync`` the file and then the directory are synced. On
    any failure the temporary file is removed and ``name`` is untouched."""
    tmp: str | None = None
    for _ in range(100):
        cand = f".{name}.{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
        tmp = cand
        break
    else:
        raise FileExistsError(17, "no free temporary file name", name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        tmp = None
        if fsync:
            os.fsync(dfd)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass


# dm-cache records (cachemgr/backends/dmcache/record.py): one file per device cachemgr
# created, read by the boot pass and the udev handler (which only asks whether any exists)
DEFAULT_DMCACHE_DIR = "/etc/cachemgr/dmcache"


def dmcache_dir() -> str:
    """The dm-cache record directory as configured (``CACHEMGR_DMCACHE_DIR`` overrides it:
    tests, and the lab, whose /etc does not survive a boot)."""
    return os.path.normpath(os.environ.get("CACHEMGR_DMCACHE_DIR") or DEFAULT_DMCACHE_DIR)


def any_dmcache_record() -> bool:
    """Is there a dm-cache record (a ``*.json`` file) at all? (the udev handler's question:
    standard library only, never raises)."""
    try:
        return any(n.endswith(".json") and not n.startswith(".")
                   for n in os.listdir(dmcache_dir()))
    except OSError:
        return False


def open_trusted_dir(shown: str, *, create: bool, what: str | None = None,
                     fix: str = "", root: bool | None = None) -> int | None:
    """The directory ``shown`` (the state directory, /etc/cachemgr/dmcache) opened without
    following a link at its last component and, run as root, refused when a directory
    above it is another user's to change (or was replaced while it was checked); ``what``
    and ``fix`` word the refusal. Made (mode 0700, and its parents) when missing if
    ``create``, else None then. ``root``: whether this runs as root, when the caller asked
    already (None: ask)."""
    root = _root(root)
    parent, name = os.path.split(os.path.abspath(shown))
    if not name:
        parent, name = "/", "."
    if create:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    real = os.path.realpath(parent)
    try:
        pfd = os.open(real, _DIR)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        if root:
            bad = loose_parent(real)
            pst, rst = os.fstat(pfd), os.lstat(real)
            if bad is None and (pst.st_dev, pst.st_ino) != (rst.st_dev, rst.st_ino):
                bad = real, "replaced while it was checked"
            if bad is not None:
                raise UnsafePathError(bad[0], f"{bad[1]}, and {what or shown} is in it",
                                      f"chown root:root {bad[0]} && chmod go-w {bad[0]}"
                                      + fix)
        return open_sub(pfd, name, shown, create=create, root=root)
    finally:
        os.close(pfd)
