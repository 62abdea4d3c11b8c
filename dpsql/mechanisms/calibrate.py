"""Noise calibration: from (epsilon, delta) and a sensitivity to a noise scale. No randomness.

Discrete Laplace (pure epsilon-DP). Adding Z with P(z) ∝ exp(-|z|/t) to an integer vector of
L1 sensitivity D1 is (D1/t)-DP, so t = D1/epsilon, exactly (a Fraction).

Discrete Gaussian ((epsilon, delta)-DP). Adding independent N_Z(0, s^2) to each coordinate
of an integer vector of L2 sensitivity D2 is rho-zCDP with rho = D2^2 / (2 s^2) (Canonne,
Kamath, Steinke 2020, Thm 4 and Thm 14 — the continuous Gaussian's bound holds for the
discrete one). rho-zCDP implies (epsilon, delta)-DP for every alpha > 1 with

    delta = exp((alpha - 1)(alpha*rho - epsilon)) * (alpha - 1)^(alpha - 1) / alpha^alpha

(CKS20, Prop 12 / Cor 13). Any alpha gives a valid delta, so an imperfect minimisation only
costs accuracy. We search the smallest s^2 whose delta is below the target and round s^2 up.

>>> laplace_scale(Fraction(10), Fraction(1, 2))
Fraction(20, 1)
>>> s2 = gaussian_sigma_squared(Fraction(1), Fraction(1), Fraction(1, 10**6))
>>> 10 < float(s2) < 25 and zcdp_delta(rho_of(Fraction(1), s2), 1.0) <= 1e-6
True
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpsql.errors import InternalError

SAFETY = 1 + 1e-9  # floats compute delta; demand this much slack below the target


def laplace_scale(l1: Fraction, epsilon: Fraction) -> Fraction:
    """Scale t of discrete Laplace noise giving epsilon-DP for L1 sensitivity ``l1``."""
    if epsilon <= 0 or l1 <= 0:
        raise InternalError(f"cannot calibrate Laplace noise for l1={l1}, epsilon={epsilon}")
    return Fraction(l1) / Fraction(epsilon)


def rho_of(l2_squared: Fraction, sigma_squared: Fraction) -> Fraction:
    """The zCDP cost rho = D2^2 / (2 sigma^2) of one discrete Gaussian release."""
    return Fraction(l2_squared) / (2 * Fraction(sigma_squared))


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest delta (up to the search) such that rho-zCDP gives (epsilon, delta)-DP.

    >>> zcdp_delta(0.0, 1.0)
    0.0
    >>> 0 < zcdp_delta(0.05, 1.0) < 1e-3
    True
    """
    if rho < 0 or epsilon < 0:
        raise InternalError(f"rho and epsilon must be non-negative, got {rho}, {epsilon}")
    if rho == 0:
        return 0.0
    return min(1.0, math.exp(zcdp_log_delta(rho, epsilon)))


def zcdp_log_delta(rho: float, epsilon: float) -> float:
    """ln of ``zcdp_delta`` (before capping at 1), which stays finite where delta underflows.

    >>> zcdp_log_delta(0.05, 1.0) < math.log(1e-3)
    True
    """
    def log_delta(alpha: float) -> float:
        return (alpha - 1) * (alpha * rho - epsilon) + (alpha - 1) * math.log(alpha - 1) - alpha * math.log(alpha)

    # log_delta is convex in alpha: golden-section search on [1 + tiny, a generous upper end].
    low, high = 1.0 + 1e-9, max(2.0, (epsilon + 1) / (2 * rho) + 2)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a = high - ratio * (high - low)
        b = low + ratio * (high - low)
        if log_delta(a) < log_delta(b):
            high = b
        else:
            low = a
    return min(log_delta(low), log_delta(high), log_delta((low + high) / 2))


def gaussian_sigma_squared(l2_squared: Fraction, epsilon: Fraction, delta: Fraction) -> Fraction:
    """Smallest sigma^2 (rounded up) whose discrete Gaussian gives (epsilon, delta)-DP."""
    if epsilon <= 0 or not 0 < delta < 1 or l2_squared <= 0:
        raise InternalError(f"cannot calibrate Gaussian noise for l2^2={l2_squared}, "
                            f"epsilon={epsilon}, delta={delta}")
    # Compared in logarithms: float(delta) is 0 below ~5e-324 (a delta of 1e-400 is exact as a
    # Fraction), and ln(delta) from numerator and denominator is not. SAFETY's slack covers
    # the float logarithms' rounding, in the safe direction.
    eps, log_target = float(epsilon), math.log(delta.numerator) - math.log(delta.denominator)

    def fits(sigma_squared: float) -> bool:
        return zcdp_log_delta(float(l2_squared) / (2 * sigma_squared), eps) + math.log(SAFETY) <= log_target

    high = float(l2_squared)
    while not fits(high):
        high *= 2
    low = high / 2
    while fits(low) and low > 1e-300:
        low /= 2
    for _ in range(100):
        middle = (low + high) / 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return round_up(high)


def round_up(value: float, bits: int = 24) -> Fraction:
    """A short Fraction no smaller than ``value`` (relative excess below 2**-bits).

    >>> round_up(0.1) >= Fraction(0.1)
    True
    """
    if value <= 0 or not math.isfinite(value):
        raise InternalError(f"cannot round {value}")
    exponent = math.floor(math.log2(value)) - bits
    unit = Fraction(2) ** exponent
    return math.ceil(Fraction(value) / unit) * unit
