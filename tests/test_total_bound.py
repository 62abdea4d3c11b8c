"""The DP choice of a bound per unit (``dpsql.mechanisms.total_bound``): its utility's
sensitivity derived by brute force over neighbouring data, and what its draw states."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.total_bound import (
    QUANTILE,
    candidates_below,
    draw_total_bound,
    stated_excess,
    utility,
)

CANDIDATES = (Fraction(1), Fraction(2), Fraction(4))
MAGNITUDES = (0, 1, 3, 5)  # a total's magnitude: below, at, between and beyond the candidates


def _utilities(units: list[tuple[int, ...]], quantile: Fraction) -> list[Fraction]:
    totals = [t for unit in units for t in unit]
    ranks = [sum(1 for t in totals if t <= c) for c in CANDIDATES]
    return utility(ranks, len(totals), quantile)


def _units(groups: int) -> list[tuple[int, ...]]:
    """Every unit of at most ``groups`` totals (a multiset of magnitudes), the empty one too."""
    return [combo for size in range(groups + 1) for combo in itertools.combinations_with_replacement(MAGNITUDES, size)]


def _largest_change(groups: int, quantile: Fraction, bounded: bool) -> Fraction:
    """max |u(D, c) - u(D', c)| over datasets D of up to two other units and neighbours D'."""
    units = _units(groups)
    others = [list(pair) for pair in itertools.combinations_with_replacement(units[:8], 2)]
    worst = Fraction(0)
    for rest in others:
        for unit in units:
            here = _utilities(rest + [unit], quantile)
            neighbours = [rest] if not bounded else [rest + [other] for other in units]
            for there in neighbours:
                changed = _utilities(there, quantile)
                worst = max(worst, *(abs(a - b) for a, b in zip(here, changed)))
    return worst


@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize("quantile", [QUANTILE, Fraction(1, 2), Fraction(1, 10)])
def test_the_utility_moves_by_at_most_l_and_l_is_reached_when_bounded(groups, quantile):
    """Δu = groups, the sensitivity ``draw_total_bound`` calibrates with: never exceeded under either
    neighbour relation, reached by replacing a unit (so groups - 1 would be wrong)."""
    unbounded = _largest_change(groups, quantile, bounded=False)
    bounded = _largest_change(groups, quantile, bounded=True)
    assert unbounded <= groups and bounded <= groups
    assert bounded == groups
    assert bounded > groups - 1  # a mutated sensitivity (groups - 1) is exceeded


def test_candidates_end_at_the_cap_and_grow_by_at_most_half_again():
    cands = candidates_below(Fraction(63000))
    assert cands[-1] == 63000 and all(c < 63000 for c in cands[:-1])
    assert cands[0] == Fraction(1, 1000)
    assert all(b / a <= Fraction(5, 3) for a, b in zip(cands[:-2], cands[1:-1]))


def _ranks(magnitudes: np.ndarray, candidates) -> list[int]:
    ordered = np.sort(magnitudes)
    return [int(np.searchsorted(ordered, float(c), side="right")) for c in candidates]


@pytest.mark.parametrize("epsilon", [Fraction(1, 10), Fraction(1)])
def test_the_drawn_bound_leaves_at_most_the_stated_share_beyond_it(epsilon):
    """With probability ≥ 1 - α at most (1 - q)·n + d totals lie beyond the bound. At α = 1e-9
    a draw, 25 draws fail together with probability < 1e-7; a draw aimed at the median (or
    calibrated 10x too loosely) fails it every time at this n."""
    groups, n_units = 3, 4000
    rng = np.random.default_rng(7)
    magnitudes = np.abs(rng.lognormal(6, 1.2, size=n_units * groups)).round(3)  # up to groups totals per unit
    cap = Fraction(10**6)
    assert magnitudes.max() < cap
    cands = candidates_below(cap)
    ranks = _ranks(magnitudes, cands)
    n = len(magnitudes)
    alpha = Fraction(1, 10**9)
    allowed = (1 - float(QUANTILE)) * n + stated_excess(epsilon, len(cands), groups, alpha)
    assert allowed < n / 4  # the statement says something
    source = SeededSource(11)
    for _ in range(25):
        bound = cands[draw_total_bound(ranks, n, epsilon, groups, source=source)]
        assert int((magnitudes > float(bound)).sum()) <= allowed
    # what a wrong aim would have stated fails: the median leaves half beyond it
    median = cands[draw_total_bound(ranks, n, Fraction(1000), groups, Fraction(1, 2), SeededSource(1))]
    assert int((magnitudes > float(median)).sum()) > allowed


def test_a_larger_epsilon_draws_closer_to_the_quantile():
    """The draw concentrates as epsilon grows (a seeded check of the law, not of one value)."""
    rng = np.random.default_rng(3)
    magnitudes = rng.uniform(0, 1000, size=3000)
    cands = candidates_below(Fraction(10**5))
    ranks = _ranks(magnitudes, cands)
    target = next(i for i, r in enumerate(ranks) if r >= QUANTILE * len(magnitudes))
    source = SeededSource(5)
    picks = [draw_total_bound(ranks, len(magnitudes), Fraction(5), 1, source=source) for _ in range(50)]
    assert sum(p == target for p in picks) >= 45


def test_an_absurd_epsilon_never_makes_the_draw_fail_with_the_number_of_totals():
    """An attacker's review: at epsilon 1e305 the log weights overflowed a float for 10,000 totals
    and not for 10, so a charged query failed or not with the data."""
    from dpsql.mechanisms.noise import SeededSource
    from dpsql.mechanisms.total_bound import draw_total_bound

    for total in (10, 10_000):
        ranks = [0, 0, 0, total]  # every total in the last bucket: the first candidates far from the aim
        assert draw_total_bound(ranks, total, Fraction(10**305), 1, source=SeededSource(1)) == 3
