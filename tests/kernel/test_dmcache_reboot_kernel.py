"""A dm-cache device survives a power cut (issue #31 item 4), driven from the host: boots on
the same disk images (LabSpec.disk_images), the record directory on a host path the guests
mount read-write (the guest's /etc is a tmpfs that does not survive a boot).

Boot 1 creates a writeback dm-cache device, writes 16 MiB with fio verify headers and lets
the cache write it back (clean), then holds writeback (migration_threshold 1: smq never sees
the device idle) and writes 16 MiB more, fsynced (dirty: on the cache device only), and cuts
the power (sysrq o: no sync, no suspend, no table removed). A fourth disk of the origin's
size (an ext4 file system made on the host) sits in the last slot.

The lab's disks have no WWN, serial or udev link: each is recorded by its place (sysfs) and
size, which a same-size disk in that place matches too (issue #41 item 1: such a bystander
in the origin's slot got the dirty blocks). So the boot pass never assembles this device by
itself; ``cachemgr assemble vc`` does, after the admin has checked.

Boot 2 on the cache and metadata disks in each other's slots: the boot pass refuses (another
device where the cache was; exit 3), assembles nothing. Boot 3, the swap: the bystander in
the origin's slot, the origin in the last: ``check`` CRITICAL naming ``cachemgr assemble
vc``, the boot pass refuses (exit 3), ``cachemgr assemble vc`` without a terminal shows what
blkid sees (the bystander's ext4 where the origin had no signature) and refuses (exit 3);
neither disk changed by a byte (checksums of both images before and after). Boot 4 on the
disks in their slots: ``check`` CRITICAL (exit 2) and the origin alone fails fio's
verification of the dirty half (stale); the boot pass still refuses (exit 3);
``cachemgr assemble vc --yes`` assembles it, every byte written before the cut reads back
(``fio --verify_only`` of both halves), and check is OK again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from cachemgr.lab import core, kernels

pytestmark = [pytest.mark.skipif(os.environ.get("CACHEMGR_IN_LAB") == "1",
                                 reason="host-side lab tests")]

HALF = 16 << 20


@pytest.fixture(params=["uml", "qemu"])
def backend(request: pytest.FixtureRequest) -> str:
    b: str = request.param
    if request.config.getoption("--no-lab"):
        pytest.skip("--no-lab given")
    if b != request.config.getoption("--lab-backend"):
        pytest.skip(f"lab backend {b} not selected")
    info = kernels.load_manifest().get(b)
    if info is None or not Path(info.kernel).exists():
        pytest.skip(f"{b} lab kernel not installed (scripts/setup.sh)")
    return b


def fio(dev: str, half: int, *extra: str) -> str:
    return (f"fio --name=h{half} --filename={dev} --rw=write --bs=64k --direct=1 "
            f"--ioengine=psync --offset={half * HALF} --size={HALF} --verify=crc32c "
            "--randrepeat=1 --randseed=31 --verify_state_save=0 --output-format=terse "
            + " ".join(extra) + " >/dev/null")


BOOT1 = f"""set -eu
set -- $LAB_DISKS
cm=.venv/bin/cachemgr
$cm create dm-cache vc --origin $1 --cache $2 --metadata $3 --mode writeback
# first half written back (clean on the origin too)
{fio('/dev/mapper/vc', 0, '--do_verify=0', '--end_fsync=1')}
for i in $(seq 600); do
    [ "$(dmsetup status vc | awk '{{print $14}}')" = 0 ] && break; sleep 0.1
