"""replace-ssd as a package (cachemgr/procedures/replace/, issue #30 item 5), read from the
source: no module of it borrows a private (underscore) name of another cachemgr module,
neither by importing it (``from cachemgr.procedures.replace.shared import _x``) nor through
an imported module or class (``shared._x``, ``build._zero``); what kinds share is a public
name of shared.py or run.py. And one module per kind: no kind's module imports another's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cachemgr" / "procedures" / "replace"
KINDS = ("bcache", "lvm", "dmcache")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module a ``from ... import`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    pkg = ["cachemgr", "procedures", "replace"]
    if path.name != "__init__.py":
        pkg = [*pkg, path.stem]
    base = pkg[: len(pkg) - node.level]
    return ".".join([*base, node.module] if node.module else base)


def borrowed(source: str, path: Path) -> list[str]:
    """Every private name of another cachemgr module that ``source`` uses, with its line."""
    tree = ast.parse(source, str(path))
    bad: list[str] = []
    imported: set[str] = set()  # local names bound to cachemgr modules, classes, functions
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cachemgr":
                    if any(_private(p) for p in a.name.split(".")):
                        bad.append(f"{path.name}:{node.lineno}: import {a.name}")
                    imported.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            if module.split(".")[0] != "cachemgr":
                continue
            if any(_private(p) for p in module.split(".")):
                bad.append(f"{path.name}:{node.lineno}: from {module} import ...")
            for a in node.names:
                if _private(a.name):
                    bad.append(f"{path.name}:{node.lineno}: from {module} import {a.name}")
                imported.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain = node.value
            while isinstance(chain, ast.Attribute):  # cachemgr.backends.x._y
                chain = chain.value
            if isinstance(chain, ast.Name) and chain.id in imported:
                bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return bad


def modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def test_the_package_has_its_modules() -> None:
    names = {p.stem for p in modules()}
    assert {"__init__", "journal", "run", "shared", *KINDS} <= names
    assert not (PACKAGE.parent / "replace.py").exists()
    assert not list(PACKAGE.parent.glob("replace_*.py"))  # the kinds live in the package


def test_no_module_borrows_a_private_name() -> None:
    bad = [hit for p in modules() for hit in borrowed(p.read_text(), p)]
    assert not bad, ("a private name of another module is used; make it a public function "
                     "of the module that owns it (shared.py for what kinds share):\n"
                     + "\n".join(bad))


def test_no_kind_imports_another_kind() -> None:
    bad = []
    for kind in KINDS:
        path = PACKAGE / f"{kind}.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(node, path)
                names = [module, *(f"{module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [f"{kind}.py:{node.lineno}: {n}" for n in names
                    if n in {f"cachemgr.procedures.replace.{k}" for k in KINDS if k != kind}]
    assert not bad, "a kind's module imports another kind's:\n" + "\n".join(bad)


def test_the_check_finds_what_it_looks_for() -> None:
    here = PACKAGE / "lvm.py"
    src = (
        "from cachemgr.procedures.replace.shared import _old_match, new_disk\n"
        "from cachemgr.procedures.replace import shared\n"
        "from . import run\n"
        "from .journal import _journal_problem\n"
        "from cachemgr.backends.dmcache import build\n"
        "import cachemgr.backends.bcache\n"
        "import os\n"
        "def f(c):\n"
        "    shared._find_new(c)\n"
        "    run.Ctx.__dataclass_fields__\n"
        "    build._zero_superblock('/dev/x')\n"
        "    cachemgr.backends.bcache._private()\n"
        "    os._exit(0)\n"
        "    self_owned = _mine = 1\n"
        "    new_disk(c)._cached\n"
    )
    got = [b.split(": ", 1)[1] for b in borrowed(src, here)]
    assert sorted(got) == sorted([
        "from cachemgr.procedures.replace.shared import _old_match",
        "from cachemgr.procedures.replace.journal import _journal_problem",
        "shared._find_new",
        "build._zero_superblock",
        "cachemgr.backends.bcache._private",
    ])
