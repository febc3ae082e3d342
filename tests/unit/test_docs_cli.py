"""The docs and `--help` agree: every `cachemgr ...` command line the docs show names a real
subcommand, and every `--option` on it is one that subcommand's --help lists."""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

import pytest

from cachemgr.cli.helpdoc import subcommands as subparsers
from cachemgr.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "udev" / "README.md", ROOT / "systemd" / "README.md"]
# a command line: "cachemgr" then words, up to the end of an inline code span, a table cell,
# a shell comment, a pipe or "&&"
LINE = re.compile(r"(?:^|[\s`(/])cachemgr((?:\s+[^\s`|#;&)]+)+)")


def options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def documented() -> list[tuple[str, int, list[str]]]:
    found = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in LINE.finditer(line):
                words = m.group(1).split()
                if "--" in words:  # "lab run ... -- CMD": what follows is the guest's
                    words = words[:words.index("--")]
                found.append((f"{path.relative_to(ROOT)}:{n}", n, words))
    return found


CASES = documented()


def test_the_docs_show_many_command_lines() -> None:
    # the scanner finds them (a broken pattern would make the test below vacuous)
    assert len(CASES) > 40
    assert any(w[:1] == ["replace-ssd"] for _, _, w in CASES)


@functools.cache
def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """cachemgr's parser and its subcommands, built once for the ~600 cases below (a build
    is 10-20 ms; nothing here changes it)."""
    parser = build_parser()
    return parser, subparsers(parser)


@pytest.mark.parametrize("where,n,words", CASES, ids=[c[0] for c in CASES])
def test_documented_command_line_matches_help(where: str, n: int, words: list[str]) -> None:
    parser, sub = _parser()
    if not words or not re.fullmatch(r"[a-z][a-z-]*", words[0]) or words[0] not in sub:
        # prose ("cachemgr is ...", "cachemgr's") or a path, not a command line; but a word
        # that looks like a subcommand in code must be one
        assert not (words and re.fullmatch(r"[a-z]+-[a-z-]+", words[0])), \
            f"{where}: no subcommand {words[0]!r}"
        return
    p = sub[words[0]]
    rest = words[1:]
    while rest and subparsers(p) and rest[0] in subparsers(p):
        p = subparsers(p)[rest[0]]
        rest = rest[1:]
    known = options(p) | options(parser)
    for w in rest:
        opt = w.strip("[]").split("=")[0].rstrip(",")
        if opt.startswith("--") and len(opt) > 2:
            assert opt in known, f"{where}: {p.prog} has no option {opt} (see its --help)"


def test_cli_reference_is_current() -> None:
    from cachemgr.cli import helpdoc

    current = (ROOT / "docs" / "cli.md").read_text()
    assert current.rstrip("\n") == helpdoc.render().rstrip("\n"), \
        "docs/cli.md is stale: .venv/bin/python -m cachemgr.cli.helpdoc > docs/cli.md"
