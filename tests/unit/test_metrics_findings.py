"""One code vocabulary (issue #41 item c): what ``cachemgr check`` finds on a host, a scrape
exports in ``cachemgr_health_finding`` with the same level, code and device; the findings the
health model got last session (a dm-cache SSD's logged errors, records that cannot be used,
a backing device gone while dirty, the scan's warnings, protect off) among them; every code
of procedures/health.py (read from its source, never a copy) is in the admin guide's table
and, when CRITICAL, fires an alert of the shipped rules.

Before, the collector read the host its own way (a bare scan plus the owners), so none of
the findings that need what ``status`` adds to a scan reached the metrics."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core import state
from cachemgr.core.model import GoneBacking
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.metrics import SnapshotCollector
from cachemgr.procedures import health
from tests.unit.tui_helpers import copy_capture

ROOT = Path(__file__).resolve().parents[2]
HEALTH = ROOT / "cachemgr/procedures/health.py"
RULES = ROOT / "monitoring/prometheus/cachemgr.rules.yml"
GUIDE = ROOT / "docs/admin-guide.md"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def health_codes() -> dict[str, set[str]]:
    """Every code procedures/health.py gives a Finding, from its source: code -> the levels
    it is given with ("interrupted-*" for the procedure's own word)."""
    tree = ast.parse(HEALTH.read_text())
    out: dict[str, set[str]] = {}

    def words(node: ast.expr) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.IfExp):
            return words(node.body) + words(node.orelse)
        if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant):
            return [f"{node.left.value}*"]
        raise AssertionError(f"a finding code health.py spells another way: "
                             f"{ast.unparse(node)}")

    for call in ast.walk(tree):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "Finding"):
            level, code = call.args[0], call.args[1]
            levels = {m for m in re.findall(r"Level\.(\w+)", ast.unparse(level))} or {
                "CRITICAL", "WARNING"}  # a level computed from a variable
            for w in words(code):
                out.setdefault(w, set()).update(levels)
    return out


def check(root: Path) -> list[tuple[str, str, str]]:
    out = io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["--sysfs-root", str(root), "check", "--json"])
    logging.root.handlers.clear()
    return sorted((f["level"].lower(), f["code"], f["device"])
                  for f in json.loads(out.getvalue())["findings"])


def scraped(root: Path) -> list[tuple[str, str, str]]:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs(str(root)), vms=False))
    out = []
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        if fam.name == "cachemgr_health_finding":
            out += [(s.labels["level"], s.labels["code"], s.labels["device"])
                    for s in fam.samples if s.value == 1.0]
    return sorted(out)


def _records(tmp_path: Path) -> Path:
    d = Path(os.environ["CACHEMGR_DMCACHE_DIR"])
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


# each scenario: a captured lab tree and what cachemgr's own files say of it
def ssd_errors(tmp_path: Path) -> Path:
    """A writeback dm-cache whose scsi_debug SSD fails reads (the kernel log of that boot)."""
    return copy_capture(tmp_path, "dmcache-ssd-errors")


def ssd_errors_clean(tmp_path: Path) -> Path:
    """The same SSD failing under a dm-cache with no dirty block (dmsetup status's dirty
    field, the 14th, set to 0 in the copy)."""
    root = copy_capture(tmp_path, "dmcache-ssd-errors")
    f = root.parent / "dmsetup-status.txt"
    lines = []
    for line in f.read_text().splitlines():
        w = line.split()
        if len(w) > 14 and w[3] == "cache":
            w[14] = "0"
            line = " ".join(w)
        lines.append(line)
    f.write_text("\n".join(lines) + "\n")
    return root


def bad_record(tmp_path: Path) -> Path:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    d = _records(tmp_path)
    (d / "vc.json").write_text('{"name": "vc", "mode": "writeb')
    os.chmod(d / "vc.json", 0o600)
    return root


def bad_record_assembled(tmp_path: Path) -> Path:
    root = copy_capture(tmp_path, "dmcache-writeback")
    d = _records(tmp_path)
    (d / "vmcache.json").write_text("")
    os.chmod(d / "vmcache.json", 0o600)
    return root


def backing_gone(tmp_path: Path) -> Path:
    """check remembered a dirty backing device (/dev/sdq) that the tree has no disk of."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (c,) = snapshot.take(Sysfs(str(root))).cache_sets
    health.save_remembered([GoneBacking("0b1e2f00-0000-4000-8000-00000000abcd", "/dev/sdq",
                                        "/dev/bcache7", c.uuid, 32 << 20, 1.0)])
    return root


def protect_off(tmp_path: Path) -> Path:
    """An SSD protected by a pass, protect off since."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    state.write_json(state.state_dir() / "protect" / "state.json", {
        "off": 2.0, "protected": {"k": {"ssd": "/dev/ubdb", "why": "3 read errors",
                                        "since": 1.0, "devices": {"/dev/bcache0": "done"},
                                        "modes": {"/dev/bcache0": "writeback"}}}})
    return root


