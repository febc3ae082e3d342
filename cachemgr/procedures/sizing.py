"""Cache sizing from a recorded trace: the LRU miss-ratio curve by reuse distances (SHARDS).

The reuse (stack) distance of a reference is the number of distinct blocks touched since the
same block was last touched; an LRU cache of C blocks hits exactly the references of distance
< C (Mattson et al., "Evaluation techniques for storage hierarchies", 1970). Distances are
counted with a Fenwick tree over the reference positions (one marker on each block's latest
position: the markers between two uses of a block are the distinct blocks in between), in
O(N log N). On a sampled trace (trace.py), a distance among sampled blocks divided by the
rate estimates the full distance; SHARDS_adj (Waldspurger et al., FAST '15, section 4.2) adds
the difference between the expected and the actual number of sampled references to the
smallest distance, which removes most of the error a few very popular blocks cause.

Which blocks of middle popularity a sample draws decides most of what error is left: the
recorder also counts the references of a larger nested sample of blocks (trace.Counts), and
the sample is weighed to those counts per frequency class (two-phase sampling for
stratification, Neyman 1938; Cochran, "Sampling Techniques", 1977, section 12.2): a class the
sample drew too many blocks of weighs less, in the hit counts and in the distances.

Reads and writes share one LRU (bcache and dm-cache in writeback or writethrough put both in
the cache); each has its own hit ratio. Discards are counted, not cached.
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachemgr.backends.blktrace import OP_DISCARD
from cachemgr.core.errors import UsageError
from cachemgr.procedures import trace as tr

CURVE_POINTS_LOG = 320  # geometric grid from one block to the footprint
CURVE_POINTS_LIN = 80  # and a linear one, so that any size reads off between two neighbours
DEFAULT_SSD_LATENCY_MS = 0.1  # a SATA SSD's 4 KiB QD1 read, about
# A sample at rate R sees one block in 1/R: below about 100/R blocks its curve is mostly the
# SHARDS_adj correction and the few hottest blocks that happen to be sampled (measured:
# benchmarks/sizing_bench.py sampling, docs/benchmarks.md "Cache sizing").
RESOLVED_SAMPLED_BLOCKS = 100


def resolved_blocks(rate: float) -> int:
    """The smallest cache (in blocks) a curve sampled at ``rate`` is read at."""
    return 1 if rate >= 1 else math.ceil(RESOLVED_SAMPLED_BLOCKS / rate)


@dataclass
class Reuse:
    """The reuse times of the counted blocks' references (tr.Counts, a sample of blocks at
    ``rate``), per (jackknife group, op): counts per bin (tr.rt_bin) and first references.
    Below what a sample resolves the curve comes from them by the AET model (Hu et al.,
    "Kinetic modeling of data cache sharing by co-located applications", USENIX ATC'16: the
    average eviction time). With P(t) the share of all references whose reuse time exceeds t
    (a first reference: never referenced before), an LRU cache of C blocks keeps a block for
    the time T where the integral of P from 0 to T is C, and a reference hits when its reuse
    time is at most T. Each counted reference stands for 1 / rate; what they fall short of
    the whole trace's references is put at reuse time 0 (hits in any cache), as SHARDS_adj
    does with distances. ``scale`` turns the recorded times into the analysed devices' own
    (their share of all references, when only some of the recorded devices are analysed)."""

    rate: float
    cells: dict[tuple[int, int], dict[int, int]]  # (group, op) -> bin -> references
    first: dict[tuple[int, int], int]  # (group, op) -> first references
    scale: float = 1.0
    # derived from the fields above on first use (dataclasses.replace starts them afresh)
    _prep: tuple[list[tuple[float, float, list[float]]], list[float], list[float]] | None = \
        field(default=None, init=False, repr=False, compare=False)
    # the last eviction time asked for and its arguments: hit_ratio asks it once per op
    _last_t: tuple[float, float, float] | None = field(default=None, init=False, repr=False,
                                                       compare=False)

    def without(self, drop: int) -> Reuse:
        """A jackknife replicate's: the blocks of group ``drop`` left out."""
        return Reuse(self.rate * (tr.GROUPS - 1) / tr.GROUPS,
                     {k: v for k, v in self.cells.items() if k[0] != drop},
                     {k: v for k, v in self.first.items() if k[0] != drop}, self.scale)

    def _prepare(self) -> tuple[list[tuple[float, float, list[float]]], list[float],
                                list[float]]:
        """Per bin (sorted): its range and the whole trace's references per op it stands
        for; the first references per op; and all of them per op. An exact time t is the
        range [t, t]; the times [lo, hi) of a wider bin are spread evenly over
        [lo - 1/2, hi - 1/2)."""
        if self._prep is None:
            inv = 1 / self.rate
            per: dict[int, list[float]] = {}
            for (_g, op), bins in self.cells.items():
                for b, n in bins.items():
                    per.setdefault(b, [0.0, 0.0])[op] += n * inv
            first = [0.0, 0.0]
            for (_g, op), n in self.first.items():
                first[op] += n * inv
            rows = []
            for b in sorted(per):
                lo, hi = tr.rt_bin_range(b)
                if hi == lo + 1:
                    rows.append((lo * self.scale, lo * self.scale, per[b]))
                else:
                    rows.append(((lo - 0.5) * self.scale, (hi - 0.5) * self.scale, per[b]))
            every = [first[op] + sum(r[2][op] for r in rows) for op in (0, 1)]
            self._prep = (rows, first, every)
        return self._prep

    def eviction_time(self, cache_blocks: float, total: float) -> float:
        """T where the integral of P(t) from 0 to T is ``cache_blocks``; ``total``: the
        whole trace's references (inf: the cache holds everything)."""
        if self._last_t is not None and self._last_t[:2] == (cache_blocks, total):
            return self._last_t[2]
        t = self._eviction_time(cache_blocks, total)
        self._last_t = (cache_blocks, total, t)
        return t

    def _eviction_time(self, cache_blocks: float, total: float) -> float:
        rows, _first, every = self._prepare()
        if total <= 0:
            return math.inf
        # S(T) = (sum over references of min(rt, T), first ones as infinite) / total
        above = every[0] + every[1]  # times above pos
        s = 0.0  # the integral up to pos
        pos = 0.0
        c = cache_blocks
        for lo, hi, n in rows:
            k = n[0] + n[1]
            if lo > pos:  # a stretch without times: P constant
                if above > 0 and s + above / total * (lo - pos) >= c:
                    return pos + (c - s) * total / above
                s += above / total * (lo - pos)
                pos = lo
            w = hi - lo
            if w == 0:  # an exact time: P drops by k there
                above -= k
                continue
            # inside a bin: P falls linearly from above to above - k over [lo, hi)
            area = (above - k / 2) * w / total
            if s + area >= c:
                # solve (above x - k x^2 / (2 w)) / total = c - s for x in [0, w]
                need = (c - s) * total
                if k == 0:
                    return lo + need / above
                a, b = k / (2 * w), -above
                disc = max(0.0, b * b - 4 * a * need)
                return lo + min(w, (-b - math.sqrt(disc)) / (2 * a))
            s += area
            above -= k
            pos = hi
        if above <= 1e-9:
            return math.inf  # every reference was a reuse: the whole footprint fits
        return pos + (c - s) * total / above

    def hits(self, op: int, cache_blocks: float, refs: Sequence[float]) -> float:
        """The whole trace's references of ``op`` (``refs``: the whole trace's, per op) that
        hit: those whose reuse time is at most the eviction time, and what the counted
        references fall short of, at time 0: mostly hot blocks the counts did not draw,
        which hit in any cache their own number of blocks fits, so ramped in over the first
        1 / rate blocks as SHARDS_adj is."""
        rows, _first, every = self._prepare()
        t = self.eviction_time(cache_blocks, refs[0] + refs[1])
        hits = (refs[op] - every[op]) * min(1.0, cache_blocks * self.rate)
        for lo, hi, n in rows:
            if lo == hi:  # an exact time: a hit from T = time, partly from time - 1 on
                hits += n[op] * min(1.0, max(0.0, t - lo + 1))
            elif hi <= t:
                hits += n[op]
            elif lo < t:
                hits += n[op] * (t - lo) / (hi - lo)
            else:
                break
        return max(0.0, hits)


