from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.core.errors import LabError, UsageError
from cachemgr.lab import core, kernels
from cachemgr.lab.core import parse_disk_specs, parse_disks, parse_size


def test_sizes() -> None:
    assert parse_disks("1G,256M") == (1 << 30, 256 << 20)
    assert parse_size("2048k") == 2 << 20
    assert parse_size("2GiB") == 2 << 30
    for bad in ("", "1X", "-1G", "10"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_nvme_disks_are_their_own_list_and_qemu_only(tmp_path: object) -> None:
    assert parse_disk_specs("1G,nvme:512M, NVMe:256M,256M") == (
        (1 << 30, 256 << 20), (512 << 20, 256 << 20))
    with pytest.raises(UsageError, match="nvme: disks are not taken here"):
        parse_disks("1G,nvme:512M")
    with pytest.raises(UsageError):
        parse_disk_specs("nvme:")
    with pytest.raises(UsageError, match="NVMe disks need the qemu backend"):
        core.run(["true"], core.LabSpec(backend="uml", nvme=(1 << 30,)))
    # fixed identities, different per controller
    assert core.nvme_serial(0) != core.nvme_serial(1) and len(core.nvme_serial(99)) <= 20
    assert core.nvme_eui64(0) != core.nvme_eui64(1)


DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(DEB822)
    (d / "other.sources").write_text("Types: deb\nURIs: https://x.invalid/apt\nSuites: nodistro\n")
    assert kernels.debian_mirror(tmp_path / "none", d) == "http://mirror.invalid/debian"


def test_mirror_from_one_line_list(tmp_path: Path) -> None:
    f = tmp_path / "sources.list"
    f.write_text("# c\ndeb [arch=amd64] http://m.invalid/debian/ bookworm main\n")
    assert kernels.debian_mirror(f, tmp_path / "none") == "http://m.invalid/debian"


def test_no_mirror_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LabError) as exc:
        kernels.debian_mirror(tmp_path / "a", tmp_path / "b")
    assert "mirror" in str(exc.value)


def test_this_machine_has_a_mirror() -> None:
    assert kernels.debian_mirror().startswith(("http://", "https://", "file:"))
