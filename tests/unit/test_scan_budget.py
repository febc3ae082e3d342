"""The reads of a poll (issues #20 and #34): a status scan reads 1 + 6 per backing device + 7
per cache set (with its cache device) sysfs files once its ScanCache is warm: what the table
and the health model use. The per-interval stats are read only when asked, the tunables and
bypass counters nothing shows between two full reads are kept from the last full read
(backends/scancache.py: dropped when this process writes to sysfs, after ``keep`` seconds
and on a uevent), and everything is read again after a uevent. Counted through Sysfs.read on
the lab's captures (no timing here: benchmarks/scan_bench.py measures the time)."""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from cachemgr.backends import bcache, snapshot
from cachemgr.backends.scancache import ScanCache
from cachemgr.cli.main import main
from cachemgr.core.model import Size, WritebackDebug
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.render import status_table
from tests.unit.tui_helpers import FIXTURES, fx, kernel_writes, unpacked


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
    """kernel/uevent_seqnum; per backing device cache_mode, state, writeback_rate_debug,
    io_errors and stats_total's cache_hits and cache_misses; per cache set errors,
    cache_available_percent, the two congestion thresholds, stats_total's hits and misses
    and its cache device's io_errors. One file more per backing device is 64 reads over it
    on the 64-device capture."""
    return 1 + 6 * len(snap.backings) + 7 * len(snap.cache_sets)


# what a poll takes from its ScanCache (the last full read's) instead of reading it
KEPT = tuple(f"/bcache/{n}" for n in bcache.KEPT_BACKING + bcache.KEPT_CACHE) + tuple(
    f"/stats_total/{n}" for n in bcache.KEPT_TOTAL)


