"""The ``cachemgr`` command line: stdout is data, stderr is diagnostics.

One module per command group (cachemgr/cli/cache.py, lab.py, replace.py, metrics.py,
bench.py, udev.py), each with ``register(subparsers)``; each command parses, calls the command
layer (cachemgr/ops) and renders. Exit codes are :class:`cachemgr.core.exitcodes.ExitCode`;
the one handler in :func:`main` maps the library's errors to them, and an OSError to one
line + hint (exit 1, or 2 when the command line can fix it: see :func:`_os_error`); Ctrl-C,
SIGTERM and SIGHUP to 128 + the signal; a closed stdout to a quiet 141. Every read command
has ``--json`` (schema 1, docs/json.md).

Startup: every command imports only what it uses. Building the parser imports the command
group modules and light modules only (the standard library, cachemgr.core's parsing and
text helpers, cachemgr/core/defaults.py for the choices, defaults and help text the
command layer also uses). The command layer (cachemgr.ops, cachemgr.procedures,
cachemgr.backends) is imported when a handler first uses it, with one pattern everywhere::

    if TYPE_CHECKING:
        from cachemgr.ops import cache as cache_ops
    else:
        cache_ops = lazy("cachemgr.ops.cache")

(cachemgr/core/lazy.py: reading an attribute imports the module), so handlers read
``cache_ops.status(...)`` as before and mypy checks them against the real module. A name
used only in annotations comes from the ``TYPE_CHECKING`` import alone; a class called at
run time is reached through its module (``control.Control(...)``). ``--version`` reads the
version only when given (:class:`VersionAction`). :func:`main` builds the parser of the
command given alone (:func:`build_parser` ``only``; tests/unit/test_parser_only.py checks
it reads every command line as the whole parser does). tests/unit/test_lazy_imports.py fails if
building the parser imports the command layer again.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from cachemgr.cli import confirm
from cachemgr.cli.complete import KINDS as COMPLETE_KINDS
from cachemgr.cli.complete import CompleteAction
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.lazy import lazy
from cachemgr.core.signals import Terminated
from cachemgr.core.sysfs import DEFAULT_ROOT
from cachemgr.core.text import printable

if TYPE_CHECKING:
    from cachemgr.ops import trail
else:  # the command layer: imported when the command runs (the docstring above)
    trail = lazy("cachemgr.ops.trail")

log = logging.getLogger("cachemgr")

# The command groups, in the order --help lists them.
GROUPS: list[str] = ["cachemgr.cli.cache", "cachemgr.cli.lab", "cachemgr.cli.replace",
                     "cachemgr.cli.metrics", "cachemgr.cli.bench", "cachemgr.cli.udev",
                     "cachemgr.cli.scheduler", "cachemgr.cli.vms", "cachemgr.cli.sizing",
                     "cachemgr.cli.install", "cachemgr.cli.restore", "cachemgr.cli.warm",
                     "cachemgr.cli.doctor", "cachemgr.cli.snapshot", "cachemgr.cli.governor"]


class VersionAction(argparse.Action):
    """``--version``: prints ``cachemgr VERSION`` and exits 0, as argparse's own "version"
    action does, but reads the version (cachemgr/core/version.py: pyproject.toml or the
    installed metadata) only when the option is given, not each time the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> NoReturn:
        from cachemgr.core.version import version

        print(f"cachemgr {version()}")
        parser.exit()


class _Skipped:
    """What a group's ``register`` gets back for a command it adds that is not the one being
    run (:func:`build_parser` with ``only``): every call on it, and on what that returns, does
    nothing, so no parser, option or help text is built for it."""

    def __getattr__(self, name: str) -> Any:
        return self._nothing

    def __setattr__(self, name: str, value: Any) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(())

    def _nothing(self, *args: Any, **kwargs: Any) -> _Skipped:
        return self


class _OnlyOne:
    """The subparsers action as the groups' ``register`` see it when only the command
    ``name`` is run: its parser is built as in the full parser, the others are skipped."""

    def __init__(self, sub: Any, name: str) -> None:
        self._sub = sub
        self._name = name

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name == self._name:
            return self._sub.add_parser(name, **kwargs)
        return _Skipped()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sub, name)


