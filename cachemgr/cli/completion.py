"""Shell completion for bash and zsh, generated from the parser (commands, subcommands,
options, the choices of options that have them), and the hidden helper the scripts call for
device arguments, ``cachemgr --complete KIND`` (cachemgr/cli/complete.py).

    .venv/bin/python -m cachemgr.cli.completion completion/

writes completion/cachemgr.bash and completion/_cachemgr (tests/unit/test_completion.py fails
when they are stale). Every word a script prints is quoted by it (bash: ``printf %q``; zsh:
``compadd``), and the words that come from the host are never expanded by the shell: a device
name is data, not a shell word.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# an argument's metavar -> what completes it: a --complete kind, or files / directories
_BY_METAVAR = {
    "TARGET": "targets", "BACKING": "backings", "CACHE": "caches",
    "DEV": "disks", "DEVICE": "disks",
    "PATH": "@files", "FILE": "@files", "RESULT.json": "@files", "DIR": "@dirs",
}
# commands that make a new cache: their disks are the free ones
_FRESH = {"create", "replace-ssd"}


@dataclass
class Arg:
    """What completes a value: ``choices`` (words), or ``kind`` (a --complete kind, or
    ``@files``/``@dirs``), or nothing."""

    choices: tuple[str, ...] = ()
    kind: str = ""
    repeats: bool = False  # a positional taking one or more (the last one repeats)


@dataclass
class Node:
    path: tuple[str, ...]
    help: str = ""
    subs: dict[str, str] = field(default_factory=dict)  # subcommand -> its help line
    options: dict[str, tuple[str, Arg | None]] = field(default_factory=dict)  # -> help, value
    positionals: list[Arg] = field(default_factory=list)


def _arg(action: argparse.Action, path: tuple[str, ...]) -> Arg:
    if action.choices is not None:
        return Arg(choices=tuple(str(c) for c in action.choices))
    kind = _BY_METAVAR.get(str(action.metavar or ""), "")
    if kind == "disks" and path and path[0] in _FRESH:
        kind = "free"
    return Arg(kind=kind)


def nodes(parser: argparse.ArgumentParser) -> list[Node]:
    """Every command of the parser (the top level first), as completion needs it. Hidden
    options (help=SUPPRESS) are left out."""
    out: list[Node] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...], help_: str) -> None:
        node = Node(path, help_)
        out.append(node)
        children: list[tuple[str, argparse.ArgumentParser, str]] = []
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                helps = {c.dest: c.help or "" for c in a._choices_actions}
                for name, sp in a.choices.items():
                    node.subs[name] = helps.get(name, "")
                    children.append((name, sp, helps.get(name, "")))
            elif a.help == argparse.SUPPRESS:
                continue
            elif a.option_strings:
                value = None if a.nargs == 0 else _arg(a, path)
                for o in a.option_strings:
                    node.options[o] = (_one_line(a.help or ""), value)
            else:
                arg = _arg(a, path)
                if a.nargs == argparse.REMAINDER:
                    arg = Arg()  # `lab run -- COMMAND`: the guest's command line
                arg.repeats = a.nargs in ("+", "*", argparse.REMAINDER)
                node.positionals.append(arg)
        for name, sp, h in children:
            walk(sp, (*path, name), h)

    walk(parser, (), parser.description or "")
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------- the scripts


def _q(word: str) -> str:
    """One shell word, single-quoted (bash and zsh read it the same)."""
    return "'" + word.replace("'", "'\\''") + "'"


def _words(words: Sequence[str]) -> str:
    return " ".join(_q(w) for w in words)


def _key(path: tuple[str, ...]) -> str:
    return _q(" ".join(path))


def _spec_cases(arg: Arg | None) -> str:
    """The shell assignments that say how a value completes (both shells)."""
    if arg is None or not (arg.choices or arg.kind):
        return "spec=none"
    if arg.choices:
        return f"spec=words; vals=({_words(arg.choices)})"
    if arg.kind == "@files":
        return "spec=files"
    if arg.kind == "@dirs":
        return "spec=dirs"
    return f"spec=host; vals=({_q(arg.kind)})"


def _tables(all_nodes: list[Node]) -> list[str]:
    """The data functions both scripts share (bash and zsh read this subset alike)."""
    out = ["_cachemgr_node() {", "    # $1: the command path; sets subs, opts and vopts "
           "(the options taking a value)", "    case $1 in"]
    for n in all_nodes:
        vopts = [o for o, (_, v) in n.options.items() if v is not None]
        out.append(f"    {_key(n.path)}) subs=({_words(list(n.subs))}); "
                   f"opts=({_words(list(n.options))}); vopts=({_words(vopts)}) ;;")
    out += ["    *) subs=(); opts=(); vopts=() ;;", "    esac", "}", "",
            "_cachemgr_optval() {", "    # $1: the command path, $2: an option; sets spec "
            "(none, words, host, files, dirs) and vals", "    spec=none; vals=()",
            "    case $1 in"]
    for n in all_nodes:
        valued = [(o, v) for o, (_, v) in n.options.items() if v is not None]
        if not valued:
            continue
        out.append(f"    {_key(n.path)})")
        out.append("        case $2 in")
        for o, v in valued:
            out.append(f"        {_q(o)}) {_spec_cases(v)} ;;")
        out += ["        esac ;;"]
    out += ["    esac", "}", "",
            "_cachemgr_posval() {", "    # $1: the command path, $2: the positional's index "
            "(0 first); sets spec and vals", "    spec=none; vals=()", "    case $1 in"]
    for n in all_nodes:
        if not n.positionals:
            continue
        out.append(f"    {_key(n.path)})")
        out.append("        case $2 in")
        for i, a in enumerate(n.positionals):
            pat = f"{i}" if not a.repeats else "*"
            out.append(f"        {pat}) {_spec_cases(a)} ;;")
            if a.repeats:
                break
        out += ["        esac ;;"]
    out += ["    esac", "}"]
    return out


HEADER = ("# Generated by `python -m cachemgr.cli.completion completion/` from cachemgr's "
          "parser: do not edit\n# (tests/unit/test_completion.py fails when it is stale).")

# the walk over the words typed so far, the same in both shells but for their arrays'
# bases; {W} is the words array, {I0} the first word after the program's name, {C} the
# index of the word being completed
_WALK = r"""
    local cmdpath="" w pending="" root="" npos=0 i={I0}
    _cachemgr_node ""
    while (( i < {C} )); do
        w=${{{W}[i]}}
        if [[ $w == --sysfs-root ]]; then
            [[ ${{{W}[i+1]}} == = ]] && (( i++ ))
            (( i + 1 < {C} )) && root=${{{W}[i+1]}}
            (( i++ ))
        elif [[ $w == --sysfs-root=* ]]; then
            root=${{w#*=}}
        elif [[ $w == -- ]]; then
            return 1
        elif [[ $w == -* ]]; then
            if [[ $w != *=* ]] && _cachemgr_in "$w" "${{vopts[@]}}"; then
                if (( i + 1 == {C} )); then
                    pending=$w
                elif [[ ${{{W}[i+1]}} == = ]]; then
                    (( i + 2 == {C} )) && pending=$w
                    (( i += 2 ))
                else
                    (( i++ ))
                fi
            fi
        elif (( ${{#subs[@]}} )) && _cachemgr_in "$w" "${{subs[@]}}"; then
            cmdpath=${{cmdpath:+$cmdpath }}$w
            npos=0
            _cachemgr_node "$cmdpath"
        else
            (( npos++ ))
        fi
        (( i++ ))
    done"""


def _walk(words: str, first: int, cword: str) -> str:
    return _WALK.replace("{W}", words).replace("{I0}", str(first)).replace(
        "{C}", cword).replace("{{", "{").replace("}}", "}")


def render_bash(parser: argparse.ArgumentParser) -> str:
    all_nodes = nodes(parser)
    body = [
        HEADER,
        "# Install: copy to /usr/share/bash-completion/completions/cachemgr (or source it).",
        "# Device arguments are completed from the host by `cachemgr --complete KIND` (a "
        "read-only", "# status snapshot); every word offered is quoted with printf %q.", "",
        *_tables(all_nodes), "",
        "_cachemgr_in() {",
        '    local x=$1; shift',
        '    local y; for y in "$@"; do [[ $y == "$x" ]] && return 0; done; return 1',
        "}", "",
        "_cachemgr_add() {",
        "    # offer the words that start with $cur, each quoted for the command line",
        '    local w q',
        '    for w in "$@"; do',
        '        if [[ $w == "$cur"* ]]; then printf -v q %q "$w"; COMPREPLY+=("$q"); fi',
        "    done",
        "}", "",
        "_cachemgr_host() {",
        "    # $1: a --complete kind; the program typed on the line, with the --sysfs-root given",
        '    local prog=${COMP_WORDS[0]}',
        '    [[ $prog == "~/"* ]] && prog=$HOME/${prog#"~/"}',
        '    local -a args=(--complete "$1")',
        '    [[ -n $root ]] && args=(--sysfs-root "$root" "${args[@]}")',
        '    local -a got',
        '    mapfile -t got < <("$prog" "${args[@]}" 2>/dev/null)',
        '    _cachemgr_add "${got[@]}"',
        "}", "",
        "_cachemgr_value() {",
        "    case $spec in",
        '    words) _cachemgr_add "${vals[@]}" ;;',
        '    host) _cachemgr_host "${vals[0]}" ;;',
        '    files) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- '
        '"$cur") ;;',
        '    dirs) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -d -- '
        '"$cur") ;;',
        "    esac",
        "}", "",
        "_cachemgr() {",
        "    COMPREPLY=()",
        '    local cur=${COMP_WORDS[COMP_CWORD]} spec',
        "    local -a subs opts vopts vals",
        "    [[ $cur == = ]] && cur=\"\"",
        _walk("COMP_WORDS", 1, "COMP_CWORD"),
        '    if [[ -z $pending && $cur != -* && ${COMP_WORDS[COMP_CWORD-1]} == = ]]; then',
        "        return 0  # a value after --option= of an option taking none",
        "    fi",
        '    if [[ -n $pending ]]; then',
        '        _cachemgr_optval "$cmdpath" "$pending"',
        "        _cachemgr_value",
        '    elif [[ $cur == -* ]]; then',
        '        _cachemgr_add "${opts[@]}"',
        '    elif (( ${#subs[@]} )); then',
        '        _cachemgr_add "${subs[@]}"',
        "    else",
        '        _cachemgr_posval "$cmdpath" "$npos"',
        "        _cachemgr_value",
        "    fi",
        "    return 0",
        "}", "",
        "complete -F _cachemgr cachemgr",
        "",
    ]
    return "\n".join(body)


def render_zsh(parser: argparse.ArgumentParser) -> str:
    all_nodes = nodes(parser)
    helps = ["_cachemgr_describe() {", "    # $1: the command path; sets descs "
             "(NAME:HELP) for its subcommands", "    descs=()", "    case $1 in"]
    for n in all_nodes:
        if n.subs:
            pairs = [f"{s}:{_one_line(h)}" for s, h in n.subs.items()]
            helps.append(f"    {_key(n.path)}) descs=({_words(pairs)}) ;;")
    helps += ["    esac", "}"]
    body = [
        "#compdef cachemgr",
        HEADER,
        "# Install: copy to a directory of $fpath (e.g. /usr/share/zsh/vendor-completions/"
        "_cachemgr).",
        "# Device arguments are completed from the host by `cachemgr --complete KIND` (a "
        "read-only", "# status snapshot); compadd quotes every word it inserts.", "",
        *_tables(all_nodes), "",
        *helps, "",
        "_cachemgr_in() {",
        '    local x=$1; shift',
        '    local y; for y in "$@"; do [[ $y == "$x" ]] && return 0; done; return 1',
        "}", "",
        "_cachemgr_host() {",
        '    local prog=${words[1]}',
        "    [[ $prog == '~/'* ]] && prog=$HOME/${prog#\\~/}",
        '    local -a args got',
        '    args=(--complete "$1")',
        '    [[ -n $root ]] && args=(--sysfs-root "$root" "${args[@]}")',
        '    got=("${(@f)$("$prog" "${args[@]}" 2>/dev/null)}")',
        '    got=("${(@)got:#}")',
        "    compadd -a got",
        "}", "",
        "_cachemgr_value() {",
        "    case $spec in",
        "    words) compadd -a vals ;;",
        '    host) _cachemgr_host "${vals[1]}" ;;',
        "    files) _files ;;",
        "    dirs) _files -/ ;;",
        "    esac",
        "}", "",
        "_cachemgr() {",
        "    setopt localoptions ksharrays",
        "    local spec",
        "    local -a subs opts vopts vals descs",
        _walk("words", 1, "CURRENT-1"),
        "    setopt localoptions noksharrays",
        '    if [[ -n $pending ]]; then',
        '        _cachemgr_optval "$cmdpath" "$pending"',
        "        _cachemgr_value",
        '    elif [[ $PREFIX == -* ]]; then',
        "        compadd -a opts",
        '    elif (( ${#subs[@]} )); then',
        '        _cachemgr_describe "$cmdpath"',
        "        _describe -t commands 'cachemgr command' descs",
        "    else",
        '        _cachemgr_posval "$cmdpath" "$npos"',
        "        _cachemgr_value",
        "    fi",
        "}", "",
        '_cachemgr "$@"',
        "",
    ]
    return "\n".join(body)


FILES = {"cachemgr.bash": render_bash, "_cachemgr": render_zsh}


def render_all() -> dict[str, str]:
    from cachemgr.cli.main import build_parser

    parser = build_parser()
    return {name: fn(parser) for name, fn in FILES.items()}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m cachemgr.cli.completion DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (out / name).write_text(text)
        print(os.fspath(out / name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
