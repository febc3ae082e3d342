"""procedures/snapshot.py: the order of the steps (drain, freeze at the rest, drain the rest,
snapshot, thaw), what each failure leaves (always thawed, the journal gone or kept for
restore), the freeze bound, and the recovery of a run killed at each phase; the mountinfo
parser of backends/fsfreeze.py. Recording fakes stand in for the host."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cachemgr.backends import fsfreeze
from cachemgr.core import state
from cachemgr.core.errors import AlreadyError, CacheMgrError
from cachemgr.core.model import CacheState, DrainProgress
from cachemgr.procedures import owners
from cachemgr.procedures import snapshot as snap

REQ = snap.Request("/dev/bcache0", ("uuid-1", "replace-cset-1"), "/srv/vms", "vg0/vm1",
                   "vg0/good", rest=4 << 20, max_freeze=10.0)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def reading(dirty: int) -> DrainProgress:
    return DrainProgress("drain", "/dev/bcache0", dirty, None, None, None, 0.0,
                         CacheState.CLEAN if dirty == 0 else CacheState.DIRTY)


class Host:
    """A bcache device under a drain: each drain reading takes ``step`` seconds of the
    clock; frozen, each reading of the dirty data gives the next of ``frozen_readings``
    (then ``dirty_left``); the journal's phase is noted at each step."""

    def __init__(self, clock: Clock, readings: list[int], *, frozen_readings: list[int]
                 | None = None, step: float = 1.0, fail: str | None = None,
                 snapshot_s: float = 0.5) -> None:
        self.clock, self.readings, self.step = clock, readings, step
        self.frozen_readings = frozen_readings if frozen_readings is not None else [0, 0]
        self.fail, self.snapshot_s = fail, snapshot_s
        self.log: list[str] = []
        self.frozen = False
        self.taken = False
        self.dirty_left = 0
        self.polls = 0
        self.in_drain = False
        self.cache_mode = "writeback"

    def phase(self) -> str | None:
        d = state.read_json(snap.journal_path(REQ.key))
        return None if d is None else str(d["phase"])

    def drain(self, progress: Callable[[DrainProgress], None]) -> None:
        self.log.append(f"drain[{self.phase()}]")
        if self.fail == "already" or (not self.readings and not self.frozen):
            raise AlreadyError("/dev/bcache0 is already clean")
        self.in_drain = True
        try:
            while self.readings:
                self.clock.t += self.step
                progress(reading(self.readings.pop(0)))
            if self.frozen:  # a drain started frozen: its readings are the frozen ones
                self.clock.t += self.step
                progress(reading(self.dirty_bytes() or 0))
            if self.fail == "drain":
                raise CacheMgrError("the drain stalled")
        finally:
            self.in_drain = False
            self.log.append("tunables back")

    def dirty_bytes(self) -> int | None:
        if self.frozen and self.frozen_readings:
            self.polls += 1
            return self.frozen_readings.pop(0)
        return self.dirty_left

    def mode(self) -> str | None:
        return self.cache_mode

    def set_mode(self, mode: str) -> None:
        self.log.append(f"mode {mode}")
        self.cache_mode = mode

    def freeze(self) -> None:
        self.log.append(f"freeze[{self.phase()}]")
        if self.fail == "freeze":
            raise CacheMgrError("fsfreeze failed")
        self.frozen = True

    def unpace(self) -> None:
        # only a drain puts the settings back: written outside one, they would stay (the
        # next drain would even journal them as the originals)
        assert self.in_drain, "unpace outside a drain"
        self.log.append("unpace")

    def thaw(self) -> bool:
        self.log.append("thaw")
        was, self.frozen = self.frozen, False
        return was

    def snapshot(self) -> None:
        self.log.append(f"snapshot[{self.phase()}]")
        self.clock.t += self.snapshot_s
        if self.fail == "snapshot":
            raise CacheMgrError("lvcreate failed")
        self.taken = True

    def snapshot_exists(self) -> bool:
        return self.taken


def take(host: Host) -> snap.Taken:
    clock = host.clock
    return snap.take(REQ, host, clock=clock, sleep=lambda s: setattr(clock, "t", clock.t + s))


