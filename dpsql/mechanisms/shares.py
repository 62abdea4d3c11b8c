"""Shares from two noisy counts, with a confidence interval that holds exactly.

A bias estimate is a share of rows: ``part / (kept + part)`` (rows dropped among all rows) or
``part / kept`` (kept rows whose value was clamped), where ``part`` and ``kept`` are released
with independent discrete Laplace noise of known scales. The share is post-processing; its
interval is too, and it is built so that it covers the true share with probability at least
``1 - alpha`` without any approximation (``share_interval``).

Why it holds. Write the released counts X = P + Z_p and Y = K + Z_k. For the true share s of
``part / (kept + part)``, P(1 - s) - sK = 0, so T(s) = X(1 - s) - sY = (1 - s)Z_p - sZ_k: its
distribution is known for every s, whatever P and K are (Fieller's construction). The set of s
in [0, 1] with |T(s)| <= q(s), q(s) the 1 - alpha quantile bound of |(1 - s)Z_p - sZ_k|,
therefore holds the true s with probability at least 1 - alpha. For ``part / kept``, T(s) =
X - sY = Z_p - sZ_k likewise.

The quantile bound. A discrete Laplace variable Z of scale b (P(z) ∝ exp(-|z|/b)) is
floor(E1) - floor(E2) for two exponentials of mean b, while L = E1 - E2 is a continuous Laplace
of scale b, so |Z - L| < 1 on one probability space. Hence |aZ_1 + cZ_2| exceeds q + |a| + |c|
only where |aL_1 + cL_2| exceeds q, and the tail of a sum of two independent Laplace variables
of scales b1 = |a|·s1 and b2 = |c|·s2 is exact: P(|S| > q) = (b1² e^(-q/b1) - b2² e^(-q/b2)) /
(b1² - b2²), e^(-q/b)(1 + q/(2b)) when b1 = b2 = b.

Against the interval this replaces (each count's own 97.5% interval, and the share's extreme
over both): the same coverage, about 40% narrower, since the two noises rarely reach their
extremes together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Share", "estimate_share", "percent", "share_interval", "sum_quantile"]

GRID = 4000
"""Candidate shares tried per interval: steps of 1/GRID; the interval is widened by one step."""


@dataclass(frozen=True)
class Share:
    """A released share with its 95% half-width; the share is shown to a tenth of a percent
    when its ± is below one percent, and as ``[low, high]`` where value ± half-width would reach
    past 0% or 100% (a share is neither below nor above: the interval is cut there).

    >>> str(Share(0.171, 0.021)), str(Share(0.0441, 0.0034)), str(Share(0.12, 0.2)), str(Share(1.0, 0.74))
    ('≈ 17% ± 2%', '≈ 4.4% ± 0.3%', '≈ 12% [0%, 32%]', '≈ 100% [26%, 100%]')
    """

    value: float
    """The share, from 0 to 1."""
    halfwidth: float
    """Half-width of its 95% interval (its largest distance from ``value``)."""

    def __str__(self) -> str:
        fine = 100 * self.halfwidth < 0.95 and 100 * self.value >= 0.95
        value = f"{100 * self.value:.1f}%" if fine else percent(self.value)
        low, high = self.value - self.halfwidth, self.value + self.halfwidth
        if low < 0 or high > 1:
            return f"≈ {value} [{percent(max(low, 0.0))}, {percent(min(high, 1.0))}]"
        return f"≈ {value} ± {percent(self.halfwidth)}"


def percent(value: float) -> str:
    """A share as a percentage, never in exponent form.

    >>> [percent(v) for v in (0, 0.00001, 0.003, 0.0097, 0.097, 0.12, 1)]
    ['0%', '< 0.01%', '0.3%', '1%', '10%', '12%', '100%']
    """
    shown = 100 * value
    if shown == 0 or shown >= 0.95:
        return f"{shown:.0f}%"
    return "< 0.01%" if shown < 0.01 else f"{shown:.1g}%"


def _tail(b1: np.ndarray, b2: np.ndarray, q: np.ndarray) -> np.ndarray:
    """P(|L1 + L2| > q) for independent continuous Laplace variables of scales b1 >= b2 >= 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        equal = (b1 - b2) <= 1e-9 * b1
        first = np.exp(-q / b1)
        second = np.where(b2 > 0, np.exp(-q / np.where(b2 > 0, b2, 1.0)), 0.0)
        unequal = (b1 * b1 * first - b2 * b2 * second) / (b1 * b1 - b2 * b2)
        same = first * (1 + q / (2 * b1))
        return np.where(b1 <= 0, (q < 0).astype(float), np.where(equal, same, unequal))


