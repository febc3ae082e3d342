"""Hypothesis strategies for the parsers' property tests (tests/unit/test_properties.py), in
one place: arbitrary text (control characters, lone surrogates, huge digit runs), arbitrary
JSON-ish values (nested, huge integers, nan/inf, wrong types), arbitrary bytes, and mutations
of real samples (the captures' dmsetup files, a bcache-super-show listing, a replace-ssd
journal) so the parsers are also fed text that is almost right."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# every code point, lone surrogates included (st.text() leaves those out): a CLI argument or a
# JSON string (\ud800) can carry one
any_char = st.characters(codec=None, exclude_categories=())
# what text from the kernel, a tool or an admin is made of, weighted towards the characters
# the grammars care about
grammar_char = st.sampled_from([*"0123456789:/=.,[]- \t\n_abcxyzABCkMGT",
                                "\x00", "\x1b", "\u202e", "\u00b2", "\u0663", "\ud800"])
junk_text = st.one_of(st.text(any_char, max_size=60), st.text(grammar_char, max_size=60),
                      st.sampled_from(["", " ", "\n", "9" * 5000, "[" * 50, "]", "[]", "[ ]",
                                       "nan", "inf", "-1", "1e999", "0x10", "\u00b2", "\u0663"]))
# a word (no white space): what split() hands a positional parser
junk_word = st.one_of(st.text(st.sampled_from(list("0123456789:/._-[]abcxyz\u00b2\u0663")),
                              min_size=1, max_size=12),
                      st.sampled_from(["9" * 5000, "1/" + "9" * 5000, "\u00b2", "-", "rw", "ro",
                                       "Fail", "Error", "cache", "writeback", "smq", "0"]))


def _lines(sample: str) -> list[str]:
    return sample.splitlines()


@st.composite
def mutated(draw: st.DrawFn, samples: list[str]) -> str:
    """One of ``samples`` with a few random edits: a line or a word dropped, doubled, swapped
    or replaced by junk, text inserted anywhere, a cut at any point."""
    text = draw(st.sampled_from(samples))
    for _ in range(draw(st.integers(0, 4))):
        lines = _lines(text) or [""]
        i = draw(st.integers(0, len(lines) - 1))
        words = lines[i].split(" ")
        j = draw(st.integers(0, len(words) - 1))
        how = draw(st.sampled_from(["drop-line", "dup-line", "drop-word", "junk-word",
                                    "dup-word", "swap-words", "insert", "cut"]))
        if how == "drop-line":
            del lines[i]
        elif how == "dup-line":
            lines.insert(i, lines[i])
        elif how == "drop-word":
            del words[j]
        elif how == "junk-word":
            words[j] = draw(junk_word)
        elif how == "dup-word":
            words.insert(j, words[j])
        elif how == "swap-words":
            k = draw(st.integers(0, len(words) - 1))
            words[j], words[k] = words[k], words[j]
        if how in ("drop-word", "junk-word", "dup-word", "swap-words"):
            lines[i] = " ".join(words)
        text = "\n".join(lines)
        if how == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(junk_text) + text[at:]
        elif how == "cut":
            text = text[:draw(st.integers(0, len(text)))]
    return text


# ------------------------------------------------------------------------------ samples


def fixture_lines(name: str) -> list[str]:
    """Every line of ``name`` (dmsetup-table.txt, ...) in every capture, without the
    ``NAME: `` prefix."""
    out = []
    for p in sorted(FIXTURES.glob(f"*/{name}")):
        for line in p.read_text().splitlines():
            if ": " in line:
                out.append(line.partition(": ")[2])
    return out


def fixture_texts(name: str) -> list[str]:
    return [p.read_text() for p in sorted(FIXTURES.glob(f"*/{name}"))]


TABLE_LINES = [x for x in fixture_lines("dmsetup-table.txt") if " cache " in x] + [
    "0 1048576 cache 98:32 98:16 253:0 128 2 writeback no_discard_passdown smq 2 "
    "migration_threshold 4096"]
STATUS_LINES = [x for x in fixture_lines("dmsetup-status.txt") if " cache " in x]
LISTINGS = fixture_texts("dmsetup-table.txt") + fixture_texts("dmsetup-status.txt") + [
    "No devices found\n", "a: b: 0 8 linear 8:0 0\na: b: 8 8 linear 8:0 8\n"]
INFOS = fixture_texts("dmsetup-info.txt")

# bcache-super-show of a backing device (bcache-tools 1.0.8, as the lab prints it)
SUPER_SHOW = [
    "sb.magic\t\tok\nsb.first_sector\t\t8 [match]\nsb.csum\t\t\t9F1A6B2C07E4C8A1 [match]\n"
    "sb.version\t\t1 [backing device]\n\ndev.label\t\t(empty)\n"
    "dev.uuid\t\t6f2c3b4e-0d2a-4c1e-9a43-3f0e2b1d5c77\ndev.sectors_per_block\t1\n"
    "dev.sectors_per_bucket\t1024\ndev.data.first_sector\t16\n"
    "dev.data.cache_mode\t1 [writeback]\ndev.data.cache_state\t2 [dirty]\n\n"
    "cset.uuid\t\t0b1f7a52-4f0e-4d61-8a7e-2c9b5d3e1f40\n",
    "sb.magic\t\tok\nsb.first_sector\t\t8 [match]\nsb.version\t\t3 [cache device]\n"
    "dev.uuid\t\t1e2d3c4b-0000-4000-8000-000000000001\ncset.uuid\t\t"
    "0b1f7a52-4f0e-4d61-8a7e-2c9b5d3e1f40\n"]

BRACKETED = ["writethrough [writeback] writearound none\n", "[lru] fifo random\n",
             "auto [always] never\n"]

WRITEBACK_DEBUG = [p.read_text() for p in sorted(FIXTURES.glob(
    "*/sys/block/*/bcache/writeback_rate_debug"))][:3] or [
    "rate:\t\t4.0k/sec\ndirty:\t\t59.9M\ntarget:\t\t0.0k\nproportional:\t0.0k\n"
    "integral:\t0.0k\nchange:\t\t0.0k/sec\nnext io:\t-1ms\n"]

TARGETS = ["/dev/bcache0", "/dev/bcache0:writeback", "fast=/dev/bcache0:none",
           "/dev/mapper/vm:cache", "x=/dev/sdb", "/dev/sdb:writearound"]

SETTINGS = ["writeback_percent=0", "sequential_cutoff=4194304", "migration_threshold=2048"]

# a replace-ssd journal as Journal.save writes it (cachemgr/procedures/replace/journal.py)
JOURNAL: dict[str, Any] = {
    "schema": 1, "id": "r-20240101-000000", "cset": "0b1f7a52-4f0e-4d61-8a7e-2c9b5d3e1f40",
    "options": {"new": "same", "interim_mode": "writearound"},
    "old": {"name": "sdc", "hctl": "2:0:0:0", "wwid": "naa.5000", "serial": "S1",
            "size_bytes": 536870912, "bucket": 524288},
    "backings": [{"uuid": "6f2c3b4e-0d2a-4c1e-9a43-3f0e2b1d5c77", "name": "sdb",
                  "node": "/dev/sdb", "device": "/dev/bcache0", "mode": "writeback",
                  "tunables": {"writeback_percent": 10}}],
    "congested": {}, "done": ["preflight", "remember"], "new": {}, "status": "running",
    "error": None, "created": 1.0, "updated": 2.0}

# ------------------------------------------------------------------------------ values

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.just(10 ** 400), st.floats(),
    st.text(any_char, max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(any_char, max_size=8), inner, max_size=4)),
    max_leaves=12)
json_objects = st.dictionaries(st.text(any_char, max_size=12), json_values, max_size=8)


@st.composite
def mutated_json(draw: st.DrawFn, sample: dict[str, Any]) -> dict[str, Any]:
    """``sample`` with a few fields dropped, added, or given values of any type (also one
    level down, in its objects and lists of objects)."""
    data = json.loads(json.dumps(sample))
    for _ in range(draw(st.integers(1, 4))):
        target: dict[str, Any] = data
        nested = [v for v in data.values() if isinstance(v, dict)] + [
            x for v in data.values() if isinstance(v, list) for x in v if isinstance(x, dict)]
        if nested and draw(st.booleans()):
            target = draw(st.sampled_from(nested))
        keys = sorted(target)
        how = draw(st.sampled_from(["drop", "add", "retype"]))
        if how == "drop" and keys:
            del target[draw(st.sampled_from(keys))]
        elif how == "add":
            target[draw(st.text(any_char, max_size=8))] = draw(json_values)
        elif keys:
            target[draw(st.sampled_from(keys))] = draw(json_values)
    return data


def json_bytes(obj: Any) -> bytes:
    """``obj`` as a state file would hold it (lone surrogates as JSON escapes)."""
    return json.dumps(obj, indent=2).encode()


file_bytes = st.one_of(
    st.binary(max_size=200),
    st.builds(json_bytes, json_values),
    st.builds(json_bytes, mutated_json(JOURNAL)),
    st.builds(lambda s: s.encode("utf-8", "surrogatepass"), st.text(any_char, max_size=80)),
    st.sampled_from([b"[" * 100_000, b"{\"a\":" * 50_000, b"9" * 5000, b"{\"x\": " + b"9" * 5000
                     + b"}", b"\xff\xfe{}", b"{\"schema\": 1e999}", b"{\"schema\": NaN}",
                     b"{\"id\": \"\\ud800\"}"]),
    st.builds(lambda b, n: json_bytes(JOURNAL)[:n] + b, st.binary(max_size=8),
              st.integers(0, 600)),
)

# a udev environment: the keys it carries and any others, any text values
udev_keys = st.one_of(st.sampled_from(["ACTION", "DEVNAME", "DEVPATH", "DEVTYPE", "SEQNUM",
                                       "SUBSYSTEM", "DEVLINKS", "ID_SERIAL", "ID_WWN",
                                       "MAJOR", "MINOR", "_received"]),
                      st.text(any_char, max_size=8))
udev_envs = st.dictionaries(udev_keys, junk_text, max_size=10)
udev_records = st.one_of(
    st.dictionaries(udev_keys, json_values, max_size=10),
    st.builds(lambda d, v: {**d, "_received": v}, udev_envs, json_values),
    st.builds(lambda d, v: {**d, "SEQNUM": v}, udev_envs,
              st.sampled_from(["\u00b2", "\u0663", "9" * 5000, "-1", "1", " 2"])))
