"""Tests of dpsql.mechanisms.selection: the threshold's minimality, an exact brute-force privacy check, and
empirical release rates.

Soundness: the statistical tests are exact binomial tests failing at p < 1e-9 (five of them),
so a correct implementation fails this file with probability below 1e-8. Reference tails are
computed here by summing the discrete Laplace pmf, independently of the module's closed form.
"""

from __future__ import annotations

import decimal
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import InternalError
from dpsql.mechanisms import noise, selection
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.selection import (
    SelectionRule,
    release_probability,
    select_partitions,
    selection_rule,
)

P_EXACT = 1e-9
RELATIONS = ["unbounded", "bounded"]


# ---------------------------------------------------------------- reference tails

def laplace_tails(scale: Fraction) -> tuple[int, np.ndarray]:
    """(R, tail) with tail[m + R] = P(Z >= m) for m in [-R, R], by summing the pmf from the
    outside in (the mass beyond R is below 1e-21 of the total)."""
    t = float(scale)
    reach = math.ceil(50 * t) + 2
    z = np.arange(-reach, reach + 1)
    w = np.exp(-np.abs(z) / t)
    pmf = w / math.fsum(w)
    return reach, np.cumsum(pmf[::-1])[::-1]


def tail_at(reach: int, tail: np.ndarray, m: int) -> float:
    return 1.0 if m < -reach else 0.0 if m > reach else float(tail[m + reach])


# ---------------------------------------------------------------- the rule

GRID = [(Fraction(e), Fraction(1, d), l, rel)
        for e in ("1/10", "1/2", "1", "3") for d in (10**3, 10**6, 10**9, 10**12)
        for l in (1, 2, 5, 10) for rel in RELATIONS]


@pytest.mark.parametrize(("epsilon", "delta", "l", "neighbours"), GRID)
def test_threshold_is_the_smallest_meeting_the_bound(epsilon, delta, l, neighbours):
    rule = selection_rule(epsilon, delta, l, neighbours)
    l1 = l if neighbours == "unbounded" else 2 * l
    assert rule.scale == l1 / epsilon                      # these scales need no rounding
    assert (rule.epsilon, rule.delta, rule.groups_per_unit, rule.neighbours) == (epsilon, delta, l, neighbours)
    reach, tail = laplace_tails(rule.scale)
    released_alone = tail_at(reach, tail, rule.threshold - 1)        # P(1 + Z >= tau)
    one_lower = tail_at(reach, tail, rule.threshold - 2)             # P(1 + Z >= tau - 1)
    assert l * released_alone <= float(delta) * (1 + 1e-9)
    assert l * one_lower > float(delta) * (1 + 1e-9)
    assert release_probability(1, rule) == pytest.approx(released_alone, rel=1e-9)


def test_threshold_formula_of_the_docstring():
    for epsilon, delta, l, neighbours in GRID[::7]:
        rule = selection_rule(epsilon, delta, l, neighbours)
        t = float(rule.scale)
        m = math.ceil(t * math.log(l / (float(delta) * (1 + math.exp(-1 / t)))))
        assert rule.threshold == 1 + max(m, 1)


def test_scale_with_large_terms_is_the_sampled_one():
    epsilon = Fraction(0.1)                       # 3602879701896397 / 2**55
    rule = selection_rule(epsilon, Fraction(1, 10**8), 3, "bounded")
    assert rule.scale >= 6 / epsilon and rule.scale - 6 / epsilon < rule.scale * Fraction(1, 2**38)
    assert noise.discrete_laplace_sampled_scale(rule.scale) == rule.scale
    reach, tail = laplace_tails(rule.scale)
    assert 3 * tail_at(reach, tail, rule.threshold - 1) <= 1e-8 < 3 * tail_at(reach, tail, rule.threshold - 2)


def test_a_large_delta_gives_a_low_threshold():
    rule = selection_rule(Fraction(1), Fraction(9, 10), 1, "unbounded")
    assert rule.threshold == 1                    # P(1 + Z >= 1) = P(Z >= 0) = 1/(1+1/e) ~ 0.73 <= 0.9
    assert release_probability(1, rule) == pytest.approx(1 / (1 + math.exp(-1)))


# ---------------------------------------------------------------- brute-force privacy

GROUPS = 3


def output_distribution(counts: tuple[int, ...], probability) -> np.ndarray:
    """P(released set == S) for every S (bit g of S's index = group g), exactly."""
    dist = np.zeros(2**GROUPS)
    for s in range(2**GROUPS):
        p = 1.0
        for g, c in enumerate(counts):
            released = bool(s >> g & 1)
            if c == 0:                            # an absent group is never released
                p *= 0.0 if released else 1.0
            else:
                p *= probability(c) if released else 1 - probability(c)
        dist[s] = p
    return dist


