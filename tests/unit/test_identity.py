"""Block device identities on captured lab trees, cross-checked with the lab's own tools.

The capture tests/fixtures/scsi-ssd-in-use-*/ holds, besides sys/, what udevd, lsblk and blkid
said in the same guest (udev-db.txt, lsblk.json, blkid.txt): the identity read from the
capture must agree with them, with the udev database and without it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cachemgr.backends import identity
from cachemgr.backends.identity import (
    Designator,
    Superblock,
    UdevInfo,
    kernel_wwid,
    normalize_wwn,
    parse_udev_db,
    parse_vpd_pg80,
    parse_vpd_pg83,
)
from cachemgr.core.errors import KernelFormatError, UsageError
from cachemgr.core.sysfs import Sysfs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SCSI = sorted(FIXTURES.glob("scsi-ssd-in-use-*"))
assert SCSI, "no scsi-ssd-in-use capture (scripts/capture-fixtures.sh scsi-ssd-in-use)"
fx_param = pytest.mark.parametrize("fx", SCSI, ids=lambda p: p.name)


def udev_db(fx: Path) -> dict[str, UdevInfo]:
    return parse_udev_db((fx / "udev-db.txt").read_text())


def lsblk(fx: Path) -> dict[str, dict[str, object]]:
    return {d["name"]: d for d in json.loads((fx / "lsblk.json").read_text())["blockdevices"]}


def blkid_export(fx: Path) -> dict[str, dict[str, str]]:
    """``blkid -p -o export`` blocks by device node."""
    out = {}
    for block in (fx / "blkid.txt").read_text().split("\n\n"):
        kv = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if kv:
            out[kv["DEVNAME"]] = kv
    return out


def blkid_prober(fx: Path) -> identity.Prober:
    table = blkid_export(fx)

    def probe(node: str) -> Superblock | None:
        values = table.get(node)
        # pylibblkid hands bytes values: feed the captured text the same way
        return Superblock.from_probe({k: v.encode() for k, v in values.items()}) if values else None

    return probe


def raw(fx: Path, rel: str) -> str:
    return (fx / "sys" / rel).read_text().strip()


def scsi_names(fx: Path) -> list[str]:
    return sorted(n for n in lsblk(fx) if n.startswith("sd"))


def at(fx: Path, want: str) -> str:
    """``@T``: the disk at SCSI target T (the async probe decides which is sda); else as is.

    scsi_debug's ids follow the target: target 0 is serial 2000, naa.33333330000007d0.
    """
    if not want.startswith("@"):
        return want
    for name in scsi_names(fx):
        link = (fx / "sys" / "block" / name / "device").readlink()
        if link.name == f"0:0:{want[1:]}:0":
            return name
    raise AssertionError(f"no disk at target {want[1:]} in {fx}")


# ---------------------------------------------------------------------------- identity


@fx_param
def test_identity_with_udev_agrees_with_lsblk_and_udev(fx: Path) -> None:
    sysfs, db, lk = Sysfs(fx / "sys"), udev_db(fx), lsblk(fx)
    names = scsi_names(fx)
    assert names == ["sda", "sdb"]
    for name in names:
        ident = identity.identify(sysfs, name, udev=db.get, probe=blkid_prober(fx))
        row = lk[name]
        assert ident.serial == row["serial"]  # lsblk: ID_SCSI_SERIAL, the unit serial
        assert ident.wwn == normalize_wwn(str(row["wwn"]))
        assert ident.wwn == raw(fx, f"block/{name}/device/wwid")  # the kernel's own id
        assert ident.model == row["model"] == "scsi_debug"
        assert ident.size_bytes == row["size"] == 128 << 20
        assert ident.fs_type == row["fstype"] == "bcache"
        assert ident.fs_uuid == row["uuid"]
        assert ident.devno == raw(fx, f"block/{name}/dev")
        assert ident.node == f"/dev/{name}" and ident.partition_of is None
        # by-id: exactly udev's links under /dev/disk/by-id, the WWN one among them
        assert ident.by_id == db[name].by_id
        assert f"/dev/disk/by-id/wwn-0x{ident.wwn.removeprefix('naa.')}" in ident.by_id
        assert all(link.startswith("/dev/disk/by-id/") for link in ident.by_id)


@fx_param
def test_udev_serial_is_not_the_unit_serial_for_scsi(fx: Path) -> None:
    """udev's ID_SERIAL for SCSI is scsi_id's page 0x83 id (type digit + NAA hex)."""
    u = udev_db(fx)["sda"]
    assert u.scsi_serial == raw(fx, "block/sda/device/serial")
    assert u.serial == "3" + raw(fx, "block/sda/device/wwid").removeprefix("naa.")
    assert u.serial_short == raw(fx, "block/sda/device/wwid").removeprefix("naa.")
    assert u.unit_serial == u.scsi_serial
    assert f"/dev/disk/by-id/scsi-{u.serial}" in u.by_id


@fx_param
def test_identity_without_udev_falls_back_to_sysfs(fx: Path) -> None:
    sysfs, db = Sysfs(fx / "sys"), udev_db(fx)
    for name in scsi_names(fx):
        with_udev = identity.identify(sysfs, name, udev=db.get, probe=None)
        bare = identity.identify(sysfs, name, udev=None, probe=None)
        assert bare.serial == with_udev.serial and bare.wwn == with_udev.wwn
        assert bare.model == with_udev.model and bare.size_bytes == with_udev.size_bytes
        assert bare.by_id == () and bare.fs_type is None and bare.fs_uuid is None
        assert bare == identity.kernel_identity(sysfs, name)
    # a capture is not the live system: AUTO uses neither pyudev nor libblkid
    assert identity.identify(sysfs, "sda") == identity.identify(sysfs, "sda", udev=None,
                                                                probe=None)


@fx_param
def test_vpd_pages_stand_in_for_missing_serial_and_wwid(fx: Path, tmp_path: Path) -> None:
    """Kernels without device/serial (6.1) or device/wwid: the VPD pages give the same."""
    dst = tmp_path / "t"
    shutil.copytree(fx, dst, symlinks=True)
    before = {n: identity.kernel_identity(Sysfs(dst / "sys"), n) for n in scsi_names(fx)}
    for name in scsi_names(fx):
        dev = (dst / "sys" / "block" / name / "device").resolve()
        (dev / "serial").unlink()
        (dev / "wwid").unlink()
    for name in scsi_names(fx):
        after = identity.kernel_identity(Sysfs(dst / "sys"), name)
        assert after == before[name]
        assert after.serial and after.wwn
    # and with the pages gone too: unknown, not a crash
    for name in scsi_names(fx):
        dev = (dst / "sys" / "block" / name / "device").resolve()
        (dev / "vpd_pg80").unlink()
        (dev / "vpd_pg83").write_bytes(b"\x00\x83\x00\x10\x01")  # truncated: logged, None
        ident = identity.kernel_identity(Sysfs(dst / "sys"), name)
        assert ident.serial is None and ident.wwn is None
        assert ident.size_bytes == 128 << 20


@fx_param
def test_blkid_superblock_beats_udev_and_matches_capture(fx: Path) -> None:
    sysfs, db = Sysfs(fx / "sys"), udev_db(fx)
    table = blkid_export(fx)
    for node, kv in table.items():
        name = node.removeprefix("/dev/")
        ident = identity.identify(sysfs, name, udev=None, probe=blkid_prober(fx))
        assert (ident.fs_type, ident.fs_uuid) == (kv["TYPE"], kv["UUID"])
        assert ident.fs_type == "bcache"
        assert ident.fs_uuid == db[name].fs_uuid
    # a fresh probe wins over udev's (possibly stale) database
    fake = identity.identify(sysfs, "sda", udev=db.get,
                             probe=lambda _n: Superblock(type="ext4", uuid="u-1"))
    assert (fake.fs_type, fake.fs_uuid) == ("ext4", "u-1")


@fx_param
def test_non_scsi_devices(fx: Path) -> None:
    sysfs, db, lk = Sysfs(fx / "sys"), udev_db(fx), lsblk(fx)
    ubda = identity.identify(sysfs, "ubda", udev=db.get, probe=None)
    # UML's ubd prints its unset serial as "(null)": that is no serial (lsblk agrees)
    assert raw(fx, "block/ubda/serial") == "(null)"
    assert ubda.serial is None and lk["ubda"]["serial"] is None
    assert ubda.wwn is None and ubda.by_id == ()
    assert ubda.fs_type == "bcache"
    dm = identity.identify(sysfs, "dm-0", udev=db.get, probe=None)
    assert dm.node == "/dev/mapper/held" and dm.size_bytes == 2048 * 512
    everything = identity.identify_all(sysfs, udev=db.get, probe=None)
    assert {"sda", "sdb", "ubda", "dm-0", "bcache0"} <= set(everything)
    with pytest.raises(UsageError) as exc:
        identity.identify(sysfs, "sdz")
    assert "sdz" in str(exc.value) and exc.value.hint


# ---------------------------------------------------------------------------- parsers


def test_vpd_pages_from_the_capture() -> None:
    for fx in SCSI:
        for name in scsi_names(fx):
            dev = fx / "sys" / "block" / name / "device"
            assert parse_vpd_pg80((dev / "vpd_pg80").read_bytes()) == raw(
                fx, f"block/{name}/device/serial")
            designators = parse_vpd_pg83((dev / "vpd_pg83").read_bytes())
            assert len(designators) == 7
            assert designators[0].type == identity.TYPE_T10
            assert designators[0].value.startswith(b"Linux   scsi_debug")
            # the kernel's own choice, recomputed
            assert kernel_wwid(designators) == raw(fx, f"block/{name}/device/wwid")


def page(code: int, payload: bytes) -> bytes:
    return bytes([0, code]) + len(payload).to_bytes(2, "big") + payload


printable = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                    min_size=1, max_size=40)


@given(serial=printable, lpad=st.integers(0, 8), rpad=st.integers(0, 8),
       nul=st.booleans())
@example(serial="2000", lpad=0, rpad=0, nul=False)
def test_pg80_any_valid_page_parses(serial: str, lpad: int, rpad: int, nul: bool) -> None:
    pad = b"\0" if nul else b" "
    data = page(0x80, b" " * lpad + serial.encode() + pad * rpad)
    assert parse_vpd_pg80(data) == serial


@given(data=st.binary(max_size=3))
def test_pg80_short_page(data: bytes) -> None:
    with pytest.raises(KernelFormatError) as exc:
        parse_vpd_pg80(data)
    assert exc.value.text == data.hex(" ")


@given(serial=printable, cut=st.integers(1, 40))
def test_pg80_truncated_page(serial: str, cut: int) -> None:
    data = page(0x80, serial.encode())
    cut = min(cut, len(serial))
    with pytest.raises(KernelFormatError) as exc:
        parse_vpd_pg80(data[:-cut])
    assert "page length" in str(exc.value) and exc.value.text == data[:-cut].hex(" ")


@given(code=st.integers(0, 255).filter(lambda c: c != 0x80), serial=printable)
def test_pg80_wrong_page_code(code: int, serial: str) -> None:
    with pytest.raises(KernelFormatError, match="page code"):
        parse_vpd_pg80(page(code, serial.encode()))


@given(serial=printable, bad=st.integers(0x80, 0xFF) | st.integers(1, 0x1F).filter(
    lambda b: b not in (0x09, 0x0A, 0x0D)))
def test_pg80_non_ascii_serial(serial: str, bad: int) -> None:
    data = page(0x80, serial.encode() + bytes([bad]) + serial.encode())
    with pytest.raises(KernelFormatError, match="printable"):
        parse_vpd_pg80(data)


designators = st.builds(
    Designator,
    protocol=st.integers(0, 15),
    code_set=st.integers(0, 15),
    piv=st.booleans(),
    association=st.integers(0, 3),
    type=st.integers(0, 15),
    value=st.binary(max_size=255),
)


@given(ds=st.lists(designators, max_size=8), trailing=st.binary(max_size=4))
def test_pg83_any_valid_page_parses(ds: list[Designator], trailing: bytes) -> None:
    body = b"".join(d.encode() for d in ds)
    if len(body) > 0xFFFF:
        return
    assert parse_vpd_pg83(page(0x83, body) + trailing) == tuple(ds)


@given(ds=st.lists(designators, min_size=1, max_size=6), data=st.data())
def test_pg83_truncated_descriptor(ds: list[Designator], data: st.DataObject) -> None:
    body = b"".join(d.encode() for d in ds)
    # claim the page ends inside the last descriptor (header or value)
    last = len(ds[-1].encode())
    cut = data.draw(st.integers(1, last - 1)) if last > 1 else 0
    if cut == 0:
        return
    short = body[:-cut]
    bad = page(0x83, short)
    with pytest.raises(KernelFormatError) as exc:
        parse_vpd_pg83(bad)
    assert "0x83" in str(exc.value) and exc.value.text == bad.hex(" ")


@given(ds=st.lists(designators, min_size=1, max_size=6), cut=st.integers(1, 300))
def test_pg83_page_shorter_than_its_length(ds: list[Designator], cut: int) -> None:
    full = page(0x83, b"".join(d.encode() for d in ds))
    cut = min(cut, len(full) - 4)
    with pytest.raises(KernelFormatError, match="page length") as exc:
        parse_vpd_pg83(full[:-cut])
    assert exc.value.text == full[:-cut].hex(" ")


@given(ds=st.lists(designators, max_size=4), code=st.integers(0, 255).filter(
    lambda c: c != 0x83))
def test_pg83_wrong_page_code(ds: list[Designator], code: int) -> None:
    with pytest.raises(KernelFormatError, match="page code"):
        parse_vpd_pg83(page(code, b"".join(d.encode() for d in ds)))


@given(data=st.binary(max_size=64))
def test_pg83_arbitrary_bytes_parse_or_raise_typed(data: bytes) -> None:
    try:
        parse_vpd_pg83(data)
    except KernelFormatError as exc:
        assert exc.text == data.hex(" ")


def naa(value: bytes, association: int = 0) -> Designator:
    return Designator(0, 1, False, association, identity.TYPE_NAA, value)


def test_kernel_wwid_preferences() -> None:
    t10 = Designator(0, 2, False, 0, identity.TYPE_T10, b"ATA     Disk 1")
    local = naa(bytes.fromhex("33333330000007d0"))
    registered = naa(bytes.fromhex("5000c500a1b2c3d4"))
    extended = naa(bytes.fromhex("6000c500a1b2c3d40000000000000001"))
    port = naa(bytes.fromhex("5000c500a1b2c3ff"), association=1)
    eui = Designator(0, 1, False, 0, identity.TYPE_EUI64, bytes.fromhex("0025385b71b07a3c"))
    name = Designator(0, 3, False, 0, identity.TYPE_SCSI_NAME, b"iqn.2004-01.x:y\0")
    assert kernel_wwid([]) is None
    assert kernel_wwid([port]) is None  # not the LUN's
    assert kernel_wwid([t10]) == "t10.ATA     Disk 1"
    assert kernel_wwid([t10, local]) == "naa.33333330000007d0"  # equal prio: the later
    assert kernel_wwid([registered, t10, local]) == "naa.5000c500a1b2c3d4"
    assert kernel_wwid([eui, registered]) == "naa.5000c500a1b2c3d4"
    assert kernel_wwid([registered, eui]) == "naa.5000c500a1b2c3d4"
    assert kernel_wwid([eui, t10]) == "eui.0025385b71b07a3c"
    assert kernel_wwid([extended, registered]) == "naa." + extended.value.hex()
    assert kernel_wwid([registered, name]) == "iqn.2004-01.x:y"


hexes = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16) | st.text(
    alphabet="0123456789abcdef", min_size=32, max_size=32)


@given(h=hexes)
def test_normalize_wwn_forms_agree(h: str) -> None:
    want = "naa." + h
    assert normalize_wwn("0x" + h) == want
    assert normalize_wwn("0X" + h.upper()) == want
    assert normalize_wwn("naa." + h.upper()) == want
    assert normalize_wwn("wwn-0x" + h) == want
    assert normalize_wwn(f" naa.{h}\0\0\n") == want
    assert identity.looks_like_wwn("0x" + h) and identity.looks_like_wwn("naa." + h)


def test_normalize_wwn_other_forms() -> None:
    assert normalize_wwn(None) is None and normalize_wwn(" \0") is None
    assert normalize_wwn("eui.0025385B71B07A3C") == "eui.0025385b71b07a3c"
    assert normalize_wwn("t10.ATA     Disk") == "t10.ATA     Disk"
    assert not identity.looks_like_wwn("2000")
    assert not identity.looks_like_wwn("sda")


def test_parse_udev_db_rejects_garbage_and_ignores_new_fields() -> None:
    text = ("P: /devices/virtual/block/loop0\nM: loop0\nR: 0\nJ: b7:0\nU: block\n"
            "E: ID_FS_TYPE=ext4\nS: disk/by-label/x\n\n"
            "P: /devices/virtual/net/lo\nU: net\nE: IFINDEX=1\n")
    db = parse_udev_db(text)
    assert set(db) == {"loop0"}
    assert db["loop0"].fs_type == "ext4" and db["loop0"].links == ("/dev/disk/by-label/x",)
    with pytest.raises(KernelFormatError) as exc:
        parse_udev_db("P: /devices/x\nthis is not udev\n")
    assert exc.value.text == "this is not udev"
    with pytest.raises(KernelFormatError):
        parse_udev_db("E: NOEQUALS\n")


@given(props=st.dictionaries(
    st.sampled_from(["ID_SERIAL", "ID_SERIAL_SHORT", "ID_SCSI_SERIAL", "ID_WWN",
                     "ID_WWN_WITH_EXTENSION", "ID_PATH", "ID_MODEL", "ID_MODEL_ENC",
                     "ID_FS_TYPE", "ID_FS_UUID", "DEVLINKS"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)))
def test_udev_info_from_any_properties(props: dict[str, str]) -> None:
    u = UdevInfo.from_properties(props)
    assert all(v is None or (v == v.strip() and v) for v in
               (u.serial, u.serial_short, u.scsi_serial, u.path, u.fs_type, u.fs_uuid))
    assert list(u.links) == sorted(set(u.links))


def test_udev_model_enc_is_decoded() -> None:
    u = UdevInfo.from_properties({"ID_MODEL": "Samsung_SSD_860", "ID_MODEL_ENC":
                                  "Samsung\\x20SSD\\x20860\\x20\\x20"})
    assert u.model == "Samsung SSD 860"


def test_superblock_from_probe() -> None:
    sb = Superblock.from_probe({"TYPE": b"bcache", "UUID": b"abc", "USAGE": b"other",
                                "LABEL": b""})
    assert sb == Superblock(type="bcache", uuid="abc", usage="other")
