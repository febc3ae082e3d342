"""The wheel builds, carries what the lab needs at run time, and its entry point works."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_builds_and_installs(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "dist").glob("cachemgr-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in ("cachemgr/cli/main.py", "cachemgr/lab/stage2.sh", "cachemgr/lab/uml-init.sh",
                 "cachemgr/lab/qemu-init.sh", "tui/app.py"):
        assert need in names, need
    # typed, and the udev rule, the units and their installer as package data
    data = "cachemgr/" "data/"  # in the wheel only (pyproject.toml's force-include)
    for need in ("cachemgr/py.typed", "tui/py.typed", f"{data}udev/90-cachemgr.rules",
                 f"{data}scripts/install-udev.sh", f"{data}libvirt/qemu-hook",
                 *(f"{data}systemd/{u.name}" for u in (ROOT / "systemd").iterdir()
                   if u.suffix in (".service", ".timer")),
                 # the alert rules, dashboard, man pages, completion and admin guide
                 f"{data}monitoring/prometheus/cachemgr.rules.yml",
                 f"{data}monitoring/grafana/cachemgr.json", f"{data}man/cachemgr.8",
                 f"{data}completion/cachemgr.bash", f"{data}docs/admin-guide.md"):
        assert need in names, need
    meta = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cachemgr = cachemgr.cli.main:main" in zipfile.ZipFile(wheel).read(meta).decode()
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    headers = [x for x in metadata.split("\n\n")[0].splitlines()]
    assert "License-Expression: GPL-2.0-or-later" in headers
    # matplotlib only with the plots extra; textual at least 6.2 (Footer(compact=...))
    requires = [x.split(": ", 1)[1] for x in headers if x.startswith("Requires-Dist: ")]
    plots = [x for x in requires if x.startswith("matplotlib")]
    assert "matplotlib>=3.8; extra == 'plots'" in plots, requires
    assert all("extra == " in x for x in plots), plots
    assert "textual>=6.2" in requires
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                        str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "-c", "import cachemgr.cli.main, sys; "
                        "print(cachemgr.cli.main.__file__); "
                        "sys.exit(cachemgr.cli.main.main(['--help']))"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(target)) and "replace-ssd" in r.stdout
    # cachemgr install-udev runs the installer the wheel carries (not this checkout's)
    rules = tmp_path / "rules"
    r = subprocess.run([sys.executable, "-c", "import cachemgr.cli.main as m, sys; "
                        "sys.exit(m.main(sys.argv[1:]))", "install-udev", "--rules-dir",
                        str(rules), "--no-systemd", "--no-reload"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"installed {rules}/90-cachemgr.rules" in r.stderr
    rule = (rules / "90-cachemgr.rules").read_text()
    assert f'RUN+="{sys.executable} -m cachemgr.cli.udev udev-event"' in rule
    from cachemgr.cli import install
    assert install.installer() == ROOT / "scripts" / "install-udev.sh"  # the checkout's here


def test_plots_without_matplotlib_say_what_to_install(tmp_path: Path) -> None:
    """matplotlib is an extra: without it ``bench plot`` exits 1 naming it (no traceback)."""
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
                        "import cachemgr.cli.main as m; sys.exit(m.main(sys.argv[1:]))",
                        "bench", "plot", str(tmp_path / "result.json")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "plots need matplotlib" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "plots" in r.stderr.split("hint:")[1]
