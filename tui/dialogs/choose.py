"""Pick one of a few things: a mode (with what happens to dirty data), a cache set, a run."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from tui.safe import literal


class ChoiceDialog(ModalScreen[str | None]):
    """A list of (id, label); Enter or a click picks one. ``explain`` describes the
    highlighted choice below the list (e.g. what a mode does to the dirty data)."""

    BINDINGS: ClassVar[list[BindingType]] = [("escape", "cancel", "Cancel")]

    def __init__(self, title: str, choices: list[tuple[str, str]],
                 explain: Callable[[str], str] | None = None, current: str | None = None,
                 empty: str = "nothing to choose from") -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices
        self.explain = explain
        self.current = current
        self.empty = empty

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(literal(self.title_text), classes="dialog-title")
            if self.choices:
                yield OptionList(*[Option(literal(label), id=cid) for cid, label in self.choices],
                                 id="choices")
            else:
                yield Static(literal(self.empty), classes="dialog-body")
            yield Static("", id="explain", classes="dialog-body", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel", id="b-cancel")

    def on_mount(self) -> None:
        if self.choices:
            ol = self.query_one(OptionList)
            ids = [c for c, _ in self.choices]
            ol.highlighted = ids.index(self.current) if self.current in ids else 0
            ol.focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if self.explain and event.option.id:
            self.query_one("#explain", Static).update(literal(self.explain(event.option.id)))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
