"""The NVMe hotplug backend on the capture tests/fixtures/nvme-pair-qemu (Debian 12's kernel,
qemu's NVMe controllers on their own PCIe root ports): nvme0n1 (serial CMLABNVME00) is the
cache device of a registered bcache set, nvme1n1 (CMLABNVME01) is blank. Writes go to a copy;
a write to a PCI function's ``remove`` takes its namespaces away as the kernel does."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cachemgr.backends import nvme
from cachemgr.core.errors import TimeoutExpired, UnsafeError, UsageError
from cachemgr.core.sysfs import Sysfs

FX = Path(__file__).resolve().parent.parent / "fixtures" / "nvme-pair-qemu"


class KernelLike(Sysfs):
    """A copied capture where ``bus/pci/devices/F/remove`` removes F's namespaces."""

    def write(self, rel: str, value: str) -> None:
        super().write(rel, value)
        parts = rel.split("/")
        if rel.startswith("bus/pci/devices/") and parts[-1] == "remove" and value == "1":
            for name in os.listdir(self.path("block")):
                ctrl = self.readlink(f"block/{name}/device")
                if ctrl and (self.read_opt(f"class/nvme/{os.path.basename(ctrl)}/address")
                             or "").strip() == parts[3]:
                    os.unlink(self.path(f"block/{name}"))


@pytest.fixture
def tree(tmp_path: Path) -> KernelLike:
    dst = tmp_path / "fx"
    shutil.copytree(FX, dst, symlinks=True)
    return KernelLike(dst / "sys")


def test_namespaces_with_their_controllers_identity() -> None:
    got = {n.name: n for n in nvme.namespaces(Sysfs(FX / "sys"))}
    assert sorted(got) == ["nvme0n1", "nvme1n1"]
    a, b = got["nvme0n1"], got["nvme1n1"]
    assert (a.controller, a.serial, a.pci, a.transport, a.nsid) == (
        "nvme0", "CMLABNVME00", "0000:01:00.0", "pcie", 1)
    assert b.serial == "CMLABNVME01" and b.pci == "0000:02:00.0"
    assert a.model == "QEMU NVMe Ctrl" and a.size_bytes == 128 << 20
    # qemu's controller: the kernel's fallback WWID (vendor, serial, model, nsid in hex)
    assert a.wwid == ("nvme.1b36-" + b"CMLABNVME00".hex() + "-"
                      + b"QEMU NVMe Ctrl".hex() + "-00000001")
    assert a.wwid != b.wwid and a.eui is None and a.uuid is None
    assert "nvme0n1 [PCI 0000:01:00.0]" in a.describe()


@pytest.mark.parametrize("name", ["vda", "bcache0", "nvme9n1", "ng0n1", "nvme0"])
def test_what_is_not_a_namespace_is_refused(name: str) -> None:
    with pytest.raises(UsageError, match="not an NVMe namespace"):
        nvme.namespace(Sysfs(FX / "sys"), name)


def test_a_namespace_in_use_is_not_pulled_and_nothing_is_written(tree: KernelLike) -> None:
    with pytest.raises(UnsafeError) as exc:
        nvme.remove(tree, "nvme0n1", mountinfo=None, swaps=None)
    assert "cache device of bcache cache set" in exc.value.message
    assert os.path.exists(tree.path("block/nvme0n1"))
    assert (tree.path("bus/pci/devices/0000:01:00.0/remove")).read_text() in ("", "\n")


def test_a_shared_controller_is_refused(tree: KernelLike) -> None:
    # a second namespace on nvme1's controller (the same files as nvme1n1, another nsid)
    src = Path(os.path.realpath(tree.path("block/nvme1n1")))
    dst = src.parent / "nvme1n2"
    shutil.copytree(src, dst, symlinks=True)
    (dst / "nsid").write_text("2\n")
    os.symlink(os.path.relpath(dst, tree.path("block")), tree.path("block/nvme1n2"))
    ns = nvme.namespace(tree, "nvme1n1")
    assert nvme.siblings(tree, ns) == ["nvme1n2"]
    with pytest.raises(UnsafeError, match="also carries /dev/nvme1n2"):
        nvme.remove(tree, "nvme1n1", mountinfo=None, swaps=None)


def test_a_controller_that_is_not_pcie_is_refused(tree: KernelLike) -> None:
    (Path(tree.path("class/nvme/nvme1")) / "transport").write_text("tcp\n")
    with pytest.raises(UnsafeError, match="not a PCIe function \\(transport tcp\\)"):
        nvme.remove(tree, "nvme1n1", mountinfo=None, swaps=None)


def test_a_mounted_namespace_is_refused(tree: KernelLike) -> None:
    devno = tree.read("block/nvme1n1/dev").strip()
    mi = f"36 1 {devno} / /srv rw,relatime - ext4 /dev/nvme1n1 rw\n"
    with pytest.raises(UnsafeError, match="mounted on /srv"):
        nvme.remove(tree, "nvme1n1", mountinfo=mi, swaps=None)


def test_remove_writes_the_pci_function_and_waits_until_gone(tree: KernelLike) -> None:
    r = nvme.remove(tree, "nvme1n1", mountinfo=None, swaps=None)
    assert r.namespace.serial == "CMLABNVME01"
    assert tree.path("bus/pci/devices/0000:02:00.0/remove").read_text().strip() == "1"
    assert [n.name for n in nvme.namespaces(tree)] == ["nvme0n1"]


def test_remove_times_out_when_the_kernel_keeps_it(tmp_path: Path) -> None:
    dst = tmp_path / "fx"
    shutil.copytree(FX, dst, symlinks=True)
    with pytest.raises(TimeoutExpired, match="still there"):
        nvme.remove(Sysfs(dst / "sys"), "nvme1n1", timeout=0.2, mountinfo=None, swaps=None)


def test_wait_for_a_namespace_by_wwid_serial_or_not_at_all() -> None:
    s = Sysfs(FX / "sys")
    wwid = nvme.namespace(s, "nvme1n1").wwid
    assert wwid is not None
    assert nvme.wait_for_namespace(s, wwid, 1, ready=lambda _: True).name == "nvme1n1"
    assert nvme.wait_for_namespace(s, "serial:CMLABNVME00", 1,
                                   ready=lambda _: True).name == "nvme0n1"
    with pytest.raises(TimeoutExpired, match="no NVMe namespace with serial NOPE"):
        nvme.wait_for_namespace(s, "serial:NOPE", 0.2, ready=lambda _: True)
    with pytest.raises(UsageError):
        nvme.NsMatch.parse("  ")


def test_rescan_writes_the_bus_rescan_file(tree: KernelLike) -> None:
    nvme.rescan(tree)
    assert tree.path("bus/pci/rescan").read_text().strip() == "1"
