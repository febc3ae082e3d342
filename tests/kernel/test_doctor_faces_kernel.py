"""doctor's causes through ``check --verbose`` on the lab kernel (issue #45 item 2): a
sequential reader that bcache bypasses past ``sequential_cutoff`` is named in check's
output after its findings, with the same code, device and next command doctor gives; the
level and exit code are check's own, as without --verbose."""

from __future__ import annotations

import json

import pytest

from tests.kernel.clirun import in_process as cm
from tests.kernel.test_doctor_kernel import WINDOW, load, make_bcache, settle


@pytest.mark.kernel(disks="1G,256M", timeout=300)
def test_check_verbose_names_a_sequential_bypass(lab_disks: list[str]) -> None:
    backing, ssd = lab_disks
    sysfs, _, cset = make_bcache(backing, ssd)
    # one cause at a time: the lab's file-backed SSD can be slower than the congestion
    # thresholds under host load (tests/kernel/test_doctor_kernel.py says why)
    for t in ("congested_read_threshold_us", "congested_write_threshold_us"):
        sysfs.write(f"fs/bcache/{cset}/{t}", "0")
    plain = cm("check", "--json")
    p = load("/dev/bcache0", "--rw=read", "--bs=128k", "--size=512M", "--rate_iops=100",
             seconds=WINDOW + 4)
    try:
        r = cm("check", "--verbose", "--window", str(WINDOW), "--json")
    finally:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        settle()
    doc = json.loads(r.stdout)
    print(f"check --verbose: exit {r.returncode}: {doc['causes']}")
    assert r.returncode == plain.returncode == doc["exit_code"], (r.stdout, plain.stdout)
    assert [(c["code"], c["device"], c["next"]) for c in doc["causes"]] == [
        ("sequential-bypass", "/dev/bcache0",
         "cachemgr tune /dev/bcache0 sequential_cutoff=0")], doc
    assert doc["window_seconds"] == WINDOW
