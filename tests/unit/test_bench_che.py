"""Che's approximation against a brute-force LRU simulation, and the QD1 ceiling."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachemgr.procedures import che


@pytest.mark.parametrize("theta,n,c", [(1.2, 1000, 100), (0.8, 1000, 100), (1.2, 500, 25),
                                       (0.8, 2000, 400)])
def test_che_matches_a_seeded_lru_simulation(theta: float, n: int, c: int) -> None:
    sim = che.simulate_lru(n, c, theta, requests=150_000, warmup=30_000, seed=7)
    assert abs(che.che_hit_ratio(n, c, theta) - sim) < 0.01


def test_facts_figures() -> None:
    n = (1 << 30) // 4096  # 1 GiB in 4 KiB blocks, 10 % cache (docs/kernel-notes.md)
    assert round(che.che_hit_ratio(n, n / 10, 1.2), 2) == 0.93
    assert round(che.che_hit_ratio(n, n / 10, 0.8), 2) == 0.48


def test_binned_tail_equals_the_exact_sum() -> None:
    n, c, theta = 20_000, 2_000, 0.9
    probs = che.zipf_probabilities(n, theta)
    exact = che.che_hit_ratio_bins([(1, p) for p in probs], c)
    assert abs(exact - che.che_hit_ratio(n, c, theta)) < 1e-4
    bins = che.zipf_bins(n, theta)
    assert sum(k for k, _ in bins) == n
    assert math.isclose(sum(k * p for k, p in bins), 1.0, rel_tol=1e-9)


def test_edges() -> None:
    assert che.che_hit_ratio(100, 100, 1.2) == 1.0
    assert che.che_hit_ratio(100, 0, 1.2) == 0.0
    assert math.isinf(che.predict(100, 200, 1.2).characteristic_requests)
    with pytest.raises(ValueError):
        che.zipf_bins(10, 0)
    big = che.predict(1 << 28, 1 << 25, 1.2)  # 1 TiB in 4 KiB blocks: stays fast
    assert 0.9 < big.hit_ratio < 1


def test_bigger_cache_blocks_hit_less() -> None:
    one = che.predict(1 << 14, 1 << 11, 1.2).hit_ratio
    eight = che.predict(1 << 14, 1 << 11, 1.2, block_items=8).hit_ratio
    assert eight < one


@settings(max_examples=40, deadline=None)
@given(st.integers(10, 5000), st.floats(0.01, 0.9), st.floats(0.3, 1.8))
def test_hit_ratio_is_a_probability_and_grows_with_the_cache(n: int, frac: float,
                                                             theta: float) -> None:
    h1 = che.che_hit_ratio(n, n * frac, theta)
    h2 = che.che_hit_ratio(n, min(n, n * frac * 1.5), theta)
    assert 0 <= h1 <= h2 + 1e-9 <= 1 + 1e-9


def test_speedup_ceiling() -> None:
    assert che.speedup_ceiling_qd1(1.0, 10_000, 100) == 100
    assert che.speedup_ceiling_qd1(0.0, 10_000, 100) == 1
    assert math.isclose(che.speedup_ceiling_qd1(0.9, 10_000, 100), 10_000 / 1090)
    with pytest.raises(ValueError):
        che.speedup_ceiling_qd1(1.5, 1, 1)
