"""blktrace, the one wrapper: start it on block devices, read its binary event stream.

``blktrace -d DEV... -a queue -o -`` (Debian's blktrace package) sets up the kernel's block
trace on each device (ioctl BLKTRACESETUP; needs debugfs at /sys/kernel/debug and a kernel
with CONFIG_BLK_DEV_IO_TRACE) and writes every event, of every CPU and device, to stdout as
``struct blk_io_trace`` (include/uapi/linux/blktrace_api.h: 48 bytes, native byte order,
followed by ``pdu_len`` bytes of payload). ``-a queue`` keeps the Q events only: one per bio
as it is submitted to the device, before merging or splitting, which is what a cache in
front of the device would see. Events of two CPUs arrive in per-CPU batches, so the stream is
ordered per CPU, not overall (docs/kernel-notes.md, "Block traces").

Stopping: SIGINT makes blktrace stop the kernel trace, flush what it holds and exit 0.
"""

from __future__ import annotations

import os
import platform
import select
import signal
import struct
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from cachemgr.backends.identity import AUTO, ProcText
from cachemgr.core.errors import (
    CacheMgrError,
    CommandError,
    CommandNotFound,
    UnsafeError,
    UsageError,
)
from cachemgr.core.runner import command_env
from cachemgr.core.sysfs import Sysfs

EVENT = struct.Struct("<IIQQIIIIIHH")  # magic seq time sector bytes action pid device cpu err pdu
MAGIC = 0x65617400
VERSION = 0x07
# action: the low 16 bits are the event (__BLK_TA_*), the high 16 bits its categories
TA_QUEUE = 1
TC_SHIFT = 16
TC_READ = 1 << 0
TC_WRITE = 1 << 1
TC_NOTIFY = 1 << 10
TC_DISCARD = 1 << 13

OP_READ, OP_WRITE, OP_DISCARD = 0, 1, 2


@dataclass(frozen=True)
class Event:
    time_ns: int  # the kernel's clock, since some start
    sector: int  # 512-byte sectors from the start of the traced device
    nbytes: int
    op: int  # OP_READ, OP_WRITE, OP_DISCARD
    devno: tuple[int, int]  # major, minor of the traced device


def devno(raw: int) -> tuple[int, int]:
    """The kernel's internal dev_t (MINORBITS 20) as (major, minor)."""
    return raw >> 20, raw & 0xFFFFF


class Parser:
    """Turns chunks of blktrace's output into Q events (other events are skipped)."""

    def __init__(self) -> None:
        self.buf = b""
        self.skipped = 0  # notify and other non-Q events
        self.bad_magic = 0

    def feed(self, chunk: bytes) -> Iterator[Event]:
        """The Q events in ``chunk`` (with what was left of the previous one)."""
        for t, sector, nbytes, op, dev in self.feed_raw(chunk):
            yield Event(t, sector, nbytes, op, devno(dev))

    def feed_raw(self, chunk: bytes) -> Iterator[tuple[int, int, int, int, int]]:
        """As feed(), as plain tuples (time_ns, sector, nbytes, op, raw dev_t): the recorder's
        loop, where building an object per event was a quarter of its CPU."""
        buf = self.buf + chunk if self.buf else chunk
        n = len(buf)
        off = 0
        unpack = EVENT.unpack_from
        size = EVENT.size
        while off + size <= n:
            magic, _seq, t, sector, nbytes, action, _pid, dev, _cpu, _err, pdu = unpack(buf, off)
            if magic & 0xFFFFFF00 != MAGIC:
                # out of step: not something to guess at; count and resynchronise on the
                # next magic, so one bad record does not eat the rest of the stream
                self.bad_magic += 1
                nxt = buf.find(struct.pack("<I", MAGIC | VERSION), off + 1)
                if nxt < 0:
                    off = max(off, n - size)
                    break
                off = nxt
                continue
            if off + size + pdu > n:
                break
            off += size + pdu
            cat = action >> TC_SHIFT
            if action & 0xFFFF != TA_QUEUE or cat & TC_NOTIFY or nbytes == 0:
                self.skipped += 1
                continue
            op = OP_DISCARD if cat & TC_DISCARD else OP_WRITE if cat & TC_WRITE else OP_READ
            yield t, sector, nbytes, op, dev
        self.buf = buf[off:]


PROC_FILESYSTEMS = "/proc/filesystems"
# the qemu lab runs Debian's own kernel, which can trace: what to run there instead
QEMU_LAB_TRACE = ("cachemgr lab run --backend qemu --disks 1G -- cachemgr trace /dev/vda "
                  "--seconds 30 -o t.trace")


def _filesystems(sysfs: Sysfs, text: ProcText) -> str | None:
    if text is AUTO:
        if not sysfs.live:
            return None
        try:
            with open(PROC_FILESYSTEMS) as f:
                return f.read()
        except OSError:
            return None
    return text


