"""Every `cachemgr ...` command line in a code block of README.md and docs/*.md is one the CLI
takes as written (issue #32 item 7: the README's `bench compare /dev/sdb /dev/bcache0` was
refused with exit 3 on the lab).

Each line is parsed by the real argparse parser (cachemgr.cli.main.build_parser), after the
synopsis notation is expanded: ``[OPTIONAL]`` parts with and without them, ``A|B`` and
``--a X | --b`` alternatives each, ``\\`` continuations joined, ``;`` and ``&&`` splitting
commands, metavariables (``S``, ``ID``, ``URI``...) given a value of their kind; the commands
a `lab run ... -- sh -c '...'` runs in the guest are checked too. `bench run` and `bench
compare` lines also go through the bench's own target parser, and a write job on a device
the same page makes the backing, origin or cache device of a cache (``create bcache
--backing /dev/sdb``) is refused as the bench refuses it at run time (exit 3: benchmark
``/dev/bcache0:none`` for the bare disk).

A line shown as wrong on purpose says so in its comment, ``# refused ...``: it must then
fail one of these checks (a marker cannot hide a line that works). docs/cli.md (generated
--help text) is left out: its usage lines are synopses, test_docs_cli checks it."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cachemgr.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md"))
                              if p.name != "cli.md")]
FENCE = re.compile(r"^\s*(```|~~~)")
REFUSED = re.compile(r"#\s*refused\b")
# values for the metavariables the docs write in command lines (an unknown one stays as it
# is: a string argument takes any word)
METAVARS = {"S": "10", "N": "2", "ID": "20261126-101500-ab12", "URI": "qemu:///system",
            "F": "/var/lib/prometheus/node-exporter/cachemgr.prom",
            "PATH": "/etc/cachemgr/cachemgr.toml", "CSET": "6f1d2a0c-3b4e-4f5a-9c8d-7e6f5a4b3c2d",
            "SSD": "/dev/sdc", "CMD": "true", "FILE": "host.trace", "DIR": "/tmp/out",
            "SIZES": "1G,256M", "DEVICE": "/dev/sdb", "TARGET": "/dev/bcache0"}
MAX_VARIANTS = 256
CACHEMGR = re.compile(r"^(?:\S*/)?cachemgr$")


@dataclass
class DocLine:
    where: str  # README.md:59
    text: str  # the line, continuations joined
    refused: bool  # marked "# refused"
    roles: dict[str, str] = field(default_factory=dict)  # the page's devices in caches


def code_lines(path: Path) -> list[DocLine]:
    """The lines of ``path``'s fenced code blocks that run cachemgr, continuations joined."""
    out: list[DocLine] = []
    inside = False
    pending: tuple[int, str] | None = None
    lines = path.read_text().splitlines()
    # a transcript (a block with "$ " prompts): its prompted lines are the commands, the
    # rest is what they printed
    transcript: set[int] = set()
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            inside = not inside
            if inside:
                block = []
                for m, ln in enumerate(lines[n:], n + 1):
                    if FENCE.match(ln):
                        break
                    block.append((m, ln))
                if any(ln.startswith("$ ") for _, ln in block):
                    transcript |= {m for m, ln in block if not ln.startswith("$ ")}
    inside = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            inside, pending = not inside, None
            continue
        if not inside or n in transcript:
            continue
        line = line.removeprefix("$ ")
        if pending is not None:
            start, text = pending[0], pending[1] + " " + line.strip()
        else:
            start, text = n, line.strip()
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        if re.search(r"(^|[\s/'\"])cachemgr\s", text):
            out.append(DocLine(f"{path.relative_to(ROOT)}:{start}", text,
                               bool(REFUSED.search(text))))
    return out


# ----------------------------------------------------------------------------- synopsis


def _tokens(text: str) -> list[str]:
    """Shell words (comments dropped), brackets of the synopsis notation as words of their
    own: ``[/dev/sdb [bfq]]`` -> ``[ /dev/sdb [ bfq ] ]``."""
    out = []
    for w in shlex.split(text, comments=True):
        lead = len(w) - len(w.lstrip("["))
        core = w.lstrip("[")
        trail = len(core) - len(core.rstrip("]"))
        core = core.rstrip("]")
        out += ["["] * lead + ([core] if core else []) + ["]"] * trail
    return out


def _alternatives(tokens: list[str], i: int, close: str | None) -> tuple[list[list[str]], int]:
    """Variants of the sequence from ``tokens[i]`` up to ``close`` (``]``, or the end), with
    ``|`` alternatives (at top level only before an option: else it is a pipe, the end)."""
    seqs: list[list[list[str]]] = [[]]  # alternatives, each a list of item-variant lists
    while i < len(tokens):
        t = tokens[i]
        if t == close:
            return _expand(seqs), i + 1
        if t == "|":
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
            if close is None and not nxt.startswith("-"):
                break  # a pipe: what follows is another program
            seqs.append([])
            i += 1
            continue
        if t in (";", "&&", "||"):
            break
        if t == "[":
            inner, i = _alternatives(tokens, i + 1, "]")
            seqs[-1].append([[], *inner])
            continue
        alts = t.split("|") if "|" in t and " " not in t and not t.startswith("-") else [t]
        seqs[-1].append([[a] for a in alts])
        i += 1
    return _expand(seqs), i


