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
from cachemgr.core.errors import CacheMgrError, CommandError, UnsafeError
from cachemgr.core.model import CacheMode, DmCacheDevice
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.kinds import Drained

ORIGINAL = "0 1048576 cache 98:32 98:16 253:0 128 1 writeback smq 0"


USED = 771  # cached blocks in the fake's status


class FakeDm:
    """Also dm-cache's metadata object (drivers/md/dm-cache-metadata.c): one per metadata
    block device while a table uses it, ``clean_when_opened`` read from the superblock's
    clean-shutdown flag when it is opened (a suspend commits the flag set); a table loaded
    on an object opened unclean marks every cached block dirty (``unclean``: the live one
    was). Other dm devices (``create``) are linear stand-ins, numbered 253:10 on."""

    def __init__(self, dirty: int = 10, unclean: bool = False) -> None:
        self.live = ORIGINAL
        self.inactive: str | None = None
        self.suspended = False
        self.dirty = dirty
        self.threshold = 2048
        self.log: list[tuple[str, ...]] = []
        self.dirty_on_resume: int | None = None  # writes that race a switch
        self.clean_when_opened = not unclean  # the live table's metadata object
        self.others: dict[str, tuple[str, str]] = {}  # name: (devno, table)

    def __call__(self, *args: str, timeout: float = 60, check: bool = True):  # type: ignore[no-untyped-def]
        self.log.append(args)
        op = args[0]

        def fail(msg: str) -> object:
            if check:
                raise CommandError(["dmsetup", *args], 1, msg)
            return _Done("", 1)

        if op in ("create", "remove") or (op == "info" and args[-1] in self.others) \
                or (op == "info" and args[-1].startswith("cachemgr-md-")):
            return self.other(args, fail)
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
                old_md = self.live.split()[3]
                self.live, self.inactive = self.inactive, None
                if self.live.split()[2] == "cache":
                    if self.live.split()[3] != old_md:  # opened afresh: the flag a suspend set
                        self.clean_when_opened = True
                    if not self.clean_when_opened:
                        self.dirty = USED
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

    def other(self, args: tuple[str, ...], fail):  # type: ignore[no-untyped-def]
        op, name = args[0], args[1] if args[0] == "create" else args[-1]
        if op == "create":
            if name in self.others:
                return fail(f"device-mapper: create ioctl on {name} failed: Device or "
                            "resource busy")
            self.others[name] = (f"253:{10 + len(self.log)}", args[-1])
        elif name not in self.others:
            return fail(f"Device {name} not found")
        elif op == "remove":
            if self.live.split()[3] == self.others[name][0]:
                return fail(f"device-mapper: remove ioctl on {name} failed: Device or "
                            "resource busy")
            del self.others[name]
        elif "major,minor" in args:
            return _Done(self.others[name][0])
        return _Done("")

    def status(self) -> str:
        t = dmcache.parse_table(self.live)
        return (f"0 {t.length} cache 8 16/4096 128 771/2048 10 5 20 3 0 0 {self.dirty} "
                f"1 {t.mode.value} 2 migration_threshold {self.threshold} {t.policy} 0 rw -")


class _Done:
    def __init__(self, out: str, returncode: int = 0) -> None:
        self.stdout = out + "\n"
        self.stderr = ""
        self.returncode = returncode


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeDm]:
    f = FakeDm()
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(command, "dmsetup", f)  # every dmsetup call goes through it
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(discover, "find", lambda sysfs, name: device(f))
    # the metadata device's size (sysfs dev/block/98:32/size), for the reopen's stand-in
    monkeypatch.setattr(switch, "device_sectors",
                        lambda sysfs, devno: 32768 if devno == "98:32" else None)
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
    loads = [a[-1].split() for a in fake.log if a[0] == "load"]
    # the final table on the metadata's stand-in, then on the metadata device (a reopen)
    assert [t[8] for t in loads] == ["writethrough", "passthrough", "passthrough"]
    assert [t[3] for t in loads] == ["98:32", loads[1][3], "98:32"] and loads[1][3] != "98:32"
    assert " passthrough smq 0" in fake.live and not fake.others


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
    assert loads == ["writethrough", "passthrough", "passthrough"]
    assert " passthrough smq 0" in fake.live

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


