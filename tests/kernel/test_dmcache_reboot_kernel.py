"""A dm-cache device survives a power cut (issue #31 item 4), driven from the host: boots on
the same disk images (LabSpec.disk_images), the record directory on a host path the guests
mount read-write (the guest's /etc is a tmpfs that does not survive a boot).

Boot 1 creates a writeback dm-cache device, writes 16 MiB with fio verify headers and lets
the cache write it back (clean), then holds writeback (migration_threshold 1: smq never sees
the device idle) and writes 16 MiB more, fsynced (dirty: on the cache device only), and cuts
the power (sysrq o: no sync, no suspend, no table removed). Boot 2 on the disks in other
slots: the boot pass refuses (another device where the cache was), assembles nothing. Boot 3
on the disks in their slots: ``cachemgr check`` says CRITICAL (exit 2) and the origin alone
fails fio's verification of the dirty half (stale); the boot pass (``cachemgr autoattach``,
no policy file) assembles the device, and every byte written before the cut reads back
(``fio --verify_only`` of both halves), and check is OK again.
"""

from __future__ import annotations

import json
import os
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

BOOT3 = f"""set -u
set -- $LAB_DISKS
cm=.venv/bin/cachemgr
$cm check >/dev/null; echo "check-before=$?"
$cm status --json >"$OUT/status-before.json"
{fio('$1', 1, '--verify_only')} 2>/dev/null; echo "origin-verify=$?"
$cm autoattach; echo "autoattach=$?"
echo "table=$(dmsetup table vc)"
{fio('/dev/mapper/vc', 0, '--verify_only')}; echo "verify0=$?"
{fio('/dev/mapper/vc', 1, '--verify_only')}; echo "verify1=$?"
$cm check >/dev/null; echo "check-after=$?"
"""


def values(out: bytes | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (out or b"").decode().splitlines()
                if "=" in line and not line.startswith(" "))


def test_writeback_dm_cache_survives_a_power_cut(backend: str, tmp_path: Path) -> None:
    imgs = [core.make_image(tmp_path / f"{n}.img", size)
            for n, size in (("origin", 256 << 20), ("cache", 64 << 20), ("meta", 16 << 20))]
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
    assert all(imgs[0].exists() for _ in imgs)  # the caller's images are never removed

    # another disk in the cache's slot (the metadata's), and the other way round: refused
    r2 = boot(BOOT_SWAPPED, [imgs[0], imgs[2], imgs[1]])
    v2 = values(r2.stdout)
    out2 = (r2.stdout or b"").decode()
    assert v2.get("tables") == "0", (out2, r2.stderr)
    assert "dm-cache /dev/mapper/vc not assembled" in out2, out2
    assert "cache /dev/" in out2 and "not the recorded device" in out2, out2

    r3 = boot(BOOT3, imgs)
    v3 = values(r3.stdout)
    text = (r3.stdout or b"").decode()
    assert r3.returncode == 0, (text, r3.stderr)
    assert v3["check-before"] == "2", text
    before = json.loads((tmp_path / "status-before.json").read_text())
    assert [(u["name"], u["mode"], u["stale_origin"], u["problems"])
            for u in before["unassembled"]] == [("vc", "writeback", True, [])]
    assert v3["origin-verify"] != "0", text  # the origin alone is stale
    assert v3["autoattach"] == "0" and "assemble dm-cache /dev/mapper/vc" in text, text
    assert " cache " in v3["table"] and " writeback smq" in v3["table"], text
    assert v3["verify0"] == "0" and v3["verify1"] == "0", text
    assert v3["check-after"] == "0", text