def _expand(seqs: list[list[list[list[str]]]]) -> list[list[str]]:
    """The variants of alternatives ``seqs`` (each a list of items, each item its variants).
    Alternatives of options share the words before the first one's first option: in
    ``replace-ssd --resume ID | --list`` the second is ``replace-ssd --list``."""
    if len(seqs) > 1:
        first = seqs[0]
        n = next((k for k, item in enumerate(first)
                  if any(v[:1] and v[0].startswith("-") for v in item)), len(first))
        seqs = [first, *([*first[:n], *alt] if alt and alt[0][0][:1] and
                         alt[0][0][0].startswith("-") else alt for alt in seqs[1:])]
    out: list[list[str]] = []
    for seq in seqs:
        for combo in itertools.product(*seq):
            out.append([w for part in combo for w in part])
            if len(out) > MAX_VARIANTS:
                raise AssertionError("too many variants: simplify the synopsis")
    return out


def commands(text: str) -> list[list[str]]:
    """Every cachemgr command line ``text`` holds (after ``;``/``&&``, inside ``sh -c``),
    each synopsis variant expanded, metavariables filled in; the words after cachemgr."""
    tokens = _tokens(text)
    out: list[list[str]] = []
    i = 0
    while i < len(tokens):
        variants, j = _alternatives(tokens, i, None)
        while j < len(tokens) and tokens[j] not in (";", "&&", "||", "|"):
            j += 1  # the rest of a pipeline's other program
        i = j + 1
        for words in variants:
            while words and words[0] in ("sudo", "exec", "time"):
                words = words[1:]
            if words[:1] and CACHEMGR.match(words[0]):
                args = words[1:]
            elif len(words) > 2 and words[1:3] == ["-m", "cachemgr"]:
                args = words[3:]
            else:
                continue
            out.append([METAVARS.get(w, w) for w in args])
    return out


def guest_commands(args: list[str]) -> list[list[str]]:
    """The cachemgr commands a `lab run ... -- COMMAND` runs in the guest."""
    if args[:2] != ["lab", "run"] or "--" not in args:
        return []
    cmd = args[args.index("--") + 1:]
    if len(cmd) >= 3 and cmd[0] in ("sh", "bash") and cmd[1] == "-c":
        return commands(cmd[2])
    return commands(shlex.join(cmd))


# ----------------------------------------------------------------------------- checks


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """cachemgr's parser, built once for every line here (a build is 10-20 ms; parsing
    does not change it)."""
    return build_parser()


