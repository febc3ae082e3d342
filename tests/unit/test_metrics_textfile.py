"""``cachemgr metrics --textfile PATH --interval S`` (issue #34 item 1): one process rewrites
node_exporter's textfile through the listener's collector and scan cache, where
cachemgr-textfile.timer started a process (and a full scan) every 15 s.

On the lab's 64-device capture: each file is the one-shot's byte for byte (from the second on,
with the measured write-back traffic a one-shot cannot know, 0 on a capture), and the refreshes
after the first run no ``dmsetup table``. A failed write is logged and tried again, the last
whole file left; SIGTERM ends the loop (exit 0) with a whole file, also when it comes in the
middle of a write. The clock and the sleep are the test's: no timed assertion."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cachemgr.cli.main import main
from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import metrics as ops_metrics
from cachemgr.procedures import metrics
from tests.unit.test_metrics_cache import count_dmsetup
from tests.unit.test_scan_budget import Clock
from tests.unit.tui_helpers import fx, unpacked

ROOT = Path(__file__).resolve().parents[2]
WB = b"cachemgr_bcache_written_back_bytes_per_second"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def fx64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 backing devices on dm-linear slices, one cache set (the lab's capture)."""
    return unpacked("bcache-64-backing", tmp_path_factory)


def one_shot(root: Path, out: Path) -> bytes:
    """What ``metrics --textfile`` (the timer's command) writes."""
    assert main(["--sysfs-root", str(root), "metrics", "--no-vms", "--textfile", str(out)]) == 0
    return out.read_bytes()


def without_wb(body: bytes) -> bytes:
    """``body`` without the write-back traffic's samples (its HELP and TYPE stay: the
    one-shot has them, with no sample)."""
    return b"".join(x for x in body.splitlines(keepends=True) if not x.startswith(WB))


class Sleeper:
    """The loop's sleep: moves the clock by what it was asked, then runs the test's step
    for this sleep (its index), if any."""

    def __init__(self, clock: Clock, steps: dict[int, Callable[[], None]] | None = None
                 ) -> None:
        self.clock, self.steps, self.asked = clock, steps or {}, []  # type: list[float]

    def __call__(self, s: float) -> None:
        self.asked.append(s)
        self.clock.t += s
        step = self.steps.get(len(self.asked))
        if step is not None:
            step()


def registry(root: Path, clock: Clock) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(ops_metrics.SnapshotCollector(Sysfs(root), vms=False, clock=clock))
    return reg


def recording(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every body the loop writes, in order (through the real atomic write)."""
    bodies: list[bytes] = []
    real = state.write_atomic

    def write(path: Path, data: bytes, *, mode: int = 0o600) -> None:
        real(path, data, mode=mode)
        bodies.append(data)

    monkeypatch.setattr(state, "write_atomic", write)
    return bodies


def test_each_file_is_the_one_shots_and_no_dmsetup_table_again(
        fx64: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    once = one_shot(fx64, tmp_path / "once.prom")
    calls = count_dmsetup(monkeypatch)
    bodies = recording(monkeypatch)
    clock = Clock()
    sleep = Sleeper(clock)
    out = tmp_path / "loop.prom"
    n = metrics.textfile_loop(out, registry(fx64, clock), 15.0, clock=clock, sleep=sleep,
                              refreshes=6)
    assert n == len(bodies) == 6
    assert sleep.asked == [15.0] * 5  # every 15 s of the loop's clock
    assert bodies[0] == once  # the first: the one-shot's, byte for byte
    for body in bodies[1:]:
        # then the write-back traffic measured between two looks (0 on a capture: none), and
        # otherwise the same bytes (the intervals carried between their reads, once a minute)
        assert without_wb(body) == once
        assert body.count(WB + b"{") == 64 and all(
            x.endswith(b" 0.0") for x in body.splitlines() if x.startswith(WB + b"{"))
    assert out.read_bytes() == bodies[-1] and out.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.prom", "once.prom"]
    # nothing changed (no uevent): the table read for the first file is the one listing of
    # all six refreshes (the slices are dm-linear: no cache device's status to read)
    assert calls == ["table"]


def test_a_refresh_slower_than_the_interval_skips_what_it_missed(
        tmp_path: Path) -> None:
    clock = Clock()
    reg = registry(fx("bcache-writeback-dirty"), clock)
    slow = {"n": 0}
    real = reg.collect

    def collect() -> object:  # the second refresh takes 2.5 intervals
        slow["n"] += 1
        if slow["n"] == 2:
            clock.t += 25.0
        return real()

    reg.collect = collect  # type: ignore[method-assign]
    sleep = Sleeper(clock)
    metrics.textfile_loop(tmp_path / "m.prom", reg, 10.0, clock=clock, sleep=sleep,
                          refreshes=4)
    # started at t0 + 10, ended at t0 + 35: the next at t0 + 40, not at once
    assert sleep.asked == [10.0, 5.0, 10.0]


def test_a_failed_write_is_logged_and_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The directory gone for two refreshes, then the disk full for one: each logged once,
    the loop goes on; the file comes back with the directory, whole, and no temporary file
    is left anywhere."""
    d = tmp_path / "textfile"
    d.mkdir()
    out = d / "cachemgr.prom"
    clock = Clock()
    real = state.write_atomic
    full = {"on": False}

    def write(path: Path, data: bytes, *, mode: int = 0o600) -> None:
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data, mode=mode)

    monkeypatch.setattr(state, "write_atomic", write)
    saved: dict[str, bytes] = {}

    def gone() -> None:
        saved["last"] = out.read_bytes()
        shutil.rmtree(d)

    def back() -> None:
        d.mkdir()

    def disk_full() -> None:
        full["on"] = True
        out.write_bytes(b"kept\n")

    def room() -> None:
        full["on"] = False
        assert out.read_bytes() == b"kept\n"  # the failed write left the old file alone

    sleep = Sleeper(clock, {2: gone, 4: back, 5: disk_full, 6: room})
    caplog.set_level(logging.WARNING, logger="cachemgr.procedures.metrics")
    n = metrics.textfile_loop(out, registry(fx("bcache-writeback-dirty"), clock), 15.0,
                              clock=clock, sleep=sleep, refreshes=5)
    # refreshes 1 and 2 wrote, 3 and 4 found no directory, 5 was written, 6 found the disk
    # full, 7 and 8 wrote: five files, eight refreshes
    assert n == 5 and len(sleep.asked) == 7
    assert out.read_bytes().startswith(b"# HELP ") and b"cachemgr_dirty_bytes{" in \
        out.read_bytes()
    assert sorted(p.name for p in d.iterdir()) == ["cachemgr.prom"]
    words = [r.getMessage() for r in caplog.records]
    assert words == [
        f"metrics: {out} not written: No such file or directory (trying again every 15 s)",
        f"metrics: {out} written again, after 2 failed refreshes",
        f"metrics: {out} not written: No space left on device (trying again every 15 s)",
        f"metrics: {out} written again, after 1 failed refresh",
    ], words
    assert saved["last"].startswith(b"# HELP ")


