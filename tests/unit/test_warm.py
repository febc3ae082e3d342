"""``cachemgr warm`` (issue #35 item 1) without a kernel: which blocks a trace finds hottest
and in which order they are read, the refusals (another device's trace, --bytes over the
capacity, a cache that admits no read, not a cached device), the pacing (no read while the
slow device is busy, up to its limit), bcache's admission settings set for the reads and put
back after them, on an error too (the undo journal gone), and replace-ssd's last step. On a
copied capture (bcache-writeback-dirty-uml: bcache0 over ubda, cache set fb5bd09d)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import undo
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode, Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import kinds, warm
from cachemgr.procedures import trace as tr
from cachemgr.procedures.replace import bcache as replace_bcache
from cachemgr.procedures.replace import dmcache as replace_dmcache
from cachemgr.procedures.replace import lvm as replace_lvm
from cachemgr.procedures.replace import run as replace_run
from tests.unit.test_parity import cli
from tests.unit.tui_helpers import copy_capture, kernel_writes

CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def make_trace(path: Path, refs: list[tuple[int, int, int]], *, name: str = "bcache0",
               size: int = 0, rate: float = 1.0) -> tr.Trace:
    """A trace of one device: ``refs`` are (offset, length, op) requests in order."""
    h = tr.Header(block=4096, rate=rate, started=0.0,
                  devices=[tr.Device(0, f"/dev/{name}", name, "252:0", size)])
    w = tr.Writer(path, h)
    for i, (off, ln, op) in enumerate(refs):
        w.add(i * 0.001, off, ln, 0, op)
    w.close({"seconds": 1.0})
    return tr.read(path)


def test_hot_blocks_are_ordered_by_reads_then_writes_then_first_seen(tmp_path: Path) -> None:
    k = 4096
    t = make_trace(tmp_path / "t", [(5 * k, k, 0), (9 * k, k, 1), (7 * k, 2 * k, 0),
                                    (5 * k, k, 0), (8 * k, k, 0), (9 * k, k, 0),
                                    (9 * k, k, 1), (3 * k, k, 2)])
    hot = warm.hot_blocks(t, t.header.devices[0])
    # 5 and 8 read twice (5 seen first; 8 by the 8 KiB read of 7-8 too), 9 read once and
    # written twice, 7 read once; a discard (block 3) is no reference
    assert hot.blocks == [5, 8, 9, 7]
    assert hot.reads == 6


def test_requests_merge_neighbours_in_a_batch_and_align_to_the_cache_block() -> None:
    assert list(warm.requests_of([9, 3, 4, 5, 20], 4096)) == [
        (3 * 4096, 3 * 4096), (9 * 4096, 4096), (20 * 4096, 4096)]
    # batches keep the hottest first: 20 (batch 1) before 3 (batch 2)
    assert list(warm.requests_of([20, 3], 4096, batch=1)) == [(20 * 4096, 4096),
                                                              (3 * 4096, 4096)]
    # a 64 KiB cache block is read whole, once, however many hot 4k blocks it holds
    assert list(warm.requests_of([1, 2, 17, 15, 80], 4096, cache_block=65536)) == [
        (0, 2 * 65536), (5 * 65536, 65536)]
    # never a request over the limit
    reqs = list(warm.requests_of(list(range(600)), 4096, limit=1 << 20))
    assert max(ln for _, ln in reqs) == 1 << 20 and sum(ln for _, ln in reqs) == 600 * 4096


def test_the_plan_stops_at_the_bytes_asked(tmp_path: Path) -> None:
    k = 4096
    t = make_trace(tmp_path / "t", [(b * k, k, 0) for b in (1, 1, 1, 2, 2, 3, 40)])
    hot = warm.hot_blocks(t, t.header.devices[0])
    reqs, n = warm.plan_requests(hot, 2 * k, 0)
    assert n == 2 and reqs == [(k, 2 * k)]
    reqs, n = warm.plan_requests(hot, 64 * 1024, 65536)  # one cache block: blocks 1, 2, 3
    assert n == 3 and reqs == [(0, 65536)]


def test_a_trace_of_another_device_is_refused_with_what_it_has(tmp_path: Path) -> None:
    t = make_trace(tmp_path / "t", [(0, 4096, 0)], name="sdb", size=1 << 30)
    with pytest.raises(UsageError) as e:
        warm.traced_device(t, {"/dev/bcache0", "bcache0"}, 1 << 30)
    assert "another device" in e.value.message and "/dev/sdb" in e.value.message
    # the same name at another size is another device too (a disk re-used under the name)
    t = make_trace(tmp_path / "u", [(0, 4096, 0)], name="bcache0", size=1 << 29)
    with pytest.raises(UsageError):
        warm.traced_device(t, {"bcache0"}, 1 << 30)
    assert warm.traced_device(t, {"bcache0"}, 1 << 29).name == "bcache0"


class Inflight:
    """A slow device whose ``inflight`` reads busy for ``busy`` looks, and a clock."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.now = 0.0

    def read_opt(self, rel: str) -> str:
        if self.busy > 0:
            self.busy -= 1
            return "       1        0\n"
        return "       0        0\n"

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_pacer_waits_while_the_slow_device_is_busy_then_sends_one_anyway() -> None:
    fake = Inflight(busy=5)
    p = warm.Pacer(fake, ["block/sda"], busy_wait=0.5, sleep=fake.sleep,  # type: ignore[arg-type]
                   clock=lambda: fake.now)
    p.wait()
    assert fake.busy == 0 and p.forced == 0 and p.waited_s > 0
    fake = Inflight(busy=10_000)  # a constant load: one read goes after busy_wait
    p = warm.Pacer(fake, ["block/sda"], busy_wait=0.5, sleep=fake.sleep,  # type: ignore[arg-type]
                   clock=lambda: fake.now)
    p.wait()
    assert p.forced == 1 and 0.5 <= p.waited_s < 0.6
    fake = Inflight(busy=0)  # idle: no wait at all
    p = warm.Pacer(fake, ["block/sda"], sleep=fake.sleep, clock=lambda: fake.now)  # type: ignore[arg-type]
    p.wait()
    assert p.waited_s == 0 and fake.now == 0


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Sysfs, kinds.Kind]:
    kernel_writes(monkeypatch)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    sysfs = Sysfs(str(root))
    k = kinds.resolve(snapshot.take(sysfs), "/dev/bcache0", sysfs)
    return root, sysfs, k


