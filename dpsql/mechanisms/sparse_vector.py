"""The sparse vector technique: which of a stream of queries exceed a threshold, for one price.

AboveThreshold as Lyu, Su and Li analyse it ("Understanding the Sparse Vector Technique for
Differential Privacy", PVLDB 10(6), 2017, Algorithm 1 and Theorem 2), with exact discrete noise:

- the threshold's noise rho is drawn once, with scale Delta/epsilon_1, and never redrawn;
- each query i gets fresh noise nu_i with scale 2*c*Delta/epsilon_2;
- query i is reported above when q_i + nu_i >= T_i + rho; after c such reports the stream stops.

The whole stream is (epsilon_1 + epsilon_2)-DP, however many queries are below. The proof shifts
noise, so it holds for noise on any lattice whose shifts it needs are whole steps: here each
query is measured in units of its own sensitivity, z_i = (q_i - T_i) / Delta_i, which one unit
moves by at most 1 (whatever Delta_i and the threshold T_i of each query: thresholds may differ,
LSL17 Section 3), and rho and nu_i are discrete Laplace draws on the lattice Z/RESOLUTION. For
neighbours D, D' and an outcome with positives at the set P:

- the "below" answers of D are below on D' when rho is replaced by rho + 1 (RESOLUTION steps of
  a discrete Laplace with scale RESOLUTION/epsilon_1: probability ratio e^epsilon_1);
- each of the at most c "above" answers stays above when nu_i is replaced by nu_i + 2 (2 *
  RESOLUTION steps with scale 2c * RESOLUTION/epsilon_2: ratio e^(epsilon_2/c) each).

So P[outcome | D] <= e^(epsilon_1 + epsilon_2) P[outcome | D'], exactly as with continuous
Laplace noise (LSL17 Theorem 2; Dwork & Roth 2014, Theorem 3.23 for the original analysis).
Queries that all move in one direction need only c*Delta/epsilon_2 (LSL17, monotonic case);
this module does not assume it, because the engine cannot prove it of every query it accepts.

The split epsilon_1 : epsilon_2 = 1 : (2c)^(2/3) is the one LSL17 Section 4.2 shows minimises the
chance of a wrong answer; any split is private, so it is rounded to a short fraction.

>>> from dpsql.mechanisms.noise import SeededSource
>>> svt = AboveThreshold(threshold=10, sensitivity=1, epsilon=Fraction(1), max_above=1,
...                      source=SeededSource(3))
>>> svt.threshold_epsilon + svt.query_epsilon == 1
True
>>> [svt.test(v) for v in (0, 1000)], svt.done
([False, True], True)
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational

from dpsql.errors import BudgetExceeded, InternalError
from dpsql.mechanisms.noise import discrete_laplace

RESOLUTION = 1024
"""Lattice steps per unit of sensitivity the noise is drawn on: finer than any useful noise."""


def threshold_share(max_above: int) -> Fraction:
    """epsilon_1 / epsilon: 1 / (1 + (2c)^(2/3)) (LSL17 Section 4.2), as a short fraction.

    >>> threshold_share(1)
    Fraction(349, 903)
    """
    share = Fraction(1 / (1 + (2 * max_above) ** (2 / 3))).limit_denominator(1000)
    return share if share > 0 else Fraction(1, 1000)  # (beyond c = 44,700 it would round to 0)


class AboveThreshold:
    """One run of AboveThreshold (module docstring): ``test`` each query's exact value in turn.

    ``threshold`` and ``sensitivity`` (Delta: the most one unit can move a query) are the
    defaults of ``test``, which may give each query its own. ``source``: where noise is drawn
    from (``SecureSource`` by default). ``resolution``: lattice steps per unit of sensitivity.
    """

    def __init__(self, threshold: Rational | float, sensitivity: Rational | float, epsilon: Fraction,
                 max_above: int, source=None, *, share: Fraction | None = None, resolution: int = RESOLUTION):
        if not isinstance(max_above, int) or isinstance(max_above, bool) or max_above < 1:
            raise InternalError(f"max_above must be a positive int, got {max_above!r}")
        epsilon = Fraction(epsilon)
        if epsilon <= 0:
            raise InternalError(f"epsilon must be positive, got {epsilon}")
        share = threshold_share(max_above) if share is None else Fraction(share)
        if not 0 < share < 1:
            raise InternalError(f"the threshold's share of epsilon must be in (0, 1), got {share}")
        self.epsilon = epsilon
        self.max_above = max_above
        self.threshold_epsilon = epsilon * share
        self.query_epsilon = epsilon - self.threshold_epsilon
        self.threshold = _exact(threshold)
        self.sensitivity = _positive(sensitivity)
        self.above = 0
        self._source = source
        self.resolution = resolution
        self.threshold_scale = resolution / self.threshold_epsilon
        """The discrete Laplace scale of the threshold's noise, in lattice steps (1/resolution)."""
        self.query_scale = Fraction(2 * max_above * resolution) / self.query_epsilon
        """The discrete Laplace scale of each query's noise, in lattice steps."""
        self._rho = Fraction(int(discrete_laplace(self.threshold_scale, 1, source)[0]), resolution)

    @staticmethod
    def scales(epsilon: Fraction, max_above: int, resolution: int = RESOLUTION) -> tuple[Fraction, Fraction]:
        """The (threshold, query) noise scales, in lattice steps, a run with these would draw."""
        first = Fraction(epsilon) * threshold_share(max_above)
        return resolution / first, Fraction(2 * max_above * resolution) / (Fraction(epsilon) - first)

    @property
    def done(self) -> bool:
        """True once ``max_above`` queries were reported above: the stream is over."""
        return self.above >= self.max_above

    def test(self, value: Rational | float, threshold: Rational | float | None = None,
             sensitivity: Rational | float | None = None) -> bool:
        """Whether ``value`` (a query's exact answer) is reported above its threshold."""
        if self.done:
            raise BudgetExceeded(
                f"this sparse vector has reported its {self.max_above} queries above the threshold "
                "and answers no more", hint="start a new one, which is charged again")
        threshold = self.threshold if threshold is None else _exact(threshold)
        sensitivity = self.sensitivity if sensitivity is None else _positive(sensitivity)
        distance = (_exact(value) - threshold) / sensitivity
        nu = Fraction(int(discrete_laplace(self.query_scale, 1, self._source)[0]), self.resolution)
        above = distance + nu >= self._rho
        self.above += above
        return above


def _exact(value: Rational | float) -> Fraction:
    """A number as an exact fraction (a float exactly as it is stored)."""
    if isinstance(value, bool) or not isinstance(value, (Rational, float)):
        raise InternalError(f"a sparse vector compares numbers, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InternalError(f"a sparse vector compares finite numbers, got {value!r}")
    return Fraction(value)


def _positive(value: Rational | float) -> Fraction:
    exact = _exact(value)
    if exact <= 0:
        raise InternalError(f"a sensitivity must be positive, got {value!r}")
    return exact
