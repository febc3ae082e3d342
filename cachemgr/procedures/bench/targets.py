"""What a benchmark runs on: ``[LABEL=]DEVICE[:MODE]`` parsed and resolved to a
:class:`Target` (a bcache device named with a mode, or its backing device), and why writing to
one would be unsafe (:func:`write_refusal`)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from cachemgr.backends import bcache, signatures, snapshot
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode, Snapshot
from cachemgr.core.sysfs import Sysfs


@dataclass(frozen=True)
class Target:
    """What one compared column runs on: a device, and for bcache devices the mode to use."""

    label: str
    spec: str  # as given: /dev/bcache0:writeback
    device: str  # the node fio opens
    name: str | None  # kernel name
    mode: CacheMode | None = None  # asked for; None keeps the current one
    backing_name: str | None = None  # set for bcache devices


def parse_target(text: str) -> tuple[str | None, str, CacheMode | None]:
    """``[LABEL=]DEVICE[:MODE]`` -> (label, device, mode)."""
    label = None
    if "=" in text and not text.startswith("/"):
        label, _, text = text.partition("=")
    mode = None
    dev, sep, m = text.rpartition(":")
    if sep and dev and m in {x.value for x in bcache.BCACHE_MODES}:
        mode, text = CacheMode(m), dev
    elif sep and dev and "/" not in m:
        raise UsageError(f"unknown cache mode {m!r} in {text}:{m}",
                         hint="use DEVICE:writethrough|writeback|writearound|none")
    return label, text, mode


def resolve_target(sysfs: Sysfs, text: str) -> Target:
    from cachemgr.backends.targets import resolve_backing

    label, dev, mode = parse_target(text)
    if not os.path.exists(dev):
        raise UsageError(f"{dev}: no such device")
    name = sysfs.block_name_of(dev)
    if name is None:
        raise UsageError(f"{dev} is not a block device")
    snap = snapshot.take(sysfs)
    backing = None
    for b in snap.backings:
        if b.device_name == name:
            backing = b
    if backing is None and mode is not None:
        # a backing device named with a mode means its bcache device
        try:
            backing = resolve_backing(snap, dev, sysfs)
        except UsageError:
            raise UsageError(f"{dev} is not a bcache device; a mode needs one") from None
        if backing.device is None:
            raise UsageError(f"{dev} has no running bcache device")
        dev, name = backing.device, backing.device_name
    if backing is not None and backing.cset_uuid is None and mode is not None:
        raise UsageError(f"{backing.device} has no cache attached; its mode means nothing")
    return Target(label=label or text, spec=text, device=dev, name=name, mode=mode,
                  backing_name=backing.identity.name if backing else None)


def write_refusal(sysfs: Sysfs, target: Target, snap: Snapshot) -> tuple[str, bool]:
    """Why writing to ``target`` would be unsafe, and whether ``--force`` may override it.

    ("", True) when it looks like a scratch device.
    """
    name = target.name or ""
    for b in snap.backings:
        if b.identity.name == name and b.device:
            return (f"{target.device} is the backing device of {b.device}: raw writes would "
                    f"overwrite its bcache superblock and bypass the cache; benchmark "
                    f"{b.device}:none for the bare device instead", False)
    for c in snap.cache_sets:
        for x in c.caches:
            if x.identity.name == name:
                return (f"{target.device} is the cache device of cache set {c.uuid}: writing "
                        "to it destroys the cache and any dirty data in it", False)
    rel = bcache.block_dirs(sysfs).get(name)
    holders = sysfs.listdir(f"{rel}/holders") if rel else []
    if holders:
        return f"{target.device} is in use by {', '.join(holders)}", True
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        if any(line.split()[0] in (target.device, f"/dev/{name}") for line in f if line):
            return f"{target.device} is mounted", True
    sig = signatures.first(target.device)
    if sig is not None:
        return f"{target.device} holds a {sig} signature (data)", True
    return "", True
