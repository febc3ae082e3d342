"""The steps of each kind of replacement, by name and in words: the tables a journal is read
and checked against (journal.py), the kinds' modules run (bcache.py, lvm.py, dmcache.py:
their ``STEPS``, with each step's function) and every face lists. Data only, below the
journal, so reading a journal loads no kind's module."""

from __future__ import annotations

# the last step of every kind (shared.py warm_step)
WARM = ("warm", "read the hottest blocks of the --warm trace through the new cache "
                "(cachemgr warm; skipped without --warm)")

BCACHE: tuple[tuple[str, str], ...] = (
    ("preflight", "check the cache set, its SSD and every backing device"),
    ("remember", "record modes and tunables to restore at the end"),
    ("mode-interim", "switch every backing device to the interim mode (no new dirty data)"),
    ("drain", "write all dirty data back to the backing devices (fast drain)"),
    ("detach", "detach every backing device (flushes; /dev/bcacheN stay up in passthrough)"),
    ("unregister", "unregister the old cache set"),
    ("wipe-old", "wipe the bcache signature of the old SSD"),
    ("remove-old", "remove the old SSD (SCSI delete; NVMe: its controller's PCI remove)"),
    ("wait-new", "wait for the new (or re-inserted) SSD"),
    ("identify-new", "identify the new SSD and refuse a wrong disk"),
    ("make-cache", "make a fresh bcache cache on the new SSD"),
    ("register", "register the new cache set"),
    ("attach", "attach every backing device to the new cache set"),
    ("restore", "restore modes and tunables"),
    ("verify", "verify every backing device: new set, mode, state"),
    WARM,
)

LVM: tuple[tuple[str, str], ...] = (
    ("preflight", "check the cached LV, its cache PV (the SSD) and the VG"),
    ("remember", "record the cache's kind, size, chunk size, mode, policy and settings"),
    ("drain", "write every dirty block back to the origin (lvm2's cleaner: writethrough)"),
    ("split", "split the cache off (lvconvert --splitcache); the LV goes on uncached"),
    ("remove-old-cache", "delete the old cache pool or cachevol (lvremove)"),
    ("vgreduce", "take the SSD's PV out of the VG (vgreduce)"),
    ("pvremove", "wipe the SSD's PV label (pvremove)"),
    ("remove-old", "remove the old SSD (SCSI delete; NVMe: its controller's PCI remove)"),
    ("wait-new", "wait for the new (or re-inserted) SSD"),
    ("identify-new", "identify the new SSD and refuse a wrong disk"),
    ("pvcreate", "make the new SSD a PV (pvcreate)"),
    ("vgextend", "add it to the VG (vgextend)"),
    ("make-cache", "make the cache pool or cachevol again, on the new SSD alone (lvcreate)"),
    ("attach", "attach it with the old mode, policy and settings (lvconvert)"),
    ("restore", "put back whatever of mode, policy and settings differs"),
    ("verify", "verify the LV: cached on the new SSD, with the old mode and policy"),
    WARM,
)

DMCACHE: tuple[tuple[str, str], ...] = (
    ("preflight", "check the dm-cache device, its SSD and where its cache and metadata lie"),
    ("remember", "record the table (block size, policy, settings, mode) and the SSD's layout"),
    ("drain", "write every dirty block back (cleaner policy), then map the device to its "
              "origin alone (a linear table; IO goes on)"),
    ("release-old", "remove the dm areas over the old SSD and wipe its partition table"),
    ("remove-old", "remove the old SSD (SCSI delete; NVMe: its controller's PCI remove)"),
    ("wait-new", "wait for the new (or re-inserted) SSD"),
    ("identify-new", "identify the new SSD and refuse a wrong disk"),
    ("layout-new", "make the cache and metadata areas on the new SSD (the old partitions or "
                   "dm-linear areas: same offsets and sizes)"),
    ("rebuild", "zero the metadata and load the cache table again over the origin (old block "
                "size, policy, settings, mode); IO goes on"),
    ("verify", "verify the device: dm-cache on the new SSD, old block size, policy and mode"),
    WARM,
)

# a journal's kind (journal.KIND_NAMES) -> its steps
BY_KIND = {"bcache": BCACHE, "lvm": LVM, "dmcache": DMCACHE}


def of(kind: str) -> tuple[tuple[str, str], ...]:
    """The steps of the kind a journal's ``kind`` names (bcache for any other name, as
    run.py's ``kind_of``)."""
    return BY_KIND.get(kind, BCACHE)
