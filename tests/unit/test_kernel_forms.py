"""Every kernel's forms (issue #31 item 5): dm-cache status lines of kernels before 4.2 and
of the old mq policy, bch_hprint values of kernels before 4.14, a dm-cache device whose
status line cannot be read (listed as "unknown" with its raw line, every change refused), a
cache set naming a backing device that is not there, and the kernel of a captured tree.
The samples and their sources are in tests/unit/kernel_forms.py."""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachemgr.backends import snapshot
from cachemgr.backends.dmcache import parse_status
from cachemgr.cli.main import main
from cachemgr.core.errors import KernelFormatError
from cachemgr.core.model import CacheMode, CacheState, DmCacheStatus, Size, WritebackDebug, hprint
from cachemgr.core.sysfs import Sysfs
from tests.unit.kernel_forms import (
    MQ_42_LINE,
    OLD_STATUS_LINES,
    PRE_314_LINE,
    SMQ_42_LINE,
    old_hprint,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SCHEMA = FIXTURES.parent.parent / "docs/schema/status.schema.json"
MQ_ARGS = ("random_threshold", "4", "sequential_threshold", "512",
           "discard_promote_adjustment", "1", "read_promote_adjustment", "4",
           "write_promote_adjustment", "8")

# --------------------------------------------------------------- dm-cache status lines


@pytest.mark.parametrize(("source", "line"), OLD_STATUS_LINES, ids=[x[0] for x in OLD_STATUS_LINES])
def test_status_before_4_2_with_mq_reads(source: str, line: str) -> None:
    st_ = parse_status(line)
    assert isinstance(st_, DmCacheStatus), source
    assert st_.policy == "mq" and st_.policy_args == MQ_ARGS
    assert st_.migration_threshold == 2048
    assert st_.metadata_mode is None and st_.needs_check is None  # not reported before 4.2


def test_status_before_4_2_fields_by_position() -> None:
    # telegraf's expected fields for cs-1 (dmcache_linux_test.go): the same numbers
    st_ = parse_status(OLD_STATUS_LINES[0][1])
    assert isinstance(st_, DmCacheStatus)
    assert (st_.metadata_block_sectors, st_.metadata_used, st_.metadata_total) == (8, 1018,
                                                                                  1501122)
    assert (st_.block_sectors, st_.used, st_.total) == (512, 7, 464962)
    assert (st_.read_hits, st_.read_misses, st_.write_hits, st_.write_misses) == (139, 352643,
                                                                                 15, 46)
    assert (st_.demotions, st_.promotions, st_.dirty) == (0, 7, 0)
    assert st_.mode is CacheMode.WRITEBACK
    cs2 = parse_status(OLD_STATUS_LINES[1][1])
    assert isinstance(cs2, DmCacheStatus) and cs2.mode is CacheMode.WRITETHROUGH
    assert (cs2.block_sectors, cs2.used, cs2.total, cs2.write_misses) == (128, 26, 24327168,
                                                                          524682)
    old = parse_status(OLD_STATUS_LINES[2][1])
    assert isinstance(old, DmCacheStatus)
    assert (old.demotions, old.promotions, old.dirty, old.used) == (0, 8, 0, 963)


def test_status_4_2_mq_and_smq_read() -> None:
    mq = parse_status(MQ_42_LINE)
    assert isinstance(mq, DmCacheStatus) and mq.policy_args == MQ_ARGS
    assert mq.metadata_mode == "rw" and mq.needs_check is False
    assert (mq.promotions, mq.dirty) == (367718, 0)
    smq = parse_status(SMQ_42_LINE)
    assert isinstance(smq, DmCacheStatus) and (smq.policy, smq.dirty) == ("smq", 5)


@pytest.mark.parametrize("line", [
    PRE_314_LINE,  # 3.9-3.13: no block sizes, no policy name
    OLD_STATUS_LINES[0][1] + " rw",  # one of the two trailing fields
    OLD_STATUS_LINES[0][1] + " rw - x",
    OLD_STATUS_LINES[0][1] + " needs_check rw",
])
def test_status_forms_not_read(line: str) -> None:
    with pytest.raises(KernelFormatError) as e:
        parse_status(line)
    assert line in str(e.value)


_num = st.integers(0, 2**40)


@settings(max_examples=200, deadline=None)
@given(_num, _num, _num, _num, st.lists(_num, min_size=7, max_size=7),
       st.sampled_from(["writeback", "writethrough", "passthrough"]),
       st.sampled_from([("smq", ()), ("cleaner", ()), ("mq", MQ_ARGS)]),
       st.sampled_from([(), ("rw", "-"), ("ro", "-"), ("rw", "needs_check")]))
def test_status_every_form_by_position(mdu: int, mdt: int, used: int, total: int,
                                       counters: list[int], mode: str,
                                       policy: tuple[str, tuple[str, ...]],
                                       tail: tuple[str, ...]) -> None:
    """A status line of 3.14 and later, with or without 4.2's trailing fields: every field is
    read from its position (``#dirty`` the 7th counter, never ``used``)."""
    name, args = policy
    line = " ".join(["0", "8", "cache", "8", f"{mdu}/{mdt}", "64", f"{used}/{total}",
                     *map(str, counters), "1", mode, "2", "migration_threshold", "2048", name,
                     str(len(args)), *args, *tail])
    s = parse_status(line)
    assert isinstance(s, DmCacheStatus)
    assert (s.used, s.total, s.metadata_used, s.metadata_total) == (used, total, mdu, mdt)
    assert [s.read_hits, s.read_misses, s.write_hits, s.write_misses, s.demotions,
            s.promotions, s.dirty] == counters
    assert s.mode == CacheMode(mode) and s.policy == name and s.policy_args == args
    assert s.metadata_mode == (tail[0] if tail else None)
    assert s.needs_check == ((tail[1] == "needs_check") if tail else None)


# ------------------------------------------------------------------------ bch_hprint


@pytest.mark.parametrize(("text", "old", "low", "high"), [
    ("1.10k", False, 2024, 2047),  # t/100 == 10: t in [1000, 1023], from kernels < 4.14 only
    ("99.10M", None, (99 << 20) + (1000 << 10), (100 << 20) - 1),
    ("1.1k", True, 1124, 1223),  # before 4.14: t/100 == 1
    ("1.1k", False, 1127, 1228),  # 4.14 on: t*10/1024 == 1
    ("1.1k", None, 1124, 1228),  # kernel not known: both
    ("59.9M", True, (59 << 20) + (900 << 10), (59 << 20) + (1000 << 10) - 1),
    ("59.9M", False, (59 << 20) + (922 << 10), (60 << 20) - 1),
    ("512k", False, 512 << 10, (513 << 10) - 1),  # before 4.14: no decimal from 100 up
    ("1023M", None, 1023 << 20, (1024 << 20) - 1),
    ("512", False, 512, 512),  # before 4.14: bytes, no shift
    ("0", None, 0, 0),
    ("-2.5k", True, -2048 + 500, -2048 + 599),  # a negative value's shift floors
    ("0.0k", True, 0, 102),  # 4.14 on only: read so whatever the kernel
])
def test_hprint_old_forms(text: str, old: bool | None, low: int, high: int) -> None:
    s = Size.parse_hprint(text, old=old)
    assert (s.low, s.high) == (low, high)


@pytest.mark.parametrize("text", ["1.11k", "1.20k", "100.10k", "0.10k", "1.5", "1.09k"])
def test_hprint_impossible_forms_refused(text: str) -> None:
    with pytest.raises(KernelFormatError):
        Size.parse_hprint(text)


def test_hprint_old_form_in_writeback_rate_debug() -> None:
    d = WritebackDebug.parse("rate:\t\t1.10k/sec\ndirty:\t\t59.10M\ntarget:\t\t1.2G\n"
                             "proportional:\t-2.5k\nintegral:\t0\nchange:\t\t-512/sec\n"
                             "next io:\t-35ms\n")
    assert d.rate is not None and (d.rate.low, d.rate.high) == (2024, 2047)
    assert d.dirty is not None and d.dirty.high == (60 << 20) - 1


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=0, max_value=1 << 62))
def test_old_hprint_bounds_are_exact(v: int) -> None:
    """Before 4.14: the bounds hold the value, and are the largest interval printing the
    same (old=True); not knowing the kernel still holds it; the default (4.14) reading's
    upper bound is never below it, so a safety decision on ``high`` stays safe."""
    text = old_hprint(v)
    s = Size.parse_hprint(text, old=True)
    assert s.low <= v <= s.high
    assert old_hprint(s.low) == text and old_hprint(s.high) == text
    assert old_hprint(s.high + 1) != text
    if s.low > 0:
        assert old_hprint(s.low - 1) != text
    u = Size.parse_hprint(text, old=None)
    assert u.low <= v <= u.high
    assert Size.parse_hprint(text).high >= v


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(1 << 62), max_value=-1024))
def test_old_hprint_negative_values(v: int) -> None:
    s = Size.parse_hprint(old_hprint(v), old=True)
    assert s.low <= v <= s.high


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(1 << 62), max_value=1 << 62))
def test_new_hprint_read_with_unknown_kernel(v: int) -> None:
    s = Size.parse_hprint(hprint(v), old=None)
    assert s.low <= v <= s.high


