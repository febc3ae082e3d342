"""Citations in comments, docstrings and docs point at things that exist in this repository.

(a) No tracked file cites notes that live outside the repository (the old briefing and design
    files, or anything under a sibling ``shared`` directory): what the code relies on is
    written down in docs/kernel-notes.md.
(b) Every repository path a tracked text file cites (``docs/...``, ``tests/...``,
    ``scripts/...``, ``cachemgr/...``, ``udev/...``, ``systemd/...`` ...) exists.
(c) Every ``docs/<name>.md, "Heading"`` reference names a heading of that file.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Written so that this file does not match its own patterns.
OUTSIDE = re.compile(r"\b(?:FACTS|DESIGN|STYLE)\.md\b|\.\./shared\b|/work/(?:shared)\b")

# Files other engineers are rewriting while this test lands; they still cite outside notes.

# A repository path: a top-level directory of this repository, then path characters. Not
# preceded by a path character, so /etc/cachemgr/..., /var/lib/cachemgr/... and
# ~/.cache/cachemgr/... are not taken for repository paths.
TOP = ("docs", "tests", "scripts", "cachemgr", "udev", "systemd", "tui", "ansible",
       "benchmarks")
PATH = re.compile(r"(?<![\w./~$@-])((?:" + "|".join(TOP) + r")/[\w.*<>{}/+-]*[\w*>}/])")
# Placeholders stand for many files: docs/<name>.md, tests/fixtures/*/meta.json,
# tests/fixtures/{a,b}, $VAR, and upper-case words (systemd/NAME, .../UUID).
PLACEHOLDER = re.compile(r"[<>*{}$]|(?:^|/)[A-Z][A-Z_]*(?:/|$)")
# Strings that look like repository paths and are not: (file, text) -> why.
NOT_PATHS = {
    ("docs/schema/status.schema.json", "cachemgr/" "status.schema.json"):
        "the schema's $id, an identifier (JSON Schema), not a file",
    **{("pyproject.toml", "cachemgr/" f"data/{p}"): "where the wheel carries it (force-include)"
       for p in ("udev/90-cachemgr.rules", "udev/README.md", "systemd",
                 "scripts/install-udev.sh", "monitoring", "man", "completion",
                 "docs/admin-guide.md", "libvirt/qemu-hook")},
}
# Captured kernel trees: kernel text, not ours.
NOT_SCANNED = ("tests/fixtures/",)

# docs/<name>.md, "Heading" (the heading may wrap onto a comment's next line)
SECTION = re.compile(r"\b(docs/[\w-]+\.md),\s+\"([^\"]{1,100})\"")
CONTINUATION = re.compile(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


@cache
def tracked() -> tuple[str, ...]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return tuple(p for p in out.decode().split("\0") if p)


@cache
def text_of(rel: str) -> str | None:
    p = ROOT / rel
    if p.is_symlink() or not p.is_file():
        return None
    data = p.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def texts(skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    out = []
    for rel in tracked():
        if rel.startswith(skip):
            continue
        t = text_of(rel)
        if t is not None:
            out.append((rel, t))
    return out


def outside_citations(rel: str, text: str) -> list[str]:
    return [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line)]


def cited_paths(text: str) -> list[tuple[int, str]]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            path = m.group(1).rstrip("/.")
            if path and not PLACEHOLDER.search(path):
                found.append((n, path))
    return found


def section_refs(text: str) -> list[tuple[str, str]]:
    flat = CONTINUATION.sub(" ", text)
    return [(m.group(1), m.group(2)) for m in SECTION.finditer(flat)]


@cache
def headings(doc: str) -> frozenset[str]:
    p = ROOT / doc
    return frozenset(HEADING.findall(p.read_text())) if p.is_file() else frozenset()


# ----------------------------------------------------------------------------- (a)


def test_no_file_cites_notes_outside_the_repository() -> None:
    bad = [hit for rel, t in texts() for hit in outside_citations(rel, t)]
    assert not bad, ("write what is needed into docs/kernel-notes.md (or the doc that "
                     "fits: cli, json, architecture) and cite that:\n" + "\n".join(bad))


def test_the_outside_pattern_matches() -> None:
    dot_md = ".md"
    for s in ("see FACTS" + dot_md, '(DESIGN' + dot_md + ' "Layers")', "STYLE" + dot_md + ":",
              "(../" + "shared/notes)", "/work/" + "shared/x"):
        assert OUTSIDE.search(s), s
    assert not OUTSIDE.search("test_facts_figures design.md shared/x")


# ----------------------------------------------------------------------------- (b)


def test_cited_repository_paths_exist() -> None:
    missing, seen = [], 0
    for rel, t in texts(skip=NOT_SCANNED):
        for n, path in cited_paths(t):
            seen += 1
            if (rel, path) in NOT_PATHS or (ROOT / path).exists():
                continue
            missing.append(f"{rel}:{n}: {path}")
    assert seen > 100, f"only {seen} path citations found: is the pattern broken?"
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_the_path_pattern() -> None:
    text = ("see docs/admin-guide.md and `scripts/test.sh`; /etc/cachemgr/cachemgr.toml, "
            "/var/lib/cachemgr/drain/<uuid>.json, tests/fixtures/<scenario>/sys, "
            "systemd/NAME, (tests/unit/test_cli.py).")
    assert [p for _, p in cited_paths(text)] == [
        "docs/admin-guide.md", "scripts/test.sh", "tests/unit/test_cli.py"]


def test_not_paths_entries_are_still_needed() -> None:
    for rel, path in NOT_PATHS:
        t = text_of(rel) or ""
        assert path in [p for _, p in cited_paths(t)], f"drop ({rel}, {path}) from NOT_PATHS"


# ----------------------------------------------------------------------------- (c)


def test_section_references_name_existing_headings() -> None:
    bad, seen = [], 0
    for rel, t in texts(skip=NOT_SCANNED):
        for doc, heading in section_refs(t):
            seen += 1
            if heading not in headings(doc):
                bad.append(f'{rel}: {doc}, "{heading}"')
    assert seen > 10, f"only {seen} section references found: is the pattern broken?"
    assert not bad, "no such heading:\n" + "\n".join(bad)


def test_the_section_pattern() -> None:
    notes = "docs/" + "kernel-notes.md"  # spelled so that the scan skips it here
    text = (f'x ({notes}, "The drain\n    # trap"); y docs/cli.md "no comma";\n'
            f'({notes}, "Failure")')
    assert section_refs(text) == [(notes, "The drain trap"), (notes, "Failure")]
    assert "The drain trap" in headings(notes)
