"""The block layer's IO schedulers: ``queue/scheduler`` and ``queue/iosched/`` of a disk.

A request-based (blk-mq) disk lists its schedulers with the active one in brackets
(``none [mq-deadline] kyber``) and takes a new one by name; the active scheduler's tunables
are the files under ``queue/iosched/`` (none for ``none``). A bio-based device (bcacheN,
dm-N, md) has no scheduler of its own: its IO is scheduled on the disks under it. On 6.1 its
``queue/scheduler`` reads a bare ``none`` and silently accepts any write; on 7.2 the file is
not there at all. So a change is refused before the write for a bio-based device, and every
write is read back (docs/kernel-notes.md, "IO schedulers").
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from cachemgr.core.change import Change
from cachemgr.core.errors import AlreadyError, CacheMgrError, SysfsError, UsageError
from cachemgr.core.model import parse_bracketed
from cachemgr.core.sysfs import Sysfs

# the multi-queue schedulers of mainline (block/mq-deadline.c, bfq-iosched.c,
# kyber-iosched.c) and "none"
KNOWN = ("mq-deadline", "bfq", "kyber", "none")
# mq-deadline's elevator_alias: the kernel takes "deadline" and reads back "mq-deadline"
ALIASES = {"deadline": "mq-deadline"}
# the single-queue schedulers removed in 5.0, and what took their place
REMOVED = {"cfq": "bfq", "noop": "none", "as": "mq-deadline", "anticipatory": "mq-deadline"}
# an elevator name: ELV_NAME_MAX is 16 bytes with the NUL (include/linux/elevator.h)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,14}$")
# a kernel block device name: one path component
_DEV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$")


@dataclass(frozen=True)
class QueueScheduler:
    """One disk's scheduler as sysfs shows it. ``current`` is None for a bio-based device
    (no scheduler of its own: ``available`` is then empty)."""

    name: str  # the kernel name of the whole disk
    current: str | None
    available: tuple[str, ...] = ()
    tunables: tuple[tuple[str, int | str], ...] = ()  # queue/iosched/*, sorted by name

    @property
    def request_based(self) -> bool:
        return self.current is not None


def check_device_name(name: str) -> str:
    """A kernel device name from outside (a command line, a policy, an event) is data: one
    path component of printable characters, never ``.``/``..``; UsageError otherwise."""
    if not _DEV.match(name) or name in (".", ".."):
        raise UsageError(f"{name!r} is not a block device name",
                         hint="name a disk: /dev/sdb, sdb, /dev/nvme0n1 or a /dev/disk/by-id link")
    return name


def check_name(word: str) -> str:
    """A scheduler name as typed -> the kernel's name (``deadline`` -> ``mq-deadline``);
    UsageError for what cannot be one (nothing is written)."""
    w = word.strip().lower()
    if w in REMOVED:
        raise UsageError(f"{word!r} is a single-queue IO scheduler, removed from the kernel in "
                         f"5.0", hint=f"its multi-queue successor is {REMOVED[w]}; one of "
                                      f"{', '.join(KNOWN)}")
    w = ALIASES.get(w, w)
    if not _NAME.match(w):
        raise UsageError(f"{word!r} is not an IO scheduler name",
                         hint=f"one of {', '.join(KNOWN)}")
    return w


def parse(text: str | None) -> tuple[str | None, tuple[str, ...]]:
    """``none [mq-deadline] kyber`` -> (``mq-deadline``, every name). A missing file (7.2) or
    a list without brackets (6.1 prints a bare ``none``) is a bio-based queue: (None, ())."""
    if text is None or "[" not in text:
        return None, ()
    return parse_bracketed(text)


def _value(text: str) -> int | str:
    try:
        return int(text.strip())
    except ValueError:
        return text.strip()


def read(sysfs: Sysfs, name: str) -> QueueScheduler:
    """The scheduler of whole disk ``name`` (``block/<name>`` must exist) and the active
    scheduler's tunables."""
    check_device_name(name)
    if not sysfs.exists(f"block/{name}"):
        raise UsageError(f"no block device {name!r}")
    current, available = parse(sysfs.read_opt(f"block/{name}/queue/scheduler"))
    tun: list[tuple[str, int | str]] = []
    if current is not None:
        for f in sysfs.listdir(f"block/{name}/queue/iosched"):
            v = sysfs.read_opt(f"block/{name}/queue/iosched/{f}")
            if v is not None:
                tun.append((f, _value(v)))
    return QueueScheduler(name, current, available, tuple(tun))