def test_drains_freezes_at_the_rest_drains_the_rest_snapshots_and_thaws() -> None:
    host = Host(Clock(), [64 << 20, 20 << 20, 5 << 20, 3 << 20, 1 << 20],
                frozen_readings=[2 << 20, 1 << 20, 0, 0])
    t = take(host)
    # frozen at the first reading at or under 4 MiB, never before; the rest polled until 0
    # twice, the drain stopped (its tunables back) before the snapshot, journaled
    # "snapshotting"; thawed last
    assert host.log == ["drain[draining]", "freeze[frozen]", "unpace", "tunables back",
                        "snapshot[snapshotting]", "thaw"]
    assert host.cache_mode == "writeback"
    assert t.start_dirty == 64 << 20 and t.dirty_at_freeze == 3 << 20
    assert host.readings == [1 << 20]  # the drain's later readings never came
    assert t.rest_s == pytest.approx(3 * snap.POLL)
    assert t.freeze_s == pytest.approx(3 * snap.POLL + 0.5)
    assert t.snapshot_s == pytest.approx(0.5)
    assert not snap.journal_path(REQ.key).exists()
    assert host.taken and not host.frozen


def test_a_zero_between_dirty_readings_is_not_the_end() -> None:
    host = Host(Clock(), [3 << 20, 2 << 20], frozen_readings=[0, 4096, 0, 0])
    t = take(host)
    assert host.polls == 4 and t.rest_s == pytest.approx(3 * snap.POLL)


def test_no_freeze_before_writeback_is_seen_moving() -> None:
    """Under the rest from the first reading: bcache's writeback thread may still sleep its
    writeback_delay (30 s); the freeze waits for a reading lower than the one before."""
    host = Host(Clock(), [3 << 20, 3 << 20, 3 << 20, 5 << 20, 2 << 20, 1 << 20],
                frozen_readings=[0, 0])
    t = take(host)
    assert t.dirty_at_freeze == 2 << 20 and host.readings == [1 << 20]


def test_clean_from_the_start_still_freezes_and_drains_what_the_freeze_wrote() -> None:
    host = Host(Clock(), [], frozen_readings=[512 << 10, 512 << 10, 0, 0])
    t = take(host)
    # the drain again, frozen: its settings (unthrottled) hold while the rest is polled
    assert host.log == ["drain[draining]", "mode writethrough", "freeze[frozen]",
                        "drain[frozen]", "unpace", "tunables back", "snapshot[snapshotting]",
                        "thaw", "mode writeback"]
    assert host.polls == 4 and t.dirty_at_freeze == 0 and t.start_dirty == 0


@pytest.mark.parametrize("fail", ["drain", "snapshot"])
def test_a_failure_while_frozen_thaws_and_takes_no_snapshot(fail: str) -> None:
    host = Host(Clock(), [8 << 20] if fail == "drain" else [2 << 20, 1 << 20], fail=fail)
    if fail == "drain":  # the drain stalls before the rest is reached: never frozen
        with pytest.raises(CacheMgrError, match="stalled"):
            take(host)
        assert "thaw" not in host.log and not any(x.startswith("freeze") for x in host.log)
    else:
        with pytest.raises(CacheMgrError, match="lvcreate failed"):
            take(host)
        assert host.log[-1] == "thaw" and not host.frozen
    assert not host.taken and host.cache_mode == "writeback"
    assert not snap.journal_path(REQ.key).exists()


def test_a_failed_freeze_is_thawed_all_the_same() -> None:
    """fsfreeze failing (or killed by its timeout) may still have frozen: thaw is tried."""
    host = Host(Clock(), [2 << 20, 1 << 20], fail="freeze")
    with pytest.raises(CacheMgrError, match="fsfreeze failed"):
        take(host)
    assert host.log[-2:] == ["tunables back", "thaw"] and not host.taken


def test_the_freeze_is_bounded_it_thaws_and_says_so() -> None:
    host = Host(Clock(), [2 << 20, 1 << 20], frozen_readings=[1 << 20] * 1000)
    with pytest.raises(snap.FreezeTooLong, match="--max-freeze 10 s") as exc:
        take(host)
    assert exc.value.exit_code == 5
    assert host.log[-2:] == ["tunables back", "thaw"] and not host.taken
    assert not any(x.startswith("snapshot") for x in host.log)
    assert host.polls == pytest.approx(10 / snap.POLL, abs=2)


