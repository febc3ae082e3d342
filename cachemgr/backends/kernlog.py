"""The IO errors the block layer logged for each disk (the kernel log, ``/dev/kmsg``).

Why the kernel log and not a counter: a SCSI disk's ``device/ioerr_cnt`` counts every
command that completed with an error, smartctl's own probing included (seen in the lab,
7.2: +2 for one ``smartctl -a`` of a scsi_debug disk, no read failing), so a count read
once says nothing about the data; NVMe, virtio and UML's ubd disks have no such counter at
all. The block layer prints one line for each failed request of a file system or a device
above it (block/blk-mq.c ``blk_print_req_error``, rate limited), and none for a passthrough
command (smartctl's SG_IO/NVMe admin commands: ``blk_rq_is_passthrough``), whatever the
driver: ``critical medium error, dev sda, sector 512 op 0x0:(READ) flags 0x800 ...``
(lab, 7.2: one per failed 64 KiB read of a dm-cache over a scsi_debug disk failing reads;
none for smartctl's probing), ``I/O error, dev sdb, sector 2048 op 0x1:(WRITE) ...``;
kernels before 5.18 prefix it with ``blk_update_request:``, before 5.0 without ``op``.
docs/kernel-notes.md, "The kernel log's IO errors".

What this gives: for each disk, how many such lines the log holds in the last
:data:`RECENT` seconds, their operations and the latest; the log is a ring (a flood of other
messages pushes old lines out) and rate limited (10 lines in 5 s), so a count is a lower
bound, and an SSD still failing logs again at the next failed read.

Reading ``/dev/kmsg`` needs CAP_SYSLOG where ``kernel.dmesg_restrict`` is 1 (Debian's
default): without it :meth:`Reader.read` says why and gives nothing. A captured tree's log
is the ``kmsg.txt`` file beside its ``sys/`` (each /dev/kmsg record's first line), if any,
read at the capture's ``uptime`` (meta.json).
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cachemgr.core.model import LoggedErrors
from cachemgr.core.sysfs import Sysfs

RECENT = 3600.0  # seconds: an error logged longer ago than this no longer counts

# "critical medium error, dev sda, sector 512 op 0x0:(READ) flags 0x800 phys_seg 16 ...";
# "blk_update_request: I/O error, dev sdb, sector 2048 op 0x1:(WRITE) ..." (before 5.18);
# "print_req_error: I/O error, dev sdb, sector 2048" (4.17-4.20). Never "Buffer I/O error on
# dev sda1, logical block 0" (the file system's echo of the same failure).
_LINE = re.compile(r"(?:^|: )(?P<what>[A-Za-z/ ]+?) error, dev (?P<dev>[^\s,]+), "
                   r"sector (?P<sector>\d+)(?: op 0x[0-9a-f]+:\((?P<op>[A-Z_]+)\))?")


@dataclass(frozen=True)
class Logged:
    """One failed request as the block layer logged it."""

    at: float  # seconds since boot (the log's clock)
    disk: str  # kernel name: sda, nvme0n1
    what: str  # "I/O", "critical medium", "timeout", ...
    op: str | None  # READ, WRITE, FLUSH, DISCARD, ... (None: an old kernel's line)
    line: str
    seq: int | None = None  # the /dev/kmsg record's sequence number (None: a bare message)


def parse(at: float, message: str) -> Logged | None:
    """A log message as a failed request, or None when it is another message."""
    m = _LINE.search(message)
    if m is None:
        return None
    return Logged(at, m["dev"], m["what"].strip(), m["op"], message.strip())


# "blk_print_req_error: 20 callbacks suppressed" (lab, 7.2.7): printk_ratelimited's notice,
# printed before the first line let through once its 5 s interval is over, of the lines it
# dropped (10 a 5 s interval, every disk together: include/linux/ratelimit_types.h
# DEFAULT_RATELIMIT_BURST/INTERVAL); "blk_update_request: ..." and "print_req_error: ..."
# on older kernels. It names no disk.
_SUPPRESSED = re.compile(r"^(?:blk_print_req_error|print_req_error|blk_update_request): "
                         r"(?P<n>\d+) callbacks suppressed")
BURST, INTERVAL = 10, 5.0  # the rate limit of the failed-request lines


def _head(record: str) -> tuple[int, float, str] | None:
    """(sequence number, seconds since boot, first message line) of a /dev/kmsg record
    (``PRI,SEQ,TS_USEC,FLAGS;MESSAGE`` then `` KEY=VALUE`` lines:
    Documentation/ABI/testing/dev-kmsg), or None when it is not one."""
    head, sep, rest = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        return int(fields[1]), int(fields[2]) / 1e6, rest.split("\n", 1)[0]
    except ValueError:
        return None


def parse_record(record: str) -> Logged | None:
    """One /dev/kmsg record as a failed request, or None."""
    got = _head(record)
    if got is None:
        return None
    seq, at, message = got
    x = parse(at, message)
    return None if x is None else Logged(x.at, x.disk, x.what, x.op, x.line, seq)


class Reader:
    """The block layer's failed requests in the kernel log, read once and then only what is
    new (a poller keeps one: the TUI, ``status --watch``). ``why_not``: why the log could not
    be read (None: it was)."""

    def __init__(self, sysfs: Sysfs) -> None:
        self.sysfs = sysfs
        self.why_not: str | None = None
        self._seen: list[Logged] = []
        self._fd: int | None = None
        self._done = False  # a captured log: read once
        self.now = 0.0  # the last read's ``now``
        # what a counter's reader needs to know of the records read so far: the sequence
        # numbers of the oldest and the newest, whether some were overwritten before they
        # were read (the ring is full), and the rate limit's notices (seq, time, lines
        # dropped): ops/protect.py, which tells failed requests from probes by them
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.lost = False
        self.suppressed: list[tuple[int, float, int]] = []

    def _records(self) -> Iterator[str]:
        if not self.sysfs.live:
            if self._done:
                return
            self._done = True
            try:
                text = (self.sysfs.root.parent / "kmsg.txt").read_text(errors="replace")
            except OSError:
                return
            yield from (line for line in text.splitlines() if line)
            return
        if self._fd is None:
            try:
                self._fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self.why_not = f"the kernel log (/dev/kmsg) not read: {exc.strerror}"
                return
        for rec in _read_fd(self._fd, self):
            if isinstance(rec, OSError):
                self.why_not = f"the kernel log (/dev/kmsg) not read: {rec.strerror}"
                return
            yield rec

    def _parse(self, record: str) -> Logged | None:
        got = _head(record)
        if got is None:
            return None
        seq, at, message = got
        if self.first_seq is None or seq < self.first_seq:
            self.first_seq = seq
        if self.last_seq is None or seq > self.last_seq:
            self.last_seq = seq
        m = _SUPPRESSED.match(message)
        if m is not None:
            self.suppressed.append((seq, at, int(m["n"])))
            return None
        x = parse(at, message)
        return None if x is None else Logged(x.at, x.disk, x.what, x.op, x.line, seq)

    def _captured_now(self) -> float:
        try:
            meta = json.loads((self.sysfs.root.parent / "meta.json").read_text())
            return float(meta["uptime"])
        except (OSError, ValueError, KeyError, TypeError):
            return max((x.at for x in self._seen), default=0.0)

    def read(self, now: float | None = None) -> list[Logged]:
        """The failed requests logged in the last :data:`RECENT` seconds before ``now``
        (seconds since boot; default: CLOCK_MONOTONIC, the log's clock)."""
        self._seen += [x for x in map(self._parse, self._records()) if x is not None]
        if now is None:
            now = (time.clock_gettime(time.CLOCK_MONOTONIC) if self.sysfs.live
                   else self._captured_now())
        self.now = now
        self._seen = [x for x in self._seen if now - x.at <= RECENT]
        return list(self._seen)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_fd(fd: int, reader: Reader | None = None) -> Iterator[str | OSError]:
    """The records of an open /dev/kmsg until none is left (an OSError: why it stopped)."""
    while True:
        try:
            raw = os.read(fd, 8192)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # a record overwritten before it was read
                if reader is not None:
                    reader.lost = True
                continue
            yield exc
            return
        if not raw:
            return
        yield raw.decode("utf-8", "replace")


def boot_id(sysfs: Sysfs) -> str | None:
    """This boot's ID (a record's sequence number counts from 0 again at each boot), None
    for a captured tree or when it cannot be read."""
    if not sysfs.live:
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def records() -> list[str]:
    """Every record /dev/kmsg holds now (the capture's; empty when it cannot be read)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return [r for r in _read_fd(fd) if isinstance(r, str)]
    finally:
        os.close(fd)


def disks_under(sysfs: Sysfs, name: str) -> list[str]:
    """The whole disks under block device ``name`` (kernel name): itself if it is one, the
    disk of a partition, the disks under a device-mapper or md device (``slaves/``, down
    to the bottom)."""
    out: list[str] = []
    todo, seen = [name], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        slaves = sysfs.listdir(f"block/{n}/slaves") if sysfs.is_dir(f"block/{n}") else []
        if slaves:
            todo += slaves
            continue
        disk = sysfs.disk_of_partition(n) or n
        if disk not in out:
            out.append(disk)
    return out


def summarise(logged: Iterable[Logged], disks: Iterable[str], now: float) -> list[LoggedErrors]:
    """Per disk of ``disks`` (kernel names) that has any: its logged failed requests."""
    by: dict[str, list[Logged]] = {}
    wanted = set(disks)
    for x in logged:
        if x.disk in wanted:
            by.setdefault(x.disk, []).append(x)
    out = []
    for disk, xs in by.items():
        last = max(xs, key=lambda x: x.at)
        ops = tuple(sorted({x.op or "?" for x in xs}))
        out.append(LoggedErrors(disk=f"/dev/{disk}", count=len(xs), ops=ops,
                                latest_age=max(0.0, now - last.at), latest=last.line))
    return out


def failing(sysfs: Sysfs, cache: str | None, origin: str | None) -> tuple[str, str]:
    """What the kernel log says of a cache's two sides (kernel names: the cache device and
    the origin or backing device, each followed down to its disks): (the cache side's
    failed requests in words, the origin side's), each "" when it logged none."""
    reader = Reader(sysfs)
    try:
        logged = reader.read()
    finally:
        reader.close()

    def words(name: str | None) -> str:
        if not name or not logged:
            return ""
        return "; ".join(e.words() for e in summarise(logged, disks_under(sysfs, name),
                                                      reader.now))

    return words(cache), words(origin)


def stall_hint(sysfs: Sysfs, cache: str | None, origin: str | None, default: str) -> str:
    """A stalled flush's next step, naming the disk the kernel log says fails (``default``
    when it names neither): a cache SSD that fails reads holds dirty blocks that cannot be
    written back, and the origin is then not the disk to repair."""
    on_cache, on_origin = failing(sysfs, cache, origin)
    if on_cache and not on_origin:
        return (f"its cache device /dev/{cache} fails ({on_cache}): the dirty blocks it "
                "cannot read stay on it; keep it, do not wipe it, and replace it once the "
                "rest is written back (cachemgr replace-ssd)")
    if on_origin and not on_cache:
        return f"its origin /dev/{origin} fails ({on_origin}): repair it, then drain again"
    if on_cache and on_origin:
        return (f"both sides fail: cache /dev/{cache} ({on_cache}), origin /dev/{origin} "
                f"({on_origin})")
    return default
