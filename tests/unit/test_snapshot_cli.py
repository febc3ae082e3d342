"""cachemgr snapshot's refusals on lab captures, before anything changes (exit 2): bad
options, a kind the sequence is not built for, --lv that is not the device's origin; and
that nothing was written or journaled."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.core import state
from tests.unit.test_parity import cli
from tests.unit.tui_helpers import copy_capture, kernel_writes


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@pytest.mark.parametrize(("extra", "words"), [
    (["--max-freeze", "0"], "--max-freeze"),
    (["--max-freeze", "nan"], "--max-freeze"),
    (["--rest", "lots"], "--rest"),
    (["--max-latency", "0"], "--max-latency"),
    (["--lv", "not an lv"], "is not an LVM name"),
    (["--name=-x"], "is not a name lvm2 takes"),
    (["--name", "snapshot1"], "is not a name lvm2 takes"),
])
def test_bad_options_are_usage_errors(extra: list[str], words: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    argv = ["snapshot", "/dev/bcache0", "--lv", "vg0/vm1", "--mount", "/srv/vms"]
    # a later option of the same name wins (argparse)
    rc, out, err = cli(root, [*argv, *extra])
    assert rc == 2 and words in err, (out, err)
    assert not (state.state_dir(create=False) / "snapshot").exists()


def test_an_lv_that_is_not_the_backing_device_is_refused(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    rc, _, err = cli(root, ["snapshot", "/dev/bcache0", "--lv", "vg0/vm1", "--mount", "/srv"])
    assert rc == 2
    assert "vg0/vm1 is not the origin of /dev/bcache0 (its backing device is /dev/ubda)" in err
    assert "hint: --lv names the LV bcache caches" in err


def test_a_dm_cache_device_is_not_built_yet(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "dmcache-writeback")
    rc, _, err = cli(root, ["snapshot", "/dev/mapper/vmcache", "--lv", "vg0/vm1",
                            "--mount", "/srv"])
    assert rc == 2 and "built for bcache devices so far" in err, err
    assert "cachemgr drain /dev/mapper/vmcache" in err
