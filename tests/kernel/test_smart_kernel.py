"""SSD health end to end (issue #19 item 6) on Debian's kernel in the qemu lab, whose emulated
NVMe controller answers the SMART/Health log: bcache with its cache on the NVMe namespace,
made by ``cachemgr create``, which picks a bucket size the kernel accepts for a small cache
(make-bcache's default 512k buckets on a 256 MiB namespace are refused: docs/kernel-notes.md,
"bcache objects and registration"); ``ssd-health --refresh`` (what cachemgr-smart.timer
runs) reads it with smartctl, and ``status --json``, the metrics and the replacement plan
show what smartctl reported, from the cache (no second smartctl run).

Runs with ``--lab-backend=qemu`` only (UML has no PCI, so no NVMe). Not in the qemu_smoke
set: it took 82 s (boot included) with another qemu guest and UML tests on the 2 CPUs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachemgr.backends import nvme, smart, snapshot
from cachemgr.core.sysfs import Sysfs
from tests.kernel.clirun import in_process as cm
from tests.kernel.test_systemd_kernel import samples

pytestmark = pytest.mark.kernel(disks="256M,nvme:128M", timeout=200)


def metrics() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``cachemgr metrics`` (the textfile form: in this process stdout has no binary
    buffer), by name and labels."""
    prom = Path("/tmp/cachemgr.prom")
    r = cm("metrics", "--no-vms", "--textfile", str(prom))
    assert r.returncode == 0, r.stderr
    return samples(prom.read_text())


def test_nvme_cache_health_in_status_metrics_and_plan(lab_disks: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    state = Path("/tmp/cachemgr-state")
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(state))
    sysfs = Sysfs()
    (ns,) = nvme.wait_for_all(sysfs, os.environ["LAB_NVME_SERIALS"].split(), 30)
    r = cm("create", "bcache", "--backing", lab_disks[0], "--cache", ns.node)
    assert r.returncode == 0, r.stderr
    (cset,) = snapshot.take(sysfs).cache_sets
    assert cset.caches[0].identity.node == ns.node

    # a scrape never runs smartctl: nothing read yet, no SSD samples
    assert not [k for k in metrics() if k[0].startswith("cachemgr_ssd_")]

    # what smartctl itself says of the namespace (qemu's hw/nvme SMART/Health log)
    doc = smart.smartctl(ns.node)
    log = doc["nvme_smart_health_information_log"]
    r = cm("ssd-health", "--refresh", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["ssd_health"]
    assert (row["device"], row["name"], row["caches"]) == (ns.node, ns.name, [cset.uuid])
    h = row["health"]
    assert h["error"] is None, h
    assert (h["protocol"], h["model"], h["serial"]) == ("NVMe", doc["model_name"], ns.serial)
    assert (h["wear_percent"], h["media_errors"], h["spare_percent"],
            h["spare_threshold_percent"], h["critical_warning"], h["smart_passed"]) == (
        log["percentage_used"], log["media_errors"], log["available_spare"],
        log["available_spare_threshold"], log["critical_warning"],
        doc["smart_status"]["passed"])
    assert h["replace_soon"] is False and h["warnings"] == []
    assert (state / "smart" / f"{ns.wwid}.json").is_file()  # keyed by the WWID, not the name

    # status --json: the same answer, from the cache (read_at unchanged: smartctl not rerun)
    r = cm("status", "--json")
    assert r.returncode == 0, r.stderr
    (srow,) = json.loads(r.stdout)["ssd_health"]
    assert srow["device"] == ns.node and srow["health"]["read_at"] == h["read_at"]
    assert {k: v for k, v in srow["health"].items() if k != "age_seconds"} == \
        {k: v for k, v in h.items() if k != "age_seconds"}

    # the metrics: the cachemgr_ssd_* families for the namespace (device: kernel name)
    got = metrics()
    lab = (("device", ns.name), ("path", ns.node))
    assert got[("cachemgr_ssd_smart_up", lab)] == 1.0
    assert got[("cachemgr_ssd_wear_ratio", lab)] == log["percentage_used"] / 100
    assert got[("cachemgr_ssd_spare_ratio", lab)] == log["available_spare"] / 100
    assert got[("cachemgr_ssd_spare_threshold_ratio", lab)] == \
        log["available_spare_threshold"] / 100
    assert got[("cachemgr_ssd_media_errors_total", lab)] == log["media_errors"]
    assert got[("cachemgr_ssd_critical_warning", lab)] == log["critical_warning"]
    assert got[("cachemgr_ssd_smart_passed", lab)] == 1.0
    assert got[("cachemgr_ssd_replace_soon", lab)] == 0.0
    assert got[("cachemgr_ssd_health_read_timestamp_seconds", lab)] == h["read_at"]
    info = [k for k in got if k[0] == "cachemgr_ssd_info"]
    assert [dict(k[1]) for k in info] == [{
        "device": ns.name, "path": ns.node, "cache": cset.uuid, "protocol": "NVMe",
        "model": "_".join(doc["model_name"].split()), "serial": ns.serial}]

    # the replacement plan shows the old SSD's health (a dry run changes nothing)
    r = cm("replace-ssd", ns.node, "--dry-run")
    assert r.returncode == 0, r.stderr
    line = (f"old SSD {ns.node} health: wear {log['percentage_used']} %, media errors "
            f"{log['media_errors']}, spare {log['available_spare']} % (threshold "
            f"{log['available_spare_threshold']} %), SMART passed")
    assert line in r.stdout.splitlines(), r.stdout
