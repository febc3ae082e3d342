"""``cachemgr status`` holds its columns on every captured tree (issue #32 items 2 and 6).

The text is rendered through the CLI in this process for every capture in tests/fixtures
(the ``*/sys`` trees and the packed 64-backing one), with and without ``--stats``, and parsed
by its header: a left-aligned column's cells start where its heading starts, a right-aligned
(numeric) column's cells end where its heading ends, and a space separates every cell from
the next, so no column runs into another. No cell says "None", shows a negative number or a
rate (bcache's ``writeback_rate`` is a controller setting, not traffic: issue #34 measures
traffic), and no LVM-internal sub-LV (``*_cdata``, ``*_cmeta``, ``*_cpool``, ``*_cvol``) is
named anywhere in the text. Cache sets come first, each with its backing devices under it
(``├``/``└``), then the device-mapper caches. ``status --json`` names every block device one
way only (``/dev/mapper/NAME``, never also ``/dev/dm-N``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cachemgr.backends import bcache
from cachemgr.backends.dmcache.refusals import lvm_name
from cachemgr.cli.main import main
from cachemgr.core.model import BcacheBacking, DmCacheDevice, DmWritecacheDevice, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.render import cell_width, status_table
from tests.unit.tui_helpers import FIXTURES, copy_capture, unpacked

PACKED = "bcache-64-backing"  # tests/fixtures/bcache-64-backing-uml.tar.xz
CAPTURES = [*sorted(p.parent.name for p in FIXTURES.glob("*/sys")), f"{PACKED}-uml"]
RIGHT = {"DIRTY", "RHIT5m", "RHIT", "WHIT", "ERR"}  # numbers: right-aligned
HEADS = ["DEVICE", "BACKING", "MODE", "STATE", "DIRTY", "RHIT", "WHIT", "ERR", "CACHE"]
SUB_LV = re.compile(r"_cdata|_cmeta|_cpool|_cvol")


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpacked(PACKED, tmp_path_factory)


def root_of(name: str, packed_root: Path) -> Path:
    return packed_root if name.startswith(PACKED) else FIXTURES / name / "sys"


def run(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> str:
    assert main(["--sysfs-root", str(root), "status", *argv]) == 0
    return capsys.readouterr().out


# ----------------------------------------------------------------------------- parsing


def columns(header: str) -> list[tuple[str, int, int]]:
    """(heading, start, end) of every heading, left to right."""
    return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", header)]


def cells(row: str, cols: list[tuple[str, int, int]]) -> list[str]:
    """The row's cells, read by the header: fails when a cell leaves its column."""
    begin: list[int] = []
    for name, start, end in cols:
        if name in RIGHT:  # ends exactly where its heading ends; one word (a number, -, ?)
            assert end == len(row) or row[end] == " ", f"{name} runs into the next: {row!r}"
            m = re.search(r"\S+$", row[:end])
            assert m is not None, f"no {name} in {row!r}"
            begin.append(m.start())
        else:  # starts exactly where its heading starts
            assert start == 0 or row[start - 1] == " ", f"{name} is run into: {row!r}"
            assert row[start:start + 1].strip(), f"{name} does not start at its column: {row!r}"
            begin.append(start)
    out = []
    for i, (name, _start, _end) in enumerate(cols):
        stop = begin[i + 1] if i + 1 < len(cols) else len(row)
        if i + 1 < len(cols):
            assert stop > begin[i] and row[stop - 1] == " ", \
                f"{name} and {cols[i + 1][0]} touch: {row!r}"
        out.append(row[begin[i]:stop].strip())
    return out


def table(out: str, snap: Snapshot) -> tuple[list[str], list[list[str]]]:
    """The header's headings and every row's cells (one row per cache set, cached device and
    device of a registered kind)."""
    lines = out.splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("DEVICE "))
    cols = columns(lines[i])
    n = (len(snap.cache_sets) + len(snap.backings) + len(snap.dmcaches)
         + len(snap.writecaches) + sum(1 for k in cache_ops.others(snap) if k.cached_device))
    rows = [cells(x, cols) for x in lines[i + 1:i + 1 + n]]
    return [c[0] for c in cols], rows


def ratio(hits: int | None, misses: int | None) -> str:
    total = (hits or 0) + (misses or 0)
    return "-" if hits is None or misses is None or not total else f"{100 * hits / total:.0f}%"


def device_name(x: BcacheBacking | DmCacheDevice | DmWritecacheDevice) -> str:
    if isinstance(x, BcacheBacking):
        return x.device or "(stopped)"
    return x.lvm.full_name if x.lvm else x.node


# ----------------------------------------------------------------------------- the table


