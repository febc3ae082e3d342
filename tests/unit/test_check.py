"""cachemgr check (issue #31 item 2) and the health model under it (procedures/health.py):
the monitoring-plugin contract (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, one line with
performance data) on captured lab trees and on the state a killed procedure leaves."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.cli.main import main
from cachemgr.core.model import Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import health
from tests.unit.test_parity import plant
from tests.unit.tui_helpers import copy_capture


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def check(root: Path, *extra: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--sysfs-root", str(root), "check", *extra])
    logging.root.handlers.clear()
    return rc, out.getvalue()


def test_a_healthy_cache_is_ok_with_perfdata(tmp_path: Path) -> None:
    rc, out = check(copy_capture(tmp_path, "bcache-writeback-dirty"))
    assert rc == 0
    line = out.splitlines()[0]
    assert line.startswith("CACHEMGR OK - 1 cached devices") and " | devices=1 " in line
    assert "dirty_bytes=" in line and line.count("|") == 1


@pytest.mark.parametrize(("capture", "words"), [
    ("bcache-missing-cache", "its cache set is not registered"),
    ("dmcache-failed", "the kernel reports the cache as Fail"),
])
def test_a_failed_cache_with_dirty_data_is_critical(tmp_path: Path, capture: str,
                                                    words: str) -> None:
    rc, out = check(copy_capture(tmp_path, capture))
    assert rc == 2, out
    assert out.startswith("CACHEMGR CRITICAL - 1 critical") and words in out


def test_an_interrupted_drain_is_a_warning_an_interrupted_replacement_critical(
        tmp_path: Path) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    plant(root, "drain:/dev/bcache0")
    rc, out = check(root)
    assert rc == 1, out
    assert "CACHEMGR WARNING" in out and "interrupted" in out \
        and "cachemgr drain /dev/bcache0 --resume" in out
    plant(root, "replace:/dev/bcache0")
    rc, out = check(root, "--json")
    assert rc == 2
    doc = json.loads(out)
    assert doc["status"] == "CRITICAL" and doc["exit_code"] == 2
    codes = [f["code"] for f in doc["findings"]]
    assert codes[0] == "interrupted-replace-ssd" and "interrupted-drain" in codes
    assert doc["findings"][0]["next"] == "cachemgr replace-ssd --resume gate-test"
    assert doc["perfdata"]["owners"] == 2


def test_cache_io_errors_put_every_dirty_device_at_risk(tmp_path: Path) -> None:
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty"))))
    c = snap.cache_sets[0]
    sick = dataclasses.replace(c, caches=tuple(dataclasses.replace(x, io_errors=4)
                                               for x in c.caches))
    found = health.assess(dataclasses.replace(snap, cache_sets=(sick,)))
    assert [(f.level, f.code, f.device) for f in found] == [
        (health.Level.CRITICAL, "failing-cache-dirty", "/dev/bcache0")]
    assert found[0].next == "cachemgr mode /dev/bcache0 writethrough --drain"
    assert "4 IO errors" in found[0].what
    clean = dataclasses.replace(snap, cache_sets=(sick,), backings=(
        dataclasses.replace(snap.backings[0], dirty=Size.exact(0)),))
    found = health.assess(clean)
    assert [(f.level, f.code) for f in found] == [(health.Level.WARNING, "cache-io-errors")]


def test_a_state_directory_it_cannot_trust_is_unknown(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "linked-state"
    os.symlink(real, link)
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(link))
    rc, out = check(root)
    assert rc == 3, out
    assert out.startswith("CACHEMGR UNKNOWN - ") and len(out.splitlines()) == 1


def test_status_shows_the_findings(tmp_path: Path) -> None:
    out = io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["--sysfs-root", str(copy_capture(tmp_path, "dmcache-failed")), "status",
                   "--no-vms"])
    logging.root.handlers.clear()
    assert rc == 0
    assert "CRITICAL: /dev/mapper/" in out.getvalue()


def test_the_metrics_carry_the_same_verdict(tmp_path: Path) -> None:
    from cachemgr.procedures import metrics

    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "dmcache-failed"))))
    fams = {f.name: f for f in metrics.collect(snap, journals=False)}
    assert [s.value for s in fams["cachemgr_health_status"].samples] == [2.0]
    (s,) = fams["cachemgr_health_finding"].samples
    assert s.labels == {"level": "critical", "code": "failed-cache",
                        "device": "/dev/mapper/failing"}
    ok = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty"))))
    fams = {f.name: f for f in metrics.collect(ok, journals=False)}
    assert [s.value for s in fams["cachemgr_health_status"].samples] == [0.0]
    assert fams["cachemgr_health_finding"].samples == []


@pytest.mark.parametrize("kind", ["replace", "drain"])
def test_a_journal_that_cannot_be_read_is_not_ok(tmp_path: Path, state_dir: Path,
                                                 kind: str) -> None:
    """A procedure journal cachemgr cannot read (truncated, not JSON, written by a newer
    cachemgr) claims nothing, so the gate lets changes through and the drain of its device
    refuses (exit 2); check said OK. Now WARNING, naming the file and why."""
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    (state_dir / kind).mkdir(parents=True)
    bad = state_dir / kind / "20261122-040812-fb5bd09d.json"
    bad.write_text('{"schema": 1, "id": "20261122-040812-fb5bd09d", "cset": "fb5b')
    rc, out = check(root, "--json")
    assert rc == 1, out
    doc = json.loads(out)
    assert doc["status"] == "WARNING"
    f = doc["findings"][0]
    assert (f["code"], f["device"]) == ("unreadable-journal", str(bad))
    assert "not valid JSON" in f["what"]


def test_an_unexpected_error_is_unknown_never_warning(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.ops import health as health_ops

    def boom(sysfs: Sysfs) -> None:
        raise RuntimeError("no /sys here")

    monkeypatch.setattr(health_ops, "check", boom)
    rc, out = check(copy_capture(tmp_path, "bcache-writeback-dirty"))
    assert rc == 3
    assert out == "CACHEMGR UNKNOWN - RuntimeError: no /sys here\n"


def test_a_writecache_error_and_a_setless_disk_s_errors_are_findings(tmp_path: Path) -> None:
    """The review of the model: a dm-writecache whose status reports an error, and IO
    errors on a backing device with no cache set, were silent (check said OK)."""
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "lvm-caches"))))
    wc = snap.writecaches[0]
    assert wc.status is not None
    sick = dataclasses.replace(wc, status=dataclasses.replace(wc.status, error=5))
    found = health.assess(dataclasses.replace(snap, writecaches=(sick,)))
    assert [f.code for f in found] == ["writecache-error"], found
    assert found[0].device == wc.node and "error 5" in found[0].what
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-unattached"))))
    b = next(b for b in snap.backings if b.cset_uuid is None)
    found = health.assess(dataclasses.replace(snap, backings=(
        dataclasses.replace(b, io_errors=3),)))
    assert [(f.level, f.code) for f in found] == [(health.Level.WARNING, "backing-io-errors")]


def test_a_drain_that_stopped_lowering_the_dirty_data_is_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain under way notes in the locks it holds when it last lowered the dirty data
    (core/drainloop.py); status and check read it: a drain that has not for STALLED_AFTER
    seconds is a WARNING naming its pid, one that just did is nothing."""
    import itertools
    import time
    import types

    from cachemgr.core import drainloop, state
    from cachemgr.core.errors import StallError
    from cachemgr.core.model import CacheState
    from cachemgr.procedures import kinds

    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    k = kinds.resolve(snapshot.take(sysfs), "/dev/bcache0", sysfs)
    readings = itertools.chain([4096], itertools.repeat(2048))
    now = [0.0]

    def sample() -> drainloop.Sample[int]:
        v = next(readings)
        return drainloop.Sample(v, v, CacheState.DIRTY, False)

    with contextlib.ExitStack() as held:
        for key, what in k.locks:
            held.enter_context(state.locked(key, what, holder={"procedure": "drain"}))
        with pytest.raises(StallError):
            drainloop.wait_clean(
                sample, action="drain", device="/dev/bcache0", timeout=100, stall_timeout=8,
                confirm=1, interval=1, progress=None,
                stall_error=lambda raw, p: StallError("stalled"),
                timeout_error=lambda raw: StallError("timeout"),
                clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
        holders = [h for h in state.held_locks() if h.get("pid") == os.getpid()]
        assert holders and all(h["progress_dirty"] == 2048 for h in holders), holders
        rc, out = check(root, "--json")
        assert "stalled-drain" not in out and rc == 0, out
        t = holders[0]["progress_at"] + health.STALLED_AFTER + 60
        monkeypatch.setattr(health, "time", types.SimpleNamespace(time=lambda: t))
        rc, out = check(root, "--json")
        assert rc == 1, out
        (f,) = [f for f in json.loads(out)["findings"] if f["code"] == "stalled-drain"]
        assert f["level"] == "WARNING" and f["device"] == "/dev/bcache0"
        assert "has not lowered the dirty data for 11 min (dirty 2.0 KiB)" in f["what"], f
        assert f"kill {os.getpid()}" in f["next"]
    monkeypatch.setattr(health, "time", time)
