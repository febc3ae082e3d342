"""LVM-owned caches and dm-writecache on a lab capture (tests/fixtures/lvm-caches-*: lvm2's
own cache pool, cachevol and writecache, with ``lvs.json`` beside ``dmsetup-*.txt``), and the
parsers on made-up input. Everything that changes a cache is proven in
tests/kernel/test_lvm_kernel.py; here: what is shown, how targets resolve, and the refusals
that come before any lvm2 command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachemgr.backends import dmwritecache, snapshot
from cachemgr.backends.lvm import command as lvm_command
from cachemgr.backends.lvm.command import spelling as lvm_spelling
from cachemgr.backends.lvm.report import cached_lvs
from cachemgr.cli.main import main
from cachemgr.core.errors import KernelFormatError, UsageError
from cachemgr.core.model import CacheMode, CacheState, DmWritecacheTable
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import render
from cachemgr.procedures import kinds
from tests.unit.guards import mutations_refused

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CAPTURES = sorted(FIXTURES.glob("lvm-caches-*"))


def test_there_is_a_capture() -> None:
    assert CAPTURES, "no lvm-caches capture (scripts/capture-fixtures.sh lvm-caches)"


@pytest.fixture(params=CAPTURES, ids=lambda p: p.name)
def fx(request: pytest.FixtureRequest) -> Path:
    p: Path = request.param
    return p


def rows(fx: Path) -> list[dict[str, object]]:
    return lvm_command.parse_report((fx / "lvs.json").read_text())


def test_snapshot_joins_lvm_to_the_dm_devices(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    by = {d.lvm.full_name: d for d in (*snap.dmcaches, *snap.writecaches) if d.lvm}
    assert set(by) == {"vg0/vm1", "vg0/vm2", "vg0/vm3"}, snap.warnings
    vm1, vm2, vm3 = by["vg0/vm1"], by["vg0/vm2"], by["vg0/vm3"]
    r = {str(x["lv_full_name"]): x for x in rows(fx)}
    # vm1: cache pool, writeback (clean again when captured; dirty LVM caches: kernel tests)
    assert vm1.lvm is not None and vm1.lvm.segtype == "cache"
    assert vm1.lvm.pool == "pool_cpool" and vm1.lvm.pool_name == "pool"
    assert vm1.lvm.pool_kind == "cachepool"
    assert vm1.lvm.cache_mode == r["vg0/vm1"]["cache_mode"] == "writeback"
    assert vm1.mode is CacheMode.WRITEBACK and vm1.status is not None
    assert vm1.status.write_hits > 0 and vm1.status.used > 0
    assert vm1.state is (CacheState.DIRTY if vm1.status.dirty else CacheState.CLEAN)
    assert vm1.lvm.policy == "smq" and vm1.lvm.chunk_bytes == 65536
    assert vm1.lvm.origin_pvs == ("/dev/mapper/slow",)
    assert vm1.lvm.cache_pvs and all(p.startswith("/dev/") for p in vm1.lvm.cache_pvs)
    # vm2: cachevol, writethrough
    assert vm2.lvm is not None and vm2.lvm.pool_kind == "cachevol"
    assert vm2.lvm.pool == "fast2_cvol" and vm2.lvm.pool_name == "fast2"
    assert vm2.mode is CacheMode.WRITETHROUGH and vm2.lvm.cache_mode == "writethrough"
    # vm3: writecache, high_watermark 60, dirty blocks (below the watermark: kept)
    assert vm3.lvm is not None and vm3.lvm.kind == "lvm-writecache"
    assert vm3.lvm.setting("high_watermark") == "60"
    assert vm3 in snap.writecaches and vm3.status is not None
    assert vm3.status.dirty > 0 and vm3.state is CacheState.DIRTY
    assert vm3.dirty_bytes == vm3.status.dirty * vm3.block_bytes


def test_status_json_and_table(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    j = snapshot.to_json(snap)
    lvmdevs = {d["lvm"]["name"]: d for d in j["devices"] if d.get("lvm")}
    wc = lvmdevs["vg0/vm3"]
    assert wc["kind"] == "dm-writecache" and wc["mode"] == "writeback"
    assert wc["high_watermark"] == 60 and wc["low_watermark"] == 45
    assert wc["dirty_blocks"] == wc["total_blocks"] - wc["free_blocks"] > 0
    assert wc["lvm"]["pool"] == "vg0/fast3_cvol"
    c = lvmdevs["vg0/vm1"]
    assert c["kind"] == "dm-cache" and c["lvm"]["pool_name_when_split"] == "vg0/pool"
    assert c["lvm"]["origin_pvs"] == ["/dev/mapper/slow"]
    json.dumps(j)  # serialisable
    table = render.status_table(snap)
    for words in ("vg0/vm1", "vg0/vm3", "lvmcache vg0/vm1", "lvm writecache vg0/vm3",
                  "cachevol vg0/fast2 ", "watermarks 60/45%"):
        assert words in table, table
    # the cachevol by the name it was given (lvs's hidden fast2_cvol is lvm2's own)
    assert "_cvol" not in table and "_cpool" not in table, table


@pytest.mark.parametrize("spelling", ["vg0/vm1", "/dev/vg0/vm1", "/dev/mapper/vg0-vm1",
                                      "vg0-vm1"])
def test_every_spelling_of_an_lv_resolves(fx: Path, spelling: str) -> None:
    sysfs = Sysfs(fx / "sys")
    dev = kinds.resolve(snapshot.take(sysfs), spelling, sysfs)
    assert isinstance(dev, kinds.LvmCache) and dev.name == "lvmcache"
    assert dev.node == "/dev/vg0/vm1" and dev.lv.full_name == "vg0/vm1"


def test_writecache_resolves_as_lvm_writecache(fx: Path) -> None:
    sysfs = Sysfs(fx / "sys")
    dev = kinds.resolve(snapshot.take(sysfs), "vg0/vm3", sysfs)
    assert isinstance(dev, kinds.LvmWritecache) and dev.name == "lvm-writecache"
    assert dev.modes == (CacheMode.WRITEBACK,)


@pytest.mark.parametrize(("args", "code", "words"), [
    (("mode", "vg0/vm3", "writethrough"), 2, "only has writeback"),
    (("mode", "vg0/vm1", "writearound"), 2, "lvmcache has no cache mode 'writearound'"),
    (("mode", "/dev/vg0/vm1", "none"), 2, "passthrough is its none"),
    (("tune", "vg0/vm1", "high_watermark=50"), 2, "unknown lvmcache tunable"),
    (("tune", "vg0/vm3", "migration_threshold=2048"), 2, "unknown lvm-writecache tunable"),
    (("tune", "vg0/vm3", "high_watermark=101"), 2, "out of range"),
    (("attach", "vg0/vm1", "vg0/pool", "--mode", "writearound"), 2, "does not apply"),
    (("attach", "vg0/vm1", "vg0/fast", "--writecache", "--mode", "writeback"), 2,
     "does not apply"),
    (("attach", "vg0/bad name", "vg0/pool"), 2, "is not an LVM name"),
    (("attach", "/dev/sdb", "/dev/sdc", "--writecache"), 2, "apply to LVM caches"),
])
def test_refusals_before_any_lvm_command(fx: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str],
                                         args: tuple[str, ...], code: int, words: str) -> None:
    refused = mutations_refused(monkeypatch)
    assert main(["--sysfs-root", str(fx / "sys"), *args]) == code
    err = capsys.readouterr().err
    assert words in err, err
    assert refused == []


# ------------------------------------------------------------------- parsers


@pytest.mark.parametrize(("text", "want"), [
    ("vg0/vm1", "vg0/vm1"), ("/dev/vg0/vm1", "vg0/vm1"), ("/dev/mapper/vg0-vm1", "vg0/vm1"),
    ("/dev/mapper/my--vg-lv--1", "my-vg/lv-1"), ("/dev/sdb", None),
    ("/dev/disk/by-id/x", None), ("/dev/bcache/by-uuid", None), ("/dev/mapper/slow", None),
    ("a/b/c", None), ("vg0/", None),
])
def test_lvm_spelling(text: str, want: str | None) -> None:
    assert lvm_spelling(text) == want


@pytest.mark.parametrize("bad", ["vg0", "vg0/-x", "vg0/a b", "vg0/a;b", "../x", "vg0/..",
                                 "vg0/a\nb", "vg0/" + "a" * 200])
def test_check_vg_lv_refuses(bad: str) -> None:
    with pytest.raises(UsageError):
        lvm_command.check_vg_lv(bad)


def test_report_rows_follow_devices_to_the_pvs() -> None:
    def row(name: str, **kw: str) -> dict[str, object]:
        return {"vg_name": "vg", "lv_name": name, "lv_full_name": f"vg/{name.strip('[]')}",
                **kw}
    rows = [
        row("vm", segtype="cache", origin="[vm_corig]", pool_lv="[p_cpool]",
            lv_dm_path="/dev/mapper/vg-vm", cache_mode="writeback", cache_policy="smq",
            cache_settings="migration_threshold=4096", chunk_size="65536", lv_uuid="u"),
        row("[vm_corig]", segtype="linear", devices="/dev/sda(0),/dev/sdb(10)"),
        row("[vm_corig]", segtype="linear", devices="/dev/sdc(0)"),  # a second segment
        row("[p_cpool]", segtype="cache-pool", lv_layout="cache,pool",
            devices="p_cpool_cdata(0)", metadata_devices="p_cpool_cmeta(0)"),
        row("[p_cpool_cdata]", segtype="linear", devices="/dev/nvme0n1(0)"),
        row("[p_cpool_cmeta]", segtype="linear", devices="/dev/nvme1n1(0)"),
    ]
    got = cached_lvs(rows)["/dev/mapper/vg-vm"]
    assert got.origin_pvs == ("/dev/sda", "/dev/sdb", "/dev/sdc")
    assert got.cache_pvs == ("/dev/nvme0n1", "/dev/nvme1n1")
    assert got.settings == (("migration_threshold", "4096"),) and got.chunk_bytes == 65536
    # a loop in devices (a broken report) ends
    rows.append(row("[x]", devices="y(0)"))
    rows.append(row("[y]", devices="x(0)"))
    rows[1] = row("[vm_corig]", devices="x(0)")
    assert cached_lvs(rows)["/dev/mapper/vg-vm"].origin_pvs == ("/dev/sdc",)


@given(st.text(max_size=300))
def test_parse_report_returns_rows_or_a_typed_error(text: str) -> None:
    try:
        out = lvm_command.parse_report(text)
    except KernelFormatError:
        return
    assert isinstance(out, list) and all(isinstance(r, dict) for r in out)
    cached_lvs(out)  # never raises on any rows


@pytest.mark.parametrize(("line", "args", "settings"), [
    ("0 614400 writecache s 253:2 253:1 4096 0", (), {}),
    ("0 614400 writecache s 253:2 253:1 4096 3 high_watermark 60 cleaner", (
        "high_watermark", "60", "cleaner"), {"high_watermark": "60", "cleaner": "1"}),
    ("0 8 writecache p /dev/pmem0 /dev/sdb 4096 2 low_watermark 10", (
        "low_watermark", "10"), {"low_watermark": "10"}),
])
def test_writecache_table(line: str, args: tuple[str, ...], settings: dict[str, str]) -> None:
    t = dmwritecache.parse_table(line)
    assert isinstance(t, DmWritecacheTable) and t.args == args and t.settings() == settings
    assert t.block_bytes == 4096


@pytest.mark.parametrize("bad", [
    "0 8 writecache x 253:2 253:1 4096 0", "0 8 writecache s 253:2 253:1 4096 2 a",
    "0 8 cache s 1:1 1:2 4096 0", "0 8 writecache s zz 253:1 4096 0",
    "0 8 writecache s 253:2 253:1 4096 1 rm;-rf",
])
def test_writecache_table_refuses(bad: str) -> None:
    with pytest.raises(KernelFormatError):
        dmwritecache.parse_table(bad)


def test_writecache_status() -> None:
    s = dmwritecache.parse_status("0 614400 writecache 0 25500 20380 0 0 0 5120 0 0 0 5120 0 0 0")
    assert not isinstance(s, str)
    assert (s.total, s.free, s.writeback, s.dirty) == (25500, 20380, 0, 5120)
    assert s.counter(0) == 0 and s.counter(2) == 5120 and s.counter(99) is None
    assert dmwritecache.parse_status("0 8 writecache Fail") == "Fail"
    old = dmwritecache.parse_status("0 8 writecache 0 100 90 1")  # an old kernel: 4 numbers
    assert not isinstance(old, str) and old.dirty == 10 and old.counters == ()
    for bad in ("0 8 writecache 0 1", "0 8 writecache a b c d", "0 8 linear"):
        with pytest.raises(KernelFormatError):
            dmwritecache.parse_status(bad)
