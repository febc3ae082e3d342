"""bcache superblocks on disk: ``bcache-super-show`` parsing and unregistered devices.

After a cache SSD fails, bcache stops and unregisters the backing devices that held dirty data
(lab, 7.2: "stop_when_cache_set_failed of bcache0 is "auto" and cache is dirty, stop it"):
they vanish from /sys/fs/bcache and /sys/block/*/bcache, and only their superblock still says
what happened. This module finds such devices so the snapshot can show them as themselves.

``bcache-super-show`` output (bcache-tools 1.0.8), one ``key<TAB>value`` per line::

    sb.version		1 [backing device]
    dev.uuid		9b2f97fb-1c07-4116-a277-a86507db2152
    dev.data.cache_mode	1 [writeback]
    dev.data.cache_state	2 [dirty]
    cset.uuid		9e848dfd-7f9b-4ec5-afe8-2c02ac8b2e3e

(a cache device has ``sb.version 0 [cache device]`` or ``3 [cache device]``).
"""

from __future__ import annotations

import errno
import logging
import os
import re

from cachemgr.backends import bcache, identity
from cachemgr.core import runner
from cachemgr.core.errors import CommandError, KernelFormatError, UnsafeError
from cachemgr.core.model import Snapshot, UnregisteredBcache
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

_BRACKET = re.compile(r"\[([^\]]+)\]")


# the cset.uuid of a backing device attached to no cache set: bcache's "no cache set"
NO_CACHE_SET = "00000000-0000-0000-0000-000000000000"


