"""One capability table for every action the gate lets in (cachemgr/ops/gate.py NEEDS,
issue #44 item 3): each command's action, the autoattach actions among them, needs a
capability its kinds declare, and an action the table does not list is refused, never let
through unchecked. Before, the gate checked only an action whose first word was a kind's
capability: create, register, replace-ssd, bench and the autoattach actions ("autoattach
setmode": its first word no capability) went through whatever the kind declared.

On copies of lab captures; the toy kind is tests/unit/test_kind_registry.py's."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from cachemgr.core.errors import AlreadyError, CacheMgrError, UsageError
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.ops import gate
from cachemgr.procedures import autoattach, kinds
from cachemgr.procedures.autoattach import Attach, Format, Register, SetMode, SetTunable
from tests.unit.test_kind_registry import SWITCHED, Toy
from tests.unit.tui_helpers import copy_capture, kernel_writes

OPS = Path(__file__).resolve().parents[2] / "cachemgr" / "ops"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))


def _actions_named_in_ops() -> set[str]:
    """The action words the command layer enters the gate (or its check before a question)
    with, as literals: gate.gate / gate.precheck / gate.check (SUBJECT, "ACTION"),
    _checked(SUBJECT, "ACTION"), _owning(J, "ACTION")."""
    found: set[str] = set()
    for path in OPS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            f = node.func
            ours = (isinstance(f, ast.Attribute) and f.attr in (
                "gate", "precheck", "check", "_checked") and isinstance(f.value, ast.Name)
                and f.value.id in ("gate", "gate_mod", "cache_ops")) or (
                isinstance(f, ast.Name) and f.id in ("_checked", "_owning"))
            arg = node.args[1]
            if ours and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def test_every_action_the_commands_name_is_in_the_table() -> None:
    named = _actions_named_in_ops()
    # the autoattach actions' words are made from their classes (ops/autoattach.py act)
    named |= {f"autoattach {c.__name__.lower()}" for c in (Attach, SetMode, SetTunable)}
    assert {"create bcache", "create dm-cache", "register", "bench", "replace-ssd",
            "assemble dm-cache", "autoattach register", "autoattach format"} <= named, named
    assert named - set(gate.NEEDS) == set()
    assert {c for c in gate.NEEDS.values() if c is not None} <= kinds.ACTIONS


def test_an_action_the_table_does_not_list_is_refused_not_let_through() -> None:
    with pytest.raises(ValueError, match="no capability for the action 'frobnicate'"), \
            gate.gate(gate.of_names("/dev/x", ["disk-x"]), "frobnicate"):
        pass
    with pytest.raises(ValueError, match="frobnicate"):
        gate.precheck(gate.of_names("/dev/x", ["disk-x"]), "frobnicate")


@pytest.mark.parametrize("action", ["create bcache", "register", "autoattach register",
                                    "autoattach format", "assemble dm-cache"])
def test_a_kind_yet_to_be_made_is_asked_for_its_capability(action: str) -> None:
    """create, register and assemble make an object where there is none: the gate asks the
    kind's class, in the words of an object's refusal (exit 2, nothing changed)."""
    cap = gate.NEEDS[action]
    with pytest.raises(UsageError) as exc, gate.gate(gate.of_disks(["/dev/x"], Toy), action):
        pass
    assert exc.value.message == f"/dev/x: cachemgr cannot {cap} a toy cache; nothing was changed"
    assert exc.value.hint == "a toy cache can: mode"
    made = (kinds.Bcache, kinds.BcacheSet) if cap != "assemble" else (kinds.DmCache,)
    assert gate.precheck(gate.of_disks(["/dev/x"], *made), action) == []  # they declare it


@pytest.mark.parametrize("action,cap", [
    (Register("sdb", "wwn-b", "p", "backing"), "register"),
    (SetMode("sdb", "wwn-b", "p", "writethrough"), "mode"),
    (SetTunable("sdb", "wwn-b", "p", "writeback_percent", 40), "tune"),
])
def test_the_autoattach_actions_pass_the_capability_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: autoattach.Action,
        cap: str) -> None:
    """The udev worker's and the boot pass's actions on a bcache device are refused by
    name (exit 2, nothing written) when its kind does not declare what they need, as the
    admin's own commands are: they went through before, to bcache's functions."""
    writes = kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    view = autoattach.take_view(sysfs, udev=None, probe=None, lvm=False)
    (b,) = view.snapshot.backings
    action = dataclasses.replace(action, device=b.identity.name)
    monkeypatch.setattr(kinds.Bcache, "actions", kinds.Bcache.actions - {cap})
    with pytest.raises(UsageError, match=f"cannot {cap}"):
        autoattach_ops.act(sysfs, view, action)
    assert writes == []


def test_the_autoattach_actions_are_the_kinds_own_and_a_kind_that_declares_none_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ops/autoattach.py asks the registry which kind an action is for (the kind that
    registers a disk of its superblock role, the cached device on its disk, the cache it
    attaches to) and has that kind do it: the test-only kind, which declares a mode and
    nothing else, is switched, and refused by name (exit 2, nothing written) the register,
    attach and tune it does not declare."""
    writes = kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    SWITCHED.clear()
    kinds.register(Toy)
    try:
        view = autoattach.take_view(sysfs, udev=None, probe=None, lvm=False)
        (c,) = view.snapshot.cache_sets
        for action, words in (
                (Register("toy0", "toy0", "p", "toy"),
                 "/dev/toy0: cachemgr cannot register a toy cache; nothing was changed"),
                (Attach("toy0", "toy0", "p", c.uuid),
                 "/dev/toy0 is a toy cache: cachemgr cannot attach it; nothing was changed"),
                (SetTunable("toy0", "toy0", "p", "writeback_percent", 40),
                 "/dev/toy0 is a toy cache: cachemgr cannot tune it; nothing was changed")):
            with pytest.raises(UsageError) as exc:
                autoattach_ops.act(sysfs, view, action)
            assert exc.value.message == words
            assert exc.value.hint == "a toy cache can: mode"
        autoattach_ops.act(sysfs, view, SetMode("toy0", "toy0", "p", "writethrough"))
        assert SWITCHED == [("/dev/toy0", CacheMode.WRITETHROUGH)]
        with pytest.raises(CacheMgrError, match="no cache kind registers a flash disk"):
            autoattach_ops.act(sysfs, view, Register("toy0", "toy0", "p", "flash"))
    finally:
        kinds.unregister(Toy)
    assert writes == []


