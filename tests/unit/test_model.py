from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachemgr.core.errors import KernelFormatError
from cachemgr.core.model import CacheMode, CacheState, Size, WritebackDebug, hprint, parse_bracketed

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@given(st.integers(min_value=-(1 << 62), max_value=1 << 62))
def test_hprint_parse_brackets_the_value(v: int) -> None:
    s = Size.parse_hprint(hprint(v))
    assert s.low <= v <= s.high


@given(st.integers(min_value=0, max_value=1 << 62))
def test_hprint_is_canonical(v: int) -> None:
    text = hprint(v)
    s = Size.parse_hprint(text)
    # every value in the interval prints the same, and the interval is the largest such
    assert hprint(s.low) == text and hprint(s.high) == text
    assert hprint(s.high + 1) != text
    if s.low > 0:
        assert hprint(s.low - 1) != text


@pytest.mark.parametrize(
    ("text", "low", "zero"),
    [
        ("0.0k", 0, True),  # 7.2's zero
        ("0", 0, True),  # older kernels' zero
        ("4.0k", 4096, False),
        ("512.0k", 512 << 10, False),
        ("59.9M", (59 << 20) + 922 * 1024, False),
        ("0.9T", 1000 << 30, False),
        ("512", 512, False),
        ("58M", 58 << 20, False),
    ],
)
def test_known_renderings(text: str, low: int, zero: bool) -> None:
    s = Size.parse_hprint(text)
    assert s.low == low
    assert s.is_zero(512) is zero


@given(st.text(alphabet="0123456789.-kMGTx ", max_size=8))
def test_malformed_raises_with_text(text: str) -> None:
    try:
        Size.parse_hprint(text)
    except KernelFormatError as exc:
        assert repr(text.strip()) in str(exc) or repr(text) in str(exc)


def test_dirty_never_zero_from_nonzero_text() -> None:
    assert not Size.parse_hprint("0.1k").is_zero(512)
    assert not Size.parse_hprint("4.0k").is_zero(512)


def test_real_outputs_from_captures() -> None:
    files = list(FIXTURES.glob("*/sys/devices/**/bcache/dirty_data")) + list(
        FIXTURES.glob("*/sys/devices/**/bcache/sequential_cutoff"))
    assert files, "no captured bcache files"
    for f in files:
        Size.parse_hprint(f.read_text().strip())


def test_bracketed() -> None:
    assert parse_bracketed("writethrough [writeback] writearound none") == (
        "writeback", ("writethrough", "writeback", "writearound", "none"))
    with pytest.raises(KernelFormatError):
        parse_bracketed("writethrough writeback")
    with pytest.raises(KernelFormatError):
        parse_bracketed("[a] [b]")


def test_enums_parse_kernel_words() -> None:
    assert CacheState.parse("no cache") is CacheState.NO_CACHE
    assert CacheMode.parse("none") is CacheMode.NONE
    with pytest.raises(KernelFormatError):
        CacheState.parse("weird")


def test_writeback_debug_from_capture() -> None:
    f = next(FIXTURES.glob("bcache-writeback-dirty-*/sys/devices/**/bcache/writeback_rate_debug"))
    d = WritebackDebug.parse(f.read_text())
    dirty = Size.parse_hprint((f.parent / "dirty_data").read_text().strip())
    assert d.dirty is not None and d.dirty.low == dirty.low
    assert d.rate is not None and d.next_io_ms is not None


def test_writeback_debug_rejects_garbage() -> None:
    with pytest.raises(KernelFormatError):
        WritebackDebug.parse("rate 512k")
