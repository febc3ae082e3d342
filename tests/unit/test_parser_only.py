"""The parser built for the command being run (cachemgr/cli/main.py ``build_parser(only)``)
reads every command line as the whole parser does: the same namespace, or the same error
and exit status, and the same --help; ``main`` builds the whole parser for what is not one
command's line (``--help``, ``--complete``, a typo)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence

import pytest

from cachemgr.cli import main as cli
from cachemgr.cli.helpdoc import subcommands

FULL = cli.build_parser()
NAMES = sorted(subcommands(FULL))


def _lines() -> list[list[str]]:
    """Command lines for every command: the documented ones (test_docs_cli reads the same
    docs), each command's --help and bare name, and some that fail."""
    from tests.unit.test_docs_cli import CASES

    out = [w for _, _, w in CASES if w and w[0] in NAMES]
    for name in NAMES:
        out += [[name], [name, "--help"], [name, "--json"], [name, "--no-such-option"],
                ["-v", name, "x", "y"], ["--sysfs-root", "/nonexistent", name, "--json"]]
    return out


LINES = _lines()


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: object = vars(parser.parse_args(argv))
        except SystemExit as exc:
            result = ("exit", exc.code)
    return result, out.getvalue(), err.getvalue()


def test_the_lines_cover_every_command() -> None:
    assert len(NAMES) > 30 and {cli.command_word(w) for w in LINES} == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_one_commands_parser_reads_its_lines_as_the_whole_one(name: str) -> None:
    one = cli.build_parser(name)
    assert list(cli._commands(one)) == [name]
    lines = [w for w in LINES if cli.command_word(w) == name]
    assert len(lines) >= 6
    for argv in lines:
        assert _parse(one, argv) == _parse(FULL, argv), argv


@pytest.mark.parametrize("argv", [["--help"], [], ["--complete", "targets"], ["--version"],
                                  ["--verb", "status"], ["-h", "status"], ["--", "status"],
                                  ["--sysfs-root"]])
def test_the_whole_parser_for_what_names_no_command_first(argv: list[str]) -> None:
    assert cli.command_word(argv) is None


def test_a_word_that_is_no_command_gets_the_whole_parsers_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.command_word(["statuss"]) == "statuss"
    with pytest.raises(SystemExit) as exc:
        cli.main(["statuss"])
    assert exc.value.code == 2
    assert "invalid choice: 'statuss' (choose from 'status', 'mode'" in capsys.readouterr().err
