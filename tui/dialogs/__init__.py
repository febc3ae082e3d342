"""Modal dialogs: confirmations, choices, forms, progress and operator prompts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def when(fn: Callable[[Any], object]) -> Callable[[Any], None]:
    """A dialog callback that acts only on an answer (not on Cancel, which gives None)."""

    def cb(value: Any) -> None:
        if value:
            fn(value)

    return cb
