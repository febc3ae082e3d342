"""``cachemgr doctor``'s diagnosis (procedures/doctor.py) on captured lab trees: each
tests/fixtures/doctor-<scenario>-uml/ holds two captures of one scenario under its fio load,
``before/`` and ``after/`` a window apart (scripts/capture-doctor-fixtures.py), and the
diagnosis of the pair names the planted cause, or nothing for a control."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.doctor import block_stats
from cachemgr.procedures import doctor, sizing
from cachemgr.procedures import trace as tr

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def window(name: str) -> doctor.Window:
    fx = FIXTURES / name
    if not fx.is_dir():
        pytest.skip(f"{name} not captured")
    a, b = (Sysfs(fx / side / "sys") for side in ("before", "after"))
    t0, t1 = (json.loads((fx / side / "meta.json").read_text())["uptime"]
              for side in ("before", "after"))
    return doctor.Window(snapshot.take(a), snapshot.take(b), t1 - t0, block_stats(a),
                         block_stats(b))


def codes(name: str) -> list[tuple[str, str]]:
    return [(c.code, c.device) for c in doctor.diagnose(window(name))]


@pytest.mark.parametrize("name", ["doctor-bcache-control-uml", "doctor-dmcache-control-uml"])
def test_a_healthy_cache_names_nothing(name: str) -> None:
    assert codes(name) == []


def test_sequential_bypass() -> None:
    w = window("doctor-bcache-sequential-uml")
    (c,) = doctor.diagnose(w)
    assert (c.code, c.device) == ("sequential-bypass", "/dev/bcache0")
    ev = dict(c.evidence)
    assert ev["bypassed_share"] >= 0.5 and ev["sequential_cutoff"] == 4 << 20
    assert c.next == "cachemgr tune /dev/bcache0 sequential_cutoff=0"
    # the same window with sequential_cutoff 0 in the second read names nothing: the cause
    # rests on the tunable, not on the bypass alone
    import dataclasses

    after = w.after
    b = dataclasses.replace(after.backings[0], sequential_cutoff=None)
    w2 = dataclasses.replace(w, after=dataclasses.replace(after, backings=(b,)))
    assert doctor.diagnose(w2) == []


def test_mode_none() -> None:
    (c,) = doctor.diagnose(window("doctor-bcache-none-uml"))
    assert (c.code, c.device, dict(c.evidence)["mode"]) == ("mode-left", "/dev/bcache0",
                                                            "none")
    assert c.next == "cachemgr mode /dev/bcache0 writethrough"


def test_congestion_bypass() -> None:
    (c,) = doctor.diagnose(window("doctor-bcache-congestion-uml"))
    assert (c.code, c.device) == ("congestion-bypass", "/dev/bcache0")
    ev = dict(c.evidence)
    assert ev["cache_read_us"] > ev["congested_read_threshold_us"] == 2000
    assert ev["backing_read_us"] > ev["cache_read_us"]
    assert c.next is not None and c.next.endswith(
        "congested_read_threshold_us=0 congested_write_threshold_us=0")


def test_dirty_full() -> None:
    (c,) = doctor.diagnose(window("doctor-bcache-dirty-full-uml"))
    assert (c.code, c.device) == ("dirty-full", "/dev/bcache0")
    ev = dict(c.evidence)
    assert ev["in_use_percent"] >= doctor.WRITEBACK_CUTOFF_PERCENT - doctor.FULL_MARGIN_PERCENT
    assert ev["writeback_running"] is False
    assert c.next == "cachemgr drain /dev/bcache0"


def test_dmcache_passthrough() -> None:
    (c,) = doctor.diagnose(window("doctor-dmcache-passthrough-uml"))
    assert (c.code, c.device) == ("mode-left", "/dev/mapper/vc")
    assert c.next == "cachemgr mode /dev/mapper/vc writethrough"


def test_dmcache_cleaner() -> None:
    (c,) = doctor.diagnose(window("doctor-dmcache-cleaner-uml"))
    assert (c.code, c.device) == ("smq-not-promoting", "/dev/mapper/vc")
    ev = dict(c.evidence)
    assert ev["policy"] == "cleaner" and ev["promotions"] == 0 and ev["read_misses"] >= 64
    assert c.next is not None and c.next.startswith("dmsetup suspend vc && dmsetup reload vc")
    assert " smq 0'" in c.next and "cleaner" not in c.next


def test_writethrough_dirty() -> None:
    (c,) = doctor.diagnose(window("doctor-dmcache-writethrough-dirty-uml"))
    assert (c.code, c.device) == ("writethrough-dirty", "/dev/mapper/vc2")
    ev = dict(c.evidence)
    assert ev["dirty_blocks"] > 0 and ev["blocks_written_back_per_s"] == 0
    assert c.next == "cachemgr drain /dev/mapper/vc2"


def test_json_shape() -> None:
    (c,) = doctor.diagnose(window("doctor-dmcache-passthrough-uml"))
    doc = c.to_json()
    assert set(doc) == {"level", "code", "device", "what", "next", "evidence"}
    assert doc["level"] == "WARNING" and doc["evidence"] == {"mode": "passthrough"}


def curve_of(tmp_path: Path, span: int, block: int = 65536) -> list[sizing.Point]:
    """The miss-ratio curve (in ``block``-byte cache blocks) of a rate-1 trace of 20,000
    random 4 KiB reads over ``span`` bytes, written by the recorder's own writer."""
    path = tmp_path / "t.trace"
    dev = tr.Device(0, "/dev/mapper/vc", "dm-0", "253:0", 512 << 20)
    w = tr.Writer(path, tr.Header(block=4096, rate=1.0, devices=[dev], started=0.0))
    rnd = random.Random(45)
    for i in range(20_000):
        w.add(i * 0.0025, rnd.randrange(span // 4096) * 4096, 4096, 0, 0)
    w.close({"seconds": 50.0, "ended_by": "time"})
    h = sizing.histogram(tr.read(path), block=block, devices=[0])
    return sizing.curve(h, extra=[64 << 20])


def test_working_set_larger_than_the_cache(tmp_path: Path) -> None:
    pts = curve_of(tmp_path, 256 << 20)
    c = doctor.working_set("/dev/mapper/vc", 64 << 20, pts, "t.trace", cache="vc",
                           observed=0.2)
    assert c is not None and c.code == "working-set"
    ev = dict(c.evidence)
    assert ev["best_read_hit_ratio"] - ev["trace_read_hit_ratio"] >= doctor.WS_GAP
    assert 192 << 20 <= ev["size_that_would_do"] <= 288 << 20
    assert c.next is not None and "cachemgr replace-ssd vc --new DEV --dry-run" in c.next
    # a cache as big as the span: nothing to name
    assert doctor.working_set("/dev/mapper/vc", 288 << 20,
                              sizing.curve(sizing.histogram(tr.read(tmp_path / "t.trace"),
                                                            block=65536, devices=[0]),
                                           extra=[288 << 20]), "t.trace") is None


def test_a_working_set_that_fits_names_nothing(tmp_path: Path) -> None:
    assert doctor.working_set("/dev/mapper/vc", 64 << 20, curve_of(tmp_path, 32 << 20),
                              "t.trace") is None


def test_a_window_without_a_fold_is_said() -> None:
    """Two reads of the same capture: bcache0 read nothing between them, nothing said; the
    block counters moved but bcache's did not: said."""
    import dataclasses

    w = window("doctor-bcache-sequential-uml")
    assert doctor.unfolded(w) == []
    same = dataclasses.replace(w, after=dataclasses.replace(
        w.after, backings=w.before.backings))
    assert doctor.unfolded(same) == ["/dev/bcache0"]


def test_a_few_slow_requests_are_not_congestion() -> None:
    """The sequential window with its cache device's reads made slow: from a few of them
    (fewer than MIN_TIMED_REQUESTS) still sequential; from many, congestion."""
    from cachemgr.backends.blockdev import BlockStat

    w = window("doctor-bcache-sequential-uml")
    ssd = w.after.cache_sets[0].caches[0].identity.name
    a = w.blk_before[ssd]

    def slow(reads: int) -> doctor.Window:
        b = BlockStat(a.reads + reads, a.read_sectors, a.writes, a.write_sectors,
                      a.read_ms + 10 * reads, a.write_ms, a.queue_ms)
        return doctor.Window(w.before, w.after, w.seconds, w.blk_before,
                             {**w.blk_after, ssd: b})

    assert [c.code for c in doctor.diagnose(slow(doctor.MIN_TIMED_REQUESTS - 1))] == [
        "sequential-bypass"]
    assert [c.code for c in doctor.diagnose(slow(doctor.MIN_TIMED_REQUESTS))] == [
        "congestion-bypass"]