# ----------------------------------------------------- a device whose status is not read


def _tree(tmp_path: Path, capture: str) -> Path:
    dst = tmp_path / capture
    shutil.copytree(FIXTURES / capture, dst, symlinks=True)
    return dst


def _unreadable_dmcache(tmp_path: Path) -> Path:
    fx = _tree(tmp_path, "dmcache-writeback-uml")
    status = fx / "dmsetup-status.txt"
    lines = [f"vmcache: {PRE_314_LINE}" if x.startswith("vmcache: ") else x
             for x in status.read_text().splitlines()]
    status.write_text("\n".join(lines) + "\n")
    return fx


def test_unreadable_status_keeps_the_device(tmp_path: Path) -> None:
    fx = _unreadable_dmcache(tmp_path)
    snap = snapshot.take(Sysfs(fx / "sys"))
    (d,) = snap.dmcaches
    assert d.name == "vmcache" and d.state is CacheState.UNKNOWN
    assert d.raw_status == PRE_314_LINE and d.status is None and d.failure is None
    assert d.dirty_bytes is None and d.mode is CacheMode.WRITEBACK  # the table's
    assert any("vmcache" in w and PRE_314_LINE in w for w in snap.warnings)
    doc = snapshot.to_json(snap)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    (j,) = [x for x in doc["devices"] if x["kind"] == "dm-cache"]
    assert j["state"] == "unknown" and j["raw_status"] == PRE_314_LINE
    assert j["dirty_bytes"] is None and j["failure"] is None
    # a device read in full has no raw line
    good = snapshot.to_json(snapshot.take(Sysfs(FIXTURES / "dmcache-writeback-uml/sys")))
    assert [x["raw_status"] for x in good["devices"] if x["kind"] == "dm-cache"] == [None]