def whole_disk(sysfs: Sysfs, name: str) -> tuple[str, str | None]:
    """(disk, partition): ``sdb1`` -> (``sdb``, ``sdb1``), ``sdb`` -> (``sdb``, None).
    UsageError when ``name`` is no block device here."""
    check_device_name(name)
    if sysfs.exists(f"block/{name}"):
        return name, None
    disk = sysfs.disk_of_partition(name)
    if disk is None:
        raise UsageError(f"no block device {name!r}",
                         hint="cachemgr scheduler lists the disks and their schedulers")
    return disk, name


def label(sysfs: Sysfs, name: str) -> str:
    """``dm-0 (vmcache)`` for a device-mapper device, the kernel name otherwise."""
    dm = sysfs.read_opt(f"block/{name}/dm/name") if name.startswith("dm-") else None
    return f"{name} ({dm.strip()})" if dm and dm.strip() else name


def _below(sysfs: Sysfs, name: str) -> list[str]:
    """The devices one level under ``name``: its slaves, partitions as their disks. A bcache
    device lists its backing device and its cache set's cache devices there (both kernels in
    the lab), a device-mapper device every device of its table."""
    return [s if sysfs.exists(f"block/{s}") else (sysfs.disk_of_partition(s) or s)
            for s in sysfs.listdir(f"block/{name}/slaves")]


def disks_under(sysfs: Sysfs, name: str) -> tuple[str, ...]:
    """The request-based whole disks a stacked (bio-based) device's IO ends up on, in
    order, each once: where a scheduler for it is set. ``()`` when there are none."""
    out: list[str] = []
    seen = {name}
    todo = _below(sysfs, name)
    while todo:
        d = todo.pop(0)
        if d in seen or not sysfs.exists(f"block/{d}"):
            continue
        seen.add(d)
        if parse(sysfs.read_opt(f"block/{d}/queue/scheduler"))[0] is not None:
            out.append(d)
        else:
            todo += _below(sysfs, d)
    return tuple(out)


def listed(sysfs: Sysfs) -> list[str]:
    """The block devices worth listing: every one with a size, but RAM disks."""
    return [n for n in sysfs.block_names()
            if not n.startswith(("ram", "zram")) and (sysfs.read_int(f"block/{n}/size") or 0) > 0]


def users(sysfs: Sysfs) -> dict[str, list[str]]:
    """Whole disk -> the bio-based devices (bcache, device-mapper) whose IO it carries."""
    out: dict[str, list[str]] = {}
    for n in listed(sysfs):
        if parse(sysfs.read_opt(f"block/{n}/queue/scheduler"))[0] is None:
            for d in disks_under(sysfs, n):
                out.setdefault(d, []).append(label(sysfs, n))
    return out


def set_scheduler(sysfs: Sysfs, name: str, word: str) -> Change:
    """Write ``word`` to whole disk ``name``'s ``queue/scheduler`` and read it back.

    AlreadyError when it is active; UsageError for a bio-based device (naming the disks
    under it) and for a name the kernel refuses (EINVAL: it has no such scheduler, built in
    or as a module; the message lists those it has). A scheduler built as a module is not
    listed until loaded; the write loads it (request_module), so an unlisted name is tried.
    """
    sched = check_name(word)
    q = read(sysfs, name)
    if q.current is None:
        under = disks_under(sysfs, name)
        raise UsageError(
            f"{label(sysfs, name)} is a bio-based device: it has no IO scheduler of its own",
            hint=(f"its IO is scheduled on {', '.join(under)}: set it there "
                  f"(cachemgr scheduler /dev/{under[0]} {sched})") if under else
            "set it on the disks under it")
    if q.current == sched:
        raise AlreadyError(f"/dev/{name}: the IO scheduler is already {sched}")
    rel = f"block/{name}/queue/scheduler"
    try:
        sysfs.write(rel, sched)
    except SysfsError as exc:
        if exc.errno == errno.EINVAL:
            raise UsageError(
                f"/dev/{name}: the kernel has no IO scheduler {sched!r} (built in, or as a "
                f"module it could load)",
                hint=f"available on /dev/{name}: {' '.join(q.available)}") from exc
        raise
    now = read(sysfs, name).current
    if now != sched:
        raise CacheMgrError(f"/dev/{name}: wrote scheduler {sched} but the kernel reports {now}")
    return Change(f"/dev/{name}", "scheduler", q.current, now)
