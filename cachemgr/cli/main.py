"""The ``cachemgr`` command line: stdout is data, stderr is diagnostics.

One module per command group (cachemgr/cli/cache.py, lab.py, replace.py, metrics.py,
bench.py, udev.py), each with ``register(subparsers)``; each command parses, calls the command
layer (cachemgr/ops) and renders. Exit codes are :class:`cachemgr.core.exitcodes.ExitCode`;
the one handler in :func:`main` maps the library's errors to them. Every read command has
``--json`` (schema 1, docs/json.md).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import DEFAULT_ROOT
from cachemgr.core.text import printable

log = logging.getLogger("cachemgr")

# The command groups, in the order --help lists them.
GROUPS: list[str] = ["cachemgr.cli.cache", "cachemgr.cli.lab", "cachemgr.cli.replace",
                     "cachemgr.cli.metrics", "cachemgr.cli.bench", "cachemgr.cli.udev"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cachemgr",
        description="Manage bcache and dm-cache devices on a hypervisor.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad usage/input, 3 refused as unsafe, "
               "4 already so, 5 timed out.",
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
        return int(args.func(args))
    except CacheMgrError as exc:
        # the message names devices by what they say of themselves: control characters in
        # a dm name or a label are shown as escapes, not sent to the terminal
        print(f"cachemgr: {printable(exc, newlines=True)}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("cachemgr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
