"""Device-supplied text made safe to print: a bcache label, a dm name, SCSI vendor/model/
serial, a by-id link or a policy name can hold any byte the kernel or a file let through,
and an escape sequence printed raw drives the operator's terminal (issue #15).

:func:`printable` replaces every control character (C0, DEL, C1) and every bidi override or
isolate with a visible ``\\xNN`` / ``\\uNNNN`` escape; printable text is returned unchanged.
Text outputs (the status table, error messages, command results) pass through it; JSON
output does not (json.dumps escapes control characters itself and the data stays exact).
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; bidi embeddings/overrides (U+202A-U+202E) and isolates
# (U+2066-U+2069), which reorder what follows them on the screen
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NEWLINES = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object, *, newlines: bool = False) -> str:
    """``text`` with every control character and bidi override shown as an escape
    (``"\\x1b"`` -> the four characters ``\\x1b``). With ``newlines``, ``\\n`` is kept (a
    message's own line breaks: message and hint); a table cell keeps none."""
    s = str(text)
    return (_NEWLINES if newlines else _UNSAFE).sub(_escape, s)


__all__ = ["printable"]