def _cleaning(fake: FakeDm, monkeypatch: pytest.MonkeyPatch) -> None:
    real = command.read_status

    def read_status(name: str):  # type: ignore[no-untyped-def]
        if "cleaner" in fake.live and not fake.suspended:
            fake.dirty = 0
        return real(name)

    monkeypatch.setattr(command, "read_status", read_status)


@pytest.mark.parametrize("final_mode", [None, CacheMode.WRITETHROUGH, CacheMode.PASSTHROUGH])
def test_a_flush_of_metadata_opened_unclean_ends_clean(
        fake: FakeDm, monkeypatch: pytest.MonkeyPatch, final_mode: CacheMode | None) -> None:
    """Metadata opened after an unclean shutdown: every plain reload marks each cached block
    dirty again (lab, 7.2.7); the flush's last switch opens it afresh through a stand-in, so
    the table put back reads 0 dirty blocks, and the stand-in is gone."""
    fake.clean_when_opened = False
    _cleaning(fake, monkeypatch)
    res = dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05,
                        final_mode=final_mode)
    assert (fake.dirty, res.dirty_after, fake.others) == (0, 0, {})
    assert fake.live.split()[3] == "98:32" and not fake.suspended
    # and it stays clean across a further reload of the same table
    switch.switch_table("vc", fake.live, fake.live)
    assert fake.dirty == 0


def test_a_plain_closing_reload_is_never_called_clean(
        fake: FakeDm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the reopen (the closing switch a plain reload), the status read after it says
    dirty: in writethrough the flush fails (exit 1) naming the count; in writeback its
    result carries the count, and the drain does not say clean."""
    fake.clean_when_opened = False
    _cleaning(fake, monkeypatch)
    monkeypatch.setattr(
        flushing, "reopen_switch",
        lambda sysfs, name, old, new, require_clean=False:
            switch.switch_table(name, old, new.line(), require_clean=require_clean))
    with pytest.raises(CacheMgrError, match=f"{USED} blocks .* read dirty after the table was "
                                            "put back .writethrough.; it is not clean") as e:
        dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05,
                      final_mode=CacheMode.WRITETHROUGH)
    assert e.value.exit_code == 1 and "cachemgr drain vc" in str(e.value)
    fake.live, fake.dirty = ORIGINAL, 10
    res = dmcache.flush(SYSFS, device(fake), interval=0.01, confirm=0.05)
    assert res.dirty_after == USED
    summary = Drained(res.device, res.start_bytes, res.elapsed_s, res.restored,
                      dirty_after=res.dirty_after).summary()
    assert "clean" not in summary.split(";")[0] and f"{USED} blocks dirty again" in summary


def test_a_killed_reopen_is_put_back_and_its_stand_in_removed(fake: FakeDm) -> None:
    """Killed between the reopen's two switches: the device runs its table over the
    stand-in; the next run loads the journal's table on the metadata device and removes
    the stand-in."""
    d = device(fake)
    flush_line = ORIGINAL.replace("writeback smq", "writethrough cleaner")
    state.write_json(flushing.journal(d), {"original": ORIGINAL, "flush": flush_line})
    fake("create", switch.reopen_name("vc"), "--table", "0 32768 linear 98:32 0")
    stand_in = fake.others[switch.reopen_name("vc")][0]
    fake.live = ORIGINAL.replace("98:32", stand_in)
    assert dmcache.restore_saved(SYSFS, replace(d, table=dmcache.parse_table(fake.live))) == \
        {"table": ORIGINAL}
    assert fake.live == ORIGINAL and not fake.others and not flushing.journal(d).exists()
