"""A scrape reads what a poller reads (issue #34 item 1): the listener's collector keeps a
ScanCache, so its second scrape of the lab's 64-device capture reads no identity, no UUID or
label, no decaying stats interval and runs no ``dmsetup table``; the intervals come back at
their own pace (STATS_EVERY), and a device that changed is seen. Counted through Sysfs.read
and the dmsetup source (no timing here: benchmarks/metrics_scrape_bench.py measures time)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.backends import bcache, dmcache
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import metrics as ops_metrics
from cachemgr.procedures import metrics
from tests.unit.test_scan_budget import Clock, Counting
from tests.unit.tui_helpers import FIXTURES, unpacked

IDENTITY = ("/size", "/wwid", "/serial", "/model", "/dm/name", "/dm/uuid",
            "/backing_dev_uuid", "/label")



@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 backing devices on dm-linear slices, one cache set: a UML lab capture with
    kernel/uevent_seqnum and the dmsetup listings."""
    return unpacked("bcache-64-backing", tmp_path_factory)


@pytest.fixture
def tree(packed: Path, tmp_path: Path) -> Path:
    dst = tmp_path / packed.parent.name
    shutil.copytree(packed.parent, dst, symlinks=True)
    return dst / "sys"


def count_dmsetup(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every dmsetup listing the scans ask for from now on (table, status, info), in order
    (the kernel test counts the same way)."""
    calls: list[str] = []
    real = dmcache.default_source

    class Counted:
        def __init__(self, inner: dmcache.DmsetupSource) -> None:
            self.inner = inner

        def output(self, what: str) -> str:
            calls.append(what)
            return self.inner.output(what)

    monkeypatch.setattr(dmcache, "default_source", lambda sysfs: Counted(real(sysfs)))
    return calls


@pytest.fixture
def dmsetup_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return count_dmsetup(monkeypatch)


def scrape(col: metrics.SnapshotCollector) -> dict[tuple[str, str], float]:
    reg = CollectorRegistry()
    reg.register(col)
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, str]:
    return name, ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def bump_seqnum(root: Path) -> None:
    seq = root / "kernel" / "uevent_seqnum"
    seq.write_text(f"{int(seq.read_text()) + 1}\n")


def test_the_second_scrape_reads_nothing_that_did_not_change(
        tree: Path, dmsetup_calls: list[str]) -> None:
    s, clock = Counting(tree), Clock()
    col = ops_metrics.SnapshotCollector(s, vms=False, clock=clock)
    first = scrape(col)
    assert dmsetup_calls.count("table") == 1
    assert [r for r in s.reads if r.endswith(IDENTITY)]  # the first reads them
    assert [r for r in s.reads if "/stats_five_minute/" in r]
    s.reads.clear()
    clock.t += 15
    second = scrape(col)
    # the same tree: the same metrics, the intervals carried; and now (a second look) the
    # measured write-back traffic, none
    wb = {k: v for k, v in second.items()
          if k[0] == "cachemgr_bcache_written_back_bytes_per_second"}
    assert len(wb) == 64 and set(wb.values()) == {0.0}
    assert {k: v for k, v in second.items() if k not in wb} == first
    assert dmsetup_calls.count("table") == 1  # no uevent: the table is the one read before
    assert not [r for r in s.reads if r.endswith(IDENTITY)]
    assert not [r for r in s.reads if "/stats_" in r and "/stats_total/" not in r]
    assert [r for r in s.reads if "/stats_total/" in r]  # the counters, on every scrape
    assert col.cache.invalidations == 0
    # the intervals at their own pace
    s.reads.clear()
    clock.t += metrics.STATS_EVERY
    scrape(col)
    assert [r for r in s.reads if "/stats_five_minute/" in r]
    assert not [r for r in s.reads if r.endswith(IDENTITY)]


def test_a_changed_device_is_seen(tree: Path, dmsetup_calls: list[str]) -> None:
    """What changes without a uevent (a mode, a counter) on the next scrape; what changes
    with one (a label, a dm table) once the kernel's uevent counter moved."""
    s, clock = Counting(tree), Clock()
    col = ops_metrics.SnapshotCollector(s, vms=False, clock=clock)
    scrape(col)
    b0 = col.snapshot().backings[0]
    assert b0.device_name is not None
    lab = {"device": b0.device_name, "path": str(b0.device)}
    bdir = tree / bcache.block_dirs(s)[b0.identity.name] / "bcache"
    # a mode switch sends no uevent: seen at once
    text = (bdir / "cache_mode").read_text()
    assert "[writeback]" in text
    (bdir / "cache_mode").write_text(text.replace("[writeback]", "writeback")
                                     .replace("writethrough", "[writethrough]", 1))
    hits = bdir / "stats_total" / "cache_hits"
    hits.write_text(f"{int(hits.read_text()) + 7}\n")
    # nor does a tunable or a bypass counter; a TUI poll takes them from its last full read,
    # a scrape reads them (the listener's ScanCache keeps none: backends/scancache.py)
    (bdir / "writeback_percent").write_text("3\n")
    bhits = bdir / "stats_total" / "cache_bypass_hits"
    bhits.write_text(f"{int(bhits.read_text()) + 5}\n")
    clock.t += 1
    now = scrape(col)
    assert now[key("cachemgr_cache_mode", kind="bcache", mode="writethrough", **lab)] == 1.0
    assert now[key("cachemgr_bcache_hits_total", **lab)] == int(hits.read_text())
    assert now[key("cachemgr_bcache_writeback_percent", **lab)] == 3
    assert now[key("cachemgr_bcache_bypass_hits_total", **lab)] == int(bhits.read_text())
    # a label write sends one: read again after the counter moved, and only then
    s.reads.clear()
    (bdir / "label").write_text("vm-disk-0\n")
    clock.t += 1
    scrape(col)
    assert not s.reads[str((bdir / "label").relative_to(tree))]
    assert col.snapshot().backings[0].label != "vm-disk-0"
    bump_seqnum(tree)
    clock.t += 1
    scrape(col)
    assert col.snapshot().backings[0].label == "vm-disk-0"
    assert col.cache.invalidations == 1
    assert dmsetup_calls.count("table") == 2  # the table too, once


def test_a_scrape_without_the_counter_reads_everything(tmp_path: Path,
                                                       dmsetup_calls: list[str]) -> None:
    """A tree without kernel/uevent_seqnum: nothing is kept (never a stale answer)."""
    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "dmcache-writeback")
    s = Counting(root)
    col = ops_metrics.SnapshotCollector(s, vms=False, clock=Clock())
    scrape(col)
    scrape(col)
    assert dmsetup_calls.count("table") == 2
    assert s.reads[next(r for r in s.reads if r.endswith("/size"))] == 2


