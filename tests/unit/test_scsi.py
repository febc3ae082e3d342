"""The SCSI hotplug backend on captured lab trees (tests/fixtures/scsi-ssd-in-use-*).

In that capture sda is the cache device of a registered bcache set (held by bcache0) and sdb
is held by a dm linear device; both are scsi_debug disks on host0. Writes go to copies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachemgr.backends import bcache, inuse, scsi
from cachemgr.backends.scsi import Hctl, WaitProgress
from cachemgr.core.errors import (
    CacheMgrError,
    KernelFormatError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.sysfs import Sysfs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SCSI = sorted(FIXTURES.glob("scsi-ssd-in-use-*"))
assert SCSI, "no scsi-ssd-in-use capture (scripts/capture-fixtures.sh scsi-ssd-in-use)"
fx_param = pytest.mark.parametrize("fx", SCSI, ids=lambda p: p.name)


def raw(root: Path, rel: str) -> str:
    return (root / "sys" / rel).read_text().strip()


def copy(fx: Path, tmp_path: Path) -> Path:
    dst = tmp_path / fx.name
    shutil.copytree(fx, dst, symlinks=True)
    return dst


class KernelLike(Sysfs):
    """A copied capture that reacts to ``device/delete`` as the kernel does: the disk goes."""

    def write(self, rel: str, value: str) -> None:
        super().write(rel, value)
        parts = rel.split("/")
        if rel.endswith("/device/delete") and parts[0] == "block" and value == "1":
            os.unlink(self.path(f"block/{parts[1]}"))


def at(fx: Path, target: int) -> str:
    """The disk at SCSI target ``target`` (the async probe decides which one is sda)."""
    for name in sorted(os.listdir(fx / "sys" / "block")):
        link = fx / "sys" / "block" / name / "device"
        if link.is_symlink() and os.path.basename(os.readlink(link)) == f"0:0:{target}:0":
            return name
    raise AssertionError(f"no disk at target {target} in {fx}")


def free(root: Path, name: str) -> None:
    """Make ``name`` unused in a copied capture (drop its holders and bcache dir)."""
    disk = (root / "sys" / "block" / name).resolve()
    for h in (disk / "holders").iterdir():
        h.unlink()
    shutil.rmtree(disk / "bcache", ignore_errors=True)


# ---------------------------------------------------------------------------- reading


@fx_param
def test_disks_and_addresses(fx: Path) -> None:
    sysfs = Sysfs(fx / "sys")
    found = scsi.disks(sysfs)
    assert [d.name for d in found] == sorted(
        (n for n in os.listdir(fx / "sys" / "block") if n.startswith("sd")),
        key=lambda n: scsi.scsi_address(sysfs, n))
    assert len(found) == 2
    for d in found:
        link = os.readlink(fx / "sys" / "block" / d.name / "device")
        assert str(d.hctl) == os.path.basename(link)
        # the scsi_device directory names the same address
        assert os.listdir(fx / "sys" / "block" / d.name / "device" / "scsi_device") == [
            str(d.hctl)]
        assert d.host == "host0" and d.hctl.host == 0
        assert d.wwid == raw(fx, f"block/{d.name}/device/wwid")
        assert d.serial == raw(fx, f"block/{d.name}/device/serial")
        assert (d.vendor, d.model, d.rev) == ("Linux", "scsi_debug", "0191")
        assert d.size_bytes == int(raw(fx, f"block/{d.name}/size")) * 512 == 128 << 20
    assert {d.hctl.target for d in found} == {0, 1}


@fx_param
def test_scsi_address_fallback_to_scsi_device_dir(fx: Path, tmp_path: Path) -> None:
    root = copy(fx, tmp_path)
    link = (root / "sys" / "block" / "sda").resolve() / "device"
    target = (link.parent / os.readlink(link)).resolve()
    # a device link that does not end in H:C:T:L: the scsi_device dir still names it
    alias = target.parent / "alias"
    alias.symlink_to(target.name)
    link.unlink()
    link.symlink_to(os.path.relpath(alias, link.parent))
    assert scsi.scsi_address(Sysfs(root / "sys"), "sda") == Hctl.parse(target.name)


@fx_param
@pytest.mark.parametrize(("name", "words"), [
    ("ubda", "not a SCSI disk"),
    ("bcache0", "not a SCSI disk"),
    ("dm-0", "not a SCSI disk"),
    ("sdz", "no such block device"),
])
def test_not_scsi_disks(fx: Path, name: str, words: str) -> None:
    with pytest.raises(UsageError) as exc:
        scsi.scsi_disk(Sysfs(fx / "sys"), name)
    assert words in str(exc.value) and exc.value.exit_code == 2


@fx_param
def test_find_scsi_debug_host(fx: Path, tmp_path: Path) -> None:
    sysfs = Sysfs(fx / "sys")
    assert scsi.find_scsi_debug_host(sysfs) == "host0"
    assert raw(fx, "class/scsi_host/host0/proc_name") == "scsi_debug"
    assert scsi.hosts(sysfs) == ("host0",)
    root = copy(fx, tmp_path)
    shutil.rmtree(root / "sys" / "bus" / "pseudo")
    assert scsi.find_scsi_debug_host(Sysfs(root / "sys")) == "host0"  # from proc_name
    shutil.rmtree(root / "sys" / "class" / "scsi_host")
    with pytest.raises(CacheMgrError, match="scsi_debug is not loaded"):
        scsi.find_scsi_debug_host(Sysfs(root / "sys"))


# ---------------------------------------------------------------------------- in use


@fx_param
def test_in_use_reasons(fx: Path) -> None:
    sysfs = Sysfs(fx / "sys")
    cset = os.path.basename(os.readlink(fx / "sys" / "block" / "sda" / "bcache" / "set"))
    assert scsi.in_use(sysfs, "sda") == (
        "/dev/sda is held by bcache0",
        f"/dev/sda is the cache device of bcache cache set {cset}",
    )
    assert scsi.in_use(sysfs, "sdb") == ("/dev/sdb is held by dm-0 (/dev/mapper/held)",)


MOUNTINFO = (
    "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/x\n"
    "36 22 8:16 / /mnt/vm\\040images rw,noatime shared:1 - ext4 /dev/sdb rw\n"
)
SWAPS = ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
         "/dev/sdb                                partition\t1048572\t\t0\t\t-2\n")


@fx_param
def test_in_use_mounted_and_swap(fx: Path, tmp_path: Path) -> None:
    root = copy(fx, tmp_path)
    free(root, "sdb")
    sysfs = Sysfs(root / "sys")
    assert scsi.in_use(sysfs, "sdb") == ()
    assert scsi.in_use(sysfs, "sdb", mountinfo=MOUNTINFO) == (
        "/dev/sdb is mounted on /mnt/vm images (ext4)",)
    assert scsi.in_use(sysfs, "sdb", swaps=SWAPS) == ("/dev/sdb is in use as swap",)
    # the root file system is named as such (a bare "on /" is easily read past)
    assert scsi.in_use(sysfs, "sdb", mountinfo="22 1 8:16 / / rw - ext4 /dev/sdb rw\n") == (
        "/dev/sdb is mounted on / (ext4), the root file system",)
    with pytest.raises(UnsafeError, match="mounted on /mnt/vm images"):
        scsi.remove(sysfs, "sdb", mountinfo=MOUNTINFO)
    assert (root / "sys" / "block" / "sdb" / "device" / "delete").read_text() == ""


class ByName(Sysfs):
    """A capture whose device nodes are their kernel names (no /dev nodes in a capture)."""

    def block_name_of(self, node: str) -> str | None:
        return os.path.basename(node)


@fx_param
def test_one_in_use_check_worded_by_each_caller(fx: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """inuse.uses finds; scsi.in_use (pull a disk) and bcache.in_use (format a device: bcache
    and dm-cache create) word the same findings their own way."""
    sysfs = Sysfs(fx / "sys")
    found = inuse.uses(sysfs, "block/sda", mountinfo=None, swaps=None)
    assert [(u.member, u.partition, u.kind, u.by) for u in found] == [
        ("sda", False, "held", "bcache0"), ("sda", False, "bcache", "")]
    (held,) = inuse.uses(sysfs, "block/sdb", mountinfo=None, swaps=None)
    assert (held.kind, held.by, held.detail) == ("held", "dm-0", "held")
    assert bcache.in_use(ByName(fx / "sys"), "/dev/sda") == "it is in use by bcache0"
    assert bcache.in_use(ByName(fx / "sys"), "/dev/sdb") == "it is in use by dm-0"

    root = copy(fx, tmp_path)
    free(root, "sdb")
    part = (root / "sys" / "block" / "sdb").resolve() / "sdb1"
    (part / "holders").mkdir(parents=True)
    (part / "partition").write_text("1\n")
    (part / "dev").write_text("8:17\n")
    free_sys = ByName(root / "sys")
    assert bcache.in_use(free_sys, "/dev/sdb") is None and scsi.in_use(free_sys, "sdb") == ()
    for texts, scsi_says, bcache_says in [
        ((MOUNTINFO, None), "/dev/sdb is mounted on /mnt/vm images (ext4)", "it is mounted"),
        ((None, SWAPS), "/dev/sdb is in use as swap", "it is in use as swap"),
        (("36 22 8:17 / /srv rw - xfs /dev/disk/by-label/x rw\n", None),
         "/dev/sdb1 is mounted on /srv (xfs)", "its partition sdb1 is in use"),
    ]:
        monkeypatch.setattr(inuse, "proc_texts", lambda s, t=texts: t)
        assert scsi.in_use(free_sys, "sdb", mountinfo=texts[0], swaps=texts[1]) == (scsi_says,)
        assert bcache.in_use(free_sys, "/dev/sdb") == bcache_says
    (part / "holders" / "dm-0").symlink_to("../../../dm-0")
    assert bcache.in_use(free_sys, "/dev/sdb") == "its partition sdb1 is in use"
    assert scsi.in_use(free_sys, "sdb", mountinfo=None, swaps=None) == (
        "/dev/sdb1 is held by dm-0 (/dev/mapper/held)",)


def test_parse_mountinfo_and_swaps() -> None:
    mounts = inuse.parse_mountinfo(MOUNTINFO)
    assert mounts[1] == inuse.Mount("8:16", "/mnt/vm images", "ext4", "/dev/sdb")
    assert inuse.parse_swaps(SWAPS) == ("/dev/sdb",)
    with pytest.raises(KernelFormatError):
        inuse.parse_mountinfo("36 22 8:16 / /mnt rw\n")


@given(point=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E),
                     min_size=1, max_size=30),
       major=st.integers(0, 4095), minor=st.integers(0, 2**20),
       optional=st.lists(st.sampled_from(["shared:1", "master:2", "unbindable"]), max_size=3))
def test_parse_mountinfo_any_line(point: str, major: int, minor: int,
                                  optional: list[str]) -> None:
    escaped = "/" + point.replace("\\", "\\134").replace(" ", "\\040")
    line = " ".join(["36", "22", f"{major}:{minor}", "/", escaped, "rw", *optional, "-",
                     "ext4", "/dev/sdb1", "rw"])
    (m,) = inuse.parse_mountinfo(line)
    assert m == inuse.Mount(f"{major}:{minor}", "/" + point, "ext4", "/dev/sdb1")


# ---------------------------------------------------------------------------- remove


@fx_param
def test_remove_refuses_registered_bcache_cache(fx: Path, tmp_path: Path) -> None:
    root = copy(fx, tmp_path)
    sysfs = KernelLike(root / "sys")
    with pytest.raises(UnsafeError) as exc:
        scsi.remove(sysfs, "sda")
    assert "cache device of bcache cache set" in str(exc.value)
    assert exc.value.exit_code == 3 and exc.value.hint
    # nothing was written and the disk is still there
    assert (root / "sys" / "block" / "sda" / "device" / "delete").read_text() == ""
    assert (root / "sys" / "block" / "sda").exists()
    with pytest.raises(UnsafeError, match="held by dm-0"):
        scsi.remove(sysfs, "sdb")


@fx_param
def test_remove_returns_what_was_removed(fx: Path, tmp_path: Path) -> None:
    root = copy(fx, tmp_path)
    free(root, "sdb")
    delete = (root / "sys" / "block" / "sdb" / "device").resolve() / "delete"
    removed = scsi.remove(KernelLike(root / "sys"), "sdb")
    assert delete.read_text() == "1"
    assert not (root / "sys" / "block" / "sdb").exists()
    d = removed.disk
    assert d.name == "sdb" and str(d.hctl) == os.path.basename(delete.parent)
    assert d.host == "host0"
    assert d.wwid == (delete.parent / "wwid").read_text().strip()
    assert d.serial == (delete.parent / "serial").read_text().strip()
    assert d.size_bytes == 128 << 20
    assert removed.overridden == ()


@fx_param
def test_remove_forced_records_what_it_went_past(fx: Path, tmp_path: Path) -> None:
    root = copy(fx, tmp_path)
    removed = scsi.remove(KernelLike(root / "sys"), "sda", force_in_use=True)
    assert any("bcache" in r for r in removed.overridden)
    assert not (root / "sys" / "block" / "sda").exists()


@fx_param
def test_remove_times_out_when_the_disk_stays(fx: Path, tmp_path: Path) -> None:
    root = copy(fx, tmp_path)
    free(root, "sdb")
    with pytest.raises(TimeoutExpired, match="still there"):
        scsi.remove(Sysfs(root / "sys"), "sdb", timeout=0.2)  # a capture never reacts


@fx_param
def test_remove_refuses_non_scsi(fx: Path) -> None:
    sysfs = Sysfs(fx / "sys")
    with pytest.raises(UsageError, match="not a SCSI disk"):
        scsi.remove(sysfs, "ubda")


# ---------------------------------------------------------------------------- rescan, wait


@fx_param
@pytest.mark.parametrize(("target", "written"), [
    ("host0", "- - -"), (0, "- - -"), ("0", "- - -"),
    (Hctl(0, 0, 1, 0), "0 1 0"), ("0:0:1:0", "0 1 0"),
])
def test_rescan_writes_scan(fx: Path, tmp_path: Path, target: str | int | Hctl,
                            written: str) -> None:
    root = copy(fx, tmp_path)
    done = scsi.rescan(Sysfs(root / "sys"), target)
    assert done == scsi.Rescanned("host0", written)
    assert (root / "sys" / "class" / "scsi_host" / "host0" / "scan").read_text() == written


@fx_param
@pytest.mark.parametrize("target", ["host7", 7, "nonsense", Hctl(3, 0, 0, 0)])
def test_rescan_unknown_host(fx: Path, target: str | int | Hctl) -> None:
    with pytest.raises(UsageError, match="no SCSI host") as exc:
        scsi.rescan(Sysfs(fx / "sys"), target)
    assert "host0" in str(exc.value)  # lists the ones there are


@fx_param
@pytest.mark.parametrize(("match", "want"), [
    ("naa.33333330000007d0", 0),  # scsi_debug's ids follow the target
    ("0x3333333000000bb8", 1),
    ("wwn-0x3333333000000bb8", 1),
    ("serial:3000", 1),
    ("2000", 0),
    ("0:0:1:0", 1),
    (Hctl(0, 0, 0, 0), 0),
])
def test_wait_for_disk_finds_present_disk(fx: Path, match: str | Hctl, want: int) -> None:
    sysfs = Sysfs(fx / "sys")
    d = scsi.wait_for_disk(sysfs, match, 1.0)
    assert d == scsi.scsi_disk(sysfs, at(fx, want))


@fx_param
def test_wait_for_disk_times_out_with_progress(fx: Path) -> None:
    seen: list[WaitProgress] = []
    with pytest.raises(TimeoutExpired) as exc:
        scsi.wait_for_disk(Sysfs(fx / "sys"), "naa.5000c500a1b2c3d4", 0.3, interval=0.05,
                           progress=seen.append)
    assert exc.value.exit_code == 5
    sda = scsi.scsi_disk(Sysfs(fx / "sys"), "sda")
    assert "naa.5000c500a1b2c3d4" in str(exc.value) and sda.describe() in str(exc.value)
    assert len(seen) >= 3 and all(p.present == ("sda", "sdb") for p in seen)
    assert seen[-1].elapsed >= 0.3 and seen[0].timeout == 0.3


@fx_param
def test_wait_for_disk_sees_a_disk_come_back(fx: Path, tmp_path: Path) -> None:
    """Remove a disk, then make it reappear (as the scan + sd probe would) under a new name."""
    root = copy(fx, tmp_path)
    free(root, "sdb")
    sysfs = KernelLike(root / "sys")
    target = os.readlink(root / "sys" / "block" / "sdb")
    removed = scsi.remove(sysfs, "sdb")
    calls: list[WaitProgress] = []

    def progress(p: WaitProgress) -> None:
        calls.append(p)
        if len(calls) == 2:  # the disk shows up between two polls, as sdc
            (root / "sys" / "block" / "sdc").symlink_to(target)

    # the block dir inside the device still says sdb; /sys/block's entry is what lists it
    found = scsi.wait_for_disk(sysfs, removed.disk.wwid or "", 2.0, interval=0.01,
                               progress=progress)
    assert found.name == "sdc" and found.wwid == removed.disk.wwid
    assert found.hctl == removed.disk.hctl and len(calls) == 2


@given(h=st.integers(0, 2**16), c=st.integers(0, 255), t=st.integers(0, 2**16),
       lun=st.integers(0, 2**32))
def test_hctl_round_trip(h: int, c: int, t: int, lun: int) -> None:
    x = Hctl(h, c, t, lun)
    assert Hctl.parse(str(x)) == x and x.host_name == f"host{h}"
    assert scsi.DiskMatch.parse(str(x)) == scsi.DiskMatch("hctl", str(x))


@given(text=st.text(max_size=12).filter(lambda s: s.strip().count(":") != 3))
def test_hctl_parse_rejects(text: str) -> None:
    with pytest.raises(KernelFormatError):
        Hctl.parse(text)


def test_disk_match_parse() -> None:
    assert scsi.DiskMatch.parse("0X3333333000000BB8") == scsi.DiskMatch(
        "wwn", "naa.3333333000000bb8")
    assert scsi.DiskMatch.parse("serial: 2000 ") == scsi.DiskMatch("serial", "2000")
    with pytest.raises(UsageError):
        scsi.DiskMatch.parse("  ")
