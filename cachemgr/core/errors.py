"""One error hierarchy for the whole library.

Every error carries a message that names the device and says what to do next, and an
exit code (see :class:`cachemgr.core.exitcodes.ExitCode`). The CLI's single top-level handler maps
these to process exit codes; nothing else in the library calls ``sys.exit``.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachemgr.core.exitcodes import ExitCode


class CacheMgrError(Exception):
    """Base of every error cachemgr raises on purpose."""

    exit_code: ExitCode = ExitCode.FAILED
    # the message is one line: a line break in it came from outside (a device path, a name
    # typed with a newline) and is shown as an escape. Errors whose message is built of lines
    # (a program's stderr, a policy's problems) say so and escape what they embed themselves.
    multiline: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class UsageError(CacheMgrError):
    """Bad usage or bad input: a wrong device, a malformed value or config."""

    exit_code = ExitCode.USAGE


class UnsafeError(CacheMgrError):
    """Refused because doing it could lose data or break running VMs."""

    exit_code = ExitCode.UNSAFE


class AlreadyError(CacheMgrError):
    """Already so: nothing was changed (stratis' NoChangeError)."""

    exit_code = ExitCode.ALREADY


class TimeoutExpired(CacheMgrError):
    """A wait ran out of time; the message says what state things were left in."""

    exit_code = ExitCode.TIMEOUT


class StallError(CacheMgrError):
    """Dirty data stopped going down (a bcache drain, a dm-cache flush); the message says what
    the device looked like, and the dirty data stays safe in the cache."""


class KernelFormatError(CacheMgrError):
    """A kernel file or a tool's output did not have a format we know.

    The offending text is part of the message so a bug report carries it.
    """

    def __init__(self, what: str, text: str) -> None:
        super().__init__(f"cannot parse {what}: {text!r}")
        self.what = what
        self.text = text


class SysfsError(CacheMgrError):
    """A read or write under /sys failed (the errno is the kernel's answer)."""

    def __init__(self, path: str, op: str, errno: int | None, strerror: str) -> None:
        super().__init__(f"{op} {path} failed: {strerror}")
        self.path = path
        self.op = op
        self.errno = errno


class CommandError(CacheMgrError):
    """An external program failed: carries argv, exit code and stderr (Open-CAS CasadmError)."""

    multiline = True  # the last lines of the program's stderr, one per line

    def __init__(
        self, argv: Sequence[str], returncode: int | None, stderr: str, *, reason: str = ""
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        detail = reason or (f"exit code {returncode}" if returncode is not None else "failed")
        tail = stderr.strip().splitlines()[-3:] if stderr else []
        msg = f"{self.argv[0]} {detail}: {' '.join(self.argv)}".replace("\n", "\\n")
        if tail:
            msg += "\n  " + "\n  ".join(tail)
        super().__init__(msg)


class CommandNotFound(CommandError):
    """The program is not installed."""

    def __init__(self, argv: Sequence[str]) -> None:
        super().__init__(argv, None, "", reason="is not installed")
        self.hint = "run the set-up (scripts/setup.sh) or install the package that provides it"


class CommandTimeout(CommandError):
    """The program ran past its timeout and was killed."""

    exit_code = ExitCode.TIMEOUT

    def __init__(self, argv: Sequence[str], timeout: float, stderr: str = "") -> None:
        super().__init__(argv, None, stderr, reason=f"timed out after {timeout:g} s")
        self.timeout = timeout


class LabError(CacheMgrError):
    """The lab (the real-kernel guest) could not be set up or booted."""


def require_root(action: str) -> None:
    """Refuse ``action`` before anything is written unless running as root (exit 2). The
    CLI, the TUI and the procedures say the same words."""
    import os

    if os.geteuid() != 0:
        raise UsageError(f"{action} needs root", hint="run it as root (sudo)")


class Cancelled(CacheMgrError):
    """The operator cancelled (the TUI's Cancel, quitting it): raised inside a command at its
    next progress report, so the library's ``finally`` blocks put back what it changed, as
    for Ctrl-C in the CLI."""
