"""The import rules between the layers (docs/architecture.md), read from every module's
source: a layer imports only itself and the layers below it.

    core        model, sysfs, runner, errors, exit codes, state files, the wait-for-clean loop
    backends    bcache, dm-cache, SCSI, identity, the snapshot, target resolution
    procedures  the device interface, drain, replace, autoattach decisions, bench, metrics
    ops         the command layer: one function per command, under every face
    cli         the command line (one module per command group)

The lab (cachemgr/lab) is off the runtime path: only the CLI (``cachemgr lab ...``, ``bench
demo``) and the lab itself import it. The TUI imports the command layer and core, never a
backend or a procedure. Nothing under cachemgr imports textual or the TUI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = {"core": 0, "backends": 1, "procedures": 2, "ops": 3, "cli": 4}
FACES = {"cachemgr.__main__", "cachemgr.udev_cli"}  # entry points kept at the top


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (also inside functions), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []
    me = module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = me.split(".")[: -node.level] if path.name != "__init__.py" else \
                    me.split(".")[: len(me.split(".")) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            out.append((node.lineno, base))
            # "from cachemgr import bcache" imports the module cachemgr.bcache
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def layer(mod: str) -> str | None:
    parts = mod.split(".")
    if parts[0] != "cachemgr" or len(parts) < 2:
        return None
    if parts[1] in RANK or parts[1] == "lab":
        return parts[1]
    return None


def sources(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


def violations() -> list[str]:
    bad = []
    for path in sources("cachemgr"):
        me = module_name(path)
        mine = layer(me)
        for line, target in imports(path):
            where = f"{path.relative_to(ROOT)}:{line}: {me} imports {target}"
            if target.split(".")[0] in ("textual", "tui"):
                bad.append(where + " (the library never imports the TUI or textual)")
                continue
            theirs = layer(target)
            if theirs is None:
                continue
            if theirs == "lab":
                if mine not in ("lab", "cli") and me not in FACES:
                    bad.append(where + " (the lab is off the runtime path)")
                continue
            if mine == "lab" or me in FACES or me == "cachemgr":
                continue
            if mine is None:
                bad.append(where + f" ({me} belongs to no layer: put it in one)")
            elif RANK[theirs] > RANK[mine]:
                bad.append(where + f" ({mine} is below {theirs})")
    for path in sources("tui"):
        for line, target in imports(path):
            theirs = layer(target)
            if theirs not in (None, "core", "ops"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: the TUI imports {target} "
                           f"({theirs}); it goes through the command layer (cachemgr.ops)")
    return bad


def test_every_module_is_in_a_layer() -> None:
    top = sorted(p.name for p in (ROOT / "cachemgr").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "udev_cli.py"], top
    for name in RANK:
        assert (ROOT / "cachemgr" / name / "__init__.py").is_file(), name


def test_layers_import_only_downwards() -> None:
    assert violations() == []


@pytest.mark.parametrize("source, expected", [
    ("cachemgr/core/model.py", "core is below backends"),
    ("cachemgr/backends/bcache.py", "backends is below ops"),
    ("tui/view.py", "the TUI imports cachemgr.backends.bcache"),
])
def test_a_wrong_import_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 source: str, expected: str) -> None:
    """The check can fail: an upward import planted in a copy of a module is reported."""
    real = ROOT / source
    planted = real.read_text() + (
        "\nfrom cachemgr.backends import bcache  # noqa\n" if "core" in source or "tui" in source
        else "\nfrom cachemgr.ops import cache  # noqa\n")
    orig_read = Path.read_text

    def read_text(self: Path, *a: object, **kw: object) -> str:
        return planted if self == real else orig_read(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    assert any(expected in v for v in violations()), violations()