@dataclass
class Strata:
    """Phase one of a two-phase sample: for a nested sample of blocks at ``rate`` (what the
    recorder counted, tr.Counts, or the trace's own sample when it is analysed at a lower
    rate), per (jackknife group, frequency class): blocks, read and write references."""

    rate: float
    cells: dict[tuple[int, int], tuple[int, int, int]]
    source: str  # "recorder" or "trace"
    reuse: Reuse | None = None  # their reuse times (none from an older recorder)

    def without(self, drop: int) -> Strata:
        """A jackknife replicate's: the blocks of group ``drop`` left out."""
        keep = (tr.GROUPS - 1) / tr.GROUPS
        return Strata(self.rate * keep, {k: v for k, v in self.cells.items() if k[0] != drop},
                      self.source, None if self.reuse is None else self.reuse.without(drop))

    def classes(self) -> dict[int, tuple[float, float, float]]:
        """Per frequency class, the whole trace's blocks, reads and writes (estimated)."""
        out: dict[int, list[int]] = {}
        for (_g, c), v in self.cells.items():
            t = out.setdefault(c, [0, 0, 0])
            for i in range(3):
                t[i] += v[i]
        return {c: (t[0] / self.rate, t[1] / self.rate, t[2] / self.rate)
                for c, t in out.items()}


