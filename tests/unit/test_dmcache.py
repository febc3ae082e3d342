"""dm-cache parsers and discovery on captured `dmsetup` outputs (tests/fixtures/dmcache-*)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachemgr.backends import dmcache, snapshot
from cachemgr.backends.dmcache import switch
from cachemgr.cli.main import main
from cachemgr.core.errors import AlreadyError, KernelFormatError, UnsafeError, UsageError
from cachemgr.core.model import CacheMode, CacheState, DmCacheStatus, DmCacheTable
from cachemgr.core.sysfs import Sysfs
from tests.unit.captures import FIXTURES, captures


def fixtures(prefix: str) -> list[Path]:
    found = captures(prefix)
    assert found, f"no capture for {prefix}"
    return found


def listing(fx: Path, what: str) -> dict[str, list[str]]:
    return dmcache.parse_listing((fx / f"dmsetup-{what}.txt").read_text(),
                                 set(dmcache.dm_devices(Sysfs(fx / "sys"))))


def by_name(fx: Path) -> dict[str, object]:
    return {d.name: d for d in snapshot.take(Sysfs(fx / "sys")).dmcaches}


# ------------------------------------------------------------------- captured outputs


@pytest.mark.parametrize("fx", fixtures("dmcache-writeback"), ids=lambda p: p.name)
def test_writeback_capture(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    (d,) = snap.dmcaches
    raw = (fx / "dmsetup-status.txt").read_text()
    line = next(x for x in raw.splitlines() if x.startswith("vmcache: "))
    toks = line.split()  # name: start len cache <md bs> <md> <bs> <used> rh rm wh wm de pr dirty
    assert d.name == "vmcache" and d.node == "/dev/mapper/vmcache"
    assert d.mode is CacheMode.WRITEBACK and d.state is CacheState.DIRTY
    assert d.status is not None
    assert d.status.dirty == int(toks[14]) > 0
    assert f"{d.status.used}/{d.status.total}" == toks[7]
    assert d.status.dirty != d.status.used  # the position, not the used count
    assert d.status.dirty_bytes == d.status.dirty * d.table.block_sectors * 512
    assert d.status.policy == "smq" and d.status.migration_threshold == 2048
    assert d.status.metadata_mode == "rw" and not d.status.needs_check
    assert not d.lvm_owned and d.uuid is None and d.open_count == 0
    # the three devices resolved to the kernel's identities by major:minor
    assert d.cache is not None and d.cache.devno == d.table.cache_dev
    assert d.metadata is not None and d.metadata.devno == d.table.metadata_dev
    assert d.origin is not None and d.origin.node == "/dev/mapper/slow"
    j = snapshot.to_json(snap)["devices"][0]
    assert j["kind"] == "dm-cache" and j["device"] == "/dev/mapper/vmcache"
    assert j["dirty_bytes"] == d.status.dirty * d.block_bytes
    assert j["cache"] == d.cache.node and j["state"] == "dirty" and j["mode"] == "writeback"


@pytest.mark.parametrize("fx", fixtures("dmcache-states"), ids=lambda p: p.name)
def test_states_capture(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    devs = {d.name: d for d in snap.dmcaches}
    # the dm-linear slices and dm-delay origins are not caches
    assert set(devs) == {"wt", "vg0-lv0", "pt", "flushing"}
    wt, lv, pt, fl = devs["wt"], devs["vg0-lv0"], devs["pt"], devs["flushing"]
    assert wt.mode is CacheMode.WRITETHROUGH and wt.state is CacheState.CLEAN
    assert wt.table.block_sectors == 256 and wt.block_bytes == 128 * 1024
    assert "metadata2" in wt.table.features
    # migration_threshold set by message: the status has it, the table does not
    assert wt.status is not None and wt.status.migration_threshold == 4096
    assert "migration_threshold" not in wt.table.policy_args
    assert lv.lvm_owned and lv.uuid is not None and lv.uuid.startswith("LVM-")
    assert lv.mode is CacheMode.WRITEBACK and lv.state is CacheState.DIRTY
    assert pt.mode is CacheMode.PASSTHROUGH and pt.status is not None and pt.status.used == 0
    assert fl.status is not None and fl.status.policy == "cleaner"
    assert fl.table.policy == "cleaner" and fl.mode is CacheMode.WRITETHROUGH
    assert fl.status.dirty > 0 and fl.status.promotions == 0  # cleaner never promotes
    j = {x["name"]: x for x in snapshot.to_json(snap)["devices"]}
    assert j["vg0-lv0"]["lvm_owned"] is True and j["wt"]["lvm_owned"] is False
    assert j["flushing"]["policy"] == "cleaner"


@pytest.mark.parametrize("fx", fixtures("dmcache-failed"), ids=lambda p: p.name)
def test_failed_capture(fx: Path) -> None:
    snap = snapshot.take(Sysfs(fx / "sys"))
    (d,) = snap.dmcaches
    assert d.failure == "Fail" and d.status is None and d.state is CacheState.FAILED
    assert d.mode is CacheMode.WRITEBACK  # from the table, still readable
    assert any("Fail" in w for w in snap.warnings)
    j = snapshot.to_json(snap)["devices"][0]
    assert j["state"] == "failed" and j["dirty_bytes"] is None  # unknown, never 0


@pytest.mark.parametrize("fx", sorted(FIXTURES.glob("*/dmsetup-status.txt")),
                         ids=lambda p: p.parent.name)
def test_every_captured_cache_line_parses(fx: Path) -> None:
    base = fx.parent
    tables = listing(base, "table")
    statuses = listing(base, "status")
    for name, lines in tables.items():
        for i, line in enumerate(lines):
            if line.split()[2] != "cache":
                continue
            t = dmcache.parse_table(line)
            assert t.line() == line.strip()  # renders back exactly
            s = dmcache.parse_status(statuses[name][i])
            if isinstance(s, DmCacheStatus):
                assert s.block_sectors == t.block_sectors
                assert s.mode == t.mode


def test_no_dm_devices_runs_nothing() -> None:
    fx = fixtures("bcache-writeback-dirty")[0]
    assert dmcache.scan(Sysfs(fx / "sys")) == dmcache.DmCacheScan((), ())


# ------------------------------------------------------------------- status parser

FEATURE = st.sampled_from(["writeback", "writethrough", "passthrough", "metadata2",
                           "no_discard_passdown"])
WORD = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True)
N = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def status_parts(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    v: dict[str, object] = {
        "metadata_block_sectors": draw(N), "metadata_used": draw(N), "metadata_total": draw(N),
        "block_sectors": draw(N), "used": draw(N), "total": draw(N),
        "read_hits": draw(N), "read_misses": draw(N), "write_hits": draw(N),
        "write_misses": draw(N), "demotions": draw(N), "promotions": draw(N), "dirty": draw(N),
        "features": tuple(draw(st.lists(FEATURE, max_size=3))),
        "core_args": tuple(draw(st.lists(st.tuples(WORD, N.map(str)), max_size=2))),
        "policy": draw(st.sampled_from(["smq", "cleaner", "mq"])),
        "policy_args": tuple(draw(st.lists(WORD | N.map(str), max_size=4))),
        "metadata_mode": draw(st.sampled_from(["rw", "ro"])),
        "needs_check": draw(st.booleans()),
    }
    core = [x for kv in v["core_args"] for x in kv]  # type: ignore[attr-defined]
    toks = [str(v["metadata_block_sectors"]), f"{v['metadata_used']}/{v['metadata_total']}",
            str(v["block_sectors"]), f"{v['used']}/{v['total']}",
            *(str(v[k]) for k in ("read_hits", "read_misses", "write_hits", "write_misses",
                                  "demotions", "promotions", "dirty")),
            str(len(v["features"])), *v["features"],  # type: ignore[arg-type]
            str(len(core)), *core, str(v["policy"]),
            str(len(v["policy_args"])), *v["policy_args"],  # type: ignore[arg-type]
            str(v["metadata_mode"]), "needs_check" if v["needs_check"] else "-"]
    sep = draw(st.sampled_from([" ", "  ", "\t"]))
    line = f"0 {draw(N)} cache " + sep.join(toks) + draw(st.sampled_from(["", " ", "\n"]))
    return line, v


@given(status_parts())
def test_status_any_valid_line_parses_to_its_numbers(parts: tuple[str, dict[str, object]]) -> None:
    line, v = parts
    s = dmcache.parse_status(line)
    assert isinstance(s, DmCacheStatus)
    assert s == DmCacheStatus(**v)  # type: ignore[arg-type]


@given(status_parts(), st.data())
def test_status_malformed_lines_raise_naming_the_line(parts: tuple[str, dict[str, object]],
                                                       data: st.DataObject) -> None:
    line, _ = parts
    toks = line.split()
    kind = data.draw(st.sampled_from(["truncate", "extend", "number", "fraction", "tail"]))
    if kind == "truncate":  # a strict prefix never parses: the parser needs what follows,
        # except the line without its trailing "rw|ro needs_check|-": the form of kernels
        # before 4.2 (docs/kernel-notes.md, "dm-cache status by kernel version"), read with
        # both fields unknown
        old = " ".join(toks[:-2])
        s = dmcache.parse_status(old)
        assert s.metadata_mode is None and s.needs_check is None
        cut = data.draw(st.integers(min_value=3, max_value=len(toks) - 1)
                        .filter(lambda c: c != len(toks) - 2))
        bad = " ".join(toks[:cut])
    elif kind == "extend":
        bad = " ".join([*toks, data.draw(WORD | N.map(str))])
    elif kind == "number":  # one of the eleven positional numbers is not a plain number
        i = data.draw(st.sampled_from([3, 5, 7, 8, 9, 10, 11, 12, 13]))
        toks[i] = data.draw(st.sampled_from(["x", "-1", "1.5", "4k", "", "+2", "０"]))
        bad = " ".join(toks)
    elif kind == "fraction":
        i = data.draw(st.sampled_from([4, 6]))
        toks[i] = data.draw(st.sampled_from(["12", "1/2/3", "/4", "a/b", "3/"]))
        bad = " ".join(toks)
    else:
        toks[-2] = data.draw(st.sampled_from(["RW", "r", "x", "0"]))
        bad = " ".join(toks)
    with pytest.raises(KernelFormatError) as exc:
        dmcache.parse_status(bad)
    assert exc.value.text == bad and repr(bad) in str(exc.value)


def test_status_fail_and_error_words() -> None:
    assert dmcache.parse_status("0 2097152 cache Fail") == "Fail"
    assert dmcache.parse_status("0 1048576 cache Error") == "Error"
    with pytest.raises(KernelFormatError):
        dmcache.parse_status("0 1048576 cache Failed")
    with pytest.raises(KernelFormatError):
        dmcache.parse_status("0 1048576 linear")


def test_status_needs_check_and_ro() -> None:
    # the healthy line captured in tests/fixtures/dmcache-writeback-uml with the tail the
    # kernel prints for read-only metadata that needs a check (cache_status:
    # DMEMIT("ro ") for CM_READ_ONLY, DMEMIT("needs_check ") when the flag is set)
    line = ("0 2097152 cache 8 23/4096 64 420/8192 0 0 1521 527 0 420 145 1 writeback "
            "2 migration_threshold 2048 smq 0 ro needs_check")
    s = dmcache.parse_status(line)
    assert isinstance(s, DmCacheStatus)
    assert s.metadata_mode == "ro" and s.needs_check and s.dirty == 145 and s.used == 420


# ------------------------------------------------------------------- table parser


@st.composite
def tables(draw: st.DrawFn) -> DmCacheTable:
    dev = st.builds(lambda a, b: f"{a}:{b}", st.integers(0, 4095), st.integers(0, 2**20))
    return DmCacheTable(
        start=draw(N), length=draw(N), metadata_dev=draw(dev), cache_dev=draw(dev),
        origin_dev=draw(dev), block_sectors=draw(N),
        features=tuple(draw(st.lists(FEATURE, max_size=3))),
        policy=draw(st.sampled_from(["smq", "cleaner"])),
        policy_args=tuple(draw(st.lists(WORD | N.map(str), max_size=4))))


@given(tables())
def test_table_roundtrip(t: DmCacheTable) -> None:
    assert dmcache.parse_table(t.line()) == t


@given(tables(), st.integers(min_value=1, max_value=8))
def test_table_truncated_raises(t: DmCacheTable, k: int) -> None:
    toks = t.line().split()
    bad = " ".join(toks[:max(3, len(toks) - k)])
    with pytest.raises(KernelFormatError) as exc:
        dmcache.parse_table(bad)
    assert exc.value.text == bad


def test_table_mode_switch_keeps_the_rest() -> None:
    t = dmcache.parse_table("0 1048576 cache 98:32 98:16 253:0 128 2 writeback "
                            "no_discard_passdown smq 2 migration_threshold 4096")
    wt = t.with_mode(CacheMode.WRITETHROUGH)
    assert wt.line() == ("0 1048576 cache 98:32 98:16 253:0 128 2 writethrough "
                         "no_discard_passdown smq 2 migration_threshold 4096")
    assert dmcache.parse_table("0 8 cache 1:2 1:3 1:4 64 0 smq 0").mode is CacheMode.WRITEBACK


def test_threshold_is_carried_into_reloads() -> None:
    t = dmcache.parse_table("0 8 cache 1:2 1:3 1:4 64 1 writeback smq 0")
    assert switch.with_threshold(t, 2048) == t  # the default: the table stays as it was
    assert switch.with_threshold(t, 8192).policy_args == ("migration_threshold", "8192")
    t2 = dmcache.parse_table("0 8 cache 1:2 1:3 1:4 64 1 writeback smq 2 "
                             "migration_threshold 4096")
    assert switch.with_threshold(t2, 4096) == t2
    assert switch.with_threshold(t2, 512).policy_args == ("migration_threshold", "512")


# ------------------------------------------------------------------- other parsers


def test_listing_names_with_colons_and_multi_targets() -> None:
    text = ("a: b: 0 8 linear 1:2 0\n"
            "a: 0 8 cache 1:2 1:3 1:4 64 0 smq 0\n"
            "multi: 0 1024 linear 98:0 0\n"
            "multi: 1024 1024 linear 98:0 4096\n")
    out = dmcache.parse_listing(text, {"a", "a: b", "multi"})
    assert out["a: b"] == ["0 8 linear 1:2 0"]
    assert out["a"] == ["0 8 cache 1:2 1:3 1:4 64 0 smq 0"]
    assert len(out["multi"]) == 2
    assert dmcache.parse_listing("No devices found\n", set()) == {}


def test_info_parser_on_capture() -> None:
    fx = fixtures("dmcache-states")[0]
    info = dmcache.parse_info((fx / "dmsetup-info.txt").read_text())
    assert info["vg0-lv0"].uuid is not None and info["vg0-lv0"].uuid.startswith("LVM-")
    assert info["wt"].uuid is None and info["wt"].open_count == 0
    assert info["o1"].open_count == 1  # held by the dm-delay device slow1
    assert info["wt"].devno is not None and ":" in info["wt"].devno


@pytest.mark.parametrize(("dm", "vg_lv"), [("vg0-lv0", "vg0/lv0"),
                                           ("my--vg-my--lv", "my-vg/my-lv"),
                                           ("vg-lv_corig", "vg/lv_corig"),
                                           ("vg-lv-real", "vg/lv")])
def test_lvm_name(dm: str, vg_lv: str) -> None:
    assert dmcache.lvm_name(dm) == vg_lv


def test_sizes() -> None:
    assert dmcache.parse_size("64k") == 65536 and dmcache.parse_size("1M") == 1 << 20
    assert dmcache.parse_size("32KiB") == 32768
    assert dmcache.parse_size("1.5M") == 3 << 19  # a multiple of 32 KiB: a valid block size
    with pytest.raises(UsageError):
        dmcache.parse_size("0.1k")  # not a whole number of bytes
    assert dmcache.default_block_bytes(128 << 20) == 64 << 10
    # 1 TiB / 64 KiB = 16 M blocks: doubled until at most a million
    assert dmcache.default_block_bytes(1 << 40) == 2 << 20
    assert dmcache.metadata_bytes_needed(128 << 20, 32 << 10) == (4 << 20) + 16 * 4096


# ------------------------------------------------------------------- refusals (no command)


def test_lvm_owned_changes_are_refused() -> None:
    d = by_name(fixtures("dmcache-states")[0])["vg0-lv0"]
    sysfs = Sysfs(fixtures("dmcache-states")[0] / "sys")
    with pytest.raises(UnsafeError) as exc:
        dmcache.set_mode(sysfs, d, CacheMode.WRITETHROUGH)  # type: ignore[arg-type]
    assert "lvchange --cachemode writethrough vg0/lv0" in str(exc.value)
    with pytest.raises(UnsafeError) as exc:
        dmcache.remove(sysfs, d)  # type: ignore[arg-type]
    assert "lvconvert --uncache vg0/lv0" in str(exc.value)
    with pytest.raises(UnsafeError) as exc:
        dmcache.flush(sysfs, d)  # type: ignore[arg-type]
    assert "lvchange --cachepolicy cleaner vg0/lv0" in str(exc.value)
    with pytest.raises(UnsafeError) as exc:
        dmcache.set_migration_threshold(sysfs, d, 4096)  # type: ignore[arg-type]
    assert "lvchange --cachesettings migration_threshold=4096 vg0/lv0" in str(exc.value)


def test_failed_cache_changes_are_refused() -> None:
    fx = fixtures("dmcache-failed")[0]
    d = by_name(fx)["failing"]
    with pytest.raises(UnsafeError, match="Fail"):
        dmcache.set_mode(Sysfs(fx / "sys"), d, CacheMode.WRITETHROUGH)  # type: ignore[arg-type]


def test_modes_and_already_so() -> None:
    fx = fixtures("dmcache-writeback")[0]
    d = by_name(fx)["vmcache"]
    with pytest.raises(UsageError, match="passthrough is dm-cache's none"):
        dmcache.set_mode(Sysfs(fx / "sys"), d, CacheMode.NONE)  # type: ignore[arg-type]
    with pytest.raises(AlreadyError):
        dmcache.set_mode(Sysfs(fx / "sys"), d, CacheMode.WRITEBACK)  # type: ignore[arg-type]


# ------------------------------------------------------------------- CLI on captures


def cli(fx: Path, *args: str) -> int:
    return main(["--sysfs-root", str(fx / "sys"), *args])


def test_cli_status_shows_dm_cache(capsys: pytest.CaptureFixture[str]) -> None:
    fx = fixtures("dmcache-states")[0]
    assert cli(fx, "status", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    kinds = {d["device"]: d["kind"] for d in data["devices"]}
    assert kinds == {f"/dev/mapper/{n}": "dm-cache" for n in ("wt", "vg0-lv0", "pt", "flushing")}
    assert cli(fx, "status") == 0
    out = capsys.readouterr().out
    assert "vg0-lv0" in out and "owned by LVM" in out and "passthrough" in out


@pytest.mark.parametrize(("args", "code", "words"), [
    (("mode", "vg0-lv0", "writethrough"), 3, "lvchange --cachemode writethrough vg0/lv0"),
    (("mode", "/dev/mapper/vg0-lv0", "passthrough", "--drain"), 3, "lvchange --cachemode"),
    (("drain", "vg0-lv0"), 3, "lvchange --cachepolicy cleaner vg0/lv0"),
    (("remove", "/dev/mapper/vg0-lv0"), 3, "lvconvert --uncache vg0/lv0"),
    (("tune", "vg0-lv0", "migration_threshold=4096"), 3, "lvchange --cachesettings"),
    (("tune", "wt", "writeback_percent=0"), 2, "unknown dm-cache tunable"),
    (("mode", "wt", "writethrough"), 4, "already in writethrough"),
    (("mode", "wt", "none"), 2, "passthrough is dm-cache's none"),
    (("mode", "wt", "writearound"), 2, "no cache mode 'writearound'"),
])
def test_cli_refusals_on_capture(capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                 code: int, words: str) -> None:
    assert cli(fixtures("dmcache-states")[0], *args) == code
    assert words in capsys.readouterr().err


def test_cli_passthrough_while_dirty_is_refused(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cli(fixtures("dmcache-writeback")[0], "mode", "vmcache", "passthrough") == 3
    err = capsys.readouterr().err
    assert "145 dirty blocks" in err and "passthrough --drain" in err
