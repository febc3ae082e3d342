"""The stage timestamps of the udev worker's action journal: one event through the handler's
queue format and the worker (cachemgr/ops/udev.py) on a captured tree, with a clock that
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
from cachemgr.ops import udev as udev_ops
from cachemgr.procedures import autoattach
from cachemgr.procedures.autoattach import Event
from tests.unit.test_autoattach import CSET, FX, SSD_WWN
from tests.unit.test_autoattach import POLICY as BASE_POLICY

# the cache by its set, the backing device's mode only (its tunables would be more actions)
POLICY = BASE_POLICY.replace(f'device = "{SSD_WWN}"', f'cset = "{CSET}"').replace(
    "writeback_percent = 20\n", "").replace('sequential_cutoff = "4M"\n', "")


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
    ev = udev_ops.event_from(env)
    assert ev is not None
    udev_ops.enqueue(ev)
    assert udev_ops.worker(str(policy), settle=0.15, linger=0, sysfs_root=str(FX)) == 0
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
    order = [e["queued"], st["worker"], st["imported"], st["ready"], st["drained"],
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
    started = udev_ops.process_started()
    assert started is not None and started <= time.time()


def test_the_queue_format_round_trips_any_environment_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Device strings are data: '=' , newlines, quotes and bytes that are not UTF-8 (as
    os.environ decodes them) come back as they were; a JSON file of an earlier version
    still reads; a file that is neither is dropped, not acted on."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    odd = "a=b\n\"c\" " + b"\xff\xfe".decode(errors="surrogateescape")
    env = {"ACTION": "add", "DEVNAME": "/dev/sdb", "SEQNUM": "7", "ID_SERIAL": odd,
           "DEVLINKS": "/dev/disk/by-id/x /dev/disk/by-id/y=z"}
    ev = udev_ops.event_from(env)
    assert ev is not None
    udev_ops.enqueue(ev)
    q = Path(udev_ops._queue())
    (q / "1-8-1.json").write_text(json.dumps({"ACTION": "change", "DEVNAME": "/dev/sdc",
                                              "_received": 2.5}))
    (q / "2-9-1.env").write_bytes(b"no equals sign\0")
    got = udev_ops.drain()
    assert list(q.iterdir()) == []
    old, new = got
    assert Event.from_json(old).received == 2.5
    e = Event.from_json(new)
    assert e.prop("ID_SERIAL") == odd and e.prop("DEVLINKS") == env["DEVLINKS"]
    assert (e.seqnum, e.received, e.started) == (7, ev["_received"], ev["_started"])


def test_the_settle_wait_counts_from_when_the_oldest_event_was_queued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An event queued longer ago than the settle time is taken at once; one queued just
    now waits the rest of it."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(autoattach_ops, "act", lambda sysfs, view, a: None)
    policy = tmp_path / "cachemgr.toml"
    policy.write_text(POLICY)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    for age, expected in ((1.0, 0.0), (0.05, 0.1)):
        slept.clear()
        ev = udev_ops.event_from({"ACTION": "add", "DEVNAME": "/dev/ubdb"})
        assert ev is not None
        udev_ops.enqueue(ev)
        queued = udev_ops.oldest_queued()
        assert queued is not None
        monkeypatch.setattr(time, "time", lambda q=queued, a=age: q + a)
        udev_ops.worker(str(policy), settle=0.15, linger=0, sysfs_root=str(FX))
        assert slept == [pytest.approx(expected, abs=1e-3)]


def test_a_lingering_worker_takes_the_next_event_and_holds_the_pending_lock(
        clock: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After its pass the worker waits for more events with its modules imported: an event
    queued then is its own (a handler sees it pending and starts no other worker)."""
    polls: list[bool] = []

    def poll(seconds: float) -> None:
        if seconds == udev_ops.POLL_S:
            polls.append(udev_ops.worker_pending())
            if len(polls) == 2:  # the other disk of the pair arrives
                ev = udev_ops.event_from({"ACTION": "add", "DEVNAME": "/dev/ubda",
                                          "SEQNUM": "1630"})
                assert ev is not None
                udev_ops.enqueue(ev)

    monkeypatch.setattr(time, "sleep", poll)
    monkeypatch.setattr(udev_ops, "_warm", lambda: polls.append(udev_ops.worker_pending()))
    monkeypatch.setattr(autoattach_ops, "act", lambda sysfs, view, a: None)
    policy = tmp_path / "cachemgr.toml"
    policy.write_text(POLICY)
    ev = udev_ops.event_from({"ACTION": "add", "DEVNAME": "/dev/ubdb", "SEQNUM": "1629"})
    assert ev is not None
    udev_ops.enqueue(ev)
    assert udev_ops.worker(str(policy), linger=10, sysfs_root=str(FX)) == 0
    passes = [r for r in journal() if r["kind"] == "pass"]
    assert [p["seqnums"] for p in passes] == [[1629], [1630]]
    # imported once, pending while it lingered, gone when it returned
    assert polls[0] and all(polls) and len(polls) > 2
    assert not udev_ops.worker_pending() and udev_ops.oldest_queued() is None


