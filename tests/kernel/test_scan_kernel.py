"""A poll's scan on the lab kernel (issues #20 and #34): what its ScanCache keeps is read
again after every change that could make it wrong, a warm poll stays within the read budget,
and the tunables a poll takes from the last full read follow cachemgr's own writes at once
and another process's at the next full read."""

from __future__ import annotations

import collections

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.backends.scancache import ScanCache
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs


class Counting(Sysfs):
    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()

    def read(self, rel: str) -> str:
        self.reads[rel] += 1
        return super().read(rel)


@pytest.mark.kernel(disks="1G,256M")
def test_poll_cache_follows_the_kernel(lab_disks: list[str]) -> None:
    hdd, ssd = lab_disks[0], lab_disks[1]
    runner.run(["dmsetup", "create", "vm0", "--table", f"0 409600 linear {hdd} 0"])
    runner.run(["dmsetup", "create", "vm1", "--table", f"0 409600 linear {hdd} 409600"])
    bcache.make_bcache(backing=["/dev/mapper/vm0", "/dev/mapper/vm1"], cache=ssd,
                       bucket="128k")
    s, cache = Counting(), ScanCache()
    for d in (ssd, "/dev/mapper/vm0", "/dev/mapper/vm1"):
        bcache.register(s, d)

    def poll() -> snapshot.Snapshot:
        s.reads.clear()
        return snapshot.take(s, stats=False, cache=cache)

    assert bcache.wait_for(lambda: len([b for b in poll().backings if b.cset_uuid]) == 2, 20)
    snap = poll()
    assert s.reads["kernel/uevent_seqnum"] == 1
    # tests/unit/test_scan_budget.py's budget: 1 + 6 per backing device + 7 per cache set
    assert sum(s.reads.values()) <= 1 + 6 * 2 + 7, s.reads
    assert not [r for r in s.reads if r.endswith(("/size", "/dm/name", "/label"))]
    assert not [r for r in s.reads if r.endswith(("/writeback_percent", "/sequential_cutoff",
                                                  "/cache_bypass_hits"))]
    full = snapshot.take(Sysfs())
    assert [(b.identity, b.uuid, b.label, b.mode, b.state, b.dirty, b.writeback_percent,
             b.writeback_delay, b.sequential_cutoff, b.running, b.writeback_running)
            for b in snap.backings] \
        == [(b.identity, b.uuid, b.label, b.mode, b.state, b.dirty, b.writeback_percent,
             b.writeback_delay, b.sequential_cutoff, b.running, b.writeback_running)
            for b in full.backings]

    # a tunable written by this process: the next poll reads it (the kept values dropped)
    rel0 = bcache.backing_rel(s, snap.backings[0].identity.name)
    before = snap.backings[0].writeback_percent
    s.write(f"{rel0}/writeback_percent", "7")
    assert poll().backings[0].writeback_percent == 7
    # by another process: not seen by the polls that take the kept value, seen by the next
    # full read (kept from then on)
    runner.run(["sh", "-c", f"echo 3 > /sys/{rel0}/writeback_percent"])
    assert poll().backings[0].writeback_percent == 7
    assert snapshot.take(s, stats=True, cache=cache).backings[0].writeback_percent == 3
    assert poll().backings[0].writeback_percent == 3
    assert not [r for r in s.reads if r.endswith("/writeback_percent")]
    s.write(f"{rel0}/writeback_percent", str(before))

    # a label write sends a uevent: the next poll reads the labels again
    b0 = snap.backings[0]
    rel = bcache.backing_rel(s, b0.identity.name)
    s.write(f"{rel}/label", "vm-disk-0")
    snap = poll()
    assert snap.backings[0].label == "vm-disk-0"
    # a mode write sends none: read on every poll anyway
    s.write(f"{rel}/cache_mode", "writeback")
    assert poll().backings[0].mode.value == "writeback"  # type: ignore[union-attr]

    # a dm device grown by a new table (load + resume: the resume sends a uevent)
    runner.run(["dmsetup", "create", "vm2", "--table", f"0 2048 linear {hdd} 819200"])
    assert "vm2" in runner.run(["dmsetup", "table"]).stdout
    poll()
    runner.run(["dmsetup", "load", "vm2", "--table", f"0 4096 linear {hdd} 819200"])
    runner.run(["dmsetup", "resume", "vm2"])
    s.reads.clear()
    snapshot.take(s, stats=False, cache=cache)
    assert [r for r in s.reads if r.endswith("/size")], \
        "the identities were not read again after the resume"
    assert cache.invalidations >= 3

    # a cache set unregistered sends no uevent: it still goes from the next poll
    cset = snap.cache_sets[0].uuid
    for b in snap.backings:
        s.write(f"{bcache.backing_rel(s, b.identity.name)}/detach", "1")
    assert bcache.wait_for(lambda: all(b.cset_uuid is None for b in poll().backings), 30)
    s.write(f"fs/bcache/{cset}/unregister", "1")
    assert bcache.wait_for(lambda: not poll().cache_sets, 30)
