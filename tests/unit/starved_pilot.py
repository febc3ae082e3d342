r"""A pytest plugin that makes every TUI pilot test see the starved host's case at once:
textual's wait_for_idle (what Pilot.press, Pilot.pause and the key sender wait on) takes
"little CPU used while asleep" for "the app is done", and a process that gets little CPU
(load 10-20 on 2 CPUs) uses little either way, so the wait ends before the app has handled
the key. Here it ends after one turn of the loop, every time: a test that reads the screen
before the app got there fails on every run instead of one run in a few under load.

    .venv/bin/python -m pytest -p no:cacheprovider -p tests.unit.starved_pilot \
        -q tests/unit/test_tui.py

Not loaded by default (issue #43 item 1: how the races the load showed were found)."""

from __future__ import annotations

import asyncio

import pytest


async def _starved(min_sleep: float = 0.0, max_sleep: float = 1.0) -> None:
    await asyncio.sleep(0)


def pytest_configure(config: pytest.Config) -> None:
    import textual.app
    import textual.pilot

    textual.app.wait_for_idle = _starved  # type: ignore[assignment]
    textual.pilot.wait_for_idle = _starved  # type: ignore[assignment]
