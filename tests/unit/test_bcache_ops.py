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
