"""util-linux ``fsfreeze``: the one wrapper (freeze, thaw, a guard that thaws when its owner
dies), and which device a mountpoint is on (``/proc/self/mountinfo``).

``fsfreeze -f MOUNTPOINT`` (the FIFREEZE ioctl) syncs the filesystem and blocks every new
write to it until ``fsfreeze -u`` (FITHAW); a frozen ext4 has its journal flushed, so a copy
of its block device taken while frozen is a clean filesystem (fsfreeze(8)). Thawing a
filesystem that is not frozen fails with EINVAL, which fsfreeze prints as ``unfreeze failed:
Invalid argument`` (seen on the lab kernel, 7.2, util-linux 2.38): :func:`thaw` reads that as
"already thawed".

A frozen filesystem stays frozen when the process that froze it dies: every writer on it
(the VMs) hangs until someone thaws it. :class:`Guard` is a small process started before the
freeze that holds a pipe from its owner: when the owner ends without saying the filesystem
was thawed (SIGKILL, a crash), the pipe closes and the guard thaws it at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError, CommandError, UsageError

FREEZE_TIMEOUT = 120.0  # fsfreeze -f first writes the filesystem's dirty pages out


def check_mountpoint(path: str) -> str:
    """An absolute, normalised path as an argv word (never an option)."""
    if not path.startswith("/") or "\n" in path or "\0" in path:
        raise UsageError(f"{path!r} is not an absolute path of a mountpoint")
    return os.path.normpath(path)


def freeze(mountpoint: str, *, timeout: float = FREEZE_TIMEOUT) -> None:
    runner.run(["fsfreeze", "--freeze", check_mountpoint(mountpoint)], timeout=timeout)


def thaw(mountpoint: str) -> bool:
    """Thaw; False when it was not frozen (EINVAL: nothing changed)."""
    try:
        runner.run(["fsfreeze", "--unfreeze", check_mountpoint(mountpoint)], timeout=60)
    except CommandError as exc:
        if "Invalid argument" in exc.stderr:
            return False
        raise
    return True


# The guard's program: it waits for its owner's word on stdin; anything but "thawed"
# (EOF: the owner died) thaws the mountpoint (argv[1]) with fsfreeze.
_GUARD = (
    "import subprocess, sys\n"
    "said = sys.stdin.read()\n"
    "if said != 'thawed':\n"
    "    subprocess.run(['fsfreeze', '--unfreeze', sys.argv[1]], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={'LC_ALL': 'C', "
    "'PATH': '/usr/sbin:/usr/bin:/sbin:/bin'}, timeout=120)\n"
)


class Guard:
    """Thaws ``mountpoint`` if this process ends before :meth:`release` (a process of its
    own session: a Ctrl-C or SIGTERM sent to the command's process group does not reach it)."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = check_mountpoint(mountpoint)
        try:
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                [sys.executable, "-I", "-c", _GUARD, self.mountpoint], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True, close_fds=True)
        except OSError as exc:
            raise CacheMgrError(f"{self.mountpoint}: cannot start the guard that thaws it "
                                f"should cachemgr die while it is frozen ({exc}); nothing "
                                "was frozen") from exc

    def release(self) -> None:
        """The filesystem is thawed (or was never frozen): the guard ends doing nothing."""
        p, self.proc = self.proc, None
        if p is None or p.stdin is None:
            return
        try:
            p.stdin.write("thawed")
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    dev: str  # "MAJOR:MINOR" of the device it is on
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (proc(5))
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """``/proc/self/mountinfo`` lines (proc(5)), e.g.
    ``36 35 254:0 / /mnt/vms rw,relatime shared:1 - ext4 /dev/bcache0 rw``."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if not sep or len(f) < 5 or len(r) < 2:
            continue
        out.append(Mount(_unescape(f[4]), f[2], r[0], _unescape(r[1])))
    return out


def mount_at(mountpoint: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> Mount | None:
    """What is mounted at ``mountpoint`` (the last mount there wins), None when nothing."""
    mp = check_mountpoint(mountpoint)
    try:
        text = mountinfo.read_text()
    except OSError as exc:
        raise CacheMgrError(f"cannot read {mountinfo}: {exc}") from exc
    found = [m for m in parse_mountinfo(text) if m.mountpoint == mp]
    return found[-1] if found else None
