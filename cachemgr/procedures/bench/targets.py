"""What a benchmark runs on: ``[LABEL=]DEVICE[:MODE][@SCHEDULER]`` parsed and resolved to a
:class:`Target` (a bcache device named with a mode, or its backing device; the IO scheduler
its disks run under for those runs), and why writing to one would be unsafe
(:func:`write_refusal`)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from cachemgr.backends import bcache, signatures, snapshot
from cachemgr.backends import scheduler as sched
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
    scheduler: str | None = None  # DEVICE@NAME: the IO scheduler for this target's runs
    # the whole disks it is set on: the device's own disk, or the disks under a bio-based
    # device (bcacheN, dm-N: no scheduler of their own)
    scheduler_disks: tuple[str, ...] = ()


def split_scheduler(text: str) -> tuple[str, str | None]:
    """``/dev/sdb:writeback@bfq`` -> (``/dev/sdb:writeback``, ``bfq``); the name checked
    (``deadline`` -> ``mq-deadline``; a removed or malformed one: UsageError)."""
    rest, at, word = text.rpartition("@")
    if not at or "/" in word:
        return text, None
    if not word or not rest:
        raise UsageError(f"{text}: nothing after @" if not word else f"{text}: no device",
                         hint="use DEVICE@SCHEDULER, e.g. /dev/sdb@bfq")
    return rest, sched.check_name(word)


def scheduler_disks(sysfs: Sysfs, name: str) -> tuple[tuple[str, ...], str | None]:
    """The whole disks a scheduler for device ``name`` is set on, and a note when they are
    not the device itself (a partition's disk; the disks under a bio-based device)."""
    disk, part = sched.whole_disk(sysfs, name)
    if sched.read(sysfs, disk).request_based:
        return (disk,), (f"{part} is a partition: the IO scheduler is set on {disk}"
                         if part else None)
    under = sched.disks_under(sysfs, disk)
    if not under:
        raise UsageError(f"{sched.label(sysfs, disk)} is bio-based and no disk with an IO "
                         "scheduler was found under it")
    return under, (f"{sched.label(sysfs, disk)} is bio-based (no IO scheduler of its own): "
                   f"the scheduler is set on the disks under it: {', '.join(under)}")


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

    given = text
    text, scheduler = split_scheduler(text)
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
    disks: tuple[str, ...] = ()
    if scheduler is not None:
        if name is None:
            raise UsageError(f"{dev}: no kernel name to find its disks by")
        disks, _ = scheduler_disks(sysfs, name)
    return Target(label=label or given, spec=given, device=dev, name=name, mode=mode,
                  backing_name=backing.identity.name if backing else None,
                  scheduler=scheduler, scheduler_disks=disks)


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
