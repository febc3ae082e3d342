"""SSD replacement with an NVMe cache SSD (issue #17 item 3), on Debian's kernel in the qemu
lab: emulated NVMe controllers, each on its own PCIe root port.

The procedure's steps are the same code for SCSI and NVMe but for the disk ones (remove-old
pulls the controller's PCI function, wait-new rescans the PCI bus and finds the namespace by
its WWID, identify-new), and each kind's steps are the same code on either bus; so this file
keeps what is NVMe's own and leaves each kind's proof (killed after every step, under fio's
verify load, refusals) to its SCSI test on UML (tests/kernel/test_replace_kernel.py,
test_replace_dmcache_kernel.py, test_replace_lvm_kernel.py). Here: a dm-cache device whose
cache and metadata are partitions of an NVMe namespace moved to another controller's namespace
under load; two LVs cached on one NVMe namespace's PV replaced in one run, killed with the
controller pulled and resumed by a PCI rescan; and (qemu's monitor, outside the CI's smoke
set) bcache's cache drive swapped in its slot by an operator at a terminal."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachemgr.backends import nvme
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from cachemgr.lab import core as labcore
from cachemgr.lab import qmp
from cachemgr.procedures import replace
from tests.kernel.test_replace_kernel import (
    FIO_COMMON,
    bcache_holding_dirt,
    cm,
    cm_here,
    end_state,
    report_times,
    start_load,
    status_modes,
    stop_load,
    verify_pre,
)


def setup(lab_disks: list[str]) -> tuple[Sysfs, list[str], list[nvme.NvmeNamespace]]:
    sysfs = Sysfs()
    ssds = nvme.wait_for_all(sysfs, os.environ["LAB_NVME_SERIALS"].split(), 30)
    return sysfs, bcache_holding_dirt(sysfs, lab_disks, ssds[0].node), ssds


@pytest.mark.kernel(disks="512M,nvme:192M,nvme:192M", timeout=1200, qemu_cpus=2)
@pytest.mark.qemu_smoke
def test_dmcache_on_nvme_partitions_moved_to_another_controller_under_load(
        lab_disks: list[str]) -> None:
    """dm-cache's cache and metadata on partitions of the first controller's namespace
    (nvmeXnYp1, p2), moved under the verify load to the second controller's namespace, named
    by its WWID: the plan's remove-old names the PCI function (a dry run, changing nothing),
    the old controller is pulled and stays out, the new areas are partitions of the other
    namespace. The same disk steps served bcache's cache in a test of its own here until
    2026-11-28 (they are one code for every kind: procedures/replace/shared.py); bcache's own
    steps onto another disk under the verify load are test_replace_kernel.py's
    test_replace_with_a_different_disk (SCSI, UML). First, in the same guest, the NVMe
    backend's own checks on these two controllers (test_nvme_kernel.py: identities, a refusal,
    a controller pulled and found again after a rescan)."""
    from tests.kernel import test_replace_dmcache_kernel as dmk
    from tests.kernel.test_nvme_kernel import identity_refusal_remove_and_rescan

    sysfs = Sysfs()
    a, b = identity_refusal_remove_and_rescan(sysfs, 192 << 20)
    sectors = runner.run(["blockdev", "--getsz", lab_disks[0]]).stdout.strip()
    runner.run(["dmsetup", "create", "slowhdd", "--table",
                f"0 {sectors} delay {lab_disks[0]} 0 2"])
    runner.run(["sfdisk", "--quiet", a.node], input="label: gpt\nsize=16MiB\nsize=128MiB\n",
               timeout=60)
    runner.run(["blockdev", "--rereadpt", a.node])
    r = cm_here("create", "dm-cache", "vc", "--origin", "/dev/mapper/slowhdd",
                "--cache", f"{a.node}p2", "--metadata", f"{a.node}p1", "--mode", "writeback")
    assert r.returncode == 0, r.stderr
    runner.run(["fio", "--name=pre", "--filename=/dev/mapper/vc", "--rw=randwrite",
                "--offset=64M", "--size=32M", "--do_verify=0", *FIO_COMMON,
                "--output-format=json"], timeout=600)
    runner.run(["dmsetup", "message", "vc", "0", "migration_threshold", dmk.THRESHOLD])
    before = dmk.table_words()
    # the plan names the PCI method; a dry run changes nothing (before the load: under TCG
    # each second of fio's verify load costs host CPU, and the plan does not depend on it)
    r = cm_here("replace-ssd", "/dev/mapper/vc", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "remove-old" in r.stdout and f"PCI {a.pci}" in r.stdout, r.stdout
    assert dmk.table_words() == before and not replace.list_runs()
    load = start_load(["/dev/mapper/vc"])
    try:
        r = cm("replace-ssd", "/dev/mapper/vc", "--new", f"wwn:{b.wwid}", "--yes", "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["kind"] == "dmcache" and res["old"]["bus"] == "nvme"
        assert res["new"]["wwid"] == b.wwid and res["new"]["slot"] == b.pci
        report_times("dmcache-nvme-other-controller", res)
        node = res["new"]["node"]
        dmk.end_state(sysfs, before, (f"{node}p1", f"{node}p2"))
        assert a.wwid not in {n.wwid for n in nvme.namespaces(sysfs)}  # pulled
    finally:
        stop_load(load)
    verify_pre(["/dev/mapper/vc"])


@pytest.mark.kernel(disks="512M,nvme:160M", timeout=1200)
@pytest.mark.qemu_smoke
def test_lvm_caches_on_one_nvme_pv_killed_with_the_controller_pulled(
        lab_disks: list[str]) -> None:
    """Two LVs cached on one NVMe namespace's PV (issue #35 item 4), each holding data written
    before the run: ``replace-ssd vg0/vm1`` replaces the SSD under both caches in one run,
    killed right after the controller's PCI function was pulled and resumed (the PCI rescan
    brings the same drive back, under whatever name the driver gives it); the data is read
    back and verified after. On qemu only what UML cannot do (the PV on an NVMe namespace,
    the PCI remove and rescan, a kill between them): the same procedure killed after every
    step under fio's verify load on both LVs, the rollback and the refusals run on SCSI in
    UML (tests/kernel/test_replace_lvm_kernel.py,
    test_lvmcache_replacement_killed_after_every_step_under_verify_load). Until 2026-11-28
    this test ran that load here too (two fio writers under TCG, most of its 317 CPU-s);
    the VM IO through a pulled NVMe controller is test_dmcache_on_nvme_partitions_... above."""
    from tests.kernel import test_replace_lvm_kernel as lk

    sysfs = Sysfs()
    (a,) = nvme.wait_for_all(sysfs, os.environ["LAB_NVME_SERIALS"].split(), 30)
    hdd = lab_disks[0]
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "hdd", "--table", f"0 {sectors} delay {hdd} 0 2"])
    with open("/etc/lvm/lvmlocal.conf", "a") as f:
        f.write(f'devices {{ global_filter = [ "r|^{hdd}$|" ] }}\n')
    lk.lvm("pvcreate", "-y", "/dev/mapper/hdd", a.node)
    lk.lvm("vgcreate", lk.VG, "/dev/mapper/hdd", a.node)
    for lv, size, pool, psize, chunk in (("vm1", "192M", "pool", "64M", "64k"),
                                         ("vm2", "128M", "pool2", "16M", "128k")):
        lk.lvm("lvcreate", "-y", "-n", lv, "-L", size, lk.VG, "/dev/mapper/hdd")
        lk.lvm("lvcreate", "-y", "-n", pool, "-L", psize, lk.VG, a.node)
        lk.lvm("lvconvert", "-y", "--type", "cache-pool", "--chunksize", chunk,
               f"{lk.VG}/{pool}")
        lk.lvm("lvconvert", "-y", "--type", "cache", "--cachepool", f"{lk.VG}/{pool}",
               "--cachemode", "writeback", f"{lk.VG}/{lv}")
    # seconds of fio under TCG (32 MiB at QD1 took 130 s): a few MiB in each cache
    lk.pre_write(lk.LV, "4M")
    lk.pre_write(lk.LV2, "4M")
    before, before2 = lk.cached_on(a.node), lk.cached_on(a.node, lk.LV2)
    r = lk.cm("replace-ssd", lk.LV, "--yes", env={replace.KILL_AFTER_ENV: "remove-old"})
    assert r.returncode == -9, r.stderr
    run = next(j for j in replace.list_runs() if j.status == "running")
    assert run.done[-1] == "remove-old" and run.lvs() == [lk.LV, lk.LV2]
    assert run.old["bus"] == "nvme" and run.old["slot"] == a.pci
    assert a.wwid not in {n.wwid for n in nvme.namespaces(sysfs)}  # pulled
    r = cm_here("replace-ssd", "--resume", run.id, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["status"] == "done" and res["new"]["wwid"] == a.wwid
    report_times("lvm-two-lvs-nvme-same-controller", res)
    node = res["new"]["node"]
    assert lk.cached_on(node) == before and lk.cached_on(node, lk.LV2) == before2
    lk.pre_verify(lk.LV, "4M")
    lk.pre_verify(lk.LV2, "4M")


class Terminal:
    """``python -m cachemgr ARGS`` on a pseudo-terminal: an operator who reads its prompts and
    answers them (replace-ssd asks for confirmation and for the swap only on a terminal)."""

    def __init__(self, *args: str) -> None:
        import pty

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cachemgr", *args], stdin=slave, stdout=slave,
            stderr=slave, start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()})
        os.close(slave)
        self.text = ""

    def expect(self, pattern: str, timeout: float = 600) -> str:
        """Wait until the output (since the last match) matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(pattern, self.text)):
            assert time.monotonic() < deadline, f"no {pattern!r} in: {self.text[-3000:]}"
            if select.select([self.master], [], [], 1.0)[0]:
                try:
                    self.text += os.read(self.master, 65536).decode(errors="replace")
                except OSError:  # EIO: the program ended and closed the terminal
                    assert self.proc.poll() is not None, self.text
                    assert re.search(pattern, self.text), f"ended without {pattern!r}: " \
                        f"{self.text[-3000:]}"
                    break
        m = re.search(pattern, self.text)
        assert m is not None
        seen, self.text = self.text[:m.end()], self.text[m.end():]
        return seen

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def wait(self, timeout: float = 900) -> tuple[int, str]:
        """The exit code and the rest of the output."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or select.select([self.master], [], [], 0)[0]:
            assert time.monotonic() < deadline, self.text[-3000:]
            if select.select([self.master], [], [], 1.0)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                    break
                self.text += chunk.decode(errors="replace")
        os.close(self.master)
        return self.proc.wait(), self.text


def _blkid_type(node: str) -> str:
    return runner.run(["blkid", "-p", "-o", "value", "-s", "TYPE", node],
                      check=False).stdout.strip()


@pytest.mark.kernel(disks="512M,512M,nvme:160M", timeout=1200, monitor=True)
def test_nvme_drive_swapped_in_its_slot_by_an_operator_wrong_drive_first(
        lab_disks: list[str]) -> None:
    """The replacement as done at a server: an operator at a terminal runs replace-ssd
    --new any, confirms the plan, and when asked pulls the NVMe drive out of its slot and puts
    another one in (qemu's monitor: device_del, device_add on the same PCIe root port), then
    presses Enter. The first drive put in carries a file system: refused, nothing written to
    it, the journal waits. The operator swaps it for a blank drive and resumes (killed once
    after identify-new, resumed again): the new drive, in the old one's PCI slot, is the
    cache, under fio verify load throughout."""
    sysfs, devices, (a,) = setup(lab_disks)
    rundir = Path(os.environ["LAB_RUNDIR"])
    wrong = str(labcore.make_image(rundir / "wrong.img", 192 << 20))
    runner.run(["mkfs.ext4", "-q", "-F", wrong], timeout=120)  # a drive holding data
    blank = str(labcore.make_image(rundir / "new.img", 192 << 20))
    old, modes = status_modes(sysfs)
    load = start_load(devices)
    try:
        with qmp.Qmp() as q:
            op = Terminal("replace-ssd", a.node, "--new", "any")
            op.expect(r"Go ahead\? \[y/N\]")
            op.send("y")
            op.expect(r"Insert the new SSD \(slot of the old one: [^)]*" + re.escape(a.pci)
                      + r"[^)]*\), then press Enter")
            # the old drive was taken out of the kernel (remove-old); now out of the slot
            assert a.wwid not in {n.wwid for n in nvme.namespaces(sysfs)}
            q.pull(qmp.CONTROLLER_ID.format(0))
            q.insert_nvme(slot=qmp.ROOT_PORT_ID.format(0), device_id="wrong", image=wrong,
                          serial="CMLABNVMEWRONG")
            op.send("")
            rc, out = op.wait()
            assert rc == 3, out
            assert "carries a ext4 signature; refusing to format it" in out, out
            (w,) = [n for n in nvme.namespaces(sysfs) if n.serial == "CMLABNVMEWRONG"]
            assert w.pci == a.pci  # it is in the old drive's slot
            assert _blkid_type(w.node) == "ext4"  # nothing was written to it
            (run,) = replace.list_runs()
            assert run.status == "failed" and (run.error or "").startswith("identify-new:")
            assert f"cachemgr replace-ssd --resume {run.id}" in out, out  # the hint
            # the operator takes the wrong drive out again and puts a blank one in
            q.pull("wrong")
            q.insert_nvme(slot=qmp.ROOT_PORT_ID.format(0), device_id="newssd", image=blank,
                          serial="CMLABNVMENEW")
        # killed once more, after the disk step that took the new drive (resumes from there)
        r = cm("replace-ssd", "--resume", run.id, env={replace.KILL_AFTER_ENV: "identify-new"})
        assert r.returncode == -9, (r.returncode, r.stderr)
        (run,) = replace.list_runs()
        assert run.done[-1] == "identify-new" and run.new["serial"] == "CMLABNVMENEW"
        r = cm("replace-ssd", "--resume", run.id, "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["status"] == "done"
        assert res["new"]["serial"] == "CMLABNVMENEW" and res["new"]["slot"] == a.pci
        report_times("bcache-nvme-swapped-in-slot", res)
        end_state(sysfs, old, modes)
        # the wrong drive left the machine as it came: still a file system (host-side image)
        assert runner.run(["blkid", "-p", "-o", "value", "-s", "TYPE", wrong],
                          check=False).stdout.strip() == "ext4"
    finally:
        stop_load(load)
    verify_pre(devices)
