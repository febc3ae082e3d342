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
    meta = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cachemgr = cachemgr.cli.main:main" in zipfile.ZipFile(wheel).read(meta).decode()
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