def neighbouring_count_vectors(l: int, neighbours: str):
    """Pairs of distinct-unit count vectors (D, D') over 3 groups: the other units give any
    counts in {0, 1, 2}; the changed unit is in 1..l groups (replaced by another such unit)."""
    others = list(itertools.product(range(3), repeat=GROUPS))
    units = [set(c) for size in range(1, l + 1) for c in itertools.combinations(range(GROUPS), size)]

    def plus(counts, unit):
        return tuple(c + (g in unit) for g, c in enumerate(counts))

    for rest in others:
        if neighbours == "unbounded":
            for unit in units:
                yield rest, plus(rest, unit)
        else:
            for unit, other in itertools.product(units, units):
                yield plus(rest, unit), plus(rest, other)


def worst_delta(rule: SelectionRule, epsilon: float, threshold: int) -> float:
    """max over neighbours (both directions) and output sets S of P[M(D) in S] - e^eps P[M(D') in S]."""
    reach, tail = laplace_tails(rule.scale)

    def probability(c):
        return tail_at(reach, tail, threshold - c)

    cache, worst = {}, 0.0
    for d, d2 in neighbouring_count_vectors(rule.groups_per_unit, rule.neighbours):
        for a, b in ((d, d2), (d2, d)):
            pa = cache.setdefault(a, output_distribution(a, probability))
            pb = cache.setdefault(b, output_distribution(b, probability))
            worst = max(worst, float(np.sum(np.maximum(pa - math.exp(epsilon) * pb, 0.0))))
    return worst


BRUTE = [(Fraction(e), Fraction(1, d), l, rel)
         for e in ("1/2", "1", "2") for d in (10, 100) for l in (1, 2) for rel in RELATIONS]


@pytest.mark.parametrize(("epsilon", "delta", "l", "neighbours"), BRUTE)
def test_selection_is_epsilon_delta_dp_by_brute_force(epsilon, delta, l, neighbours):
    rule = selection_rule(epsilon, delta, l, neighbours)
    worst = worst_delta(rule, float(epsilon), rule.threshold)
    assert worst <= float(delta) + 1e-12
    # The worst case is exactly "some one-sided group is released", 1 - (1 - p)**l, under both
    # relations: under bounded neighbours the groups that vanish and those that appear do not add.
    reach, tail = laplace_tails(rule.scale)
    p = tail_at(reach, tail, rule.threshold - 1)
    assert worst == pytest.approx(1 - (1 - p) ** l, rel=1e-6)


@pytest.mark.parametrize(("epsilon", "delta", "neighbours"),
                         [(e, d, rel) for e, d, _, rel in BRUTE if _ == 1])
def test_brute_force_catches_a_threshold_one_too_low(epsilon, delta, neighbours):
    rule = selection_rule(epsilon, delta, 1, neighbours)
    assert worst_delta(rule, float(epsilon), rule.threshold - 1) > float(delta)


def worst_log_ratio_on_common_groups(scale: Fraction, l: int, neighbours: str, threshold: int) -> float:
    """max of ln P[M(D) = S] - ln P[M(D') = S] over neighbours with the same groups present:
    the part of the guarantee that must be pure epsilon, whatever the threshold."""
    reach, tail = laplace_tails(scale)

    def probability(c):
        return tail_at(reach, tail, threshold - c)

    worst = 0.0
    for d, d2 in neighbouring_count_vectors(l, neighbours):
        if [c > 0 for c in d] != [c > 0 for c in d2]:
            continue
        pa, pb = output_distribution(d, probability), output_distribution(d2, probability)
        support = pa > 0
        worst = max(worst, float(np.max(np.abs(np.log(pa[support]) - np.log(pb[support])))))
    return worst


@pytest.mark.parametrize("neighbours", RELATIONS)
@pytest.mark.parametrize("l", [1, 2])
def test_common_groups_are_pure_epsilon_dp_and_the_scale_is_needed(l, neighbours):
    epsilon = Fraction(1, 2)
    rule = selection_rule(epsilon, Fraction(1, 10**6), l, neighbours)
    half = rule.scale / 2          # for bounded neighbours, that is the unbounded scale l/epsilon
    right = [worst_log_ratio_on_common_groups(rule.scale, l, neighbours, tau) for tau in (1, 2, 3, 4)]
    wrong = [worst_log_ratio_on_common_groups(half, l, neighbours, tau) for tau in (1, 2, 3, 4)]
    assert max(right) <= float(epsilon) * (1 + 1e-9)
    assert max(wrong) > float(epsilon) * 1.5


# ---------------------------------------------------------------- empirical release rates

