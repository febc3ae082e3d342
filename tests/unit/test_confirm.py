"""One confirmation rule (issue #32 item 5; docs/cli.md, "Confirmations"): every command that
can lose data or disrupt a VM shows what it would do, asks on a terminal, refuses without
one (exit 3, nothing changed) unless given --yes; the checks it can make without acting come
first; the TUI (the command layer without a question) and automation keep working.

Run as root on writable copies of the lab captures, through the CLI in this process; a
"terminal" is a stdin whose isatty() says so. Every refusal is checked to have written
nothing to the tree and run nothing (tests/unit/guards.py)."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import virsh
from cachemgr.cli.helpdoc import CONFIRMATIONS, subcommands
from cachemgr.cli.main import build_parser
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from tests.unit.guards import held_elsewhere, mutations_refused
from tests.unit.test_parity import lock_key, plant
from tests.unit.test_state_files import cli
from tests.unit.tui_helpers import FIXTURES, copy_capture, kernel_writes

REPO = Path(__file__).resolve().parents[2]
DIRTY_CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"  # bcache-writeback-dirty's cache set
FREE_CSET = "3a85497b-f234-4651-a39a-c547edabc679"  # bcache-unattached's (nothing attached)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return d


class Terminal(io.StringIO):
    """stdin on a terminal, with the operator's answer typed in."""

    def isatty(self) -> bool:
        return True


class NoStdin(io.StringIO):
    """stdin the command must not touch (the TUI owns the terminal)."""

    def isatty(self) -> bool:
        raise AssertionError("the command layer looked at stdin")

    def readline(self, *a: object) -> str:  # type: ignore[override]
        raise AssertionError("the command layer read stdin")


@dataclass(frozen=True)
class Case:
    id: str
    capture: str
    argv: tuple[str, ...]
    says: str  # a line of its plan


CASES = [
    Case("remove-bcache", "bcache-writeback-dirty", ("remove", "/dev/bcache0"),
         f"would detach /dev/bcache0 from cache set {DIRTY_CSET}: bcache first writes its "
         "4.4 MiB of dirty data back to /dev/ubda"),
    Case("remove-cache-set", "bcache-unattached", ("remove", FREE_CSET),
         f"would unregister cache set {FREE_CSET}"),
    Case("detach", "bcache-writeback-dirty", ("detach", "/dev/bcache0"),
         "then /dev/bcache0 runs on uncached"),
    Case("mode-none", "bcache-writeback-dirty", ("mode", "/dev/bcache0", "none"),
         "would switch /dev/bcache0 from writeback to none"),
    Case("mode-none-drain", "bcache-writeback-dirty",
         ("mode", "/dev/bcache0", "none", "--drain"),
         "would write its 4.4 MiB of dirty data back now"),
    Case("dm-passthrough-drain", "dmcache-writeback", ("mode", "vmcache", "passthrough",
                                                        "--drain"),
         "would switch /dev/mapper/vmcache from writeback to passthrough"),
    Case("dm-remove", "dmcache-writeback", ("remove", "vmcache"),
         "would then remove /dev/mapper/vmcache"),
    Case("dm-remove-keep", "dmcache-writeback", ("remove", "vmcache", "--keep-device"),
         "would stay, as that linear mapping"),
    Case("lvm-detach", "lvm-caches", ("detach", "vg0/vm1"), "(lvconvert --splitcache)"),
    Case("lvm-remove", "lvm-caches", ("remove", "vg0/vm1"), "(lvconvert --uncache)"),
    Case("stop-set", "bcache-writeback-dirty",
         ("stop-set", DIRTY_CSET, "--i-accept-data-loss"),
         f"would stop cache set {DIRTY_CSET} without writing its dirty data back"),
    Case("force-run", "bcache-missing-cache", ("force-run", "/dev/ubda",
                                               "--i-accept-data-loss"),
         "would start /dev/ubda without its cache"),
    Case("replace-ssd", "scsi-ssd-in-use", ("replace-ssd", "/dev/sda"),
         "replace the cache SSD /dev/sda"),
    # the VMs whose disk it is (libvirt as captured beside the tree)
    Case("remove-vm-disk", "vms", ("remove", "/dev/bcache0"),
         "/dev/bcache0 is a disk of VM vm-bc (vda, shut off)"),
    Case("mode-vm-disk", "vms", ("mode", "vc", "passthrough", "--drain"),
         "/dev/mapper/vc is a disk of VM vm-dm (vda, shut off)"),
]


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: str, argv: tuple[str, ...],
        stdin: io.StringIO) -> tuple[int, str, str, list[Any], list[Any], Path]:
    root = copy_capture(tmp_path, capture)
    writes = kernel_writes(monkeypatch)
    commands = mutations_refused(monkeypatch)
    monkeypatch.setattr(sys, "stdin", stdin)
    rc, out, err = cli(root, argv)
    assert "Traceback" not in err, err
    return rc, out, err, writes, commands, root


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_without_a_terminal_it_shows_the_plan_and_refuses(
        case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    rc, out, err, writes, commands, _ = run(tmp_path, monkeypatch, case.capture, case.argv,
                                            io.StringIO("y\n"))
    assert rc == 3, err
    assert out == ""
    cmd = " ".join(a for a in case.argv if a != "--i-accept-data-loss")
    assert err.startswith(f"cachemgr {cmd} (nothing is changed yet):\n"), err
    assert case.says in err
    assert (f"cachemgr: {cmd}: not confirmed: stdin is not a terminal, so there was nobody "
            "to ask; nothing was changed\n  hint: run it on a terminal to be asked, or pass "
            '--yes (docs/cli.md, "Confirmations")\n') in err
    assert "Go ahead?" not in err
    assert writes == [] and commands == [], (writes, commands)
    assert not (state_dir / "replace").is_dir() or not list((state_dir / "replace").iterdir())


@pytest.mark.parametrize("answer", ["n\n", "\n", "", "yes please\n"])
@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("remove-bcache", "mode-none",
                                                                "dm-remove", "replace-ssd")],
                         ids=lambda c: c.id)
