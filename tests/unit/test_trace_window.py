"""The recorder's window of unwritten records (cachemgr/procedures/trace.py, Window): the
same records, in the same order, at every flush, as the old way (append every record, sort
the whole window per chunk, cut at the bound)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cachemgr.procedures import trace as tr


class OldWindow:
    """The recorder before issue #34: a list sorted whole on every flush."""

    def __init__(self) -> None:
        self.pending: list[tr.Rec] = []

    def extend(self, new: list[tr.Rec]) -> None:
        self.pending.extend(new)

    def upto(self, t: float | None) -> list[tr.Rec]:
        self.pending.sort()
        n = len(self.pending) if t is None else next(
            (i for i, p in enumerate(self.pending) if p[0] > t), len(self.pending))
        out = self.pending[:n]
        del self.pending[:n]
        return out

    def __len__(self) -> int:
        return len(self.pending)


def _rec(t: float, i: int) -> tr.Rec:
    return (t, 4096 * (i % 7), 4096, i % 3, i % 2)


# a chunk: records with times (ms, some equal, some before the window's end); then a flush
# bound (ms before the chunk's newest), or none
chunks = st.lists(st.tuples(st.lists(st.integers(0, 60), max_size=30),
                            st.one_of(st.none(), st.integers(0, 40))), max_size=25)


@settings(max_examples=300, deadline=None)
@given(chunks)
def test_window_hands_out_what_the_sort_did(steps: list[tuple[list[int], int | None]]) -> None:
    new, old = tr.Window(), OldWindow()
    clock = 0
    i = 0
    for times, back in steps:
        recs = []
        for dt in times:  # around the clock: late ones (another CPU's) and new ones
            recs.append(_rec(max(0, clock + dt - 30) / 1000, i))
            i += 1
        clock += 20
        new.extend(list(recs))
        old.extend(list(recs))
        assert len(new) == len(old)
        if back is not None:
            bound = (clock - back) / 1000
            assert new.upto(bound) == old.upto(bound)
    assert new.upto(None) == old.upto(None)
    assert len(new) == 0


def test_window_in_order_stream_and_two_cpus() -> None:
    """A long stream as blktrace gives it: two CPUs' batches interleaved, each in order;
    flushed as the recorder does (more than 4096 held: up to 2 s before the newest)."""
    rnd = random.Random(1)
    new, old = tr.Window(), OldWindow()
    written_new: list[tr.Rec] = []
    written_old: list[tr.Rec] = []
    for chunk in range(400):
        recs = []
        for _cpu in (0, 1):  # each CPU's batch in order, reaching 20 ms back
            recs += [_rec(chunk / 100 + x, chunk)
                     for x in sorted(rnd.random() * 0.02 for _ in range(rnd.randint(0, 200)))]
        newest = max(r[0] for r in recs) if recs else 0.0
        new.extend(list(recs))
        old.extend(list(recs))
        if len(old) > 4096:
            written_new += new.upto(newest - 0.05)
            written_old += old.upto(newest - 0.05)
    written_new += new.upto(None)
    written_old += old.upto(None)
    assert written_new == written_old
    assert [r[0] for r in written_new] == sorted(r[0] for r in written_new)
    assert len(written_new) > 40000


def test_window_keeps_its_written_prefix_small() -> None:
    """The written records are dropped once they are half the list: the list holds no more
    than twice what is pending."""
    w = tr.Window()
    for k in range(100):
        w.extend([(k + j / 10, 0, 4096, 0, 0) for j in range(10)])
        w.upto(k - 5.0)
        assert len(w.items) <= 2 * len(w) + 10