def parse(words: list[str]) -> tuple[object | None, str]:
    """(the parsed arguments, "") or (None, argparse's complaint)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return _parser().parse_args(words), ""
    except SystemExit as exc:
        if exc.code in (0, None):
            return None, ""
        return None, err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(exc)


def roles(lines: list[DocLine]) -> dict[str, str]:
    """The devices a page puts into caches: ``create bcache --backing X --cache Y``,
    ``create dm-cache ... --origin X --cache Y --metadata Z`` (node -> what it is)."""
    out: dict[str, str] = {}
    for line in lines:
        for words in commands(line.text) + [w for c in commands(line.text)
                                             for w in guest_commands(c)]:
            args, _ = parse(words)
            if args is None or words[:1] != ["create"]:
                continue
            for opt, what in (("backing", "the backing device of a bcache device"),
                              ("origin", "the origin of a dm-cache device"),
                              ("cache", "a cache device"), ("metadata", "a cache's metadata")):
                v = getattr(args, opt, None)
                for dev in v if isinstance(v, list) else [v] if v else []:
                    have = out.get(str(dev))
                    out[str(dev)] = what if have in (None, what) else f"{have} and {what}"
    return out


def bench_problem(args: object, roles: dict[str, str]) -> str | None:
    """What the bench itself refuses in a `bench run|compare` line: a target its parser
    rejects, or a write job on a device this page puts into a cache (it would overwrite its
    superblock or destroy the cache: refused with exit 3 at run time)."""
    from cachemgr.core.errors import UsageError
    from cachemgr.procedures.bench import job, targets

    cmd = getattr(args, "benchcmd", None)
    if cmd not in ("run", "compare"):
        return None
    given = [args.target] if cmd == "run" else list(args.targets)  # type: ignore[attr-defined]
    writes = job.JobSpec(rw=args.rw).writes  # type: ignore[attr-defined]
    for text in given:
        try:
            rest, _ = targets.split_scheduler(text)
            _, dev, mode = targets.parse_target(rest)
        except UsageError as exc:
            return f"bench target {text!r}: {exc.message}"
        if writes and mode is None and dev in roles:
            return (f"bench target {text!r}: a write job on {dev}, {roles[dev]} on this page, "
                    "is refused at run time (exit 3); the bare disk under a bcache device is "
                    "/dev/bcacheN:none")
    return None


def problems(line: DocLine) -> list[str]:
    found = []
    todo = commands(line.text)
    seen = 0
    while todo:
        words = todo.pop(0)
        seen += 1
        args, why = parse(words)
        if args is None:
            if why:
                found.append(f"`cachemgr {shlex.join(words)}`: {why}")
            continue
        bad = bench_problem(args, line.roles)
        if bad:
            found.append(f"`cachemgr {shlex.join(words)}`: {bad}")
        todo += guest_commands(words)
    assert seen, f"{line.where}: no cachemgr command found in {line.text!r}"
    return found


def cases() -> list[DocLine]:
    out = []
    for path in DOCS:
        lines = code_lines(path)
        page = roles(lines)
        for line in lines:
            line.roles = page
        out += lines
    return out


CASES = cases()


def test_the_docs_have_many_command_lines() -> None:
    # the scanner finds them, across pages (a broken one would make the test below vacuous)
    assert len(CASES) > 50
    assert {c.where.split(":")[0] for c in CASES} >= {"README.md", "docs/admin-guide.md",
                                                      "docs/benchmarks.md"}
    assert any("bench compare" in c.text for c in CASES)


@pytest.mark.parametrize("line", CASES, ids=[c.where for c in CASES])
def test_documented_command_runs_as_written(line: DocLine) -> None:
    found = problems(line)
    if line.refused:
        assert found, f"{line.where} is marked '# refused' but the CLI takes it: {line.text}"
    else:
        assert not found, f"{line.where}: " + "; ".join(found)


# ----------------------------------------------------------------------------- the checker


def test_synopsis_notation_is_expanded() -> None:
    assert commands("cachemgr status [--json] [--watch S]   # every cache") == [
        ["status"], ["status", "--watch", "10"], ["status", "--json"],
        ["status", "--json", "--watch", "10"]]
    assert commands("cachemgr replace-ssd --resume ID | --rollback ID | --list") == [
        ["replace-ssd", "--resume", METAVARS["ID"]],
        ["replace-ssd", "--rollback", METAVARS["ID"]], ["replace-ssd", "--list"]]
    assert commands("cachemgr scheduler [/dev/sdb [bfq]]") == [
        ["scheduler"], ["scheduler", "/dev/sdb"], ["scheduler", "/dev/sdb", "bfq"]]
    assert commands("cachemgr attach /dev/bcache0 CSET|SSD ; cachemgr detach /dev/bcache0") \
        == [["attach", "/dev/bcache0", METAVARS["CSET"]], ["attach", "/dev/bcache0", "/dev/sdc"],
            ["detach", "/dev/bcache0"]]
    # a pipe to another program ends the command
    assert commands("cachemgr status --json | jq .devices") == [["status", "--json"]]
    # the guest's commands of a lab run
    (outer,) = commands("cachemgr lab run --disks 1G -- sh -c 'cachemgr create bcache "
                        "--backing /dev/ubda --cache /dev/ubdb && .venv/bin/cachemgr status'")
    assert guest_commands(outer) == [["create", "bcache", "--backing", "/dev/ubda", "--cache",
                                      "/dev/ubdb"], ["status"]]


def test_the_checks_catch_what_the_cli_refuses() -> None:
    """The admin's line of issue #32, and lines argparse refuses, fail the check."""
    page = {"/dev/sdb": "the backing device of a bcache device"}

    def bad(text: str) -> list[str]:
        return problems(DocLine("x.md:1", text, False, page))

    (why,) = bad("cachemgr bench compare /dev/sdb /dev/bcache0")
    assert "refused at run time (exit 3)" in why and "/dev/bcacheN:none" in why
    assert bad("cachemgr bench compare /dev/sdb@mq-deadline /dev/sdb@bfq")
    assert not bad("cachemgr bench compare /dev/sdb@mq-deadline /dev/sdb@bfq --rw randread")
    assert not bad("cachemgr bench compare /dev/bcache0:none /dev/bcache0:writeback")
    assert "unknown cache mode" in bad("cachemgr bench run /dev/bcache0:fast")[0]
    assert "invalid choice" in bad("cachemgr bench compare --rw trim /dev/bcache0")[0]
    assert "unrecognized arguments" in bad("cachemgr status --no-such-option")[0]
    assert bad("cachemgr lab run --disks 1G -- sh -c 'cachemgr staus'")
    roles_of = roles([DocLine("x.md:1", "cachemgr create bcache --backing /dev/sdb "
                              "--cache /dev/sdc [--mode writeback]", False)])
    assert roles_of == {"/dev/sdb": "the backing device of a bcache device",
                        "/dev/sdc": "a cache device"}
