"""Metrics from captured trees parse as Prometheus text and agree with status --json."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.metrics import SnapshotCollector

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def scrape(root: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs(root)))
    text = generate_latest(reg).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.mark.parametrize("fx", sorted(FIXTURES.glob("*/sys")), ids=lambda p: p.parent.name)
def test_metrics_match_status_json(fx: Path) -> None:
    m = scrape(fx)
    status = snapshot.to_json(snapshot.take(Sysfs(fx)))
    for d in status["devices"]:
        d = {**d, "device": d["device"] or d.get("backing")}  # a stopped backing device
        modes = {lab["mode"]: v for lab, v in m["cachemgr_cache_mode"]
                 if lab["device"] == d["device"]}
        assert modes[d["mode"]] == 1.0 and sum(modes.values()) == 1.0
        states = {lab["state"]: v for lab, v in m["cachemgr_cache_state"]
                  if lab["device"] == d["device"]}
        assert states[d["state"]] == 1.0 and sum(states.values()) == 1.0
        dirty = [v for lab, v in m.get("cachemgr_dirty_bytes", []) if lab["device"] == d["device"]]
        if d["dirty_bytes"] is None:
            assert dirty == []  # unknown is not exported as 0
        else:
            assert dirty == [float(d["dirty_bytes"])]
    loaded = m["cachemgr_bcache_loaded"][0][1]
    assert loaded == (1.0 if status["bcache_loaded"] else 0.0)


def test_counter_names_follow_conventions() -> None:
    m = scrape(next(FIXTURES.glob("bcache-writeback-dirty-*/sys")))
    for name in m:
        assert name.startswith("cachemgr_")
    assert "cachemgr_bcache_hits_total" in m and "cachemgr_bcache_hits" not in m


def test_missing_stats_file_is_not_exported(tmp_path: Path) -> None:
    import shutil

    src = next(FIXTURES.glob("bcache-writeback-dirty-*"))
    shutil.copytree(src, tmp_path / "t", symlinks=True)
    next((tmp_path / "t/sys").glob("devices/**/bcache/stats_total/cache_hits")).unlink()
    m = scrape(tmp_path / "t/sys")
    assert "cachemgr_bcache_hits_total" not in m
    assert "cachemgr_bcache_misses_total" in m