done
echo "clean=$(dmsetup status vc | awk '{{print $14}}')"
# second half held dirty: below one block smq never sees the device idle
dmsetup message vc 0 migration_threshold 1
{fio('/dev/mapper/vc', 1, '--do_verify=0', '--end_fsync=1')}
echo "dirty=$(dmsetup status vc | awk '{{print $14}}')"
sleep 0.3  # the serial line drains; the cache does not write back (held)
echo o >/proc/sysrq-trigger
sleep 10
"""

BOOT_SWAPPED = """set -u
cm=.venv/bin/cachemgr
$cm autoattach; echo "autoattach=$?"
echo "tables=$(dmsetup ls --target cache | grep -c vc)"
"""

BOOT_BYSTANDER = """set -u
cm=.venv/bin/cachemgr
$cm check >"$OUT/check-swapped.txt"; echo "check=$?"
$cm autoattach; echo "autoattach=$?"
$cm assemble vc </dev/null; echo "assemble=$?"
echo "tables=$(dmsetup ls --target cache | grep -c vc)"
"""

BOOT3 = f"""set -u
set -- $LAB_DISKS
cm=.venv/bin/cachemgr
$cm check >/dev/null; echo "check-before=$?"
$cm status --json >"$OUT/status-before.json"
{fio('$1', 1, '--verify_only')} 2>/dev/null; echo "origin-verify=$?"
$cm autoattach; echo "autoattach=$?"
echo "tables=$(dmsetup ls --target cache | grep -c vc)"
$cm assemble vc --yes; echo "assemble=$?"
echo "table=$(dmsetup table vc)"
{fio('/dev/mapper/vc', 0, '--verify_only')}; echo "verify0=$?"
{fio('/dev/mapper/vc', 1, '--verify_only')}; echo "verify1=$?"
$cm check >/dev/null; echo "check-after=$?"
"""


BOOT_SERIALS = f"""set -u
cm=.venv/bin/cachemgr
$cm autoattach; echo "autoattach=$?"
echo "tables=$(dmsetup ls --target cache | grep -c vc)"
{fio('/dev/mapper/vc', 0, '--verify_only')}; echo "verify0=$?"
{fio('/dev/mapper/vc', 1, '--verify_only')}; echo "verify1=$?"
$cm check >/dev/null; echo "check=$?"
"""


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def values(out: bytes | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (out or b"").decode().splitlines()
                if "=" in line and not line.startswith(" "))


def test_writeback_dm_cache_survives_a_power_cut(backend: str, tmp_path: Path) -> None:
    imgs = [core.make_image(tmp_path / f"{n}.img", size)
            for n, size in (("origin", 256 << 20), ("cache", 64 << 20), ("meta", 16 << 20),
                            ("bystander", 256 << 20))]
    subprocess.run(["mkfs.ext4", "-q", "-F", str(imgs[3])], check=True)
    records = tmp_path / "records"
    env = {"CACHEMGR_DMCACHE_DIR": str(records), "OUT": str(tmp_path)}

    def boot(script: str, order: list[Path]) -> core.LabResult:
        return core.run(["bash", "-c", script],
                        core.LabSpec(backend=backend, disk_images=tuple(map(str, order)),
                                     rw_paths=(str(tmp_path),), env=env, timeout=300),
                        capture=True)

    r1 = boot(BOOT1, imgs)
    v1 = values(r1.stdout)
    # the power cut: the guest ended without an exit code (no orderly power-off)
    assert not any(m.startswith("rc=") for m in r1.messages), (r1.messages, r1.stderr)
    assert v1.get("clean") == "0" and int(v1.get("dirty", "0")) > 0, (v1, r1.stderr)
    rec = json.loads((records / "vc.json").read_text())
    assert rec["mode"] == "writeback" and rec["origin"]["size_bytes"] == 256 << 20
    assert rec["origin"]["signature"] == "no signature", rec  # blkid at create
    assert all(imgs[0].exists() for _ in imgs)  # the caller's images are never removed

    # another disk in the cache's slot (the metadata's), and the other way round: refused
    r2 = boot(BOOT_SWAPPED, [imgs[0], imgs[2], imgs[1], imgs[3]])
    v2 = values(r2.stdout)
    out2 = (r2.stdout or b"").decode()
    assert v2.get("tables") == "0", (out2, r2.stderr)
    assert v2.get("autoattach") == "3", (out2, r2.stderr)  # it refused something
    assert "dm-cache /dev/mapper/vc not assembled" in out2, out2
    assert "cache /dev/" in out2 and "not the recorded device" in out2, out2

    # the bystander in the origin's slot, the origin in the last: nothing written anywhere
    before = [digest(imgs[0]), digest(imgs[3])]
    r3 = boot(BOOT_BYSTANDER, [imgs[3], imgs[1], imgs[2], imgs[0]])
    v3 = values(r3.stdout)
    out3 = (r3.stdout or b"").decode()
    err3 = (r3.stderr or b"").decode()
    assert [digest(imgs[0]), digest(imgs[3])] == before, (out3, err3)
    assert v3.get("tables") == "0", (out3, err3)
    assert v3.get("check") == "2", (out3, err3)
    check = (tmp_path / "check-swapped.txt").read_text()
    assert "/dev/mapper/vc: recorded writeback dm-cache device not assembled" in check, check
    assert "next: cachemgr assemble vc" in check, check
    assert v3.get("autoattach") == "3", (out3, err3)
    assert "known by its place only" in out3 and "cachemgr assemble vc" in out3, out3
    assert v3.get("assemble") == "3", (out3, err3)  # no terminal, no --yes
    disk0 = "/dev/ubda" if backend == "uml" else "/dev/vda"
    assert f"origin: {disk0}, " in err3 and "blkid at create: no signature; now: ext4 " \
        "UUID" in err3, err3

    r4 = boot(BOOT3, imgs)
    v4 = values(r4.stdout)
    text = (r4.stdout or b"").decode()
    assert r4.returncode == 0, (text, r4.stderr)
    assert v4["check-before"] == "2", text
    status = json.loads((tmp_path / "status-before.json").read_text())
    assert [(u["name"], u["mode"], u["stale_origin"], u["problems"],
             [p["role"] for p in u["unproven"]]) for u in status["unassembled"]] == [
        ("vc", "writeback", True, [], ["origin", "cache", "metadata"])]
    assert v4["origin-verify"] != "0", text  # the origin alone is stale
    # place-only disks: the boot pass leaves the device to the admin's command
    assert v4["autoattach"] == "3" and v4["tables"] == "0", text
    assert v4["assemble"] == "0" and "/dev/mapper/vc: dm-cache writeback over" in text, text
    assert " cache " in v4["table"] and " writeback smq" in v4["table"], text
    assert v4["verify0"] == "0" and v4["verify1"] == "0", text
    assert v4["check-after"] == "0", text


def test_disks_with_serials_assemble_at_boot_wherever_they_sit(backend: str,
                                                               tmp_path: Path) -> None:
    """The same power cut on virtio disks that have serials (qemu): each disk recorded by
    its serial, so after the swap (the bystander in the origin's slot, the origin in the
    last) the boot pass finds the origin where it went and assembles the device by itself
    (exit 0); every byte verifies and the bystander is not changed by a byte."""
    if backend != "qemu":
        pytest.skip("only qemu's virtio disks can have serials")
    names = ("origin", "cache", "meta", "bystander")
    imgs = [core.make_image(tmp_path / f"{n}.img", size)
            for n, size in zip(names, (256 << 20, 64 << 20, 16 << 20, 256 << 20),
                               strict=True)]
    subprocess.run(["mkfs.ext4", "-q", "-F", str(imgs[3])], check=True)
    serial = dict(zip(imgs, ("LAB-ORIGIN", "LAB-CACHE", "LAB-META", "LAB-BYSTANDER"),
                      strict=True))
    records = tmp_path / "records"
    env = {"CACHEMGR_DMCACHE_DIR": str(records), "OUT": str(tmp_path)}

    def boot(script: str, order: list[Path]) -> core.LabResult:
        return core.run(["bash", "-c", script],
                        core.LabSpec(backend=backend, disk_images=tuple(map(str, order)),
                                     disk_serials=tuple(serial[p] for p in order),
                                     rw_paths=(str(tmp_path),), env=env, timeout=900),
                        capture=True)

    r1 = boot(BOOT1, imgs)
    v1 = values(r1.stdout)
    assert v1.get("clean") == "0" and int(v1.get("dirty", "0")) > 0, (v1, r1.stderr)
    rec = json.loads((records / "vc.json").read_text())
    assert [rec[r].get("serial") for r in ("origin", "cache", "metadata")] == [
        "LAB-ORIGIN", "LAB-CACHE", "LAB-META"], rec

    bystander = digest(imgs[3])
    r2 = boot(BOOT_SERIALS, [imgs[3], imgs[1], imgs[2], imgs[0]])
    v2 = values(r2.stdout)
    out2 = (r2.stdout or b"").decode()
    assert v2.get("autoattach") == "0" and v2.get("tables") == "1", (out2, r2.stderr)
    assert "assemble dm-cache /dev/mapper/vc (writeback) over /dev/vdd" in out2, out2
    assert v2["verify0"] == "0" and v2["verify1"] == "0", out2
    assert v2["check"] == "0", out2
    assert digest(imgs[3]) == bystander