def command_word(argv: Sequence[str]) -> str | None:
    """The command an argument list runs (``status`` in ``-v status --json``), when only the
    options before it that cannot change which parser reads the rest come first
    (``-v``... and ``--sysfs-root``); None for anything else (``--help``, ``--complete``,
    ``--version``, an abbreviated option, no command): those get the whole parser."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--sysfs-root":
            i += 2
            continue
        if word == "--verbose" or word.startswith("--sysfs-root=") or (
                len(word) > 1 and word.strip("v") == "-"):
            i += 1
            continue
        return None if word.startswith("-") else word
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``only`` (a command's name), the parser of that
    command alone under the same top level: the others' parsers are not built (a third of
    a command's start in the UML lab: 48 parsers, 340 options). It parses ``only``'s
    command lines as the whole parser does; :func:`main` builds the whole one whenever the
    command is not one it has (its error lists them all), and for --help, --complete and
    --version."""
    p = argparse.ArgumentParser(
        prog="cachemgr",
        description="Manage bcache and dm-cache devices on a hypervisor.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad usage/input, 3 refused as unsafe, "
               "4 already so, 5 timed out; stopped by a signal: 130 SIGINT (Ctrl-C), "
               "143 SIGTERM, 129 SIGHUP (what a drain or flush changed is put back); "
               "141 stdout closed early (a pipe's reader left). " + confirm.RULE,
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log on stderr")
    p.add_argument("--version", action=VersionAction, help="print cachemgr's version and exit")
    p.add_argument("--sysfs-root", default=os.environ.get("CACHEMGR_SYSFS", DEFAULT_ROOT),
                   help=argparse.SUPPRESS)
    # the shell completion's helper (cachemgr/cli/completion.py): hidden, read-only
    p.add_argument("--complete", action=CompleteAction, choices=sorted(COMPLETE_KINDS),
                   help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    groups = sub if only is None else _OnlyOne(sub, only)
    for name in GROUPS:
        importlib.import_module(name).register(groups)
    return p


def _commands(parser: argparse.ArgumentParser) -> Sequence[str]:
    """The command names ``parser`` has."""
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name in a.choices]


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    only = command_word(words)
    parser = build_parser(only)
    if only is not None and only not in _commands(parser):
        parser = build_parser()
    args = parser.parse_args(words)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="cachemgr: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    # the journal trail of what the command changed (cachemgr/ops/trail.py): written when
    # the command ends, with its exit code and its error
    with trail.command(args.cmd, target=_target_words(args),
                       plan=bool(getattr(args, "dry_run", False))) as frame:
        frame.exit = _run(args, frame)
        return frame.exit


def _run(args: argparse.Namespace, frame: trail.Frame) -> int:
    """The command, its errors mapped to exit codes (and, with --json, to a JSON document on
    stdout: docs/json.md, "Errors and already so"); ``frame`` gets the error."""
    try:
        rc = int(args.func(args))
        sys.stdout.flush()  # here, not at exit, so a closed pipe is caught below
        return rc
    except CacheMgrError as exc:
        frame.error = exc
        # the message names devices by what they say of themselves: control characters in
        # a dm name or a label are shown as escapes, not sent to the terminal
        print(f"cachemgr: {_error_text(exc)}", file=sys.stderr)
        _json_error(args, int(exc.exit_code), exc.message, exc.hint)
        return int(exc.exit_code)
    except Terminated as exc:  # SIGTERM/SIGHUP in a drain or a flush (core/signals.py)
        frame.error = exc
        # the procedure's finally blocks have put back what it changed (tunables, tables),
        # as for Ctrl-C; 128 + the signal's number, as a shell reports a killed process
        print(f"cachemgr: terminated by {exc.name}", file=sys.stderr)
        _json_error(args, exc.exit_code, f"terminated by {exc.name}", None)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        frame.error = exc
        print("cachemgr: interrupted", file=sys.stderr)
        _json_error(args, 130, "interrupted", None)
        return 130
    except BrokenPipeError as exc:
        if not _stdout_closed():
            frame.error = exc
            return _os_error(exc, args)
        # the reader of stdout went away (`status --json | head -c1`): stop quietly as a C
        # tool killed by SIGPIPE would, and with its status, 128 + SIGPIPE = 141, so a
        # pipeline under `set -o pipefail` sees the same as for any other tool. stdout goes
        # to /dev/null so the interpreter's flush at exit does not fail a second time.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return BROKEN_PIPE
    except OSError as exc:
        frame.error = exc
        return _os_error(exc, args)


# the words of each exit code in a JSON error document's "kind"
ERROR_KINDS: dict[int, str] = {
    ExitCode.FAILED: "failed", ExitCode.USAGE: "usage", ExitCode.UNSAFE: "unsafe",
    ExitCode.ALREADY: "already", ExitCode.TIMEOUT: "timeout", 129: "terminated",
    130: "interrupted", 143: "terminated"}


def _json_error(args: argparse.Namespace, code: int, message: str, hint: str | None) -> None:
    """With --json, the error as a JSON document on stdout (the words stay on stderr): "already
    so" (exit 4) as ``{"schema": 1, "already": true, "message": ...}``, any other as
    ``{"schema": 1, "error": {"code", "kind", "message", "hint"}}``. The text is exact (JSON
    escapes control characters itself)."""
    if not getattr(args, "json", False):
        return
    if code == ExitCode.ALREADY:
        doc: dict[str, object] = {"schema": 1, "already": True, "message": message}
    else:
        doc = {"schema": 1, "error": {"code": code, "kind": ERROR_KINDS.get(code, "failed"),
                                      "message": message, "hint": hint}}
    with contextlib.suppress(OSError, ValueError):  # a closed stdout: the code still says it
        print(json.dumps(doc), flush=True)


def _target_words(args: argparse.Namespace) -> str | None:
    """What the command line names as the object acted on (the journal trail's target of a
    refusal that came before the gate)."""
    for name in ("target", "backing", "cache", "device", "devices", "domain"):
        v = getattr(args, name, None)
        if isinstance(v, list):
            v = ", ".join(str(x) for x in v)
        if isinstance(v, str) and v:
            return v
    return None


BROKEN_PIPE = 128 + signal.SIGPIPE  # 141


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone (poll says POLLERR)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return any(ev & select.POLLERR for _, ev in p.poll(0))


# errnos that say the path itself cannot be used (name another one), as opposed to the
# filesystem or the device failing under a good path (ENOSPC, EIO: exit 1)
_PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP}

