"""Man pages in roff (man(7) macros), generated from the parser docs/cli.md is generated from:
cachemgr(8), the overview (every command, the global options, exit status, environment,
files), and one page per command, cachemgr-COMMAND(8) (its subcommands as sections).

    .venv/bin/python -m cachemgr.cli.manpages man/

tests/unit/test_manpages.py fails when man/ is stale, and renders each page with groff's
warnings on. Every text line goes through :func:`text`, so a backslash, or a leading dot or
apostrophe in a help string, is printed as itself and never read as a roff request.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from cachemgr.cli.helpdoc import WIDTH, subcommands
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.safefs import DEFAULT_DMCACHE_DIR, DEFAULT_STATE_DIR
from cachemgr.core.version import version
from cachemgr.ops.udev import DEFAULT_POLICY

SECTION = "8"
MANUAL = "System Administration"

EXIT_STATUS: dict[int, str] = {
    ExitCode.OK: "Done: the change was made, or the data asked for was printed.",
    ExitCode.FAILED: "Failed: the message on standard error says why and the state the "
                     "device was left in.",
    ExitCode.USAGE: "Bad usage or input (a wrong device, a malformed value or policy, not "
                    "root); nothing was changed.",
    ExitCode.UNSAFE: "Refused as unsafe: the message says why and how to proceed; nothing "
                     "was changed.",
    ExitCode.ALREADY: "Already so: the device was already in the state asked for; nothing "
                      "was changed.",
    ExitCode.TIMEOUT: "Timed out waiting; the message says the state the device was left "
                      "in.",
    129: "Stopped by SIGHUP; what a drain or flush changed was put back.",
    130: "Stopped by SIGINT (Ctrl-C); what a drain or flush changed was put back.",
    141: "Standard output was closed early (the reader of a pipe left).",
    143: "Stopped by SIGTERM; what a drain or flush changed was put back.",
}

ENVIRONMENT = {
    "CACHEMGR_POLICY": f"The policy file (default {DEFAULT_POLICY}).",
    "CACHEMGR_STATE_DIR": f"The state directory (default {DEFAULT_STATE_DIR}): locks, "
                          "journals of interrupted procedures, settings to put back.",
    "CACHEMGR_DMCACHE_DIR": f"Where dm-cache devices are recorded (default "
                            f"{DEFAULT_DMCACHE_DIR}).",
    "CACHEMGR_BENCH_DIR": "Where bench saves its results (default "
                          "/var/lib/cachemgr/bench; --out overrides it).",
    "CACHEMGR_LIBVIRT_URI": "The libvirt connection whose VMs are shown (default "
                            "qemu:///system; --connect overrides it).",
    "COLUMNS": "The width tables may fill (else the terminal's; no limit in a pipe).",
}

FILES = {
    DEFAULT_POLICY: "The policy: which disks autoattach caches, protect, metrics.",
    DEFAULT_STATE_DIR: "State: locks, journals of interrupted procedures (replace-ssd, "
                       "drain, bench), settings to put back.",
    DEFAULT_DMCACHE_DIR: "One record per dm-cache device cachemgr created, to assemble it "
                         "again.",
}

SEE_ALSO = ["make-bcache(8)", "bcache-super-show(8)", "dmsetup(8)", "lvmcache(7)",
            "virsh(1)", "fio(1)"]


# ----------------------------------------------------------------------------- roff


def esc(s: str) -> str:
    """``s`` for the inside of a roff line: a backslash printed as one, a hyphen as
    itself (``\\-`` in option names, so they can be searched for and copied)."""
    return " ".join(s.split()).replace("\\", "\\e")


def opt(s: str) -> str:
    """An option or command name: hyphens as ``\\-`` (the minus sign man pages use)."""
    return esc(s).replace("-", "\\-")


def text(s: str) -> str:
    """A text line: escaped, and guarded with ``\\&`` when it would start with a dot or an
    apostrophe (roff's request characters)."""
    line = esc(s)
    return "\\&" + line if line.startswith((".", "'")) else line


def _expand(p: argparse.ArgumentParser, a: argparse.Action) -> str:
    return p._get_formatter()._expand_help(a) if a.help else ""


def _usage(p: argparse.ArgumentParser) -> str:
    return " ".join(p.format_usage().split()).removeprefix("usage: ")


def _visible(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._SubParsersAction)]


