"""The Ansible collection against the lab (issue #19 item 1, issue #33 item 3): on the lab's
root, where cachemgr is not installed, the role installs the Debian package the controller
supplies (scripts/build-deb.sh's, in dist/) with the policy, udev rule and units; each module
then runs that cachemgr, set once through the collection's action group (module_defaults:
no cachemgr is on PATH), the facts list the lab's caches, and the host-by-host replacement
playbook runs; the lab host changes once, and the same play run again changes nothing; in
check mode a bad policy fails the run. (ansible/tests/mode.yml's own run, which proved the
action group, the facts and a mode set once, is gone: this play proves each of them.)
Without a package built from this checkout's sources the play test is skipped, saying so."""

from __future__ import annotations

import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core import runner
from cachemgr.core.model import BcacheBacking, CacheMode
from cachemgr.core.sysfs import Sysfs

ROOT = Path(__file__).resolve().parents[2]
# the system's PATH only: a module that did not get cachemgr_bin from the play's
# module_defaults would run a "cachemgr" found there, and on the lab's root there is none
# until the role installs the package
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_PYTHON = "/usr/bin/python3"


def play(path: Path, cachemgr_bin: str, *extra: str) -> tuple[int, str]:
    """ansible-playbook's exit code and output (and its wall and CPU time, printed)."""
    # no PYTHONPATH or PYTHONHOME: the package's cachemgr runs its own virtualenv's code
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update({"ANSIBLE_COLLECTIONS_PATH": str(ROOT / "ansible"),
                "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local", "ANSIBLE_REMOTE_TEMP": "/tmp/ansible",
                "ANSIBLE_NOCOLOR": "1", "PATH": SYSTEM_PATH,
                # the host's Python runs the modules, as on a managed host (ansible.builtin.apt
                # finds python3-apt there), each from a file and not through a pipe: Python
                # 3.11 reads a script on its stdin one byte per read() (strace: 188,837 reads
                # for AnsiballZ's 188,836-byte file module), and in UML each read is a trip
                # to the host (the file module in a guest doing nothing else: 20 s piped,
                # 3.3 s from a file; docs/benchmarks.md, "Test suite time"). ansible-core's
                # AnsiballZ runs the module in that one Python either way; without the pipe
                # a task adds a few shell commands (mkdir, chmod, rm of its temporary dir).
                "ANSIBLE_PYTHON_INTERPRETER": SYSTEM_PYTHON, "ANSIBLE_PIPELINING": "0",
                # the controller polls its worker every 50 ms, not every 1 ms (the file says
                # why: the poll loop shared the guest's one CPU with each module)
                "ANSIBLE_CONFIG": str(ROOT / "ansible/tests/lab-ansible.cfg")})
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                        "localhost,", "-c", "local", str(path), "-e",
                        f"cachemgr_bin={cachemgr_bin}", *extra],
                       capture_output=True, text=True, env=env, timeout=900)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    print(f"ansible-playbook {path.name} {' '.join(a for a in extra if a.startswith('--'))}: "
          f"exit {r.returncode}, {time.monotonic() - t0:.1f} s, CPU {cpu:.1f} s")
    return r.returncode, r.stdout + r.stderr


def recap(out: str) -> dict[str, int]:
    m = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+"
                  r"failed=(\d+)", out)
    assert m, out
    return {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}


def changed_tasks(out: str) -> list[str]:
    """The names of the tasks that reported a change (the default callback's lines)."""
    tasks, now = [], ""
    for line in out.splitlines():
        if line.startswith("TASK ["):
            now = line[6:line.rfind("]")]
        elif line.startswith("changed: "):
            tasks.append(now)
    return tasks


def the_deb() -> Path:
    """scripts/build-deb.sh's package in dist/, built from this checkout's cachemgr/ (every
    module the same in the package as here); skips the test, saying why, otherwise."""
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    deb = ROOT / "dist" / f"cachemgr_{version.group(1)}_{arch}.deb"
    if not deb.exists():
        pytest.skip(f"{deb.relative_to(ROOT)} not built: run scripts/build-deb.sh first")
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                         check=True).stdout
    packaged: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        for m in tf.getmembers():
            # ./usr/lib/cachemgr/lib/python3.X/site-packages/cachemgr/...py
            parts = m.name.split("/")
            if m.isfile() and m.name.endswith(".py") and parts[1:4] == ["usr", "lib",
                                                                          "cachemgr"] \
                    and parts[6:8] == ["site-packages", "cachemgr"]:
                f = tf.extractfile(m)
                assert f
                packaged["/".join(parts[7:])] = f.read()
    assert packaged, f"no cachemgr modules in {deb}"
    here = {str(p.relative_to(ROOT)): p.read_bytes() for p in (ROOT / "cachemgr").rglob("*.py")}
    differ = sorted(n for n in packaged.keys() | here.keys() if packaged.get(n) != here.get(n))
    if differ:
        pytest.skip(f"{deb.relative_to(ROOT)} was built from other sources ({len(differ)} "
                    f"module(s) differ from this checkout's, {differ[0]} first): run "
                    "scripts/build-deb.sh again")
    return deb


def dpkg_installed(pkg: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                       text=True)
    return r.returncode == 0 and "install ok installed" in r.stdout


BAD_POLICY = ('version = 1\n[defaults]\nmode = "writethrough"\n[backing.vm-a]\n'
              'device = "serial:Z1X2C3V4"\ncache = "ssd9"\n')
ROLE = "cachemgr.cachemgr.cachemgr : "


