"""Small forms: tune a value, create a cache. Values come back as a dict of strings."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from tui.safe import literal


class FormDialog(ModalScreen[dict[str, str] | None]):
    """Fields are (key, label, default, placeholder); ``checks`` are (key, label).
    Values are returned as strings ("1"/"" for checkboxes); the library validates them."""

    BINDINGS: ClassVar[list[BindingType]] = [("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[tuple[str, str, str, str]],
                 checks: list[tuple[str, str]] | None = None, note: str = "",
                 ok_label: str = "OK", ok_variant: str = "primary") -> None:
        super().__init__()
        self.title_text = title
        self.fields = fields
        self.checks = checks or []
        self.note = note
        self.ok_label = ok_label
        self.ok_variant = ok_variant

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog form"):
            yield Static(literal(self.title_text), classes="dialog-title")
            with VerticalScroll(classes="form-fields"):
                for key, label, default, placeholder in self.fields:
                    yield Label(literal(label))
                    yield Input(default, placeholder=placeholder, id=f"f-{key}")
                for key, label in self.checks:
                    yield Checkbox(literal(label), id=f"c-{key}")
                if self.note:
                    yield Static(literal(self.note), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button(literal(self.ok_label), id="b-ok",
                             variant=self.ok_variant)  # type: ignore[arg-type]
                yield Button("Cancel", id="b-cancel")

    def on_mount(self) -> None:
        if self.fields:
            self.query_one(f"#f-{self.fields[0][0]}", Input).focus()

    def values(self) -> dict[str, str]:
        out = {k: self.query_one(f"#f-{k}", Input).value.strip() for k, *_ in self.fields}
        for k, _ in self.checks:
            out[k] = "1" if self.query_one(f"#c-{k}", Checkbox).value else ""
        return out

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(self.values())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self.values() if event.button.id == "b-ok" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
