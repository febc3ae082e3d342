"""What a cache can do at best: Che's approximation for LRU under Zipf, and the QD1 ceiling.

Che's approximation (Che, Tung, Wang 2002; Fricker, Robert, Roberts 2012) for an LRU cache of
``C`` items fed by independent requests with item probabilities ``p_i``: the cache's
*characteristic time* ``T`` solves ``sum_i (1 - exp(-p_i T)) = C``; item ``i`` is in the cache
with probability ``1 - exp(-p_i T)``, so the hit ratio is ``sum_i p_i (1 - exp(-p_i T))``.
For Zipf(theta) over 1 GiB in 4 KiB blocks it gives 0.93 at a 10 % cache (theta 1.2) and 0.48
(theta 0.8), the reference figures in docs/kernel-notes.md, "Zipf, Che's approximation and
the speed-up ceiling".

Pure Python on purpose (the library needs no numpy): the most popular ``EXACT_HEAD`` items are
summed one by one, the tail in geometric bins whose items differ in probability by at most
``BIN_RATIO``; a 1 TiB device in 4 KiB blocks (2^28 items) costs about 10,000 terms.

fio's Zipf generator (lib/zipf.c, Gray et al.'s method) is not exactly Zipf for theta > 1: its
ranks 3, 4, 5 are a little more popular. Che's hit ratio with fio's own rank probabilities
differs from the exact Zipf one by less than 0.006 for theta 0.8-1.2 and caches of 5-25 %
(computed), so the exact Zipf is the prediction. fio hashes ranks over the device
(``__hash_long(rank) % nranges``, a bijection when the number of blocks is a power of two), so
a cache block larger than the IO block aggregates random ranks: see ``block_items``.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

EXACT_HEAD = 4096
BIN_RATIO = 1.002
# Beyond this many items, ``block_items`` > 1 (random aggregation) is refused: it needs
# every item's probability.
MAX_GROUPED_ITEMS = 1 << 21

Bins = Sequence[tuple[int, float]]  # (number of items, probability of each)


def _check_theta(theta: float) -> None:
    if not theta > 0 or math.isinf(theta) or math.isnan(theta):
        raise ValueError(f"Zipf theta must be a positive number, not {theta!r}")


def zipf_bins(n: int, theta: float) -> list[tuple[int, float]]:
    """Zipf(theta) over ``n`` items as (count, probability each) bins, summing to 1."""
    if n < 1:
        raise ValueError(f"need at least one item, not {n}")
    _check_theta(theta)
    raw: list[tuple[int, float]] = []
    head = min(n, EXACT_HEAD)
    raw.extend((1, float(i) ** -theta) for i in range(1, head + 1))
    a = head + 1
    step = BIN_RATIO ** (1.0 / theta)  # index ratio giving a probability ratio of BIN_RATIO
    while a <= n:
        b = min(n + 1, max(a + 1, math.floor(a * step)))
        count = b - a
        # sum_{i=a}^{b-1} i^-theta by the midpoint rule (exact to ~1e-7 this far out)
        lo, hi = a - 0.5, b - 0.5
        if abs(theta - 1.0) < 1e-12:
            mass = math.log(hi / lo)
        else:
            mass = (hi ** (1 - theta) - lo ** (1 - theta)) / (1 - theta)
        raw.append((count, mass / count))
        a = b
    total = math.fsum(c * p for c, p in raw)
    return [(c, p / total) for c, p in raw]


def _occupancy(bins: Bins, t: float) -> float:
    return math.fsum(c * -math.expm1(-p * t) for c, p in bins)


def characteristic_time(bins: Bins, cache_items: float) -> float:
    """Che's T: the time (in requests) an item stays in the LRU cache after its last use.

    ``math.inf`` when the cache holds every item.
    """
    n = sum(c for c, _ in bins)
    if cache_items >= n:
        return math.inf
    if cache_items <= 0:
        return 0.0
    lo = float(cache_items)  # occupancy(T) <= T, so T >= C
    hi = lo * 2
    while _occupancy(bins, hi) < cache_items:
        lo, hi = hi, hi * 2
    for _ in range(100):  # bisection on log T: monotone, no derivative trouble
        mid = math.sqrt(lo * hi)
        if _occupancy(bins, mid) < cache_items:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return math.sqrt(lo * hi)


def che_hit_ratio_bins(bins: Bins, cache_items: float) -> float:
    t = characteristic_time(bins, cache_items)
    if math.isinf(t):
        return 1.0
    return math.fsum(c * p * -math.expm1(-p * t) for c, p in bins)


@dataclass(frozen=True)
class Prediction:
    """Che's expected LRU hit ratio for one Zipf workload and cache size."""

    items: int  # distinct IO blocks the workload addresses (fio's nranges)
    cache_items: float  # cache capacity in those blocks
    theta: float
    block_items: int  # IO blocks per cache block (1 for bcache: it caches extents)
    hit_ratio: float
    characteristic_requests: float  # Che's T; a warm-up should issue a few times this