@pytest.fixture(scope="module")
def fx64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 backing devices (dm-linear slices) on one cache set, captured on the UML lab kernel
    with kernel/uevent_seqnum."""
    return unpacked("bcache-64-backing", tmp_path_factory)


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
    # the tunables and bypass counters: kept from the first scan, not read again
    assert not [r for r in s.reads if r.endswith(KEPT)]
    assert not [r for r in s.reads if r.startswith("fs/bcache/") and r.endswith(
        tuple(f"/{n}" for n in bcache.KEPT_SET))]
    # the same data as a full scan, every field, without the intervals and the kernel's
    # rounded ratio
    full, full_reads = s.take()
    assert full_reads > 2 * warm_reads
    assert [r for r in s.reads if r.endswith(KEPT)]  # a full read reads them
    pairs = [*zip(warm.backings, full.backings, strict=True),
             *zip(warm.cache_sets, full.cache_sets, strict=True)]
    for a, b in pairs:
        assert list(a.stats) == ["total"] and list(b.stats) == list(bcache.STATS_INTERVALS)
        assert a.stats["total"] == dataclasses.replace(b.stats["total"], hit_ratio=None)
        assert dataclasses.replace(a, stats={}) == dataclasses.replace(b, stats={})  # type: ignore[type-var]
    b0 = warm.backings[0]
    assert None not in (b0.writeback_percent, b0.writeback_delay, b0.sequential_cutoff,
                        b0.writeback_rate_minimum, b0.io_error_limit,
                        b0.stop_when_cache_set_failed, b0.stats["total"].bypass_hits)
    assert warm.cache_sets[0].io_error_limit is not None and warm.cache_sets[0].caches[0].written


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


@pytest.fixture
def tree(fx64: Path, tmp_path: Path) -> Path:
    """A writable copy of the 64-device capture."""
    root = tmp_path / "sys"
    shutil.copytree(fx64, root, symlinks=True)
    return root


class Clock:
    """Monotonic seconds that move only when a test moves them (``t``); test_metrics_cache
    uses it too."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_tune_through_the_ops_layer_is_seen_on_the_next_poll(
        tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The TUI's tune runs cache_ops.tune in the TUI's process: its write drops what the
    poller kept, so the next poll reads the kept files again and shows the new value."""
    from cachemgr.ops import cache as cache_ops

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    kernel_writes(monkeypatch)
    s, clock = Counting(tree), Clock()
    cache = ScanCache(clock=clock)
    s.take(stats=False, cache=cache)
    b0 = s.take(stats=False, cache=cache)[0].backings[0]
    assert b0.writeback_percent != 7 and b0.device
    res = cache_ops.tune(Sysfs(tree), b0.device, ["writeback_percent=7"])
    assert res.exit_code == 0 and res.changes
    snap, reads = s.take(stats=False, cache=cache)  # no time has passed on the cache's clock
    assert snap.backings[0].writeback_percent == 7
    assert reads > budget(snap)  # every kept file read again, once
    assert [r for r in s.reads if r.endswith(KEPT)]
    assert cache.invalidations == 0  # the identities stay: a tune sends no uevent
    # and kept again from then on
    assert s.take(stats=False, cache=cache)[1] == budget(snap)


def test_a_value_changed_behind_cachemgrs_back_shows_at_the_next_full_read(
        tree: Path) -> None:
    """A write cachemgr did not make (another process, echo > /sys/...) is not seen by the
    polls that take the kept value; the next full read (stats=True: the TUI's every 15 s)
    reads it, and a poll reads it again once the kept value is ``keep`` seconds old."""
    s, clock = Counting(tree), Clock()
    cache = ScanCache(clock=clock)
    first = s.take(stats=False, cache=cache)[0].backings[0]
    rel = bcache.block_dirs(s)[first.identity.name]
    (tree / rel / "bcache" / "writeback_percent").write_text("3\n")
    clock.t += cache.keep - 1
    assert s.take(stats=False, cache=cache)[0].backings[0].writeback_percent == \
        first.writeback_percent != 3
    assert s.take(stats=True, cache=cache)[0].backings[0].writeback_percent == 3
    # the full read kept what it read: the polls after it take it
    (tree / rel / "bcache" / "writeback_percent").write_text("4\n")
    clock.t += cache.keep - 1
    snap, reads = s.take(stats=False, cache=cache)
    assert snap.backings[0].writeback_percent == 3 and reads == budget(snap)
    # keep seconds after the full read: a poll reads them again
    clock.t += 1
    snap, reads = s.take(stats=False, cache=cache)
    assert snap.backings[0].writeback_percent == 4 and reads > budget(snap)


def test_a_poll_with_nothing_kept_reads_everything_but_the_intervals(tree: Path) -> None:
    """keep=0 (the metrics listener) and a one-shot poll (no ScanCache): the kept files are
    read by every poll, so every snapshot has every field."""
    s = Counting(tree)
    cache = ScanCache(keep=0)
    s.take(stats=False, cache=cache)
    for kw in ({"cache": cache}, {}):
        snap, _ = s.take(stats=False, **kw)
        assert len([r for r in s.reads if r.endswith(KEPT)]) == 64 * (
            len(bcache.KEPT_BACKING) + len(bcache.KEPT_TOTAL)) + len(
            bcache.KEPT_CACHE) + len(bcache.KEPT_TOTAL)
        assert snap.backings[0].writeback_rate_minimum is not None


def test_a_uevent_drops_the_kept_values_too(tree: Path) -> None:
    s = Counting(tree)
    cache = ScanCache()
    first = s.take(stats=False, cache=cache)[0].backings[0]
    rel = bcache.block_dirs(s)[first.identity.name]
    (tree / rel / "bcache" / "sequential_cutoff").write_text("1.0M\n")
    seq = tree / "kernel" / "uevent_seqnum"
    seq.write_text(f"{int(seq.read_text()) + 1}\n")
    assert s.take(stats=False, cache=cache)[0].backings[0].sequential_cutoff == \
        Size.parse_hprint("1.0M")


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
