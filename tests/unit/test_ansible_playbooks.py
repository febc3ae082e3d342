"""The collection's replace_ssd playbook goes host by host and stops the whole rollout at the
first failure (issue #19 item 1): a failed replacement on the first host leaves that host's
next cache and every later host untouched. cachemgr is a stand-in that records each call and
fails (a real replacement runs in tests/kernel/test_ansible_kernel.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_replace_playbook_stops_at_the_first_failure(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "cachemgr"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "cachemgr: refused" >&2\nexit 3\n')
    fake.chmod(0o755)
    hosts = {"h1": ["h1-first", "h1-second"], "h2": ["h2-only"], "h3": ["h3-only"]}
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {
        h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "cachemgr_replacements": [{"cache": c} for c in caches]}
        for h, caches in hosts.items()}}}))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "al"), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                        str(inventory), "cachemgr.cachemgr.replace_ssd", "-e",
                        json.dumps({"cachemgr_hosts": "all", "cachemgr_become": False,
                                    "cachemgr_bin": str(fake)})],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "cachemgr failed (exit 3): cachemgr: refused" in out
    # one call: h1's first cache asked for its runs; nothing after it
    assert calls.read_text().splitlines() == ["replace-ssd h1-first --list --json"], out
    assert "h2" not in out.split("PLAY RECAP")[-1] and "h3" not in out.split("PLAY RECAP")[-1]
