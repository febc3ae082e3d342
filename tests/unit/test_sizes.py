"""The one grammar for sizes an admin types (cachemgr.core.model.parse_size) and its callers."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cachemgr.backends import dmcache
from cachemgr.core.errors import UsageError
from cachemgr.core.model import MAX_SIZE, parse_size
from cachemgr.lab import core as lab
from cachemgr.procedures import bench, policy

SHIFTS = {"": 0, "k": 10, "K": 10, "m": 20, "M": 20, "g": 30, "G": 30, "t": 40, "T": 40}
TAILS = ("", "B", "b", "iB", "ib", "IB")


@given(n=st.integers(0, MAX_SIZE))
def test_bytes_round_trip(n: int) -> None:
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n


@given(n=st.integers(0, 1 << 22), unit=st.sampled_from("kKmMgGtT"), tail=st.sampled_from(TAILS),
       pad=st.sampled_from(["", " ", "\t", "\n", " \n"]))
def test_units_round_trip(n: int, unit: str, tail: str, pad: str) -> None:
    assert parse_size(f"{pad}{n}{unit}{tail}{pad}") == n << SHIFTS[unit]


@given(whole=st.integers(0, 1 << 20), frac=st.integers(0, 1023), unit=st.sampled_from("kMGT"))
def test_fractions_of_a_binary_unit(whole: int, frac: int, unit: str) -> None:
    """A decimal fraction that is a whole number of bytes parses exactly (no float)."""
    value = (whole << SHIFTS[unit]) + (frac << (SHIFTS[unit] - 10))
    # frac/1024 of a unit has an exact decimal expansion of at most 10 digits
    digits = f"{frac / 1024:.10f}"[2:].rstrip("0") or "0"
    assert parse_size(f"{whole}.{digits}{unit}") == value


@given(st.text())
@example("")
@example("-1")
@example("nan")
@example("inf")
@example("1e999")
@example("4 k")
@example("4\nk")
@example("1.5")
@example("0.1k")
@example("4iB")
@example("9" * 5000)
@example("99999999999999999999T")
@example("\u0664k")  # an Arabic-Indic digit: int() would take it
def test_any_text_parses_or_is_a_usage_error(text: str) -> None:
    try:
        n = parse_size(text)
    except UsageError as exc:
        assert repr(text) in str(exc)
    else:
        assert 0 <= n <= MAX_SIZE
        assert text.strip().isascii() and not any(c.isspace() for c in text.strip())


@pytest.mark.parametrize("bad", ["", " ", "-1", "+1", "nan", "inf", "1e9", "1e999", "4 k",
                                 "4\nk", "1 000", "1.5", "0.1k", "4iB", "4kk", "4P", "1,5G",
                                 "0x10", "9" * 21, "8388608T"])
def test_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="bad size"):
        parse_size(bad)


def test_the_callers_share_it() -> None:
    for text, want in [("4k", 4096), ("64KiB", 65536), ("1.5M", 3 << 19), ("256M", 256 << 20),
                       ("1G", 1 << 30), ("2T", 2 << 40), ("4096", 4096)]:
        assert bench.parse_size(text) == dmcache.parse_size(text) == want
        assert policy.parse_size(text) == want
        if want >= 1 << 20:
            assert lab.parse_size(text) == want
    # each caller keeps its own hint
    with pytest.raises(UsageError) as exc:
        dmcache.parse_size("64 k")
    assert exc.value.hint == "e.g. 64k, 256k, 1M"
    # policy takes TOML integers too, and reports ValueError for its own collector
    assert policy.parse_size(4096) == 4096
    for bad in (True, -1, 1.5, "4 parsecs"):
        with pytest.raises(ValueError):
            policy.parse_size(bad)


def test_fio_gets_what_we_parsed() -> None:
    """fio reads "4KiB" as 4000 (kb_base=1024): the job passes our bytes in k/M/G/T."""
    opts = dict(bench.JobSpec(bs="4KiB", size="1.5G", offset="1000").options("/dev/x", seed=1))
    assert (opts["bs"], opts["size"], opts["offset"]) == ("4k", "1536M", "1000")
    assert bench.fio_size("2048k") == "2M" and bench.fio_size("0") == "0"
