"""The gate takes the locks of its subject in one order for every command (ops/gate.py):
two commands on overlapping objects never each take one lock and refuse each other.

The test here failed on the code before its fix."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from tests.unit.tui_helpers import copy_capture


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the gate takes its locks as root only
    return d


def test_a_device_command_and_a_set_command_at_once_are_not_both_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mode /dev/bcache0`` locks (the device, its cache set); ``tune``, ``remove`` or
    ``stop-set`` of the set lock (the set, each device on it). Started together, each took
    its first lock and was refused the other's (LOCK_NB): both refused, exit 3, each naming
    the other, and nothing done (a script or the udev worker retrying both could go on like
    that). In one order, one of them runs."""
    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))
    snap = snapshot.take(sysfs)
    device = gate.of_backing(snap.backings[0])
    cache_set = gate.of_cache_set(snap.cache_sets[0], snap)
    assert device.keys == cache_set.keys  # the same two objects

    # both commands hold their first lock before either tries its second, and neither lets
    # go of it before both tried (a command refused at its first lock breaks the barriers:
    # the other goes on alone)
    both_first, both_tried = threading.Barrier(2, timeout=5), threading.Barrier(2, timeout=5)
    real = state.locked

    def wait(b: threading.Barrier) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            b.wait()

    @contextlib.contextmanager
    def locked(key: str, what: str, **kw: Any) -> Iterator[None]:
        second = getattr(tls, "n", 0) == 1
        if second:
            wait(both_first)
        try:
            cm = real(key, what, **kw)
            cm.__enter__()
        except state.BusyError:
            if second:
                wait(both_tried)
            raise
        if second:
            wait(both_tried)
        tls.n = getattr(tls, "n", 0) + 1
        try:
            yield
        finally:
            cm.__exit__(None, None, None)

    tls = threading.local()
    monkeypatch.setattr(state, "locked", locked)
    outcome: dict[str, str] = {}

    def run(name: str, subject: gate.Subject) -> None:
        try:
            with gate.gate(subject, "tune" if name == "set" else "mode", check_kind=False):
                outcome[name] = "ran"
        except state.BusyError as exc:
            both_first.abort()
            both_tried.abort()
            outcome[name] = exc.message

    threads = [threading.Thread(target=run, args=a)
               for a in (("device", device), ("set", cache_set))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert "ran" in outcome.values(), outcome
