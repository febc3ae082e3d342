"""``cachemgr doctor``'s diagnosis (procedures/doctor.py) on captured lab trees: each
tests/fixtures/doctor-<scenario>-uml/ holds two captures of one scenario under its fio load,
``before/`` and ``after/`` a window apart (scripts/capture-doctor-fixtures.py), and the
diagnosis of the pair names the planted cause, or nothing for a control."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.doctor import block_stats
from cachemgr.procedures import doctor

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


def test_json_shape() -> None:
    (c,) = doctor.diagnose(window("doctor-dmcache-passthrough-uml"))
    doc = c.to_json()
    assert set(doc) == {"level", "code", "device", "what", "next", "evidence"}
    assert doc["level"] == "WARNING" and doc["evidence"] == {"mode": "passthrough"}