@dataclass
class Histogram:
    """Sampled references by estimated reuse distance (in blocks of the whole trace), per op
    (read, write), each with the number of the whole trace's references it stands for."""

    block: int
    rate: float
    # per op: the distances of the sampled reuses, sorted; the cumulative weights of the
    # references up to each, and of weight x distance (hits() interpolates with them)
    distances: list[array[float]] = field(default_factory=lambda: [array("d"), array("d")])
    cum: list[array[float]] = field(default_factory=lambda: [array("d", [0.0]),
                                                             array("d", [0.0])])
    cum_d: list[array[float]] = field(default_factory=lambda: [array("d", [0.0]),
                                                               array("d", [0.0])])
    cold: list[int] = field(default_factory=lambda: [0, 0])  # sampled first references
    refs: list[float] = field(default_factory=lambda: [0.0, 0.0])  # the whole trace's, per op
    adjust: list[float] = field(default_factory=lambda: [0.0, 0.0])  # SHARDS_adj, per op
    unique: int = 0  # distinct sampled blocks
    discards: int = 0
    # a sampled trace's references (keys, ops), the whole trace's references per op (None
    # without a trailer) and the strata: what the standard errors are made from
    sample: tuple[list[int], list[int]] | None = None
    totals: tuple[float, float] | None = None
    strata: Strata | None = None
    # below this cache size (blocks) the curve comes from the strata's reuse times (AET),
    # against the whole trace's references per op
    aet_below: float = 0.0
    aet_refs: tuple[float, float] = (0.0, 0.0)
    # the jackknife's replicates of a sampled trace, made on the first stderr()
    _reps: list[Histogram] | None = field(default=None, repr=False, compare=False)

    def hits(self, op: int, cache_blocks: float) -> float:
        """The whole trace's references of ``op`` that hit an LRU cache of ``cache_blocks``
        blocks, as the sample estimates them."""
        if cache_blocks < self.aet_below and self.strata is not None \
                and self.strata.reuse is not None:
            # the model below, the sample from aet_below up; the model's figure is capped at
            # the sample's there, so that the curve does not fall where one meets the other
            modelled = self.strata.reuse.hits(op, cache_blocks, self.aet_refs) \
                * self.refs[op] / max(self.aet_refs[op], 1e-300)
            return min(modelled, self._sampled_hits(op, self.aet_below))
        return self._sampled_hits(op, cache_blocks)

    def _sampled_hits(self, op: int, cache_blocks: float) -> float:
        # a sampled reference at estimated distance d stands for full distances in
        # [d, d + 1 / rate): at a cache of C blocks it is a hit for the part of that interval
        # below C, clamp((C - d) x rate, 0, 1); at rate 1 that is exactly "d < C".
        # SHARDS_adj's correction sits at distance 0.
        c, r = cache_blocks, self.rate
        d, cw, cwd = self.distances[op], self.cum[op], self.cum_d[op]
        i = bisect.bisect_right(d, c - 1 / r)
        j = max(i, bisect.bisect_left(d, c))
        n = cw[i]
        if j > i:
            n += r * (c * (cw[j] - cw[i]) - (cwd[j] - cwd[i]))
        return max(0.0, n + self.adjust[op] * min(1.0, c * r))

    def hit_ratio(self, cache_bytes: float, op: int | None = None) -> float | None:
        c = cache_bytes / self.block
        if op is None:
            total = self.refs[0] + self.refs[1]
            if total <= 0:
                return None
            return max(0.0, min(1.0, (self.hits(0, c) + self.hits(1, c)) / total))
        if self.refs[op] <= 0:
            return None
        return max(0.0, min(1.0, self.hits(op, c) / self.refs[op]))

    def stderr(self, sizes_bytes: Sequence[float], op: int | None = None) -> list[float]:
        """The standard error of :meth:`hit_ratio` at each size (0 at rate 1; nan where
        there is nothing to say), by the delete-a-group jackknife: the sampled blocks are
        split into tr.GROUPS groups by a second hash of their address, the curve is computed
        again without each group (a sample at rate x (G-1)/G, distances, strata and all),
        and Var = (G-1)/G x the sum of the squared deviations of those curves from their
        mean. It covers what makes a sample's curve wrong: which blocks were drawn, in the
        sample and in the strata's counts, and the noise of the distances estimated from
        sampled blocks."""
        if self.rate >= 1:
            return [0.0] * len(sizes_bytes)
        if self.sample is None or not self.sample[0]:
            return [math.nan] * len(sizes_bytes)
        reps = self._replicates()
        g = len(reps)
        out = []
        for c in sizes_bytes:
            vals = [h.hit_ratio(c, op) for h in reps]
            if any(v is None for v in vals):
                out.append(math.nan)
                continue
            xs = [float(v or 0.0) for v in vals]
            mean = sum(xs) / g
            var = (g - 1) / g * sum((v - mean) ** 2 for v in xs)
            if c / self.block < self.aet_below and self.strata is not None:
                # modelled from the counted blocks alone: a sample of them at the strata's
                # rate, none at rate 1 (the finite-population correction)
                var *= max(0.0, 1.0 - self.strata.rate)
            out.append(math.sqrt(var))
        return out

    def _replicates(self) -> list[Histogram]:
        if self._reps is None:
            assert self.sample is not None
            keys, ops = self.sample
            g = tr.GROUPS
            keep = (g - 1) / g
            group = [tr.group(k) for k in keys]
            self._reps = []
            for drop in range(g):
                kept = [i for i, x in enumerate(group) if x != drop]
                st = None if self.strata is None else self.strata.without(drop)
                rep = _count([keys[i] for i in kept], [ops[i] for i in kept], self.block,
                             self.rate * keep, 0, self.totals, st)
                rep.aet_below = self.aet_below
                self._reps.append(rep)
        return self._reps

    @property
    def sampled_refs(self) -> int:
        return len(self.distances[0]) + len(self.distances[1]) + sum(self.cold)

    @property
    def footprint_bytes(self) -> int:
        """The cache size from which the curve is flat: every reuse hits."""
        far = max((d[-1] for d in self.distances if d), default=0.0)
        return math.ceil(far + 1 / self.rate - 1e-9) * self.block


