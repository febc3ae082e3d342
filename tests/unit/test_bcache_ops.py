"""bcache helpers that need no capture: whether a block device is claimed exclusively."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends import bcache


def test_claimed_reads_an_exclusive_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from cachemgr.core.sysfs import Sysfs

    assert bcache.claimed(str(tmp_path / "gone")) is False  # no node: nobody holds it
    f = tmp_path / "plain"
    f.write_bytes(b"")
    assert bcache.claimed(str(f)) is False

    def busy(path: str, flags: int, *a: object) -> int:
        assert flags & os.O_EXCL
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(os, "open", busy)
    assert bcache.claimed("/dev/sdz") is True

    def denied(path: str, flags: int, *a: object) -> int:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PermissionError):
        bcache.claimed("/dev/sdz")
    assert Sysfs().live and not Sysfs(tmp_path).live


class _BusyOnce:
    """A Sysfs stand-in whose register write fails with EBUSY ``fails`` times."""

    def __init__(self, fails: int, registered: bool = False) -> None:
        self.fails, self.registered, self.writes = fails, registered, 0

    def exists(self, rel: str) -> bool:
        return rel == "fs/bcache/register"

    def write(self, rel: str, value: str) -> None:
        import errno

        from cachemgr.core.errors import SysfsError

        self.writes += 1
        if self.writes <= self.fails:
            raise SysfsError(rel, "write", errno.EBUSY, "Device or resource busy")

    def block_name_of(self, node: str) -> str:
        return "sdz"

    def is_dir(self, rel: str) -> bool:
        return self.registered and rel == "block/sdz/bcache"


@pytest.mark.parametrize("held", [0, 3])
def test_register_waits_for_a_stopped_device_to_be_released(
        monkeypatch: pytest.MonkeyPatch, held: int) -> None:
    """EBUSY from a device bcache does not hold (its exclusive open not yet released after a
    stop) is waited for and tried again; the change is the registration."""
    fake = _BusyOnce(fails=1)
    monkeypatch.setattr(bcache, "block_dirs", lambda sysfs: {"sdz": "block/sdz"})
    polls = iter([True] * held + [False] * 10)
    monkeypatch.setattr(bcache, "claimed", lambda node: next(polls))
    change = bcache.register(fake, "/dev/sdz", release_wait=5)  # type: ignore[arg-type]
    assert fake.writes == 2 and change.after == "registered"


def test_register_says_already_only_when_bcache_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.core.errors import AlreadyError, CacheMgrError

    monkeypatch.setattr(bcache, "block_dirs", lambda sysfs: {"sdz": "block/sdz"})
    monkeypatch.setattr(bcache, "claimed", lambda node: False)
    fake = _BusyOnce(fails=9, registered=True)
    with pytest.raises(AlreadyError):
        bcache.register(fake, "/dev/sdz")  # type: ignore[arg-type]
    assert fake.writes == 1
    # held by someone else for longer than the wait: the kernel's "device busy", not exit 4
    monkeypatch.setattr(bcache, "claimed", lambda node: True)
    fake = _BusyOnce(fails=9)
    with pytest.raises(CacheMgrError) as got:
        bcache.register(fake, "/dev/sdz", release_wait=0.05)  # type: ignore[arg-type]
    assert not isinstance(got.value, AlreadyError)
    assert "device busy" in str(got.value) and fake.writes == 1