@pytest.mark.parametrize("stats", [False, True], ids=["plain", "stats"])
@pytest.mark.parametrize("name", CAPTURES)
def test_the_table_holds_its_columns(name: str, stats: bool, packed: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = root_of(name, packed)
    out = run(capsys, root, *(["--stats"] if stats else []))
    snap = cache_ops.status(Sysfs(root), probe_unregistered=True, stats=stats)
    heads, rows = table(out, snap)
    assert heads == ([*HEADS[:5], "RHIT5m", *HEADS[5:]] if stats else HEADS), out
    for row in rows:
        for cell in row:
            assert cell, f"an empty cell: {row}"
            assert "None" not in cell, f"None shown: {row}"
            assert not re.match(r"-\d", cell), f"a negative figure: {row}"
            assert not cell.endswith("/s"), f"a rate: {row}"
    assert not SUB_LV.search(out), out  # nowhere: table, detail lines, findings

    # the tree: each cache set, then its backing devices under it; then the others
    at = 0
    for c in snap.cache_sets:
        assert rows[at][0] == f"cset {c.uuid[:8]}", out
        mine = [b for b in snap.backings if b.cset_uuid == c.uuid]
        kids = rows[at + 1:at + 1 + len(mine)]
        assert [r[0][:1] for r in kids] == ["├"] * (len(mine) - 1) + ["└"] * bool(mine), out
        assert sorted(r[0][1:] for r in kids) == sorted(device_name(b) for b in mine)
        at += 1 + len(mine)
    flat = {r[0].lstrip("├└"): r for r in rows}
    for b in snap.backings:
        r = flat[device_name(b)]
        assert r[1] == b.identity.node and r[3] == b.state.value
        total = b.stats.get("total")
        assert r[heads.index("RHIT")] == (ratio(total.hits, total.misses) if total else "-")
        assert r[heads.index("WHIT")] == "-"  # bcache counts reads only
    for d in snap.dmcaches:
        r = flat[device_name(d)]
        st = d.status
        assert r[heads.index("RHIT")] == (ratio(st.read_hits, st.read_misses) if st else "-")
        assert r[heads.index("WHIT")] == (ratio(st.write_hits, st.write_misses) if st else "-")
        if d.lvm is not None:  # the PVs under the origin, the pool by the name it was given
            assert r[1] == ",".join(d.lvm.origin_pvs)
            assert r[-1] == f"{d.lvm.vg}/{d.lvm.pool_name}"
    for w in snap.writecaches:
        r = flat[device_name(w)]
        if w.lvm is not None:
            assert r[1] == ",".join(w.lvm.origin_pvs)
            assert r[-1] == f"{w.lvm.vg}/{w.lvm.pool_name}"


def test_an_lvm_cache_shows_read_and_write_hits_apart(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """lvs reported 0/0 read hits for vg0/vm1 while status said 80 % (its write hits)."""
    out = run(capsys, FIXTURES / "lvm-caches-uml" / "sys", "--no-vms")
    snap = cache_ops.status(Sysfs(FIXTURES / "lvm-caches-uml" / "sys"))
    heads, rows = table(out, snap)
    vm1 = next(r for r in rows if r[0] == "vg0/vm1")
    (d,) = [x for x in snap.dmcaches if x.lvm and x.lvm.full_name == "vg0/vm1"]
    assert d.status is not None and d.status.read_hits + d.status.read_misses == 0
    assert d.status.write_hits > 0
    assert vm1[heads.index("RHIT")] == "-" and vm1[heads.index("WHIT")].endswith("%")
    # and the detail line has the counters lvs prints as cache_read_hits/cache_read_misses
    assert (f"read hits/misses {d.status.read_hits}/{d.status.read_misses}, write "
            f"hits/misses {d.status.write_hits}/{d.status.write_misses}") in out


def test_lvm_caches_without_lvs_name_no_sub_lv(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """lvs failing leaves the dm view only; its sub-LVs are named by their pool or cachevol."""
    root = copy_capture(tmp_path, "lvm-caches")
    (root.parent / "lvs.json").write_text("# lvs: command failed\n")
    out = run(capsys, root, "--no-vms")
    assert "LVM's view not read" in out
    assert not SUB_LV.search(out), out
    assert "vg0/pool" in out and "vg0/fast2" in out and "vg0/fast3" in out


# ----------------------------------------------------------------------------- width


@pytest.mark.parametrize("width", [40, 60, 72, 80])
def test_past_the_terminal_width_names_keep_their_end(
        width: int, packed: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    snap = cache_ops.status(Sysfs(packed))
    wide = status_table(snap)
    assert max(len(x) for x in wide.splitlines()[:66]) > width  # it has to give way
    monkeypatch.setenv("COLUMNS", str(width))
    out = run(capsys, packed, "--no-vms")
    _heads, rows = table(out, snap)
    lines = out.splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("DEVICE "))
    grid = lines[i:i + 1 + len(rows)]
    if width >= 72:  # room enough for every column at its narrowest
        assert all(len(x) <= width for x in grid), "\n".join(grid)
    shown = []
    for r in rows[1:]:  # under the set: each bcache device over its dm device
        dev, backing = r[0].lstrip("├└"), r[1]
        found = [b for b in snap.backings
                 if fits(dev, b.device) and fits(backing, b.identity.node)]
        assert len(found) == 1, r  # the cut cells still name one device
        shown.append(backing)
    assert any(x.startswith("…") for x in shown), "nothing was cut"
    assert len(set(shown)) == len(shown), "a cut that keeps the start leaves them all alike"


def fits(shown: str, full: str | None) -> bool:
    """``shown`` is ``full``, or its end after an ellipsis."""
    return full is not None and (shown == full or (
        shown.startswith("…") and len(shown) > 1 and full.endswith(shown[1:])))


def test_a_name_with_a_control_character_keeps_the_grid(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from tests.unit.test_tui_hostile import ESC, hostile_dm

    root = hostile_dm(tmp_path, "vm" + ESC)
    out = run(capsys, root, "--no-vms")
    assert "\x1b" not in out
    _heads, rows = table(out, cache_ops.status(Sysfs(root)))
    assert rows and rows[0][0] == "/dev/mapper/vme\\x1b[31mr\\u202e"


def on_screen(line: str) -> str:
    """``line`` as the terminal lays it out: a wide character followed by a filler for its
    second cell, a combining one dropped (each index is then a terminal column)."""
    out = []
    for c in line:
        w = cell_width(c)
        out.append("" if w == 0 else c + "\0" * (w - 1))
    return "".join(out)


@pytest.mark.parametrize("width", [None, 60])
def test_wide_characters_keep_the_grid(width: int | None, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A dm name in CJK (two cells a character) and with a combining accent."""
    from tests.unit.test_tui_hostile import hostile_dm

    name = "東京-ディスク-e\u0301"
    root = hostile_dm(tmp_path, name)
    if width:
        monkeypatch.setenv("COLUMNS", str(width))
    out = run(capsys, root, "--no-vms")
    screen = "\n".join(on_screen(x) for x in out.splitlines())
    _heads, rows = table(screen, cache_ops.status(Sysfs(root)))
    dev = rows[0][0].replace("\0", "")
    assert dev == f"/dev/mapper/{name}".replace("\u0301", "") if width is None else \
        dev.startswith("…") and f"/dev/mapper/{name}".replace("\u0301", "").endswith(dev[1:])


# ----------------------------------------------------------------------------- JSON


def node_names(root: Path) -> dict[str, str]:
    """Every spelling /dev/... of a block device of the tree -> its kernel name."""
    sysfs = Sysfs(root)
    out = {}
    for name, rel in bcache.block_dirs(sysfs).items():
        out[f"/dev/{name}"] = name
        dm = sysfs.read_opt(f"{rel}/dm/name")
        if dm:
            out[f"/dev/mapper/{dm.strip()}"] = name
            lv = lvm_name(dm.strip())
            if "/" in lv:
                out[f"/dev/{lv}"] = name
    return out


def strings(doc: object, key: str = "") -> list[tuple[str, str]]:
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in strings(v, k)]
    if isinstance(doc, list):
        return [x for v in doc for x in strings(v, key)]
    return [(key, doc)] if isinstance(doc, str) else []


@pytest.mark.parametrize("name", CAPTURES)
def test_json_names_each_device_once(name: str, packed: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = root_of(name, packed)
    doc = json.loads(run(capsys, root, "--json", "--stats"))
    spelling = node_names(root)
    seen: dict[str, set[str]] = {}
    for key, value in strings(doc):
        if value in spelling and key != "by_uuid":
            seen.setdefault(spelling[value], set()).add(value)
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, f"named more than one way: {twice}"
    for key, value in strings(doc):  # a named dm device is never /dev/dm-N
        if re.fullmatch(r"/dev/dm-\d+", value):
            dm = Sysfs(root).read_opt(f"block/{value[5:]}/dm/name")
            assert not dm, f"{key}: {value} is /dev/mapper/{dm}"
    for c in doc["caches"]:  # the kernel's names kept, in their own field
        assert len(c["backing_kernel_names"]) == len(c["backing_devices"])
        for node, kname in zip(c["backing_devices"], c["backing_kernel_names"], strict=True):
            assert spelling.get(node) == kname
