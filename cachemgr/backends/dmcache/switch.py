"""Table switches: suspend -> load -> resume with SIGINT/SIGTERM/SIGHUP held, the old
table put back on any failure; the live migration_threshold carried into a new table; the
same cleaner table loaded again to let a drain's tail go (:func:`requeue_cleaner`)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

from cachemgr.backends.dmcache import command
from cachemgr.backends.dmcache.parse import DEFAULT_MIGRATION_THRESHOLD, parse_table
from cachemgr.core.errors import CommandError, UnsafeError
from cachemgr.core.model import CacheMode, DmCacheTable


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while a table switch runs.

    A Ctrl-C between ``suspend`` and ``resume`` would leave the VMs' disk suspended (all IO
    hangs). The blocked mask is inherited by the dmsetup children (the terminal sends
    SIGINT to the whole process group), and the signal is delivered once the switch is
    complete, where the flush's handler restores the table.
    """
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def switch_table(name: str, old: str, new: str, *, require_clean: bool = False) -> None:
    """suspend -> load ``new`` -> resume; on any failure the ``old`` table runs again.

    ``require_clean``: refuse (UnsafeError) unless the status reads 0 dirty blocks while the
    device is suspended (no IO can dirty a block then).
    """
    with critical():
        command.dmsetup("suspend", name)
        try:
            if require_clean:
                st = command.read_status(name)
                if isinstance(st, str) or st.dirty:
                    dirty = "?" if isinstance(st, str) else str(st.dirty)
                    raise UnsafeError(f"/dev/mapper/{name}: {dirty} dirty blocks appeared "
                                      "again; not switching the table")
            command.dmsetup("load", name, "--table", new)
        except BaseException:
            command.dmsetup("resume", name, check=False)  # the old table is still the live one
            raise
        try:
            command.dmsetup("resume", name)
        except CommandError:
            # The kernel refused the new table at resume (preresume): passthrough with dirty
            # blocks gives EBUSY. The device is now suspended with the new table live.
            with contextlib.suppress(CommandError):
                command.dmsetup("clear", name)
            command.dmsetup("load", name, "--table", old)
            command.dmsetup("resume", name)
            raise


def with_threshold(t: DmCacheTable, threshold: int | None) -> DmCacheTable:
    """The table with ``migration_threshold`` set to the live value (a reload resets it to
    the table's). Unchanged when the table already says so (or says nothing and the value is
    the default)."""
    if threshold is None:
        return t
    args = t.policy_args
    pairs = list(zip(args[0::2], args[1::2], strict=False))
    current = next((int(v) for k, v in pairs if k == "migration_threshold" and v.isdigit()),
                   DEFAULT_MIGRATION_THRESHOLD)
    if threshold == current:
        return t
    pairs = [(k, v) for k, v in pairs if k != "migration_threshold"]
    pairs.append(("migration_threshold", str(threshold)))
    return t.with_policy(t.policy, tuple(x for kv in pairs for x in kv))


def requeue_cleaner(name: str) -> float | None:
    """Load the live table of cache ``name`` again, unchanged (suspend -> load -> resume), so
    that the cleaner writes back at once the dirty blocks it is holding back. Returns the
    seconds IO was held, or None when it did nothing: the device is suspended or has an
    inactive table (another tool is changing it), or its table is not writethrough with the
    cleaner policy (the drain's, the only table this is for).

    Why: the cleaner skips blocks touched in the last writeback period (~10 s), so under any
    IO a drain's tail waits in ~10 s steps; a table load makes a new policy instance, which
    puts every mapping ahead of the writeback sentinels (dm-cache-policy-smq.c,
    smq_load_mapping). lvm2's ``lvchange --refresh`` suppresses a reload of an identical
    table, so it does not do this (docs/kernel-notes.md, "dm-cache modes, smq and the
    cleaner"). The table loaded is the one read while suspended, with the live
    migration_threshold carried over: nothing the kernel or lvm2 keeps changes."""
    attr = command.dmsetup("info", "-c", "--noheadings", "-o", "attr", "--", name,
                           timeout=30).stdout.strip()
    if len(attr) < 3 or attr[0] != "L" or attr[1] == "I" or attr[2] == "s":
        return None
    with critical():
        t0 = time.monotonic()
        command.dmsetup("suspend", "--", name, timeout=600)
        try:
            table = parse_table(command.read_table(name))
            st = command.read_status(name)
            ours = table.mode == CacheMode.WRITETHROUGH and table.policy == "cleaner" \
                and not isinstance(st, str)
            if ours and not isinstance(st, str):
                command.dmsetup("load", "--table",
                                with_threshold(table, st.migration_threshold).line(), "--", name)
        except BaseException:
            # the old table is still the live one; a loaded inactive one is dropped
            with contextlib.suppress(CommandError):
                command.dmsetup("clear", "--", name)
            command.dmsetup("resume", "--", name, check=False)
            raise
        command.dmsetup("resume", "--", name)
        return time.monotonic() - t0 if ours else None
