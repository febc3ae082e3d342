"""SSD replacement with an NVMe cache SSD (issue #17 item 3), on Debian's kernel in the qemu
lab: two emulated NVMe controllers, each on its own PCIe root port; bcache over a dm-delay
"HDD" and a second scratch disk, its cache on the first controller's namespace; fio writing
and verifying on every /dev/bcacheN throughout.

The procedure's steps are the same code for SCSI and NVMe but for the disk ones (remove-old
pulls the controller's PCI function, wait-new rescans the PCI bus and finds the namespace by
its WWID, identify-new); a kill with the controller pulled is tested here, every kill point on
SCSI (tests/kernel/test_replace_kernel.py, test_replace_dmcache_kernel.py). A dm-cache device
whose cache and metadata are partitions of an NVMe namespace is moved to the other
controller's namespace under load."""

from __future__ import annotations

import json
import os

import pytest

from cachemgr.backends import nvme, snapshot
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace
from tests.kernel.test_replace_kernel import (
    FIO_COMMON,
    bcache_holding_dirt,
    cm,
    cm_here,
    end_state,
    start_load,
    status_modes,
    stop_load,
    verify_pre,
)


def setup(lab_disks: list[str]) -> tuple[Sysfs, list[str], list[nvme.NvmeNamespace]]:
    sysfs = Sysfs()
    ssds = nvme.wait_for_all(sysfs, os.environ["LAB_NVME_SERIALS"].split(), 30)
    return sysfs, bcache_holding_dirt(sysfs, lab_disks, ssds[0].node), ssds


@pytest.mark.kernel(disks="512M,512M,nvme:160M,nvme:160M", timeout=1200)
@pytest.mark.qemu_smoke
def test_nvme_cache_replaced_under_verify_load_killed_at_the_pci_steps(
        lab_disks: list[str]) -> None:
    sysfs, devices, (a, b) = setup(lab_disks)
    old, modes = status_modes(sysfs)
    load = start_load(devices)
    try:
        # the plan names the PCI method; a dry run changes nothing
        r = cm("replace-ssd", a.node, "--dry-run")
        assert r.returncode == 0, r.stderr
        assert "remove-old" in r.stdout and f"PCI {a.pci}" in r.stdout, r.stdout
        assert status_modes(sysfs) == (old, modes) and not replace.list_runs()
        # killed right after the controller was pulled (the PCI-specific state: the drive is
        # out and the journal must bring it back by a PCI rescan)
        for step in ("remove-old",):
            old, modes = status_modes(sysfs)
            ssd = snapshot.take(sysfs).cache_sets[0].caches[0].identity.node
            r = cm("replace-ssd", ssd, "--yes", env={replace.KILL_AFTER_ENV: step})
            assert r.returncode == -9, (step, r.returncode, r.stderr)
            runs = [j for j in replace.list_runs() if j.status == "running"]
            assert len(runs) == 1 and runs[0].done[-1] == step
            assert runs[0].old["bus"] == "nvme" and runs[0].old["slot"] == a.pci
            r = cm_here("replace-ssd", "--resume", runs[0].id, "--json")
            assert r.returncode == 0, (step, r.stderr)
            res = json.loads(r.stdout)
            assert res["status"] == "done"
            end_state(sysfs, old, modes)
            # the same controller came back in its slot: same WWID and PCI function
            assert res["new"]["wwid"] == a.wwid
            back = nvme.namespace(sysfs, res["new"]["name"])
            assert back.pci == a.pci and back.serial == a.serial
        # a different NVMe drive (the second controller) by its WWID
        old, modes = status_modes(sysfs)
        ssd = snapshot.take(sysfs).cache_sets[0].caches[0].identity.node
        r = cm("replace-ssd", ssd, "--new", f"wwn:{b.wwid}", "--yes", "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["new"]["wwid"] == b.wwid and res["new"]["slot"] == b.pci
        end_state(sysfs, old, modes)
        # the old drive was pulled and stays out (it was replaced)
        assert a.wwid not in {n.wwid for n in nvme.namespaces(sysfs)}
    finally:
        stop_load(load)
    verify_pre(devices)


@pytest.mark.kernel(disks="512M,nvme:192M,nvme:192M", timeout=1200)
@pytest.mark.qemu_smoke
def test_dmcache_on_nvme_partitions_moved_to_another_controller_under_load(
        lab_disks: list[str]) -> None:
    from tests.kernel import test_replace_dmcache_kernel as dmk

    sysfs = Sysfs()
    a, b = nvme.wait_for_all(sysfs, os.environ["LAB_NVME_SERIALS"].split(), 30)
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
    load = start_load(["/dev/mapper/vc"])
    try:
        r = cm("replace-ssd", "/dev/mapper/vc", "--new", f"wwn:{b.wwid}", "--yes", "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["kind"] == "dmcache" and res["old"]["bus"] == "nvme"
        assert res["new"]["wwid"] == b.wwid and res["new"]["slot"] == b.pci
        node = res["new"]["node"]
        dmk.end_state(sysfs, before, (f"{node}p1", f"{node}p2"))
        assert a.wwid not in {n.wwid for n in nvme.namespaces(sysfs)}  # pulled
    finally:
        stop_load(load)
    verify_pre(["/dev/mapper/vc"])
