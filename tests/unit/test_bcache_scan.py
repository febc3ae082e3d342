"""bcache discovery on captured lab trees (tests/fixtures/*/meta.json says what each is)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.model import CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs
from tests.unit.captures import FIXTURES, captures


def fixtures(prefix: str) -> list[Path]:
    found = captures(prefix)
    assert found, f"no capture for {prefix}"
    return found


def raw(base: Path, rel: str) -> str:
    return (base / "sys" / rel).read_text().strip()


@pytest.mark.parametrize("fx", fixtures("bcache-writeback-dirty"), ids=lambda p: p.name)
def test_attached_writeback_dirty(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    assert snap.bcache_loaded and not snap.warnings
    (b,) = snap.backings
    (cs,) = snap.cache_sets
    assert b.device == "/dev/bcache0"
    assert b.mode is CacheMode.WRITEBACK and b.state is CacheState.DIRTY
    assert b.cset_uuid == cs.uuid
    assert b.dirty is not None and not b.dirty.is_zero(512)
    assert b.dirty.low <= 24 << 20  # the scenario wrote 24 MiB
    assert b.writeback_running is False
    assert b.uuid == raw(fx, f"block/{b.identity.name}/bcache/backing_dev_uuid")
    assert set(b.stats) == {"five_minute", "hour", "day", "total"}
    assert cs.backing_names == (b.identity.name,)
    assert len(cs.caches) == 1 and cs.caches[0].cset_uuid == cs.uuid
    assert cs.caches[0].io_errors == 0
    j = snapshot.to_json(snap)
    assert j["schema"] == 1
    assert j["devices"][0]["dirty_bytes"] == b.dirty.low
    assert j["devices"][0]["cache"] == cs.uuid


@pytest.mark.parametrize("fx", fixtures("bcache-unattached"), ids=lambda p: p.name)
def test_unattached_backing_and_empty_cache_set(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    (b,) = snap.backings
    (cs,) = snap.cache_sets
    assert b.state is CacheState.NO_CACHE and b.cset_uuid is None
    assert b.device == "/dev/bcache0"  # a detached backing device still runs (passthrough)
    assert cs.backing_names == () and len(cs.caches) == 1
    j = snapshot.to_json(snap)
    assert j["devices"][0]["cache"] is None
    assert j["caches"][0]["backing_devices"] == []


@pytest.mark.parametrize("fx", fixtures("bcache-missing-cache"), ids=lambda p: p.name)
def test_backing_whose_cache_is_missing(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    (b,) = snap.backings
    assert snap.cache_sets == ()
    assert b.state is CacheState.DIRTY
    assert b.device is None and b.running is False
    # the kernel reads 0 here, but the dirty data is on the missing SSD: never report 0
    assert snapshot.to_json(snap)["devices"][0]["dirty_bytes"] is None


@pytest.mark.parametrize("fx", fixtures("dmcache-writeback"), ids=lambda p: p.name)
def test_no_bcache_objects(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    assert snap.backings == () and snap.cache_sets == ()


def test_missing_stats_file_is_unknown_not_a_crash(tmp_path: Path) -> None:
    import shutil

    src = fixtures("bcache-writeback-dirty")[0]
    dst = tmp_path / "t"
    shutil.copytree(src, dst, symlinks=True)
    victim = next((dst / "sys").glob("devices/**/bcache/stats_total/cache_hits"))
    victim.unlink()  # as cache_readaheads vanished in 5.13 (node_exporter#2103)
    snap = snapshot.take(Sysfs(dst / "sys"))
    assert snap.backings[0].stats["total"].hits is None
    assert snap.backings[0].stats["total"].misses is not None


def test_meta_names_the_kernel() -> None:
    for m in FIXTURES.glob("*/meta.json"):
        meta = json.loads(m.read_text())
        assert meta["kernel"] and meta["scenario"] and meta["description"]
