"""dm-cache operations against a fake device-mapper that behaves as the lab kernel did.

The fake reproduces what the lab showed (package docstring of cachemgr/backends/dmcache/): a table
loaded into the inactive slot, ``resume`` swapping it in, and ``resume`` of a passthrough
table over dirty blocks failing with EBUSY while leaving the device suspended with the new
table live. The failure paths these tests drive (a refused resume, a failed load, Ctrl-C in
the middle of a flush) are hard to hit on purpose in the lab; the happy paths run there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from cachemgr.backends import dmcache
from cachemgr.backends.dmcache import command, discover, flushing, switch
from cachemgr.core import state
from cachemgr.core.errors import CommandError, UnsafeError
from cachemgr.core.model import CacheMode, DmCacheDevice
from cachemgr.core.sysfs import Sysfs

ORIGINAL = "0 1048576 cache 98:32 98:16 253:0 128 1 writeback smq 0"


class FakeDm:
    def __init__(self, dirty: int = 10) -> None:
        self.live = ORIGINAL
        self.inactive: str | None = None
        self.suspended = False
        self.dirty = dirty
        self.threshold = 2048
        self.log: list[tuple[str, ...]] = []
        self.dirty_on_resume: int | None = None  # writes that race a switch

    def __call__(self, *args: str, timeout: float = 60, check: bool = True):  # type: ignore[no-untyped-def]
        self.log.append(args)
        op = args[0]

        def fail(msg: str) -> object:
            if check:
                raise CommandError(["dmsetup", *args], 1, msg)
            return None

        if op == "suspend":
            self.suspended = True
        elif op == "load":
            t = args[-1]
            if "bogus" in t:
                return fail("device-mapper: reload ioctl on vc failed: Invalid argument")
            self.inactive = t
        elif op == "clear":
            self.inactive = None
        elif op == "resume":
            if self.inactive is not None:
                self.live, self.inactive = self.inactive, None
                if self.dirty_on_resume is not None:
                    self.dirty, self.dirty_on_resume = self.dirty_on_resume, None
                if " passthrough " in self.live and self.dirty:
                    return fail("device-mapper: resume ioctl on vc failed: Device or "
                                "resource busy")
            self.suspended = False
        elif op == "message":
            self.threshold = int(args[-1])
        elif op in ("status", "table"):
            return _Done(self.status() if op == "status" else self.live)
        return _Done("")

    def status(self) -> str:
        t = dmcache.parse_table(self.live)
        return (f"0 {t.length} cache 8 16/4096 128 771/2048 10 5 20 3 0 0 {self.dirty} "
                f"1 {t.mode.value} 2 migration_threshold {self.threshold} {t.policy} 0 rw -")


class _Done:
    def __init__(self, out: str) -> None:
        self.stdout = out + "\n"
        self.returncode = 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeDm]:
    f = FakeDm()
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(command, "dmsetup", f)  # every dmsetup call goes through it
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(discover, "find", lambda sysfs, name: device(f))
    yield f


def device(f: FakeDm) -> DmCacheDevice:
    st = dmcache.parse_status(f.status())
    assert not isinstance(st, str)
    return DmCacheDevice(name="vc", kernel_name="dm-1", devno="253:1", uuid=None,
                         table=dmcache.parse_table(f.live), status=st, failure=None,
                         metadata=None, cache=None, origin=None, open_count=0,
                         suspended=f.suspended)


SYSFS = Sysfs("/nonexistent")


def test_refused_resume_puts_the_old_table_back(fake: FakeDm) -> None:
    new = ORIGINAL.replace("writeback", "passthrough")
    with pytest.raises(CommandError):
        switch.switch_table("vc", ORIGINAL, new)
    # the kernel left it suspended with the new table live; cachemgr undid that
    assert fake.live == ORIGINAL and not fake.suspended and fake.inactive is None
    assert [a[0] for a in fake.log] == ["suspend", "load", "resume", "clear", "load", "resume"]


def test_failed_load_resumes_the_old_table(fake: FakeDm) -> None:
    with pytest.raises(CommandError):
        switch.switch_table("vc", ORIGINAL, ORIGINAL.replace("smq", "bogus"))
    assert fake.live == ORIGINAL and not fake.suspended


def test_require_clean_checks_while_suspended(fake: FakeDm) -> None:
    with pytest.raises(UnsafeError, match="10 dirty blocks appeared"):
        switch.switch_table("vc", ORIGINAL, "0 1048576 linear 253:0 0", require_clean=True)
    assert fake.live == ORIGINAL and not fake.suspended
    assert ("load", "vc", "--table", "0 1048576 linear 253:0 0") not in fake.log


def test_passthrough_race_goes_back_to_writeback(fake: FakeDm) -> None:
    fake.dirty = 0
    fake.dirty_on_resume = 0
    # a write dirties blocks right as the writethrough table goes live... it cannot in
    # writethrough, but if the kernel ever says so the refusal must leave writeback running
    orig_status = fake.status
    calls = {"n": 0}

    def status() -> str:
        calls["n"] += 1
        if " writethrough " in fake.live and fake.suspended:
            fake.dirty = 3
        return orig_status()

    fake.status = status  # type: ignore[method-assign]
    with pytest.raises(UnsafeError) as exc:
        dmcache.set_mode(SYSFS, device(fake), CacheMode.PASSTHROUGH)
    assert exc.value.exit_code == 3 and "passthrough --drain" in str(exc.value)
    assert fake.live == ORIGINAL and not fake.suspended


def test_set_mode_carries_the_live_threshold(fake: FakeDm) -> None:
    fake.threshold = 8192
    ch = dmcache.set_mode(SYSFS, device(fake), CacheMode.WRITETHROUGH)
    assert (ch.before, ch.after) == ("writeback", "writethrough")
    assert fake.live == ("0 1048576 cache 98:32 98:16 253:0 128 1 writethrough smq 2 "
                         "migration_threshold 8192")


def test_flush_interrupted_restores(fake: FakeDm, monkeypatch: pytest.MonkeyPatch) -> None:
    real = command.read_status
    polls = {"n": 0}

    def read_status(name: str):  # type: ignore[no-untyped-def]
        polls["n"] += 1
        if polls["n"] == 3:
            raise KeyboardInterrupt
        return real(name)

    monkeypatch.setattr(command, "read_status", read_status)
    with pytest.raises(KeyboardInterrupt):
        dmcache.flush(SYSFS, device(fake), interval=0.01)
    assert fake.live == ORIGINAL and not fake.suspended
    flush_tables = [a[-1] for a in fake.log if a[0] == "load"]
    assert flush_tables[0].endswith("1 writethrough cleaner 0")
    assert flushing.journal(device(fake)).exists() is False


def test_flush_runs_writethrough_cleaner_then_restores(fake: FakeDm,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real = command.read_status

    def read_status(name: str):  # type: ignore[no-untyped-def]
        if "cleaner" in fake.live:
            fake.dirty = max(0, fake.dirty - 4)  # the cleaner at work
        return real(name)

    monkeypatch.setattr(command, "read_status", read_status)
    seen: list[int | None] = []
    res = dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05,
                        progress=lambda p: seen.append(p.dirty_blocks))
    assert fake.live == ORIGINAL and fake.dirty == 0 and not fake.suspended
    assert res.start_bytes == 6 * 128 * 512  # the first poll, after the cleaner's first go
    assert seen[:3] == [6, 2, 0] and set(seen[3:]) == {0}
    assert res.restored == {"mode": "writeback", "policy": "smq"}


def test_flush_with_final_mode_never_passes_through_writeback(
        fake: FakeDm, monkeypatch: pytest.MonkeyPatch) -> None:
    real = command.read_status

    def read_status(name: str):  # type: ignore[no-untyped-def]
        if "cleaner" in fake.live:
            fake.dirty = 0
        return real(name)

    monkeypatch.setattr(command, "read_status", read_status)
    dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05,
                  final_mode=CacheMode.PASSTHROUGH)
    loads = [a[-1].split()[8] for a in fake.log if a[0] == "load"]
    assert loads == ["writethrough", "passthrough"]
    assert " passthrough smq 0" in fake.live


def test_a_block_dirty_again_under_the_suspended_device_is_cleaned_and_switched(
        fake: FakeDm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clean twice, then one dirty block while suspended for the switch to passthrough (lab,
    replace-ssd under a writing VM): the cleaner runs again and the switch is made; a block
    that keeps coming back is refused after SWITCH_TRIES, with the original table back."""
    real = command.read_status
    again = [1]

    def read_status(name: str):  # type: ignore[no-untyped-def]
        if "cleaner" in fake.live:
            if fake.suspended and again[0]:
                again[0] -= 1
                fake.dirty = 1  # a write that raced the last poll
            elif not fake.suspended:
                fake.dirty = 0
        return real(name)

    monkeypatch.setattr(command, "read_status", read_status)
    dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05,
                  final_mode=CacheMode.PASSTHROUGH)
    loads = [a[-1].split()[8] for a in fake.log if a[0] == "load"]
    assert loads == ["writethrough", "passthrough"] and " passthrough smq 0" in fake.live

    fake.live, fake.dirty, fake.log[:] = ORIGINAL, 10, []
    again[0] = dmcache.flushing.SWITCH_TRIES  # every try: refused, the table put back
    with pytest.raises(UnsafeError, match="dirty blocks appeared again"):
        dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05,
                      final_mode=CacheMode.PASSTHROUGH)
    assert fake.live == ORIGINAL and not fake.suspended


def test_a_killed_flush_is_restored_by_the_next_run(fake: FakeDm) -> None:
    d = device(fake)
    flush_line = ORIGINAL.replace("writeback smq", "writethrough cleaner")
    state.write_json(flushing.journal(d), {"original": ORIGINAL, "flush": flush_line})
    fake.live = flush_line
    assert dmcache.restore_saved(SYSFS, replace(d, table=dmcache.parse_table(flush_line))) == \
        {"table": ORIGINAL}
    assert fake.live == ORIGINAL and not flushing.journal(d).exists()
