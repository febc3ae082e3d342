"""The Ansible collection against the lab: a mode is ensured idempotently, facts gathered."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.backends import bcache
from cachemgr.core.sysfs import Sysfs

ROOT = Path(__file__).resolve().parents[2]


def play(path: Path, cachemgr_bin: str) -> tuple[int, str]:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "ansible"),
           "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local", "ANSIBLE_REMOTE_TEMP": "/tmp/ansible",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                        "localhost,", str(path), "-e", f"cachemgr_bin={cachemgr_bin}"],
                       capture_output=True, text=True, env=env, timeout=600)
    return r.returncode, r.stdout + r.stderr


def recap(out: str) -> dict[str, int]:
    m = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+"
                  r"failed=(\d+)", out)
    assert m, out
    return {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}


@pytest.mark.kernel(disks="1G,256M", timeout=600)
def test_playbook_sets_mode_idempotently_and_gathers_facts(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="128k")
    cm = str(Path(sys.executable).parent / "cachemgr")
    rc, out = play(ROOT / "ansible/tests/mode.yml", cm)
    assert rc == 0, out
    assert recap(out) == {"ok": 3, "changed": 1, "failed": 0}
    assert "/dev/bcache0" in out  # the facts task saw the device
    assert "[writeback]" in sysfs.read("block/bcache0/bcache/cache_mode")
    rc, out = play(ROOT / "ansible/tests/mode.yml", cm)
    assert rc == 0, out
    assert recap(out) == {"ok": 3, "changed": 0, "failed": 0}
