"""Checks of the values that come from outside (command-line options, the TUI's forms, job
files, the policy), shared by every face so that each refuses the same values with the same
words.

Numbers: :func:`number` takes the admin's text (or a number a face already parsed) and refuses
what is not a finite number in range: ``nan`` compares false with everything (a timeout of
nan never expires, an interval of nan or 0 busy-loops, a negative one crashes a sleep), and
``inf`` or ``1e999`` never ends. Text: :func:`bad_char` finds the first character that must not
be in a name, an id or a line of a file that is written for another program (control
characters such as a newline, and the invisible format characters: bidi overrides, zero-width
spaces), which could add lines or hide what is really there.
"""

from __future__ import annotations

import argparse
import math
import unicodedata
from collections.abc import Callable

from cachemgr.core.errors import UsageError


def _range_words(*, minimum: float | None, above: float | None,
                 maximum: float | None) -> str:
    words = []
    if above is not None:
        words.append(f"greater than {above:g}")
    if minimum is not None:
        words.append(f"of at least {minimum:g}")
    if maximum is not None:
        words.append(f"of at most {maximum:g}")
    return " and ".join(words)


def number_problem(value: object, *, integer: bool = False, minimum: float | None = None,
                   above: float | None = None, maximum: float | None = None
                   ) -> tuple[float | int | None, str | None]:
    """(the number, None) or (None, why it is refused): the words after "must be"."""
    kind = "a whole number" if integer else "a finite number"
    rng = _range_words(minimum=minimum, above=above, maximum=maximum)
    want = f"{kind} {rng}".strip()
    shown = repr(value) if isinstance(value, str) else f"{value}"
    n: float | int
    if isinstance(value, bool):
        return None, f"must be {want}, not {shown}"
    if isinstance(value, str):
        text = value.strip()
        try:
            n = int(text, 10) if integer else float(text)
        except ValueError:
            return None, f"must be {want}, not {shown}"
    elif isinstance(value, int) or (isinstance(value, float) and not integer):
        n = value
    else:
        return None, f"must be {want}, not {shown}"
    if isinstance(n, float) and not math.isfinite(n):
        return None, f"must be {want}, not {shown}"
    if ((above is not None and not n > above) or (minimum is not None and not n >= minimum)
            or (maximum is not None and not n <= maximum)):
        return None, f"must be {want}, not {shown}"
    return n, None


def number(value: object, what: str, *, integer: bool = False, minimum: float | None = None,
           above: float | None = None, maximum: float | None = None) -> float | int:
    """``value`` (text or a number) as a finite number in range; UsageError (exit 2) naming
    ``what`` (e.g. ``--interval``) otherwise."""
    n, why = number_problem(value, integer=integer, minimum=minimum, above=above,
                            maximum=maximum)
    if why is not None or n is None:
        raise UsageError(f"{what} {why}")
    return n


def seconds(value: object, what: str) -> float:
    """A duration that must pass: finite and > 0 (intervals, timeouts, runtimes)."""
    return float(number(value, what, above=0))


def seconds_or_zero(value: object, what: str) -> float:
    """A duration that may be 0 (a ramp, a warm-up): finite and >= 0."""
    return float(number(value, what, minimum=0))


def count(value: object, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number of at least ``minimum``."""
    return int(number(value, what, integer=True, minimum=minimum, maximum=maximum))


def argtype(name: str, *, integer: bool = False, minimum: float | None = None,
            above: float | None = None, maximum: float | None = None
            ) -> Callable[[str], float | int]:
    """An argparse ``type=``: the same check, refused as ``argument --X: must be ...``
    (argparse's usage error, exit 2)."""

    def check(text: str) -> float | int:
        n, why = number_problem(text, integer=integer, minimum=minimum, above=above,
                                maximum=maximum)
        if why is not None or n is None:
            raise argparse.ArgumentTypeError(why)
        return n

    check.__name__ = name
    return check


# ----------------------------------------------------------------------------- text

_BAD_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
_UNNAMED = {"Cc": "a control character", "Cs": "a surrogate", "Co": "private use",
            "Cn": "unassigned"}


def bad_char(text: str) -> str | None:
    """The first character of ``text`` that is a control character (newline, tab, escape,
    DEL, C1), an invisible format character (bidi overrides and isolates, zero-width
    spaces, BOM), a line or paragraph separator, a surrogate or unassigned; shown as
    ``U+XXXX`` (its name when it has one). None when there is none."""
    for ch in text:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            name = unicodedata.name(ch, "") or _UNNAMED.get(unicodedata.category(ch), "")
            return f"U+{ord(ch):04X}" + (f" ({name})" if name else "")
    return None


def plain_text(text: str, what: str) -> str:
    """``text`` when it has no :func:`bad_char`; UsageError naming ``what`` otherwise."""
    ch = bad_char(text)
    if ch is not None:
        raise UsageError(f"{what} {text!r} contains the character {ch}",
                         hint="use printable characters only (no control, newline or bidi "
                              "characters)")
    return text