@pytest.mark.parametrize("fx", sorted(FIXTURES.glob("*/sys")), ids=lambda p: p.parent.name)
def test_the_exposition_is_prometheus_clients_byte_for_byte(fx: Path) -> None:
    """metrics.text writes what prometheus_client's generate_latest writes, on every capture
    (and a label value with a quote, a backslash and a newline: device strings are data)."""
    reg = CollectorRegistry()
    reg.register(ops_metrics.SnapshotCollector(Sysfs(fx)))
    fams = list(reg.collect())
    odd = GaugeMetricFamily("cachemgr_odd", 'a "doc" with \\ and\nnewline', labels=["x"])
    for v in ('a"b', "c\\d", "e\nf", "ü", ""):
        odd.add_metric([v], 1.5)
    for val in (0.0, 1e6, 123456789.0, 0.1, float("nan"), float("inf"), -3.0, 2**53):
        odd.add_metric([str(val)], val)
    fams.append(odd)

    class Fixed:
        def collect(self) -> list[Metric]:
            return fams

    assert metrics.text(fams) == generate_latest(Fixed())  # type: ignore[arg-type]


def test_the_app_serves_the_text_format_and_gzip() -> None:
    from tests.unit.tui_helpers import fx as capture

    reg = CollectorRegistry()
    reg.register(ops_metrics.SnapshotCollector(Sysfs(capture("bcache-writeback-dirty")),
                                           vms=False))
    app = metrics.wsgi_app(reg)
    got: list[tuple[str, list[tuple[str, str]]]] = []

    def call(**env: str) -> bytes:
        return b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", **env},
                            lambda status, headers: got.append((status, headers))))

    plain = call()
    assert got[-1][0] == "200 OK" and ("Content-Type", metrics.CONTENT_TYPE) in got[-1][1]
    assert b"cachemgr_dirty_bytes{" in plain
    assert gzip.decompress(call(HTTP_ACCEPT_ENCODING="gzip, deflate")).startswith(b"# HELP")
    assert ("Content-Encoding", "gzip") in got[-1][1]
    one = call(QUERY_STRING="name[]=cachemgr_bcache_hits_total").decode()
    assert "cachemgr_bcache_hits_total{" in one and "cachemgr_dirty_bytes" not in one
    call(REQUEST_METHOD="POST")
    assert got[-1][0].startswith("405")