# an asked size whose two standard errors exceed this gets a note
SE_NOTE = 0.02


class _Fenwick:
    __slots__ = ("n", "t")

    def __init__(self, n: int) -> None:
        self.n = n
        self.t = [0.0] * (n + 1)

    def add(self, i: int, v: float) -> None:
        t, n = self.t, self.n
        while i <= n:
            t[i] += v
            i += i & -i

    def prefix(self, i: int) -> float:
        t = self.t
        s = 0.0
        while i > 0:
            s += t[i]
            i -= i & -i
        return s


def references(trace: tr.Trace, *, rate: float | None = None, block: int | None = None,
               devices: Sequence[int] | None = None) -> tuple[list[int], list[int], int, float,
                                                               int]:
    """The sampled block references of ``trace`` in time order: keys, ops, block, rate and
    the number of discarded blocks. ``rate`` below the recorded one samples further."""
    h = trace.header
    rate = h.rate if rate is None else rate
    if rate > h.rate + 1e-12:
        raise UsageError(f"the trace was sampled at {h.rate:g}; it cannot be analysed at the "
                         f"higher rate {rate:g}")
    block = h.block if block is None else block
    if block < 512 or block & (block - 1):
        raise UsageError(f"the block size is a power of two of at least 512, not {block}")
    if block != h.block and h.rate < 1:
        raise UsageError(f"the trace was sampled in {h.block}-byte blocks; a sampled trace is "
                         f"analysed in the same blocks", hint=f"--block {h.block}")
    thr = tr.threshold(rate)
    keys: list[int] = []
    ops: list[int] = []
    discards = 0
    for dev, first, last, op in _spans(trace, block, devices):
        if op == OP_DISCARD:
            discards += last - first + 1
            continue
        for b in range(first, last + 1):
            if rate >= 1 or tr.sampled(dev, b, thr):
                keys.append(tr.key(dev, b))
                ops.append(op)
    return keys, ops, block, rate, discards


def _spans(trace: tr.Trace, block: int, devices: Sequence[int] | None
           ) -> Iterator[tuple[int, int, int, int]]:
    """The requests of ``devices`` (None: all) in time order, in blocks of ``block`` bytes:
    device index, first and last block, op."""
    shift = block.bit_length() - 1
    want = None if devices is None else set(devices)
    for _t, off, ln, dev, op in tr.requests(trace):
        if want is None or dev in want:
            yield dev, off >> shift, (off + ln - 1) >> shift, op


def phase_one(trace: tr.Trace, rate: float, block: int,
              devices: Sequence[int] | None = None) -> Strata | None:
    """The strata for a sample at ``rate``: the recorder's counts, or the trace's own
    sample when it was recorded at a higher rate than ``rate``; None when neither counts more
    blocks than the sample itself."""
    h = trace.header
    t = trace.trailer or {}
    bc = t.get("block_counts")
    if bc is not None and block == h.block:
        st = _recorded_strata(bc, len(h.devices), devices, scale=_time_scale(t, h, devices))
        if st is not None and st.rate > rate:
            return st
    if h.rate > rate:
        # the recorder's counting, over the trace's own blocks: as bounded, and a block of a
        # sampled trace is counted only when it is in that sample (a request is kept whole
        # when one of its blocks is). Reuse times are the whole trace's only in a trace of
        # every request (in a sampled one they would count sampled references).
        c = tr.Counts(thr=tr.threshold(h.rate), floor=tr.threshold(rate), limit=tr.COUNT_TABLE,
                      reuse=h.rate >= 1)
        for dev, first, last, op in _spans(trace, block, devices):
            for b in range(first, last + 1):
                c.add(dev, b, op)  # a discard is not counted
        return _recorded_strata(c.to_json(), len(h.devices), None, "trace")
    return None


def _time_scale(t: dict[str, Any], h: tr.Header, devices: Sequence[int] | None
                ) -> float | None:
    """The recorder's reuse times count the references of every recorded device: for some
    of them, their share of the references turns those times into theirs (exact for one
    device; for several, as if their requests were spread evenly among the others'). None
    when the per-device totals are missing."""
    if devices is None or set(devices) >= set(range(len(h.devices))):
        return 1.0
    some, every = _totals(t, len(h.devices), devices), _totals(t, len(h.devices), None)
    if some is None or every is None or sum(every) <= 0:
        return None
    return sum(some) / sum(every)


def _damaged(why: str) -> tr.TraceFormatError:
    return tr.TraceFormatError(f"the trace's block counts are damaged: {why}")


def _count_int(x: Any, what: str) -> int:
    if type(x) is not int or not 0 <= x < 1 << 62:
        raise _damaged(f"{what} is {x!r}, not a count")
    return x