def test_on_a_terminal_anything_but_yes_is_no(case: Case, answer: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = Terminal(answer)
    rc, _, err, writes, commands, _ = run(tmp_path, monkeypatch, case.capture, case.argv,
                                            stdin)
    assert rc == 3, err
    assert case.says in err and "Go ahead? [y/N] " in err
    assert err.index(case.says) < err.index("Go ahead?")  # the plan, then the question
    assert err.endswith("not confirmed; nothing was changed\n"), err
    assert stdin.tell() == len(answer)  # the answer was read
    assert writes == [] and commands == []


# the ones whose change a copied tree answers as the kernel does (tui_helpers.kernel_writes)
DONE = {"mode-none": ("cache_mode", "/dev/bcache0: cache_mode writeback -> none"),
        "detach": ("detach", f"/dev/bcache0: detached from cache set {DIRTY_CSET}"),
        "stop-set": ("stop", f"{DIRTY_CSET}: stopped (was registered)"),
        "force-run": ("running", "/dev/ubda: running 0 -> 1")}


@pytest.mark.parametrize("case", [c for c in CASES if c.id in DONE], ids=lambda c: c.id)
@pytest.mark.parametrize("how", ["terminal-y", "terminal-yes", "--yes", "-y"])
def test_yes_goes_ahead(case: Case, how: str, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = case.argv + ((how,) if how.startswith("-") else ())
    stdin = Terminal("Y\n" if how == "terminal-y" else " yes \n") if how.startswith(
        "terminal") else io.StringIO("")
    rc, out, err, writes, commands, _ = run(tmp_path, monkeypatch, case.capture, argv, stdin)
    assert rc == 0, err
    attr, line = DONE[case.id]
    assert [w for w in writes if w[0].endswith(f"/{attr}")], writes
    assert line in out.splitlines(), out
    asked = how.startswith("terminal")
    assert ("Go ahead? [y/N] " in err) == asked and ("nothing is changed yet" in err) == asked
    assert commands == []


def test_json_stays_on_stdout_and_the_question_on_stderr(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    rc, out, err, writes, _, _ = run(tmp_path, monkeypatch, "bcache-writeback-dirty",
                                     ("mode", "/dev/bcache0", "none", "--json"),
                                     Terminal("y\n"))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["changes"] == [{"target": "/dev/bcache0", "what": "cache_mode",
                               "before": "writeback", "after": "none"}]
    assert "Go ahead?" in err and writes


# ----------------------------------------------------------------------------- no question


@pytest.mark.parametrize("capture,argv", [
    ("bcache-writeback-dirty", ("mode", "/dev/bcache0", "writethrough")),
    ("bcache-writeback-dirty", ("mode", "/dev/bcache0", "writearound")),
    ("bcache-writeback-dirty", ("tune", "/dev/bcache0", "writeback_percent=5")),
    ("bcache-unattached", ("attach", "/dev/bcache0", FREE_CSET)),
])
def test_a_change_that_loses_nothing_is_not_asked(capture: str, argv: tuple[str, ...],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rc, _, err, writes, _, _ = run(tmp_path, monkeypatch, capture, argv, NoStdin())
    assert rc == 0 and writes and "Go ahead" not in err, err


@pytest.mark.parametrize("capture,argv,code,says", [
    # the target, the words
    ("bcache-writeback-dirty", ("remove", "/dev/cachemgr-no-such-disk"), 2, "no such device"),
    ("bcache-writeback-dirty", ("mode", "/dev/bcache0", "nonesuch"), 2,
     "unknown cache mode 'nonesuch'"),
    ("dmcache-writeback", ("mode", "vmcache", "none"), 2, "dm-cache"),
    # already so
    ("bcache-unattached", ("detach", "/dev/bcache0"), 4, "not attached to a cache set"),
    # what the kind cannot do, what its backend refuses as the device stands
    ("dmcache-writeback", ("detach", "vmcache"), 2, "cannot detach it"),
    ("dmcache-writeback", ("mode", "vmcache", "passthrough"), 3,
     "dm-cache accepts passthrough only when every block is clean"),
    ("dmcache-states", ("remove", "vg0-lv0"), 3, "lvconvert --uncache vg0/lv0"),
    ("dmcache-failed", ("remove", "failing"), 3, "the kernel reports the cache as Fail"),
    ("bcache-missing-cache", ("remove", "/dev/ubda"), 3, "has dirty data in its cache"),
    # set-wide refusals: devices attached; no data-loss acknowledgement
    ("bcache-writeback-dirty", ("remove", DIRTY_CSET), 3, "holds dirty data of /dev/bcache0"),
    ("bcache-writeback-dirty", ("stop-set", DIRTY_CSET), 3, "--i-accept-data-loss"),
    ("bcache-missing-cache", ("force-run", "/dev/ubda"), 3, "--i-accept-data-loss"),
])
def test_what_it_can_check_without_acting_comes_before_the_question(
        capture: str, argv: tuple[str, ...], code: int, says: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    rc, _, err, writes, commands, _ = run(tmp_path, monkeypatch, capture, argv,
                                          Terminal("y\n"))
    assert rc == code, err
    assert says in err and "Go ahead" not in err and "nothing is changed yet" not in err, err
    assert writes == [] and commands == []


@pytest.mark.parametrize("lock,holder,says", [
    ("/dev/bcache0", "{}", "another cachemgr run is acting on /dev/bcache0"),
    (f"cset:{DIRTY_CSET}", '{"procedure": "replace-ssd", "run": "r1", "step": "drain"}',
     f"cache set {DIRTY_CSET} is held by replace-ssd run r1"),
])
@pytest.mark.parametrize("argv", [("remove", "/dev/bcache0"), ("detach", "/dev/bcache0"),
                                  ("mode", "/dev/bcache0", "none"),
                                  ("stop-set", DIRTY_CSET, "--i-accept-data-loss")])
def test_a_run_holding_the_device_is_refused_before_the_question(
        lock: str, holder: str, says: str, argv: tuple[str, ...], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    """In the gate's words: the lock it would meet first (the keys' order), its holder."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    with held_elsewhere(lock_key(root, lock), state_dir, holder):
        rc, _, err = cli(root, argv)
    assert rc == 3 and says in err, err
    assert "Go ahead" not in err and writes == []


def test_an_interrupted_procedure_is_refused_before_the_question(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    plant(root, "drain:/dev/bcache0")
    rc, _, err = cli(root, ["remove", "/dev/bcache0"])
    assert rc == 3 and "owned by drain" in err and "--resume" in err, err
    assert "Go ahead" not in err and writes == []
    # a drain takes an interrupted drain over: mode --drain is asked (here: no), not refused
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    rc, _, err = cli(root, ["mode", "/dev/bcache0", "none", "--drain"])
    assert rc == 3 and "Go ahead" in err and "owned by" not in err, err


def test_not_root_is_told_so_without_a_question(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for capture, argv, says in (("bcache-writeback-dirty", ("remove", "/dev/bcache0"),
                                 "removing needs root"),
                                ("dmcache-writeback", ("remove", "vmcache", "--keep-device"),
                                 "needs root")):
        rc, _, err, writes, _, _ = run(tmp_path / capture, monkeypatch, capture, argv,
                                       Terminal("y\n"))
        assert rc == 2 and says in err and "Go ahead" not in err, err
        assert writes == []


def test_the_same_mode_again_is_already_so_without_a_question(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    kernel_writes(monkeypatch)
    mutations_refused(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert cli(root, ["mode", "/dev/bcache0", "none", "--yes"])[0] == 0
    rc, _, err = cli(root, ["mode", "/dev/bcache0", "none"])
    assert rc == 4 and "already in none mode" in err and "nothing is changed yet" not in err


# ----------------------------------------------------------------------------- other faces


def test_the_command_layer_asks_nothing_without_a_face_that_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the TUI calls (its own dialogs asked before): no prompt on its terminal."""
    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))
    writes = kernel_writes(monkeypatch)
    mutations_refused(monkeypatch)
    monkeypatch.setattr(sys, "stdin", NoStdin())
    res = cache_ops.mode(sysfs, "/dev/bcache0", "none")
    assert [c.after for c in res.changes] == ["none"]
    res = cache_ops.detach(sysfs, "/dev/bcache0")
    assert [c.what for c in res.changes] == ["detach"]
    res = cache_ops.stop_set(sysfs, DIRTY_CSET, accept_data_loss=True)
    assert [c.what for c in res.changes] == ["stop"]
    assert len(writes) == 3


def test_vm_cache_asks_before_it_defines(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    capture = FIXTURES / "vms-uml"

    class Captured(virsh.CapturedVirsh):  # libvirt as captured, asked for the definition
        def __init__(self, uri: str | None = None) -> None:
            super().__init__(capture, uri)

        def output(self, *args: str) -> str:
            return super().output(*[a for a in args if a != "--inactive"])

    defined: list[str] = []
    monkeypatch.setattr(virsh, "LiveVirsh", Captured)
    monkeypatch.setattr(virsh, "define", lambda uri, xml: defined.append(xml))
    mutations_refused(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    root = capture / "sys"
    rc, out, err = cli(root, ["vm-cache", "vm-bc", "vda", "writeback"])
    assert rc == 3 and defined == [] and out == "", err
    assert ("cachemgr vm-cache vm-bc vda writeback (nothing is changed yet):\n"
            "  would set the cache mode of vm-bc's disk vda from none to writeback in its "
            "persistent definition\n") in err
    assert "-> writeback" not in err  # not said as done
    rc, _, err = cli(root, ["vm-cache", "vm-bc", "vda", "writeback", "--yes"])
    # the define is recorded, not made: libvirt reads back the old mode (exit 1 says so)
    assert len(defined) == 1 and 'cache="writeback"' in defined[0]
    assert rc == 1 and "libvirt stored cache none, not writeback" in err, err
    assert "nothing is changed yet" not in err


def test_the_ansible_mode_module_confirms_with_yes(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """cachemgr_mode runs the CLI without a terminal (as Ansible does): it passes --yes, so
    a switch to none goes through."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    mutations_refused(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.syspath_prepend(str(REPO / "ansible"))
    from ansible_collections.cachemgr.cachemgr.plugins.modules import (  # type: ignore[import-not-found]
        cachemgr_mode as m,
    )

    ran: list[list[str]] = []

    class Done(Exception):
        pass

    class Module:
        check_mode = False
        _diff = False

        def __init__(self, **kw: object) -> None:
            self.params = {"device": "/dev/bcache0", "mode": "none", "drain": False,
                           "cachemgr_bin": "cachemgr"}

        def run_command(self, argv: list[str], **kw: object) -> tuple[int, str, str]:
            ran.append(argv[1:])
            return cli(root, argv[1:])

        def exit_json(self, **kw: Any) -> None:
            raise Done(kw)

        def fail_json(self, **kw: Any) -> None:
            raise AssertionError(kw)

    monkeypatch.setattr(m, "AnsibleModule", Module)
    with pytest.raises(Done) as e:
        m.main()
    assert e.value.args[0]["changed"] is True
    assert ran[-1][:3] == ["mode", "/dev/bcache0", "none"] and "--yes" in ran[-1]
    assert [w for w in writes if w[0].endswith("/cache_mode")]


def test_automation_calls_no_command_that_asks() -> None:
    """The systemd units and the udev rule run commands that act on the admin's policy and
    ask nothing; the commands that ask are the ones the rule lists."""
    asking = {name for name, p in subcommands(build_parser()).items()
              if any("--yes" in a.option_strings for a in p._actions)}
    listed = {row.split("`")[1].split()[0] for row in CONFIRMATIONS
              if row.startswith("| `")}
    listed |= {w.strip("` ") for row in CONFIRMATIONS if row.startswith("| `")
               for w in row.split("|")[1].split(",")}
    listed = {w.split()[0] for w in listed}
    assert asking == listed == {"remove", "detach", "mode", "stop-set", "force-run", "create",
                                "vm-cache", "replace-ssd", "assemble",
                                "invalidate"}
    runs = []
    for unit in [*(REPO / "systemd").glob("*.service"), REPO / "udev" / "90-cachemgr.rules"]:
        for line in unit.read_text().splitlines():
            for mark in ("@CACHEMGR@ ", "cachemgr.cli.udev "):
                if mark in line and not line.lstrip().startswith("#"):
                    runs.append(line.split(mark, 1)[1].split()[0].removesuffix("@ARGS@"))
    assert runs and not set(runs) & asking, runs
