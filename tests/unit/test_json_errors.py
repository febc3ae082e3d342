"""``--json`` always answers in JSON (issue #33 item 5, docs/json.md, "Errors and already
so"): an error prints ``{"schema": 1, "error": {"code", "kind", "message", "hint"}}`` on
stdout (its words stay on stderr), "already so" the command's document or ``{"schema": 1,
"already": true, "message"}``; the exit codes are those without --json. Every command that
has --json is here (test_every_json_command_has_a_case fails for a new one)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.cli.main import build_parser
from cachemgr.core.errors import SysfsError
from cachemgr.ops import protect as protect_ops
from tests.unit.test_parity import cli
from tests.unit.tui_helpers import copy_capture, kernel_writes

ND = "/dev/cachemgr-no-such-disk"
KINDS = {1: "failed", 2: "usage", 3: "unsafe", 5: "timeout"}

# (argv, the exit code) of an error: a device (or a file) that does not exist
ERRORS: dict[str, tuple[list[str], int]] = {
    "mode": (["mode", ND, "writeback"], 2),
    "drain": (["drain", ND], 2),
    "attach": (["attach", ND, ND], 2),
    "detach": (["detach", ND], 2),
    "invalidate": (["invalidate", ND, "--yes"], 2),
    "scrub": (["scrub", ND], 2),
    "create": (["create", "bcache", "--backing", ND], 2),
    "remove": (["remove", ND], 2),
    "tune": (["tune", ND, "sequential_cutoff=0"], 2),
    "register": (["register", ND], 2),
    "assemble": (["assemble", "no-such-record"], 2),
    "force-run": (["force-run", ND, "--i-accept-data-loss"], 2),
    "stop-set": (["stop-set", ND, "--i-accept-data-loss"], 2),
    "replace-ssd": (["replace-ssd", ND, "--dry-run"], 2),
    "bench run": (["bench", "run", ND], 2),
    "bench compare": (["bench", "compare", ND], 2),
    "bench replay": (["bench", "replay", "--trace", "/nonexistent.trace", ND], 2),
    "autoattach": (["autoattach", "--policy", "/nonexistent/policy.toml"], 2),
    "policy check": (["policy", "check", "--policy", "/nonexistent/policy.toml"], 2),
    "scheduler": (["scheduler", ND], 2),
    "vm-cache": (["vm-cache", "--connect", "test:///nonexistent", "nodomain", "vda",
                  "none"], 1),
    "trace": (["trace", "-o", "{tmp}/x.trace", ND], 2),
    "size": (["size", "--trace", "/nonexistent.trace"], 2),
    "restore": (["restore", ND], 2),
    "warm": (["warm", ND, "--trace", "/nonexistent.trace"], 2),
    "doctor": (["doctor", ND, "--window", "1"], 2),
    "snapshot": (["snapshot", ND, "--lv", "vg0/vm1", "--mount", "/srv/vms"], 2),
    "governor": (["governor", "--policy", "/"], 2),  # a directory, not a policy file
}
# commands that name no device: their read of /sys fails (EIO under the snapshot; protect's
# pass)
NO_DEVICE = {"status": ["status", "--no-vms"], "ssd-health": ["ssd-health"],
             "check": ["check"], "vms": ["vms", "--connect", "test:///nonexistent"],
             "protect": ["protect", "--policy", "/nonexistent/policy.toml"]}


def json_commands() -> set[str]:
    out: set[str] = set()

    def walk(p: argparse.ArgumentParser, words: list[str]) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, [*words, name])
        if any("--json" in a.option_strings for a in p._actions):
            out.add(" ".join(words))

    walk(build_parser(), [])
    return out


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    kernel_writes(monkeypatch)
    return copy_capture(tmp_path, "bcache-writeback-dirty")


def test_every_json_command_has_a_case() -> None:
    assert json_commands() == set(ERRORS) | set(NO_DEVICE)


def error_doc(out: str, code: int) -> dict[str, object]:
    doc = json.loads(out)
    assert set(doc) == {"schema", "error"} and doc["schema"] == 1, out
    err = doc["error"]
    assert set(err) == {"code", "kind", "message", "hint"}, out
    assert err["code"] == code and err["kind"] == KINDS[code], out
    assert isinstance(err["message"], str) and err["message"], out
    assert err["hint"] is None or isinstance(err["hint"], str), out
    return err


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_an_error_is_a_json_document(name: str, root: Path, tmp_path: Path) -> None:
    argv, code = ERRORS[name]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc_text, out_text, err_text = cli(root, argv)
    rc, out, err = cli(root, [*argv, "--json"])
    assert rc == rc_text == code, (out, err)
    assert out_text == ""  # without --json, nothing on stdout, as before
    e = error_doc(out, code)
    # the words stay on stderr, the same as without --json
    assert err == err_text and f"cachemgr: {str(e['message']).splitlines()[0]}" in err


@pytest.mark.parametrize("name", sorted(NO_DEVICE))
def test_an_error_of_a_command_without_a_device(name: str, root: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*_a: object, **_k: object) -> None:
        raise SysfsError(str(root / "block"), "read", 5, "Input/output error")

    monkeypatch.setattr(snapshot, "take", fails)
    # protect reads nothing without a [protect] policy: its pass fails as a whole
    monkeypatch.setattr(protect_ops, "run", fails)
    rc, out, err = cli(root, [*NO_DEVICE[name], "--json"])
    if name == "check":  # a monitoring check's own document: UNKNOWN, exit 3 (docs/json.md)
        doc = json.loads(out)
        assert rc == 3 and doc["status"] == "UNKNOWN" and "Input/output error" in doc["error"]
        return
    assert rc == 1, (out, err)
    e = error_doc(out, 1)
    assert "Input/output error" in str(e["message"]) and "Input/output error" in err


def test_a_refusal_is_unsafe(root: Path) -> None:
    rc, out, err = cli(root, ["force-run", "/dev/bcache0", "--json"])
    assert rc == 3
    e = error_doc(out, 3)
    assert "--i-accept-data-loss" in str(e["hint"]) and "corrupt" in err


def test_already_so_without_a_document(root: Path) -> None:
    """mode raises "already so": ``{"schema": 1, "already": true, "message"}``."""
    rc, out, err = cli(root, ["mode", "/dev/bcache0", "writeback", "--json"])
    assert rc == 4
    doc = json.loads(out)
    assert doc == {"schema": 1, "already": True,
                   "message": "/dev/bcache0 is already in writeback mode"}
    assert "already in writeback mode" in err


def test_already_so_with_the_commands_document(root: Path) -> None:
    """tune's change document says it: no change, already, the words."""
    rc, out, _ = cli(root, ["tune", "/dev/bcache0", "sequential_cutoff=4194304", "--json"])
    assert rc == 4
    doc = json.loads(out)
    assert doc["changes"] == [] and doc["already"] is True
    assert "sequential_cutoff is already" in doc["message"]
    rc, out, _ = cli(root, ["restore", "--json"])
    assert rc == 4 and json.loads(out) == {"schema": 1, "restored": []}
    # a change that is made says no "already"
    rc, out, _ = cli(root, ["tune", "/dev/bcache0", "sequential_cutoff=0", "--json"])
    assert rc == 0
    doc = json.loads(out)
    assert "already" not in doc and [c["what"] for c in doc["changes"]] == ["sequential_cutoff"]