def scan_warning(tmp_path: Path) -> Path:
    """A bcache device whose state the scan cannot read (a word no kernel prints)."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (root / "block/bcache0/bcache/state").write_text("garbage\n")
    return root


SCENARIOS = [ssd_errors, ssd_errors_clean, bad_record, bad_record_assembled, backing_gone,
             protect_off, scan_warning]


@pytest.mark.parametrize("make", SCENARIOS, ids=lambda f: f.__name__)
def test_a_scrape_exports_what_check_finds(tmp_path: Path, make: object) -> None:
    assert callable(make)
    root = make(tmp_path)
    found = check(root)
    assert found, "the scenario gives no finding"
    assert scraped(root) == found


def test_the_findings_of_last_session_are_exported(tmp_path: Path) -> None:
    """The codes issue #41 found missing from the metrics, each exported by a scrape of one
    of the scenarios above."""
    seen: set[str] = set()
    for i, make in enumerate(SCENARIOS):
        seen |= {code for _, code, _ in scraped(make(tmp_path / str(i)))}
    want = {"failing-cache-dirty", "cache-io-errors", "bad-record", "backing-gone-dirty",
            "scan-warning", "protect-off"}
    assert want <= set(health_codes()), "a code renamed in health.py"
    assert want <= seen, want - seen


def test_a_gone_disk_still_on_the_host_is_not_said_gone(tmp_path: Path) -> None:
    """A scrape opens no disk: a remembered device whose disk is still there (ubda: bcache
    may have stopped it; or another disk took its name) is not called gone; check, which
    reads its superblock, says what it is."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (c,) = snapshot.take(Sysfs(str(root))).cache_sets
    health.save_remembered([GoneBacking("0b1e2f00-0000-4000-8000-00000000abcd", "/dev/ubda",
                                        None, c.uuid, 1 << 20, 1.0)])
    assert [code for _, code, _ in scraped(root)] == []


def test_the_guide_lists_every_code_and_every_critical_one_fires_an_alert() -> None:
    codes = health_codes()
    assert len(codes) >= 15 and "backing-gone-dirty" in codes
    guide = GUIDE.read_text()
    para = guide[guide.index("`cachemgr_health_finding` has one sample per finding"):]
    para = para[:para.index("\n\n")]
    listed = set(re.findall(r"`([a-z-]+(?:-PROCEDURE)?)`",
                            para[para.index("is one of:"):para.index("reads them")]))
    listed = {c.replace("-PROCEDURE", "-*") for c in listed if not c.startswith(
        "interrupted-") or c.endswith("-PROCEDURE")}
    assert listed == set(codes), ("the admin guide's list of codes (Alerts and dashboard) "
                                  f"differs from health.py's: {listed ^ set(codes)}")
    # CachemgrHealthCritical fires for each CRITICAL code but those its expression leaves
    # to the alerts above it (which say them from the kernel's own state): those must be
    # codes health.py gives, and none of them a code only the health model knows
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    m = re.search(r'code!~"([^"]*)"', alerts["CachemgrHealthCritical"]["expr"])
    assert m, alerts["CachemgrHealthCritical"]["expr"]
    left = m.group(1).split("|")
    words = {c.replace("*", ".*") for c in codes}
    assert set(left) <= words, f"the alert leaves out codes health.py does not give: {left}"
    fired = [c for c, lv in codes.items() if "CRITICAL" in lv
             and not re.fullmatch(m.group(1), c.replace("*", "x"))]
    assert {"backing-gone-dirty", "bad-record", "failing-cache-dirty", "dmcache-unproven",
            "protected"} <= set(fired)


def test_a_kernel_log_the_scrape_cannot_read_is_never_ok(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the kernel log (a sandbox without /dev/kmsg, no CAP_SYSLOG), a failing
    device-mapper cache SSD would not be seen: said (cachemgr_unseen), health status 3; a
    host without a device-mapper cache loses nothing by it."""
    from cachemgr.backends import kernlog

    def denied(self: kernlog.Reader) -> Iterator[str]:
        self.why_not = "the kernel log (/dev/kmsg) not read: Operation not permitted"
        yield from ()

    monkeypatch.setattr(kernlog.Reader, "_records", denied)

    def families(root: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
        reg = CollectorRegistry()
        reg.register(SnapshotCollector(Sysfs(str(root)), vms=False))
        return {f.name: [(s.labels, s.value) for s in f.samples]
                for f in text_string_to_metric_families(generate_latest(reg).decode())}

    m = families(copy_capture(tmp_path / "dm", "dmcache-writeback"))
    assert m["cachemgr_unseen"] == [({"what": "kernel-log", "path": "/dev/kmsg"}, 1.0)]
    assert m["cachemgr_health_status"] == [({}, 3.0)]
    m = families(copy_capture(tmp_path / "bcache", "bcache-writeback-dirty"))
    assert m["cachemgr_unseen"] == [] and m["cachemgr_health_status"] == [({}, 0.0)]