def test_unreadable_status_in_status_text_and_json(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fx = _unreadable_dmcache(tmp_path)
    assert main(["--sysfs-root", str(fx / "sys"), "status"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("/dev/mapper/vmcache "))
    assert "unknown" in row
    assert main(["--sysfs-root", str(fx / "sys"), "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["raw_status"] for d in data["devices"]] == [PRE_314_LINE]


@pytest.mark.parametrize("args", [
    ("mode", "vmcache", "writethrough"),
    ("mode", "/dev/mapper/vmcache", "passthrough", "--drain"),
    ("drain", "vmcache"),
    ("remove", "vmcache"),
    ("tune", "vmcache", "migration_threshold=4096"),
])
@pytest.mark.parametrize("root", [False, True])
def test_unreadable_status_refuses_every_change(tmp_path: Path, args: tuple[str, ...],
                                                root: bool, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fx = _unreadable_dmcache(tmp_path)
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    if root:
        monkeypatch.setattr(os, "geteuid", lambda: 0)
    before = (fx / "dmsetup-table.txt").read_text()
    assert main(["--sysfs-root", str(fx / "sys"), *args]) == 3
    err = capsys.readouterr().err
    assert "cannot read its dm-cache status line" in err and "nothing was changed" in err
    assert PRE_314_LINE in err
    assert (fx / "dmsetup-table.txt").read_text() == before


# ----------------------------------------------- a cache set naming a missing backing device


def test_cache_set_member_not_under_sys_block_is_a_warning(tmp_path: Path) -> None:
    fx = _tree(tmp_path, "bcache-writeback-dirty-uml")
    (cset,) = (fx / "sys/fs/bcache").glob("*-*-*-*-*")
    (cset / "bdev1").symlink_to("../../../devices/virtual/block/ghost/bcache")
    snap = snapshot.take(Sysfs(fx / "sys"))
    assert len(snap.backings) == 1
    (w,) = [x for x in snap.warnings if "bdev1" in x]
    assert cset.name in w and "not a block device" in w and "ghost" in w
    # the captured set alone: no such warning
    clean = snapshot.take(Sysfs(FIXTURES / "bcache-writeback-dirty-uml/sys"))
    assert not [x for x in clean.warnings if "not a block device" in x]


# ------------------------------------------------------------ the kernel of a captured tree


def test_kernel_of_a_capture_is_the_capture_s(capsys: pytest.CaptureFixture[str]) -> None:
    fx = FIXTURES / "dmcache-failed-qemu"
    meta = json.loads((fx / "meta.json").read_text())
    assert meta["kernel"] == "6.1.0-50-amd64" != platform.release()
    assert snapshot.take(Sysfs(fx / "sys")).kernel == "6.1.0-50-amd64"
    assert main(["--sysfs-root", str(fx / "sys"), "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel"] == "6.1.0-50-amd64"


def test_kernel_of_a_capture_without_one_is_null(tmp_path: Path) -> None:
    fx = _tree(tmp_path, "bcache-unattached-uml")
    meta = json.loads((fx / "meta.json").read_text())
    del meta["kernel"]
    (fx / "meta.json").write_text(json.dumps(meta))
    assert snapshot.take(Sysfs(fx / "sys")).kernel is None
    (fx / "meta.json").unlink()
    assert snapshot.take(Sysfs(fx / "sys")).kernel is None