def zipf_probabilities(n: int, theta: float) -> list[float]:
    _check_theta(theta)
    w = [float(i) ** -theta for i in range(1, n + 1)]
    total = math.fsum(w)
    return [x / total for x in w]


def predict(items: int, cache_items: float, theta: float, *, block_items: int = 1,
            seed: int = 1) -> Prediction:
    """Expected LRU hit ratio of a cache of ``cache_items`` IO blocks under Zipf(theta).

    ``block_items`` > 1 models a cache whose blocks hold several IO blocks (dm-cache's 32 KiB
    blocks under 4 KiB IO): fio scatters ranks over the device, so each cache block's
    popularity is the sum of ``block_items`` randomly chosen ranks' (seeded, reproducible).
    """
    if block_items < 1:
        raise ValueError("block_items must be at least 1")
    if block_items == 1:
        bins: Bins = zipf_bins(items, theta)
        c = cache_items
    else:
        if items > MAX_GROUPED_ITEMS:
            raise ValueError(f"block_items > 1 supports up to {MAX_GROUPED_ITEMS} items")
        probs = zipf_probabilities(items, theta)
        order = list(range(items))
        random.Random(seed).shuffle(order)
        blocks = [0.0] * math.ceil(items / block_items)
        for pos, rank in enumerate(order):
            blocks[pos // block_items] += probs[rank]
        bins = [(1, p) for p in blocks]
        c = cache_items / block_items
    t = characteristic_time(bins, c)
    h = 1.0 if math.isinf(t) else math.fsum(n * p * -math.expm1(-p * t) for n, p in bins)
    return Prediction(items=items, cache_items=cache_items, theta=theta,
                      block_items=block_items, hit_ratio=h, characteristic_requests=t)


def che_hit_ratio(items: int, cache_items: float, theta: float) -> float:
    """Shortcut: Che's LRU hit ratio for Zipf(theta) over ``items`` with ``cache_items``."""
    return predict(items, cache_items, theta).hit_ratio


def speedup_ceiling_qd1(hit_ratio: float, slow_latency: float, fast_latency: float) -> float:
    """The most a cache can speed up a QD1 workload (Little's law, docs/kernel-notes.md):
    ``L_slow / (h L_fast + (1 - h) L_slow)``. With one request in flight, IOPS is 1/latency."""
    if not 0.0 <= hit_ratio <= 1.0:
        raise ValueError(f"hit ratio must be within [0, 1], not {hit_ratio}")
    if slow_latency <= 0 or fast_latency <= 0:
        raise ValueError("latencies must be positive")
    return slow_latency / (hit_ratio * fast_latency + (1 - hit_ratio) * slow_latency)


def simulate_lru(items: int, cache_items: int, theta: float, *, requests: int,
                 warmup: int, seed: int) -> float:
    """Brute force: an LRU cache fed by seeded Zipf(theta) requests; the hit ratio after
    ``warmup`` requests. For checking Che's approximation on small cases (tests)."""
    rng = random.Random(seed)
    probs = zipf_probabilities(items, theta)
    cum: list[float] = []
    acc = 0.0
    for p in probs:
        acc += p
        cum.append(acc)
    draws = rng.choices(range(items), cum_weights=cum, k=warmup + requests)
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k, item in enumerate(draws):
        if item in cache:
            cache.move_to_end(item)
            if k >= warmup:
                hits += 1
        else:
            cache[item] = None
            if len(cache) > cache_items:
                cache.popitem(last=False)
    return hits / requests
