"""Process exit codes: a contract automation relies on (docs/cli.md)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    """Done: the requested change was made or the requested data was printed."""

    FAILED = 1
    """Failed: the message on stderr says why; the device state is described there."""

    USAGE = 2
    """Bad usage or bad input (wrong device, malformed value or policy); nothing was changed."""

    UNSAFE = 3
    """Refused as unsafe: the message says why and how to proceed; nothing was changed."""

    ALREADY = 4
    """Already so: the device was already in the requested state; nothing was changed."""

    TIMEOUT = 5
    """Timed out waiting; the message says what state the device was left in."""
