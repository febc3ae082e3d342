"""SIGTERM and SIGHUP stop a drain the way Ctrl-C does (cachemgr/core/signals.py): every
tunable back, the journal gone, Terminated raised; replace-ssd's drain threads too (its run
stays resumable); the helper itself (main thread only, ignored signals stay ignored, old
handlers back, a second signal does not cut the restore short)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import dmcache, snapshot
from cachemgr.backends.dmcache import command, flushing
from cachemgr.core import signals
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import drain, replace
from cachemgr.procedures.replace import bcache as replace_bcache
from tests.unit.test_dmcache_ops import ORIGINAL, SYSFS, FakeDm, device, fake  # noqa: F401
from tests.unit.test_replace_drain import ctx, endless
from tests.unit.tui_helpers import copy_capture, kernel_writes

SIGS = [signal.SIGTERM, signal.SIGHUP]
TUNABLES = ("writeback_percent", "writeback_delay", "writeback_running")


@pytest.fixture
def caught() -> Iterator[list[int]]:
    """SIGTERM and SIGHUP recorded instead of killing the test run: what they did before the
    fix. Put back afterwards."""
    got: list[int] = []
    old = {s: signal.signal(s, lambda n, f: got.append(n)) for s in SIGS}
    yield got
    for s, h in old.items():
        signal.signal(s, h)


def later(sig: int, after: float = 0.3) -> None:
    threading.Timer(after, os.kill, (os.getpid(), sig)).start()


@pytest.mark.parametrize("sig", SIGS, ids=lambda s: signal.Signals(s).name)
def test_signal_during_drain_restores_every_tunable(
        sig: int, caught: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    writes = kernel_writes(monkeypatch)
    sysfs = Sysfs(root)
    b = snapshot.take(sysfs).backings[0]
    rel = f"block/{b.identity.name}/bcache"
    before = {t: sysfs.read(f"{rel}/{t}") for t in TUNABLES}
    assert before["writeback_percent"] != "0"
    later(sig)
    t0 = time.monotonic()
    # the capture's dirty data never goes down: only the signal (or a stall) ends the drain
    with pytest.raises(KeyboardInterrupt) as ei:
        drain.drain(sysfs, b, stall_timeout=5, interval=0.05)
    assert time.monotonic() - t0 < 4, "the drain ran on to its stall"
    assert isinstance(ei.value, signals.Terminated) and ei.value.signum == sig
    assert ei.value.exit_code == 128 + sig
    assert "writeback_percent" in {w[0].rsplit("/", 1)[-1] for w in writes}  # it drained
    assert {t: sysfs.read(f"{rel}/{t}") for t in TUNABLES} == before
    assert not list((tmp_path / "state").rglob("*.json"))
    assert not list((tmp_path / "state").rglob("*.tmp"))
    assert signal.getsignal(sig) is not signal.SIG_DFL and caught == []  # handler back


@pytest.mark.parametrize("sig", SIGS, ids=lambda s: signal.Signals(s).name)
def test_signal_during_dmcache_flush_restores_the_table(
        sig: int, caught: list[int], fake: FakeDm,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = command.read_status
    polls = {"n": 0}

    def read_status(name: str):  # type: ignore[no-untyped-def]
        polls["n"] += 1
        if polls["n"] == 3:  # the flush table is loaded: the signal arrives mid-flush
            os.kill(os.getpid(), sig)
        return real(name)

    monkeypatch.setattr(command, "read_status", read_status)
    with pytest.raises(KeyboardInterrupt) as ei:
        dmcache.flush(SYSFS, device(fake), interval=0.01, stall_timeout=3)
    assert isinstance(ei.value, signals.Terminated) and ei.value.signum == sig
    assert fake.live == ORIGINAL and not fake.suspended
    assert any("cleaner" in a[-1] for a in fake.log if a[0] == "load")
    assert not flushing.journal(device(fake)).exists()
    assert caught == []


def test_sigterm_in_replace_drain_step_stops_every_drain(
        caught: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = ctx(tmp_path, monkeypatch)
    stopped: list[str] = []
    monkeypatch.setattr(drain, "drain", endless(stopped))
    c.j.save()
    later(signal.SIGTERM, 0.2)
    with pytest.raises(signals.Terminated):
        replace_bcache.s_drain(c)
    # every drain thread stopped (drain.drain restores its tunables there) before the step
    # returned, and the run is resumable: the drain step is not done
    assert sorted(stopped) == sorted(e["uuid"] for e in c.j.backings)
    j = replace.Journal.load(c.j.id)
    assert "drain" not in j.done and j.status == "running"
    assert caught == []


def test_helper_restores_handlers_and_keeps_ignored_signals_ignored() -> None:
    old_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with signals.terminate_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is signals._handler
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing raised
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)


def test_helper_is_a_no_op_outside_the_main_thread() -> None:
    seen: list[Any] = []

    def worker() -> None:
        with signals.terminate_as_interrupt():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [before]


def test_a_second_signal_does_not_cut_the_restore_short(caught: list[int]) -> None:
    done: list[str] = []
    with pytest.raises(signals.Terminated) as ei, signals.terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGHUP)  # while putting things back
            time.sleep(0.05)
            done.append("restored")
    assert ei.value.signum == signal.SIGTERM and done == ["restored"]


def test_deferred_holds_a_signal_until_its_block_ends(caught: list[int]) -> None:
    done: list[str] = []
    with pytest.raises(signals.Terminated), signals.terminate_as_interrupt():
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append("restored")
        done.append("after")  # not reached: raised as the deferred block ended
    assert done == ["restored"]


def test_state_is_reset_after_a_signal(caught: list[int]) -> None:
    for _ in range(2):  # a second operation in the same process is stopped again
        with pytest.raises(signals.Terminated), signals.terminate_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
