"""The Ansible collection against the lab (issue #19 item 1): each module, the role's policy and
udev tasks and the host-by-host replacement playbook change the lab host once, and the same
play run again (and in check mode with --diff) changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core import runner
from cachemgr.core.model import BcacheBacking, CacheMode
from cachemgr.core.sysfs import Sysfs

ROOT = Path(__file__).resolve().parents[2]


def play(path: Path, cachemgr_bin: str, *extra: str) -> tuple[int, str]:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "ansible"),
           "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local", "ANSIBLE_REMOTE_TEMP": "/tmp/ansible",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                        "localhost,", "-c", "local", str(path), "-e",
                        f"cachemgr_bin={cachemgr_bin}", *extra],
                       capture_output=True, text=True, env=env, timeout=900)
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


def changed_tasks(out: str) -> list[str]:
    """The names of the tasks that reported a change (the default callback's lines)."""
    tasks, now = [], ""
    for line in out.splitlines():
        if line.startswith("TASK ["):
            now = line[6:line.rfind("]")]
        elif line.startswith("changed: "):
            tasks.append(now)
    return tasks


@pytest.mark.kernel(disks="512M,512M,256M,64M,256M,128M", timeout=900)
def test_lab_play_changes_once_then_nothing(lab_disks: list[str]) -> None:
    """ansible/tests/lab.yml: drain (dirty data held) and a bcache mode by a by-id link to the
    backing disk, a dm-cache mode, the role's policy and udev rule and units, and replace-ssd
    (new: same) on the scsi_debug SSD of a second bcache set, named by a by-id wwn link,
    through the collection's replace_ssd playbook (serial: 1)."""
    sysfs = Sysfs()
    # set A: dirty data held (writeback off: an idle set writes back at once), for the drain
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[5], bucket="64k",
                  mode=CacheMode.WRITEBACK)
    (a,) = snapshot.take(sysfs).backings
    sysfs.write(f"block/{a.device_name}/bcache/writeback_running", "0")
    runner.run(["fio", "--name=w", f"--filename={a.device}", "--rw=randwrite", "--bs=4k",
                "--size=32M", "--io_size=8M", "--direct=1", "--output-format=json"])
    # set B: on a scsi_debug SSD, for the replacement (writeback on: replace-ssd drains it)
    (ssd,) = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)
    assert ssd.wwid and ssd.wwid.startswith("naa.")
    bcache.create(sysfs, backings=[lab_disks[4]], cache=ssd.node, bucket="64k",
                  mode=CacheMode.WRITEBACK)

    def backing(disk: str) -> BcacheBacking:
        name = Path(disk).name
        (b,) = [b for b in snapshot.take(sysfs).backings if b.identity.name == name]
        return b
    a = backing(lab_disks[0])
    assert a.dirty is not None and not a.dirty.is_zero(512)
    old_cset = backing(lab_disks[4]).cset_uuid
    cm = str(Path(sys.executable).parent / "cachemgr")
    r = runner.run([cm, "create", "dm-cache", "vc", "--origin", lab_disks[1], "--cache",
                    lab_disks[2], "--metadata", lab_disks[3], "--mode", "writeback"])
    assert r.returncode == 0, r.stderr
    # udev is not running: the stable links an admin would use, made by hand
    byid = Path("/dev/disk/by-id")
    byid.mkdir(parents=True, exist_ok=True)
    (byid / "lab-backing").symlink_to(lab_disks[0])
    ssd_link = byid / f"wwn-0x{ssd.wwid[4:]}"
    ssd_link.symlink_to(ssd.node)
    extra = ["-e", json.dumps({
        "lab_backing_link": str(byid / "lab-backing"), "lab_dmcache": "vc",
        "cachemgr_hosts": "localhost", "cachemgr_become": False,
        "cachemgr_replacements": [{"cache": str(ssd_link), "new": "same"}]})]
    lab = ROOT / "ansible/tests/lab.yml"

    rc, out = play(lab, cm, *extra)
    assert rc == 0, out
    assert recap(out)["failed"] == 0
    assert changed_tasks(out) == [
        "Drain bcache, named by a by-id link to its backing disk",
        "Writethrough on bcache, named by the same link",
        "Passthrough on the dm-cache device, named by its dm name",
        # no "Create the policy's directory": create dm-cache above made /etc/cachemgr (its
        # record of the device goes to /etc/cachemgr/dmcache: docs/admin-guide.md, "After a
        # reboot: the record and the boot pass"), with the mode the role asks for
        "cachemgr.cachemgr.cachemgr : Write the auto-attach policy (checked by cachemgr "
        "policy check first)",
        "cachemgr.cachemgr.cachemgr : Create the state directory",  # a fresh host's
        "cachemgr.cachemgr.cachemgr : Record the install-udev command line",
        "cachemgr.cachemgr.cachemgr : Run cachemgr install-udev",
        f"Replace the SSD under {ssd_link}"], out
    a = backing(lab_disks[0])
    assert a.mode == CacheMode.WRITETHROUGH and a.dirty is not None and a.dirty.is_zero(512)
    b = backing(lab_disks[4])
    assert b.cset_uuid and b.cset_uuid != old_cset  # a new cache set on the re-inserted SSD
    assert b.mode == CacheMode.WRITEBACK  # restored
    assert "passthrough" in runner.run(["dmsetup", "table", "vc"]).stdout
    assert Path("/etc/cachemgr/cachemgr.toml").read_text() == (
        ROOT / "ansible/tests/lab-policy.toml").read_text()
    assert Path("/etc/udev/rules.d/90-cachemgr.rules").is_file()
    assert Path("/etc/systemd/system/cachemgr-autoattach.service").is_file()

    rc, out = play(lab, cm, *extra)
    assert rc == 0, out
    assert changed_tasks(out) == [] and recap(out)["changed"] == 0, out
    assert recap(out)["failed"] == 0
    rc, out = play(lab, cm, *extra, "--check", "--diff")
    assert rc == 0, out
    assert changed_tasks(out) == [] and recap(out)["changed"] == 0, out