def kernel_has_debugfs(filesystems: str | None) -> bool | None:
    """Whether the kernel knows debugfs, from /proc/filesystems (``nodev\tdebugfs``);
    None when that text is unknown."""
    if filesystems is None:
        return None
    return any(line.split()[-1:] == ["debugfs"] for line in filesystems.splitlines())


def no_debugfs_hint(env: Mapping[str, str] | None = None) -> str:
    """What does work on a kernel without debugfs (so without block tracing): in the UML lab,
    the qemu lab (Debian's kernel); elsewhere, a kernel built with both."""
    env = os.environ if env is None else env
    if env.get("CACHEMGR_IN_LAB") == "1" and env.get("LAB_BACKEND") == "uml":
        return ("the UML lab kernel is built without debugfs and block tracing; record in "
                f"the qemu lab, on Debian's kernel: {QEMU_LAB_TRACE}")
    return ("boot a kernel built with CONFIG_DEBUG_FS and CONFIG_BLK_DEV_IO_TRACE (Debian's "
            "own kernels have both)")


def preflight(sysfs: Sysfs, names: Sequence[str], *, filesystems: ProcText = AUTO,
              env: Mapping[str, str] | None = None) -> None:
    """Refuse what blktrace cannot do or must not be asked: a kernel without debugfs (the
    UML lab's: no hint to mount what it does not have, but where tracing works), debugfs not
    mounted (the kernel's trace files live there), or a device whose trace is already set up
    (its ``trace0`` relay file exists). A second blktrace on a traced device did not fail in
    the lab: it hung in the kernel, with the guest's shell unable to kill it
    (docs/kernel-notes.md, "Block traces"); so cachemgr never starts one.

    ``filesystems``: the text of /proc/filesystems (AUTO: read on the live system);
    ``env``: the environment that says whether this is the UML lab (default: os.environ)."""
    if not sysfs.is_dir("kernel/debug/block"):
        if kernel_has_debugfs(_filesystems(sysfs, filesystems)) is False:
            raise UsageError(f"this kernel ({platform.release()}) has no debugfs, so no block "
                             "tracing: cachemgr trace cannot record here",
                             hint=no_debugfs_hint(env))
        raise UsageError("debugfs is not mounted (block traces are read from it)",
                         hint="mount -t debugfs none /sys/kernel/debug")
    busy = [n for n in names if sysfs.exists(f"kernel/debug/block/{n}/trace0")]
    if busy:
        raise UnsafeError(
            f"a block trace is already running on {', '.join(busy)} (another cachemgr trace "
            "or blktrace); a second one can hang in the kernel",
            hint="wait for it to end, or stop it (Ctrl-C in its terminal)")


class Blktrace:
    """A running ``blktrace -a queue -o -`` on ``devices`` (device nodes); see preflight()."""

    def __init__(self, devices: Sequence[str], *, buffer_kib: int = 512, buffers: int = 8):
        self.argv = ["blktrace", "-a", "queue", "-o", "-", "-b", str(buffer_kib),
                     "-n", str(buffers)]
        for d in devices:
            self.argv += ["-d", d]
        try:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=command_env(),
                                         stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise CommandNotFound(self.argv) from None
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()

    def read(self, size: int = 1 << 20, timeout: float = 0.5) -> bytes | None:
        """Up to ``size`` bytes of the stream; b"" at its end; None when nothing came within
        ``timeout`` seconds (so a caller keeps its own deadlines)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, size) if ready else None

    def stop(self) -> None:
        """Ask blktrace to stop (it flushes and exits); read on until b""."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def finish(self, timeout: float = 30) -> None:
        """Wait for the exit; a failure becomes an error saying why."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        assert self.proc.stderr is not None
        err = self.proc.stderr.read().decode(errors="replace")
        self.proc.stdout and self.proc.stdout.close()
        self.proc.stderr.close()
        if rc not in (0, -signal.SIGINT):
            raise explain(self.argv, rc, err)


def explain(argv: Sequence[str], rc: int, stderr: str) -> CacheMgrError:
    """blktrace's failure as an error with the likely cause."""
    e = CommandError(argv, rc, stderr)
    if "debug" in stderr.lower() and ("invalid" in stderr.lower() or "mount" in stderr.lower()):
        e.hint = "mount debugfs first: mount -t debugfs none /sys/kernel/debug"
    elif "busy" in stderr.lower():
        e.hint = ("a block trace is already running on the device (another blktrace or "
                  "cachemgr trace); only one can run per device")
    elif "inappropriate ioctl" in stderr.lower() or "not supported" in stderr.lower():
        e.hint = "this kernel was built without block tracing (CONFIG_BLK_DEV_IO_TRACE)"
    return e
