"""Privacy amplification by Poisson subsampling of units: what a mechanism run on a sample costs.

Let ``A`` be (epsilon, delta)-DP and ``S_p`` keep each unit of a table independently with
probability ``p`` (all of the unit's rows or none). Then ``A ∘ S_p`` is (epsilon', p·delta)-DP with

    epsilon' = ln(1 + p·(e^epsilon - 1))

(Li, Qardaji, Su 2012, "On sampling, anonymization, and differential privacy", Thm 1; Balle,
Barthe, Gaboardi 2018, "Privacy amplification by subsampling: tight analyses via couplings and
divergences", NeurIPS, Thm 8 with Table 1 for Poisson sampling and the add/remove relation).

Proof sketch (add/remove). Let D' = D + x. Condition on the sample ``S`` of D's units, which has
the same law whether or not x is in the table, because every unit's coin is independent. Then
``A(S_p(D)) = E_S[A(S)]`` and ``A(S_p(D')) = (1 - p)·E_S[A(S)] + p·E_S[A(S + x)]``: a mixture in
which only the p-part differs, and "advanced joint convexity" (BBG18 Thm 2) turns the base
(epsilon, delta) of ``A(S)`` vs ``A(S + x)`` into (epsilon', p·delta).

Replacement (the policy's ``NEIGHBOURS BOUNDED``). Let D = D0 + x and D' = D0 + x'. The coins of
x and x' are independent of the sample of D0 whether or not they are equal (a replacement that
keeps the unit's id keeps its coin, one with a new id gets a fresh coin; only the marginal law
on each side matters). So ``A(S_p(D)) = (1 - p)·μ0 + p·μ1`` and ``A(S_p(D')) = (1 - p)·μ0 + p·μ1'``
with ``μ0 = E[A(S)]``, ``μ1 = E[A(S + x)]``, ``μ1' = E[A(S + x')]``. The two samples differ by a
replacement (both coins in), or by a removal or an addition (one in, one out), never both. BBG18
Thm 2 gives, with ``β = e^epsilon'/e^epsilon``:

    D_{e^epsilon'}(μ || μ') = p · D_{e^epsilon}(μ1 || (1 - β)·μ0 + β·μ1')
                           <= p · ((1 - β)·D_{e^epsilon}(μ1 || μ0) + β·D_{e^epsilon}(μ1 || μ1'))

(joint convexity of the hockey-stick divergence), so ``A ∘ S_p`` is (epsilon', p·delta)-DP under
replacement *provided ``A`` is (epsilon, delta)-DP both under replacement (μ1 vs μ1') and under
removal (μ1 vs μ0)*. The second condition is the pitfall: a mechanism calibrated to replace-one
neighbours alone need not bound a removal (a row-level COUNT(*) does not move under
replacement). dpsql's replace-one sensitivities dominate its add/remove ones for every measure
(``dpsql.analysis.sensitivity``, ``dpsql.mechanisms.selection``, ``dpsql.mechanisms.quantile``),
and ``dpsql.analysis.sampling.check_covers_removal`` re-derives the add/remove plan and refuses
a query where that would not hold. The pure case is checked by enumeration in
``tests/test_subsample.py`` (exact output distributions of a discrete-Laplace COUNT over every
sample of neighbouring three-unit tables, under both relations).

zCDP. The hockey-stick bound has no zCDP form. A pure epsilon'-DP release is
(epsilon'^2/2)-zCDP (Bun & Steinke 2016, Prop 3.3), so a pure plan costs the smaller of that and
its own rho. A Gaussian plan keeps its own rho: Rényi divergence is jointly quasi-convex, so
``D_alpha(A(S_p(D)) || A(S_p(D')))`` is at most the largest ``D_alpha`` between the mixtures'
parts, which is the base mechanism's; and no smaller rho holds for every alpha, since the
Rényi DP of a subsampled Gaussian divided by alpha tends to the unsampled 1/(2·sigma^2) as alpha
grows (Mironov, Talwar, Zhang 2019; ``tests/test_subsample.py`` computes it). Amplification
under ACCOUNTING ZCDP is therefore real only for pure (Laplace) queries.

Arithmetic: epsilon' is computed with 60-digit decimals and rounded *up* to a Fraction of 16
significant digits; p·delta is exact.
"""

from __future__ import annotations

import decimal
from fractions import Fraction

from dpsql.budget.accounting import Spend

_DIGITS = 60
_SIGNIFICANT = 16


def amplified_epsilon(epsilon: Fraction, rate: Fraction) -> Fraction:
    """ln(1 + rate·(e^epsilon - 1)), rounded up to a Fraction of 16 significant digits.

    >>> round(float(amplified_epsilon(Fraction(1), Fraction(1, 10))), 9)  # ln(1 + 0.1·(e - 1))
    0.158565079
    >>> amplified_epsilon(Fraction(1, 2), Fraction(1))
    Fraction(1, 2)
    """
    epsilon, rate = Fraction(epsilon), Fraction(rate)
    if not 0 < rate <= 1:
        raise ValueError(f"a sampling rate is in (0, 1], got {rate}")
    if rate == 1 or epsilon == 0:
        return epsilon
    with decimal.localcontext() as context:
        context.prec = _DIGITS
        e = decimal.Decimal(epsilon.numerator) / decimal.Decimal(epsilon.denominator)
        p = decimal.Decimal(rate.numerator) / decimal.Decimal(rate.denominator)
        value = (1 + p * (e.exp() - 1)).ln()
    return _round_up(Fraction(value) * (1 + Fraction(1, 10**40)))  # 60 digits: a margin far above their error


def amplified_cost(cost: Spend, rate: Fraction) -> Spend:
    """What running a mechanism of base ``cost`` on a Poisson sample of units at ``rate`` costs
    (module docstring): (epsilon', rate·delta), and rho where one holds.

    >>> amplified_cost(Spend(Fraction(1), Fraction(0), Fraction(1, 2)), Fraction(1, 100)).epsilon < Fraction(2, 100)
    True
    >>> print(amplified_cost(Spend(Fraction(1), Fraction(1, 10**6), Fraction(1, 8)), Fraction(1, 10)))
    epsilon 0.158565, delta 1e-7, rho 0.125
    """
    epsilon = amplified_epsilon(cost.epsilon, rate)
    rho = cost.rho
    if rho is not None and cost.delta == 0:
        rho = min(rho, epsilon ** 2 / 2)
    return Spend(epsilon, Fraction(rate) * cost.delta, rho)


def _round_up(value: Fraction) -> Fraction:
    """The smallest Fraction of ``_SIGNIFICANT`` significant decimal digits at least ``value`` (> 0)."""
    digits = len(str(value.numerator // value.denominator)) if value >= 1 else \
        -len(str(value.denominator // value.numerator)) + 1
    unit = Fraction(10) ** (digits - _SIGNIFICANT)
    steps = -((-value) // unit)  # ceiling
    return steps * unit
