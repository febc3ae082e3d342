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

import logging
import re

from cachemgr.backends import bcache, identity
from cachemgr.core import runner
from cachemgr.core.errors import CommandError, KernelFormatError, UnsafeError
from cachemgr.core.model import Snapshot, UnregisteredBcache
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

_BRACKET = re.compile(r"\[([^\]]+)\]")


def parse_super_show(text: str) -> dict[str, str]:
    """``key -> value`` of bcache-super-show's output; bracketed words replace codes."""
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


def scan_unregistered(sysfs: Sysfs) -> tuple[UnregisteredBcache, ...]:
    """Block devices with a bcache superblock that bcache has not registered (live only)."""
    if not sysfs.live:
        return ()
    found = []
    for name, rel in sorted(bcache.block_dirs(sysfs).items()):
        if name.startswith(("bcache", "loop", "ram", "zram")) or sysfs.is_dir(f"{rel}/bcache"):
            continue
        if (sysfs.read_int(f"{rel}/size") or 0) == 0 or sysfs.listdir(f"{rel}/holders"):
            continue
        # a suspended dm device blocks every read until it is resumed: probing one during a
        # table switch (ours or LVM's) hung `cachemgr status` in the lab
        if (sysfs.read_opt(f"{rel}/dm/suspended") or "0").strip() == "1":
            continue
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
