"""The ``cachemgr`` command line: stdout is data, stderr is diagnostics.

One module per command group (cachemgr/cli/cache.py, lab.py, replace.py, metrics.py,
bench.py, udev.py), each with ``register(subparsers)``; each command parses, calls the command
layer (cachemgr/ops) and renders. Exit codes are :class:`cachemgr.core.exitcodes.ExitCode`;
the one handler in :func:`main` maps the library's errors to them, and an OSError to one
line + hint (exit 1, or 2 when the command line can fix it: see :func:`_os_error`); Ctrl-C,
SIGTERM and SIGHUP to 128 + the signal; a closed stdout to a quiet 141. Every read command
has ``--json`` (schema 1, docs/json.md).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence

from cachemgr.cli import confirm
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.signals import Terminated
from cachemgr.core.sysfs import DEFAULT_ROOT
from cachemgr.core.text import printable

log = logging.getLogger("cachemgr")

# The command groups, in the order --help lists them.
GROUPS: list[str] = ["cachemgr.cli.cache", "cachemgr.cli.lab", "cachemgr.cli.replace",
                     "cachemgr.cli.metrics", "cachemgr.cli.bench", "cachemgr.cli.udev",
                     "cachemgr.cli.scheduler", "cachemgr.cli.vms", "cachemgr.cli.sizing",
                     "cachemgr.cli.install"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cachemgr",
        description="Manage bcache and dm-cache devices on a hypervisor.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad usage/input, 3 refused as unsafe, "
               "4 already so, 5 timed out; stopped by a signal: 130 SIGINT (Ctrl-C), "
               "143 SIGTERM, 129 SIGHUP (what a drain or flush changed is put back); "
               "141 stdout closed early (a pipe's reader left). " + confirm.RULE,
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log on stderr")
    p.add_argument("--sysfs-root", default=os.environ.get("CACHEMGR_SYSFS", DEFAULT_ROOT),
                   help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    for name in GROUPS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="cachemgr: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        rc = int(args.func(args))
        sys.stdout.flush()  # here, not at exit, so a closed pipe is caught below
        return rc
    except CacheMgrError as exc:
        # the message names devices by what they say of themselves: control characters in
        # a dm name or a label are shown as escapes, not sent to the terminal
        print(f"cachemgr: {_error_text(exc)}", file=sys.stderr)
        return int(exc.exit_code)
    except Terminated as exc:  # SIGTERM/SIGHUP in a drain or a flush (core/signals.py)
        # the procedure's finally blocks have put back what it changed (tunables, tables),
        # as for Ctrl-C; 128 + the signal's number, as a shell reports a killed process
        print(f"cachemgr: terminated by {exc.name}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cachemgr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if not _stdout_closed():
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
        return _os_error(exc, args)


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
    if hint and path:
        print(f"  hint: {hint.format(path=path)}", file=sys.stderr)
    denied = exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0
    named = path is not None and exc.errno in _PATH_ERRNOS \
        and os.path.abspath(path) in _user_paths(args)
    return int(ExitCode.USAGE if denied or named else ExitCode.FAILED)


if __name__ == "__main__":
    sys.exit(main())
