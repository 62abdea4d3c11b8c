"""(1 - alpha) intervals of derived statistics, from the exact noise laws of their measures.

Every derived statistic (AVG, VARIANCE, STDDEV, CORR, COVAR_*, REGR_*) is a function of ratios
r = S / n of a sum measure S over a count n of the same rows. Its interval is built in up to four
steps, each conservative (no approximation decides the coverage):

1. **Each ratio by test inversion.** When r is the true ratio, S' - r n' = e_S - r e_n exactly
   (S = r n), whatever n is: a pivot whose law is known from the two measures' noise laws alone
   (discrete Laplace or discrete Gaussian, ``dpsql.mechanisms.noise``). The interval of r is
   every r in the ratio's possible range that the level-alpha test |S' - r n'| <= t(r) accepts,
   t(r) the pivot's (1 - alpha) quantile. Computed on a partition of the range into cells: for
   a cell [a, b], t is the (1 - alpha) quantile of max over r in {a, b} of |e_S - r e_n| (which
   bounds |e_S - r e_n| for every r in the cell, the expression being linear in r), so each r is
   tested at level alpha by its own cell's t; the noise of n is summed over in blocks of values
   (within a block its worst corner counts), and the law's far tail is counted as a miss. The
   cells that accept anything are split (a finer partition only lowers each t, so it accepts
   less) until the interval stops shrinking. Coverage of r is then at least 1 - alpha, with the
   two noises convolved rather than each bounded apart, and with the true ratio rather than
   its worst case multiplying the count's noise. AVG is one ratio: its interval is this one.
2. **Centred second moments by their own pivots** (``centred_moment_interval``): for the true
   means m_u, m_v and centred moment c = S_uv/n - m_u m_v (a covariance, or a variance when
   u = v), S_uv' - m_v S_u' - m_u S_v' + (m_u m_v - c) n' is a weighted sum of the four noises,
   whose law the hypothesis fixes; its critical value (``sum_critical``: the noises' pmfs on a
   lattice, convolved) at the largest weights the means' intervals allow bounds the one at the
   true weights. The means' own errors then reach c only at second order.
3. **A union bound** (``centred_boxes``): the means (``MEANS_SHARE`` of alpha) and the centred
   moments (the rest, equally) hold together with probability at least 1 - alpha (and the
   count's own interval at ``COUNT_SHARE`` of it, where the sample form's n / (n - 1) needs
   it); the statistic's interval is its exact range over that box (``correlation_bounds``,
   ``quotient_range``, ``product_range``: each is monotone in each part, so the range is read
   off at the box's ends), through the clamps the values apply (``clamped_moments``).
4. **CORR's and REGR_SLOPE's own pivots** (``correlation_interval``, ``slope_interval``): at
   the true rho (beta) a combination of the W_uv = S_uv' - m_v S_u' - m_u S_v' + m_u m_v n' is a
   weighted sum of the noises alone, its nuisances (the means, the ratio of the spreads) taken
   from the box at ``CORRELATION_BOX_SHARE`` of alpha; the interval is the box's range cut to
   what the pivot accepts.

The per-unit model's uncentred sums (``uncentred``: of v, v^2 and v_x v_y, each unit's total
clamped) go through the same steps in their own units (the pivots do not depend on the values'
origin), then are converted exactly to centred units (``centred_boxes``).

These intervals are for the bounded truth (the data as clamped and contribution-bounded);
bias from the bounds is not in them. Nothing here reads data: the noisy measures and the plan
only (post-processing).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

import numpy as np

from dpsql.analysis.plan import Measure
from dpsql.mechanisms import noise

__all__ = ["Law", "law_of", "ratio_interval", "ratio_range", "count_interval", "square_range",
           "spread_of", "product_range", "quotient_range", "outward", "sample_factor_range", "correlation_bounds",
           "holding", "sum_critical", "centred_moment_interval", "centred_boxes", "clamped_moments",
           "uncentred", "unclamped", "correlation_interval", "slope_interval"]

TAIL_SHARE = 1e-3
"""Share of alpha left to the count's noise beyond the blocks summed over (counted as a miss)."""
BLOCKS = 160
"""Blocks of the count's noise values on each side of 0 (finer near 0, where its mass is)."""
SPLIT = 4
"""Children of a cell that accepts some ratio, at each refinement."""
DEPTH = 6
"""Refinements at most: cells as narrow as the range / 4**6."""
SHRINK = 0.99
"""A refinement that leaves the interval wider than this share of the previous one is the last."""
COUNT_SHARE = 0.05
"""Share of alpha spent on the count's own interval where a statistic needs it (n / (n - 1))."""
MEANS_SHARE = 0.1
"""Share of alpha the means take beside centred second moments (their errors reach a moment only
at second order, so a wider interval of the means costs little)."""


@dataclass(frozen=True)
class Law:
    """A measure's noise law: discrete Laplace of ``scale``, discrete Gaussian of variance
    ``scale``, or none."""

    kind: str
    scale: Fraction

    def tail(self, m: np.ndarray) -> np.ndarray:
        """P(Z > m) for integer m (any sign), as floats.

        >>> Law("laplace", Fraction(10)).tail(np.array([-1, 0, 29])).round(4).tolist()
        [0.525, 0.475, 0.0261]
        """
        m = np.asarray(m, dtype=np.float64)
        upper = self._upper_tail(np.abs(m) - (m < 0))   # P(Z > m) = 1 - P(Z > -m - 1) for m < 0
        return np.where(m < 0, 1.0 - upper, upper)

    def _upper_tail(self, m: np.ndarray) -> np.ndarray:
        """P(Z > m) for m >= 0."""
        if self.kind == "none" or self.scale == 0:
            return np.zeros_like(m)
        if self.kind == "laplace":
            log_p = -1.0 / float(self.scale)
            return np.exp((m + 1) * log_p - math.log1p(math.exp(log_p)))   # p^(m+1) / (1 + p)
        return _gaussian_tail(self.scale, m)

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - laws are few, frozen and hashable
    def reach(self, mass: float) -> int:
        """The least R >= 0 with P(|Z| > R) <= mass."""
        if self.kind == "none" or self.scale == 0:
            return 0
        high = 1
        while 2 * float(self.tail(np.array([high]))[0]) > mass:
            high *= 2
        low = 0
        while low < high:
            middle = (low + high) // 2
            if 2 * float(self.tail(np.array([middle]))[0]) <= mass:
                high = middle
            else:
                low = middle + 1
        return low


