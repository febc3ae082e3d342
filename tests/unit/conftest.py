from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _argparse_untranslated() -> Iterator[None]:
    """argparse asks gettext for each of its strings, some 140 times for cachemgr's parser,
    and under LANG=C.UTF-8 each ask looks for a C.UTF-8 catalogue on disk; LANGUAGE=C stops
    gettext at "C" before it looks (Python's gettext.find). No message changes (there is no
    catalogue for C.UTF-8), and a unit run builds the parser thousands of times (every CLI
    call in the test's process or its own): 21 -> 13 ms a build here."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LANGUAGE", "C")
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _pilot_press_waits_for_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Pilot.press in a TUI test returns once the app has handled the keys
    (tui_helpers.handled), not when textual's CPU-time heuristic guesses it has."""
    from textual.pilot import Pilot

    real = Pilot.press

    async def press(self: object, *keys: str) -> None:
        from tests.unit.tui_helpers import handled  # imports the app: only where one runs

        await real(self, *keys)
        await handled(self)

    monkeypatch.setattr(Pilot, "press", press)
