"""The udev rule and the systemd units as shipped: the rule's policy guard, and the units'
sandboxing as systemd-analyze scores it (offline: no running systemd is needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cachemgr.cli import udev as udev_cli
from cachemgr.procedures import policy

ROOT = Path(__file__).resolve().parents[2]
RULE = ROOT / "udev" / "90-cachemgr.rules"
UNITS = ROOT / "systemd"


def rule_lines() -> list[str]:
    """The rule's lines without comments, continuation lines joined."""
    text = RULE.read_text().replace("\\\n", "")
    return [x.strip() for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]


def test_rule_runs_nothing_without_the_policy_file() -> None:
    lines = rule_lines()
    run = next(i for i, x in enumerate(lines) if "RUN+=" in x)
    guard = [i for i, x in enumerate(lines)
             if re.search(r'TEST!="([^"]+)",.*GOTO="cachemgr_end"', x)]
    assert guard and guard[0] < run, lines
    path = re.search(r'TEST!="([^"]+)"', lines[guard[0]]).group(1)  # type: ignore[union-attr]
    # the path the handler and the boot pass read: one policy file for all of them
    assert path == policy.DEFAULT_PATH == udev_cli.DEFAULT_POLICY
    boot = (UNITS / "cachemgr-autoattach.service").read_text()
    assert f"ConditionPathExists=|{path}\n" in boot
    # or a recorded dm-cache device (assembled without a policy): the same pair in both
    assert 'TEST!="/etc/cachemgr/dmcache", GOTO="cachemgr_end"' in lines[guard[0]]
    assert "ConditionDirectoryNotEmpty=|/etc/cachemgr/dmcache\n" in boot
    # nothing between the guard and RUN jumps past the end label into RUN
    assert lines[-1] == 'LABEL="cachemgr_end"'


def test_rule_does_not_skip_md_arrays() -> None:
    skipped = next(x for x in rule_lines() if x.startswith('KERNEL=="'))
    names = skipped.split('"')[1].split("|")
    assert "md*" not in names and "loop*" in names, names


