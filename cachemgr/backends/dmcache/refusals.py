"""Refusals shared by every change: LVM-owned, failed, unchecked or suspended devices,
a mode dm-cache does not have."""

from __future__ import annotations

from cachemgr.core.errors import UnsafeError, UsageError
from cachemgr.core.model import CacheMode, DmCacheDevice


def lvm_name(dm_name: str) -> str:
    """``VG/LV`` from LVM's dm name ``VG-LV`` (a '-' inside either name is doubled)."""
    parts: list[str] = []
    cur = ""
    i = 0
    while i < len(dm_name):
        c = dm_name[i]
        if c == "-" and dm_name[i + 1:i + 2] == "-":
            cur += "-"
            i += 2
            continue
        if c == "-":
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return f"{parts[0]}/{parts[1]}" if len(parts) >= 2 else dm_name


def check_changeable(d: DmCacheDevice, what: str, lvm_command: str) -> None:
    """Refuse changes to LVM-owned, failed, unchecked or suspended devices (exit 3)."""
    if d.lvm_owned:
        raise UnsafeError(
            f"{d.node} belongs to LVM (dm UUID {d.uuid}); changing its {what} with dmsetup "
            "behind LVM's back would leave LVM's metadata wrong; nothing was changed",
            hint=f"use LVM: {lvm_command.replace('VG/LV', lvm_name(d.name))}")
    if d.failure or d.status is None:
        raise UnsafeError(
            f"{d.node}: the kernel reports the cache as {d.failure}; its dirty blocks cannot "
            f"be written back, so its {what} is not changed",
            hint="see dmesg; check the cache and metadata devices; keep the cache device")
    if d.status.needs_check or d.status.metadata_mode == "ro":
        how = "read-only" if d.status.metadata_mode == "ro" else "flagged needs_check"
        raise UnsafeError(
            f"{d.node}: the cache metadata is {how}; "
            f"dm-cache cannot record changes, so its {what} is not changed",
            hint="stop the device and run cache_check (thin-provisioning-tools) on the "
                 "metadata device")
    if d.suspended:
        raise UnsafeError(
            f"{d.node} is suspended (another tool, or an interrupted cachemgr run, is in the "
            f"middle of changing it); its {what} is not changed",
            hint=f"cachemgr drain {d.name} --resume puts back what cachemgr changed")


def bad_mode(mode: CacheMode | str) -> UsageError:
    word = mode.value if isinstance(mode, CacheMode) else mode
    hint = "dm-cache modes: writeback, writethrough, passthrough"
    if word == "none":
        hint += " (passthrough is dm-cache's none)"
    return UsageError(f"dm-cache has no cache mode {word!r}", hint=hint)
