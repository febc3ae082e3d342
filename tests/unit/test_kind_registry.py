"""The cache kinds are a registry (cachemgr/procedures/kinds): a kind that ships nowhere,
defined in this file alone, is listed by the CLI's status (text and JSON), switched through
the command layer and the gate, and refused what it cannot do, with no other file changed.
And no module of the command layer, the CLI or the TUI branches on a kind class."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends.bcache import Change
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import kinds
from cachemgr.procedures.kinds import Kind
from tests.unit.test_parity import cli as parity_cli
from tests.unit.tui_helpers import copy_capture, kernel_writes

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ToyDevice:
    name: str
    mode: CacheMode
    dirty_bytes: int


SWITCHED: list[tuple[str, CacheMode]] = []


class Toy(Kind):
    """A test-only kind: one mode switch, nothing else."""

    name = "toy"
    title = "toy cache"
    modes = (CacheMode.WRITETHROUGH, CacheMode.WRITEBACK)
    actions = frozenset({"mode"})
    obj: ToyDevice

    @classmethod
    def scan(cls, sysfs: Sysfs) -> Iterable[Any]:
        return [ToyDevice("toy0", CacheMode.WRITEBACK, 4096)]

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, ToyDevice)

    def names(self) -> set[str]:
        return {self.node, self.obj.name}

    def kernel_names(self) -> set[str]:
        return {self.obj.name}

    # its disks carry a "toy" superblock, which cachemgr cannot register (it declares no
    # register): autoattach's Register of one is refused by name
    disk_role = "toy"

    @property
    def node(self) -> str:
        return f"/dev/{self.obj.name}"

    @property
    def state_word(self) -> str:
        return "dirty" if self.obj.dirty_bytes else "clean"

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        return ((f"toy-{self.obj.name}", self.node),)

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        SWITCHED.append((self.node, mode))
        return Change(self.node, "cache_mode", self.obj.mode.value, mode.value)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    SWITCHED.clear()
    kinds.register(Toy)
    try:
        yield root
    finally:
        kinds.unregister(Toy)


def cli(root: Path, *argv: str) -> tuple[int, str, str]:
    return parity_cli(root, argv)


def test_status_lists_a_registered_kind(toy: Path) -> None:
    rc, out, err = cli(toy, "status", "--json", "--no-vms")
    assert rc == 0, err
    devices = json.loads(out)["devices"]
    mine = [d for d in devices if d["kind"] == "toy"]
    assert mine == [{"kind": "toy", "device": "/dev/toy0", "mode": "writeback",
                     "state": "dirty", "dirty_bytes": 4096, "cache": None, "owner": None}]
    assert any(d["kind"] == "bcache" for d in devices)  # the built-in kinds still there
    rc, out, err = cli(toy, "status", "--no-vms")
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("/dev/toy0"))
    assert "writeback" in line and "dirty" in line and "4.0K" in line


def test_the_gate_switches_what_the_kind_can_and_refuses_the_rest(
        toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes = kernel_writes(monkeypatch)
    rc, _out, err = cli(toy, "mode", "toy0", "writethrough")
    assert rc == 0, err
    assert SWITCHED == [("/dev/toy0", CacheMode.WRITETHROUGH)]
    for argv in (("drain", "/dev/toy0"), ("detach", "/dev/toy0"), ("remove", "/dev/toy0"),
                 ("tune", "/dev/toy0", "x=1")):
        rc, _out, err = cli(toy, *argv)
        assert rc == 2, (argv, err)
        assert f"/dev/toy0 is a toy cache: cachemgr cannot {argv[0]} it" in err, err
        assert "a toy cache can: mode" in err, err
    assert SWITCHED == [("/dev/toy0", CacheMode.WRITETHROUGH)]
    assert writes == []


@pytest.mark.parametrize("argv", [("bench", "compare", "/dev/toy0", "--runtime", "1"),
                                  ("replace-ssd", "toy0", "--dry-run"),
                                  ("replace-ssd", "/dev/toy0", "--yes")])
def test_the_bench_and_replace_ssd_refuse_what_the_kind_does_not_declare(
        toy: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]) -> None:
    """bench and replace-ssd are in the gate's one capability table (ops/gate.py NEEDS):
    a kind that declares neither is refused by name, exit 2, nothing written. Before, the
    bench's gate skipped the check and replace-ssd's subject had no kind."""
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr("os.geteuid", lambda: 0)  # a run past its root check
    rc, _out, err = cli(toy, *argv)
    verb = "bench" if argv[0] == "bench" else "replace"
    assert rc == 2, err
    assert f"/dev/toy0 is a toy cache: cachemgr cannot {verb} it" in err, err
    assert "a toy cache can: mode" in err, err
    assert writes == []


def test_a_registered_kind_is_resolved_before_bcache_and_gone_when_unregistered(
        toy: Path) -> None:
    from cachemgr.ops import cache as cache_ops

    snap = cache_ops.status(Sysfs(str(toy)))
    assert isinstance(kinds.resolve(snap, "/dev/toy0", None), Toy)
    assert isinstance(kinds.resolve(snap, "/dev/bcache0", None), kinds.Bcache)
    kinds.unregister(Toy)
    snap = cache_ops.status(Sysfs(str(toy)))
    assert snap.others == ()
    with pytest.raises(UsageError, match=r"no such device|not a bcache device"):
        kinds.resolve(snap, "/dev/toy0", None)


KIND_CLASSES = {"BcacheBacking", "CacheSet", "DmCacheDevice", "DmWritecacheDevice",
                "LvmCachedLv", "BcacheDevice", "DmCache", "LvmCache"}


def _isinstance_on_kinds(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" \
                and len(node.args) == 2:
            names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
                     for n in ast.walk(node.args[1])}
            if names & KIND_CLASSES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_the_command_layer_and_the_cli_never_branch_on_a_kind_class() -> None:
    files = [*(REPO / "cachemgr" / "ops").glob("*.py"), *(REPO / "cachemgr" / "cli").glob("*.py")]
    found = [hit for f in files for hit in _isinstance_on_kinds(f)]
    assert not found, found


def test_the_tui_lists_a_registered_kind_switches_it_and_offers_nothing_else(
        toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard lists the test-only kind's device with the columns every kind has,
    offers its one action (mode, through its kind's modes and the gate) and disables the
    ones it cannot do."""
    import asyncio

    from textual.widgets import OptionList

    from tests.unit.tui_helpers import app_on, click, settle, shown
    from tui.dialogs.choose import ChoiceDialog
    from tui.dialogs.confirm import ConfirmDialog
    from tui.widgets.devices import DeviceTable

    kernel_writes(monkeypatch)
    key = "other:toy:/dev/toy0"

    async def go() -> tuple[list[str], dict[str, bool | None], list[str]]:
        app = app_on(toy)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: app.polls > 0)
            row = next(r for r in app.rows if r.key == key)
            cells = list(row.cells())
            app.query_one(DeviceTable).select_key(key)
            await settle(pilot, lambda: app.selected_key == key)
            offered = {a: app.check_action(a, ()) for a in
                       ("mode", "drain", "detach", "remove", "tune", "attach", "bench",
                        "replace")}
            await pilot.press("m")
            await settle(pilot, lambda: shown(app, ChoiceDialog))
            screen = app.screen
            assert isinstance(screen, ChoiceDialog)
            choices = [c for c, _ in screen.choices]
            ol = screen.query_one(OptionList)
            await settle(pilot, lambda: ol.highlighted is not None)
            assert ol.highlighted is not None
            await pilot.press(*["down" if choices.index("writethrough") > ol.highlighted
                                else "up"] * abs(choices.index("writethrough")
                                                 - ol.highlighted), "enter")
            await settle(pilot, lambda: shown(app, ConfirmDialog))
            await click(pilot, "#b-switch")
            await settle(pilot, lambda: bool(SWITCHED))
            return cells, offered, choices

    cells, offered, choices = asyncio.run(go())
    assert cells[:5] == ["toy0", "-", "writeback", "dirty", "4.0K"], cells
    assert offered["mode"] is True
    assert not any(offered[a] for a in ("drain", "detach", "remove", "tune", "attach",
                                        "bench", "replace")), offered
    assert choices == ["writethrough", "writeback"]
    assert SWITCHED == [("/dev/toy0", CacheMode.WRITETHROUGH)]