def counting_stopped(trace: tr.Trace) -> bool:
    """Whether the recorder counted blocks and stopped: its table could not hold the blocks
    of any rate above the sample's (tr.Counts.shrink)."""
    bc = (trace.trailer or {}).get("block_counts")
    return isinstance(bc, dict) and bc.get("threshold") == 0


def _recorded_strata(bc: Any, ndev: int, devices: Sequence[int] | None,
                     source: str = "recorder", scale: float | None = 1.0) -> Strata | None:
    """``block_counts`` (tr.Counts.to_json) as strata, checked: it is data from a file. None
    when counting stopped. ``scale``: what the reuse times are multiplied by (None: they are
    not used)."""
    if not isinstance(bc, dict) or not isinstance(bc.get("cells"), list):
        raise _damaged("not a table of cells")
    thr = _count_int(bc.get("threshold"), "the threshold")
    raw = bc.get("rate")
    rate = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) \
        else math.nan
    if thr > 1 << tr.RATE_BITS or not abs(rate - thr / (1 << tr.RATE_BITS)) <= 1e-12:
        raise _damaged(f"rate {raw!r} is not the threshold's ({thr})")
    if bc.get("groups") != tr.GROUPS:
        raise _damaged(f"{bc.get('groups')!r} jackknife groups, not {tr.GROUPS}")
    rows = bc["cells"]
    if thr == 0:
        if rows:
            raise _damaged("cells without a threshold")
        return None
    cells: dict[tuple[int, int], tuple[int, int, int]] = {}
    want = None if devices is None else set(devices)
    for row in rows:
        if not isinstance(row, list) or len(row) != 6:
            raise _damaged(f"a cell is {row!r}")
        dev, g, c, b, r, w = (_count_int(x, "a cell's field") for x in row)
        if dev >= ndev or g >= tr.GROUPS or c > 62 or not b << c <= r + w < b << (c + 1):
            raise _damaged(f"the cell {row!r} is out of range")
        if want is None or dev in want:
            old = cells.get((g, c), (0, 0, 0))
            cells[(g, c)] = (old[0] + b, old[1] + r, old[2] + w)
    reuse = None
    if "reuse" in bc:  # checked even when not used
        reuse = _recorded_reuse(bc["reuse"], rate, ndev, want, scale or 1.0)
    return Strata(rate, cells, source, reuse if scale is not None else None)


def _recorded_reuse(ru: Any, rate: float, ndev: int, want: set[int] | None, scale: float
                    ) -> Reuse | None:
    """``block_counts.reuse`` (tr.Counts.to_json), checked; None when it has no references."""
    if not isinstance(ru, dict) or not isinstance(ru.get("times"), list) \
            or not isinstance(ru.get("first"), list):
        raise _damaged("the reuse times are not tables")
    if ru.get("bins_per_octave") != 8 or ru.get("exact_below") != tr.RT_EXACT:
        raise _damaged(f"reuse time bins {ru.get('bins_per_octave')!r} per octave from "
                       f"{ru.get('exact_below')!r}, not 8 from {tr.RT_EXACT}")
    _count_int(ru.get("references"), "the references")
    cells: dict[tuple[int, int], dict[int, int]] = {}
    first: dict[tuple[int, int], int] = {}
    for row in ru["times"]:
        if not isinstance(row, list) or len(row) != 5:
            raise _damaged(f"a reuse time cell is {row!r}")
        dev, g, op, b, n = (_count_int(x, "a reuse time cell's field") for x in row)
        if dev >= ndev or g >= tr.GROUPS or op > 1 or not 1 <= b < tr.RT_COLD or n < 1:
            raise _damaged(f"the reuse time cell {row!r} is out of range")
        if want is None or dev in want:
            bins = cells.setdefault((g, op), {})
            bins[b] = bins.get(b, 0) + n
    for row in ru["first"]:
        if not isinstance(row, list) or len(row) != 4:
            raise _damaged(f"a first-reference cell is {row!r}")
        dev, g, op, n = (_count_int(x, "a first-reference cell's field") for x in row)
        if dev >= ndev or g >= tr.GROUPS or op > 1 or n < 1:
            raise _damaged(f"the first-reference cell {row!r} is out of range")
        if want is None or dev in want:
            first[(g, op)] = first.get((g, op), 0) + n
    if not first:
        return None
    return Reuse(rate, cells, first, scale)


def histogram(trace: tr.Trace, *, rate: float | None = None, block: int | None = None,
              devices: Sequence[int] | None = None) -> Histogram:
    keys, ops, block, rate, discards = references(trace, rate=rate, block=block,
                                                  devices=devices)
    t = trace.trailer
    totals = strata = None
    if rate < 1:
        if t is not None and block == trace.header.block:
            # SHARDS_adj: the whole trace's references, against which the sample is weighed
            totals = _totals(t, len(trace.header.devices), devices)
        if totals is None and trace.header.rate >= 1:
            # a trace of every request holds them (an older recorder had no per-device totals)
            totals = _references_per_op(trace, block, devices)
        strata = phase_one(trace, rate, block, devices)
    hist = _count(keys, ops, block, rate, discards, totals, strata)
    if rate < 1:
        hist.sample = (keys, ops)
    return hist