def test_still_dirty_after_the_drain_takes_no_snapshot() -> None:
    """The drain says clean (AlreadyError), frozen, and the device still reads dirty."""
    host = Host(Clock(), [], frozen_readings=[], fail="already")
    host.dirty_left = 8192
    with pytest.raises(CacheMgrError, match=r"8\.0 KiB dirty after the drain"):
        take(host)
    assert host.log[-2:] == ["thaw", "mode writeback"] and not host.taken


def test_a_write_through_cache_keeps_its_mode() -> None:
    host = Host(Clock(), [])
    host.cache_mode = "writethrough"
    take(host)
    assert not any(x.startswith("mode") for x in host.log) and host.taken


def test_a_thaw_that_fails_keeps_the_journal_for_restore() -> None:
    host = Host(Clock(), [2 << 20, 1 << 20])

    def broken() -> bool:
        raise CacheMgrError("fsfreeze --unfreeze failed")

    host.thaw = broken  # type: ignore[method-assign]
    with pytest.raises(CacheMgrError, match="unfreeze"):
        take(host)
    assert snap.journal_path(REQ.key).exists()
    (o,) = [o for o in owners.interrupted() if o.procedure == "snapshot"]
    assert o.keys == frozenset(REQ.keys) and o.resume == "cachemgr restore"
    assert o.step == "snapshotted"
    j = snap.interrupted(REQ.key)
    assert j is not None and j.mode == "writeback"  # for restore to put back


# ------------------------------------------------------------------ a run killed at each phase


def killed_at(phase: str) -> snap.Interrupted:
    """The journal a run SIGKILLed right after journaling ``phase`` leaves."""
    state.write_json(snap.journal_path(REQ.key), {
        "device": REQ.device, "keys": list(REQ.keys), "mountpoint": REQ.mountpoint,
        "origin": REQ.origin, "snapshot": REQ.snapshot, "phase": phase, "started": 1.0,
        "mode": "writeback", "pid": 1})
    j = snap.interrupted(REQ.key)
    assert j is not None and j.phase == phase
    return j


@pytest.mark.parametrize(("phase", "frozen", "taken", "thawed", "words"), [
    ("draining", False, False, False, []),
    ("frozen", True, False, True, ["thawed", "vg0/good: not taken"]),
    ("frozen", False, False, False, ["not frozen", "vg0/good: not taken"]),
    ("snapshotting", True, False, True, ["thawed", "vg0/good: not taken"]),
    ("snapshotting", True, True, True, ["thawed", "vg0/good: taken", "consistent"]),
    ("snapshotted", True, True, True, ["thawed", "vg0/good: taken", "consistent"]),
])
def test_recover_after_a_kill_at_each_phase(phase: str, frozen: bool, taken: bool,
                                            thawed: bool, words: list[str]) -> None:
    j = killed_at(phase)
    assert [o.procedure for o in owners.interrupted()] == ["snapshot"]
    calls: list[str] = []

    def thaw(mp: str) -> bool:
        calls.append(mp)
        return frozen

    modes: list[tuple[str, str]] = []

    def set_mode(device: str, mode: str) -> bool:
        modes.append((device, mode))
        return frozen

    said = snap.recover(j, thaw=thaw, exists=lambda name: taken and name == "vg0/good",
                        set_mode=set_mode)
    assert calls == ([] if phase == "draining" else ["/srv/vms"])
    # the mode is put back from the freeze on (the switch comes just before it)
    assert modes == ([] if phase == "draining" else [("/dev/bcache0", "writeback")])
    text = " ".join(said)
    for w in words:
        assert w in text, (w, said)
    assert ("thawed (left frozen" in text) == thawed
    assert not snap.journal_path(REQ.key).exists()
    assert owners.interrupted() == []


