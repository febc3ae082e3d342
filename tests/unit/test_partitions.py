"""backends/partitions: sfdisk's own dumps (tests/fixtures/sfdisk, util-linux 2.38.1) made into
a script for another disk, and that script read back by sfdisk itself (on an image file)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cachemgr.backends import partitions
from cachemgr.core.errors import CacheMgrError

FX = Path(__file__).resolve().parent.parent / "fixtures" / "sfdisk"


@pytest.mark.parametrize("disk,first", [("sdq", "sdq1"), ("nvme1n1", "nvme1n1p1"),
                                        ("ubda", "ubda1")])
def test_partition_names_follow_the_kernel(disk: str, first: str) -> None:
    assert partitions.part_name(disk, 1) == first


def test_a_gpt_dump_for_another_disk_keeps_the_layout_not_the_identifiers() -> None:
    script = partitions.for_disk((FX / "gpt-two.dump").read_text(), "nvme1n1")
    lines = script.splitlines()
    assert lines[0] == "label: gpt"
    assert not any(x.startswith(("label-id", "device", "last-lba")) for x in lines)
    assert "uuid=" not in script
    parts = [x for x in lines if x.startswith("/dev/")]
    assert parts == [
        "/dev/nvme1n1p1 : start=        2048, size=       32768, "
        "type=0FC63DAF-8483-4772-8E79-3D69D8477DE4",
        "/dev/nvme1n1p2 : start=       34816, size=      262144, "
        "type=0FC63DAF-8483-4772-8E79-3D69D8477DE4"]


def test_a_dos_dump_keeps_its_types() -> None:
    script = partitions.for_disk((FX / "dos-two.dump").read_text(), "sdc")
    assert "label: dos" in script and "/dev/sdc2 : start=       34816, size=      262144, " \
        "type=83" in script and "0x" not in script


def test_no_label_is_refused() -> None:
    with pytest.raises(CacheMgrError, match="without a label"):
        partitions.for_disk("/dev/sdb1 : start=2048, size=8\n", "sdc")


@pytest.mark.skipif(shutil.which("sfdisk") is None,
                    reason="sfdisk (Debian package fdisk, installed by scripts/setup.sh)")
def test_sfdisk_reads_the_script_back(tmp_path: Path) -> None:
    img = tmp_path / "img"
    img.write_bytes(b"")
    subprocess.run(["truncate", "-s", "200M", str(img)], check=True)
    script = partitions.for_disk((FX / "gpt-two.dump").read_text(), "sdq")
    subprocess.run(["sfdisk", "--quiet", str(img)], input=script, text=True, check=True)
    again = partitions.for_disk(partitions.dump(str(img)), "sdq")
    assert again == script  # same label, starts, sizes and types; new identifiers dropped
