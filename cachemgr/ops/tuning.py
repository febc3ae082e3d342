"""Tunables by name, for one target: a bcache backing device, a cache set or a dm-cache
device. The one implementation behind `cachemgr tune` and the TUI's tune action."""

from __future__ import annotations

from collections.abc import Sequence

from cachemgr.backends import bcache, dmcache
from cachemgr.backends.lvm import manage as lvm_manage
from cachemgr.backends.targets import find_dm, find_dmcache, resolve_backing, resolve_cache_set
from cachemgr.core.errors import AlreadyError, UsageError, require_root
from cachemgr.core.model import BcacheBacking, CacheSet, Snapshot
from cachemgr.core.sysfs import Sysfs


def parse_settings(settings: Sequence[str]) -> list[tuple[str, int]]:
    """NAME=VALUE words to (name, integer value); a usage error names the bad one."""
    parsed: list[tuple[str, int]] = []
    for kv in settings:
        name, sep, value = kv.partition("=")
        if not sep:
            raise UsageError(f"bad setting {kv!r}", hint="use NAME=VALUE, e.g. writeback_percent=0")
        try:
            parsed.append((name, int(value)))
        except ValueError:
            raise UsageError(f"{name}: {value!r} is not an integer") from None
    return parsed


def tune(sysfs: Sysfs, snap: Snapshot, target: str, settings: Sequence[str]
         ) -> tuple[list[bcache.Change], list[str]]:
    """Apply ``settings`` to ``target``. Returns what changed and one "already so" message
    per setting that already had its value. Every setting is checked before the first
    write (unknown name: usage error, nothing written); root is required."""
    parsed = parse_settings(settings)
    lv = find_dm(snap, target, sysfs, lvm=True)
    dm = find_dmcache(snap, target, sysfs) if lv is None else None
    b: BcacheBacking | None = None
    c: CacheSet | None = None
    if lv is not None:
        for name, value in parsed:
            lvm_manage.check_tunable(lv, name, value)
    elif dm is not None:
        for name, _ in parsed:
            if name != "migration_threshold":
                raise UsageError(f"unknown dm-cache tunable {name!r}",
                                 hint="dm-cache has: migration_threshold (sectors)")
    else:
        try:
            b = resolve_backing(snap, target, sysfs)
        except UsageError:
            c = resolve_cache_set(snap, target, sysfs)
        for name, value in parsed:
            bcache.check_tunable(name, value, cache_set=b is None)
    if lv is None:
        require_root("tuning")  # an LVM cache: lvm_manage.tune, after its health refusal
    changes: list[bcache.Change] = []
    already: list[str] = []
    for name, value in parsed:
        try:
            if lv is not None:
                changes.append(lvm_manage.tune(lv, name, value))
            elif dm is not None:
                changes.append(dmcache.set_migration_threshold(sysfs, dm, value))
            elif b is not None:
                changes.append(bcache.set_tunable(sysfs, b, name, value))
            else:
                assert c is not None
                changes.append(bcache.set_cache_set_tunable(sysfs, c, name, value))
        except AlreadyError as exc:
            already.append(f"cachemgr: {exc}")
    return changes, already