def sum_quantile(a: np.ndarray, scale_a: float, c: np.ndarray, scale_c: float, alpha: float) -> np.ndarray:
    """A q with P(|aZ_a + cZ_c| > q) <= alpha, Z_a and Z_c independent discrete Laplace of
    scales ``scale_a`` and ``scale_c`` (``a`` and ``c`` arrays of weights, one q each).

    >>> float(sum_quantile(np.array([1.0]), 10.0, np.array([0.0]), 10.0, 0.05)[0]) > 10 * math.log(20)
    True
    """
    b = np.abs(a) * scale_a, np.abs(c) * scale_c
    b1, b2 = np.maximum(*b), np.minimum(*b)
    low, high = np.zeros_like(b1), (b1 + b2) * (math.log(2 / alpha) + 2) + 1
    for _ in range(40):  # bisection: |high - low| shrinks 2^40-fold (high is kept: q errs high)
        middle = (low + high) / 2
        over = _tail(b1, b2, middle) > alpha
        low, high = np.where(over, middle, low), np.where(over, high, middle)
    return high + np.abs(a) + np.abs(c)  # the discrete variables lie within 1 of continuous ones


def share_interval(part: int, part_scale: float, kept: int, kept_scale: float, *, added: bool,
                   alpha: float = 0.05) -> tuple[float, float]:
    """The shares s in [0, 1] consistent with the noisy counts at level 1 - ``alpha``: every s
    with |T(s)| <= q(s) (module docstring), as the smallest interval holding them all, widened
    by one grid step so no consistent s between grid points is left out. ``added``: the share
    is part / (kept + part) (the part is not among the kept), else part / kept.

    >>> low, high = share_interval(17_000, 500.0, 83_000, 500.0, added=True)
    >>> 0.15 < low < 0.17 < high < 0.19
    True
    """
    s = np.linspace(0.0, 1.0, GRID + 1)
    statistic = part - s * (part + kept) if added else part - s * kept
    # With weights within [0, 1], P(|aL1 + cL2| > q) <= P(|L1| > q·s1/(s1 + s2)) + P(|L2| > q·s2/(s1
    # + s2)) = 2e^(-q/(s1 + s2)): q(s) is at most this reach, so only shares within it need q(s).
    reach = (part_scale + kept_scale) * math.log(2 / alpha) + 2
    s = s[np.abs(statistic) <= reach]
    statistic = part - s * (part + kept) if added else part - s * kept
    a = 1 - s if added else np.ones_like(s)
    consistent = np.abs(statistic) <= sum_quantile(a, part_scale, -s, kept_scale, alpha)
    whole = part + kept if added else kept
    candidates = [float(v) for v in s[consistent]]
    if whole > 0 and 0 <= part <= whole:  # T(part / whole) = 0: always consistent
        candidates.append(part / whole)
    if not candidates:  # no share is consistent (probability below alpha): say nothing
        return 0.0, 1.0
    step = 1 / GRID
    return max(min(candidates) - step, 0.0), min(max(candidates) + step, 1.0)


def estimate_share(part: int, part_scale: float, kept: int, kept_scale: float, *, added: bool,
                   alpha: float = 0.05) -> Share:
    """The share the noisy counts give (each read as at least 0), with the largest distance
    from it to an end of ``share_interval``.

    >>> share = estimate_share(17_000, 500.0, 83_000, 500.0, added=True)
    >>> round(share.value, 2), 0 < share.halfwidth < 0.02
    (0.17, True)
    """
    p, k = max(part, 0), max(kept, 0)
    whole = p + k if added else k
    value = 0.0 if whole <= 0 else min(p / whole, 1.0)
    low, high = share_interval(part, part_scale, kept, kept_scale, added=added, alpha=alpha)
    return Share(value, float(max(value - low, high - value, 0.0)))
