"""Is a block device used by something? One answer for every caller: holders (bcache and
device-mapper devices built on it), registered with bcache, mounted, swap; for the device and
each of its partitions.

The callers word it themselves: bcache and dm-cache refuse to format a busy device
(:func:`cachemgr.backends.bcache.in_use`), SCSI hotplug refuses to pull a used disk
(:func:`cachemgr.backends.scsi.in_use`), a capture keeps the loop devices something uses.
Mounts and swap come from /proc/self/mountinfo and /proc/swaps, read on the live system only
(:func:`proc_texts`); a mount is matched by device number, so any name of the device counts
(/dev/mapper/x, /dev/disk/by-uuid/...).

Not here: whether anyone has the device *open* (a VM's qemu opens it without a claim); only
device-mapper counts that (``dmsetup info``, :func:`cachemgr.backends.dmcache.in_use_reason`).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Literal, TypeGuard

from cachemgr.core.errors import KernelFormatError
from cachemgr.core.sysfs import Sysfs

PROC_MOUNTINFO = "/proc/self/mountinfo"
PROC_SWAPS = "/proc/swaps"


@dataclass(frozen=True)
class Mount:
    devno: str  # "8:1"
    mount_point: str
    fs_type: str
    source: str


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(text: str) -> str:
    """/proc escapes space, tab, newline and backslash in paths as ``\\040`` etc."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    """``/proc/self/mountinfo`` (proc_pid_mountinfo(5)). Sample line::

        36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue

    mount id, parent id, major:minor, root, mount point, options, optional fields, ``-``,
    fs type, source, super options. KernelFormatError for a line without that shape.
    """
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(" ")
        try:
            sep = f.index("-", 6)
        except ValueError:
            raise KernelFormatError("mountinfo line", line) from None
        if len(f) < sep + 3 or ":" not in f[2]:
            raise KernelFormatError("mountinfo line", line)
        out.append(Mount(devno=f[2], mount_point=_unescape(f[4]), fs_type=f[sep + 1],
                         source=_unescape(f[sep + 2])))
    return tuple(out)


def parse_swaps(text: str) -> tuple[str, ...]:
    """The swap areas' paths from ``/proc/swaps``. Sample::

        Filename				Type		Size		Used		Priority
        /dev/sdb2                               partition	1048572		0		-2
    """
    out = []
    for line in text.splitlines()[1:]:
        if line.strip():
            out.append(_unescape(line.split()[0]))
    return tuple(out)


def _read_proc(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def proc_texts(sysfs: Sysfs) -> tuple[str | None, str | None]:
    """/proc/self/mountinfo and /proc/swaps on the live system; (None, None) on a capture
    (its host's mounts say nothing about the captured devices)."""
    if not sysfs.live:
        return None, None
    return _read_proc(PROC_MOUNTINFO), _read_proc(PROC_SWAPS)


@dataclass(frozen=True)
class Use:
    """One thing that uses the device or one of its partitions (``member``)."""

    member: str  # kernel name: the device itself or a partition of it
    rel: str  # the member's sysfs directory
    partition: bool  # member is a partition of the device asked about
    kind: Literal["held", "bcache", "mounted", "swap"]
    by: str = ""  # held: the holder's kernel name; mounted: the mount point; swap: the path
    detail: str = ""  # held: the holder's dm name, if any; mounted: the file system type


def uses(sysfs: Sysfs, rel: str, *, mountinfo: str | None,
         swaps: str | None) -> tuple[Use, ...]:
    """What uses the block device at sysfs directory ``rel`` (``block/sda``, or a partition's
    directory) or one of its partitions; empty when nothing does. ``mountinfo`` and
    ``swaps``: the texts of /proc/self/mountinfo and /proc/swaps, None to skip them.

    Order: per member (the device first, then its partitions) its holders and its bcache
    registration, then the mounts, then swap.
    """
    name = os.path.basename(rel.rstrip("/"))
    members = [(name, rel, False)] + [
        (c, f"{rel}/{c}", True) for c in sysfs.listdir(rel)
        if sysfs.exists(f"{rel}/{c}/partition")]
    out: list[Use] = []
    devnos: dict[str, tuple[str, str, bool]] = {}
    by_name = {m[0]: m for m in members}
    for m, mrel, part in members:
        devno = (sysfs.read_opt(f"{mrel}/dev") or "").strip()
        if devno:
            devnos[devno] = (m, mrel, part)
        for holder in sysfs.listdir(f"{mrel}/holders"):
            dm = (sysfs.read_opt(f"block/{holder}/dm/name") or "").strip()
            out.append(Use(m, mrel, part, "held", holder, dm))
        if sysfs.is_dir(f"{mrel}/bcache"):
            out.append(Use(m, mrel, part, "bcache"))
    if mountinfo:
        for mnt in parse_mountinfo(mountinfo):
            src = os.path.basename(mnt.source) if mnt.source.startswith("/dev/") else None
            hit = devnos.get(mnt.devno) or by_name.get(src or "")
            if hit:
                out.append(Use(*hit, "mounted", mnt.mount_point, mnt.fs_type))
    if swaps:
        for path in parse_swaps(swaps):
            hit = by_name.get(os.path.basename(path))
            if hit:
                out.append(Use(*hit, "swap", path))
    return tuple(dict.fromkeys(out))


def _given(text: object) -> TypeGuard[str | None]:
    return text is None or isinstance(text, str)


def texts(sysfs: Sysfs, mountinfo: object, swaps: object) -> tuple[str | None, str | None]:
    """The /proc texts to use: each given text (or None: skip) as it is; the AUTO sentinel
    (anything else) becomes the live text (:func:`proc_texts`)."""
    live = (None, None) if _given(mountinfo) and _given(swaps) else proc_texts(sysfs)
    return (mountinfo if _given(mountinfo) else live[0], swaps if _given(swaps) else live[1])


def reasons(sysfs: Sysfs, rel: str, mountinfo: str | None,
            swaps: str | None) -> tuple[str, ...]:
    """:func:`uses` in words, each once: why the device at ``rel`` may not be pulled or
    overwritten; empty when nothing uses it."""
    return reasons_of(sysfs, uses(sysfs, rel, mountinfo=mountinfo, swaps=swaps))


def reasons_of(sysfs: Sysfs, found: tuple[Use, ...]) -> tuple[str, ...]:
    """Each :class:`Use` of ``found`` in words, in order, each once."""
    out = []
    for u in found:
        if u.kind == "held":
            out.append(f"/dev/{u.member} is held by {u.by}"
                       + (f" (/dev/mapper/{u.detail})" if u.detail else ""))
        elif u.kind == "bcache":
            out.append(_bcache_role(sysfs, u.member, f"{u.rel}/bcache"))
        elif u.kind == "mounted":
            # "/" said in words: "mounted on / (ext4)" is easily read past
            root = ", the root file system" if u.by == "/" else ""
            out.append(f"/dev/{u.member} is mounted on {u.by} ({u.detail}){root}")
        else:
            out.append(f"{u.by} is in use as swap")
    return tuple(dict.fromkeys(out))


def _bcache_role(sysfs: Sysfs, member: str, b: str) -> str:
    cset = sysfs.readlink(f"{b}/set")
    if cset:
        return (f"/dev/{member} is the cache device of bcache cache set "
                f"{os.path.basename(cset.rstrip('/'))}")
    if sysfs.exists(f"{b}/cache_mode"):
        dev = sysfs.readlink(f"{b}/dev")
        where = f" of /dev/{os.path.basename(dev.rstrip('/'))}" if dev else ""
        return f"/dev/{member} is a registered bcache backing device{where}"
    return f"/dev/{member} is registered with bcache"


def node_ready(node: str) -> bool:
    """Is ``node`` a block device now (udev or devtmpfs made it)?"""
    try:
        return stat.S_ISBLK(os.stat(node).st_mode)
    except OSError:
        return False
