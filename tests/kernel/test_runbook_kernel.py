"""The admin guide's SSD replacement runbook, run as written (docs/admin-guide.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs

ROOT = Path(__file__).resolve().parents[2]


def runbook_commands() -> list[str]:
    text = (ROOT / "docs/admin-guide.md").read_text()
    section = text[text.index("## Replace a cache SSD"):]
    section = section[:section.index("\n## ", 5)]
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("scripts/replace-ssd"):
                cmds.append(line)
    return cmds


def test_runbook_is_parsed() -> None:
    cmds = runbook_commands()
    assert any("--dry-run" in c for c in cmds) and any("--resume" in c for c in cmds)


@pytest.mark.kernel(disks="512M", timeout=600)
def test_runbook_commands_work(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    (ssd,) = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)
    bcache.create(sysfs, backings=lab_disks, cache=ssd.node, bucket="64k",
                  mode=CacheMode.WRITEBACK)
    old = snapshot.take(sysfs).cache_sets[0].uuid
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CACHEMGR_LOG_DIR": "/tmp/cachemgr-log"}
    ran = []
    run_id = None
    for cmd in runbook_commands():
        if "--new any" in cmd or "--rollback" in cmd:
            continue  # needs an operator at the machine / a run stopped half-way
        if "--warm" in cmd:
            # needs a trace of the host's IO (blktrace: not in the UML kernel); the warm step
            # of a replacement runs in tests/kernel/test_warm_kernel.py
            continue
        cmd = cmd.replace("/dev/sdX", ssd.node)
        if "--resume" in cmd:
            assert run_id, "the runbook resumes before any run"
            cmd = re.sub(r"--resume \S+", f"--resume {run_id}", cmd)
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=400)
        ran.append((cmd, r.returncode))
        if "--resume" in cmd:
            assert r.returncode == 4, r.stderr  # the run finished: "already done"
        else:
            assert r.returncode == 0, (cmd, r.stderr)
        if "--list" in cmd:
            run_id = r.stdout.split()[0]
        if "--yes" in cmd:
            ssd = next(d for d in scsi.disks(sysfs) if d.wwid == ssd.wwid)
    assert [c for c, _ in ran if "--dry-run" in c] and [c for c, _ in ran if "--yes" in c]
    snap = snapshot.take(sysfs)
    assert snap.cache_sets[0].uuid != old
    assert all(b.cset_uuid == snap.cache_sets[0].uuid for b in snap.backings)
    logs = list(Path("/tmp/cachemgr-log").glob("replace-ssd-*.log"))
    assert logs and any("# exit 0" in p.read_text() for p in logs)
    r = subprocess.run([str(ROOT / ".venv/bin/cachemgr"), "replace-ssd", "--list", "--json"],
                       capture_output=True, text=True, env=env)
    assert json.loads(r.stdout)["runs"][0]["status"] == "done"
