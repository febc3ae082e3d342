"""The library never imports textual (docs/architecture.md, harlequin's contract)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import cachemgr


def test_library_imports_no_textual() -> None:
    mods = [m.name for m in pkgutil.walk_packages(cachemgr.__path__, "cachemgr.")
            if not m.name.endswith("__main__")]
    assert "cachemgr.cli.main" in mods and "cachemgr.backends.bcache" in mods
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(cachemgr.__file__).parent.parent)
    assert r.returncode == 0, r.stdout + r.stderr
