from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachemgr.core.errors import SysfsError
from cachemgr.core.sysfs import Sysfs


def test_read_strips_newline_and_read_opt_missing(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("clean\n")
    s = Sysfs(tmp_path)
    assert s.read("a") == "clean"
    assert s.read_opt("nope") is None
    with pytest.raises(SysfsError) as exc:
        s.read("nope")
    assert "nope" in str(exc.value)


def test_priority_stats_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "priority_stats").write_text("x")
    with pytest.raises(SysfsError):
        Sysfs(tmp_path).read("priority_stats")


def test_write_and_write_error(tmp_path: Path) -> None:
    (tmp_path / "cache_mode").write_text("")
    s = Sysfs(tmp_path)
    s.write("cache_mode", "writeback")
    assert (tmp_path / "cache_mode").read_text() == "writeback"
    with pytest.raises(SysfsError) as exc:
        s.write("missing/dir/file", "1")
    assert exc.value.errno is not None


def test_readlink_and_resolve(tmp_path: Path) -> None:
    (tmp_path / "devices" / "x").mkdir(parents=True)
    (tmp_path / "block").mkdir()
    os.symlink("../devices/x", tmp_path / "block" / "x")
    s = Sysfs(tmp_path)
    assert s.readlink("block/x") == "../devices/x"
    assert s.resolve("block/x") == "devices/x"
    assert list(s.block_names()) == ["x"]


def test_no_module_names_sys_itself() -> None:
    """Principle: every kernel path goes through Sysfs; no "/sys/..." strings elsewhere."""
    root = Path(__file__).resolve().parents[2] / "cachemgr"
    offenders = []
    for f in root.rglob("*.py"):
        # sysfs_lite.py: the same layer's standard-library reader for the libvirt hook's
        # fast path (sysfs.py's own imports cost the hook more than its answer)
        if f.name in ("sysfs.py", "sysfs_lite.py"):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if '"/sys/' in code or "'/sys/" in code or '"/sys"' in code:
                offenders.append(f"{f.name}:{n}: {line.strip()}")
    assert offenders == []


def test_live_is_the_one_check(tmp_path: Path) -> None:
    """Sysfs.live: the running kernel's /sys however it is spelled; never a capture."""
    (tmp_path / "link").symlink_to("/sys")
    assert Sysfs().live and Sysfs("/sys/").live and Sysfs(tmp_path / "link").live
    assert not Sysfs(tmp_path).live and not Sysfs(tmp_path / "missing").live


@pytest.mark.parametrize("size", [0, 1, 4095, 65535, 65536, 65537, 200_000])
def test_sysfs_reads_whole_files_of_any_size(tmp_path: Path, size: int) -> None:
    """Sysfs.read takes one read(2) where the kernel hands everything at once; a file that
    fills the chunk is read on to its end (a capture's file, a large cgroup file)."""
    data = bytes(48 + i % 10 for i in range(size)) + b"\n"
    (tmp_path / "attr").write_bytes(data)
    assert Sysfs(tmp_path).read("attr") == data.decode().rstrip("\n")
    assert Sysfs(tmp_path).read_opt("missing") is None
    (tmp_path / "dir").mkdir()
    with pytest.raises(SysfsError):
        Sysfs(tmp_path).read("dir")
