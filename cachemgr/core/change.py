"""What every cache kind's operation returns, and the one bounded wait every kind polls
with: shared by all backends and kinds (cachemgr/procedures/kinds), none of them owning it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    """What an operation did: ``changed`` False means it was already so."""

    target: str
    what: str
    before: str | None
    after: str | None
    changed: bool = True



def wait_for(pred: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``pred`` every ``interval`` seconds until it is true (True) or ``timeout``
    seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