def _references_per_op(trace: tr.Trace, block: int, devices: Sequence[int] | None
                       ) -> tuple[float, float]:
    n = [0, 0, 0]
    for _dev, first, last, op in _spans(trace, block, devices):
        n[op] += last - first + 1
    return float(n[0]), float(n[1])


def _totals(t: dict[str, Any], ndev: int, devices: Sequence[int] | None
            ) -> tuple[float, float] | None:
    """The whole trace's block references per op (read, write): all devices' from the
    trailer's totals, some devices' from its per-device ones (None from an older recorder)."""
    try:
        if devices is None:
            blocks = t.get("blocks", {})
            return float(blocks.get("read", 0)), float(blocks.get("write", 0))
        per = t.get("device_blocks")
        if not isinstance(per, list) or len(per) != ndev:
            return None
        return (float(sum(per[d]["read"] for d in devices)),
                float(sum(per[d]["write"] for d in devices)))
    except (AttributeError, TypeError, KeyError, IndexError, ValueError, OverflowError):
        raise tr.TraceFormatError("the trace's totals are damaged") from None


def _count(keys: list[int], ops: list[int], block: int, rate: float, discards: int,
           totals: tuple[float, float] | None, strata: Strata | None = None) -> Histogram:
    """Reuse distances of the sampled references ``keys`` (their ``ops``) into a Histogram.

    Without strata, each sampled block stands for 1 / rate blocks and each sampled reference
    for 1 / rate references. With strata, a sampled block of frequency class c stands for
    B_c / s_c blocks (B_c the class's blocks in the whole trace as the strata estimate it,
    s_c the sample's) in the distances, and its references of op o for N_co / n_co
    references: the sample is weighed to the strata's totals, class by class (post-
    stratification). ``totals`` (the whole trace's references per op, or else the strata's
    estimate) puts what the sampled references do not account for at distance 0
    (SHARDS_adj): the references of classes no sampled block belongs to, mostly a few very
    popular blocks, hit in any cache the sample resolves."""
    inv = 1 / rate
    hist = Histogram(block=block, rate=rate, discards=discards, totals=totals, strata=strata)
    if rate < 1 and strata is not None and strata.reuse is not None:
        hist.aet_below = resolved_blocks(rate)  # a jackknife replicate takes its parent's
    bw: dict[int, float] = {}  # per sampled block, when strata: its weight in the distances
    rw: dict[int, tuple[float, float]] = {}  # and its references' per op
    if strata is not None:
        per: dict[int, list[int]] = {}
        for k, op in zip(keys, ops, strict=True):
            per.setdefault(k, [0, 0])[op] += 1
        cls = {k: tr.freq_class(v[0] + v[1]) for k, v in per.items()}
        s: dict[int, list[int]] = {}
        for k, c in cls.items():
            t = s.setdefault(c, [0, 0, 0])
            t[0] += 1
            t[1] += per[k][0]
            t[2] += per[k][1]
        whole = strata.classes()
        weight: dict[int, tuple[float, float, float]] = {}
        for c, (sb, sr, sw) in s.items():
            wb, wr, ww = whole.get(c, (0.0, 0.0, 0.0))
            # a class the strata do not have (the sample is nested in them: only a
            # replicate's rounding) keeps the uniform weights
            weight[c] = (wb / sb if wb else inv, wr / sr if sr and wr else inv,
                         ww / sw if sw and ww else inv)
        for k, c in cls.items():
            bw[k] = weight[c][0]
            rw[k] = (weight[c][1], weight[c][2])
        if totals is None:
            totals = (sum(v[1] for v in whole.values()), sum(v[2] for v in whole.values()))
    fw = _Fenwick(len(keys))
    last: dict[int, int] = {}
    dist: list[list[float]] = [[], []]
    vals: list[list[float]] = [[], []]  # with strata: each reuse's weight
    cold_w = [0.0, 0.0]
    uniform = strata is None
    for i, (k, op) in enumerate(zip(keys, ops, strict=True), 1):
        w = inv if uniform else bw[k]
        p = last.get(k)
        if p is None:
            hist.cold[op] += 1
            cold_w[op] += inv if uniform else rw[k][op]
        else:
            dist[op].append(fw.prefix(i - 1) - fw.prefix(p))
            if not uniform:
                vals[op].append(rw[k][op])
            fw.add(p, -w)
        fw.add(i, w)
        last[k] = i
    hist.unique = len(last)
    for op in (0, 1):
        ws: Iterable[float]
        if uniform:
            ds = sorted(dist[op])
            ws = itertools.repeat(inv, len(ds))
        else:
            order = sorted(range(len(dist[op])), key=dist[op].__getitem__)
            ds = [dist[op][i] for i in order]
            ws = [vals[op][i] for i in order]
        cw, cwd = array("d", [0.0]), array("d", [0.0])
        a = b = 0.0
        for d, v in zip(ds, ws, strict=False):
            a += v
            b += v * d
            cw.append(a)
            cwd.append(b)
        hist.distances[op], hist.cum[op], hist.cum_d[op] = array("d", ds), cw, cwd
        hist.refs[op] = a + cold_w[op]
    if totals is not None:
        for op in (0, 1):
            if hist.refs[op] > 0:
                hist.adjust[op] = totals[op] - hist.refs[op]
                hist.refs[op] = totals[op]
        # the model times all references, the writes too when the sample drew none
        hist.aet_refs = (totals[0], totals[1])
    return hist


