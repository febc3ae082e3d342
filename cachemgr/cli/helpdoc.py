"""docs/cli.md: every subcommand's --help, generated from the parser (so docs and --help
cannot drift apart; tests/unit/test_docs_cli.py checks the file is current).

    .venv/bin/python -m cachemgr.cli.helpdoc > docs/cli.md
"""

from __future__ import annotations

import argparse
import os

from cachemgr.cli.main import build_parser

WIDTH = "96"


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name ({} when it has none)."""
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def render() -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps to the terminal: fix it for the file
    try:
        parser = build_parser()
        out = ["# cachemgr command reference", "",
               "Generated from the program's own `--help` by `python -m cachemgr.cli.helpdoc` "
               "(a unit test fails when this file is stale). Exit codes: 0 done, 1 failed, "
               "2 usage error (bad input, not root), 3 refused as unsafe, 4 already so, "
               "5 timed out. JSON output: [json.md](json.md); procedures: "
               "[admin-guide.md](admin-guide.md).", ""]

        def walk(p: argparse.ArgumentParser, depth: int) -> None:
            out.extend([f"{'#' * min(depth, 4)} `{p.prog}`", "", "```",
                        p.format_help().rstrip(), "```", ""])
            for sp in subcommands(p).values():
                walk(sp, depth + 1)

        walk(parser, 2)
        return "\n".join(out)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


if __name__ == "__main__":
    print(render())