def test_the_rules_call_imports_only_what_it_needs(tmp_path: Path) -> None:
    """The handler udev runs for every block event (install-udev.sh's command line) imports
    none of the modules that cost most of a handler's start (cachemgr/ops/udev.py's docstring)."""
    import subprocess
    import sys

    code = ("import sys; from cachemgr.cli import udev; "
            "rc = udev.main(['udev-event', '--policy', sys.argv[1]]); "
            "print(rc, sorted(m for m in ('argparse', 'json', 'logging', 're', 'typing', "
            "'pathlib', 'cachemgr.core.state') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "none.toml")],
                         capture_output=True, text=True, check=True).stdout
    assert out.split(maxsplit=1) == ["0", "[]\n"], out


def test_the_rules_call_that_queues_loads_its_face_and_runtime_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's command line, run as udevd runs it (``-m cachemgr.cli.udev``), for an event
    it queues while a worker is pending: of cachemgr it loads the face and its runtime
    (cachemgr/ops/udev.py) and nothing else (not the command layer's other modules, which
    load the backends) and cachemgr.core.safefs (what opens the state directory without
    following links, as cachemgr.core.state does), and of the standard library no more
    than fcntl and __future__."""
    import fcntl
    import os
    import subprocess
    import sys

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    policy = tmp_path / "cachemgr.toml"
    policy.write_text(POLICY)
    code = ("import runpy, sys; before = set(sys.modules); "
            "sys.argv = ['cachemgr.cli.udev', 'udev-event', '--policy', sys.argv[1]]\n"
            "try:\n    runpy.run_module('cachemgr.cli.udev', run_name='__main__')\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "print(rc, ' '.join(sorted(set(sys.modules) - before)))")
    env = {"CACHEMGR_STATE_DIR": str(tmp_path / "state"), "ACTION": "add",
           "SUBSYSTEM": "block", "DEVNAME": "/dev/sdq", "SEQNUM": "5",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    pending = udev_ops._lock_fd("autoattach-pending")  # a worker is pending: none is started
    try:
        fcntl.flock(pending, fcntl.LOCK_EX)
        out = subprocess.run([sys.executable, "-c", code, str(policy)], env=env,
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.close(pending)
    rc, *loaded = out.split()
    assert rc == "0", out
    assert len(os.listdir(udev_ops._queue())) == 1  # the event was queued
    # the face itself runs as __main__, as under -m
    assert sorted(m for m in loaded if m.startswith("cachemgr")) == [
        "cachemgr", "cachemgr.cli", "cachemgr.core", "cachemgr.core.safefs", "cachemgr.ops",
        "cachemgr.ops.udev"], out
    assert {m for m in loaded if not m.startswith("cachemgr")} <= {"__future__", "fcntl"}, out


def test_the_worker_process_runs_ahead_of_udevs_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker command (what systemd-run starts; the forked worker does the same) sets
    its nice before it works; a refusal (no CAP_SYS_NICE) is not an error."""
    import os

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    calls: list[tuple[int, int, int]] = []

    def setpriority(which: int, who: int, prio: int) -> None:
        calls.append((which, who, prio))
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", setpriority)
    rc = udev_cli.main(["worker", "--policy", str(tmp_path / "none.toml"), "--linger", "0"])
    assert rc == 0
    assert calls == [(os.PRIO_PROCESS, 0, udev_ops.WORKER_NICE)] and udev_ops.WORKER_NICE < 0
