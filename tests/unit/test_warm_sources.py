"""Which traces a warm takes (issue #45 item 3, "sizing flows into warm"): a trace whose
offsets map onto the cached device. The cached device itself; an LVM cache's LV traced
before it was cached (lvconvert keeps the LV's dm device: lab, docs/kernel-notes.md,
"Warming a cache"); a bcache device's backing disk, its offsets less bcache's data offset
(the backing device's size less /dev/bcacheN's, both from sysfs). Anything else is refused,
saying why it cannot map. On captured lab trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.errors import UsageError
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import kinds, warm
from tests.unit.test_warm import make_trace, state_dir  # noqa: F401 (a fixture)
from tests.unit.tui_helpers import fx

K = 4096
DATA_OFFSET = 16 * 512  # make-bcache's default: the capture's ubda less bcache0, in bytes


def bcache_kind() -> tuple[Sysfs, kinds.Kind]:
    sysfs = Sysfs(str(fx("bcache-writeback-dirty")))
    return sysfs, kinds.resolve(snapshot.take(sysfs), "/dev/bcache0", sysfs)


def test_bcache_data_offset_is_the_sizes_difference() -> None:
    sysfs, k = bcache_kind()
    below = k.warm_trace_below(sysfs)
    assert below is not None
    names, shift = below
    assert shift == DATA_OFFSET and {"/dev/ubda", "ubda"} <= names


def sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' sizes as the lab kernel gave them (a capture has no /dev nodes)."""
    known = {"/dev/bcache0": (1 << 30) - DATA_OFFSET, "/dev/ubda": 1 << 30,
             "/dev/vg0/vm1": 128 << 20}
    monkeypatch.setattr(warm, "device_size", lambda sysfs, node: known.get(node))


def test_a_trace_of_the_backing_disk_warms_its_blocks_less_the_data_offset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes(monkeypatch)
    sysfs, k = bcache_kind()
    size = 1 << 30
    # disk blocks 0 and 1 are bcache's superblock and data offset: not the bcache device's;
    # block 1 + 262140 is past its end (the disk's last block)
    t = make_trace(tmp_path / "t", [(b * K, K, 0) for b in (9, 9, 9, 5, 5, 0, 1, 262143, 2)],
                   name="ubda", size=size)
    p = warm.prepare(sysfs, k, t, 1 << 20)
    assert p.hot.shift == DATA_OFFSET and p.hot.device.path == "/dev/ubda"
    assert p.hot.blocks == [7, 3, 262141, 0]
    # the same blocks in a trace of /dev/bcache0 itself: no shift
    t2 = make_trace(tmp_path / "u", [(b * K, K, 0) for b in (7, 7, 7, 3, 3, 0)],
                    name="bcache0", size=size - DATA_OFFSET)
    p2 = warm.prepare(sysfs, k, t2, 1 << 20)
    assert p2.hot.shift == 0 and p2.hot.blocks == [7, 3, 0]


def test_the_summary_says_the_shift(tmp_path: Path) -> None:
    sysfs, k = bcache_kind()
    t = make_trace(tmp_path / "t", [(9 * K, K, 0)], name="ubda", size=1 << 30)
    p = warm.prepare(sysfs, k, t, 1 << 20)
    w = warm.Warmed(device="/dev/bcache0")
    lines = warm.summary(p, w)
    assert ("  the trace is of /dev/ubda, /dev/bcache0's backing device: its offsets read "
            "less bcache's data offset, 8.0 KiB (16 sectors)") in lines


def test_traces_that_cannot_map_are_refused_saying_why(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    sizes(monkeypatch)
    sysfs, k = bcache_kind()
    # another disk
    t = make_trace(tmp_path / "t", [(0, K, 0)], name="ubdc", size=1 << 30)
    with pytest.raises(UsageError) as e:
        warm.prepare(sysfs, k, t)
    msg = e.value.message
    assert "/dev/ubdc" in msg and "nor of its backing device /dev/ubda of 1.0 GiB" in msg
    assert "it cannot map onto /dev/bcache0" in msg
    # the backing disk's name at another size: another disk since
    t = make_trace(tmp_path / "u", [(0, K, 0)], name="ubda", size=1 << 29)
    with pytest.raises(UsageError, match="cannot map onto /dev/bcache0"):
        warm.prepare(sysfs, k, t)
    # a data offset that is not a whole number of the trace's blocks
    _, shift = k.warm_trace_below(sysfs) or (set(), 0)
    k2 = _Shifted(k, shift + 512)
    monkeypatch.setattr(warm, "device_size", lambda sysfs, node: (1 << 30) - shift - 512)
    t = make_trace(tmp_path / "v", [(0, K, 0)], name="ubda", size=1 << 30)
    with pytest.raises(UsageError, match=r"not a whole number of the trace's 4\.0 KiB blocks"):
        warm.trace_source(sysfs, k2, t)


class _Shifted:
    """A kind whose backing device is ahead by ``shift`` (a data offset make-bcache can
    give: --data-offset in sectors)."""

    def __init__(self, k: kinds.Kind, shift: int) -> None:
        self.k, self.shift = k, shift
        self.node = k.node

    def warm_trace_names(self) -> set[str]:
        return self.k.warm_trace_names()

    def warm_trace_below(self, sysfs: Sysfs) -> tuple[set[str], int]:
        below = self.k.warm_trace_below(sysfs)
        assert below is not None
        return below[0], self.shift


def test_an_lvm_cache_takes_a_trace_of_its_lv_taken_before_it_was_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes(monkeypatch)
    sysfs = Sysfs(str(fx("lvm-caches")))
    k = kinds.resolve(snapshot.take(sysfs), "vg0/vm1", sysfs)
    size = warm.device_size(sysfs, k.node)
    assert size == 128 << 20
    # `cachemgr trace /dev/vg0/vm1` on the linear LV: its dm device (dm-1) and size
    t = make_trace(tmp_path / "t", [(b * K, K, 0) for b in (4, 4, 2)], name="dm-1",
                   size=size)
    p = warm.prepare(sysfs, k, t, 1 << 20)
    assert p.hot.shift == 0 and p.hot.blocks == [4, 2]
    # its PV (the slow disk under the VG): the LV's extents are not its offsets
    t = make_trace(tmp_path / "u", [(0, K, 0)], name="ubda", size=1 << 30)
    with pytest.raises(UsageError, match="another device"):
        warm.prepare(sysfs, k, t)
