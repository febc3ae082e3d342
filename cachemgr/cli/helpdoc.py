"""docs/cli.md: every subcommand's --help, generated from the parser (so docs and --help
cannot drift apart; tests/unit/test_docs_cli.py checks the file is current).

    .venv/bin/python -m cachemgr.cli.helpdoc > docs/cli.md
"""

from __future__ import annotations

import argparse
import os

from cachemgr.cli.main import build_parser

WIDTH = "96"

# the rule of cachemgr/cli/confirm.py, for the reference (the main --help has it short)
CONFIRMATIONS = [
    "The commands that can lose data or disrupt a VM ask before they change anything, the "
    "same way each:",
    "",
    "| command | asks when |",
    "|---|---|",
    "| `remove` | always (a device, its cache, or a cache set with nothing attached) |",
    "| `detach` | the device has a cache to detach |",
    "| `mode` | the mode caches nothing: bcache `none`, dm-cache and LVM `passthrough` |",
    "| `stop-set`, `force-run` | always (after `--i-accept-data-loss`, which they need) |",
    "| `create --force` | a device it would format carries a signature (a filesystem, a "
    "superblock, dm-cache metadata) |",
    "| `invalidate` | the device's cache holds copies (it costs the cache's warmth for it) |",
    "| `vm-cache` | always (a VM's persistent definition) |",
    "| `replace-ssd` | a run (not `--dry-run`, `--list`, `--resume` or `--rollback`) |",
    "| `assemble` | a device of the dm-cache is known by its place only (the boot pass left "
    "it to the admin) |",
    "",
    "1. First every check it can make without acting: the words, the target, root, the "
    "locks, an interrupted procedure. Their refusals (exit 2, 3) and \"already so\" "
    "(exit 4) come before any question.",
    "2. Then the plan on stderr: `cachemgr remove /dev/bcache0 (nothing is changed yet):` "
    "and a line per change it would make (\"would detach ... would stop ...\"), and the "
    "VMs whose disks are on the device.",
    "3. On a terminal (stdin is one): `Go ahead? [y/N]`. Only `y` or `yes` goes on; "
    "anything else, Enter or Ctrl-D is no: exit 3 (refused as unsafe), nothing changed.",
    "4. Without a terminal (a script, cron, ssh without a tty, `</dev/null`): refused, exit "
    "3, nothing changed, with the plan on stderr, unless the command line has `--yes` "
    "(`-y`). With `--yes` nothing is asked and no plan is shown; the output says what was "
    "done.",
    "",
    "`--dry-run` (replace-ssd, autoattach, protect) prints the plan and changes nothing, "
    "with or without `--yes`. A refusal cachemgr can only meet while it acts (bcache refusing "
    "to stop a device that still holds dirty data) comes after the answer, as in the TUI, "
    "whose dialogs ask instead of this prompt. autoattach, protect and udev-event act on "
    "the policy the admin wrote and ask nothing.",
]


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
               "[admin-guide.md](admin-guide.md).", "", "## Confirmations", "",
               *CONFIRMATIONS, ""]

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
