"""The lab captures under tests/fixtures (<scenario>-<backend>, the large ones packed as
.tar.xz; scripts/capture-fixtures.sh makes them), found by their exact scenario name."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def captured_as(path: Path, scenario: str) -> bool:
    """``path`` is a capture of ``scenario`` (tests/fixtures/<scenario>-<backend>, or packed
    as .tar.xz): not of another scenario whose name starts the same ("vms-" also matches
    vms-accounting-uml, and the glob's order is the directory's)."""
    return path.name.removesuffix(".tar.xz").rsplit("-", 1)[0] == scenario


def captures(scenario: str, suffix: str = "") -> list[Path]:
    """Every capture of ``scenario`` (one per backend), in name order; ``suffix`` ".tar.xz":
    the packed ones."""
    return [p for p in sorted(FIXTURES.glob(f"{scenario}-*{suffix}")) if captured_as(p, scenario)]


def fx(scenario: str) -> Path:
    """The sys/ tree of the first capture of ``scenario``."""
    return captures(scenario)[0] / "sys"