def admission(sysfs: Sysfs) -> tuple[str, str]:
    """sequential_cutoff in bytes (the kernel prints 4.0M, the fake what was written), and
    the set's congested_read_threshold_us."""
    cutoff = Size.parse_hprint(sysfs.read("block/bcache0/bcache/sequential_cutoff").strip())
    return (str(cutoff.low),
            sysfs.read(f"fs/bcache/{CSET}/congested_read_threshold_us").strip())


def test_bcache_warm_sets_admission_for_the_reads_and_puts_it_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, sysfs, k = setup(tmp_path, monkeypatch)
    before = admission(sysfs)
    assert before != ("0", "0")
    t = make_trace(tmp_path / "t", [(b * 4096, 4096, 0) for b in (7, 7, 3)])
    seen: dict[str, Any] = {}

    def reads(node: str, reqs: list[tuple[int, int]], **kw: Any) -> None:
        seen["during"] = admission(sysfs)
        seen["journal"] = [p for _, p, _ in undo.journals()[0].entries]
        seen["reqs"] = list(reqs)

    monkeypatch.setattr(warm, "read_hot", reads)
    monkeypatch.setattr(warm, "device_size", lambda sysfs, node: None)
    p = warm.prepare(sysfs, k, t, 1 << 20)
    w = warm.run(sysfs, p)
    assert seen["during"] == ("0", "0")
    assert set(seen["journal"]) == {"block/ubda/bcache/sequential_cutoff",
                                     f"fs/bcache/{CSET}/congested_read_threshold_us"}
    assert seen["reqs"] == [(3 * 4096, 4096), (7 * 4096, 4096)]
    assert admission(sysfs) == before and undo.journals() == []
    assert any("sequential_cutoff" in s for s in w.settings)

    def fails(*a: Any, **kw: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(warm, "read_hot", fails)
    with pytest.raises(KeyboardInterrupt):
        warm.run(sysfs, p)
    assert admission(sysfs) == before and undo.journals() == []


def test_warm_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, sysfs, k = setup(tmp_path, monkeypatch)
    monkeypatch.setattr(warm, "device_size", lambda sysfs, node: None)
    t = make_trace(tmp_path / "t", [(0, 4096, 0)])
    cap = k.warm_capacity(sysfs)
    assert cap
    with pytest.raises(UsageError) as e:
        warm.prepare(sysfs, k, t, cap + 1)
    assert "more than /dev/bcache0's cache holds" in e.value.message
    assert warm.prepare(sysfs, k, t).nbytes == cap  # the default: the capacity
    assert warm.prepare(sysfs, k, t, share=2).nbytes == cap // 2
    none = kinds.Bcache(snapshot.take(sysfs).backings[0].__class__(
        **{**vars(snapshot.take(sysfs).backings[0]), "mode": CacheMode.NONE}))
    with pytest.raises(UsageError) as e:
        warm.prepare(sysfs, none, t)
    assert "cache mode none" in e.value.message
    # the CLI: each refusal exit 2, with its words
    (tmp_path / "bad").write_bytes(b"not a trace")
    rc, _, err = cli(root, ["warm", "/dev/ubdc", "--trace", str(tmp_path / "t")])
    assert rc == 2 and "not a cached device" in err, err
    rc, _, err = cli(root, ["warm", "/dev/bcache0", "--trace", str(tmp_path / "bad")])
    assert rc == 2 and "not a cachemgr trace" in err, err
    other = make_trace(tmp_path / "o", [(0, 4096, 0)], name="sdq")
    rc, _, err = cli(root, ["warm", "/dev/bcache0", "--trace", str(tmp_path / "o")])
    assert other and rc == 2 and "another device" in err, err
    rc, _, err = cli(root, ["warm", "/dev/bcache0", "--trace", str(tmp_path / "t"),
                            "--bytes", "0"])
    assert rc == 2, err


def test_replace_ssd_warms_as_its_last_journaled_step() -> None:
    for mod in (replace_bcache, replace_dmcache, replace_lvm):
        kind = mod.KIND
        assert kind.step_names[-1] == "warm", kind.name
        assert "warm" in kind.funcs
    said: list[str] = []
    j = replace_run.Journal(id="x", cset="c", options={}, old={}, backings=[])
    ctx = replace_run.Ctx(Sysfs("/nonexistent"), j, replace_run.Options(), said.append,
                          lambda m: None)
    replace_bcache.KIND.funcs["warm"](ctx)  # no --warm: nothing read, nothing changed
    assert said == ["warm: skipped (no --warm trace)"]
    lines = replace_run.describe(replace_run.Journal(
        id="x", cset="c", options=vars(replace_run.Options(warm="/tmp/h.trace")),
        old={"bus": "scsi", "node": "/dev/sdb", "name": "sdb", "wwid": "naa.5000",
             "serial": "S1", "hctl": "0:0:1:0"}, backings=[]))
    assert any("warm" in line and "(from /tmp/h.trace)" in line for line in lines), lines


def test_progress_reports_say_the_pass_and_give_a_bar_and_eta_for_one_pass() -> None:
    from cachemgr.ops.control import progress_line

    one = warm.WarmProgress("/dev/bcache0", 8192, 8192, 32768, waited_s=1.25, elapsed_s=2.0)
    assert progress_line(one) == str(one) == (
        "warm /dev/bcache0: 8.0 KiB of 32.0 KiB read (25%), waited 1.2 s for the VMs' IO")
    assert one.fraction == 0.25 and one.eta_s == 6.0
    # in passes (dm-cache): the bar is the pass's, no ETA (more passes may follow)
    third = warm.WarmProgress("/dev/mapper/vc", 5 << 20, 1 << 20, 2 << 20, pass_no=3,
                              passes=24, elapsed_s=1.0)
    assert third.fraction == 0.5 and third.eta_s is None
    assert "pass 3 (at most 24, until 3 in a row promote nothing): 1.0 MiB of 2.0 MiB read " \
           "(50%), 5.0 MiB in all" in str(third)


class SmqLike:
    """A dm-cache as warm sees it (Kind's warm_* methods): ``blocks`` cache blocks read a
    pass, ``promoted[n]`` of the missed ones promoted after pass n+1 (0 after the list),
    its counters (read hits, read misses, promotions, demotions) moved by the reads alone,
    or also by ``other`` reads of someone else's a pass (that all hit)."""

    node = "/dev/mapper/vc"
    warm_pass_s = 0.0
    warm_passes = 24

    def __init__(self, blocks: int, promoted: list[int], other: int = 0) -> None:
        self.blocks, self.promoted, self.other = blocks, promoted, other
        self.resident = self.hits = self.misses = self.promotions = self.passes = 0

    def read_pass(self, node: str, reqs: list[tuple[int, int]], *, out: warm.Warmed,
                  **kw: Any) -> None:
        assert len(reqs) == self.blocks  # one aligned 64 KiB read a cache block
        out.bytes_read += sum(ln for _, ln in reqs)
        self.hits += self.resident + self.other
        self.misses += self.blocks - self.resident
        n = self.promoted[self.passes] if self.passes < len(self.promoted) else 0
        self.passes += 1
        self.resident += n
        self.promotions += n

    def warm_cache_block(self) -> int:
        return 65536

    def reread(self, sysfs: Sysfs) -> Any:
        return type("R", (), {"hit_counters": lambda _: (self.hits, self.misses)})()

    def warm_settings(self, sysfs: Sysfs) -> list[tuple[str, str, str]]:
        return []

    def warm_slow_devices(self, sysfs: Sysfs) -> list[str]:
        return []

    def warm_admitted(self, sysfs: Sysfs) -> int:
        return self.promotions

    def warm_counters(self, sysfs: Sysfs) -> tuple[int, int, int, int]:
        return self.hits, self.misses, self.promotions, 0

    def warm_settle(self, sysfs: Sysfs) -> None:
        pass


def smq_warm(monkeypatch: pytest.MonkeyPatch, fake: SmqLike) -> tuple[warm.Warmed, list[str]]:
    # one hot 4 KiB block in each of ``blocks`` 64 KiB cache blocks, far apart
    hot = warm.Hot(tr.Device(0, fake.node, "dm-0", "252:0", 0), 4096,
                   [i * 64 for i in range(fake.blocks)], fake.blocks, 1.0)
    monkeypatch.setattr(warm, "read_hot", fake.read_pass)
    w = warm.warm(Sysfs("/nonexistent"), fake, hot, fake.blocks * 65536)  # type: ignore[arg-type]
    p = warm.Prepared(fake, hot, fake.blocks * 65536, 1 << 27)  # type: ignore[arg-type]
    return w, warm.admitted_lines(w, fake.warm_passes) + warm.summary(p, w)[:0]


def test_smq_passes_go_on_through_a_lull_and_end_when_three_admit_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # what the lab showed under load: a first pass that promotes nothing, then a lull of
    # two passes (which ended the warm before, with 10 of 100 blocks still to come)
    fake = SmqLike(100, [0, 40, 10, 0, 0, 10, 5])
    w, lines = smq_warm(monkeypatch, fake)
    assert w.passes_ended_by == "no more admitted" and w.passes == 10
    assert w.admitted == warm.Admitted(65, 65, 100, True)
    assert [p.delta(0) for p in w.pass_log] == [0, 0, 40, 50, 50, 50, 60, 65, 65, 65]
    assert lines[0].startswith("  in the cache at the end: 65 of the 100 cache blocks it "
                               "read (65%)") and "estimate" not in lines[0]
    assert "3 passes in a row admitted no more" in lines[1]
    assert w.to_json()["admitted"] == {"blocks": 65, "at_most": 65, "of": 100,
                                       "fraction": 0.65, "exact": True}
    assert w.to_json()["passes_ended_by"] == "no more admitted"


def test_smq_passes_that_run_out_while_admitting_say_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SmqLike(100, [0] + [3] * 30)
    w, lines = smq_warm(monkeypatch, fake)
    assert w.passes == 24 and w.passes_ended_by == "pass limit"
    # the last pass hit 66 and 3 promotions completed while it ran: they may be blocks it
    # found there already (counted twice), or of its misses: 66 to 69 in the cache
    assert w.admitted == warm.Admitted(66, 69, 100, False)
    assert "66 to 69 of the 100" in lines[0] and "estimate" in lines[0]
    assert "NOT all admitted" in lines[1] and "warm again" in lines[1]


def test_smq_passes_end_once_one_finds_every_block_in_the_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w, lines = smq_warm(monkeypatch, SmqLike(10, [0, 4, 6]))
    assert w.passes == 4 and w.passes_ended_by == "all admitted"
    assert w.admitted == warm.Admitted(10, 10, 10, True) and "all admitted" in lines[1]


def test_smq_admitting_nothing_says_none_and_other_reads_make_an_estimate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w, lines = smq_warm(monkeypatch, SmqLike(10, []))
    assert w.admitted == warm.Admitted(0, 0, 10, True) and "NONE admitted" in lines[1]
    # someone else's reads (hits) during the passes: counted, but not exact
    w, lines = smq_warm(monkeypatch, SmqLike(10, [0, 5], other=3))
    assert w.admitted is not None and not w.admitted.exact and "estimate" in lines[0]
