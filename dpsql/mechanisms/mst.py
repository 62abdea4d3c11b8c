"""MST (McKenna, Miklau, Sheldon 2021, "Winning the NIST Contest: A scalable and general approach to
differentially private synthetic data", JPC 11(3), Algorithm 1), written from the paper. Pure: the
exact marginals come from ``exact(clique)`` (the curator's process, after the charge).

Given ρ (what is left after the row count, ``dpsql.mechanisms.synthesis``) and d columns:

1. every one-way marginal is measured at ρ/(3d) (Gaussian, Δ₂ of ``marginals``);
2. a maximum spanning tree of the columns is chosen privately, Kruskal's way: d' - 1 rounds (d' - 1
   = d minus the components of the graph of the allowed pairs, a public number), each choosing,
   among the pairs that join two components of the forest so far, one by the exponential mechanism
   at ε with ε²/8 = ρ/(3(d' - 1)), on the score q_ab = ||M_ab(x) - M_ab(p̂)||₁, p̂ the independent
   model of the noisy one-way marginals (public); q moves by at most Δ₁ (``marginals``);
3. each chosen pair is measured at ρ/(3(d' - 1)) plus what rounding ε down saved (so the parts add
   up to ρ exactly); a round with one pair left to join has nothing to choose (the allowed pairs
   are public) and measures with both thirds.

The graphical model fitted to all of them (``dpsql.mechanisms.graphical``) is a tree. MST's
compression of rare one-way cells is not done (the cells are the policy's).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.marginals import (
    Measurement,
    choose,
    l1_distance,
    measure,
    on_score_grid,
    selection_epsilon,
    selection_rho,
)

Exact = Callable[[tuple[str, ...]], np.ndarray]


def independent_marginal(ones: dict[str, np.ndarray], clique: tuple[str, ...], total: float) -> np.ndarray:
    """The marginal over ``clique`` of the model where columns are independent, each with its noisy
    one-way marginal cut at 0 and normalised (post-processing of released values)."""
    result = np.ones(1)
    for column in clique:
        part = np.clip(ones[column], 0.0, None)
        share = part / part.sum() if part.sum() > 0 else np.full(part.size, 1.0 / part.size)
        result = np.outer(result, share).ravel()
    return result * total


def spanning_rounds(columns: Sequence[str], pairs: Sequence[tuple[str, str]]) -> int:
    """How many pairs a spanning forest of the allowed ``pairs`` has (public: sizes only)."""
    parent = {c: c for c in columns}

    def root(c: str) -> str:
        while parent[c] != c:
            c = parent[c]
        return c
    joined = 0
    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
            joined += 1
    return joined


def run_mst(columns: Sequence[str], pairs: Sequence[tuple[str, str]], rho: Fraction, l2_squared: int,
            score_sensitivity: int, exact: Exact, total: float, source) -> list[Measurement]:
    """The measurements of MST (module docstring), in order: one-way marginals, then the tree's pairs
    each with the selection cost that chose it."""
    d = len(columns)
    rounds = spanning_rounds(columns, pairs)
    one_way = rho / (3 * d) if rounds else rho / d
    measured = [measure((c,), exact((c,)), l2_squared, one_way, source) for c in columns]
    if not rounds:
        return measured
    ones = {m.clique[0]: m.values for m in measured}
    per_round = (rho - d * one_way) / rounds          # a third for choosing, a third for measuring
    epsilon = selection_epsilon(per_round / 2)
    component = {c: i for i, c in enumerate(columns)}
    for _ in range(rounds):
        open_pairs = [p for p in pairs if component[p[0]] != component[p[1]]]
        if len(open_pairs) == 1:  # nothing to choose (a public fact): no choice, no cost
            chosen, spent = open_pairs[0], Fraction(0)
        else:
            scores = [l1_distance(exact(p), on_score_grid(independent_marginal(ones, p, total))) for p in open_pairs]
            chosen = open_pairs[choose(scores, Fraction(score_sensitivity), epsilon, source)]
            spent = selection_rho(epsilon)
        measured.append(measure(chosen, exact(chosen), l2_squared, per_round - spent, source, spent))
        old, new = component[chosen[0]], component[chosen[1]]
        component = {c: (new if i == old else i) for c, i in component.items()}
    return measured


def allowed_pairs(columns: Sequence[str], sizes: dict[str, int], max_cells: int) -> list[tuple[str, str]]:
    """Every pair of columns whose marginal has at most ``max_cells`` cells, in the domain's order."""
    return [(a, b) for a, b in itertools.combinations(columns, 2) if sizes[a] * sizes[b] <= max_cells]