def _subhelps(p: argparse.ArgumentParser) -> dict[str, str]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return {c.dest: c.help or "" for c in a._choices_actions}
    return {}


def _metavar(a: argparse.Action) -> str:
    if a.metavar is not None:
        return str(a.metavar)
    if a.choices is not None:
        return "{" + ",".join(str(c) for c in a.choices) + "}"
    return a.dest.upper()


def _arguments(p: argparse.ArgumentParser, heading: str) -> Iterator[str]:
    """The positional arguments and the options of ``p``, as .TP paragraphs."""
    actions = _visible(p)
    pos = [a for a in actions if not a.option_strings]
    opts = [a for a in actions if a.option_strings]
    if pos:
        yield f"{heading} ARGUMENTS"
        for a in pos:
            yield ".TP"
            yield f"\\fI{esc(_metavar(a))}\\fR"
            yield text(_describe(p, a))
    if opts:
        yield f"{heading} OPTIONS"
        for a in opts:
            names = ", ".join(f"\\fB{opt(o)}\\fR" for o in a.option_strings)
            if a.nargs != 0:
                names += f" \\fI{esc(_metavar(a))}\\fR"
            yield ".TP"
            yield names
            yield text(_describe(p, a))


def _describe(p: argparse.ArgumentParser, a: argparse.Action) -> str:
    """An argument's help, with its choices and its default when the help does not say
    them (the man page says what --help leaves to the usage line)."""
    words = _expand(p, a)
    if not words and a.option_strings == ["--json"]:
        words = "machine-readable output (JSON)"
    extra = []
    if a.choices is not None:
        extra.append(f"One of: {', '.join(map(str, a.choices))}.")
    d = a.default
    if a.nargs != 0 and d not in (None, False, argparse.SUPPRESS) and "default" not in words:
        unit = " seconds" if a.metavar in ("S", "SECONDS") else ""
        extra.append(f"Default: {d:g}{unit}." if isinstance(d, float) else f"Default: {d}{unit}.")
    return " ".join([w for w in (words.rstrip(), *extra) if w])


def _synopsis(p: argparse.ArgumentParser) -> Iterator[str]:
    usage = _usage(p)
    rest = usage.removeprefix(p.prog).strip() if usage.startswith(p.prog) else \
        usage.partition(" ")[2]
    yield f".B {opt(p.prog)}"
    if rest:
        yield text(rest)


def _paragraphs(s: str | None) -> Iterator[str]:
    if not s:
        return
    for i, para in enumerate(s.split("\n\n")):
        if i:
            yield ".PP"
        yield text(para)


def _command(p: argparse.ArgumentParser, help_: str, level: int) -> Iterator[str]:
    """A command's description, arguments and options; its subcommands after it."""
    if level:
        yield f".SS {opt(p.prog)}"
        yield from _synopsis(p)
        yield ".PP"
    else:
        yield ".SH DESCRIPTION"
    yield from _paragraphs(p.description or help_)
    if p.epilog:
        yield ".PP"
        yield from _paragraphs(p.epilog)
    # within a subcommand's section: bold lead-ins, not section headings
    yield from _arguments(p, ".SH" if level == 0 else ".PP\n.B")
    subs = subcommands(p)
    if subs:
        helps = _subhelps(p)
        yield ".SH COMMANDS" if level == 0 else ".PP"
        for name, sp in subs.items():
            yield from _command(sp, helps.get(name, ""), level + 1)


def _th(name: str) -> str:
    return f'.TH {opt(name.upper())} {SECTION} "" "cachemgr {esc(version())}" "{MANUAL}"'


