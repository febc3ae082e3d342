"""SSD health from `smartctl --json` (backends/smart.py) on recorded outputs: the qemu lab's
emulated NVMe and real SATA, SAS and NVMe drives (tests/fixtures/smartctl/README.md); the
cache (one smartctl run per disk per 10 minutes, keyed by identity); status --json, the
metrics and the replacement plan (issue #19 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cachemgr.backends import smart, snapshot
from cachemgr.core import state
from cachemgr.core.errors import CommandNotFound
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.metrics import SnapshotCollector

FX = Path(__file__).resolve().parents[1] / "fixtures"
SC = FX / "smartctl"
NVME_SYS = Sysfs(FX / "nvme-pair-qemu" / "sys")


def doc(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((SC / f"{name}.json").read_text())


@pytest.mark.parametrize(("name", "protocol", "wear", "media", "spare", "thresh", "soon"), [
    ("qemu-nvme-ns", "NVMe", 0, 0, 0, 0, False),  # qemu: spare 0 with threshold 0
    ("qemu-nvme", "NVMe", 0, 0, 0, 0, False),
    ("nvme-null-Samsung_SSD_970_EVO_Plus_250GB-nvme0", "NVMe", 0, 0, 100, 10, False),
    ("nvme-null-INTEL_SSDPE2KX020T7-nvme6", "NVMe", 75, 0, 99, 10, False),
    ("nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0", "NVMe", 0, 0, 100, 10, True),
    ("SAMSUNG_MZ7WD240HAFV-00003_21", "ATA", 9, 0, None, None, False),
    ("sat-Intel_S4510_S4610_S4500_S4600_Series_SSDs-INTEL_SSDSC2KB480G8-sdm", "ATA", 0, 0,
     100, 10, False),
    ("sat-Micron_5100_Pro___52x0___5300_SSDs-Micron_5300_MTFDDAK960TDS-sdi", "ATA", 1, 0,
     100, 10, False),
    ("sat-Phison_Driven_SSDs-KINGSTON_SA400M8120G-sda", "ATA", 2, 0, None, None, False),
    ("ST3500418AS_11", "ATA", None, 0, None, None, False),
    ("HITACHI_H109060SESUN600G_10", "SCSI", None, 0, None, None, False),
])
def test_parse_recorded_outputs(name: str, protocol: str, wear: int | None, media: int,
                                spare: int | None, thresh: int | None, soon: bool) -> None:
    h = smart.parse("/dev/x", doc(name), 1.0)
    assert h.error is None
    assert (h.protocol, h.wear_percent, h.media_errors, h.spare_percent,
            h.spare_threshold_percent, h.replace_soon) == (protocol, wear, media, spare,
                                                           thresh, soon)


def test_failed_drive_says_why() -> None:
    h = smart.parse("/dev/nvme0n1", doc("nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0"), 1.0)
    assert h.passed is False and h.critical_warning == 0x10
    assert "replace soon" in h.words() and "critical warning 0x10" in h.words()


def test_worn_and_erroring_drives_are_replace_soon() -> None:
    d = doc("nvme-null-INTEL_SSDPE2KX020T7-nvme6")
    d["nvme_smart_health_information_log"]["percentage_used"] = 90
    assert smart.parse("/dev/x", d, 1.0).warnings == ("90 % of its rated endurance used",)
    d["nvme_smart_health_information_log"].update(percentage_used=10, media_errors=2,
                                                  available_spare=5)
    w = smart.parse("/dev/x", d, 1.0).warnings
    assert w == ("spare 5 % below its threshold 10 %", "2 media/data integrity errors")
    a = doc("SAMSUNG_MZ7WD240HAFV-00003_21")
    next(x for x in a["ata_smart_attributes"]["table"]
         if x["name"] == "Wear_Leveling_Count")["value"] = 7
    assert smart.parse("/dev/x", a, 1.0).wear_percent == 93


def test_no_answer_is_an_error_not_a_crash() -> None:
    d = {"smartctl": {"exit_status": 2, "messages": [
        {"string": "Smartctl open device: /dev/sdz failed: No such device", "severity":
         "error"}]}}
    h = smart.parse("/dev/sdz", d, 1.0)
    assert h.error == "Smartctl open device: /dev/sdz failed: No such device"
    assert not h.replace_soon and h.words().startswith("no SMART data")


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(smart, "_memo", {})
    return tmp_path


def test_lookup_runs_smartctl_at_most_once_per_max_age(state_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake(node: str) -> dict:  # type: ignore[type-arg]
        calls.append(node)
        return doc("qemu-nvme-ns")

    monkeypatch.setattr(smart, "smartctl", fake)
    h = smart.lookup("/dev/nvme0n1", "eui.0001", now=1000.0)
    assert h is not None and h.read_at == 1000.0 and calls == ["/dev/nvme0n1"]
    # another process (the file), later, under another kernel name: same identity, cached
    monkeypatch.setattr(smart, "_memo", {})
    assert smart.lookup("/dev/nvme1n1", "eui.0001", now=1000.0 + 599) is not None
    assert calls == ["/dev/nvme0n1"]
    assert smart.lookup("/dev/nvme1n1", "eui.0001", refresh=False, now=1e6) is not None
    assert calls == ["/dev/nvme0n1"]
    assert smart.lookup("/dev/nvme1n1", "eui.0001", now=1000.0 + 600) is not None
    assert calls == ["/dev/nvme0n1", "/dev/nvme1n1"]
    assert smart.lookup("/dev/sdq", "naa.2", refresh=False) is None
    assert (state_dir / "smart" / "eui.0001.json").exists()


def test_a_failed_run_is_cached_too(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def missing(node: str) -> dict:  # type: ignore[type-arg]
        calls.append(node)
        raise CommandNotFound(["smartctl"])

    monkeypatch.setattr(smart, "smartctl", missing)
    h = smart.lookup("/dev/sdc", "naa.1", now=10.0)
    assert h is not None and h.error and calls == ["/dev/sdc"]
    assert smart.lookup("/dev/sdc", "naa.1", now=20.0) == h and calls == ["/dev/sdc"]


def _seed(key: str, name: str, read_at: float = 1.7e9) -> None:
    state.write_json(smart.cache_path(key), {"key": key, "node": "/dev/x", "read_at": read_at,
                                             "smartctl": doc(name)})


def test_cache_ssds_are_the_nvme_namespace_under_bcache() -> None:
    snap = snapshot.take(NVME_SYS)
    ssds = smart.cache_ssds(NVME_SYS, snap)
    assert [(s.name, s.caches) for s in ssds] == [
        (x.identity.name, (c.uuid,)) for c in snap.cache_sets for x in c.caches]
    assert all(s.key.startswith("nvme.") for s in ssds)  # the namespace's wwid


def test_status_json_and_metrics_show_the_cached_health(state_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(node: str) -> dict:  # type: ignore[type-arg]
        raise AssertionError("smartctl run against a captured tree")

    monkeypatch.setattr(smart, "smartctl", never)
    snap = snapshot.take(NVME_SYS)
    ssd = smart.cache_ssds(NVME_SYS, snap)[0]
    doc_ = cache_ops.status_json(snap, NVME_SYS)
    assert doc_["ssd_health"] == [{"device": ssd.node, "name": ssd.name,
                                   "caches": list(ssd.caches), "health": None}]
    _seed(ssd.key, "nvme-null-INTEL_SSDPE2KX020T7-nvme6")
    h = cache_ops.status_json(snap, NVME_SYS)["ssd_health"][0]["health"]
    assert (h["wear_percent"], h["spare_percent"], h["replace_soon"]) == (75, 99, False)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(NVME_SYS, vms=False))
    text = generate_latest(reg).decode()
    lab = f'device="{ssd.name}",path="{ssd.node}"'
    assert f"cachemgr_ssd_wear_ratio{{{lab}}} 0.75" in text
    assert f"cachemgr_ssd_replace_soon{{{lab}}} 0.0" in text
    assert f"cachemgr_ssd_media_errors_total{{{lab}}} 0.0" in text
    assert 'model="INTEL_SSDPE2KX020T7"' in text  # no spaces in label values


def test_plan_line_shows_the_old_ssd_health(state_dir: Path) -> None:
    from cachemgr.ops import replace as replace_ops
    from cachemgr.procedures import replace

    _seed("naa.5000", "nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0")
    j = replace.Journal(id="r1", cset="c", options={}, backings=[],
                        old={"node": "/dev/sdc", "wwid": "naa.5000", "serial": "S1"})
    lines = replace_ops.health_lines(NVME_SYS, j)
    assert lines == ["old SSD /dev/sdc health: wear 0 %, media errors 0, spare 100 % "
                     "(threshold 10 %), SMART FAILED; replace soon: the drive's SMART "
                     "self-assessment failed; NVMe critical warning 0x10"]
    j.old = {"node": "/dev/sdd", "wwid": "naa.6000"}
    assert replace_ops.health_lines(NVME_SYS, j) == ["old SSD /dev/sdd health: not read"]


def test_ssd_health_command_lines_json_and_warnings(state_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``cachemgr ssd-health`` (what cachemgr-smart.timer runs with --refresh): one line per
    cache SSD, a warning (stderr: the unit's journal) for a drive to replace soon; --refresh
    on a captured tree runs nothing (its disks are not this host's)."""
    from cachemgr.ops import health

    def never(node: str) -> dict:  # type: ignore[type-arg]
        raise AssertionError("smartctl run against a captured tree")

    monkeypatch.setattr(smart, "smartctl", never)
    ssd = smart.cache_ssds(NVME_SYS, snapshot.take(NVME_SYS))[0]
    res = health.report(NVME_SYS, refresh=True)
    assert res.text() == [f"{ssd.node} (caches {ssd.caches[0]}): not read"]
    assert res.notes == [] and res.exit_code == 0
    _seed(ssd.key, "nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0")
    res = health.report(NVME_SYS)
    words = ("wear 0 %, media errors 0, spare 100 % (threshold 10 %), SMART FAILED; replace "
             "soon: the drive's SMART self-assessment failed; NVMe critical warning 0x10")
    assert res.text() == [f"{ssd.node} (caches {ssd.caches[0]}): {words}"]
    assert res.notes == [f"cachemgr: warning: {ssd.node}: {words}"]
    (row,) = res.json()["ssd_health"]
    assert row["device"] == ssd.node and row["health"]["replace_soon"] is True
