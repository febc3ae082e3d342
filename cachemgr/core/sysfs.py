"""The one root through which every /sys read and write goes (prometheus/procfs' NewFS).

No module of cachemgr names "/sys" itself: they hold a :class:`Sysfs` and use paths relative
to it, so unit tests point it at a captured lab tree (tests/fixtures/<scenario>/sys) and the
lab and production point it at the real /sys.

Reads are tolerant by design: a file that a kernel lacks reads as ``None`` through
:meth:`Sysfs.read_opt` (node_exporter#2103: one vanished bcache stats file broke the whole
collector). Writes report the kernel's answer (errno) in a typed :class:`SysfsError`, because
for bcache a failed write *is* the error report (a failed ``register`` surfaces later as ENOENT
on ``attach`` if it is not checked).
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections.abc import Iterator
from pathlib import Path

from cachemgr.core.errors import SysfsError

DEFAULT_ROOT = "/sys"

# Files that must never be read on a normal scan: priority_stats walks every bucket under the
# bucket lock (node_exporter#1593 hung on it).
NEVER_READ = frozenset({"priority_stats"})


CHUNK = 1 << 16

_writes = 0  # sysfs writes this process has made (:func:`writes`)


def writes() -> int:
    """How many sysfs writes this process has made, under any root (failed ones included).
    A poller's ScanCache drops the values it keeps between full reads when this moved since
    its last scan: a tunable cachemgr itself wrote shows on the next poll
    (backends/scancache.py)."""
    return _writes


def note_write() -> None:
    """Count a write (:meth:`Sysfs.write` calls it once the write is done or failed)."""
    global _writes
    _writes += 1


def _slurp(path: str) -> bytes:
    """A file's bytes in as few system calls as the kernel allows: open, one read, close.
    A sysfs attribute (and a cgroup file: seq_file) hands all it has, up to the size asked,
    to the first read; only a read that fills the whole chunk is followed by more. Python's
    ``open(path, "rb").read()`` makes seven or eight calls (fstat twice, the isatty ioctl, a
    second read for the end of file): under UML, where each is a round trip to the host,
    1,000 reads took 0.9 s that way and 0.2-0.26 s this way (lab, issue #34)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, CHUNK)
        if len(data) == CHUNK:
            parts = [data]
            while chunk := os.read(fd, CHUNK):
                parts.append(chunk)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


class Sysfs:
    def __init__(self, root: str | os.PathLike[str] = DEFAULT_ROOT) -> None:
        self.root = Path(root)
        # string paths on the hot path (a scan makes ~1000 accesses: pathlib's parsing cost
        # more than the reads themselves in the UML lab, benchmarks/scan_bench.py)
        self._prefix = str(self.root).rstrip("/") + "/"

    def __repr__(self) -> str:
        return f"Sysfs({str(self.root)!r})"

    @property
    def live(self) -> bool:
        """The running kernel's /sys (not a capture): /dev nodes, udev and libblkid then
        describe its devices. The one "is this the live /sys" check."""
        try:
            return self.root.resolve() == Path(DEFAULT_ROOT).resolve()
        except OSError:
            return False

    def path(self, rel: str) -> Path:
        rel = rel.lstrip("/")
        return self.root / rel if rel else self.root

    def _str(self, rel: str) -> str:
        return self._prefix + rel.lstrip("/")

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._str(rel))

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self._str(rel))

    def read(self, rel: str) -> str:
        """The file's text without the trailing newline; raises SysfsError."""
        if rel.rstrip("/").rsplit("/", 1)[-1] in NEVER_READ:
            raise SysfsError(rel, "read", None, "refusing to read (locks every bucket)")
        p = self._str(rel)
        try:
            data = _slurp(p)
        except OSError as exc:
            raise SysfsError(p, "read", exc.errno, exc.strerror or str(exc)) from exc
        return data.decode(errors="replace").rstrip("\n")

    def read_bytes(self, rel: str) -> bytes | None:
        """A binary attribute (SCSI VPD pages) unchanged, or None when missing/unreadable."""
        if rel.rstrip("/").rsplit("/", 1)[-1] in NEVER_READ:
            raise SysfsError(rel, "read", None, "refusing to read (locks every bucket)")
        try:
            with open(self._str(rel), "rb") as f:
                return f.read()
        except OSError:
            return None

    def read_opt(self, rel: str) -> str | None:
        """Like :meth:`read`, but ``None`` when the file is missing or unreadable."""
        try:
            return self.read(rel)
        except SysfsError as exc:
            if exc.errno in (errno_mod.ENOENT, errno_mod.ENOTDIR, errno_mod.EACCES,
                             errno_mod.EPERM, errno_mod.EINVAL, errno_mod.ENODEV,
                             errno_mod.ENXIO, errno_mod.EIO):
                return None
            raise

    def read_int(self, rel: str) -> int | None:
        text = self.read_opt(rel)
        if text is None:
            return None
        try:
            return int(text.strip())
        except ValueError:
            return None

    def write(self, rel: str, value: str) -> None:
        """Write ``value`` in one write(2), as the kernel expects; raises SysfsError."""
        p = self.path(rel)
        data = value.encode()
        try:
            fd = os.open(p, os.O_WRONLY)
        except OSError as exc:
            raise SysfsError(str(p), "write", exc.errno, exc.strerror or str(exc)) from exc
        try:
            n = os.write(fd, data)
            if n != len(data):
                raise SysfsError(str(p), "write", None, f"short write ({n} of {len(data)})")
        except OSError as exc:
            raise SysfsError(
                str(p), f"write {value.strip()!r} to", exc.errno, exc.strerror or str(exc)
            ) from exc
        finally:
            os.close(fd)
            note_write()  # after the write: a scan that began before it keeps nothing of it

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self._str(rel)))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self._str(rel))
        except OSError:
            return None

    def resolve(self, rel: str) -> str | None:
        """Resolve a link inside the tree; the answer is relative to the root again."""
        p = self.path(rel)
        try:
            real = p.resolve(strict=True)
        except OSError:
            return None
        try:
            return str(real.relative_to(self.root.resolve()))
        except ValueError:
            return None

    def block_names(self) -> Iterator[str]:
        yield from self.listdir("block")

    def disk_of_partition(self, name: str) -> str | None:
        """The whole disk partition ``name`` (``sdb1``, ``nvme0n1p1``) belongs to, or None
        when ``name`` is no partition here (a whole disk, or unknown)."""
        return next((d for d in self.block_names()
                     if self.exists(f"block/{d}/{name}/partition")), None)

    def block_name_of(self, node: str) -> str | None:
        """Kernel name (sdb, dm-1, sda1) of a device node, by its major:minor.

        Names alone are not enough: without udevd, dmsetup makes /dev/mapper/NAME a real
        node (not a link to dm-N), and by-id links may point anywhere. None if ``node`` is
        not a block device.
        """
        try:
            st = os.stat(node)
        except OSError:
            return None
        import stat as stat_mod

        if not stat_mod.S_ISBLK(st.st_mode):
            return None
        target = self.readlink(f"dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        return os.path.basename(target) if target else None