_ENUMERATE_SIGMA = 4096.0


@functools.lru_cache(maxsize=64)
def _gaussian_table(sigma_sq: Fraction) -> np.ndarray:
    """P(Z > m) for m = 0 .. reach of a discrete Gaussian (0 beyond), from its normalised pmf."""
    reach = math.ceil(math.sqrt(2 * 745 * float(sigma_sq))) + 2
    z = np.arange(reach + 1, dtype=np.float64)
    w = np.exp(-z * z / (2 * float(sigma_sq)))
    above = np.cumsum(w[::-1])[::-1]
    return np.append(above[1:], 0.0) / (w[0] + 2 * above[1])


def _gaussian_tail(sigma_sq: Fraction, m: np.ndarray) -> np.ndarray:
    sigma = math.sqrt(sigma_sq)
    if sigma <= _ENUMERATE_SIGMA:
        table = _gaussian_table(sigma_sq)
        index = np.minimum(m, table.size - 1).astype(np.int64)
        return table[index]
    # Euler-Maclaurin, as ``noise.discrete_gaussian_halfwidth`` (error ~ sigma^-3 of the pmf)
    a = m + 1
    f = np.exp(-a * a / (2 * sigma * sigma))
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return erfc(a / (sigma * math.sqrt(2))) / 2 + (f / 2 + a * f / (12 * sigma * sigma)) / (
        math.sqrt(2 * math.pi) * sigma)


def law_of(measure: Measure) -> Law:
    """The noise law of ``measure`` (in its grid units), with the scale the sampler really draws
    (rounded up when its terms are large)."""
    if measure.noise == "laplace":
        return Law("laplace", noise.discrete_laplace_sampled_scale(measure.scale))
    if measure.noise == "gaussian":
        return Law("gaussian", noise.discrete_gaussian_sampled_sigma_sq(measure.scale))
    return Law("none", Fraction(0))


def ratio_range(measure: Measure) -> tuple[Fraction, Fraction]:
    """Where a sum measure's mean row value lies, in its grid units: its row values' interval
    (centred: [-(U - L), U - L]; centred and squared: [0, (U - L)^2]; else [lower, upper])."""
    if measure.centred:
        spread = Fraction(measure.upper - measure.lower)
        return (Fraction(0), spread * spread) if measure.squared else (-spread, spread)
    return Fraction(measure.lower), Fraction(measure.upper)


# -- one ratio: the pivot's critical values and the test's acceptance ------------------------

