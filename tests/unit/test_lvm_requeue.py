"""The LVM drain's tail (issue #34 item 6): when the cleaner holds dirty blocks back (touched in
the last writeback period), the drain loads the same cleaner table again so that they go at
once (dmcache.switch.requeue_cleaner, manage._requeue); it does nothing to a table that is not
the drain's, nor to a device another tool is changing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cachemgr.backends.dmcache import command, switch
from cachemgr.backends.lvm import manage
from cachemgr.core import runner
from cachemgr.core.errors import CommandError

CLEANER = "0 1048576 cache 253:4 253:3 253:5 128 2 metadata2 writethrough cleaner 0"
SMQ = "0 1048576 cache 253:4 253:3 253:5 128 2 metadata2 writeback smq 0"


def status(threshold: int = 2048) -> str:
    return ("0 1048576 cache 8 23/4096 128 420/4096 0 0 1521 527 0 420 57 1 writethrough "
            f"2 migration_threshold {threshold} cleaner 0 rw -")


class Dm:
    """dmsetup as the kernel would answer it, every call recorded."""

    def __init__(self, table: str = CLEANER, attr: str = "L--w", threshold: int = 2048,
                 fail: str | None = None) -> None:
        self.table, self.attr, self.threshold, self.fail = table, attr, threshold, fail
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, timeout: float = 60, check: bool = True) -> runner.Completed:
        self.calls.append(args)
        if args[0] == self.fail:
            raise CommandError(["dmsetup", *args], 1, "failed")
        out = {"info": self.attr, "table": self.table, "status": status(self.threshold)}
        return runner.Completed(("dmsetup", *args), 0, out.get(args[0], "") + "\n", "")

    def verbs(self) -> list[str]:
        return [c[0] for c in self.calls]


def test_the_cleaner_table_is_loaded_again_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = Dm()
    monkeypatch.setattr(command, "dmsetup", dm)
    assert switch.requeue_cleaner("vg0-vm1") is not None
    assert dm.verbs() == ["info", "suspend", "table", "status", "load", "resume"]
    assert dm.calls[4] == ("load", "--table", CLEANER, "--", "vg0-vm1")


def test_a_live_threshold_is_carried_over(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = Dm(threshold=16384)
    monkeypatch.setattr(command, "dmsetup", dm)
    switch.requeue_cleaner("vg0-vm1")
    assert dm.calls[4][2] == CLEANER.replace("cleaner 0", "cleaner 2 migration_threshold 16384")


@pytest.mark.parametrize("attr", ["LI-w", "L-sw", "--"])
def test_a_device_being_changed_is_left_alone(monkeypatch: pytest.MonkeyPatch,
                                              attr: str) -> None:
    dm = Dm(attr=attr)
    monkeypatch.setattr(command, "dmsetup", dm)
    assert switch.requeue_cleaner("vg0-vm1") is None
    assert dm.verbs() == ["info"]


def test_a_table_that_is_not_the_drains_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = Dm(table=SMQ)
    monkeypatch.setattr(command, "dmsetup", dm)
    assert switch.requeue_cleaner("vg0-vm1") is None
    assert dm.verbs() == ["info", "suspend", "table", "status", "resume"]


def test_a_failed_load_resumes_the_old_table(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = Dm(fail="load")
    monkeypatch.setattr(command, "dmsetup", dm)
    with pytest.raises(CommandError):
        switch.requeue_cleaner("vg0-vm1")
    assert dm.verbs() == ["info", "suspend", "table", "status", "load", "clear", "resume"]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_drain_loads_again_only_when_the_count_stands_still(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(manage.time, "monotonic", clock)
    loads: list[str] = []
    after: list[int] = []

    def requeue(name: str) -> float | None:
        loads.append(name)
        return 0.1

    monkeypatch.setattr(manage.dm_switch, "requeue_cleaner", requeue)
    monkeypatch.setattr(manage, "_dirty", lambda d: (after[0], after[0] * 65536))
    d: Any = SimpleNamespace(name="vg0-vm1", lvm=SimpleNamespace(full_name="vg0/vm1"))
    flat: list[Any] = [None, clock.t, 0]
    assert manage._requeue(d, flat, 57, None) == (57, None) and not loads  # first reading
    clock.t += manage.REQUEUE_AFTER_S / 2
    assert manage._requeue(d, flat, 57, None) == (57, None) and not loads  # not long enough
    clock.t += manage.REQUEUE_AFTER_S
    after[:] = [41]
    assert manage._requeue(d, flat, 57, None) == (41, 41 * 65536)  # loaded, read again
    assert loads == ["vg0-vm1"]
    assert manage._requeue(d, flat, 41, None) == (41, None)  # a fall: the clock starts again
    last = clock.t
    # loads that bring no fall: each doubles the wait before the next, up to the maximum
    after[:] = [41]
    waits: list[float] = []
    for _ in range(400):
        clock.t += 0.1
        n = len(loads)
        manage._requeue(d, flat, 41, None)
        if len(loads) > n:
            waits.append(round(clock.t - last, 1))
            last = clock.t
    first = manage.REQUEUE_AFTER_S
    want = [min(first * 2 ** k, manage.REQUEUE_MAX_WAIT_S) for k in range(5)]
    assert waits[:5] == pytest.approx(want, abs=0.11), waits
    assert waits[5:] == pytest.approx([manage.REQUEUE_MAX_WAIT_S] * len(waits[5:]),
                                      abs=0.11), waits
    n = len(loads)
    manage._requeue(d, flat, 40, None)  # a fall: back to the first wait
    clock.t += manage.REQUEUE_AFTER_S
    manage._requeue(d, flat, 40, None)
    assert len(loads) == n + 1


def test_a_table_not_the_drains_stops_the_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(manage.time, "monotonic", clock)
    loads: list[str] = []

    def requeue(name: str) -> float | None:
        loads.append(name)
        return None

    monkeypatch.setattr(manage.dm_switch, "requeue_cleaner", requeue)
    d: Any = SimpleNamespace(name="vg0-vm1", lvm=SimpleNamespace(full_name="vg0/vm1"))
    flat: list[Any] = [None, clock.t, 0]
    manage._requeue(d, flat, 57, None)
    for _ in range(5):
        clock.t += manage.REQUEUE_AFTER_S
        assert manage._requeue(d, flat, 57, None) == (57, None)
    assert loads == ["vg0-vm1"]


@pytest.mark.parametrize(("mode", "blocks", "raises"), [
    ("writethrough", 57, True), ("passthrough", 3, True), ("writethrough", 0, False),
    ("writeback", 57, False)])
def test_dirty_after_lvm2_put_the_policy_back_is_never_called_clean(
        monkeypatch: pytest.MonkeyPatch, mode: str, blocks: int, raises: bool) -> None:
    """lvm2's reload keeps dm-cache's metadata object: opened after an unclean shutdown, it
    marks every cached block dirty again. The status read after the drain's last lvchange
    then fails the drain in writethrough or passthrough (exit 1) rather than say clean; in
    writeback dirty blocks may be the VMs' writes."""
    from dataclasses import replace

    from tests.unit.test_dmcache_ops import FakeDm, device

    d = replace(device(FakeDm()), lvm=SimpleNamespace(full_name="vg0/vm1"))
    monkeypatch.setattr(manage, "_dirty", lambda d: (blocks, blocks * 65536))
    if not raises:
        manage._clean_after(d, mode, None, False)
        return
    with pytest.raises(manage.CacheMgrError, match=f"vg0/vm1: every dirty block was written "
                                                   f"back, but {blocks} blocks") as e:
        manage._clean_after(d, mode, None, False)
    assert e.value.exit_code == 1 and "not clean" in e.value.message
