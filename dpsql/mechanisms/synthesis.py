"""A synthetic table from noisy marginals of the bounded copy: the row count, then AIM or MST, then
rows drawn from the model. Pure (``dpsql.calls.synthesize`` plans, charges and fetches the exact
marginals; ``exact(clique)`` gives them here).

Budget (zCDP, one charge of ρ): ``TOTAL_SHARE`` of ρ measures the row count (the 0-way marginal,
Δ₂ = k), the rest goes to the method (``dpsql.mechanisms.aim``, ``dpsql.mechanisms.mst``), which
spends exactly what it is given. Everything released is the measurements and the choices; the
model, the error estimates and the rows are post-processing of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.mechanisms import graphical
from dpsql.mechanisms.aim import run_aim
from dpsql.mechanisms.marginals import (
    Measurement,
    count_l2_squared,
    marginal_l1,
    marginal_l2_squared,
    measure,
)
from dpsql.mechanisms.mst import run_mst

TOTAL_SHARE = Fraction(1, 20)
"""The share of ρ spent on the noisy row count."""
MAX_ROWS = 10 ** 7
"""The most synthetic rows drawn: a noisy count above it is cut to it (post-processing)."""


@dataclass(frozen=True)
class Synthesis:
    """What the synthesizer released and made from it."""

    measurements: tuple[Measurement, ...]
    """The row count first (no columns), then every marginal, in order."""
    rows: int
    """The synthetic table's row count (the noisy count cut into [1, MAX_ROWS], or the analyst's)."""
    cells: dict[str, np.ndarray]
    """Column -> each synthetic row's cell index."""
    error_estimates: dict[tuple[str, ...], float]


def synthesize(method: str, columns: Sequence[str], sizes: dict[str, int], rho: Fraction, reach: int,
               neighbours: str, exact: Callable[[tuple[str, ...]], np.ndarray], max_cells: int,
               allowed: Sequence[tuple[str, ...]], weights: dict[tuple[str, ...], int], rows: int | None,
               source) -> Synthesis:
    """Spend exactly ``rho`` (module docstring) and draw the rows. ``allowed``: MST's pairs;
    ``weights``: AIM's candidates."""
    count_rho = rho * TOTAL_SHARE
    count = measure((), exact(()), count_l2_squared(reach), count_rho, source)
    total = max(float(count.values[0]), 1.0)
    l2_squared = marginal_l2_squared(reach, neighbours)
    space = graphical.domain(columns, [sizes[c] for c in columns])
    estimates: dict[tuple[str, ...], float] = {}
    model: Any
    if method == "mst":
        pairs = [(p[0], p[1]) for p in allowed]
        measured = run_mst(columns, pairs, rho - count_rho, l2_squared, marginal_l1(reach, neighbours), exact,
                           total, source)
        model = graphical.estimate(space, measured, total)
    else:
        run = run_aim(columns, sizes, weights, rho - count_rho, l2_squared, marginal_l1(reach, neighbours), exact,
                      total, max_cells, source)
        measured, model, estimates = list(run.measurements), run.model, run.error_estimates
    size = rows if rows is not None else min(MAX_ROWS, max(1, int(round(float(count.values[0])))))
    cells = graphical.sample_rows(model, size, source)
    return Synthesis((count, *measured), size, cells, estimates)
