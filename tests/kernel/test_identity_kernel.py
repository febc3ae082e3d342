"""Block device identities on the lab kernel, against udevadm, lsblk, blkid and bcache-tools.

The disks are scsi_debug's. Its identifiers are fixed by drivers/scsi/scsi_debug.c: with
``vpd_use_hostno=0`` a disk's number is 2000 + 1000 * target + lun, its unit serial (VPD 0x80)
is that number in decimal and its LUN designator a locally assigned NAA, 0x3333333 followed by
the number in 36 bits (target 0: serial ``2000``, ``naa.33333330000007d0``).
"""

from __future__ import annotations

import json
import os

import pytest

from cachemgr.backends import bcache, identity, scsi
from cachemgr.backends.identity import normalize_wwn
from cachemgr.backends.scsi import ScsiDisk
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs


def scsi_debug_ids(d: ScsiDisk) -> tuple[str, str]:
    """(serial, wwn) scsi_debug gives the disk at ``d.hctl`` (vpd_use_hostno=0)."""
    num = 2000 + 1000 * d.hctl.target + d.hctl.lun
    return str(num), f"naa.3333333{num:09x}"


def load(dev_size_mb: int, num_tgts: int) -> tuple[Sysfs, tuple[ScsiDisk, ...]]:
    sysfs = Sysfs()
    found = scsi.load_scsi_debug(sysfs, dev_size_mb=dev_size_mb, num_tgts=num_tgts,
                                 vpd_use_hostno=0)
    return sysfs, found


def udev_props(node: str) -> dict[str, str]:
    out = runner.run(["udevadm", "info", "--query=property", f"--name={node}"]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def lsblk() -> dict[str, dict[str, str | None]]:
    out = runner.run(["lsblk", "-J", "-o", "NAME,SERIAL,WWN,MODEL"]).stdout
    return {d["name"]: d for d in json.loads(out)["blockdevices"]}


@pytest.mark.kernel(udev=True)
def test_identity_with_udevd() -> None:
    sysfs, found = load(dev_size_mb=16, num_tgts=2)
    runner.run(["udevadm", "settle", "--timeout=30"])
    table = lsblk()
    assert len(found) == 2
    for d in found:
        serial, wwn = scsi_debug_ids(d)
        props = udev_props(d.node)
        u = identity.udev_info(d.name)
        assert u is not None, f"udevd has no data for {d.name}"
        assert u.serial == props["ID_SERIAL"] and u.serial_short == props["ID_SERIAL_SHORT"]
        assert u.scsi_serial == props["ID_SCSI_SERIAL"] == serial
        assert props["ID_WWN"] == "0x" + wwn.removeprefix("naa.")

        ident = identity.identify(sysfs, d.name)
        assert ident.serial == serial == table[d.name]["serial"]
        assert ident.wwn == wwn == normalize_wwn(table[d.name]["wwn"])
        assert ident.wwn == sysfs.read(f"block/{d.name}/device/wwid")
        assert ident.model == table[d.name]["model"] == "scsi_debug"
        links = {x for x in props["DEVLINKS"].split() if x.startswith("/dev/disk/by-id/")}
        assert set(ident.by_id) == links
        assert f"/dev/disk/by-id/wwn-{props['ID_WWN']}" in ident.by_id
        assert f"/dev/disk/by-id/scsi-{props['ID_SERIAL']}" in ident.by_id
        for link in ident.by_id:
            assert os.path.realpath(link) == d.node


@pytest.mark.kernel()
def test_identity_without_udevd() -> None:
    sysfs, found = load(dev_size_mb=16, num_tgts=2)
    assert not os.path.exists("/dev/disk/by-id")
    table = lsblk()
    for d in found:
        serial, wwn = scsi_debug_ids(d)
        assert identity.udev_info(d.name) is None  # pyudev sees it, udevd never recorded it
        ident = identity.identify(sysfs, d.name)
        assert ident.by_id == ()
        assert ident.serial == serial == table[d.name]["serial"]  # lsblk reads sysfs too
        assert ident.wwn == wwn == sysfs.read(f"block/{d.name}/device/wwid")
        assert ident.size_bytes == 16 << 20 and ident.devno == sysfs.read(f"block/{d.name}/dev")
        # the VPD pages, parsed here, say what the kernel says
        assert identity.vpd_serial(sysfs, f"block/{d.name}") == serial
        assert identity.vpd_wwid(sysfs, f"block/{d.name}") == wwn


@pytest.mark.kernel()
def test_blkid_sees_bcache_after_make_bcache() -> None:
    sysfs, (d,) = load(dev_size_mb=64, num_tgts=1)
    assert identity.identify(sysfs, d.name).fs_type is None
    assert identity.probe_superblock(d.node) is None
    bcache.make_bcache(cache=d.node, bucket="64k")
    sb = identity.probe_superblock(d.node)
    assert sb is not None and sb.type == "bcache"
    ident = identity.identify(sysfs, d.name)
    show = runner.run(["bcache-super-show", d.node]).stdout
    dev_uuid = next(line.split()[1] for line in show.splitlines() if line.startswith("dev.uuid"))
    assert ident.fs_type == "bcache" and ident.fs_uuid == sb.uuid == dev_uuid
    blkid = runner.run(["blkid", "-p", "-o", "value", "-s", "UUID", d.node]).stdout.strip()
    assert blkid == dev_uuid