def test_libvirt_is_asked_at_its_own_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first scrape asks libvirt; the next ones within VM_EVERY export that answer; a due
    scrape starts a new look in a thread and exports the last answer meanwhile."""
    import threading

    from cachemgr.backends import vms as vms_mod
    from tests.unit.tui_helpers import fx as capture

    asked: list[int] = []
    gate = threading.Event()
    second = threading.Event()  # the thread's look has begun
    real = vms_mod.scan

    def scan(*a: object, **k: object) -> object:
        asked.append(1)
        if len(asked) > 1:
            second.set()
            gate.wait(30)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(vms_mod, "scan", scan)
    clock = Clock()
    col = ops_metrics.SnapshotCollector(Sysfs(capture("vms")), clock=clock)
    first = col.snapshot()
    assert first.vms is not None and first.vms.vms and len(asked) == 1
    clock.t += metrics.VM_EVERY / 2
    assert col.snapshot().vms is first.vms and len(asked) == 1
    clock.t += metrics.VM_EVERY
    assert col.snapshot().vms is first.vms  # not waited for
    thread = col._vm_thread
    # the thread asks libvirt once it runs (under load, a moment after the scrape returned)
    assert thread is not None and second.wait(30) and len(asked) == 2
    assert col.snapshot().vms is first.vms and len(asked) == 2  # one look at a time
    gate.set()
    thread.join(30)
    after = col.snapshot().vms
    assert after is not None and after is not first.vms and after.vms == first.vms.vms



def test_drain_journals_are_found_by_one_listing(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """cachemgr_drain_running from the drain journal directory listed once: the device whose
    journal is there, and no other."""
    from cachemgr.backends import snapshot
    from cachemgr.core import state
    from cachemgr.procedures import drain
    from tests.unit.tui_helpers import fx as capture

    root = capture("bcache-writeback-dirty")
    snap = snapshot.take(Sysfs(root))
    b = snap.backings[0]
    sd = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(sd))
    (sd / "drain").mkdir(parents=True, mode=0o700)
    sd.chmod(0o700)
    (sd / "drain" / state.journal_name(drain.journal_key(b))).write_text("{}")
    assert drain._journal(b).exists()  # the name the drain itself writes
    (sd / "drain" / state.journal_name("some-other-device")).write_text("{}")
    col = ops_metrics.SnapshotCollector(Sysfs(root), vms=False, clock=Clock())
    got = {k: v for k, v in scrape(col).items() if k[0] == "cachemgr_drain_running"}
    assert got == {key("cachemgr_drain_running", kind="bcache", device=str(b.device_name),
                       path=str(b.device)): 1.0}
