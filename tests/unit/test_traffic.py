"""WB/s is measured write-back traffic, not bcache's writeback_rate setting (issue #34 item
5): the lower bound of procedures/traffic.py from the block layer's write counters and
dirty data, on a copied lab capture whose counters are moved as the kernel would move them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends import blockdev, snapshot
from cachemgr.core.model import Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.render import status_table
from cachemgr.procedures import traffic
from tests.unit.tui_helpers import copy_capture

MIB = 1 << 20


def look(t: float, backing: int, upper: int, dirty: int | None = None) -> traffic.Look:
    return traffic.Look(t, backing, upper, Size(dirty, dirty) if dirty is not None else None)


def test_a_drain_is_all_of_the_backing_writes() -> None:
    # nothing written to bcacheN: every byte that reached the backing device was written back
    assert traffic.written_back(look(0, 100 * MIB, 5 * MIB, 40 * MIB),
                                look(2, 120 * MIB, 5 * MIB, 20 * MIB)) == 10 * MIB


def test_an_idle_clean_device_is_zero() -> None:
    assert traffic.written_back(look(0, 7 * MIB, 3 * MIB, 0), look(5, 7 * MIB, 3 * MIB, 0)) == 0


def test_writethrough_writes_are_not_write_back() -> None:
    assert traffic.written_back(look(0, 0, 0, 0), look(1, 8 * MIB, 8 * MIB, 0)) == 0


def test_writes_cached_in_writeback_mode_leave_the_dirty_drop() -> None:
    # 10 MiB cached (not on the backing device), 6 MiB written back, dirty fell by 2 MiB net:
    # a lower bound, never above what reached the backing device
    got = traffic.written_back(look(0, 0, 0, 20 * MIB), look(1, 6 * MIB, 10 * MIB, 18 * MIB))
    assert got == 2 * MIB
    assert traffic.written_back(look(0, 0, 0, 20 * MIB), look(1, MIB, 0, 10 * MIB)) == MIB


def test_hprint_bounds_are_taken_the_safe_way() -> None:
    # 59.9M before, 59.9M after: no drop can be claimed from dirty data alone
    before = traffic.Look(0, 0, 0, Size.parse_hprint("59.9M"))
    after = traffic.Look(1, 4 * MIB, 4 * MIB, Size.parse_hprint("59.9M"))
    assert traffic.written_back(before, after) == 0


@pytest.mark.parametrize("bad", [
    look(1, 0, 0), traffic.Look(1, None, 0, None), traffic.Look(1, 0, None, None),
    look(-1, 200 * MIB, 0)])
def test_unknown_or_backwards_is_none(bad: traffic.Look) -> None:
    assert traffic.written_back(look(0, 100 * MIB, 5 * MIB), bad) is None


def _add_writes(root: Path, rel: str, sectors: int) -> None:
    p = root / rel / "stat"
    f = p.read_text().split()
    f[6] = str(int(f[6]) + sectors)
    p.write_text(" ".join(f) + "\n")


def test_the_meter_and_status_watch_show_traffic_not_the_setting(tmp_path: Path) -> None:
    """An idle device: WB/s says 0 whatever its writeback_rate setting reads; with writes on
    its backing device and none on bcacheN it says their rate."""
    root = copy_capture(tmp_path, "bcache-unattached")
    s = Sysfs(root)
    snap = snapshot.take(s)
    b = snap.backings[0]
    assert b.device_name and b.writeback_rate is not None
    dirs = blockdev.block_dirs(s)
    meter = cache_ops.WritebackMeter()
    assert meter.update(s, snap.backings, 10.0) == {b.key: None}
    assert meter.update(s, snap.backings, 12.0) == {b.key: 0.0}
    _add_writes(root, dirs[b.identity.name], 4096)  # 2 MiB in 2 s
    rates = meter.update(s, snap.backings, 14.0)
    assert rates == {b.key: float(MIB)}
    table = status_table(snap, written_back=rates)
    head, row = table.splitlines()[0], next(x for x in table.splitlines()
                                            if x.startswith(str(b.device)))
    assert "WB/s" in head and "1.0M" in row
    assert "WB/s" not in status_table(snap)  # a single look measures nothing
    doc = cache_ops.status_json(snap, written_back=rates)
    entry = next(d for d in doc["devices"] if d["device"] == b.device)
    assert entry["written_back_bytes_per_second"] == MIB
    assert entry["writeback_rate_bytes"] == b.writeback_rate.bytes  # the setting, by its name
    # written to bcacheN as much as reached the backing device: passed through, no write-back
    _add_writes(root, dirs[b.identity.name], 2048)
    _add_writes(root, dirs[b.device_name], 2048)
    assert meter.update(s, snap.backings, 15.0) == {b.key: 0.0}


def test_the_listener_exports_the_traffic_beside_the_setting(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cachemgr.ops import metrics as ops_metrics

    root = copy_capture(tmp_path, "bcache-unattached")
    s = Sysfs(root)
    t = [100.0]
    col = ops_metrics.SnapshotCollector(s, vms=False, clock=lambda: t[0])
    reg = CollectorRegistry()
    reg.register(col)
    first = generate_latest(reg).decode()
    assert "cachemgr_bcache_writeback_rate_bytes_per_second{" in first
    assert "cachemgr_bcache_written_back_bytes_per_second{" not in first  # one look
    b = snapshot.take(s).backings[0]
    _add_writes(root, blockdev.block_dirs(s)[b.identity.name], 8192)  # 4 MiB in 4 s
    t[0] += 4
    line = next(x for x in generate_latest(reg).decode().splitlines()
                if x.startswith("cachemgr_bcache_written_back_bytes_per_second{"))
    assert float(line.rsplit(" ", 1)[1]) == MIB


def test_the_tui_trend_keeps_the_measured_traffic() -> None:
    """The TUI's poll hands each backing device's measurement to the history (the WB/s
    sparkline): a device measured, a poll without a measurement (the first) as unknown."""
    from tests.unit.tui_helpers import fx as capture
    from tui.history import History

    snap = snapshot.take(Sysfs(capture("bcache-writeback-dirty")))
    key = snap.backings[0].key
    h = History()
    h.add(1.0, snap, {}, {})
    h.add(2.0, snap, {}, {key: 3.0 * MIB})
    last = h.last(key)
    assert last is not None and last.wb == 3.0 * MIB
    assert h.series(key, "wb") == [0.0, 3.0 * MIB]


def test_the_tui_reads_a_bcache_devices_stat_once_a_poll(tmp_path: Path) -> None:
    """The meter reads each bcache device's ``stat`` for WB/s; the TUI's IOPS (the same
    file's reads + writes completed) come from that read (Meter.completed), not a second
    one: the same counts, no read of any ``stat`` file by io_counts."""
    from tests.unit.test_scan_budget import Counting
    from tests.unit.tui_helpers import unpack
    from tui import history, view

    s = Counting(unpack("bcache-64-backing", tmp_path))
    snap = snapshot.take(s, stats=False)
    rows = view.rows(snap)
    meter = traffic.Meter()
    meter.update(s, snap.backings, 1.0)
    assert len(meter.completed) == 64
    s.reads.clear()
    ios = history.io_counts(s, snap, rows, meter.completed)
    assert not [r for r in s.reads if r.endswith("/stat")]
    assert ios and ios == history.io_counts(s, snap, rows)
    assert len([r for r in s.reads if r.endswith("/stat")]) == 64  # without: read again