# ----------------------------------------------------------------------------- the curve


@dataclass(frozen=True)
class Point:
    cache_bytes: int
    hit_ratio: float | None
    read_hit_ratio: float | None
    write_hit_ratio: float | None
    # standard errors of a sampled trace's figures (0 at rate 1; None: nothing to say)
    hit_ratio_se: float | None = None
    read_hit_ratio_se: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"cache_bytes": self.cache_bytes, "hit_ratio": _r(self.hit_ratio),
                "read_hit_ratio": _r(self.read_hit_ratio),
                "write_hit_ratio": _r(self.write_hit_ratio),
                "hit_ratio_se": _r(self.hit_ratio_se),
                "read_hit_ratio_se": _r(self.read_hit_ratio_se)}


def _r(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 5)


def points(h: Histogram, sizes: Sequence[int]) -> list[Point]:
    """The curve at ``sizes``, with the standard errors of a sampled trace."""
    se, rse = h.stderr(sizes), h.stderr(sizes, 0)
    return [Point(c, h.hit_ratio(c), h.hit_ratio(c, 0), h.hit_ratio(c, 1), se[i], rse[i])
            for i, c in enumerate(sizes)]


def point(h: Histogram, cache_bytes: int) -> Point:
    return points(h, [cache_bytes])[0]


def grid(h: Histogram, extra: Sequence[int] = ()) -> list[int]:
    """Cache sizes for the curve: one block to a little past the footprint, both spacings."""
    top = max(h.footprint_bytes, h.block) * 1.05
    sizes = {h.block * max(1, round(top / h.block * i / CURVE_POINTS_LIN))
             for i in range(1, CURVE_POINTS_LIN + 1)}
    ratio = (top / h.block) ** (1 / CURVE_POINTS_LOG)
    sizes |= {h.block * max(1, round(ratio ** i)) for i in range(CURVE_POINTS_LOG + 1)}
    sizes |= set(extra)
    return sorted(sizes)


def curve(h: Histogram, extra: Sequence[int] = ()) -> list[Point]:
    return points(h, grid(h, extra))


def knee(points: Sequence[Point]) -> Point | None:
    """The working set's knee: the point farthest above the line from the empty cache to the
    footprint, curve and sizes both scaled to 1 (Satopaa et al.'s Kneedle, one pass)."""
    pts = [p for p in points if p.hit_ratio is not None]
    if not pts:
        return None
    top = max(p.hit_ratio or 0.0 for p in pts)
    full = next((p for p in pts if (p.hit_ratio or 0.0) >= top - 1e-9), pts[-1])
    if top <= 0:
        return None
    return max((p for p in pts if p.cache_bytes <= full.cache_bytes),
               key=lambda p: (p.hit_ratio or 0.0) / top - p.cache_bytes / full.cache_bytes)


@dataclass(frozen=True)
class Model:
    """What a hit ratio buys: Little's law at the recorded queue depth."""

    hdd_read_ms: float | None
    hdd_write_ms: float | None
    ssd_ms: float
    queue_depth: float | None
    read_share: float | None  # reads / all requests


def model_from(trace: tr.Trace, *, hdd_ms: float | None, ssd_ms: float | None,
               devices: Sequence[int] | None = None) -> Model:
    t = trace.trailer or {}
    reads = writes = read_ms = write_ms = queue_ms = 0
    names = {d.name for d in trace.header.devices
             if devices is None or d.index in devices}
    for name, s in (t.get("diskstats") or {}).items():
        if name in names:
            reads += s["reads"]
            writes += s["writes"]
            read_ms += s["read_ms"]
            write_ms += s["write_ms"]
            queue_ms += s["queue_ms"]
    secs = float(t.get("seconds") or 0)
    rq = t.get("requests") or {}
    n_r, n_w = int(rq.get("read", 0)), int(rq.get("write", 0))
    return Model(
        hdd_read_ms=hdd_ms if hdd_ms is not None else (read_ms / reads if reads else None),
        hdd_write_ms=hdd_ms if hdd_ms is not None else (write_ms / writes if writes else None),
        ssd_ms=DEFAULT_SSD_LATENCY_MS if ssd_ms is None else ssd_ms,
        queue_depth=queue_ms / (secs * 1000) if secs > 0 and queue_ms else None,
        read_share=n_r / (n_r + n_w) if n_r + n_w else None)


