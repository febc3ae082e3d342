"""Table switches: suspend -> load -> resume with SIGINT/SIGTERM/SIGHUP held, the old
table put back on any failure; the live migration_threshold carried into a new table; the
same cleaner table loaded again to let a drain's tail go (:func:`requeue_cleaner`); a switch
that opens the cache metadata afresh (:func:`reopen_switch`), so that the dirty bits a
drain cleared are the ones the new table loads."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import signal
import time
from collections.abc import Iterator

from cachemgr.backends.dmcache import command
from cachemgr.backends.dmcache.parse import DEFAULT_MIGRATION_THRESHOLD, parse_table
from cachemgr.core.errors import CacheMgrError, CommandError, UnsafeError
from cachemgr.core.model import CacheMode, DmCacheTable
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)


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


# The reopen's stand-in for the metadata device: a dm name of our own, the same for a device
# every time (a run killed half-way leaves it; the next one finds and removes it)
REOPEN_PREFIX = "cachemgr-md-"


def reopen_name(name: str) -> str:
    """The stand-in's dm name for cache ``name`` (a digest: any dm name fits, none is parsed)."""
    return REOPEN_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:16]


def reopen_switch(sysfs: Sysfs, name: str, old: str, new: DmCacheTable, *,
                  require_clean: bool = False) -> None:
    """``old`` -> ``new`` with the cache metadata opened afresh, so that the new table loads
    the dirty bits as they are on disk.

    Why: dm-cache keeps one metadata object per metadata block device while any table uses
    it, and reads the superblock's clean-shutdown flag only when it opens one
    (``clean_when_opened``, drivers/md/dm-cache-metadata.c: ``__open_metadata``,
    ``lookup_or_open``). Opened after an unclean shutdown, every later table load of the
    same device marks every cached block dirty again (``__load_mapping_v1/v2``:
    ``respect_dirty_flags``), however clean a drain left them. A suspend commits the
    metadata with the flag set (``cache_postsuspend`` -> ``sync_metadata`` ->
    ``commit(cache, true)``); a table on another block device over the same metadata opens
    a new object, which reads that flag. So: a linear stand-in over the metadata device,
    ``new`` on it (suspend -> load -> resume), then ``new`` itself (the stand-in's object
    committed clean at that suspend; the metadata device's own opened afresh), then the
    stand-in removed. IO is held twice, as long as each switch. Lab (UML 7.2.7): a device
    whose metadata was opened unclean read 512 of 512 blocks dirty again after each plain
    reload of its drained table, and 0 after this switch and every reload after it
    (docs/kernel-notes.md, "Why a cache does not help": dirty blocks in writethrough after
    an unclean shutdown).

    Each switch is :func:`switch_table` (the old table back on a failure). Left on the
    stand-in by a failure of the second, the device runs ``new`` with its metadata read
    through the stand-in (the same blocks); the stand-in is then kept (in use) and the
    error raised: the caller puts its own table back, and :func:`drop_reopen` removes it.
    """
    size = device_sectors(sysfs, new.metadata_dev)
    if not size:
        raise CacheMgrError(f"/dev/mapper/{name}: cannot read the size of its metadata device "
                            f"{new.metadata_dev} (sysfs dev/block/{new.metadata_dev}/size)")
    alias = reopen_name(name)
    drop_reopen(name)  # one a killed run left
    command.dmsetup("create", alias, "--table", f"0 {size} linear {new.metadata_dev} 0")
    try:
        devno = command.dmsetup("info", "-c", "--noheadings", "-o", "major,minor", "--",
                                alias, timeout=30).stdout.strip()
        via = dataclasses.replace(new, metadata_dev=devno).line()
        switch_table(name, old, via, require_clean=require_clean)
        switch_table(name, via, new.line(), require_clean=require_clean)
    finally:
        drop_reopen(name)


def device_sectors(sysfs: Sysfs, devno: str) -> int | None:
    """The size in 512-byte sectors of block device ``devno`` (major:minor), from sysfs."""
    return sysfs.read_int(f"dev/block/{devno}/size")


def drop_reopen(name: str) -> bool:
    """Remove cache ``name``'s stand-in (:func:`reopen_switch`) if one exists and nothing
    uses it; True when none is left."""
    alias = reopen_name(name)
    if command.dmsetup("info", "--", alias, timeout=30, check=False).returncode != 0:
        return True
    r = command.dmsetup("remove", "--", alias, timeout=60, check=False)
    if r.returncode != 0:
        log.error("/dev/mapper/%s: the metadata stand-in %s is still in use (%s)", name, alias,
                  r.stderr.strip())
        return False
    return True
