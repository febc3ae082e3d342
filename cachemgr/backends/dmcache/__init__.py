"""dm-cache backend: reads device-mapper ``cache`` targets into the model and changes them.

Sources (Documentation/admin-guide/device-mapper/cache.rst, drivers/md/dm-cache-target.c):
``dmsetup table`` / ``dmsetup status`` / ``dmsetup info`` through the one command runner, and
``/sys/block/dm-*/dm/{name,uuid,suspended}`` through :class:`~cachemgr.core.sysfs.Sysfs`.

What the lab kernels showed (7.2 UML and Debian 12's 6.1; captures in tests/fixtures/):

* ``dmsetup table`` prints the constructor arguments as loaded, devices as ``major:minor``::

      vmcache: 0 2097152 cache 98:32 98:16 253:0 64 1 writeback smq 0

  The status line reports the *live* features: 7.2 adds ``no_discard_passdown`` by itself
  when the origin cannot discard a whole block (the table does not show it), so a reload is
  always built from the table, never from the status.
* ``dmsetup message NAME 0 migration_threshold N`` changes the live value (status core
  args) but not the table; a reload resets it to the table's value. Every reload here
  carries the live value forward.
* Switching to ``passthrough`` while blocks are dirty: ``dmsetup load`` succeeds, ``dmsetup
  resume`` fails with EBUSY ("cannot enter passthrough mode unless all blocks are clean") and
  leaves the device **suspended with the new table live**. The only way out is loading the
  old table and resuming; :func:`~cachemgr.backends.dmcache.switch.switch_table`
  does that.
* suspend -> load -> resume keeps the hit/miss counters (the new instance reads them from
  the metadata the old one saved at suspend); load -> suspend -> resume resets them.
* The flush trap: smq writes dirty blocks back only after a second of idleness; the
  ``cleaner`` policy (with upstream fix 1e4ab7b4c881, present in 6.1 and 7.2) cleans under
  IO too, but only blocks not touched in the last writeback period (10 s, the sentinels of
  dm-cache-policy-smq.c). In writeback mode a hot block a VM keeps writing is dirtied again
  faster than that, so ``writeback`` + ``cleaner`` never reaches 0 under continuous writes
  (lab: 87 -> 736 dirty blocks in 5 s of QD1 Zipf writes). In ``writethrough`` a write
  cannot dirty a clean block, so the dirty count only goes down: under the same load it went
  689 -> 234 at once, then in steps every ~10 s to 0 (154 -> 28 -> 0 in 29 s). So a flush
  runs in writethrough + cleaner and puts the original mode and policy back at the end.

LVM owns devices whose dm UUID starts with ``LVM-``: they are shown, and every change is
refused with the lvchange/lvconvert command that does it through LVM.

The modules, each importing only those above it:

    parse       dmsetup's table, status, listing and info text -> the model's types
    command     the dmsetup wrapper; live vs captured answers; one device's table/status now
    discover    the dm-cache devices (sysfs + dmsetup), their warnings, find by name
    refusals    LVM-owned / failed / suspended devices, unknown modes
    switch      suspend -> load -> resume with signals held, the old table back on failure
    pacing      a paced flush (drain --max-latency): dm_cache's copy throttle, its journal
    flushing    flush through writethrough + cleaner, its journal, restore after a crash
    manage      mode, remove, migration_threshold
    build       create, block and metadata sizes

Inside the package dmsetup, read_status and find are called through their module
(``command.dmsetup``, ``discover.find``): one patch there reaches every caller.
"""

from __future__ import annotations

from cachemgr.backends.dmcache.build import (
    CACHE_SUPERBLOCK_MAGIC,
    DEFAULT_BLOCK_BYTES,
    MAX_BLOCK_SECTORS,
    MAX_DEFAULT_BLOCKS,
    MIN_BLOCK_SECTORS,
    create,
    default_block_bytes,
    has_cache_metadata,
    metadata_bytes_needed,
    parse_size,
)
from cachemgr.backends.dmcache.command import (
    CapturedDmsetup,
    DmsetupSource,
    LiveDmsetup,
    default_source,
)
from cachemgr.backends.dmcache.discover import (
    DmCacheScan,
    DmSys,
    device_warnings,
    dm_devices,
    find,
    scan,
)
from cachemgr.backends.dmcache.flushing import FlushResult, flush, restore_saved
from cachemgr.backends.dmcache.manage import (
    in_use_reason,
    remove,
    set_migration_threshold,
    set_mode,
)
from cachemgr.backends.dmcache.parse import (
    DEFAULT_MIGRATION_THRESHOLD,
    DmInfo,
    FailWord,
    parse_info,
    parse_listing,
    parse_status,
    parse_table,
    split_target_line,
)
from cachemgr.backends.dmcache.refusals import lvm_name

__all__ = [
    "CACHE_SUPERBLOCK_MAGIC",
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_MIGRATION_THRESHOLD",
    "MAX_BLOCK_SECTORS",
    "MAX_DEFAULT_BLOCKS",
    "MIN_BLOCK_SECTORS",
    "CapturedDmsetup",
    "DmCacheScan",
    "DmInfo",
    "DmSys",
    "DmsetupSource",
    "FailWord",
    "FlushResult",
    "LiveDmsetup",
    "create",
    "default_block_bytes",
    "default_source",
    "device_warnings",
    "dm_devices",
    "find",
    "flush",
    "has_cache_metadata",
    "in_use_reason",
    "lvm_name",
    "metadata_bytes_needed",
    "parse_info",
    "parse_listing",
    "parse_size",
    "parse_status",
    "parse_table",
    "remove",
    "restore_saved",
    "scan",
    "set_migration_threshold",
    "set_mode",
    "split_target_line",
]