@functools.lru_cache(maxsize=64)
def _blocks(law: Law, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The count's noise values summed over: (first, last, mass) of each block, and the mass left
    beyond them. {0}, then single values, or blocks of quadratic spacing (narrow near 0, where
    the mass is), mirrored on the negative side."""
    reach = law.reach(alpha * TAIL_SHARE)
    if reach <= BLOCKS:
        lasts = np.arange(1, reach + 1, dtype=np.float64)
    else:
        lasts = np.unique(np.round(reach * (np.arange(1, BLOCKS + 1) / BLOCKS) ** 2))
        lasts = lasts[lasts >= 1]
    firsts = np.concatenate(([1.0], lasts[:-1] + 1))[:lasts.size]
    mass = law.tail(firsts - 1) - law.tail(lasts)              # P(first <= Z <= last)
    zero = law.tail(np.array([-1]))[0] - law.tail(np.array([0]))[0]
    lows = np.concatenate(([0.0], firsts, -lasts))
    highs = np.concatenate(([0.0], lasts, -firsts))
    masses = np.concatenate(([zero], mass, mass))
    beyond = 2 * float(law.tail(np.array([reach]))[0])
    return lows, highs, masses, beyond


@functools.lru_cache(maxsize=4096)
def critical(x: Law, y: Law, a: float, b: float, alpha: float) -> float:
    """A t with P(max over r in {a, b} of |X - r Y| > t) <= alpha, X and Y independent with laws
    ``x`` and ``y`` (the sum's and the count's noise); close to the least such t.

    >>> t = critical(Law("laplace", Fraction(10)), Law("none", Fraction(0)), 0.0, 1.0, 0.05)
    >>> 30 <= t < 30.5
    True
    """
    lows, highs, masses, beyond = _blocks(y, alpha)
    products = np.stack([a * lows, a * highs, b * lows, b * highs])
    least, most = products.min(axis=0), products.max(axis=0)    # r y over the cell and the block
    # |X - r y| <= t for all of them: X in [most - t, least + t] (Y symmetric: -Y has Y's law)
    budget = alpha * (1 - 1e-9) - beyond

    def misses(ts: np.ndarray) -> np.ndarray:
        """The missed mass at each t of ``ts``, one row per t (each row as a lone t gives it)."""
        t = ts[:, None]
        first, last = np.ceil(most - t), np.floor(least + t)
        inside = np.where(first <= last, 1.0 - x.tail(-first) - x.tail(last), 0.0)
        return np.sum(masses * (1.0 - np.maximum(inside, 0.0)), axis=1)

    reach_x = x.reach(alpha / 4)
    high = float(reach_x + max(abs(a), abs(b)) * max(abs(lows).max(), abs(highs).max()) + 1)
    while True:  # doubling until it passes: LOOKAHEAD doublings tried at once
        tried = high * 2.0 ** np.arange(LOOKAHEAD)
        passed = np.flatnonzero(misses(tried) <= budget)
        if passed.size:
            high = float(tried[passed[0]])
            break
        high = float(tried[-1]) * 2
    low = 0.0
    while high - low > max(1e-3 * high, 0.5):  # t at most 0.1% above the least
        # Bisection, LOOKAHEAD steps at a time: every midpoint those steps could try, computed
        # as they compute it (node i halves its interval into nodes 2i + 1 and 2i + 2), is
        # tested in one call; the walk then takes the steps one by one, as plain bisection would.
        ends = [(low, high)]
        middles = []
        for i in range(2 ** LOOKAHEAD - 1):
            below, above = ends[i]
            middle = (below + above) / 2
            middles.append(middle)
            ends += [(below, middle), (middle, above)]
        passes = misses(np.array(middles)) <= budget
        node = 0
        for _ in range(LOOKAHEAD):
            if not high - low > max(1e-3 * high, 0.5):
                break
            if passes[node]:
                high, node = middles[node], 2 * node + 1
            else:
                low, node = middles[node], 2 * node + 2
    return high


LOOKAHEAD = 4
"""Steps of ``critical``'s doubling and bisection tested in one vectorised call (15 midpoints)."""


def _accepted(total: int, count: int, t: float, a: float, b: float) -> tuple[float, float] | None:
    """The r in [a, b] with |total - r count| <= t (rounded outward), or None."""
    if count == 0:
        return (a, b) if abs(total) <= t else None
    ends = sorted(((total - t) / count, (total + t) / count))
    low, high = max(_down(ends[0]), a), min(_up(ends[1]), b)
    return (low, high) if low <= high else None


@functools.lru_cache(maxsize=1 << 16)  # accuracy() asks for intervals and half-widths of the same rows
def ratio_interval(total: int, count: int, x: Law, y: Law, low: Fraction, high: Fraction,
                   alpha: float) -> tuple[float, float]:
    """The (1 - alpha) interval of the true ratio S / n in [low, high] from noisy ``total`` S' and
    ``count`` n' (module docstring, step 1); the whole range when the test accepts it all.

    >>> laplace = Law("laplace", Fraction(20))
    >>> low, high = ratio_interval(5000, 1000, laplace, laplace, Fraction(-10), Fraction(10), 0.05)
    >>> 4.6 < low < 4.8 and 5.2 < high < 5.4
    True
    """
    whole = (float(low), float(high))
    cells = {whole: _accepted(total, count, critical(x, y, *whole, alpha), *whole)}
    for end in (0, 1):  # refine the cell that holds the lowest accepted ratio, then the highest
        for _ in range(DEPTH):
            found = _hull(cells)
            if found is None:
                return whole  # no ratio passes: only a ratio outside the range could be the truth
            pick = min if end == 0 else max
            cell = pick((c for c, a in cells.items() if a is not None), key=lambda c: cells[c][end])  # type: ignore[index]
            a, b = cell
            del cells[cell]
            for i in range(SPLIT):  # a finer partition: each child's t is at most its parent's
                child = (a + (b - a) * i / SPLIT, a + (b - a) * (i + 1) / SPLIT)
                cells[child] = _accepted(total, count, critical(x, y, *child, alpha), *child)
            narrowed = _hull(cells)
            if narrowed is None or abs(narrowed[end] - found[end]) <= (1 - SHRINK) * (found[1] - found[0]):
                break
    return _hull(cells) or whole


def _hull(cells: dict[tuple[float, float], tuple[float, float] | None]) -> tuple[float, float] | None:
    accepted = [a for a in cells.values() if a is not None]
    if not accepted:
        return None
    return min(a[0] for a in accepted), max(a[1] for a in accepted)


def _down(value: float) -> float:
    return math.nextafter(value - abs(value) * 1e-12, -math.inf) if math.isfinite(value) else value


def _up(value: float) -> float:
    return math.nextafter(value + abs(value) * 1e-12, math.inf) if math.isfinite(value) else value


# -- several ratios: the union bound and the statistics' ranges over its box ----------------

def count_interval(count: Measure, noisy: int, alpha: float) -> tuple[int, int]:
    """The (1 - alpha) interval of a count from its noisy value (at least 0)."""
    law = law_of(count)
    if law.kind == "none":
        return max(noisy, 0), max(noisy, 0)
    half = law.reach(alpha)
    return max(noisy - half, 0), max(noisy + half, 0)


def square_range(low: float, high: float) -> tuple[float, float]:
    """The range of m^2 over m in [low, high]."""
    ends = (low * low, high * high)
    return (0.0 if low <= 0 <= high else min(ends)), max(ends)


def product_range(first: tuple[float, float], second: tuple[float, float]) -> tuple[float, float]:
    """The range of a b over a, b in the two intervals (at their corners)."""
    corners = [a * b for a in first for b in second]
    return min(corners), max(corners)


def quotient_range(numerator: tuple[float, float], denominator: tuple[float, float]) -> tuple[float, float] | None:
    """The range of a / b over a in ``numerator`` and b in ``denominator`` (b > 0 throughout;
    None, unbounded, when the denominator may be 0 or less)."""
    if denominator[0] <= 0:
        return None
    corners = [a / b for a in numerator for b in denominator]
    return min(corners), max(corners)


def outward(low: float, high: float, floor: float = -math.inf, ceiling: float = math.inf) -> tuple[float, float]:
    """[low, high] widened by a relative 1e-12 and one float step (float arithmetic above), cut
    to [floor, ceiling]."""
    return max(_down(low), floor), min(_up(high), ceiling)


def spread_of(low: float, high: float, value: float) -> float:
    """The half-width reported for an interval that need not be centred on the value: the larger
    distance from the value to an end (NaN for an undefined value).

    >>> spread_of(1.0, 4.0, 2.0), spread_of(0.0, 1.0, float("nan"))
    (2.0, nan)
    """
    if math.isnan(value):
        return math.nan
    return max(value - low, high - value)


# -- second moments over a box of ratios (VARIANCE, COVAR, CORR, REGR_*) ----------------------

Box = dict[str, tuple[float, float]]
"""Per statistic name (a sum measure's ratio to the count, in its grid units), its interval; "n"
is the count's own interval where asked for."""


def sample_factor_range(count: tuple[float, float]) -> tuple[float, float]:
    """The range of n / (n - 1) over true counts n >= 2 in ``count`` (2 where n may be 2 or less).

    >>> sample_factor_range((101.0, 201.0))
    (1.005, 1.01)
    """
    def factor(n: float) -> float:
        return n / (n - 1) if n > 2 else 2.0
    return factor(count[1]), factor(count[0])


def correlation_bounds(cov: tuple[float, float], var_x: tuple[float, float],
                       var_y: tuple[float, float]) -> tuple[float, float]:
    """The range of cov / sqrt(var_x var_y) over the intervals, within [-1, 1] (where the truth
    lies, by Cauchy-Schwarz): a positive cov is smallest over the largest root and largest over
    the smallest (1 where that may be 0), a negative one the other way round.

    >>> [round(end, 9) for end in correlation_bounds((0.5, 0.8), (1.0, 1.0), (1.0, 4.0))]
    [0.25, 0.8]
    >>> correlation_bounds((-0.1, 0.8), (0.0, 1.0), (1.0, 4.0))
    (-1.0, 1.0)
    """
    smallest = math.sqrt(var_x[0] * var_y[0]) * (1 - 1e-12)
    largest = math.sqrt(var_x[1] * var_y[1]) * (1 + 1e-12)

    def ratio(value: float, root: float) -> float:
        if root <= 0:
            return math.copysign(1.0, value) if value != 0 else 0.0
        return max(-1.0, min(1.0, value / root))

    low = ratio(cov[0], largest if cov[0] >= 0 else smallest)
    high = ratio(cov[1], smallest if cov[1] >= 0 else largest)
    if cov[0] < 0 and smallest <= 0:
        low = -1.0
    if cov[1] > 0 and smallest <= 0:
        high = 1.0
    return max(_down(low), -1.0), min(_up(high), 1.0)


def holding(spans: Sequence[tuple[float, float]], values: Sequence[float]) -> list[tuple[float, float]]:
    """Each interval widened to hold its released value (a value the test rejects, as an AVG of
    a noisy count <= 0 released as its bounds' midpoint, is still shown inside its interval;
    widening keeps the coverage).

    >>> holding([(1.0, 2.0), (1.0, 2.0), (1.0, 2.0)], [0.5, 1.5, float("nan")])
    [(0.5, 2.0), (1.0, 2.0), (1.0, 2.0)]
    """
    return [(low, high) if math.isnan(value) or math.isnan(low) else (min(low, value), max(high, value))
            for (low, high), value in zip(spans, values)]


# -- centred second moments by their own pivots ------------------------------------------------

LATTICE = 4096
"""Lattice steps across the widest term of ``sum_critical`` (its rounding adds at most one step
per term to t)."""


@functools.lru_cache(maxsize=4096)
def sum_critical(terms: tuple[tuple[Law, float], ...], alpha: float) -> float:
    """A t with P(|sum of a_i Z_i| > t) <= alpha for independent Z_i of the given laws and
    coefficients a_i: each a_i Z_i rounded up onto a lattice (so the lattice sum is at least the
    true one), their exact pmfs convolved (FFT), the tails beyond each law's reach counted as
    misses; by symmetry P(|sum| > t) <= 2 P(lattice sum > t).

    >>> t = sum_critical(((Law("laplace", Fraction(10)), 1.0),), 0.05)
    >>> 30 <= t < 31
    True
    """
    parts = [(law, abs(a)) for law, a in terms if law.kind != "none" and law.scale and a]
    if not parts:
        return 0.0
    share = alpha * TAIL_SHARE / len(parts)
    reaches = [law.reach(share) for law, _ in parts]
    step = max(a * (r + 1) for (_, a), r in zip(parts, reaches)) / (LATTICE / 2)
    total = np.ones(1)
    offset = 0
    beyond = 0.0
    for (law, a), reach in zip(parts, reaches):
        lowest, highest = math.floor(-a * reach / step), math.ceil(a * reach / step)
        cells = np.arange(lowest, highest + 1, dtype=np.float64)
        # ceil(a Z / step) = j  <=>  (j - 1) step / a < Z <= j step / a
        upper = np.floor(cells * step / a)
        below = np.floor((cells - 1) * step / a)
        pmf = np.maximum(law.tail(below) - law.tail(upper), 0.0)
        beyond += 2 * float(law.tail(np.array([reach]))[0])
        size = total.size + pmf.size - 1
        width = 1 << (size - 1).bit_length()
        total = np.fft.irfft(np.fft.rfft(total, width) * np.fft.rfft(pmf, width), width)[:size]
        total = np.maximum(total, 0.0)
        offset += lowest
    above = np.cumsum(total[::-1])[::-1]      # above[k] = P(lattice sum >= offset + k)
    budget = alpha * (1 - 1e-6) - beyond
    # P(sum > t) <= P(lattice sum > t / step): the least k with 2 P(lattice >= k + 1) <= budget
    tails = np.append(above[1:], 0.0)
    index = int(np.argmax(2 * tails <= budget))
    return max((offset + index) * step, 0.0) * (1 + 1e-9)


def centred_moment_interval(second: int, first: tuple[int, int], count: int, laws: tuple[Law, Law, Law, Law],
                            means: tuple[tuple[float, float], tuple[float, float]], limit: tuple[float, float],
                            alpha: float, same: bool = False) -> tuple[float, float]:
    """The (1 - alpha) interval, given that the true means lie in ``means``, of a centred second
    moment c = S_uv/n - m_u m_v (a covariance; a variance when u = v) in [limit]: from noisy
    ``second`` = S_uv', ``first`` = (S_u', S_v') and ``count`` = n', with the noise laws of
    (S_uv, S_u, S_v, n); ``same`` for a variance (u = v: one sum, its noise counted once with
    the summed coefficient 2 m_u).

    For the true (m_u, m_v, c), D = S_uv' - m_v S_u' - m_u S_v' + (m_u m_v - c) n' is exactly
    e_uv - m_v e_u - m_u e_v + (m_u m_v - c) e_n, whose law the hypothesis fixes; the test
    |D| <= t (t by ``chernoff_critical``, at the largest coefficients the means' box and the
    current range of c allow: t only grows with them) accepts c where n' |c - cov' - (m_u - m_u')
    (m_v - m_v')| <= t for some means in the box (cov' = S_uv'/n' - m_u' m_v', m' = S'/n'). Its
    error from the means is second order ((m_u - m_u')(m_v - m_v')), where the box of the three
    ratios had it first order (m_v' e_u + m_u' e_v). Holds with probability 1 - alpha when the
    means do (a union bound with theirs).

    Why the largest coefficients: with U_i independent uniform on (-1/2, 1/2), each Z_i + U_i has
    a symmetric unimodal density, so (Anderson's theorem, their convolution being symmetric
    unimodal too) P(|sum a_i (Z_i + U_i)| > t) only grows with each |a_i|; and the sum of the
    a_i Z_i differs from that of the a_i (Z_i + U_i) by at most half the sum of |a_i|, as does
    ``sum_critical``'s lattice sum once shifted by it. So the critical value at the largest
    |a_i|, plus the sum of the |a_i|, holds for every coefficient at most as large."""
    low, high = limit
    if count <= 0:
        return low, high
    law_uv, law_u, law_v, law_n = laws
    mean_u, mean_v = Fraction(first[0], count), Fraction(first[1], count)
    centre = float(Fraction(second, count) - mean_u * mean_v)
    shifts = ((means[0][0] - float(mean_u), means[0][1] - float(mean_u)),
              (means[1][0] - float(mean_v), means[1][1] - float(mean_v)))
    offsets = square_range(*shifts[0]) if same else product_range(*shifts)
    largest_u = max(abs(means[0][0]), abs(means[0][1]))
    largest_v = max(abs(means[1][0]), abs(means[1][1]))
    for _ in range(3):
        kappa = largest_u * largest_v + max(abs(low), abs(high))
        terms = [(law_uv, 1.0), (law_n, _rounded_up(kappa))]
        terms += ([(law_u, _rounded_up(largest_v + largest_u))] if same else
                  [(law_u, _rounded_up(largest_v)), (law_v, _rounded_up(largest_u))])
        # + the coefficients: the critical value at the largest coefficients bounds the one at the
        # true ones (below), up to the integers' lattice
        t = (sum_critical(tuple(terms), alpha) + sum(a for _, a in terms)) / count
        low, high = max(low, _down(centre + offsets[0] - t)), min(high, _up(centre + offsets[1] + t))
        if low > high:  # nothing accepted: only a value outside the limit could be the truth
            return limit
    return low, high


def _rounded_up(value: float) -> float:
    """``value`` rounded up to 3 significant bits: t grows with every coefficient, so this only
    widens, and keeps the critical values' cache small."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log2(value)) - 2
    return math.ceil(value / 2.0**exponent) * 2.0**exponent


SECOND_MOMENTS = {"xy": ("cov", "x", "y"), "xx": ("var_x", "x", "x"), "yy": ("var_y", "y", "y")}
"""A second-moment statistic -> the centred moment it gives and the two means it is centred on."""


def uncentred(measure: Measure) -> bool:
    """The per-unit model's sums of v, v^2 and v_x v_y (not centred on the bounds' midpoint)."""
    return not measure.centred and not (measure.factors and measure.factors[0].centred)


def _hull_zero(low: Fraction, high: Fraction) -> tuple[Fraction, Fraction]:
    return min(low, Fraction(0)), max(high, Fraction(0))


def centred_boxes(measures: Sequence[Measure], statistics: Sequence[str], noisy: Mapping[str, Sequence[int]],
                  alpha: float, with_count: bool = False) -> list[Box]:
    """Per released row, intervals holding together with probability at least 1 - alpha, in
    centred units (a step of a mean worth grid / 2, of a moment grid_u grid_v / 4), of the exact
    statistics' means "x" and "y" (``ratio_interval``) and the centred moments "cov", "var_x",
    "var_y" their ``statistics`` give ("xy", "xx", "yy": ``centred_moment_interval``); not yet
    clamped as the released values are (``clamped_moments``, or the family's own clamp). The
    means share ``MEANS_SHARE`` of alpha, the moments the rest equally (less ``COUNT_SHARE`` of it
    all, which the count's interval "n" takes ``with_count``). ``measures``: the sums of
    ``statistics`` in order, then the count.

    The per-unit model's uncentred sums (S_u = sum u, S_uv = sum u v, n; ``uncentred``) are
    tested in their own units, with their own independent noises: the pivot of
    ``centred_moment_interval`` is shift-invariant (S_uv' - m_v S_u' - m_u S_v' + (m_u m_v - c) n'
    is, for the true means and c = S_uv/n - m_u m_v, exactly e_uv - m_v e_u - m_u e_v + (m_u m_v
    - c) e_n whatever the origin of u and v), so it holds for the uncentred sums as it does for
    the centred ones; only the hypotheses' ranges differ. There each unit's per-group total is
    clamped toward 0 (its bounds hold 0), so it stays between 0 and the unclamped total: a mean
    lies in [lower, upper] widened to hold 0 (every row in [lower, upper], so every unit's total
    in n_k [lower, upper]), S_uv / n in the rows' products' range widened to hold 0 (S_uu / n in
    [0, max(lower^2, upper^2)]), and c in that range less the means' product's range (possibly
    below 0: a clamped sum of squares need not exceed the square of its clamped sum; the
    centred moment's pivot needs only a range holding the truth). The exact conversion to
    centred units (c = 2v - M, M = lower + upper: mean 2 m - M, moment 4 c, as
    ``moments.centred_statistics``) is affine, increasing, so it maps each interval onto the
    interval of the converted truth; the converted truth is what the released value's formula
    reads (``moments.centred_statistics``, ``variance.centred_moments``)."""
    k = len(statistics)
    sums, count = dict(zip(statistics, measures[:k])), measures[k]
    firsts = [name for name in statistics if name in ("x", "y")]
    seconds = [name for name in statistics if name in SECOND_MOMENTS]
    tests = alpha * (1 - COUNT_SHARE) if with_count else alpha
    # the means' errors reach a centred moment only at second order: they take a small share
    share_first = tests * (MEANS_SHARE if seconds else 1) / len(firsts)
    share = tests * (1 - MEANS_SHARE) / len(seconds) if seconds else 0.0
    laws = {name: law_of(measure) for name, measure in sums.items()}
    law_n = law_of(count)
    native = uncentred(measures[0])
    ranges = {name: (_hull_zero(Fraction(sums[name].lower), Fraction(sums[name].upper)) if native
                     else ratio_range(sums[name])) for name in firsts}
    # centred units: a native mean m becomes 2 m - M, a native moment 4 c
    middles = {name: sums[name].lower + sums[name].upper if native else 0 for name in firsts}
    limits = {}
    for name in seconds:
        _, u, v = SECOND_MOMENTS[name]
        low_u, high_u = (float(end) for end in ranges[u])
        low_v, high_v = (float(end) for end in ranges[v])
        if native:  # c = S_uv / n - m_u m_v: the rows' products' range (with 0) less the means' product's
            products = square_range(low_u, high_u) if u == v else product_range((low_u, high_u), (low_v, high_v))
            seconds_range = (min(products[0], 0.0), max(products[1], 0.0))
            limits[name] = (seconds_range[0] - products[1], seconds_range[1] - products[0])
        else:  # half the width of each mean's range: |cov| <= h_u h_v, var <= h^2 (centred: h = s)
            largest = (high_u - low_u) / 2 * (high_v - low_v) / 2
            limits[name] = (0.0, largest) if u == v else (-largest, largest)
    rows = []
    for i, n in enumerate(noisy[count.name]):
        own: Box = {}
        for name in firsts:
            own[name] = ratio_interval(noisy[sums[name].name][i], n, laws[name], law_n, *ranges[name], share_first)
        box: Box = {name: (2 * low - middles[name], 2 * high - middles[name]) if native else (low, high)
                    for name, (low, high) in own.items()}
        for name in seconds:
            moment, u, v = SECOND_MOMENTS[name]
            low, high = centred_moment_interval(
                noisy[sums[name].name][i], (noisy[sums[u].name][i], noisy[sums[v].name][i]), n,
                (laws[name], laws[u], laws[v], law_n), (own[u], own[v]), limits[name], share, same=u == v)
            box[moment] = (4 * low, 4 * high) if native else (low, high)
        if with_count:
            low_n, high_n = count_interval(count, n, alpha * COUNT_SHARE)
            box["n"] = (float(low_n), float(high_n))
        rows.append(box)
    return rows


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def clamped_moments(box: Box, spreads: Mapping[str, float]) -> Box:
    """``centred_boxes``' box (centred units) as ``moments.moments`` clamps the values it reads:
    each mean m into [-s, s] (``spreads``: s per mean), each second moment's ratio k + q (k the
    centred moment, q = m_u m_v) into [A, B] ([-s_u s_v, s_u s_v]; a square's [0, s^2]), and the
    moment, that ratio less the clamped means' product q', into [A, B] again. The exact bounded
    statistics of the per-unit model need not be those of any data (each total clamped on its
    own), so these clamps may bind on the truth; they never do on the rows model's.

    The moment's value v(k, q, q') = clamp(clamp(k + q, A, B) - q', A, B) is nondecreasing in k
    and q and nonincreasing in q', so over the box it lies between its values at the corners
    (k low, q low, q' high) and (k high, q high, q' low). Where both means' intervals lie inside
    [-s, s] the means are never clamped (q' = q), and then, as |q| <= B - A,
    v = clamp(k, max(A, A - q), min(B, B - q)): nondecreasing in k and nonincreasing in q, so the
    range is read at (k low, q high) and (k high, q low); this keeps the means' errors at second
    order (q itself cancels).

    >>> box = clamped_moments({"x": (-1.0, 1.0), "var_x": (3.0, 5.0)}, {"x": 2.0})
    >>> box["var_x"]  # var = clamp(k, 0, 4 - m^2): at most 4 - 0, at least min(3, 4 - 1)
    (3.0, 4.0)
    >>> clamped_moments({"x": (1.0, 3.0), "var_x": (3.0, 5.0)}, {"x": 2.0})["var_x"]  # m may be clamped
    (0.0, 3.0)
    """
    out = dict(box)
    clamped = {}
    for name, s in spreads.items():
        if name in box:
            clamped[name] = (_clamp(box[name][0], -s, s), _clamp(box[name][1], -s, s))
            out[name] = clamped[name]
    inside = all(clamped[name] == box[name] for name in clamped)
    for moment, u, v in SECOND_MOMENTS.values():
        if moment not in box:
            continue
        low, high = box[moment]
        if u == v:
            a, b = 0.0, spreads[u] * spreads[u]
            q, q_clamped = square_range(*box[u]), square_range(*clamped[u])
        else:
            b = spreads[u] * spreads[v]
            a = -b
            q, q_clamped = product_range(box[u], box[v]), product_range(clamped[u], clamped[v])
        if inside:
            out[moment] = (_clamp(low, max(a, a - q[1]), min(b, b - q[1])),
                           _clamp(high, max(a, a - q[0]), min(b, b - q[0])))
        else:
            out[moment] = (_clamp(_clamp(low + q[0], a, b) - q_clamped[1], a, b),
                           _clamp(_clamp(high + q[1], a, b) - q_clamped[0], a, b))
    return out


def unclamped(box: Box, spreads: Mapping[str, float]) -> bool:
    """No clamp of ``clamped_moments`` binds anywhere in ``box``: every mean inside [-s, s] and each
    moment k with k, and k + q for every q = m_u m_v of the box, inside its [A, B]; then the
    values' moments are the box's own (k itself, at every point)."""
    for name, s in spreads.items():
        if name in box and not -s <= box[name][0] <= box[name][1] <= s:
            return False
    for moment, u, v in SECOND_MOMENTS.values():
        if moment not in box:
            continue
        low, high = box[moment]
        if u == v:
            a, b, q = 0.0, spreads[u] * spreads[u], square_range(*box[u])
        else:
            b = spreads[u] * spreads[v]
            a, q = -b, product_range(box[u], box[v])
        if not (max(a, a - q[0]) <= low and high <= min(b, b - q[1])):
            return False
    return True


CORRELATION_BOX_SHARE = 0.5
"""Share of alpha the box (means and centred moments) takes beside CORR's and REGR_SLOPE's own
pivots. The box only fixes the pivots' nuisances (means, the ratio of the spreads), which reach
them at second order, so a small share costs the pivots little (on flights under the per-unit
model, CORR's median width is 0.179 at 0.1, 0.189 at 0.5, 0.205 at 0.75); but where the noise
leaves a variance possibly 0 the pivot tells nothing and the box alone, at this share, is the
interval (rows model on flights, CORR at epsilon 1: mean width 1.53 at 0.75, 1.68 at 0.5, 1.79 at
0.25 against 1.48 with the box alone at all of alpha). Half is the compromise."""


def correlation_interval(measures: Sequence[Measure], noisy: Mapping[str, Sequence[int]], i: int, box: Box,
                         alpha: float) -> tuple[float, float] | None:
    """The (1 - alpha) interval of rho = cov / sqrt(var_x var_y) of row ``i``, given that its true
    means, centred moments and so the ratio of spreads lie in ``box`` (``centred_boxes``, unclamped
    and strictly positive variances; ``unclamped``, so the value is clamp(rho, -1, 1)); None where
    it cannot tell (count or variances not positive). ``measures``: the sums of x, y, xy, xx, yy
    and the count (CORR's ``STATISTICS``), in their own units, either form.

    With W_uv = S_uv' - m_v S_u' - m_u S_v' + m_u m_v n' at the true means, W_uv = c_uv n +
    N_uv, N_uv = e_uv - m_v e_u - m_u e_v + m_u m_v e_n. For lambda = sqrt(var_y / var_x) and
    rho the truth's, c_xy = rho lambda var_x = rho var_y / lambda, so c_xy - a var_x - b var_y = 0
    with a = rho lambda / 2, b = rho / (2 lambda), and the pivot P = W_xy - a W_xx - b W_yy is
    N_xy - a N_xx - b N_yy exactly: e_xy - a e_xx - b e_yy - (m_y - 2 a m_x) e_x - (m_x - 2 b
    m_y) e_y + (m_x m_y - a m_x^2 - b m_y^2) e_n, a weighted sum of the six independent noises.
    Its critical value at the largest weights the box allows (|rho| <= R, lambda in the box's
    range, |m| at most the means' largest) bounds the one at the true weights (Anderson's theorem
    as in ``centred_moment_interval``). The test |P| <= t accepts rho where, with noisy centred
    cov' and var' (m' = S'/n') and d = m - m' the means' shifts, n' |cov' + d_x d_y - rho K| <= t,
    K = (lambda (var_x' + d_x^2) + (var_y' + d_y^2) / lambda) / 2; over the nuisance box the
    accepted rho lie between (the least numerator) / K and (the greatest) / K at the extreme K of
    the numerator's sign (K > 0 throughout, else None). The means and lambda enter K at second
    order (K is least at the true lambda): the interval is about as narrow as rho's own noise.
    The accepted set's largest |rho| bounds R at the next pass (the truth lies in it whenever the
    test holds: the induction of ``centred_moment_interval``)."""
    if box["var_x"][0] <= 0 or box["var_y"][0] <= 0:
        return None
    noisy_row = _noisy_moments(measures, ("x", "y", "xy", "xx", "yy"), noisy, i, box)
    if noisy_row is None:
        return None
    n, own, cov, (low_x, high_x), (low_y, high_y), cross, sums, count = noisy_row
    ratio_low = math.sqrt(box["var_y"][0] / box["var_x"][1]) * (1 - 1e-12)
    ratio_high = math.sqrt(box["var_y"][1] / box["var_x"][0]) * (1 + 1e-12)
    optimum = min(max(math.sqrt(low_y / low_x), ratio_low), ratio_high)
    least = (optimum * low_x + low_y / optimum) / 2 * (1 - 1e-12)
    most = max(r * high_x + high_y / r for r in (ratio_low, ratio_high)) / 2 * (1 + 1e-12)
    largest_x = max(abs(own["x"][0]), abs(own["x"][1]))
    largest_y = max(abs(own["y"][0]), abs(own["y"][1]))
    laws = {name: law_of(measure) for name, measure in sums.items()}
    reach = max(abs(end) for end in box["cov"]) / math.sqrt(box["var_x"][0] * box["var_y"][0])
    if not reach < 1e12:  # a box this loose tells nothing the pivot could narrow
        return None
    accepted: tuple[float, float] | None = (-reach, reach)
    for _ in range(3):
        a, b = reach * ratio_high / 2, reach / ratio_low / 2
        terms = [(laws["xy"], 1.0), (laws["xx"], _rounded_up(a)), (laws["yy"], _rounded_up(b)),
                 (laws["x"], _rounded_up(largest_y + 2 * a * largest_x)),
                 (laws["y"], _rounded_up(largest_x + 2 * b * largest_y)),
                 (law_of(count), _rounded_up(largest_x * largest_y + a * largest_x ** 2 + b * largest_y ** 2))]
        t = (sum_critical(tuple(terms), alpha) + sum(weight for _, weight in terms)) / n
        assert accepted is not None
        accepted = _narrowed_by(accepted, (cov + cross[0] - t, cov + cross[1] + t), (least, most))
        if accepted is None:  # nothing accepted: the test failed
            return None
        reach = max(abs(accepted[0]), abs(accepted[1]))
    return accepted


def _narrowed_by(accepted: tuple[float, float], numerator: tuple[float, float],
                 denominator: tuple[float, float]) -> tuple[float, float] | None:
    """``accepted`` cut to the range of numerator / denominator (denominator > 0 throughout): the
    largest numerator over the least denominator where it is >= 0, over the greatest else."""
    bottom, top = numerator
    high = top / denominator[0] if top >= 0 else top / denominator[1]
    low = bottom / denominator[0] if bottom <= 0 else bottom / denominator[1]
    cut = (max(accepted[0], _down(low)), min(accepted[1], _up(high)))
    return cut if cut[0] <= cut[1] else None


NoisyMoments = tuple[int, dict[str, tuple[float, float]], float, tuple[float, float], tuple[float, float],
                     tuple[float, float], dict[str, Measure], Measure]


def _noisy_moments(measures: Sequence[Measure], statistics: Sequence[str], noisy: Mapping[str, Sequence[int]],
                   i: int, box: Box) -> NoisyMoments | None:
    """Row ``i``'s noisy count n', the box's means in the sums' own units, the noisy cov' =
    S_xy'/n' - m_x' m_y' (m' = S'/n'), the ranges of var_x' + d_x^2 and var_y' + d_y^2 and of
    d_x d_y over the means' shifts d = m - m' in the box (each variance range's least end > 0,
    else None; var_y's (1, 1) where "yy" is not measured), the sums by statistic and the count."""
    sums = dict(zip(statistics, measures[:len(statistics)]))
    count = measures[len(statistics)]
    n = noisy[count.name][i]
    if n <= 0:
        return None
    native = uncentred(measures[0])
    own = {}
    for name in ("x", "y"):  # the box's means back in the sums' own units
        middle = sums[name].lower + sums[name].upper if native else 0
        own[name] = ((box[name][0] + middle) / 2, (box[name][1] + middle) / 2) if native else box[name]
    value = {name: noisy[measure.name][i] for name, measure in sums.items()}
    m_x, m_y = Fraction(value["x"], n), Fraction(value["y"], n)
    shift_x = (own["x"][0] - float(m_x), own["x"][1] - float(m_x))
    shift_y = (own["y"][0] - float(m_y), own["y"][1] - float(m_y))
    cov = float(Fraction(value["xy"], n) - m_x * m_y)
    var_x = float(Fraction(value["xx"], n) - m_x * m_x)
    square_x = square_range(*shift_x)
    spread_x = (var_x + square_x[0], var_x + square_x[1])
    spread_y = (1.0, 1.0)
    if "yy" in value:
        var_y = float(Fraction(value["yy"], n) - m_y * m_y)
        square_y = square_range(*shift_y)
        spread_y = (var_y + square_y[0], var_y + square_y[1])
    if spread_x[0] <= 0 or spread_y[0] <= 0:
        return None
    return n, own, cov, spread_x, spread_y, product_range(shift_x, shift_y), sums, count


def slope_interval(measures: Sequence[Measure], statistics: Sequence[str], noisy: Mapping[str, Sequence[int]],
                   i: int, box: Box, alpha: float) -> tuple[float, float] | None:
    """The (1 - alpha) interval of beta = cov / var_x (in the centred moments' units, which the
    sums' own share) of row ``i``, given that its true means and centred moments lie in ``box``
    (as ``correlation_interval``: unclamped, var_x > 0); None where it cannot tell.

    c_xy - beta var_x = 0 at the truth, so P = W_xy - beta W_xx = N_xy - beta N_xx = e_xy -
    beta e_xx - (m_y - 2 beta m_x) e_x - m_x e_y + (m_x m_y - beta m_x^2) e_n exactly (W, N as in
    ``correlation_interval``); its critical value at the largest weights (|beta| <= R, from the
    box's cov / var_x at first, then the accepted set's) bounds the true one, and |P| <= t accepts
    beta where n' |cov' + d_x d_y - beta (var_x' + d_x^2)| <= t for some shifts d of the means in
    the box: between (the least numerator) / (var_x' + d_x^2) and (the greatest) / (it), at its
    extreme of the numerator's sign. The means enter at second order."""
    if box["var_x"][0] <= 0:
        return None
    noisy_row = _noisy_moments(measures, statistics, noisy, i, box)
    if noisy_row is None:
        return None
    n, own, cov, spread_x, _, cross, sums, count = noisy_row
    largest_x = max(abs(own["x"][0]), abs(own["x"][1]))
    largest_y = max(abs(own["y"][0]), abs(own["y"][1]))
    laws = {name: law_of(measure) for name, measure in sums.items()}
    reach = max(abs(end) for end in box["cov"]) / box["var_x"][0]
    if not reach < 1e100:  # a box this loose tells nothing the pivot could narrow
        return None
    accepted: tuple[float, float] | None = (-reach, reach)
    for _ in range(3):
        terms = [(laws["xy"], 1.0), (laws["xx"], _rounded_up(reach)),
                 (laws["x"], _rounded_up(largest_y + 2 * reach * largest_x)), (laws["y"], _rounded_up(largest_x)),
                 (law_of(count), _rounded_up(largest_x * largest_y + reach * largest_x ** 2))]
        t = (sum_critical(tuple(terms), alpha) + sum(weight for _, weight in terms)) / n
        assert accepted is not None
        accepted = _narrowed_by(accepted, (cov + cross[0] - t, cov + cross[1] + t), spread_x)
        if accepted is None:
            return None
        reach = max(abs(accepted[0]), abs(accepted[1]))
    return accepted
