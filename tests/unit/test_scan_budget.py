"""The reads of a poll (issue #20): a status scan reads at most 28 + 16 per backing device +
3 per cache set sysfs files once its ScanCache is warm, the per-interval stats only when
asked, and reads everything again after a uevent. Counted through Sysfs.read on the lab's
captures (no timing here: benchmarks/scan_bench.py measures the time)."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.backends.scancache import ScanCache
from cachemgr.cli.main import main
from cachemgr.core.model import Size, WritebackDebug
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.render import status_table
from tests.unit.tui_helpers import FIXTURES, fx, unpack


class Counting(Sysfs):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: collections.Counter[str] = collections.Counter()

    def read(self, rel: str) -> str:
        self.reads[rel] += 1
        return super().read(rel)

    def take(self, **kw: object) -> tuple[snapshot.Snapshot, int]:
        self.reads.clear()
        snap = snapshot.take(self, **kw)  # type: ignore[arg-type]
        return snap, sum(self.reads.values())


def budget(snap: snapshot.Snapshot) -> int:
    return 28 + 16 * len(snap.backings) + 3 * len(snap.cache_sets)


@pytest.fixture(scope="module")
def fx64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 backing devices (dm-linear slices) on one cache set, captured on the UML lab kernel
    with kernel/uevent_seqnum."""
    return unpack("bcache-64-backing", tmp_path_factory.mktemp("fx64"))


def test_a_warm_poll_of_64_devices_stays_within_budget(fx64: Path) -> None:
    s, cache = Counting(fx64), ScanCache()
    _, cold_reads = s.take(stats=False, cache=cache)
    warm, warm_reads = s.take(stats=False, cache=cache)
    assert len(warm.backings) == 64 and len(warm.cache_sets) == 1
    assert warm_reads <= budget(warm), (warm_reads, budget(warm))
    assert cold_reads > budget(warm)  # the identities are read once, on the first scan
    # what a poll never reads: the three decaying intervals, libblkid's probes, the
    # identities; and every file at most once
    assert not [r for r in s.reads if "/stats_" in r and "/stats_total/" not in r]
    assert not [r for r in s.reads if r.endswith(("/size", "/wwid", "/serial", "/model",
                                                  "/dm/name", "/backing_dev_uuid"))]
    assert max(s.reads.values()) == 1
    assert cache.invalidations == 0
    # the same device data as a full scan, without the intervals
    full, full_reads = s.take()
    assert full_reads > 2 * warm_reads
    for a, b in zip(warm.backings, full.backings, strict=True):
        assert (a.identity, a.uuid, a.label, a.mode, a.state, a.dirty, a.writeback_rate,
                a.cset_uuid, a.io_errors, a.sequential_cutoff) == (
            b.identity, b.uuid, b.label, b.mode, b.state, b.dirty, b.writeback_rate,
            b.cset_uuid, b.io_errors, b.sequential_cutoff)
        assert list(a.stats) == ["total"] and list(b.stats) == list(bcache.STATS_INTERVALS)
        assert a.stats["total"].hits == b.stats["total"].hits
        assert a.writeback_rate_minimum is None and b.writeback_rate_minimum is not None


def test_a_uevent_empties_the_cache(fx64: Path, tmp_path: Path) -> None:
    """A copy of the capture: with kernel/uevent_seqnum unchanged a label written since is
    not seen (the kernel sends a change uevent with every label write: sysfs.c), once the
    counter moves every identity and label is read again."""
    root = tmp_path / "sys"
    shutil.copytree(fx64, root, symlinks=True)
    s, cache = Counting(root), ScanCache()
    s.take(stats=False, cache=cache)
    b0 = s.take(stats=False, cache=cache)[0].backings[0]
    label = root / bcache.block_dirs(s)[b0.identity.name] / "bcache" / "label"
    label.write_text("vm-disk-0\n")
    assert s.take(stats=False, cache=cache)[0].backings[0].label == b0.label
    seq = root / "kernel" / "uevent_seqnum"
    seq.write_text(f"{int(seq.read_text()) + 1}\n")
    snap, reads = s.take(stats=False, cache=cache)
    assert snap.backings[0].label == "vm-disk-0"
    assert cache.invalidations == 1
    assert reads > budget(snap)
    assert s.take(stats=False, cache=cache)[1] <= budget(snap)


def test_a_tree_without_the_counter_is_read_in_full_every_time() -> None:
    """Captures made before kernel/uevent_seqnum was captured: nothing is kept between
    scans (the cache only ever saves reads, it never decides what is shown)."""
    s, cache = Counting(fx("bcache-writeback-dirty")), ScanCache()
    first = s.take(stats=False, cache=cache)[1]
    assert s.take(stats=False, cache=cache)[1] == first
    assert any(r.endswith("/size") for r in s.reads)


@pytest.mark.parametrize("debug", sorted(FIXTURES.glob("*/sys/devices/**/bcache/"
                                                         "writeback_rate_debug")),
                         ids=lambda p: p.relative_to(FIXTURES).parts[0])
def test_debug_file_says_what_dirty_data_and_writeback_rate_say(debug: Path) -> None:
    """The poll takes dirty data and the rate from writeback_rate_debug instead of two more
    files: the same bch_hprint of the same counters in every capture."""
    d = WritebackDebug.parse(debug.read_text())
    dirty = Size.parse_hprint((debug.parent / "dirty_data").read_text().strip())
    rate = Size.parse_hprint((debug.parent / "writeback_rate").read_text().strip()
                             .removesuffix("/sec"))
    assert d.dirty == dirty and d.rate == rate


def test_status_shows_the_intervals_only_with_stats(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    root = str(fx("bcache-writeback-dirty"))
    plain = snapshot.take(Sysfs(root), stats=False)
    assert "HIT5m" not in status_table(plain, intervals=False)
    assert "HIT5m" in status_table(snapshot.take(Sysfs(root)))
    assert main(["--sysfs-root", root, "status", "--json", "--no-vms"]) == 0
    out = capsys.readouterr().out
    assert '"five_minute"' not in out and '"total"' in out
    assert main(["--sysfs-root", root, "status", "--json", "--no-vms", "--stats"]) == 0
    assert '"five_minute"' in capsys.readouterr().out
    assert main(["--sysfs-root", root, "status", "--no-vms"]) == 0
    assert "HIT5m" not in capsys.readouterr().out


def test_carried_stats_fill_a_poll() -> None:
    s = Sysfs(fx("bcache-writeback-dirty"))
    full, poll = snapshot.take(s), snapshot.take(s, stats=False)
    carried = snapshot.carry_stats(poll, full)
    for new, old, now in [*zip(carried.backings, full.backings, poll.backings, strict=True),
                          *zip(carried.cache_sets, full.cache_sets, poll.cache_sets,
                               strict=True)]:
        # the earlier intervals, this poll's total (its kernel-rounded percent not read)
        assert list(new.stats) == list(old.stats) == list(bcache.STATS_INTERVALS)
        assert new.stats["total"] is now.stats["total"]
        assert all(new.stats[k] is old.stats[k] for k in ("five_minute", "hour", "day"))
    assert snapshot.carry_stats(poll, None) is poll