def test_a_journal_that_is_not_a_snapshot_journal_is_refused() -> None:
    state.write_json(snap.journal_path(REQ.key), {"device": "/dev/bcache0", "keys": [],
                                                  "phase": "frozen"})
    with pytest.raises(state.StateFileError):
        snap.interrupted(REQ.key)
    assert snap.load({"device": "x", "keys": ["k"], "mountpoint": "rel/path", "origin": "a/b",
                      "snapshot": "a/c", "phase": "frozen"}, "p") is None


# ------------------------------------------------------------------ fsfreeze's mountinfo


def test_mountinfo_lines_and_their_escapes() -> None:
    text = ("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
            "36 22 252:0 / /srv/vm\\040disks rw,relatime shared:9 - ext4 /dev/bcache0 rw\n"
            "37 22 0:5 / /dev rw - devtmpfs udev rw,size=1k\n")
    ms = fsfreeze.parse_mountinfo(text)
    assert [m.mountpoint for m in ms] == ["/", "/srv/vm disks", "/dev"]
    assert ms[1].dev == "252:0" and ms[1].fstype == "ext4" and ms[1].source == "/dev/bcache0"


def test_mount_at_takes_the_last_mount_and_refuses_a_relative_path(tmp_path: Path) -> None:
    mi = tmp_path / "mountinfo"
    mi.write_text("40 22 252:0 / /srv rw - ext4 /dev/bcache0 rw\n"
                  "41 40 252:1 / /srv rw - xfs /dev/bcache1 rw\n")
    m = fsfreeze.mount_at("/srv/", mi)
    assert m is not None and m.dev == "252:1"
    assert fsfreeze.mount_at("/other", mi) is None
    with pytest.raises(CacheMgrError):
        fsfreeze.mount_at("srv", mi)
    assert os.path.isabs(fsfreeze.check_mountpoint("/a/../b"))


def test_the_live_steps_are_the_kinds_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """The cache's part of the live steps (its readings, its mode, the unthrottled drain)
    and restore's mode setter go through the device's kind (Kind.snapshot_cache, set_mode)
    on a fresh read, not through bcache's own functions: a bcache device's are bcache's
    writes (on a copy of a lab capture); the test-only kind, which declares a mode switch
    and no snapshot, is switched by restore's setter and refused the snapshot by name."""
    from cachemgr.core.model import CacheMode
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import kinds
    from cachemgr.procedures.kinds.base import Kind
    from tests.unit.test_kind_registry import SWITCHED, Toy
    from tests.unit.tui_helpers import copy_capture, kernel_writes

    writes = kernel_writes(monkeypatch)
    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty")))
    put = snap.mode_setter(sysfs)
    assert put("/dev/bcache0", "writeback") is False  # already so
    assert put("/dev/bcache0", "writethrough") is True
    with pytest.raises(CacheMgrError, match="/dev/nothing: not found to put its cache mode"):
        put("/dev/nothing", "writeback")
    snapshot = snap.snapshot_mod.take(sysfs, stats=False)
    k: Kind = kinds.resolve(snapshot, "/dev/bcache0", sysfs)
    cache = k.snapshot_cache(sysfs, max_latency_ms=None, timeout=1, stall_timeout=1)
    steps = snap.LiveSteps(cache, mountpoint="/srv", origin="vg/lv", name="vg/s", size=None,
                           thin=False)
    assert steps.mode() == "writethrough"
    assert steps.dirty_bytes() == k.dirty_bytes and (k.dirty_bytes or 0) > 0
    steps.set_mode("writethrough")  # already so: fine
    steps.unpace()
    assert [(p.rsplit("/", 1)[1], v) for p, v in writes] == [
        ("cache_mode", "writethrough"), ("writeback_percent", "0"), ("writeback_delay", "0")]
    SWITCHED.clear()
    kinds.register(Toy)
    try:
        assert snap.mode_setter(sysfs)("/dev/toy0", "writethrough") is True
        assert SWITCHED == [("/dev/toy0", CacheMode.WRITETHROUGH)]
        toy = Toy(next(iter(Toy.scan(sysfs))))
        with pytest.raises(CacheMgrError, match="/dev/toy0 is a toy cache: cachemgr cannot "
                                                "snapshot it"):
            toy.snapshot_cache(sysfs, max_latency_ms=None, timeout=1, stall_timeout=1)
    finally:
        kinds.unregister(Toy)
