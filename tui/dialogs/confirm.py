"""A confirmation: what will happen, in words, and explicit buttons (Cancel has the focus)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tui.safe import literal


class ConfirmDialog(ModalScreen[str | None]):
    """Returns the id of the button pressed, None on Cancel/Escape.

    ``buttons`` are (id, label, variant); destructive choices use variant "error". The focus
    starts on Cancel so that Enter alone never does anything destructive.
    """

    BINDINGS: ClassVar[list[BindingType]] = [("escape", "cancel", "Cancel")]
    # Cancel has the focus: Enter alone never confirms. Focused when the screen is shown, not
    # in on_mount: a dialog pushed as the app exits is torn down without its buttons, and
    # on_mount's query failed then (a unit test under load)
    AUTO_FOCUS = "#b-cancel"

    def __init__(self, title: str, body: str,
                 buttons: list[tuple[str, str, str]] | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.buttons = buttons or [("ok", "OK", "primary")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(literal(self.title_text), classes="dialog-title")
            # a long body (the replacement plan) scrolls: the buttons stay on the screen
            with VerticalScroll(classes="dialog-scroll"):
                yield Static(literal(self.body), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                for bid, label, variant in self.buttons:
                    yield Button(literal(label), id=f"b-{bid}", variant=variant)  # type: ignore[arg-type]
                yield Button("Cancel", id="b-cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        bid = (event.button.id or "").removeprefix("b-")
        self.dismiss(None if bid == "cancel" else bid)

    def action_cancel(self) -> None:
        self.dismiss(None)


class MessageDialog(ModalScreen[None]):
    """A result or a refusal, shown until dismissed (the library's words, verbatim)."""

    BINDINGS: ClassVar[list[BindingType]] = [("escape", "close", "Close"),
                                             ("enter", "close", "Close")]
    AUTO_FOCUS = "#b-close"  # as ConfirmDialog's

    def __init__(self, title: str, body: str, error: bool = False) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.error = error

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog error" if self.error else "dialog"):
            yield Static(literal(self.title_text), classes="dialog-title")
            with VerticalScroll(classes="dialog-scroll"):
                yield Static(literal(self.body), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Close", id="b-close", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
