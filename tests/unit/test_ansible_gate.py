"""The gate's refusals through the Ansible modules (issue #30, parity): a device a drain holds
(another process has its lock) and a device an interrupted procedure's journal owns (a killed
drain, a replace-ssd run that failed in its drain step) make cachemgr_mode and cachemgr_drain
fail with the CLI's own words and exit code 3 (the message is the CLI's stderr, message and
hint; ``rc`` its exit code), report no change, and change nothing (the capture's sysfs files
and the journals are as they were). The CLI's answer is taken by running the very command the
module ran (its ``cmd``) with the same state directory, while the same lock is held. One play
runs every task (ansible-playbook costs seconds to start), each on its own writable copy of
the capture and its own state directory, as tests/unit/test_ansible_modules.py does; the TUI
and the CLI agree on the same refusals in tests/unit/test_parity.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.guards import held_elsewhere
from tests.unit.test_parity import plant
from tests.unit.tui_helpers import copy_capture

REPO = Path(__file__).resolve().parents[2]
CAPTURE = "bcache-writeback-dirty"  # /dev/bcache0 dirty in writeback, on cache set fb5bd09d
UUID = "7643a213-caa1-4bce-8c4a-454fdbe3fa1c"  # its backing device: the drain's lock key
MODE = ("cachemgr_mode", {"device": "/dev/bcache0", "mode": "writethrough"})
DRAIN = ("cachemgr_drain", {"device": "/dev/bcache0"})

# (task, setting, module and args, words the CLI's message holds)
TASKS: list[tuple[str, str, tuple[str, dict[str, str]], str]] = [
    ("held_mode", "held", MODE, "/dev/bcache0 is held by drain"),
    ("held_drain", "held", DRAIN, "/dev/bcache0 is held by drain"),
    ("drained_mode", "drain", MODE, "/dev/bcache0 is owned by drain"),
    ("replaced_mode", "replace", MODE, "owned by replace-ssd run gate-test"),
    ("replaced_drain", "replace", DRAIN,
     "resume it (cachemgr replace-ssd --resume gate-test) or roll it back"),
]
SETTINGS = ("held", "drain", "replace")


def files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (links not followed) and its content."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def journals(state: Path) -> dict[str, bytes]:
    """The state directory's journals (the locks the gate takes are not changes)."""
    return {k: v for k, v in files(state).items() if not k.startswith("locks/")}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ansible-gate")
    roots, states, bins = {}, {}, {}
    for s in SETTINGS:
        roots[s] = copy_capture(tmp / s, CAPTURE)
        states[s] = tmp / f"state-{s}"
        w = tmp / f"cachemgr-{s}"
        w.write_text(f"#!/bin/sh\nexec {sys.executable} -m cachemgr --sysfs-root {roots[s]} "
                     "\"$@\"\n")
        w.chmod(0o755)
        bins[s] = str(w)
    # the interrupted procedures' journals, as those procedures write them
    for s, spec in (("drain", "drain:/dev/bcache0"), ("replace", "replace:/dev/bcache0")):
        os.environ["CACHEMGR_STATE_DIR"] = str(states[s])
        try:
            plant(roots[s], spec)
        finally:
            del os.environ["CACHEMGR_STATE_DIR"]
    before = {s: (files(roots[s]), journals(states[s])) for s in ("drain", "replace")}
    before["held"] = (files(roots["held"]), {})
    out = tmp / "out.json"
    tasks: list[dict[str, Any]] = [
        {"name": tid, f"cachemgr.cachemgr.{module}": {**args, "cachemgr_bin": bins[s]},
         "environment": {"CACHEMGR_STATE_DIR": str(states[s])}, "ignore_errors": True,
         "register": tid} for tid, s, (module, args), _ in TASKS]
    tasks.append({"name": "save", "ansible.builtin.copy": {
        "dest": str(out), "mode": "0644",
        "content": "{{ {" + ", ".join(f"'{t[0]}': {t[0]}" for t in TASKS) + "} | to_json }}"}})
    play = tmp / "play.yml"
    play.write_text(json.dumps([{"name": "the gate's refusals", "hosts": "localhost",
                                 "connection": "local", "gather_facts": False,
                                 "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "al"), "ANSIBLE_REMOTE_TEMP": str(tmp / "ar"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "PYTHONPATH": str(REPO)}
    env.pop("CACHEMGR_STATE_DIR", None)
    # a drain holds /dev/bcache0 in the "held" setting, for the play and the CLI's runs
    with held_elsewhere(UUID, states["held"], '{"procedure": "drain"}'):
        r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                            "localhost,", str(play)], capture_output=True, text=True, env=env,
                           timeout=300, cwd=REPO)
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
        results = json.loads(out.read_text())
        # the CLI itself: the command each module ran, with the same state directory
        cli = {}
        for tid, s, _, _ in TASKS:
            cmd = results[tid].get("cmd")
            assert isinstance(cmd, list) and cmd[0] == bins[s], (tid, results[tid])
            c = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                               env={**env, "CACHEMGR_STATE_DIR": str(states[s])})
            cli[tid] = (c.returncode, c.stdout, c.stderr)
    after = {s: (files(roots[s]), journals(states[s]) if s != "held" else {})
             for s in SETTINGS}
    return {"results": results, "cli": cli, "before": before, "after": after}


@pytest.mark.parametrize("task", TASKS, ids=[t[0] for t in TASKS])
def test_the_module_fails_with_the_clis_words_and_code(outcome: dict[str, Any],
                                                      task: tuple[Any, ...]) -> None:
    tid, _, (module, _args), says = task
    r = outcome["results"][tid]
    rc, out, err = outcome["cli"][tid]
    # the CLI: refused as unsafe, its one message and hint on stderr; on stdout (the modules
    # run it with --json) the error document (docs/json.md, "Errors and already so")
    assert rc == 3 and json.loads(out)["error"]["kind"] == "unsafe", (rc, out, err)
    assert err.startswith("cachemgr: ") and says in err and "\n  hint: " in err, err
    # the module: failed with that exit code and those words, and no change
    assert r.get("failed") and not r.get("changed"), r
    assert r["rc"] == rc
    assert r["msg"] == f"cachemgr failed (exit 3): {err.strip()}"
    assert r["stderr"] == err
    # the command it ran is the one that makes the change (the gate refused it)
    assert r["cmd"][1] == ("mode" if module == "cachemgr_mode" else "drain")
    assert "/dev/bcache0" in r["cmd"]


def test_nothing_was_changed(outcome: dict[str, Any]) -> None:
    """No sysfs file of the captures and no journal changed: the interrupted procedures still
    own their devices, as they left them."""
    for s in SETTINGS:
        before, after = outcome["before"][s], outcome["after"][s]
        assert after[0] == before[0], f"{s}: sysfs files changed"
        assert after[1] == before[1], f"{s}: journals changed"
    assert outcome["before"]["drain"][1] and outcome["before"]["replace"][1]
