"""Tests of dpsql.mechanisms.quantile: the utility sensitivity and the mechanism's privacy by brute force
over neighbouring multisets, the exact accuracy theorem, and empirical accuracy.

Soundness: the two empirical tests are one-sided binomial tests failing at p < 1e-9, so a
correct implementation fails this file with probability below 1e-8. The sampler's own
statistical tests (frequencies against the softmax) are in ``tests/test_noise.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import InternalError
from dpsql.mechanisms import noise
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.quantile import (
    _log_weights,
    quantile_accuracy,
    quantile_rule,
    release_quantile,
)

P_EXACT = 1e-9
RELATIONS = ["unbounded", "bounded"]
LEVELS = [0, 0.25, 0.5, 1]
REST = 4            # the other units hold up to this many values in all


# ---------------------------------------------------------------- neighbouring multisets

def multisets(buckets: int, max_total: int) -> np.ndarray:
    """Every vector of bucket counts with total <= max_total (a multiset of bucket indices)."""
    rows = [c for c in itertools.product(range(max_total + 1), repeat=buckets) if sum(c) <= max_total]
    return np.array(rows, dtype=np.int64).reshape(-1, buckets)


def neighbour_pairs(buckets: int, k: int, neighbours: str) -> tuple[np.ndarray, np.ndarray]:
    """(D, D') bucket counts for every neighbouring pair: the other units' values R, and one unit
    with m <= k values added (unbounded) or replaced by another m' <= k values (bounded)."""
    rest, unit = multisets(buckets, REST), multisets(buckets, k)
    if neighbours == "unbounded":
        d = np.repeat(rest, len(unit), axis=0)
        return d, d + np.tile(unit, (len(rest), 1))
    d = np.repeat(rest, len(unit) ** 2, axis=0)
    first = np.tile(np.repeat(unit, len(unit), axis=0), (len(rest), 1))
    second = np.tile(np.tile(unit, (len(unit), 1)), (len(rest), 1))
    return d + first, d + second


def utilities(counts: np.ndarray, q: float) -> np.ndarray:
    """u(j) = -|c_j - q n| for every row and edge (exact here: q is dyadic, counts are small)."""
    below = np.concatenate([np.zeros((len(counts), 1), dtype=np.int64), np.cumsum(counts, axis=1)], axis=1)
    return -np.abs(below - q * below[:, -1:])


# ---------------------------------------------------------------- the utility sensitivity

@pytest.mark.parametrize("neighbours", RELATIONS)
@pytest.mark.parametrize("q", LEVELS)
def test_utility_sensitivity_is_never_exceeded_and_tight(q, neighbours):
    for k, buckets in itertools.product((1, 2, 3), (1, 2, 3)):
        rule = quantile_rule(q, Fraction(1), k, neighbours, 0, 1, buckets=buckets)
        d, d2 = neighbour_pairs(buckets, k, neighbours)
        largest = Fraction(float(np.max(np.abs(utilities(d, q) - utilities(d2, q)))))
        assert largest <= rule.utility_sensitivity
        if neighbours == "bounded" and buckets == 1:
            # One bucket: every value is below the last edge and none below the first, so a
            # replacement moves u only through n; the general bound k is not reached.
            assert largest == k * max(Fraction(q), 1 - Fraction(q))
        else:
            assert largest == rule.utility_sensitivity


def test_sensitivity_formulas():
    for q in (0, 0.1, 0.5, 0.75, 1):
        for k in (1, 4):
            exact = Fraction(q)
            assert quantile_rule(q, Fraction(1), k, "unbounded", 0, 1).utility_sensitivity == k * max(exact, 1 - exact)
            assert quantile_rule(q, Fraction(1), k, "bounded", 0, 1).utility_sensitivity == k


# ---------------------------------------------------------------- privacy of the exact mechanism

def worst_privacy_loss(rule, d: np.ndarray, d2: np.ndarray) -> float:
    """max over pairs and outputs j of |ln P(j | D) - ln P(j | D')| for the exact softmax of the
    module's own weights (in float64, where the log-softmax is accurate to ~1e-15)."""
    log_p = {}
    for row in np.unique(np.concatenate([d, d2]), axis=0):
        x = _log_weights(row.tolist(), rule)
        log_p[tuple(row)] = x - np.logaddexp.reduce(x)
    a = np.array([log_p[tuple(r)] for r in d])
    b = np.array([log_p[tuple(r)] for r in d2])
    return float(np.max(np.abs(a - b)))


@pytest.mark.parametrize("epsilon", [Fraction(1, 2), Fraction(4)])
@pytest.mark.parametrize("neighbours", RELATIONS)
@pytest.mark.parametrize("q", LEVELS)
def test_exact_output_distribution_is_epsilon_dp(q, neighbours, epsilon):
    for k, buckets in itertools.product((1, 2), (2, 3)):
        rule = quantile_rule(q, epsilon, k, neighbours, 0, 1, buckets=buckets)
        assert worst_privacy_loss(rule, *neighbour_pairs(buckets, k, neighbours)) <= float(epsilon) * (1 + 1e-9)


@pytest.mark.parametrize("neighbours", RELATIONS)
@pytest.mark.parametrize("q", [0.25, 0.5])
def test_brute_force_catches_half_the_sensitivity(q, neighbours):
    # Inside (0, 1) the utility is not monotone and the factor 2 of the exponential mechanism
    # is needed: with Delta_u / 2 the loss exceeds epsilon on some pair.
    epsilon, k, buckets = Fraction(4), 1, 3
    rule = quantile_rule(q, epsilon, k, neighbours, 0, 1, buckets=buckets)
    wrong = dataclasses.replace(rule, utility_sensitivity=rule.utility_sensitivity / 2)
    assert worst_privacy_loss(wrong, *neighbour_pairs(buckets, k, neighbours)) > float(epsilon) * 1.2


def test_log_weights_are_exact_roundings():
    rule = quantile_rule(0.3, Fraction(7, 10), 3, "unbounded", 0, 1, buckets=5)
    counts = [4, 0, 9, 2, 7]
    x = _log_weights(counts, rule)
    below = [0, 4, 4, 13, 15, 22]
    gaps = [abs(c - Fraction(0.3) * 22) for c in below]
    scale = rule.epsilon / (2 * rule.utility_sensitivity)
    assert x.tolist() == [float(-scale * (g - min(gaps))) for g in gaps]
    assert x.max() == 0.0


# ---------------------------------------------------------------- accuracy

def rank_errors(counts, q: float) -> np.ndarray:
    below = np.concatenate([[0], np.cumsum(counts)])
    return np.abs(below - q * below[-1])


@pytest.mark.parametrize("neighbours", RELATIONS)
@pytest.mark.parametrize("q", [0, 0.1, 0.5, 1])
def test_exact_probability_of_exceeding_the_bound_is_at_most_alpha(q, neighbours):
    counts = np.bincount(np.random.default_rng(5).integers(0, 64, 300), minlength=64).tolist()
    rule = quantile_rule(q, Fraction(1, 4), 2, neighbours, 0, 64, buckets=64)
    x = _log_weights(counts, rule)
    p = np.exp(x - np.logaddexp.reduce(x))
    errors = rank_errors(counts, q)
    for alpha in (0.5, 0.05, 1e-3):
        bound = quantile_accuracy(rule, math.inf, alpha)
        assert math.fsum(p[errors > errors.min() + bound]) <= alpha


@pytest.mark.parametrize("q", [0.5, 0.1, 0, 1])
def test_median_of_a_well_spread_sample_is_found_within_the_bound(q):
    rng = np.random.default_rng(7)                       # the data, not the noise
    values = np.clip(rng.normal(500, 150, 20_000), 0, 1000)
    rule = quantile_rule(q, Fraction(1, 2), 1, "unbounded", 0, 1000, buckets=1024)
    counts = np.bincount(np.minimum((values / 1000 * 1024).astype(int), 1023), minlength=1024)
    alpha, trials = 0.05, 2_000
    bound = quantile_accuracy(rule, math.inf, alpha)
    errors = rank_errors(counts, q)
    chosen = noise._exponential_mechanism_draws(_log_weights(counts.tolist(), rule), trials, SeededSource(8))
    failures = int(np.sum(errors[chosen] > errors.min() + bound))
    # Each trial fails with probability <= alpha: failures is stochastically below Binomial(trials, alpha).
    assert stats.binom.sf(failures - 1, trials, alpha) >= P_EXACT
    assert bound < 45                                    # and the bound itself is a few dozen values
    released = [release_quantile(counts.tolist(), rule, SeededSource(seed)) for seed in range(20)]
    for value in released:
        j = value * 1024 / 1000
        assert j.denominator == 1 and 0 <= j <= 1024      # always an edge of the public grid
        assert errors[int(j)] <= errors.min() + quantile_accuracy(rule, math.inf, 1e-9)


def test_quantile_accuracy_formula_and_cap():
    rule = quantile_rule(0.9, Fraction(1, 3), 5, "bounded", -10, 10, buckets=255)
    expected = 2 * 5 * 3 * (math.log(256) + math.log(100))
    assert quantile_accuracy(rule, math.inf, 0.01) == pytest.approx(expected, rel=1e-12)
    assert quantile_accuracy(rule, math.inf, 0.01) >= expected
    assert quantile_accuracy(rule, 100, 0.01) == pytest.approx(90)
    assert quantile_accuracy(rule, -5.0, 0.01) == 0.0


def test_release_on_an_empty_group_is_uniform_over_the_grid():
    rule = quantile_rule(0.5, Fraction(1), 1, "bounded", Fraction(-1, 2), Fraction(1, 2), buckets=4)
    assert _log_weights([0, 0, 0, 0], rule).tolist() == [0.0] * 5
    grid = {Fraction(-1, 2) + Fraction(i, 4) for i in range(5)}
    assert {release_quantile([0] * 4, rule, SeededSource(s)) for s in range(60)} == grid


# ---------------------------------------------------------------- invalid parameters

GOOD = dict(q=0.5, epsilon=Fraction(1), rows_per_unit=1, neighbours="bounded", lower=0, upper=1, buckets=8)


@pytest.mark.parametrize(("field", "bad"), [
    ("q", -0.1), ("q", 1.5), ("q", float("nan")), ("q", True), ("q", "0.5"), ("q", None),
    ("epsilon", 0), ("epsilon", Fraction(-1)), ("epsilon", 1.0), ("epsilon", float("nan")), ("epsilon", True),
    ("rows_per_unit", 0), ("rows_per_unit", 1.0), ("rows_per_unit", True),
    ("neighbours", "replace"), ("neighbours", None),
    ("lower", 1), ("lower", 2), ("lower", 0.0), ("upper", float("inf")),
    ("buckets", 0), ("buckets", 2.0), ("buckets", 2**21), ("buckets", True),
])
def test_invalid_rule_parameters_raise_internal_error(field, bad):
    with pytest.raises(InternalError):
        quantile_rule(**{**GOOD, field: bad})


@pytest.mark.parametrize("call", [
    lambda rule: release_quantile([1] * 7, rule, SeededSource(0)),
    lambda rule: release_quantile([1] * 7 + [-1], rule, SeededSource(0)),
    lambda rule: release_quantile([1] * 7 + [1.0], rule, SeededSource(0)),
    lambda rule: release_quantile([1] * 7 + [True], rule, SeededSource(0)),
    lambda rule: quantile_accuracy(rule, 10, 0),
    lambda rule: quantile_accuracy(rule, 10, 1),
    lambda rule: quantile_accuracy(rule, 10, float("nan")),
    lambda rule: quantile_accuracy(rule, float("nan"), 0.05),
])
def test_invalid_release_arguments_raise_internal_error(call):
    with pytest.raises(InternalError):
        call(quantile_rule(**GOOD))
