"""NVMe hotplug on Debian's kernel in the qemu lab (issue #17 items 1 and 2): two emulated
NVMe controllers, each on its own PCIe root port. The backend finds the namespaces by their
controllers' serials, refuses to pull a controller whose namespace is in use, pulls one (its PCI
function's remove), and finds it again by its WWID after a PCI rescan, its data unchanged.

In the CI's qemu set these checks run in the guest of
test_replace_nvme_kernel.py::test_dmcache_on_nvme_partitions_moved_to_another_controller_under_load,
which has the same two controllers and goes on to replace a cache on them (a qemu guest's boot
and pytest's start cost ~25 CPU-s of TCG, as much as these checks' own guest did in all);
the test here runs them alone."""

from __future__ import annotations

import os

import pytest

from cachemgr.backends import hotplug, nvme
from cachemgr.core import runner
from cachemgr.core.errors import UnsafeError, UsageError
from cachemgr.core.sysfs import Sysfs

SIZE = 64 << 20


def _sha(node: str) -> str:
    return runner.run(["bash", "-c", f"head -c 4M {node} | sha256sum"]).stdout.split()[0]


@pytest.mark.kernel(disks="256M,nvme:64M,nvme:64M", timeout=300)
def test_nvme_identity_refusal_remove_and_rescan() -> None:
    identity_refusal_remove_and_rescan(Sysfs(), SIZE)


def identity_refusal_remove_and_rescan(sysfs: Sysfs, size: int
                                       ) -> tuple[nvme.NvmeNamespace, nvme.NvmeNamespace]:
    """The checks, on the lab's two controllers (namespaces of ``size`` bytes): their
    namespaces 1 after them (the first one as the rescan brought it back)."""
    serials = os.environ["LAB_NVME_SERIALS"].split()
    assert len(serials) == 2
    found = {n.serial: n for n in nvme.wait_for_all(sysfs, serials, 30)}
    a, b = found[serials[0]], found[serials[1]]
    assert a.controller != b.controller and a.wwid and b.wwid and a.wwid != b.wwid
    assert a.pci and b.pci and a.pci != b.pci and a.transport == "pcie"
    assert a.nsid == 1 and a.size_bytes == size
    assert nvme.siblings(sysfs, a) == []
    with pytest.raises(UsageError):
        nvme.namespace(sysfs, "vda")
    runner.run(["bash", "-c", f"head -c 4M /dev/urandom > {a.node}; sync"])
    before = _sha(a.node)
    # in use (a dm device on it): refused, nothing pulled
    runner.run(["dmsetup", "create", "hold", "--table", f"0 2048 linear {a.node} 0"])
    with pytest.raises(UnsafeError, match="is held by dm-"):
        nvme.remove(sysfs, a.name)
    assert os.path.exists(a.node)
    runner.run(["dmsetup", "remove", "hold"])
    # pulled: the namespace goes with its controller; found again by WWID after a rescan
    r = nvme.remove(sysfs, a.name)
    assert r.namespace.wwid == a.wwid
    assert a.wwid not in {n.wwid for n in nvme.namespaces(sysfs)}
    assert b.wwid in {n.wwid for n in nvme.namespaces(sysfs)}
    # re-inserted the way a journal says (hotplug.record: method pci-remove-rescan)
    rec = hotplug.record(a)
    assert rec["method"] == "pci-remove-rescan"
    assert hotplug.rescan(sysfs, rec) == "PCI bus rescanned"
    back = nvme.wait_for_namespace(sysfs, a.wwid, 30)
    assert back.serial == a.serial and back.pci == a.pci
    assert nvme.wait_for_namespace(sysfs, f"serial:{a.serial}", 1).wwid == a.wwid
    assert _sha(back.node) == before
    return back, b