# dpkg -i (byte-compiling the package's virtualenv) and the role's tasks in three runs (four
# until 2026-11-26): under
# a load of ~14 on 2 CPUs the whole test took ~25 minutes (2026-11-26); this bounds a hang
@pytest.mark.kernel(disks="512M,512M,256M,64M,256M,128M", timeout=1800)
def test_lab_play_changes_once_then_nothing(lab_disks: list[str]) -> None:
    """ansible/tests/lab.yml on a root without cachemgr: the role installs the .deb, the
    policy and the udev rule and units; then, with the package's cachemgr, drain (dirty data
    held) and a bcache mode by a by-id link to the backing disk, a dm-cache mode, and
    replace-ssd (new: same) on the scsi_debug SSD of a second bcache set, named by a by-id
    wwn link, through the collection's replace_ssd playbook (serial: 1). Run again: no change;
    with --check and a bad policy: the role's check fails it."""
    deb = the_deb()
    # the lab's root: this machine's, under an overlay whose writes go to a tmpfs
    assert not dpkg_installed("cachemgr"), "cachemgr is installed in the lab root already"
    assert shutil.which("cachemgr", path=SYSTEM_PATH) is None
    assert not Path("/usr/lib/cachemgr").exists()
    # the role keeps the package in /var/cache/cachemgr, where the lab's own cache may be
    # (this machine's /var/cache/cachemgr/lab): the directory is a change only without it
    new_cache_dir = not Path("/var/cache/cachemgr").exists()
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
        "lab_deb": str(deb),
        "lab_backing_link": str(byid / "lab-backing"), "lab_dmcache": "vc",
        "cachemgr_hosts": "localhost", "cachemgr_become": False,
        "cachemgr_replacements": [{"cache": str(ssd_link), "new": "same"}]})]
    lab = ROOT / "ansible/tests/lab.yml"

    pkg_bin = "/usr/bin/cachemgr"  # the role's default for a .deb
    rc, out = play(lab, pkg_bin, *extra)
    assert rc == 0, out
    assert recap(out)["failed"] == 0
    assert changed_tasks(out) == [
        *([ROLE + "Create the directory the host keeps the package in"] if new_cache_dir
          else []),
        ROLE + "Copy the .deb to the host",
        ROLE + "Install the .deb with apt (its dependencies from the host's apt sources)",
        # no "Create the policy's directory": create dm-cache above made /etc/cachemgr (its
        # record of the device goes to /etc/cachemgr/dmcache: docs/admin-guide.md, "After a
        # reboot: the record and the boot pass"), with the mode the role asks for
        ROLE + "Write the auto-attach policy (checked by cachemgr policy check first)",
        ROLE + "Create the state directory",  # a fresh host's
        ROLE + "Record the install-udev command line",
        ROLE + "Run cachemgr install-udev",
        "Drain bcache, named by a by-id link to its backing disk",
        "Writethrough on bcache, named by the same link",
        "Passthrough on the dm-cache device, named by its dm name",
        f"Replace the SSD under {ssd_link}"], out
    assert dpkg_installed("cachemgr")
    assert Path(pkg_bin).resolve() == Path("/usr/lib/cachemgr/bin/cachemgr")
    a = backing(lab_disks[0])
    assert a.mode == CacheMode.WRITETHROUGH and a.dirty is not None and a.dirty.is_zero(512)
    b = backing(lab_disks[4])
    assert b.cset_uuid and b.cset_uuid != old_cset  # a new cache set on the re-inserted SSD
    assert b.mode == CacheMode.WRITEBACK  # restored
    assert "passthrough" in runner.run(["dmsetup", "table", "vc"]).stdout
    assert Path("/etc/cachemgr/cachemgr.toml").read_text() == (
        ROOT / "ansible/tests/lab-policy.toml").read_text()
    # install-udev as the package's cachemgr ran it: its interpreter is the rule's program
    rule = Path("/etc/udev/rules.d/90-cachemgr.rules").read_text()
    assert "/usr/lib/cachemgr/bin/python3 -m cachemgr.cli.udev" in rule, rule
    assert Path("/etc/systemd/system/cachemgr-autoattach.service").is_file()

    rc, out = play(lab, pkg_bin, *extra)
    assert rc == 0, out
    assert changed_tasks(out) == [] and recap(out)["changed"] == 0, out
    assert recap(out)["failed"] == 0
    # (no third run with --check --diff: the second run's "no change" is the stronger check,
    # and each run of the play costs minutes of the suite in UML)

    # --check with a bad policy: copy's validate is skipped in check mode, the role's own
    # check is not; the run fails there, before any module, and nothing is written. The
    # package is installed and the udev rule written (the runs above): the role is asked
    # for the policy alone (install_from none, no udev), each task of the play costing
    # seconds of CPU in UML
    bad = json.loads(extra[1]) | {"cachemgr_policy": BAD_POLICY,
                                  "cachemgr_install_from": "none", "cachemgr_udev": False}
    rc, out = play(lab, pkg_bin, "-e", json.dumps(bad), "--check")
    assert rc != 0, out
    assert recap(out)["failed"] == 1, out
    failed = re.findall(r"^TASK \[(.*)\]", out[:out.find("fatal: ")], re.M)  # up to it
    assert "fatal: " in out and failed[-1] == ROLE + "Write the auto-attach policy (checked " \
        "by cachemgr policy check first)", out
    assert "cachemgr policy check refused the policy" in out, out
    assert "no [cache.ssd9] in this policy" in out, out
    assert "Drain bcache" not in out, out
    assert Path("/etc/cachemgr/cachemgr.toml").read_text() == (
        ROOT / "ansible/tests/lab-policy.toml").read_text()
    assert not list(Path("/etc/cachemgr").glob(".cachemgr-policy-*")), "the checked copy left"
