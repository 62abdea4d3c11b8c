"""AIM (McKenna, Mullins, Sheldon, Miklau 2022, "AIM: An Adaptive and Iterative Mechanism for
Differentially Private Synthetic Data", PVLDB 15(11), Algorithm 2), written from the paper. Pure:
the exact marginals come from ``exact(clique)``; the model from ``dpsql.mechanisms.graphical``.

The workload W is every 3-way marginal of the columns (every marginal, with fewer than 3 columns);
the candidates are W's downward closure, less any marginal above the size cap (``candidates``), each
weighted w_r = Σ_{s ∈ W, r ⊆ s} |r ∩ s|. Given ρ (after the row count), T = 16d and α = 0.9:

1. per round, the measurement's ρ_m = αρ/T and the choice's ε with ε²/8 <= (1 - α)ρ/T; every
   one-way marginal is measured at ρ_m first;
2. each round: if what remains is below twice a round's cost, this round takes all of it (α of it
   to measure, ε from the rest, the measurement getting whatever rounding ε down left) and is the
   last; the candidates are those whose junction tree, added to the model's cliques, stays within
   ``max_cells``·(ρ used)/ρ cells; one is chosen by the exponential mechanism on
   q_r = w_r·(||M_r(x) - M_r(p̂)||₁ - √(2/π)·σ·n_r), n_r its cells, σ this round's noise: q_r moves
   by at most Δ_q = max_r w_r · Δ₁ (the penalty is public); it is measured, and p̂ re-estimated;
3. when the new estimate of the chosen marginal moved by less than √(2/π)·σ·n_r in L1 (the
   expected noise), σ is halved and ε doubled (ρ_m and the choice's ρ times 4) for the next rounds.

Every round's cost is fixed before it runs from public values (what was spent, earlier releases),
so the rounds add up to at most ρ, and the last one to exactly ρ: the sum of every measurement's
and choice's ρ is ρ (``tests/test_synthesize.py`` checks it). The error estimate of a measured
marginal r (AIM §5's shape, from released values only): ||M_r(p̂) - y_r||₁ + √(2/π)·σ_r·n_r, y_r its
last measurement; a heuristic, not a bound.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.mechanisms import graphical
from dpsql.mechanisms.marginals import (
    Measurement,
    choose,
    l1_distance,
    measure,
    on_score_grid,
    selection_epsilon,
    selection_rho,
)

ROUNDS_PER_COLUMN = 16
"""T = 16d: the rounds the initial budget per round is sized for."""
MEASURE_SHARE = Fraction(9, 10)
"""α: the share of a round's ρ spent measuring (the rest choosing)."""
WORKLOAD_DEGREE = 3
"""W: every marginal of this many columns."""
ROUND_ITERATIONS = 500
"""Mirror-descent steps of a round's estimate, warm-started from the last (the final model gets
``graphical.ITERATIONS``), as the paper's implementation does: steps cost time at scale."""
EXPECTED_ABS = math.sqrt(2 / math.pi)
"""E|Z| for a standard normal: the expected L1 noise per cell is this times σ."""

Exact = Callable[[tuple[str, ...]], np.ndarray]


@dataclass(frozen=True)
class AimRun:
    """What AIM released, and its model (post-processing of the releases)."""

    measurements: tuple[Measurement, ...]
    model: Any
    error_estimates: dict[tuple[str, ...], float]


def candidates(columns: Sequence[str], sizes: dict[str, int], max_cells: int) -> dict[tuple[str, ...], int]:
    """AIM's candidate marginals (module docstring) -> weight w_r, in the domain's order."""
    degree = min(WORKLOAD_DEGREE, len(columns))
    workload = list(itertools.combinations(columns, degree))
    weights: dict[tuple[str, ...], int] = {}
    for size in range(1, degree + 1):
        for clique in itertools.combinations(columns, size):
            if math.prod(sizes[c] for c in clique) > max_cells:
                continue
            weights[clique] = sum(len(set(clique) & set(s)) for s in workload if set(clique) <= set(s))
    return weights


def run_aim(columns: Sequence[str], sizes: dict[str, int], weights: dict[tuple[str, ...], int], rho: Fraction,
            l2_squared: int, l1: int, exact: Exact, total: float, max_cells: int, source) -> AimRun:
    """AIM's rounds (module docstring), spending exactly ``rho``."""
    space = graphical.domain(columns, [sizes[c] for c in columns])
    rounds = ROUNDS_PER_COLUMN * len(columns)
    measure_rho = MEASURE_SHARE * rho / rounds
    choice_rho = (1 - MEASURE_SHARE) * rho / rounds
    measured = [measure((c,), exact((c,)), l2_squared, measure_rho, source) for c in columns]
    used = len(columns) * measure_rho
    model = graphical.estimate(space, measured, total, iterations=ROUND_ITERATIONS)
    last = used >= rho
    while not last:
        left = rho - used
        if left < 2 * (measure_rho + choice_rho):
            measure_rho, choice_rho, last = MEASURE_SHARE * left, (1 - MEASURE_SHARE) * left, True
        epsilon = selection_epsilon(choice_rho)
        spent = selection_rho(epsilon)
        this_measure = (measure_rho + choice_rho - spent) if not last else left - spent
        used += spent + this_measure
        sigma = math.sqrt(float(l2_squared) / (2 * float(this_measure)))
        cliques = [m.clique for m in measured]
        limit = max_cells * float(used / rho)
        allowed = [r for r in weights if _fits(space, cliques, r, limit)]
        if not allowed:  # nothing fits (cannot happen: one-way marginals are in the model): stop cleanly
            allowed = [(columns[0],)]
        projected = graphical.Projector(model)
        estimates = {r: projected(r) for r in allowed}
        scores = [weights.get(r, 1) * (l1_distance(exact(r), on_score_grid(estimates[r]))
                                       - Fraction(EXPECTED_ABS * sigma * _cells(sizes, r)))
                  for r in allowed]
        sensitivity = Fraction(max(weights.get(r, 1) for r in allowed) * l1)
        chosen = allowed[choose(scores, sensitivity, epsilon, source)]
        measured.append(measure(chosen, exact(chosen), l2_squared, this_measure, source, spent))
        model = graphical.estimate(space, measured, total, warm=model, iterations=ROUND_ITERATIONS)
        moved = float(np.abs(graphical.project(model, chosen) - estimates[chosen]).sum())
        if moved <= EXPECTED_ABS * sigma * _cells(sizes, chosen):
            measure_rho, choice_rho = 4 * measure_rho, 4 * choice_rho
    model = graphical.estimate(space, measured, total, warm=model)
    return AimRun(tuple(measured), model, _error_estimates(model, measured, sizes))


def _cells(sizes: dict[str, int], clique: tuple[str, ...]) -> int:
    return math.prod(sizes[c] for c in clique)


def _fits(space: Any, cliques: list[tuple[str, ...]], clique: tuple[str, ...], limit: float) -> bool:
    if any(set(clique) <= set(c) for c in cliques):
        return True   # already inside the model: adds nothing
    return graphical.model_cells(space, [*cliques, clique]) <= limit


def _error_estimates(model: Any, measured: list[Measurement], sizes: dict[str, int]) -> dict[tuple[str, ...], float]:
    last: dict[tuple[str, ...], Measurement] = {}
    for m in measured:
        last[m.clique] = m
    projected = graphical.Projector(model)
    return {clique: float(np.abs(projected(clique) - m.values).sum())
            + EXPECTED_ABS * m.sigma * _cells(sizes, clique) for clique, m in last.items()}
