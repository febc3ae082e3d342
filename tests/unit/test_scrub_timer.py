"""The weekly scrub (issue #42 item 4's timer): the policy's ``[scrub]`` table, ``cachemgr
scrub --all`` over the host's write-through and clean caches (or those the table names) and
its exit codes, and cachemgr-scrub.timer/.service as shipped and installed. Each device's
scrub is the ``scrub`` command's own (tests/unit/test_scrub.py, the kernel test); here it is
stood in for, so that nothing is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachemgr.core.errors import CacheMgrError, UnsafeError
from cachemgr.ops import scrub as scrub_ops
from cachemgr.ops.control import Result
from cachemgr.procedures import policy
from tests.unit.guards import mutations_refused
from tests.unit.test_scrub import cli
from tests.unit.test_tui_coherence import clean_writethrough
from tests.unit.tui_helpers import copy_capture

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@pytest.fixture
def scrubs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """Each device's scrub, stood in for: (target, bound) recorded, a clean result."""
    calls: list[tuple[str, float | None]] = []

    def fake(sysfs: Any, target: str, *, max_latency_ms: float | None = None,
             ctl: Any = None) -> Result:
        calls.append((target, max_latency_ms))
        return Result(lines=[f"scrub {target}: 10 blocks compared: 0 served unlike the origin"],
                      data={"schema": 1, "mismatches": [], "bytes": 1 << 20, "seconds": 1.0,
                            "dropped": None})

    monkeypatch.setattr(scrub_ops, "scrub", fake)
    return calls


def write_policy(tmp_path: Path, text: str) -> str:
    p = tmp_path / "cachemgr.toml"
    p.write_text(text)
    p.chmod(0o600)
    return str(p)


def test_the_scrub_table() -> None:
    assert policy.parse("").scrub == policy.ScrubPolicy(True, (), 20.0)
    pol = policy.parse('[scrub]\nenabled = false\ndevices = ["/dev/bcache0", "vg/lv", '
                       '"/dev/bcache0"]\nmax_latency_ms = 50\n')
    assert pol.scrub == policy.ScrubPolicy(False, ("/dev/bcache0", "vg/lv"), 50.0)
    assert policy.parse(policy.dumps(pol)).scrub == pol.scrub
    assert policy.parse("[scrub]\nmax_latency_ms = 0\n").scrub.max_latency_ms is None
    for bad, words in (("enabled = 1", "enabled must be true or false"),
                       ('devices = "/dev/bcache0"', "devices must be a list"),
                       ('devices = [""]', "devices must be a list"),
                       ("max_latency_ms = -1", "max_latency_ms must be a number"),
                       ("max_latency_ms = 60001", "max_latency_ms must be a number"),
                       ("max_latency_ms = true", "max_latency_ms must be a number"),
                       ("pace = 3", "pace")):
        with pytest.raises(policy.PolicyError) as exc:
            policy.parse(f"[scrub]\n{bad}\n")
        assert words in str(exc.value) and exc.value.problems[0].line == 2, (bad, exc.value)


def test_off_in_the_policy_scrubs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          scrubs: list[Any]) -> None:
    root = clean_writethrough(tmp_path)
    ran = mutations_refused(monkeypatch)
    pol = write_policy(tmp_path, "[scrub]\nenabled = false\n")
    rc, out, err = cli(root, ["scrub", "--all", "--policy", pol])
    assert rc == 4, err
    assert f"scrub is off: the [scrub] table of {pol} has enabled = false" in out
    assert scrubs == [] and ran == []


def test_every_write_through_or_clean_cache_paced_by_default(
        tmp_path: Path, scrubs: list[Any]) -> None:
    root = clean_writethrough(tmp_path)
    nothing = str(tmp_path / "none.toml")  # no policy file: the table's defaults
    rc, out, err = cli(root, ["scrub", "--all", "--policy", nothing])
    assert rc == 0, err
    assert scrubs == [("/dev/bcache0", 20.0)]
    assert "scrub /dev/bcache0: 10 blocks compared" in out
    # the table's pace, and --max-latency over it
    pol = write_policy(tmp_path, "[scrub]\nmax_latency_ms = 50\n")
    assert cli(root, ["scrub", "--all", "--policy", pol])[0] == 0
    assert cli(root, ["scrub", "--all", "--policy", pol, "--max-latency", "30"])[0] == 0
    assert scrubs[1:] == [("/dev/bcache0", 50.0), ("/dev/bcache0", 30.0)]


