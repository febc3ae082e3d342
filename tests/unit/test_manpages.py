"""The man pages (man/, cachemgr/cli/manpages.py): current with the parser, one per command,
rendered by groff without a warning, and escaped so that help text is never read as roff."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from cachemgr.cli import manpages
from cachemgr.cli.helpdoc import subcommands
from cachemgr.cli.main import build_parser
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.version import version

ROOT = Path(__file__).resolve().parents[2]
MAN = ROOT / "man"
GROFF = shutil.which("groff")
NO_GROFF = "groff is not installed (Debian: groff-base, in scripts/setup.sh's package list)"


def test_man_pages_are_current() -> None:
    pages = manpages.render_all()
    on_disk = {p.name: p.read_text() for p in MAN.glob("*.8")}
    assert set(on_disk) == set(pages), \
        "man/ is stale: .venv/bin/python -m cachemgr.cli.manpages man/"
    for name, page in pages.items():
        assert on_disk[name] == page, \
            f"man/{name} is stale: .venv/bin/python -m cachemgr.cli.manpages man/"


def test_one_page_per_command_and_the_overview_names_them_all() -> None:
    pages = manpages.render_all()
    commands = list(subcommands(build_parser()))
    assert len(commands) > 20
    assert set(pages) == {"cachemgr.8", *(f"cachemgr-{c}.8" for c in commands)}
    overview = pages["cachemgr.8"]
    for c in commands:
        assert f"\\fBcachemgr\\-{c.replace('-', chr(92) + '-')}\\fR(8)" in overview
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "EXIT STATUS",
                    "ENVIRONMENT", "FILES", "SEE ALSO"):
        assert f"\n.SH {section}\n" in overview
    assert f'"cachemgr {version()}"' in overview.splitlines()[1]
    # every exit code of the contract is explained
    assert {int(c) for c in ExitCode} <= set(manpages.EXIT_STATUS)
    # the global options, hidden ones left out
    assert "\\fB\\-\\-version\\fR" in overview
    assert "sysfs" not in overview and "\\-\\-complete" not in overview


def test_a_command_page_has_its_options_and_subcommands() -> None:
    pages = manpages.render_all()
    lab = pages["cachemgr-lab.8"]
    for sub in ("run", "shell", "demo", "setup"):
        assert f".SS cachemgr lab {sub}\n" in lab
    replace = pages["cachemgr-replace-ssd.8"]
    assert "\\fB\\-\\-interim\\-mode\\fR" in replace
    assert "One of: none, writearound, writethrough." in replace
    assert "\\fB\\-\\-stall\\-timeout\\fR \\fIS\\fR" in pages["cachemgr-drain.8"]


def _groff(page: str, device: str = "utf8") -> subprocess.CompletedProcess[str]:
    assert GROFF
    return subprocess.run([GROFF, "-man", "-ww", f"-T{device}", "-P-cbou"], input=page,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(GROFF is None, reason=NO_GROFF)
@pytest.mark.parametrize("name", sorted(p.name for p in MAN.glob("*.8")))
def test_page_renders_without_warnings(name: str) -> None:
    r = _groff((MAN / name).read_text())
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"groff warns on man/{name}:\n{r.stderr}"
    assert "NAME" in r.stdout and "SYNOPSIS" in r.stdout


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db is not installed")
def test_man_reads_the_overview_without_warnings() -> None:
    r = subprocess.run(["man", "--warnings", "-l", str(MAN / "cachemgr.8")],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={"PATH": "/usr/bin:/bin", "MANWIDTH": "80", "LANG": "C.UTF-8"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "cachemgr-replace-ssd(8)" in r.stdout


HOSTILE = [".TH EVIL 1", "'br", "C:\\Windows\\new", "a \\fBbold\\fR try", ".\\\" comment",
           "\\\\ two"]


@pytest.mark.skipif(GROFF is None, reason=NO_GROFF)
@pytest.mark.parametrize("words", HOSTILE)
def test_help_text_is_printed_as_written(words: str) -> None:
    # a backslash, a leading dot or apostrophe in a help string is text, not roff
    p = argparse.ArgumentParser(prog="cachemgr evil", description=words)
    p.add_argument("--opt", metavar="X", help=words)
    p.add_argument("thing", metavar="THING", help=words)
    page = manpages.render_command(p, words)
    r = _groff(page, "ascii")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = " ".join(r.stdout.split())
    # once each: NAME, DESCRIPTION, the argument, the option
    assert out.count(words) >= 4, out


def test_text_guards_roff_requests() -> None:
    assert manpages.text(".TH x") == "\\&.TH x"
    assert manpages.text("'br") == "\\&'br"
    assert manpages.text("a\\b") == "a\\eb"
    assert manpages.text("  spaced\n out ") == "spaced out"
    assert manpages.opt("--stall-timeout") == "\\-\\-stall\\-timeout"


def test_generator_writes_the_pages_and_drops_gone_ones(tmp_path: Path) -> None:
    (tmp_path / "cachemgr-gone.8").write_text("old")
    (tmp_path / "other.8").write_text("not ours")
    assert manpages.main([str(tmp_path)]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert "cachemgr-gone.8" not in names and "other.8" in names
    assert names - {"other.8"} == set(manpages.render_all())
