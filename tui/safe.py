"""Text from outside (device labels, dm names, INQUIRY strings, by-id links, policy names,
the library's messages that embed them) shown as data, never as markup (issue #15).

A ``str`` handed to a Textual widget, a notification, an OptionList prompt, a Button or a
Rich table cell is parsed as markup: ``[/]`` in a bcache label raises MarkupError and kills
the app, ``[link=...]`` makes a terminal hyperlink. :func:`literal` makes it a Rich ``Text``
(taken literally by every one of them) with control characters shown as escapes
(cachemgr.core.text.printable), so that nothing reaches the terminal raw. The app's own
styling goes in the ``style`` argument, never in markup mixed with data.
"""

from __future__ import annotations

from rich.text import Text

from cachemgr.core.text import printable


def plain(s: object) -> str:
    """``s`` as text to show: control characters escaped, line breaks kept."""
    return printable(s, newlines=True)


def literal(s: object, style: str = "") -> Text:
    """``s`` as a Text that is shown exactly (no markup), in ``style``."""
    return Text(plain(s), style=style)


__all__ = ["literal", "plain"]