def test_count_one_groups_are_almost_never_released():
    rule = selection_rule(Fraction(1), Fraction(1, 10**6), 1, "unbounded")
    n = 200_000
    released = int(select_partitions([1] * n, rule, SeededSource(31)).sum())
    # The true rate is at most delta / l; the count is stochastically below Binomial(n, delta).
    assert stats.binom.sf(released - 1, n, 1e-6) >= P_EXACT


def test_large_groups_are_released():
    rule = selection_rule(Fraction(1, 2), Fraction(1, 10**9), 4, "bounded")
    n = 50_000
    large = rule.threshold + noise.discrete_laplace_halfwidth(rule.scale, 1e-12)
    kept = select_partitions([large] * n, rule, SeededSource(32))
    missed = int(n - kept.sum())
    assert 1 - release_probability(large, rule) <= 1e-12
    assert stats.binom.sf(missed - 1, n, 1e-12) >= P_EXACT


@pytest.mark.parametrize("offset", [-3, 0, 2])
def test_release_rate_matches_the_exact_probability(offset):
    rule = selection_rule(Fraction(1), Fraction(1, 10**6), 2, "unbounded")
    count, n = rule.threshold + offset, 100_000
    reach, tail = laplace_tails(rule.scale)
    exact = tail_at(reach, tail, rule.threshold - count)
    assert release_probability(count, rule) == pytest.approx(exact, rel=1e-9)
    released = int(select_partitions([count] * n, rule, SeededSource(33 + offset)).sum())
    assert stats.binomtest(released, n, exact).pvalue >= P_EXACT


def test_noise_is_drawn_in_one_batch(monkeypatch):
    calls = []
    real = noise.discrete_laplace

    def recording(scale, size, source=None):
        calls.append((scale, size))
        return real(scale, size, source)

    monkeypatch.setattr(noise, "discrete_laplace", recording)
    rule = selection_rule(Fraction(1), Fraction(1, 10**6), 3, "bounded")
    mask = select_partitions(np.array([5, 0, 100, 7]), rule, SeededSource(1))
    assert calls == [(rule.scale, 4)]
    assert mask.dtype == bool and mask.shape == (4,)
    empty = select_partitions([], rule, SeededSource(1))
    assert empty.dtype == bool and empty.shape == (0,)


def test_default_source_is_the_secure_one(monkeypatch):
    calls = []
    real = noise.SecureSource.integers

    def counting(self, upper, size):
        calls.append(size)
        return real(self, upper, size)

    monkeypatch.setattr(noise.SecureSource, "integers", counting)
    rule = selection_rule(Fraction(1), Fraction(1, 10**6), 1, "unbounded")
    assert select_partitions([1, 100], rule).tolist()[1] and calls


# ---------------------------------------------------------------- invalid parameters

@pytest.mark.parametrize("call", [
    lambda: selection_rule(Fraction(0), Fraction(1, 10**6), 1, "unbounded"),
    lambda: selection_rule(Fraction(-1), Fraction(1, 10**6), 1, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(0), 1, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(-1, 10), 1, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(1), 1, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(3, 2), 1, "bounded"),
    lambda: selection_rule(1.0, Fraction(1, 10**6), 1, "unbounded"),
    lambda: selection_rule(Fraction(1), 1e-6, 1, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(1, 10**6), 0, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(1, 10**6), 1.5, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(1, 10**6), True, "unbounded"),
    lambda: selection_rule(Fraction(1), Fraction(1, 10**6), 1, "replace"),
    lambda: selection_rule(Fraction(1, 10**15), Fraction(1, 10**6), 1, "unbounded"),   # scale >= 2**40
    lambda: select_partitions([1, -1], selection_rule(Fraction(1), Fraction(1, 10**6), 1, "bounded")),
    lambda: select_partitions([1, 2.0], selection_rule(Fraction(1), Fraction(1, 10**6), 1, "bounded")),
    lambda: select_partitions([True], selection_rule(Fraction(1), Fraction(1, 10**6), 1, "bounded")),
    lambda: release_probability(1.5, selection_rule(Fraction(1), Fraction(1, 10**6), 1, "bounded")),
])
def test_invalid_parameters_raise_internal_error(call):
    with pytest.raises(InternalError):
        call()


def test_module_threshold_search_agrees_with_its_closed_form():
    # The guard may only ever raise tau; on ordinary parameters it changes nothing.
    rule = selection_rule(Fraction(1, 3), Fraction(1, 10**7), 7, "bounded")
    m = rule.threshold - 1
    assert selection._smallest_passing_m(rule.scale, rule.delta, 7) == m
    with decimal.localcontext(selection._context()):
        delta = decimal.Decimal(rule.delta.numerator) / rule.delta.denominator
        assert 7 * selection._tail(rule.scale, m) <= delta < 7 * selection._tail(rule.scale, m - 1)
