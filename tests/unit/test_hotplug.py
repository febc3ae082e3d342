"""backends/hotplug: one face for SCSI disks and NVMe namespaces, on two captures:
tests/fixtures/nvme-pair-qemu (Debian 12's kernel; nvme0n1, serial CMLABNVME00, is the cache
device of a registered bcache set, nvme1n1, CMLABNVME01, is blank) and
tests/fixtures/scsi-ssd-in-use-uml (sda the cache device of a bcache set, sdb held by a dm
linear device)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cachemgr.backends import hotplug, nvme, scsi
from cachemgr.core.errors import TimeoutExpired, UsageError
from cachemgr.core.sysfs import Sysfs

FX = Path(__file__).resolve().parent.parent / "fixtures"
NV = Sysfs(FX / "nvme-pair-qemu" / "sys")
SC = Sysfs(FX / "scsi-ssd-in-use-uml" / "sys")


def test_each_bus_is_found_with_its_slot() -> None:
    a = hotplug.disk(NV, "nvme0n1")
    assert isinstance(a, nvme.NvmeNamespace)
    assert (hotplug.bus(a), hotplug.slot(a), hotplug.where(a)) == (
        "nvme", "0000:01:00.0", "PCI 0000:01:00.0")
    s = hotplug.disk(SC, "sda")
    assert isinstance(s, scsi.ScsiDisk)
    assert hotplug.bus(s) == "scsi" and hotplug.slot(s) == str(s.hctl)
    assert sorted(d.name for d in hotplug.disks(NV)) == ["nvme0n1", "nvme1n1"]
    assert {d.name for d in hotplug.disks(SC)} >= {"sda", "sdb"}


@pytest.mark.parametrize("name", ["vda", "bcache0", "nosuch"])
def test_what_is_neither_is_refused(name: str) -> None:
    with pytest.raises(UsageError, match="neither a SCSI disk nor an NVMe namespace"):
        hotplug.disk(NV, name)


def test_a_journal_record_says_where_the_disk_was() -> None:
    r = hotplug.record(hotplug.disk(NV, "nvme0n1"))
    assert (r["bus"], r["slot"], r["controller"], r["serial"]) == (
        "nvme", "0000:01:00.0", "nvme0", "CMLABNVME00")
    assert hotplug.slot_words(r) == "PCI 0000:01:00.0"
    s = hotplug.record(hotplug.disk(SC, "sda"))
    assert hotplug.slot_words(s) == f"SCSI {s['host']} [{s['hctl']}]"
    # a journal from before NVMe support: no bus, SCSI
    assert hotplug.slot_words({"host": "host0", "hctl": "0:0:0:0"}) == "SCSI host0 [0:0:0:0]"


@pytest.mark.parametrize("text,kind", [
    ("0:0:1:0", "slot"), ("0000:01:00.0", "slot"), ("serial:CMLABNVME00", "serial"),
    ("CMLABNVME00", "serial"), ("naa.33333330000007d0", "wwn"), ("wwn:0x33333330000007d0", "wwn"),
])
def test_match_forms(text: str, kind: str) -> None:
    m = hotplug.Match.parse(text)
    assert m.kind == kind
    assert hotplug.Match.parse(m.words()) == m


def test_a_namespace_is_matched_by_wwid_serial_and_slot() -> None:
    a = hotplug.disk(NV, "nvme0n1")
    assert a.wwid
    for text in (a.wwid, f"wwn:{a.wwid}", "serial:CMLABNVME00", "0000:01:00.0"):
        assert [d.name for d in hotplug.find(NV, hotplug.Match.parse(text))] == ["nvme0n1"]
    assert hotplug.find(NV, hotplug.Match.parse("serial:CMLABNVME09")) == []
    # a SCSI disk's serial does not name a namespace, nor the other way round
    s = hotplug.disk(SC, "sda")
    assert s.serial and [d.name for d in hotplug.find(
        SC, hotplug.Match.parse(f"serial:{s.serial}"))] == ["sda"]
    assert hotplug.find(SC, hotplug.Match.parse("serial:CMLABNVME00")) == []


def test_the_cache_device_itself_is_no_reason_at_plan_time() -> None:
    a = hotplug.disk(NV, "nvme0n1")
    assert hotplug.in_use(NV, a, mountinfo=None, swaps=None)  # bcache holds it
    assert hotplug.removal_refusals_besides(NV, a, "nvme0n1", mountinfo=None,
                                            swaps=None) == ()
    s = hotplug.disk(SC, "sda")
    assert hotplug.removal_refusals_besides(SC, s, "sda", mountinfo=None, swaps=None) == ()


def test_other_uses_refuse_at_plan_time(tmp_path: Path) -> None:
    dst = tmp_path / "fx"
    shutil.copytree(FX / "nvme-pair-qemu", dst, symlinks=True)
    tree = Sysfs(dst / "sys")
    a = hotplug.disk(tree, "nvme0n1")
    # the root file system on the cache SSD's controller: a second namespace, mounted on /
    src = Path(os.path.realpath(tree.path("block/nvme0n1")))
    sib = src.parent / "nvme0n2"
    shutil.copytree(src, sib, symlinks=True)
    shutil.rmtree(sib / "bcache")
    (sib / "nsid").write_text("2\n")
    (sib / "dev").write_text("259:9\n")
    os.symlink(os.path.relpath(sib, tree.path("block")), tree.path("block/nvme0n2"))
    mi = "22 1 259:9 / / rw,relatime - ext4 /dev/nvme0n2 rw\n"
    why = hotplug.removal_refusals_besides(tree, a, "nvme0n1", mountinfo=mi, swaps=None)
    assert any("also carries /dev/nvme0n2" in w for w in why), why
    assert "/dev/nvme0n2 is mounted on / (ext4), the root file system" in why, why
    # the same disk's own other use (swap on it) refuses a SCSI SSD too
    s = hotplug.disk(SC, "sda")
    why = hotplug.removal_refusals_besides(SC, s, "sda", mountinfo=None,
                                           swaps="Filename Type\n/dev/sda partition 1 0 -2\n")
    assert why == ("/dev/sda is in use as swap",)


def test_remove_and_rescan_say_what_they_did(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    dst = tmp_path / "fx"
    shutil.copytree(FX / "nvme-pair-qemu", dst, symlinks=True)
    tree = Sysfs(dst / "sys")
    b = hotplug.disk(tree, "nvme1n1")
    # the kernel takes the namespace away when its PCI function's remove is written
    real_write = Sysfs.write

    def write(self: Sysfs, rel: str, value: str) -> None:
        real_write(self, rel, value)
        if rel == "bus/pci/devices/0000:02:00.0/remove":
            os.unlink(self.path("block/nvme1n1"))

    monkeypatch.setattr(Sysfs, "write", write)
    r = hotplug.remove(tree, b)
    assert r.how == "NVMe controller nvme1 (PCI 0000:02:00.0) removed"
    assert hotplug.rescan(tree, hotplug.record(b)) == "PCI bus rescanned"
    assert tree.path("bus/pci/rescan").read_text().strip() == "1"
    rec = hotplug.record(b)
    assert rec["method"] == "pci-remove-rescan"
    words = hotplug.method_words(rec)
    assert words.startswith("PCI remove/rescan (PCI function 0000:02:00.0 ")
    assert "slot's power is not used" in words
    with pytest.raises(UsageError, match="hotplug method 'slot-power'"):
        hotplug.rescan(tree, {**rec, "method": "slot-power"})
    # a journal written before the method was recorded: its bus's one method
    assert hotplug.rescan(tree, {k: v for k, v in rec.items() if k != "method"}) \
        == "PCI bus rescanned"


def test_wait_names_what_is_there() -> None:
    m = hotplug.Match.parse("serial:CMLABNVME00")
    assert hotplug.wait_for(NV, m, 1, ready=lambda _n: True).name == "nvme0n1"
    with pytest.raises(TimeoutExpired, match=r"no disk with serial NOPE.*nvme1n1"):
        hotplug.wait_for(NV, hotplug.Match.parse("serial:NOPE"), 0.2, ready=lambda _n: True)
