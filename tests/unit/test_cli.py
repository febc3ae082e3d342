from __future__ import annotations

import json

import pytest

from cachemgr.cli.main import main
from tests.unit.captures import fx


def test_status_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sysfs-root", str(fx("bcache-writeback-dirty")), "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == 1
    (d,) = data["devices"]
    for key in ("kind", "device", "mode", "state", "dirty_bytes", "cache"):
        assert key in d
    assert isinstance(d["dirty_bytes"], int) and d["state"] == "dirty"


def test_status_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sysfs-root", str(fx("bcache-unattached")), "status"]) == 0
    out = capsys.readouterr().out
    assert "no cache" in out and "0 backing" in out


def test_mode_bad_target_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--sysfs-root", str(fx("bcache-writeback-dirty")), "mode", "/dev/sdz9", "none"])
    assert rc == 2
    assert "no such device" in capsys.readouterr().err
    rc = main(["--sysfs-root", str(fx("bcache-writeback-dirty")), "mode", "/dev/null", "none"])
    assert rc == 2
    assert "not a bcache" in capsys.readouterr().err


def test_mode_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--sysfs-root", str(fx("bcache-writeback-dirty")), "mode", "/dev/bcache0", "fast"])
    assert rc == 2


def test_mode_already_so(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--sysfs-root", str(fx("bcache-writeback-dirty")), "mode", "/dev/bcache0",
               "writeback"])
    assert rc == 4
    assert "already" in capsys.readouterr().err


def test_lab_run_without_command_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "run"]) == 2
