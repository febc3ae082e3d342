"""The Ansible modules against the real CLI on captured lab trees (issue #19 item 1): a device
named any way the CLI takes it, a mode already set is not a change (also in check mode), the
modes each kind has (dm-cache has no none, a writecache only writeback), check mode and diff,
a drain of a clean cache is not a change, and a finished replacement whose SSD is in place is
not one either. One play runs every task (ansible-playbook costs seconds to start); the kernel
side is tests/kernel/test_ansible_kernel.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
# (name in the play, capture): bcache dirty in writeback (cset fb5bd09d, backing uuid 7643a213),
# LVM caches (vg0/vm1 writeback clean, vg0/vm2 writethrough, vg0/vm3 a dirty writecache),
# a plain dm-cache vmcache, a bcache set on the SCSI SSD /dev/sda
CAPTURES = {"bc": "bcache-writeback-dirty-uml", "lvm": "lvm-caches-uml",
            "dm": "dmcache-writeback-uml", "scsi": "scsi-ssd-in-use-uml"}
UUID = "7643a213-caa1-4bce-8c4a-454fdbe3fa1c"

TASKS: list[tuple[str, str, str, dict[str, Any], bool]] = [
    # (id, capture, module, args, check mode)
    ("bc_already", "bc", "cachemgr_mode", {"device": "/dev/bcache0", "mode": "writeback"}, False),
    ("bc_by_uuid", "bc", "cachemgr_mode", {"device": f"/dev/bcache/by-uuid/{UUID}",
                                           "mode": "writeback"}, False),
    ("bc_switch", "bc", "cachemgr_mode", {"device": UUID, "mode": "writethrough"}, True),
    ("bc_backing", "bc", "cachemgr_mode", {"device": "/dev/ubda", "mode": "none"}, True),
    ("bc_drain", "bc", "cachemgr_drain", {"device": "/dev/bcache0"}, True),
    ("bc_missing", "bc", "cachemgr_mode", {"device": "/dev/bcache9", "mode": "none"}, True),
    ("lv_already", "lvm", "cachemgr_mode", {"device": "vg0/vm1", "mode": "writeback"}, False),
    ("lv_path", "lvm", "cachemgr_mode", {"device": "/dev/vg0/vm2", "mode": "writethrough"},
     False),
    ("lv_none", "lvm", "cachemgr_mode", {"device": "vg0/vm1", "mode": "none"}, True),
    ("wc_mode", "lvm", "cachemgr_mode", {"device": "vg0/vm3", "mode": "writethrough"}, True),
    ("lv_clean", "lvm", "cachemgr_drain", {"device": "/dev/mapper/vg0-vm1"}, False),
    ("wc_dirty", "lvm", "cachemgr_drain", {"device": "vg0/vm3"}, True),
    ("dm_none", "dm", "cachemgr_mode", {"device": "vmcache", "mode": "none"}, True),
    ("dm_pass", "dm", "cachemgr_mode", {"device": "/dev/mapper/vmcache", "mode": "passthrough"},
     True),
    ("facts", "lvm", "cachemgr_facts", {"vms": False}, False),
    ("ssd_done", "scsi", "cachemgr_replace_ssd", {"cache": "/dev/sda", "new": "same"}, False),
    ("ssd_other", "scsi", "cachemgr_replace_ssd", {"cache": "/dev/sda", "new": "serial:X9"},
     True),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ansible-modules")
    state = tmp / "state"
    os.environ["CACHEMGR_STATE_DIR"] = str(state)
    try:
        # a finished replacement on the SCSI capture's cache set: the set it made is there
        j = replace.plan(Sysfs(FIXTURES / CAPTURES["scsi"] / "sys"), "/dev/sda",
                         replace.Options(yes=True))
        for step, _ in j.steps:
            j.mark(step)
        j.new = {"cset": j.cset, "node": "/dev/sda", "name": "sda", "serial": "S0"}
        j.status = "done"
        j.save()
    finally:
        del os.environ["CACHEMGR_STATE_DIR"]
    bins = {}
    for name, capture in CAPTURES.items():
        w = tmp / f"cachemgr-{name}"
        w.write_text(f"#!/bin/sh\nexec {sys.executable} -m cachemgr --sysfs-root "
                     f"{FIXTURES / capture / 'sys'} \"$@\"\n")
        w.chmod(0o755)
        bins[name] = str(w)
    tasks = []
    for tid, cap, module, args, check in TASKS:
        tasks.append({"name": tid, f"cachemgr.cachemgr.{module}": {**args,
                                                                   "cachemgr_bin": bins[cap]},
                      "check_mode": check, "diff": True, "ignore_errors": True,
                      "register": tid})
    out = tmp / "out.json"
    tasks.append({"name": "save", "check_mode": False, "ansible.builtin.copy": {
        "dest": str(out), "mode": "0644",
        "content": "{{ {" + ", ".join(f"'{t[0]}': {t[0]}" for t in TASKS) + "} | to_json }}"}})
    play = tmp / "play.yml"
    play.write_text(json.dumps([{"name": "modules on captures", "hosts": "localhost",
                                 "connection": "local", "gather_facts": False,
                                 "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "al"), "ANSIBLE_REMOTE_TEMP": str(tmp / "ar"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "CACHEMGR_STATE_DIR": str(state), "PYTHONPATH": str(REPO)}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                        "localhost,", str(play)], capture_output=True, text=True, env=env,
                       timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def ok(r: dict[str, Any]) -> bool:
    return not r.get("failed") and not r.get("changed")


def test_a_mode_already_set_is_no_change_by_any_name(results: dict[str, dict[str, Any]]) -> None:
    for tid in ("bc_already", "bc_by_uuid", "lv_already", "lv_path"):
        assert ok(results[tid]), (tid, results[tid])
    assert results["bc_already"]["device"] == "/dev/bcache0"
    assert results["lv_path"]["device"] == "/dev/mapper/vg0-vm2"


def test_check_mode_predicts_the_switch_with_a_diff(results: dict[str, dict[str, Any]]) -> None:
    r = results["bc_switch"]
    assert r["changed"] and not r.get("failed"), r
    assert (r["device"], r["before"], r["mode"]) == ("/dev/bcache0", "writeback",
                                                       "writethrough")
    assert "mode: writeback" in r["diff"]["before"]
    assert "mode: writethrough" in r["diff"]["after"]
    assert results["bc_backing"]["changed"] and results["bc_backing"]["device"] == "/dev/bcache0"


def test_modes_per_kind(results: dict[str, dict[str, Any]]) -> None:
    for tid, words in (("dm_none", "no mode none"), ("lv_none", "no mode none"),
                       ("wc_mode", "no mode writethrough")):
        r = results[tid]
        assert r.get("failed") and words in r["msg"], (tid, r)
    assert "passthrough is its none" in results["dm_none"]["msg"]
    assert results["dm_pass"]["changed"] and not results["dm_pass"].get("failed")


def test_drain_changes_only_a_dirty_cache(results: dict[str, dict[str, Any]]) -> None:
    assert ok(results["lv_clean"]), results["lv_clean"]
    for tid in ("wc_dirty", "bc_drain"):
        assert results[tid]["changed"] and results[tid]["dirty_bytes"] > 0, results[tid]


def test_an_unknown_device_fails(results: dict[str, dict[str, Any]]) -> None:
    r = results["bc_missing"]
    assert r.get("failed") and "/dev/bcache9 is not a cached device" in r["msg"], r


def test_facts(results: dict[str, dict[str, Any]]) -> None:
    r = results["facts"]
    assert ok(r)
    devices = r["ansible_facts"]["cachemgr"]["devices"]
    assert {"/dev/mapper/vg0-vm1", "/dev/mapper/vg0-vm3"} <= {d["device"] for d in devices}


def test_a_finished_replacement_in_place_is_no_change(results: dict[str, dict[str, Any]]
                                                      ) -> None:
    r = results["ssd_done"]
    assert ok(r), r
    assert r["done"]
    # another new disk asked for: not that run's, so a new plan (check mode: the dry run)
    other = results["ssd_other"]
    assert other["changed"] and not other.get("failed"), other
    assert "done" not in other and "new SSD: serial:X9" in other["plan"]