def test_sigterm_while_sleeping_ends_the_loop(tmp_path: Path) -> None:
    clock = Clock()
    out = tmp_path / "m.prom"
    sleep = Sleeper(clock, {3: lambda: os.kill(os.getpid(), signal.SIGTERM)})
    n = metrics.textfile_loop(out, registry(fx("bcache-writeback-dirty"), clock), 15.0,
                              clock=clock, sleep=sleep)
    assert n == 3 and len(sleep.asked) == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler put back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.prom"]


def test_sigterm_in_the_middle_of_a_write_waits_for_the_whole_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal arrives after the temporary file is written, before its rename: the file
    is completed and renamed, then the loop ends."""
    clock = Clock()
    out = tmp_path / "m.prom"
    real = os.replace
    renamed: list[str] = []

    def replace(src: str, dst: str, **kw: object) -> None:
        if len(renamed) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once: held by the loop
        real(src, dst, **kw)  # type: ignore[arg-type]
        renamed.append(dst)

    monkeypatch.setattr(os, "replace", replace)
    n = metrics.textfile_loop(out, registry(fx("bcache-writeback-dirty"), clock), 15.0,
                              clock=clock, sleep=Sleeper(clock))
    assert n == 2 and len(renamed) == 2
    assert without_wb(out.read_bytes()) == one_shot(fx("bcache-writeback-dirty"),
                                                    tmp_path / "once.prom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.prom", "once.prom"]


def test_the_command_runs_until_sigterm_and_exits_0(tmp_path: Path) -> None:
    """The real command in a process of its own: it rewrites the file (a new inode each
    time), SIGTERM ends it with exit 0, and the file it leaves is the one-shot's plus the
    write-back traffic."""
    root = fx("bcache-writeback-dirty")
    out = tmp_path / "m.prom"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "cachemgr", "--sysfs-root", str(root),
                          "metrics", "--no-vms", "--textfile", str(out), "--interval", "0.05"],
                         cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        inodes: set[int] = set()
        deadline = time.monotonic() + 120  # a bound for a loaded host, not a measurement
        while len(inodes) < 3 and time.monotonic() < deadline and p.poll() is None:
            try:
                inodes.add(out.stat().st_ino)
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        assert len(inodes) >= 3, (inodes, p.poll())
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert err == f"cachemgr: {out} written; rewritten every 0.05 s\n", err
    assert without_wb(out.read_bytes()) == one_shot(root, tmp_path / "once.prom")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.prom", "once.prom"]
