"""The stage timestamps of the udev worker's action journal: one event through the handler's
queue format and the worker (cachemgr/cli/udev.py) on a captured tree, with a clock that
steps by one second at each reading, so each stage's time says in which order it was taken.

The capture is tests/fixtures/bcache-unattached-uml (a backing device ubda attached to
nothing, a cache set on ubdb); the executor is a fake that records what it was asked.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from cachemgr.cli import udev as udev_cli
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.procedures import autoattach
from cachemgr.procedures.autoattach import Event

FX = Path(__file__).resolve().parent.parent / "fixtures" / "bcache-unattached-uml" / "sys"
BUUID = "a978012d-8ec0-44df-bf32-93fd5a00ca7a"
CSET = "3a85497b-f234-4651-a39a-c547edabc679"
POLICY = f"""version = 1

[cache.ssd0]
cset = "{CSET}"

[backing.vm-a]
device = "uuid:{BUUID}"
cache = "ssd0"
mode = "writeback"
"""


@pytest.fixture
def clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    ticks = itertools.count(1000)
    monkeypatch.setattr(time, "time", lambda: float(next(ticks)))
    monkeypatch.setattr(time, "sleep", lambda s: None)


def journal() -> list[dict[str, object]]:
    text = Path(autoattach.actions_log()).read_text()
    return [json.loads(line) for line in text.splitlines()]


def run_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
               ) -> list[str]:
    """Queue ``env`` as the handler does, run one worker on the capture; what it did."""
    done: list[str] = []
    monkeypatch.setattr(autoattach_ops, "act", lambda sysfs, view, a: done.append(a.kind))
    policy = tmp_path / "cachemgr.toml"
    policy.write_text(POLICY)
    ev = udev_cli.event_from(env)
    assert ev is not None
    udev_cli.enqueue(ev)
    assert udev_cli.worker(str(policy), settle=0.15, sysfs_root=str(FX)) == 0
    return done


def test_a_pass_records_each_stage_in_order(clock: None, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    done = run_worker(tmp_path, monkeypatch, {
        "ACTION": "add", "DEVNAME": "/dev/ubdb", "SEQNUM": "1629", "SUBSYSTEM": "block"})
    assert done == ["attach", "mode"]
    records = journal()
    assert [r["kind"] for r in records] == ["attach", "mode", "pass"]
    p = records[-1]
    st = p["stages"]
    assert isinstance(st, dict)
    (e,) = p["event_stages"]  # type: ignore[misc]
    assert (e["seq"], e["action"], e["dev"]) == (1629, "add", "ubdb")
    # this test's own process started long before its fake clock's first tick
    assert e["started"] is not None and e["started"] < e["queued"]
    r1, r2 = st["rounds"]
    order = [e["queued"], st["worker"], st["ready"], st["drained"], st["imported"],
             st["policy"], r1["view"], r1["decided"], records[0]["t"], records[1]["t"],
             r1["acted"], r2["view"], r2["decided"], st["done"], p["t"]]
    assert order == sorted(order) and len(set(order)) == len(order), order
    assert "acted" not in r2  # the second round found nothing left to do
    assert all(isinstance(r["took_s"], float) for r in records[:2])
    assert p["latency_s"] == st["done"] - e["queued"]


def test_an_event_without_a_start_time_reads_as_none(clock: None) -> None:
    """A queued event of an earlier handler (no _started) still reads; a bad one does not."""
    e = Event.from_json({"ACTION": "add", "DEVNAME": "/dev/sdb", "_received": 5.0})
    assert e.started is None and e.stages()["started"] is None
    assert Event.from_json(e.to_json()) == e
    with pytest.raises(autoattach.KernelFormatError):
        Event.from_json({"ACTION": "add", "_received": 5.0, "_started": "soon"})


def test_process_started_is_before_now() -> None:
    started = udev_cli.process_started()
    assert started is not None and started <= time.time()
