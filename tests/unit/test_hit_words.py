"""The hit ratio words (issue #45 item 4): what the metrics' help says each counter counts is
what the kernel counts (docs/kernel-notes.md, "What the hit counters count"), and status's
RHIT for bcache is its hits over hits and misses, the bypassed reads left out, on the
captured window of a sequential reader that bcache mostly bypassed."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.metrics import SnapshotCollector

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def helps(root: Path) -> dict[str, str]:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs(root)))
    return {f.name: f.documentation
            for f in text_string_to_metric_families(generate_latest(reg).decode())}


def test_the_bcache_counters_say_reads_and_bypass() -> None:
    h = helps(FIXTURES / "doctor-bcache-sequential-uml" / "after" / "sys")
    assert "read requests only, the bypassed reads left out" in h["cachemgr_bcache_hit_ratio"]
    assert "writes are not counted" in h["cachemgr_bcache_hits"]
    assert "a partial hit is a miss" in h["cachemgr_bcache_misses"]
    assert "reads and writes" in h["cachemgr_bcache_bypassed_bytes"]
    assert h["cachemgr_bcache_bypass_hits"].startswith("Bypassed read requests")


def test_the_dmcache_counters_say_per_cache_block() -> None:
    h = helps(FIXTURES / "doctor-dmcache-passthrough-uml" / "after" / "sys")
    for k in ("read_hits", "read_misses", "write_hits", "write_misses"):
        assert "one per cache block a request covers" in h[f"cachemgr_dmcache_{k}"], k
    assert "in passthrough the origin serves them" in h["cachemgr_dmcache_read_hits"]


def test_bcache_rhit_leaves_the_bypassed_reads_out() -> None:
    b = snapshot.take(Sysfs(FIXTURES / "doctor-bcache-sequential-uml" / "after" / "sys")
                      ).backings[0]
    t = b.stats["total"]
    assert t.hits is not None and t.misses is not None and t.bypass_misses
    assert t.bypass_misses > t.hits + t.misses  # mostly bypassed
    assert t.computed_hit_ratio == t.hits / (t.hits + t.misses)
