"""The CLI's one handler for what is not a CacheMgrError: an OSError is one line (what, the
kernel's words) + a hint and exit 1, or 2 when the command line can fix it; SIGTERM/SIGHUP
are 128 + the signal with one line; stdout closed early is a quiet 141. No traceback, and
the atomic writers (journals, the metrics textfile) leave no temporary file behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachemgr.cli import cache as cli_cache
from cachemgr.cli.main import main
from cachemgr.core import signals, state

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
DIRTY = str(next(FIXTURES.glob("bcache-writeback-dirty-*")) / "sys")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["--sysfs-root", DIRTY, *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def raising(exc: BaseException) -> Any:
    def cmd(args: Any) -> int:
        raise exc
    return cmd


@pytest.mark.parametrize(("exc", "euid", "code", "words"), [
    # the state directory, not root: the contract's "not root" is exit 2
    (PermissionError(errno.EACCES, "Permission denied", "/var/lib/cachemgr/drain"), 1000, 2,
     "run it as root"),
    # the same as root (an immutable or read-only mount, an LSM): the host's to fix
    (PermissionError(errno.EACCES, "Permission denied", "/var/lib/cachemgr/drain"), 0, 1,
     "check the permissions of /var/lib/cachemgr/drain"),
    (OSError(errno.ENOSPC, "No space left on device", "/var/lib/cachemgr/drain/x.json"), 0, 1,
     "free space"),
    (OSError(errno.EROFS, "Read-only file system", "/var/lib/cachemgr"), 0, 1,
     "read-only filesystem"),
    (OSError(errno.EIO, "Input/output error"), 0, 1, None),
], ids=["eacces-user", "eacces-root", "enospc", "erofs", "eio-no-path"])
def test_os_error_is_one_line_and_an_exit_code(
        exc: OSError, euid: int, code: int, words: str | None,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_cache, "cmd_status", raising(exc))
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    rc, out, err = run(capsys, "status")
    assert rc == code, err
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    where = exc.filename or "error"
    assert lines[0] == f"cachemgr: {where}: {exc.strerror}"
    if words is None:
        assert len(lines) == 1
    else:
        assert len(lines) == 2 and lines[1].startswith("  hint: ") and words in lines[1]


def test_a_signal_is_one_line_and_128_plus_its_number(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        monkeypatch.setattr(cli_cache, "cmd_status", raising(signals.Terminated(sig)))
        rc, _, err = run(capsys, "status")
        assert rc == 128 + sig
        assert err == f"cachemgr: terminated by {signal.Signals(sig).name}\n"
    monkeypatch.setattr(cli_cache, "cmd_status", raising(KeyboardInterrupt()))
    assert run(capsys, "status")[:3:2] == (130, "cachemgr: interrupted\n")  # as before


def test_textfile_in_a_missing_directory_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "no-such-dir" / "cachemgr.prom"
    rc, _, err = run(capsys, "metrics", "--textfile", str(target))
    assert rc == 2, err
    assert err.splitlines()[0] == f"cachemgr: {target}: No such file or directory"
    assert "Traceback" not in err and len(err.splitlines()) == 2


def test_textfile_write_failure_leaves_no_temporary_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "cachemgr.prom"
    target.write_text("old\n")

    def full(*a: Any, **kw: Any) -> None:  # rename(2) can need a new directory block: ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    rc, _, err = run(capsys, "metrics", "--textfile", str(target))
    assert rc == 1, err  # the path was fine: the filesystem is full
    assert err.splitlines() == [f"cachemgr: {target}: No space left on device",
                                f"  hint: free space on the filesystem holding {target}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cachemgr.prom"]
    assert target.read_text() == "old\n"  # untouched


def test_textfile_is_written_world_readable(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "cachemgr.prom"
    assert run(capsys, "metrics", "--textfile", str(target))[0] == 0
    assert "bcache" in target.read_text() and target.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cachemgr.prom"]


@pytest.mark.parametrize("fail", ["fsync", "replace", "interrupt"])
def test_write_json_failure_leaves_no_temporary_file(
        fail: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at fsync, a failed rename, Ctrl-C (or SIGTERM) in the middle: the old
    journal stays whole, no temporary file is left, the error names the journal."""
    path = tmp_path / "drain" / "x.json"
    state.write_json(path, {"n": 1})
    exc: BaseException = KeyboardInterrupt() if fail == "interrupt" else \
        OSError(errno.ENOSPC, "No space left on device")

    def boom(*a: Any, **kw: Any) -> None:
        raise exc

    monkeypatch.setattr(os, "replace" if fail == "replace" else "fsync", boom)
    with pytest.raises(type(exc)) as ei:
        state.write_json(path, {"n": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.json"]
    assert state.read_json(path) == {"n": 1}
    if isinstance(ei.value, OSError):
        assert ei.value.filename == str(path) and ei.value.errno == errno.ENOSPC


def test_status_json_into_a_closed_pipe_is_quiet() -> None:
    """``status --json | head -c0``, deterministic: the reader is gone before anything is
    written. A C tool dies of SIGPIPE (141); cachemgr exits 141 without a traceback (and
    without Python's second complaint when it flushes stdout at exit)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "cachemgr", "--sysfs-root", DIRTY, "status",
                            "--json"], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120,
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(w)
    assert p.returncode == 141, p.stderr
    assert p.stderr == ""