def _page_name(prog: str) -> str:
    return prog.replace(" ", "-")


def render_command(p: argparse.ArgumentParser, help_: str) -> str:
    name = _page_name(p.prog)
    lines = [
        '.\\" Generated by python -m cachemgr.cli.manpages from the parser: do not edit',
        _th(name),
        ".SH NAME",
        f"{opt(name)} \\- {esc(help_ or p.description or '')}",
        ".SH SYNOPSIS",
        *_synopsis(p),
        *_command(p, help_, 0),
        ".PP",
        "Global options, given before the command: see \\fBcachemgr\\fR(8).",
        ".SH EXIT STATUS",
        "See \\fBcachemgr\\fR(8).",
        ".SH SEE ALSO",
        "\\fBcachemgr\\fR(8)",
        "",
    ]
    return "\n".join(lines)


def render_overview(parser: argparse.ArgumentParser) -> str:
    helps = _subhelps(parser)
    lines = [
        '.\\" Generated by python -m cachemgr.cli.manpages from the parser: do not edit',
        _th("cachemgr"),
        ".SH NAME",
        f"cachemgr \\- {esc(parser.description or '')}",
        ".SH SYNOPSIS",
        ".B cachemgr",
        "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGUMENTS\\fR]",
        ".SH DESCRIPTION",
        text("cachemgr manages the bcache, dm-cache and LVM caches of a hypervisor: it "
             "shows them, switches their modes, drains, attaches, detaches, creates and "
             "removes them, replaces a failing cache SSD, benchmarks and sizes caches, and "
             "attaches caches to hot-plugged disks by policy. Each command is described in "
             "its own page, cachemgr-COMMAND(8), and by cachemgr COMMAND --help."),
        ".PP",
        text("Standard output carries data, standard error diagnostics. Every read command "
             "has --json (schema 1)."),
        *_arguments(parser, ".SH"),
        ".SH COMMANDS",
    ]
    for name, sp in subcommands(parser).items():
        lines += [".TP", f"\\fB{opt(_page_name(sp.prog))}\\fR({SECTION})",
                  text(helps.get(name, "") or sp.description or "")]
    lines.append(".SH EXIT STATUS")
    for code, words in EXIT_STATUS.items():
        lines += [".TP", f"\\fB{int(code)}\\fR", text(words)]
    lines.append(".SH ENVIRONMENT")
    for var, words in ENVIRONMENT.items():
        lines += [".TP", f"\\fB{var}\\fR", text(words)]
    lines.append(".SH FILES")
    for path, words in FILES.items():
        lines += [".TP", f"\\fI{opt(path)}\\fR", text(words)]
    see = [f"\\fB{opt(_page_name(sp.prog))}\\fR({SECTION})"
           for sp in subcommands(parser).values()]
    see += [f"\\fB{opt(s.split('(')[0])}\\fR({s.split('(')[1]}" for s in SEE_ALSO]
    lines += [".SH SEE ALSO", ",\n".join(see), ""]
    return "\n".join(lines)


def render_all() -> dict[str, str]:
    """Every page by file name (``cachemgr.8``, ``cachemgr-status.8``, ...)."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps usage to the terminal: fix it
    try:
        from cachemgr.cli.main import build_parser

        parser = build_parser()
        pages = {f"cachemgr.{SECTION}": render_overview(parser)}
        helps = _subhelps(parser)
        for name, sp in subcommands(parser).items():
            pages[f"{_page_name(sp.prog)}.{SECTION}"] = render_command(sp, helps.get(name, ""))
        return pages
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m cachemgr.cli.manpages DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    pages = render_all()
    for old in out.glob(f"cachemgr*.{SECTION}"):
        if old.name not in pages:  # a command that went: its page goes too
            old.unlink()
    for name, page in pages.items():
        (out / name).write_text(page)
    print(f"{len(pages)} pages in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
