"""The program's version, from one source: pyproject.toml's ``[project] version``.

In a source checkout the pyproject.toml beside the package is read (it is the truth even
when an editable installation's metadata predates a bump); an installed wheel has none, and
its metadata (written from the same pyproject.toml at build time) is read instead.
``cachemgr --version`` prints it; the man pages carry it (core: the TUI may import it).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

UNKNOWN = "unknown"


def version() -> str:
    """``0.1.0``; ``unknown`` when neither a checkout's pyproject.toml nor the installed
    metadata says (never raises: ``--version`` must always answer)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "cachemgr" and isinstance(project.get("version"), str):
            return str(project["version"])
    except (OSError, ValueError):
        pass
    # importlib.metadata costs ~10 ms to import: only an installed wheel (no pyproject.toml
    # beside the package) needs it
    from importlib import metadata

    try:
        return metadata.version("cachemgr")
    except metadata.PackageNotFoundError:
        return UNKNOWN
