"""AboveThreshold (dpsql.mechanisms.sparse_vector): its exact output distribution on neighbouring
streams is within e^epsilon, brute force over small streams; and it draws the noise it says."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

import dpsql.mechanisms.sparse_vector as sparse_vector
from dpsql.errors import BudgetExceeded
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.sparse_vector import AboveThreshold

REACH = 100  # sensitivities of threshold noise summed over each way: the mass beyond is below 1e-16


def _at_least(m: np.ndarray, scale: Fraction) -> np.ndarray:
    """P(K >= m) for K discrete Laplace with ``scale`` (in lattice steps), elementwise."""
    p = math.exp(-1 / float(scale))
    upper = p ** np.maximum(m, 1) / (1 + p)             # m >= 1: p^m / (1 + p)
    lower = 1 - p ** np.maximum(1 - m, 1) / (1 + p)     # m <= 0: 1 - P(K >= 1 - m), by symmetry
    return np.where(m >= 1, upper, lower)


def _pmf(j: np.ndarray, scale: Fraction) -> np.ndarray:
    p = math.exp(-1 / float(scale))
    return (1 - p) / (1 + p) * p ** np.abs(j)


def outcome_probabilities(svt: AboveThreshold, distances: tuple[Fraction, ...]) -> dict[tuple, float]:
    """The exact probability of every outcome (True/False per query run, the stream stopping after
    ``svt.max_above`` above) for queries at these distances (value - threshold) / sensitivity,
    from the instance's own noise scales and its rule: above iff distance + nu >= rho. Answers
    after the stream stopped are summed out (their outcomes' probabilities add up to one)."""
    resolution = svt.resolution
    j = np.arange(-REACH * resolution, REACH * resolution + 1)
    weight_rho = _pmf(j, svt.threshold_scale)
    found = {}
    for outcome in itertools.product((False, True), repeat=len(distances)):
        probability = weight_rho.copy()
        for distance, above in zip(distances, outcome):
            m = j - int(distance * resolution)  # above iff k >= m, k the query's noise in steps
            tail = _at_least(m, svt.query_scale)
            probability *= tail if above else 1 - tail
        found[_cut(outcome, svt.max_above)] = found.get(_cut(outcome, svt.max_above), 0.0) + probability.sum()
    return found


def _cut(outcome: tuple, max_above: int) -> tuple:
    """The outcome as released: nothing after the max_above-th above."""
    above = 0
    for position, value in enumerate(outcome):
        above += value
        if above == max_above:
            return outcome[:position + 1]
    return outcome


def worst_log_ratio(epsilon: Fraction, max_above: int, resolution: int, length: int, step: Fraction) -> float:
    """The largest |log P[o | D] / P[o | D']| over streams of ``length`` queries at distances
    -2, -1, 0, 1 times ``step`` (sensitivities from their thresholds) and neighbours moving each
    query by -1, 0 or +1 sensitivity (in any mix of directions)."""
    svt = AboveThreshold(0, 1, epsilon, max_above, SeededSource(0), resolution=resolution)
    points = [Fraction(k) * step for k in (-2, -1, 0, 1)]
    worst = 0.0
    for distances in itertools.product(points, repeat=length):
        here = outcome_probabilities(svt, distances)
        assert math.isclose(sum(here.values()), 1.0, rel_tol=1e-9)
        for moves in itertools.product((-1, 0, 1), repeat=length):
            there = outcome_probabilities(svt, tuple(d + m for d, m in zip(distances, moves)))
            worst = max(worst, *(abs(math.log(here[o] / there[o])) for o in here))
    return worst


@pytest.mark.parametrize("max_above,resolution,step", [(1, 1, Fraction(1)), (2, 2, Fraction(1, 2)),
                                                       (1, 4, Fraction(1, 4))])
def test_neighbouring_streams_are_within_e_to_the_epsilon(max_above, resolution, step):
    epsilon = Fraction(1)
    worst = worst_log_ratio(epsilon, max_above, resolution, 3, step)
    assert worst <= float(epsilon) * (1 + 1e-9)
    assert worst > 0.3 * float(epsilon)  # the comparison can fail: outcomes do differ


def test_half_the_query_noise_breaks_the_guarantee(monkeypatch):
    """The 2 in 2cΔ/ε₂ is needed when queries move in different directions: with cΔ/ε₂ the
    brute force finds outcomes beyond e^epsilon (the check above is not vacuous)."""
    original = AboveThreshold.__init__

    def halved(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.query_scale = self.query_scale / 2

    monkeypatch.setattr(AboveThreshold, "__init__", halved)
    assert worst_log_ratio(Fraction(1), 1, 1, 3, Fraction(1)) > 1.01


def test_it_draws_the_noise_its_analysis_uses(monkeypatch):
    """Every draw has the scale the brute force above was computed with: the threshold's once,
    then one per query tested."""
    asked = []
    real = sparse_vector.discrete_laplace

    def recording(scale, size, source=None):
        asked.append(scale)
        return real(scale, size, source)

    monkeypatch.setattr(sparse_vector, "discrete_laplace", recording)
    svt = AboveThreshold(10, 2, Fraction(1, 2), 3, SeededSource(1))
    for value in (0, 1, 2, 3):
        svt.test(value)
    assert asked == [svt.threshold_scale] + [svt.query_scale] * 4
    assert svt.threshold_scale == sparse_vector.RESOLUTION / svt.threshold_epsilon
    assert svt.query_scale == 2 * 3 * sparse_vector.RESOLUTION / svt.query_epsilon
    assert svt.threshold_epsilon + svt.query_epsilon == Fraction(1, 2)


def test_the_threshold_noise_is_drawn_once_and_the_stream_stops():
    svt = AboveThreshold(0, 1, Fraction(1), 2, SeededSource(5))
    outcomes = [svt.test(10**6) for _ in range(2)]
    assert outcomes == [True, True] and svt.done
    with pytest.raises(BudgetExceeded, match="answers no more"):
        svt.test(0)


def test_each_query_is_measured_in_its_own_sensitivity():
    """A query far below its threshold in its own units stays below, whatever the others'."""
    svt = AboveThreshold(0, 1, Fraction(10), 1, SeededSource(2))
    assert not svt.test(-10**6, threshold=0, sensitivity=10**5)  # 10 sensitivities below
    assert svt.test(10**6, threshold=0, sensitivity=10**5)


def test_the_split_is_lsl17s():
    for c in (1, 2, 5, 50):
        share = sparse_vector.threshold_share(c)
        assert math.isclose(float(share), 1 / (1 + (2 * c) ** (2 / 3)), abs_tol=1e-3)
