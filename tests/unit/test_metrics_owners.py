"""Who owns each device, in the metrics (issue #30): ``cachemgr_device_owner_info`` and
``cachemgr_device_owner_since_seconds`` for a device a procedure holds now (another process
holds its lock) or an interrupted procedure's journal claims, on captured trees, as
``cachemgr status --json`` says it (its devices' ``owner``); nothing when nobody owns one; a
scrape never creates the state directory; a kind registered beyond the built-in ones is
asked, not branched on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.core import state
from cachemgr.core.model import CacheMode, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as ops_cache
from cachemgr.ops.metrics import SnapshotCollector
from cachemgr.procedures import kinds, owners, replace
from cachemgr.procedures.kinds import Kind
from tests.unit.guards import held_elsewhere

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BCACHE = FIXTURES / "bcache-writeback-dirty-uml" / "sys"
DMCACHE = FIXTURES / "dmcache-writeback-uml" / "sys"
LVM = FIXTURES / "lvm-caches-uml" / "sys"
UUID = "7643a213-caa1-4bce-8c4a-454fdbe3fa1c"  # bcache0's backing device
CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"
OWNER_LABELS = {"kind", "device", "path", "procedure", "run", "step", "state"}

Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def scrape(root: Path) -> tuple[Samples, str]:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs(root), vms=False))
    text = generate_latest(reg).decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out, text


def owned(m: Samples) -> dict[str, dict[str, str]]:
    """path -> the labels of its owner_info sample (each value 1)."""
    out = {}
    for lab, v in m.get("cachemgr_device_owner_info", []):
        assert v == 1.0 and set(lab) == OWNER_LABELS, lab
        assert lab["path"] not in out, "one owner per device"
        out[lab["path"]] = lab
    return out


def since(m: Samples) -> dict[str, float]:
    return {lab["path"]: v for lab, v in m.get("cachemgr_device_owner_since_seconds", [])}


def status_owner(root: Path, path: str) -> dict[str, Any] | None:
    """What ``cachemgr status --json`` says owns the device ``path``."""
    doc = ops_cache.status_json(ops_cache.status(Sysfs(root)))
    owner: dict[str, Any] | None = next(d["owner"] for d in doc["devices"]
                                        if d["device"] == path)
    return owner


def drain_journal(started: float = 1.0) -> None:
    """A bcache drain of /dev/bcache0 killed before it put the tunables back (as
    procedures/drain.py writes it)."""
    state.write_json(state.journal_path("drain", UUID), {
        "device": "/dev/bcache0", "backing": "/dev/ubda", "uuid": UUID,
        "original": {"writeback_percent": 10, "writeback_delay": 30, "writeback_running": 1},
        "started": started})


# ----------------------------------------------------------------------------- nobody


@pytest.mark.parametrize("root", [BCACHE, DMCACHE, LVM], ids=lambda p: p.parent.name)
def test_nobody_owns_a_device_nothing_is_exported(root: Path, state_dir: Path) -> None:
    m, text = scrape(root)
    assert owned(m) == {} and since(m) == {}
    # the families are there (HELP, TYPE), empty
    assert "# TYPE cachemgr_device_owner_info gauge" in text
    assert "# TYPE cachemgr_device_owner_since_seconds gauge" in text
    # a scrape reads the state directory, never makes it (the metrics' sandbox is read-only)
    assert not state_dir.exists()
    state_dir.mkdir(mode=0o700)
    (state_dir / "locks").mkdir(mode=0o700)
    assert owned(scrape(root)[0]) == {}


# ----------------------------------------------------------------------------- running


def test_a_drain_holding_the_device_is_running(state_dir: Path) -> None:
    t0 = time.time()
    with held_elsewhere(UUID, state_dir, '{"procedure": "drain"}'):
        m, _ = scrape(BCACHE)
        st = status_owner(BCACHE, "/dev/bcache0")
    assert owned(m) == {"/dev/bcache0": {
        "kind": "bcache", "device": "bcache0", "path": "/dev/bcache0", "procedure": "drain",
        "run": "", "step": "", "state": "running"}}
    assert st is not None and st["procedure"] == "drain" and st["running"]
    assert since(m) == {"/dev/bcache0": st["since"]}
    assert t0 - 5 < st["since"] <= time.time()
    # the lock released: nobody owns it any more
    assert owned(scrape(BCACHE)[0]) == {}


def test_a_replace_run_holding_the_cache_owns_its_devices(state_dir: Path) -> None:
    """A replace-ssd run holds the cache set's lock: every device on it is the run's, at the
    step it is at."""
    holder = json.dumps({"procedure": "replace-ssd", "run": "r1", "step": "drain"})
    with held_elsewhere(owners.cache_key(CSET), state_dir, holder):
        m, _ = scrape(BCACHE)
    lab = owned(m)["/dev/bcache0"]
    assert (lab["procedure"], lab["run"], lab["step"], lab["state"]) == (
        "replace-ssd", "r1", "drain", "running")


def test_a_dm_cache_flush_holding_the_device(state_dir: Path) -> None:
    with held_elsewhere(owners.dmcache_key("vmcache"), state_dir,
                        '{"procedure": "dm-cache flush"}'):
        m, text = scrape(DMCACHE)
    # the dm device's labels as every dm-cache family has them; no spaces in label values
    assert owned(m) == {"/dev/mapper/vmcache": {
        "kind": "dm-cache", "device": "dm-1", "path": "/dev/mapper/vmcache",
        "procedure": "dm-cache_flush", "run": "", "step": "", "state": "running"}}
    assert 'cachemgr_cache_mode{device="dm-1",kind="dm-cache",mode="writeback",' \
           'path="/dev/mapper/vmcache"} 1.0' in text


# ----------------------------------------------------------------------------- interrupted


def test_an_interrupted_drain_owns_its_device(state_dir: Path) -> None:
    drain_journal(started=1700000000.0)
    m, _ = scrape(BCACHE)
    assert owned(m) == {"/dev/bcache0": {
        "kind": "bcache", "device": "bcache0", "path": "/dev/bcache0", "procedure": "drain",
        "run": "", "step": "", "state": "interrupted"}}
    assert since(m) == {"/dev/bcache0": 1700000000.0}
    st = status_owner(BCACHE, "/dev/bcache0")
    assert st is not None and not st["running"] and st["since"] == 1700000000.0
    # resumed: the drain takes its lock again, and owns the device while it runs
    with held_elsewhere(UUID, state_dir, '{"procedure": "drain"}'):
        assert owned(scrape(BCACHE)[0])["/dev/bcache0"]["state"] == "running"
    # done: its journal is gone
    state.journal_path("drain", UUID).unlink()
    assert owned(scrape(BCACHE)[0]) == {}


def test_an_interrupted_replace_run_owns_its_devices_at_its_step(state_dir: Path) -> None:
    j = replace.Journal(id="gate-test", cset=CSET, options={}, old={},
                        backings=[{"uuid": UUID, "name": "ubda", "node": "/dev/ubda",
                                   "device": "/dev/bcache0", "mode": "writeback"}],
                        done=["preflight", "remember", "mode-interim"], status="failed")
    j.save()
    m, _ = scrape(BCACHE)
    lab = owned(m)["/dev/bcache0"]
    st = status_owner(BCACHE, "/dev/bcache0")
    assert st is not None
    assert (lab["procedure"], lab["run"], lab["step"], lab["state"]) == (
        "replace-ssd", "gate-test", st["step"], "interrupted")
    assert lab["step"] and lab["step"] not in j.done
    assert since(m)["/dev/bcache0"] == st["since"] == j.created
    # an interrupted claim comes before a lock someone holds on the same device
    with held_elsewhere(UUID, state_dir, '{"procedure": "mode"}'):
        assert owned(scrape(BCACHE)[0])["/dev/bcache0"]["run"] == "gate-test"


def test_an_interrupted_lvm_drain_owns_its_lv(state_dir: Path) -> None:
    state.write_json(state.journal_path("lvm-drain", "vg0-vm2"),
                     {"lv": "vg0/vm2", "started": 42.0})
    m, _ = scrape(LVM)
    # an LVM cache's labels as the dm-cache families have them (kind dm-cache, its dm node)
    assert owned(m) == {"/dev/mapper/vg0-vm2": {
        "kind": "dm-cache", "device": "dm-2", "path": "/dev/mapper/vg0-vm2",
        "procedure": "lvm_drain", "run": "", "step": "", "state": "interrupted"}}
    assert since(m) == {"/dev/mapper/vg0-vm2": 42.0}


def test_the_textfile_says_it(state_dir: Path, tmp_path: Path) -> None:
    from cachemgr.cli.main import main

    drain_journal(started=5.0)
    out = tmp_path / "cachemgr.prom"
    assert main(["--sysfs-root", str(BCACHE), "metrics", "--no-vms", "--textfile",
                 str(out)]) == 0
    text = out.read_text()
    assert ('cachemgr_device_owner_info{device="bcache0",kind="bcache",path="/dev/bcache0",'
            'procedure="drain",run="",state="interrupted",step=""} 1.0') in text
    assert ('cachemgr_device_owner_since_seconds{device="bcache0",kind="bcache",'
            'path="/dev/bcache0",procedure="drain",run="",state="interrupted",step=""} 5.0'
            ) in text


# ----------------------------------------------------------------------------- a new kind


@dataclass(frozen=True)
class Flash:
    """A cached device of a kind cachemgr does not build in."""

    name: str
    mode: CacheMode
    dirty_bytes: int | None


class FlashKind(Kind):
    name = "flashcache"
    title = "flashcache device"
    modes = (CacheMode.WRITEBACK, CacheMode.WRITETHROUGH)

    @classmethod
    def owns(cls, obj: object) -> bool:
        return isinstance(obj, Flash)

    @classmethod
    def scan(cls, sysfs: Sysfs) -> tuple[Flash, ...]:
        return (Flash("fc0", CacheMode.WRITEBACK, 4096),)

    @property
    def node(self) -> str:
        return f"/dev/mapper/{self.obj.name}"

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        return ((f"flash-{self.obj.name}", self.node),)


@pytest.fixture()
def flash_kind() -> Iterator[None]:
    kinds.register(FlashKind)
    try:
        yield
    finally:
        kinds.unregister(FlashKind)


def test_a_kind_registered_beyond_the_built_in_ones(flash_kind: None, state_dir: Path) -> None:
    """Its devices (its own scan) are in the scrape as the kind answers: name, node, mode,
    dirty bytes, and the owner of its lock keys."""
    with held_elsewhere("flash-fc0", state_dir, '{"procedure": "mode"}'):
        m, _ = scrape(BCACHE)
    assert owned(m)["/dev/mapper/fc0"] == {
        "kind": "flashcache", "device": "fc0", "path": "/dev/mapper/fc0", "procedure": "mode",
        "run": "", "step": "", "state": "running"}
    assert "/dev/bcache0" not in owned(m)
    fc = {"kind": "flashcache", "device": "fc0", "path": "/dev/mapper/fc0"}
    assert (fc, 4096.0) in m["cachemgr_dirty_bytes"]
    assert {lab["mode"]: v for lab, v in m["cachemgr_cache_mode"]
            if lab["path"] == "/dev/mapper/fc0"} == {"writeback": 1.0, "writethrough": 0.0}


def test_owners_come_from_the_snapshot_the_collector_fills(state_dir: Path) -> None:
    """metrics.collect reads Snapshot.owners: a bare scan (no owners) exports none; the
    collector's (status's) has them."""
    from cachemgr.backends import snapshot
    from cachemgr.procedures import metrics

    drain_journal()
    snap = snapshot.take(Sysfs(BCACHE))
    assert isinstance(snap, Snapshot) and snap.owners == ()
    fams = {f.name: f for f in metrics.collect(snap, journals=False)}
    assert fams["cachemgr_device_owner_info"].samples == []
    filled = ops_cache.status(Sysfs(BCACHE))  # what the collector scans (ops/metrics.py)
    fams = {f.name: f for f in metrics.collect(filled, journals=False)}
    assert [s.labels["state"] for s in fams["cachemgr_device_owner_info"].samples] == [
        "interrupted"]
