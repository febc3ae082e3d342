"""Property tests of the parsers (issue #15 item 9): whatever text, bytes or JSON a parser is
handed (arbitrary, or a real sample from tests/fixtures with random edits), it returns its
typed result or raises one of the project's typed errors (a CacheMgrError: KernelFormatError,
UsageError, StateFileError), never ValueError, KeyError, IndexError, TypeError, UnicodeError,
RecursionError or OverflowError. The strategies are in tests/unit/strategies.py."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cachemgr.backends.bcache_super import parse_super_show
from cachemgr.backends.dmcache.parse import (
    DmInfo,
    parse_info,
    parse_listing,
    parse_status,
    parse_table,
)
from cachemgr.core import state
from cachemgr.core.errors import CacheMgrError, KernelFormatError, UsageError
from cachemgr.core.model import (
    CacheMode,
    CacheState,
    DmCacheStatus,
    DmCacheTable,
    Size,
    WritebackDebug,
    parse_bracketed,
    parse_size,
)
from cachemgr.ops.tuning import parse_settings
from cachemgr.ops.udev import event_from
from cachemgr.procedures.autoattach import Event
from cachemgr.procedures.bench.targets import parse_target
from cachemgr.procedures.replace import Journal
from tests.unit import strategies as s
from tests.unit.kernel_forms import MQ_42_LINE, OLD_STATUS_LINES, SMQ_42_LINE

T = TypeVar("T")
PROPS = settings(max_examples=300, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])


def typed(call: Callable[[], T], *errors: type[CacheMgrError]) -> T | CacheMgrError:
    """``call()``'s result, or the typed error it raised (one of ``errors``); anything else
    escapes and fails the test with its traceback."""
    try:
        return call()
    except errors as exc:
        assert str(exc)  # says something
        return exc


# --------------------------------------------------------------------------- cache_mode


@PROPS
@given(st.one_of(s.junk_text, s.mutated(s.BRACKETED)))
def test_cache_mode_and_bracketed_choices(text: str) -> None:
    r = typed(lambda: CacheMode.parse(text), KernelFormatError)
    assert isinstance(r, CacheMode | KernelFormatError)
    r2 = typed(lambda: CacheState.parse(text), KernelFormatError)
    assert isinstance(r2, CacheState | KernelFormatError)
    b = typed(lambda: parse_bracketed(text), KernelFormatError)
    if not isinstance(b, KernelFormatError):
        active, choices = b
        assert active in choices


@PROPS
@given(st.one_of(s.junk_text, s.mutated(s.WRITEBACK_DEBUG)))
@example("next io:\txms\n")
@example("next io:\t" + "9" * 5000 + "ms\n")
@example("next io:\t\u00b2ms\n")
@example("rate:\t\t1.10k/sec\ndirty:\t\t59.10M\n")  # kernels before 4.14
def test_bcache_hprint_and_writeback_rate_debug(text: str) -> None:
    for old in (False, True, None):
        r = typed(functools.partial(Size.parse_hprint, text, old=old), KernelFormatError)
        assert isinstance(r, Size | KernelFormatError)
        if isinstance(r, Size):
            assert r.low <= r.high
    w = typed(lambda: WritebackDebug.parse(text), KernelFormatError)
    assert isinstance(w, WritebackDebug | KernelFormatError)


# --------------------------------------------------------------------- bcache superblock


@PROPS
@given(st.one_of(s.junk_text, s.mutated(s.SUPER_SHOW)))
def test_bcache_super_show(text: str) -> None:
    r = typed(lambda: parse_super_show(text), KernelFormatError)
    if not isinstance(r, KernelFormatError):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in r.items())


def test_bcache_super_show_sample() -> None:
    sb = parse_super_show(s.SUPER_SHOW[0])
    assert sb["sb.version"] == "backing device" and sb["dev.data.cache_state"] == "dirty"
    assert sb["sb.first_sector"] == "8 [match]"


# ---------------------------------------------------------------------------- one size


@PROPS
@given(st.one_of(s.junk_text, st.from_regex(r"\A[0-9]{1,25}(\.[0-9]{0,25})?[kKmMgGtTbB]?"
                                            r"(i?[bB])?\Z")))
def test_size(text: str) -> None:
    r = typed(lambda: parse_size(text), UsageError)
    if not isinstance(r, UsageError):
        assert isinstance(r, int) and 0 <= r < 1 << 63


# ------------------------------------------------------------------------ tune settings


@PROPS
@given(st.lists(st.one_of(s.junk_text, s.mutated(s.SETTINGS)), max_size=4))
@example(["writeback_percent=" + "9" * 5000])
@example(["writeback_percent=\u00b2"])
def test_tune_settings(settings_: list[str]) -> None:
    r = typed(lambda: parse_settings(settings_), UsageError)
    if not isinstance(r, UsageError):
        assert len(r) == len(settings_)
        assert all(isinstance(n, str) and isinstance(v, int) for n, v in r)


# ------------------------------------------------------------------------ bench targets


@PROPS
@given(st.one_of(s.junk_text, s.mutated(s.TARGETS)))
def test_bench_targets(text: str) -> None:
    r = typed(lambda: parse_target(text), UsageError)
    if not isinstance(r, UsageError):
        _label, dev, mode = r
        assert isinstance(dev, str) and (mode is None or isinstance(mode, CacheMode))


# --------------------------------------------------------------------- dmsetup listings


# what other kernels print (tests/unit/kernel_forms.py: before 4.2, the mq policy)
OTHER_STATUS_LINES = [x for _, x in OLD_STATUS_LINES] + [MQ_42_LINE, SMQ_42_LINE]


@PROPS
@given(st.one_of(s.junk_text, s.mutated(s.TABLE_LINES), s.mutated(s.STATUS_LINES),
                 s.mutated(OTHER_STATUS_LINES)))
@example("0 8 cache 1:1 1:2 1:3 " + "9" * 5000 + " 0 smq 0")
@example("0 8 cache 8 1/" + "9" * 5000 + " 64 1/2 0 0 0 0 0 0 0 0 0 smq 0 rw -")
def test_dmsetup_table_and_status_lines(line: str) -> None:
    t = typed(lambda: parse_table(line), KernelFormatError)
    assert isinstance(t, DmCacheTable | KernelFormatError)
    st_ = typed(lambda: parse_status(line), KernelFormatError)
    assert isinstance(st_, DmCacheStatus | KernelFormatError) or st_ in ("Fail", "Error")


def test_dmsetup_samples_parse() -> None:
    assert s.TABLE_LINES and s.STATUS_LINES
    for line in s.TABLE_LINES:
        assert isinstance(parse_table(line), DmCacheTable)
    for line in s.STATUS_LINES:
        assert isinstance(parse_status(line), DmCacheStatus) or parse_status(line) == "Fail"
    for line in OTHER_STATUS_LINES:
        assert isinstance(parse_status(line), DmCacheStatus)


@PROPS
@given(st.one_of(s.junk_text, s.mutated(s.LISTINGS), s.mutated(s.INFOS)),
       st.sets(st.one_of(st.sampled_from(["vmcache", "slow", "a: b", "a"]),
                         st.text(s.any_char, max_size=6)), max_size=4))
@example("Name: x\nOpen count: \u00b2\n", set())
@example("Name: x\nOpen count: " + "9" * 5000 + "\n", set())
def test_dmsetup_listing_and_info(text: str, names: set[str]) -> None:
    r = typed(lambda: parse_listing(text, names), KernelFormatError)
    if not isinstance(r, KernelFormatError):
        assert all(isinstance(v, list) for v in r.values())
    i = typed(lambda: parse_info(text), KernelFormatError)
    if not isinstance(i, KernelFormatError):
        assert all(isinstance(v, DmInfo) for v in i.values())


# ------------------------------------------------------------------ udev event records


@PROPS
@given(s.udev_envs)
def test_udev_event_from_env(env: dict[str, str]) -> None:
    ev = event_from(env)
    assert ev is None or (isinstance(ev, dict) and ev["ACTION"] == env.get("ACTION", "change"))
    e = Event.from_env(env, 0.0)
    assert e.seqnum is None or (isinstance(e.seqnum, int) and e.seqnum >= 0)


@PROPS
@given(s.udev_records)
@example({"_received": "soon"})
@example({"_received": 10 ** 400})
@example({"_received": [1]})
@example({"SEQNUM": "\u00b2"})
@example({1: "x"})
def test_udev_event_records(data: dict[Any, Any]) -> None:
    r = typed(lambda: Event.from_json(data), KernelFormatError)
    if isinstance(r, Event):
        assert r.describe() and (r.seqnum is None or r.seqnum >= 0)


# ---------------------------------------------------------------------- journal loading


@pytest.fixture
def state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
              ) -> Path:
    d = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@PROPS
@given(data=s.file_bytes)
def test_read_json_and_journal_read(state_dir: Path, data: bytes) -> None:
    path = state.journal_path("replace", "r-1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    r = typed(lambda: state.read_json(path), state.StateFileError)
    assert r is None or isinstance(r, dict | state.StateFileError)
    j = typed(lambda: Journal.read(path), state.StateFileError)
    assert j is None or isinstance(j, Journal | state.StateFileError)


@PROPS
@given(data=s.mutated_json(s.JOURNAL), run_id=s.junk_text)
@example(data={**s.JOURNAL, "id": "\ud800"}, run_id="\ud800")
@example(data={**s.JOURNAL, "done": [[1]]}, run_id="r")
def test_journal_load(state_dir: Path, data: dict[str, Any], run_id: str) -> None:
    ok = typed(lambda: Journal.load(run_id), UsageError)
    assert isinstance(ok, UsageError)  # no such run (or an id no run can have)
    rid = data.get("id") if isinstance(data.get("id"), str) else "r"
    path = typed(lambda: state.journal_path("replace", rid), UsageError)
    if isinstance(path, UsageError):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(s.json_bytes(data))
    j = typed(lambda: Journal.load(rid), UsageError)
    if isinstance(j, Journal):
        assert j.id == rid and j.path == path
    os.unlink(path)


def test_a_real_journal_loads(state_dir: Path) -> None:
    path = state.journal_path("replace", s.JOURNAL["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(s.json_bytes(s.JOURNAL))
    assert Journal.load(s.JOURNAL["id"]).cset == s.JOURNAL["cset"]


def test_a_bad_queued_event_is_dropped_not_the_batch(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops import autoattach as ops

    ops.event_pass(Sysfs(str(tmp_path)), str(tmp_path / "no-policy.toml"),
                   [{"_received": "soon", "ACTION": "add"}, {"ACTION": "add", "SEQNUM": "7"}])
    assert "dropping a queued event" in caplog.text and "soon" in caplog.text