def parse_super_show(text: str) -> dict[str, str]:
    """``key -> value`` of bcache-super-show's output; bracketed words replace codes. A
    ``cset.uuid`` of all zeros (a backing device detached from its set, or never attached)
    means no cache set: it is left out, as for a superblock that names none."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or "." not in parts[0]:
            raise KernelFormatError("bcache-super-show line", line)
        key, value = parts[0], parts[1].strip()
        m = _BRACKET.search(value)
        out[key] = m.group(1) if m and key != "sb.first_sector" else value
    if out.get("cset.uuid", "").lower() == NO_CACHE_SET:
        del out["cset.uuid"]
    return out


def super_show(node: str) -> dict[str, str] | None:
    try:
        r = runner.run(["bcache-super-show", node], timeout=30, check=False)
    except CommandError:
        return None
    if r.returncode != 0:
        return None
    try:
        return parse_super_show(r.stdout)
    except KernelFormatError as exc:
        log.warning("%s: %s", node, exc)
        return None


def _unclaimed(sysfs: Sysfs) -> list[tuple[str, str]]:
    """Block devices nothing holds that bcache has not registered: where a backing device
    that bcache stopped (or never registered) would be."""
    out = []
    for name, rel in sorted(bcache.block_dirs(sysfs).items()):
        if name.startswith(("bcache", "loop", "ram", "zram")) or sysfs.is_dir(f"{rel}/bcache"):
            continue
        if (sysfs.read_int(f"{rel}/size") or 0) == 0 or sysfs.listdir(f"{rel}/holders"):
            continue
        # a suspended dm device blocks every read until it is resumed: probing one during a
        # table switch (ours or LVM's) hung `cachemgr status` in the lab
        if (sysfs.read_opt(f"{rel}/dm/suspended") or "0").strip() == "1":
            continue
        out.append((name, rel))
    return out


def not_probed(sysfs: Sysfs) -> tuple[str, ...]:
    """Unclaimed block devices this process may not open (not root, not in their group), of
    which udevd has not said that they carry no bcache superblock: where a backing device
    bcache stopped while dirty could be, unseen (:func:`scan_unregistered` probes the others).
    udevd's probe (its blkid builtin, and bcache-tools' probe-bcache rule) records
    ``ID_FS_TYPE`` in its database, which every user may read (/run/udev/data); a device udev
    initialized without ``ID_FS_TYPE=bcache`` has no bcache superblock that udev saw. Live
    only; opens nothing."""
    if not sysfs.live:
        return ()
    out = []
    for name, rel in _unclaimed(sysfs):
        node = f"/dev/{name}"
        if os.access(node, os.R_OK) or not os.path.exists(node):
            continue
        info = identity.udev_info(name)
        if info is not None and info.fs_type != "bcache":
            continue
        dm_name = (sysfs.read_opt(f"{rel}/dm/name") or "").strip()
        out.append(f"/dev/mapper/{dm_name}" if dm_name else node)
    return tuple(out)


def unreadable(sysfs: Sysfs) -> tuple[str, ...]:
    """Unclaimed block devices whose bcache superblock (4 KiB at 4 KiB) cannot be read (EIO):
    a dead disk may be a backing device that bcache stopped while dirty, and nothing on the
    host says whether it was (the kernel keeps no per-device dirty count once it is stopped;
    priority_stats rounds 1 MiB of dirt on a 512 MiB SSD to 0 %, seen in the lab). Live only;
    reads a few KiB of each device, so only explicit commands call it, never a poll."""
    if not sysfs.live:
        return ()
    bad = []
    for name, rel in _unclaimed(sysfs):
        try:
            fd = os.open(f"/dev/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # no medium, no node: nothing a bcache set could have written to
        try:
            os.pread(fd, 4096, 4096)
        except OSError as exc:
            if exc.errno == errno.EIO:
                dm_name = (sysfs.read_opt(f"{rel}/dm/name") or "").strip()
                bad.append(f"/dev/mapper/{dm_name}" if dm_name else f"/dev/{name}")
        finally:
            os.close(fd)
    return tuple(bad)


def scan_unregistered(sysfs: Sysfs) -> tuple[UnregisteredBcache, ...]:
    """Block devices with a bcache superblock that bcache has not registered (live only)."""
    if not sysfs.live:
        return ()
    found = []
    for name, rel in _unclaimed(sysfs):
        node = f"/dev/{name}"
        sb = identity.probe_superblock(node)
        if sb is None or sb.type != "bcache":
            continue
        fields = super_show(node) or {}
        version = fields.get("sb.version", "")
        kind = "backing" if "backing" in version else "cache" if "cache" in version else "?"
        found.append(UnregisteredBcache(
            identity=bcache.identity(sysfs, name, rel),
            kind=kind,
            uuid=fields.get("dev.uuid") or sb.uuid,
            cset_uuid=fields.get("cset.uuid"),
            sb_state=fields.get("dev.data.cache_state"),
            sb_mode=fields.get("dev.data.cache_mode"),
        ))
    return tuple(found)


def refuse_orphaned_dirt(snap: Snapshot, cset: str, doing: str = "replacing the SSD",
                         then: str = "run replace-ssd again") -> None:
    """A backing device that bcache stopped (IO errors, a failed set) while dirty is no
    longer listed in the set, but its dirty data still lives on this SSD (seen in the lab:
    the undrainable-dirty-data test). Replacing or unregistering the set would lose it.
    ``snap`` must have been taken with ``probe_unregistered=True``."""
    lost = [u for u in snap.unregistered
            if u.kind == "backing" and u.cset_uuid == cset and u.sb_state == "dirty"]
    if lost:
        names = ", ".join(u.identity.node for u in lost)
        raise UnsafeError(
            f"cache set {cset} holds dirty data of {names}, which bcache stopped (see dmesg: "
            f"usually IO errors on that backing device); {doing} would lose it",
            hint=f"repair {lost[0].identity.node} and register it again "
                 f"(echo {lost[0].identity.node} > /sys/fs/bcache/register) so its dirty data "
                 f"can be written back, then {then}")


def refuse_unreadable(sysfs: Sysfs, cset: str, doing: str) -> None:
    """A backing device that bcache stopped while dirty and that cannot even be read (a dead
    disk) hides its superblock, so :func:`refuse_orphaned_dirt` cannot see it, yet its dirty
    data is on this cache set's SSD (seen in the lab with a dm ``error`` table: the set was
    unregistered and the data lost). An unreadable unclaimed disk on the host therefore stops
    ``doing`` until someone says what it is."""
    bad = unreadable(sysfs)
    if bad:
        raise UnsafeError(
            f"{', '.join(bad)} cannot be read (IO errors): if it is a backing device of cache "
            f"set {cset} that bcache stopped, its dirty data is on this SSD and {doing} would "
            "lose it; nothing was changed",
            hint=f"repair {bad[0]} and register it again (echo {bad[0]} "
                 "> /sys/fs/bcache/register), or take it off the host if it is not a bcache "
                 f"device; if its data is gone for good: cachemgr stop-set {cset} "
                 "--i-accept-data-loss")
