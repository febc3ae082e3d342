"""The import rules between the layers (docs/architecture.md) are import-linter
contracts in pyproject.toml ([tool.importlinter]): the layers (cli > ops > procedures >
backends > core, every module of cachemgr in one, the lab beside them), the TUI through the
command layer only, no textual or TUI in the library, the lab off the runtime path, each kind
of SSD replacement independent of the others, and no import circle, module to module
(tests/importcontracts.py: imports inside functions and under TYPE_CHECKING count) or package
to package. This test runs them on the checkout, and shows that each can fail: an import
planted in a copy of the tree breaks the contract it should.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def lint(tree: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on the checkout at ``tree`` (its pyproject.toml, its packages first on
    the path: the installed cachemgr may be another checkout's)."""
    args = [a for c in contracts for a in ("--contract", c)]
    env = {**os.environ, "PYTHONPATH": str(tree), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", *args],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept() -> None:
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


def copy_tree(dst: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in ("cachemgr", "tui"):
        shutil.copytree(ROOT / top, dst / top, ignore=skip)
    (dst / "tests").mkdir()
    for name in ("__init__.py", "importcontracts.py"):
        shutil.copy(ROOT / "tests" / name, dst / "tests" / name)
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


# (file, what is added to it, the contract it breaks, a word of the report)
PLANTED = [
    # a circle: ops/control.py imports ops/trail.py
    ("cachemgr/ops/trail.py", "from cachemgr.ops import control  # noqa\n", "acyclic",
     "cachemgr.ops.control, cachemgr.ops.trail"),
    # a circle through an import inside a function still counts
    ("cachemgr/cli/complete.py",
     "def _parser():  # noqa\n    from cachemgr.cli.main import build_parser  # noqa\n",
     "acyclic", "cachemgr.cli.complete, cachemgr.cli.main"),
    # ... and one under TYPE_CHECKING (tui/app.py imports tui/actions.py)
    ("tui/actions.py",
     "from typing import TYPE_CHECKING  # noqa\nif TYPE_CHECKING:\n"
     "    from tui.app import CacheMgrApp  # noqa\n", "acyclic", "tui.actions, tui.app"),
    # a package circle with no module circle: procedures/replace/shared.py imports the kinds
    ("cachemgr/procedures/kinds/base.py",
     "from cachemgr.procedures.replace import journal  # noqa\n", "acyclic-packages",
     "cachemgr.procedures"),
    ("cachemgr/core/model.py", "from cachemgr.backends import bcache  # noqa\n", "layers",
     "cachemgr.core.model -> cachemgr.backends.bcache"),
    ("cachemgr/backends/bcache.py", "from cachemgr.ops import cache  # noqa\n", "layers",
     "cachemgr.backends.bcache -> cachemgr.ops.cache"),
    ("tui/view.py", "from cachemgr.backends import bcache  # noqa\n", "tui",
     "tui.view -> cachemgr.backends.bcache"),
    ("cachemgr/core/text.py", "import textual  # noqa\n", "no-textual",
     "cachemgr.core.text -> textual"),
    ("cachemgr/ops/warm.py", "from cachemgr.lab import core  # noqa\n", "lab",
     "cachemgr.ops.warm -> cachemgr.lab.core"),
    ("cachemgr/procedures/replace/lvm.py",
     "from cachemgr.procedures.replace import dmcache  # noqa\n", "replace-kinds",
     "cachemgr.procedures.replace.lvm -> cachemgr.procedures.replace.dmcache"),
]


@pytest.mark.parametrize("source, planted, contract, said", PLANTED,
                         ids=[f"{c}:{s}" for s, _, c, _ in PLANTED])
def test_a_planted_import_breaks_its_contract(tmp_path: Path, source: str, planted: str,
                                              contract: str, said: str) -> None:
    tree = copy_tree(tmp_path)
    path = tree / source
    path.write_text(path.read_text() + "\n" + planted)
    r = lint(tree, contract)
    out = " ".join((r.stdout + r.stderr).split())  # the report wraps long lines
    assert r.returncode == 1, out
    assert "1 broken" in out and said in out, out


def test_a_module_in_no_layer_breaks_the_layers(tmp_path: Path) -> None:
    """A new top-level module of cachemgr belongs to no layer: the layers contract is
    exhaustive, so it fails until the module is put in one."""
    tree = copy_tree(tmp_path)
    (tree / "cachemgr" / "stray.py").write_text("X = 1\n")
    r = lint(tree, "layers")
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 1 and "cachemgr.stray" in out, out