def predict(p: Point, m: Model) -> dict[str, Any]:
    """What the curve's point ``p`` means for the disk of model ``m``."""
    out: dict[str, Any] = p.to_json()
    hr = p.read_hit_ratio
    if hr is not None and m.hdd_read_ms:
        cached = hr * m.ssd_ms + (1 - hr) * m.hdd_read_ms
        out["read_latency_ms"] = round(cached, 4)
        out["read_iops_gain"] = round(m.hdd_read_ms / cached, 3)
        if m.queue_depth:
            out["read_iops_at_recorded_qd"] = round(m.queue_depth * 1000 / cached, 1)
    # writeback: every write completes at the SSD; a write to a block still in the cache
    # replaces it there, so the disk sees it once however often it was rewritten (at most:
    # writeback may have cleaned the block between the two writes)
    out["write_absorption"] = _r(p.write_hit_ratio)
    if m.read_share is not None and m.hdd_read_ms and m.queue_depth:
        rs, hw = m.read_share, m.hdd_write_ms or m.hdd_read_ms
        bare = rs * m.hdd_read_ms + (1 - rs) * hw
        wb = rs * (out.get("read_latency_ms") or m.hdd_read_ms) + (1 - rs) * m.ssd_ms
        out["iops_at_recorded_qd"] = {"bare": round(m.queue_depth * 1000 / bare, 1),
                                      "writeback": round(m.queue_depth * 1000 / wb, 1)}
    return out


def analyse(trace: tr.Trace, *, rate: float | None = None, block: int | None = None,
            sizes: Sequence[int] = (), hdd_ms: float | None = None,
            ssd_ms: float | None = None, devices: Sequence[int] | None = None
            ) -> dict[str, Any]:
    """The ``cachemgr size --json`` document."""
    h = histogram(trace, rate=rate, block=block, devices=devices)
    pts = curve(h, sizes)
    at = {p.cache_bytes: p for p in pts}
    asked = [at[s] for s in sizes]  # the grid holds every asked size
    k = knee(pts)
    m = model_from(trace, hdd_ms=hdd_ms, ssd_ms=ssd_ms, devices=devices)
    top = max((p.hit_ratio or 0.0 for p in pts), default=0.0)

    def size_for(frac: float) -> int | None:
        return next((p.cache_bytes for p in pts if (p.hit_ratio or 0.0) >= frac * top), None)

    notes = []
    small = [s for s in sizes if s < resolved_blocks(h.rate) * h.block]
    if small:
        how = "are rough"
        if h.aet_below and h.strata is not None:
            how = (f"come from the reuse times of the {h.strata.source}'s counted blocks "
                   f"(rate {h.strata.rate:g}) by the AET model")
        notes.append(f"a sample at rate {h.rate:g} does not resolve caches under "
                     f"{resolved_blocks(h.rate) * h.block} bytes: the figures for "
                     f"{', '.join(str(s) for s in small)} {how}")
    for p in asked:
        if p.hit_ratio is not None and p.hit_ratio_se is not None \
                and 2 * p.hit_ratio_se > SE_NOTE:
            notes.append(f"at {p.cache_bytes} bytes the sample gives a hit ratio of "
                         f"{p.hit_ratio:.3f} +- {2 * p.hit_ratio_se:.3f} (two standard "
                         "errors): record longer or at a higher --rate for a closer figure")
    if h.rate < 1 and h.strata is None and counting_stopped(trace):
        notes.append(f"the recorder stopped counting blocks (its table of {tr.COUNT_TABLE:,} "
                     "overflowed even at the lowest rate above the sample's): it is weighed "
                     "by SHARDS_adj alone, whose curve can be off by 0.05 at the smallest "
                     "sizes for a weakly skewed workload; see the standard errors")
    if not trace.complete:
        notes.append("the trace has no trailer (the recorder was killed): the totals, the "
                     "SHARDS adjustment and the latency model are missing")
    sampled_refs = h.sampled_refs
    if h.rate < 1 and sampled_refs < 10_000:
        notes.append(f"only {sampled_refs:,} sampled references: the curve is rough "
                     "(record longer or at a higher --rate)")
    hd = trace.header
    t = trace.trailer or {}
    return {
        "schema": 1,
        "trace": {"devices": [vars(d) for d in hd.devices], "rate": hd.rate,
                  "block": hd.block, "seconds": t.get("seconds"),
                  "requests": t.get("requests"), "kept_requests": len(trace),
                  "complete": trace.complete},
        "rate": h.rate,
        "block": h.block,
        "references": {"read": round(h.refs[0]), "write": round(h.refs[1]),
                       "sampled": sampled_refs, "discarded_blocks": h.discards},
        "strata": None if h.strata is None else {
            "rate": h.strata.rate, "from": h.strata.source,
            "classes": len(h.strata.classes()),
            "reuse_times": h.strata.reuse is not None},
        "footprint_bytes": h.footprint_bytes,
        "resolved_from_bytes": resolved_blocks(h.rate) * h.block,
        "reuse_model_below_bytes": round(h.aet_below) * h.block if h.aet_below else None,
        "max_hit_ratio": _r(top),
        "knee": k.to_json() if k else None,
        "size_for": {"50%": size_for(0.5), "90%": size_for(0.9), "95%": size_for(0.95),
                     "99%": size_for(0.99)},
        "model": {"hdd_read_ms": _r(m.hdd_read_ms), "hdd_write_ms": _r(m.hdd_write_ms),
                  "ssd_ms": m.ssd_ms, "queue_depth": _r(m.queue_depth),
                  "read_share": _r(m.read_share)},
        "sizes": [predict(p, m) for p in asked],
        "curve": [p.to_json() for p in pts],
        "notes": notes,
    }