_HINTS = {
    errno.EACCES: "run it as root (sudo), or check the permissions of {path}",
    errno.EPERM: "run it as root (sudo), or check the permissions of {path}",
    errno.EROFS: "{path} is on a read-only filesystem: remount it read-write or use "
                 "another path",
    errno.ENOSPC: "free space on the filesystem holding {path}",
    errno.EDQUOT: "free space on the filesystem holding {path} (a quota is exhausted)",
    errno.ENOENT: "check the path: {path} (or its directory) does not exist",
    errno.ENOTDIR: "check the path: a part of {path} is not a directory",
    errno.EIO: "the device holding {path} fails IO: see dmesg",
}


def _user_paths(args: argparse.Namespace) -> set[str]:
    """Every path the command line named (option values and arguments), made absolute."""
    out: set[str] = set()
    for v in vars(args).values():
        for s in v if isinstance(v, list) else [v]:
            if isinstance(s, str) and s:
                out.add(os.path.abspath(s))
    return out


def _error_text(exc: CacheMgrError) -> str:
    """The message (one line unless its class is built of lines: ``multiline``) and the hint
    line; a line break that came from outside (a path or a name typed with a newline) is
    shown as ``\\n``, so the message stays one line and the hint the one after it."""
    text = printable(exc.message, newlines=exc.multiline)
    if exc.hint:
        text += f"\n  hint: {printable(exc.hint)}"
    return text


def _os_error(exc: OSError, args: argparse.Namespace) -> int:
    """One line for an OSError the library did not turn into a CacheMgrError: what failed and
    the kernel's words, a hint, and an exit code.

    Exit 2 (bad usage or input) when the command line can fix it: the failing path is one the
    user named (``metrics --textfile /no/such/dir/x.prom``) and the errno is about the path
    (:data:`_PATH_ERRNOS`), or a permission was denied to a user who is not root (the
    contract's "not root", as require_root says it). Exit 1 (failed) otherwise: the state
    directory /var/lib/cachemgr on a full or read-only filesystem, an IO error, anything
    else the host has to fix."""
    path = exc.filename if isinstance(exc.filename, str) else None
    what = path or "error"
    if exc.filename2:
        what += f" -> {exc.filename2}"
    strerror = exc.strerror or str(exc)
    print(f"cachemgr: {what}: {strerror}", file=sys.stderr)
    hint = _HINTS.get(exc.errno or 0)
    hint = hint.format(path=path) if hint and path else None
    if hint:
        print(f"  hint: {hint}", file=sys.stderr)
    denied = exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0
    named = path is not None and exc.errno in _PATH_ERRNOS \
        and os.path.abspath(path) in _user_paths(args)
    code = int(ExitCode.USAGE if denied or named else ExitCode.FAILED)
    _json_error(args, code, f"{what}: {strerror}", hint)
    return code


if __name__ == "__main__":
    sys.exit(main())
