"""scripts/rehearse.sh, the load rehearsal (issue #43 item 2): its argument handling, its
table (each test's runs and failures, each failure's first error line), that a run which
skipped counts as a failure, and that the pressure stops when the script is stopped. The
rehearsed tests here are small pytest files of the test's own, run without pressure (a few
seconds a run); the kernel rehearsals themselves are in docs/benchmarks.md."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "rehearse.sh"

TESTS = '''
import os, time
def test_ok():
    pass
def test_bad():
    assert 1 + 1 == 3, "two | is not three"
def test_skips():
    import pytest
    pytest.skip("nothing to rehearse here")
def test_sleeps():
    if os.environ.get("REHEARSE_STARTED"):
        open(os.environ["REHEARSE_STARTED"], "w").close()
    time.sleep(float(os.environ.get("REHEARSE_SLEEP", "0")))
'''


# the rehearsed files need no plugin: a run starts in a third of the time without them
ENV = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def rehearse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=ENV)


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by test: runs, failed, wall a run, wall in all, load, errors."""
    found = {}
    for line in out.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            found[cells[0].strip("`")] = cells[1:]
    return found


@pytest.mark.parametrize("args, said", [
    (["--runs", "x", "t.py"], "--runs takes a number, not 'x'"),
    (["--runs", "0", "t.py"], "--runs is at least 1"),
    (["--cpu-load", "150", "t.py"], "--cpu-load is a percentage"),
    (["--backend", "kvm", "t.py"], "--backend is uml or qemu, not 'kvm'"),
    (["--keep"], "TEST..."),
    (["--nope", "t.py"], "unknown option '--nope'"),
    ([], "no tests given"),
])
def test_bad_usage_exits_2_and_says_why(args: list[str], said: str) -> None:
    r = rehearse(*args)
    assert r.returncode == 2 and said in r.stderr, r
    assert r.stdout == ""


def test_each_test_on_its_own_in_rounds_with_a_table(tmp_path: Path) -> None:
    f = tmp_path / "test_rehearsed.py"
    f.write_text(TESTS)
    ok, bad, skips = (f"{f}::test_{n}" for n in ("ok", "bad", "skips"))
    r = rehearse("--runs", "2", "--until-fail", "--cpu", "0", "--io", "0",
                 "--keep", str(tmp_path / "logs"), ok, bad, skips)
    assert r.returncode == 1, r
    # rounds: each test once, then again those that have not failed
    order = [m[1] for m in re.finditer(r"^(\S+) run \d+: ", r.stdout, re.M)]
    assert order == [ok, bad, skips, ok], r.stdout
    table = rows(r.stdout)
    assert table[ok][:2] == ["2", "0"] and table[ok][-1] == ""
    assert table[bad][:2] == ["1", "1"]
    assert table[bad][-1] == r"run 1: AssertionError: two \| is not three", table[bad]
    # a run that ran nothing proves nothing
    assert table[skips][:2] == ["1", "1"] and "nothing to rehearse here" in table[skips][-1]
    assert "no added pressure" in r.stdout
    logs = sorted(p.name for p in (tmp_path / "logs").glob("*.log"))
    assert logs == ["test-1-run-1.log", "test-1-run-2.log", "test-2-run-1.log",
                    "test-3-run-1.log"]


def test_all_passed_exits_0_and_pytest_args_go_to_each_run(tmp_path: Path) -> None:
    f = tmp_path / "test_rehearsed.py"
    f.write_text(TESTS)
    r = rehearse("--runs", "1", "--cpu", "0", "--io", "0", str(f), "--", "-k", "ok")
    assert r.returncode == 0, r
    assert rows(r.stdout)[f"{f} -k ok"][:2] == ["1", "0"], r.stdout


@pytest.mark.skipif(shutil.which("stress-ng") is None,
                    reason="stress-ng not installed (scripts/setup.sh)")
def test_terminated_it_stops_the_run_and_the_pressure_and_prints_the_table(
        tmp_path: Path) -> None:
    f = tmp_path / "test_rehearsed.py"
    f.write_text(TESTS)
    logs = tmp_path / "logs"
    run = logs / "test-1-run-1.log"
    started = tmp_path / "started"
    p = subprocess.Popen([str(SCRIPT), "--cpu", "1", "--cpu-load", "5", "--io", "0",
                          "--keep", str(logs), f"{f}::test_sleeps"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**ENV, "REHEARSE_SLEEP": "600", "REHEARSE_STARTED": str(started)})
    try:
        deadline = time.monotonic() + 120
        # once the run is in its test: its python ignores SIGINT (a background job's) until
        # it sets the handler, and the script waits for that before it interrupts it. Not as
        # soon as its log exists: twice on 2026-11-28 (a full run at load ~10, a unit run at
        # ~2) the interrupt came while pytest was still starting and the log stayed empty
        # (why nothing was written then is not found), which is not what this test is about
        while not started.exists():
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
        stress = int((logs / "stress-ng.pid").read_text())
        assert Path(f"/proc/{stress}").exists()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, (out, err)
    assert time.monotonic() - t0 < 30  # the run was interrupted, not waited for
    assert "KeyboardInterrupt" in run.read_text()
    assert rows(out)[f"{f}::test_sleeps"][:2] == ["0", "0"], out
    assert not Path(f"/proc/{stress}").exists()