def test_the_bcache_actions_write_what_they_wrote_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kernel writes as when ops/autoattach.py called bcache's functions: the
    backing device's cache_mode and tunable, the register file; a format runs make-bcache
    -C on the disk (the bucket the kernel takes), then registers it."""
    writes = kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    view = autoattach.take_view(sysfs, udev=None, probe=None, lvm=False)
    (b,) = view.snapshot.backings
    name = b.identity.name
    autoattach_ops.act(sysfs, view, SetMode(name, name, "p", "writethrough"))
    autoattach_ops.act(sysfs, view, SetTunable(name, name, "p", "writeback_percent", 40))
    with pytest.raises(AlreadyError):  # the capture's backing device is attached
        autoattach_ops.act(sysfs, view, Attach(name, name, "p", b.cset_uuid or ""))
    ran: list[dict[str, object]] = []
    monkeypatch.setattr("cachemgr.backends.bcache.make_bcache", lambda **kw: ran.append(kw))
    monkeypatch.setattr("cachemgr.backends.bcache.device_bytes", lambda sysfs, node: 1 << 30)
    autoattach_ops.act(sysfs, view, Format("sdz", "sdz", "p", None))
    autoattach_ops.act(sysfs, view, Register("sdy", "sdy", "p", "backing"))
    assert [w for _, w in writes] == ["writethrough", "40", "/dev/sdz", "/dev/sdy"]
    assert writes[0][0].endswith("/bcache/cache_mode")
    assert writes[1][0].endswith("/bcache/writeback_percent")
    assert writes[2][0] == writes[3][0] == "fs/bcache/register"
    assert ran == [{"cache": "/dev/sdz", "bucket": None}]  # 1 GiB: make-bcache's bucket


def test_the_data_losing_verbs_are_the_kinds_and_the_test_only_kind_has_none(
        tmp_path: Path) -> None:
    """force-run and stop-set are a kind's verbs (Kind.force_run, Kind.stop_set, handed
    AcceptDataLoss by the command once it has asked): a kind that declares neither refuses
    them by name, nothing done."""
    from cachemgr.core.model import AcceptDataLoss

    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))
    toy = Toy(next(iter(Toy.scan(sysfs))))
    for verb, word in ((toy.force_run, "force-run"), (toy.stop_set, "stop-set")):
        with pytest.raises(UsageError) as exc:
            verb(sysfs, AcceptDataLoss.I_ACCEPT_DATA_LOSS)
        assert exc.value.message == (f"/dev/toy0 is a toy cache: cachemgr cannot {word} it; "
                                     "nothing was changed")