def test_a_writeback_cache_is_passed_over_unless_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scrubs: list[Any]) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    ran = mutations_refused(monkeypatch)
    rc, out, err = cli(root, ["scrub", "--all", "--policy", str(tmp_path / "none.toml")])
    assert rc == 4, err  # nothing to compare
    assert "/dev/bcache0: passed over (/dev/bcache0 is in writeback with 4.4 MiB of dirty " \
           "data" in out
    assert "no write-through or clean cache to scrub on this host" in out
    assert scrubs == [] and ran == []
    # named by the policy: the scrub command's refusal (exit 3), in its words
    monkeypatch.undo()
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    pol = write_policy(tmp_path, '[scrub]\ndevices = ["/dev/bcache0"]\n')
    rc, out, err = cli(root, ["scrub", "--all", "--policy", pol, "--json"])
    assert rc == 3, err
    doc = json.loads(out)
    assert doc["devices"][0]["outcome"] == "refused"
    assert "cachemgr mode /dev/bcache0 writethrough --drain && cachemgr scrub /dev/bcache0" \
        in doc["devices"][0]["hint"]


def test_a_failed_scrub_is_exit_1_and_the_others_still_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = clean_writethrough(tmp_path)
    seen: list[str] = []

    def fake(sysfs: Any, target: str, **_: Any) -> Result:
        seen.append(target)
        if target == "/dev/bcache0":
            raise CacheMgrError("a read of 1048576 bytes at 0 gave 0")
        raise UnsafeError(f"{target} is busy")

    monkeypatch.setattr(scrub_ops, "scrub", fake)
    pol = write_policy(tmp_path, '[scrub]\ndevices = ["/dev/bcache0", "/dev/bcache9"]\n')
    rc, out, _ = cli(root, ["scrub", "--all", "--policy", pol])
    assert rc == 1  # a failure wins over a refusal
    assert seen == ["/dev/bcache0", "/dev/bcache9"]
    assert "/dev/bcache0: scrub failed: a read of 1048576 bytes at 0 gave 0" in out
    assert "/dev/bcache9: not scrubbed: /dev/bcache9 is busy" in out


def test_a_target_or_all(tmp_path: Path, scrubs: list[Any]) -> None:
    root = clean_writethrough(tmp_path)
    for argv in (["scrub"], ["scrub", "/dev/bcache0", "--all"],
                 ["scrub", "/dev/bcache0", "--policy", "/etc/x.toml"]):
        rc, _, err = cli(root, argv)
        assert rc == 2, (argv, err)
    assert scrubs == []


def test_the_timer_runs_scrub_all_weekly_and_is_installed_on_request() -> None:
    from cachemgr.cli.main import build_parser

    unit = (UNITS / "cachemgr-scrub.service").read_text()
    exe = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = exe.removeprefix("ExecStart=").replace("@ARGS@", " --policy /etc/x.toml").split()
    assert argv[0] == "@CACHEMGR@"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "scrub" and args.all and args.target is None
    assert args.policy == "/etc/x.toml"
    # nothing to compare (exit 4) is no failure of the unit; 1 and 3 are
    assert "SuccessExitStatus=4\n" in unit
    timer = (UNITS / "cachemgr-scrub.timer").read_text()
    assert "OnCalendar=weekly\n" in timer and "Persistent=true\n" in timer
    assert "WantedBy=timers.target" in timer
    # the installer knows both (install, enable, uninstall); the package ships them
    installer = (ROOT / "scripts" / "install-udev.sh").read_text()
    assert "install_unit cachemgr-scrub.timer" in installer
    assert "cachemgr-scrub.service cachemgr-scrub.timer" in installer
    assert "cachemgr-scrub.service cachemgr-scrub.timer" in (ROOT / "debian/rules").read_text()
    from cachemgr.cli import install

    ns = build_parser().parse_args(["install-udev", "--scrub", "--no-reload"])
    assert "--scrub" in install.argv_for(ns)