def test_installer_puts_the_policy_path_in_the_guard(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--python",
                        str(Path(ROOT / ".venv" / "bin" / "python")
                            if (ROOT / ".venv" / "bin" / "python").exists() else "python3"),
                        "--rules-dir", str(tmp_path), "--no-systemd", "--no-reload",
                        "--policy", "/srv/cache policy.toml"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "90-cachemgr.rules").read_text()
    assert ('TEST!="/srv/cache policy.toml", TEST!="/etc/cachemgr/dmcache", '
            'GOTO="cachemgr_end"') in text
    assert "/etc/cachemgr/cachemgr.toml" not in text.split("LABEL=")[0].split("TEST!=")[1]
    # a relative path would be relative to the device's sysfs directory (udev(7)): refused
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--rules-dir",
                        str(tmp_path / "x"), "--no-systemd", "--policy", "cachemgr.toml"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "absolute" in r.stderr, r.stderr


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """The units with @CACHEMGR@ made an existing program (verify checks ExecStart=)."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    for u in UNITS.iterdir():
        if u.suffix in (".service", ".timer"):
            (tmp_path / u.name).write_text(u.read_text().replace("@CACHEMGR@", "/bin/true")
                                           .replace("@ARGS@", ""))
    return tmp_path


def exposure(unit: Path) -> float:
    r = _analyze("security", "--offline=true", "--no-pager", str(unit))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


def test_units_verify_clean(units: Path) -> None:
    r = _analyze("verify", "--man=true", *map(str, sorted(units.iterdir())))
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


@pytest.mark.parametrize(("name", "most"), [("cachemgr-metrics.service", 5.0),
                                            ("cachemgr-textfile.service", 5.0),
                                            ("cachemgr-autoattach.service", 5.0),
                                            ("cachemgr-smart.service", 5.0),
                                            ("cachemgr-protect.service", 5.0),
                                            ("cachemgr-scrub.service", 5.0),
                                            ("cachemgr-governor.service", 5.0)])
def test_unit_exposure(units: Path, name: str, most: float) -> None:
    assert exposure(units / name) <= most


def test_smart_unit_runs_the_refresh_on_a_timer(units: Path) -> None:
    """cachemgr-smart.service runs a command the CLI has (ssd-health --refresh), on its
    timer every 10 minutes, and may open the disks smartctl asks (SCSI, NVMe) read-only."""
    from cachemgr.cli.main import build_parser

    unit = (UNITS / "cachemgr-smart.service").read_text()
    exe = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = exe.removeprefix("ExecStart=").split()
    assert argv[0] == "@CACHEMGR@"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "ssd-health" and args.refresh
    timer = (UNITS / "cachemgr-smart.timer").read_text()
    assert "OnUnitActiveSec=10min\n" in timer and "WantedBy=timers.target" in timer
    allowed = {x.split("=", 1)[1] for x in unit.splitlines() if x.startswith("DeviceAllow=")}
    assert allowed == {"block-sd r", "block-blkext r", "/dev/mapper/control rw"}
    # the installer knows the units (install, enable, uninstall)
    installer = (ROOT / "scripts" / "install-udev.sh").read_text()
    assert "install_unit cachemgr-smart.timer" in installer
    assert "cachemgr-smart.service cachemgr-smart.timer" in installer


def test_protect_unit_runs_the_pass_every_minute(units: Path) -> None:
    """cachemgr-protect.service runs a command the CLI has (protect), on its timer every
    minute, only with a policy file; the installer knows both units."""
    from cachemgr.cli.main import build_parser

    unit = (UNITS / "cachemgr-protect.service").read_text()
    exe = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = exe.removeprefix("ExecStart=").replace("@ARGS@", "").split()
    assert argv[0] == "@CACHEMGR@"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "protect" and not args.dry_run
    assert "ConditionPathExists=|/etc/cachemgr/cachemgr.toml\n" in unit
    timer = (UNITS / "cachemgr-protect.timer").read_text()
    assert "OnUnitActiveSec=1min\n" in timer and "WantedBy=timers.target" in timer
    installer = (ROOT / "scripts" / "install-udev.sh").read_text()
    assert "install_unit cachemgr-protect.timer" in installer
    assert "cachemgr-protect.service cachemgr-protect.timer" in installer


def test_textfile_unit_runs_one_process_that_rewrites_the_file(units: Path) -> None:
    """cachemgr-textfile.service is one long-running process (``metrics --textfile PATH
    --interval 15``), enabled on its own: no timer ships any more; restarted on a failure,
    not on exit 2 (a path the command line must fix)."""
    from cachemgr.cli.main import build_parser

    assert not (UNITS / "cachemgr-textfile.timer").exists()
    unit = (UNITS / "cachemgr-textfile.service").read_text()
    lines = unit.splitlines()
    exe = next(x for x in lines if x.startswith("ExecStart="))
    argv = exe.removeprefix("ExecStart=").split()
    assert argv[0] == "@CACHEMGR@"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "metrics" and args.interval == 15.0
    assert args.textfile == "/var/lib/prometheus/node-exporter/cachemgr.prom"
    for want in ("Type=exec", "Restart=on-failure", "RestartPreventExitStatus=2",
                 "WantedBy=multi-user.target", "PrivateNetwork=yes",
                 "ReadWritePaths=-/var/lib/prometheus/node-exporter"):
        assert want in lines, want
    # no per-run settings left from the oneshot (a run every 15 s)
    assert not [x for x in lines if x.startswith(("Type=oneshot", "LogLevelMax="))]
    installer = (ROOT / "scripts" / "install-udev.sh").read_text()
    assert "enable+=(cachemgr-textfile.service) start+=(cachemgr-textfile.service)" in installer
    assert "install_unit cachemgr-textfile.timer" not in installer


def test_installer_removes_an_earlier_versions_textfile_timer(tmp_path: Path) -> None:
    """An install over an earlier version's (an upgrade): its cachemgr-textfile.timer, which
    would start the textfile service every 15 s, is disabled and removed with its links, by
    any run of the installer (here the rule only)."""
    bash = shutil.which("bash")
    assert bash
    units = tmp_path / "units"
    (units / "timers.target.wants").mkdir(parents=True)
    (units / "cachemgr-textfile.timer").write_text("[Timer]\nOnUnitActiveSec=15s\n")
    (units / "timers.target.wants" / "cachemgr-textfile.timer").symlink_to(
        units / "cachemgr-textfile.timer")
    (units / "cachemgr-smart.timer").write_text("[Timer]\n")  # not an earlier version's
    python = ROOT / ".venv" / "bin" / "python"
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--python",
                        str(python) if python.exists() else "python3",
                        "--rules-dir", str(tmp_path / "rules"), "--unit-dir", str(units),
                        "--no-systemd", "--no-reload", "--no-libvirt-hook"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert f"removed {units}/cachemgr-textfile.timer" in r.stderr
    assert sorted(str(p.relative_to(units)) for p in units.rglob("*")) == [
        "cachemgr-smart.timer", "timers.target.wants"]
    # --uninstall removes it too (a dangling link left from an earlier version's timer)
    (units / "timers.target.wants" / "cachemgr-textfile.timer").symlink_to(
        units / "cachemgr-textfile.timer")
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--uninstall",
                        "--rules-dir", str(tmp_path / "rules"), "--unit-dir", str(units),
                        "--no-reload", "--no-libvirt-hook"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert not list((units / "timers.target.wants").iterdir())


def test_installer_reloads_udev_by_a_signal_that_cannot_be_dropped(tmp_path: Path) -> None:
    """udevd 252 can ignore the message of ``udevadm control --reload`` while udevadm exits 0
    (docs/kernel-notes.md, "udevd can ignore udevadm control"): the installer signals udevd
    (SIGHUP, its forced reload) and then pings it, on install and on --uninstall. Here
    ``udevadm`` ignores every message, as udevd did, and ``pgrep`` names a stand-in udevd
    that records the signals it gets."""
    import os
    import signal
    import sys
    import time

    bash = shutil.which("bash")
    assert bash
    log = tmp_path / "log"
    fake = tmp_path / "bin"
    fake.mkdir()
    ready = tmp_path / "ready"
    udevd = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        "def hup(n, f):\n    open(sys.argv[1], 'a').write('udevd SIGHUP\\n')\n"
        "signal.signal(signal.SIGHUP, hup)\nopen(sys.argv[2], 'w').close()\n"
        "while True:\n    time.sleep(0.05)\n"), str(log), str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and udevd.poll() is None, "stand-in udevd"
            time.sleep(0.02)
        (fake / "udevadm").write_text(f'#!/bin/sh\necho "udevadm $*" >>{log}\n')
        (fake / "pgrep").write_text(
            f'#!/bin/sh\ncase "$*" in *systemd-udevd*) echo {udevd.pid} ;; *) exit 1 ;; esac\n')
        for f in fake.iterdir():
            f.chmod(0o755)
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
        python = ROOT / ".venv" / "bin" / "python"
        common = ["--rules-dir", str(tmp_path / "rules"), "--no-systemd", "--no-libvirt-hook"]
        for extra in (["--python", str(python) if python.exists() else "python3"],
                      ["--uninstall"]):
            log.write_text("")
            r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), *common,
                                *extra], capture_output=True, text=True, timeout=60,
                               check=False, env=env)
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 10
            while "udevd SIGHUP" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
            lines = log.read_text().splitlines()
            assert lines.count("udevd SIGHUP") == 1, (extra, lines, r.stderr)
            assert [x for x in lines if x.startswith("udevadm")] == ["udevadm control --ping"]
            assert f"udev rules reloaded (SIGHUP to udevd, pid {udevd.pid})" in r.stderr
    finally:
        udevd.send_signal(signal.SIGTERM)
        udevd.wait(timeout=10)
