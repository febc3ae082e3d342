"""Tunables by name, for one target: a bcache backing device, a cache set or a dm-cache
device. The one implementation behind `cachemgr tune` and the TUI's tune action."""

from __future__ import annotations

from collections.abc import Sequence

from cachemgr.backends import bcache
from cachemgr.core.errors import AlreadyError, UsageError, require_root
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Result
from cachemgr.procedures import kinds


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


def tune(sysfs: Sysfs, snap: Snapshot, target: str, settings: Sequence[str]) -> Result:
    """Apply ``settings`` to ``target`` (any kind with tunables: a cached device or a cache
    set). The Result holds what changed (before and after) and one "already so" note per
    setting that already had its value (``already`` when none changed). Every setting is
    checked before the first write (unknown name: usage error, nothing written); root is
    required (lvm2's caches: after lvm2's own refusals). The Result is built inside the
    gate, so that the journal trail of a face with no command frame of its own (the TUI)
    names each setting's old and new value (cachemgr/ops/trail.py)."""
    parsed = parse_settings(settings)
    k = kinds.resolve(snap, target, sysfs, caches=True)
    subject = gate.of_cache_set(k.obj, snap) if not k.cached_device else gate.of_kind(k)
    gate.precheck(subject, "tune")  # the gate's refusals, before the settings are checked
    for name, value in parsed:
        k.check_tunable(name, value)
    if not k.root_in_backend:
        require_root("tuning")
    with gate.gate(subject, "tune", detail=dict(parsed)):
        changes: list[bcache.Change] = []
        already: list[str] = []
        for name, value in parsed:
            try:
                changes.append(k.set_tunable(sysfs, name, value))
            except AlreadyError as exc:
                already.append(f"cachemgr: {exc}")
        return Result(changes=changes, notes=already, already=not changes and bool(already))
