"""A long operation in progress: bar, ETA, the library's progress line; Cancel and Hide."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, ProgressBar, Static

from tui.safe import literal


class ProgressDialog(ModalScreen[str | None]):
    """Dismissed with "cancel" (the app cancels the operation safely), "hide" (it goes on in
    the background, progress in the status line) or None when the operation ended."""

    BINDINGS: ClassVar[list[BindingType]] = [("escape", "hide", "Hide"),
                                             ("c", "cancel_op", "Cancel")]

    def __init__(self, op_id: int, title: str, cancellable: bool = True,
                 cancel_note: str = "", *, line: str = "starting...") -> None:
        super().__init__()
        self.line = line
        self.op_id = op_id
        self.title_text = title
        self.cancellable = cancellable
        self.cancel_note = cancel_note

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(literal(self.title_text), classes="dialog-title")
            yield ProgressBar(total=1.0, show_eta=False, id="bar")
            yield Static(literal(self.line), id="line")
            yield Static("", id="eta")
            if self.cancel_note:
                yield Static(literal(self.cancel_note), classes="dialog-note")
            with Horizontal(classes="dialog-buttons"):
                if self.cancellable:
                    yield Button("Cancel", id="b-cancel", variant="warning")
                yield Button("Hide", id="b-hide")

    def update_progress(self, line: str, fraction: float | None, eta_s: float | None) -> None:
        self.query_one("#line", Static).update(literal(line))
        bar = self.query_one(ProgressBar)
        if fraction is not None:
            bar.update(total=1.0, progress=fraction)
        else:
            bar.update(total=None)
        self.query_one("#eta", Static).update(
            f"ETA {eta_s:.0f} s" if eta_s is not None else "ETA unknown")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "b-cancel":
            self.action_cancel_op()
        else:
            self.action_hide()

    def action_cancel_op(self) -> None:
        if self.cancellable:
            self.query_one("#line", Static).update("cancelling: putting things back...")
            self.dismiss("cancel")

    def action_hide(self) -> None:
        self.dismiss("hide")
