"""Every command imports only what it uses (cachemgr/cli/main.py's docstring): building the
parser imports no module of the command layer, ``--version`` reads the version only when
given, and a handler still reaches its module when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cachemgr
from cachemgr.core import defaults
from cachemgr.core.lazy import lazy

ROOT = Path(cachemgr.__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

# the command layer: none of it may be imported to build the parser
HEAVY = ("cachemgr.ops.", "cachemgr.procedures.", "cachemgr.backends.", "cachemgr.lab.")
# cachemgr/cli/udev.py's top level imports cachemgr.ops.udev, which imports the standard
# library and cachemgr.core.safefs only (the udev rule's fast path: its docstring)
ALLOWED = {"cachemgr.ops.udev"}


def _modules_after(code: str) -> list[str]:
    """The cachemgr modules loaded after running ``code`` in a fresh interpreter."""
    r = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys\n"
         "print(json.dumps(sorted(m for m in sys.modules if m.startswith('cachemgr'))))"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    mods: list[str] = json.loads(r.stdout.splitlines()[-1])
    return mods


def _heavy(mods: list[str]) -> list[str]:
    return [m for m in mods if m.startswith(HEAVY) and m not in ALLOWED]


def test_building_the_parser_imports_no_command_layer() -> None:
    mods = _modules_after("import cachemgr.cli.main\ncachemgr.cli.main.build_parser()")
    assert "cachemgr.cli.cache" in mods and "cachemgr.cli.bench" in mods  # it did build
    assert _heavy(mods) == []
    assert "cachemgr.core.version" not in mods  # read only when --version is given
    # the model's two dozen dataclasses and the state files: a handler's, not the parser's
    assert "cachemgr.core.model" not in mods and "cachemgr.core.state" not in mods


def test_the_check_sees_a_heavy_import() -> None:
    # the same check run after a handler's module was imported: it must name it
    mods = _modules_after("import cachemgr.cli.main\ncachemgr.cli.main.build_parser()\n"
                          "import cachemgr.ops.cache")
    assert "cachemgr.ops.cache" in _heavy(mods)


def test_version_and_help_import_no_command_layer() -> None:
    for argv in (["--version"], ["status", "--help"]):
        code = ("import sys, cachemgr.cli.main\n"
                f"try:\n    cachemgr.cli.main.main({argv!r})\n"
                "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
                "sys.stdout.flush()")
        mods = _modules_after(code)
        assert _heavy(mods) == [], argv


def test_a_handler_imports_its_module_when_it_runs() -> None:
    sysfs = next(FIXTURES.glob("bcache-writeback-dirty-*")) / "sys"
    mods = _modules_after("import cachemgr.cli.main, contextlib, io\n"
                          "with contextlib.redirect_stdout(io.StringIO()):\n"
                          f"    rc = cachemgr.cli.main.main(['--sysfs-root', {str(sysfs)!r}, "
                          "'status', '--json'])\n"
                          "assert rc == 0, rc")
    assert "cachemgr.ops.cache" in mods


def test_lazy_reads_the_modules_attributes() -> None:
    m = lazy("json")
    assert m.dumps([1]) == "[1]"
    with pytest.raises(AttributeError):
        _ = m.no_such_name
    with pytest.raises(ModuleNotFoundError):
        _ = lazy("cachemgr.no_such_module").x


def test_parser_values_match_the_command_layer() -> None:
    # the constants the parser shows (cachemgr/core/defaults.py) are the ones the command
    # layer uses
    from cachemgr.ops import sizing
    from cachemgr.procedures import bench, trace

    assert bench.RW_MODES == defaults.RW_MODES
    assert bench.DEFAULT_TOLERANCE == defaults.DEFAULT_TOLERANCE
    assert bench.CACHE_SSD == defaults.CACHE_SSD
    assert trace.COUNT_TABLE == sizing.COUNT_TABLE == defaults.COUNT_TABLE
    assert sizing.DEFAULT_RATE == defaults.SIZING_DEFAULT_RATE


def test_the_rollback_help_names_each_kinds_point_of_no_return_from_its_module() -> None:
    """--rollback's help is read from the kinds' registry when shown (a kind's point of no
    return lives in its own module, never in the parser)."""
    from cachemgr.cli.main import build_parser
    from cachemgr.ops import replace

    sub = next(a for a in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
               if a.choices)
    help_text = sub.choices["replace-ssd"].format_help()  # type: ignore[index]
    flat = " ".join(help_text.split())
    for k in replace.KINDS:
        assert f"{k.name}: {k.point_of_no_return}" in flat, (k.name, flat)
