"""The log panel: what was done (each action, its result, refusals) with the time."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual.widgets import RichLog

from tui.safe import plain


class LogPanel(RichLog):
    def __init__(self, clock: Callable[[], float] = time.time, **kw: object) -> None:
        super().__init__(wrap=True, markup=False, max_lines=2000, **kw)  # type: ignore[arg-type]
        self.clock = clock
        self.lines_text: list[str] = []  # plain copy, for tests and the help of a screen

    def add(self, line: str, style: str = "") -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        for i, part in enumerate(plain(line).splitlines() or [""]):
            text = f"{stamp} {part}" if i == 0 else f"         {part}"
            self.lines_text.append(text)
            self.write(Text(text, style=style))
