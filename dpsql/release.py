"""Stage 7, release: exact bounded measures in, noisy released values out.

The exact values never leave this function: it returns only noisy measures and what is
computed from them (post-processing). Noise comes from ``dpsql.noise`` — exact discrete
Laplace or discrete Gaussian on integers, drawn from a cryptographically secure source —
one batch per measure, covering every released cell, so the time a draw takes does not
depend on which cells had rows.

Released values: a COUNT is its noisy integer, floored at 0; a SUM is its noisy integer times
the grid; an AVG is grid * (S'/C' + L + U) / 2 from the noisy centred sum S' and noisy count
C', clamped into the expression's bounds (the midpoint when C' <= 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

from . import noise
from .plan import Measure, OutputColumn, Plan


@dataclass(frozen=True)
class Release:
    """What a private query releases: keys and noisy measures, nothing exact."""

    keys: tuple[tuple, ...]
    """One key tuple per released row (the whole public domain; ``()`` when ungrouped)."""
    noisy: dict[str, tuple[int, ...]]
    """Measure name -> noisy integer per row, in grid units."""


def release_measures(plan: Plan, keys: Sequence[tuple], exact_rows: Sequence[tuple], source: Any = None) -> Release:
    """Add noise to every measure of every released key; keys without rows count as zero."""
    width = len(plan.query.keys)
    exact_by_key = {tuple(row[:width]): row[width:] for row in exact_rows}
    noisy: dict[str, tuple[int, ...]] = {}
    for index, measure in enumerate(plan.measures):
        exact = [int(exact_by_key.get(tuple(key), ())[index] or 0) if tuple(key) in exact_by_key else 0
                 for key in keys]
        noisy[measure.name] = tuple(e + int(z) for e, z in zip(exact, _draw(measure, len(exact), source)))
    return Release(keys=tuple(tuple(k) for k in keys), noisy=noisy)


def _draw(measure: Measure, size: int, source: Any):
    if measure.noise == "none":
        return [0] * size
    if measure.noise == "gaussian":
        return noise.discrete_gaussian(measure.scale, size, source)
    return noise.discrete_laplace(measure.scale, size, source)


def released_rows(plan: Plan, release: Release) -> list[tuple]:
    """The released table: one tuple per key, columns in select-list order."""
    rows = []
    for row_index, key in enumerate(release.keys):
        rows.append(tuple(_value(column, plan, release, key, row_index) for column in plan.outputs))
    return rows


def _value(column: OutputColumn, plan: Plan, release: Release, key: tuple, row: int):
    if column.kind == "key":
        return key[column.key_index]
    values = [release.noisy[name][row] for name in column.measures]
    first = plan.measure(column.measures[0])
    if column.kind == "count":
        return max(values[0], 0)
    if column.kind == "sum":
        return _on_grid(values[0], first.grid)
    centred_sum, count = values
    if count <= 0:
        middle = (column.lower + column.upper) / 2
        return float(middle)
    average = first.grid * (Fraction(centred_sum, count) + first.lower + first.upper) / 2
    return float(min(max(average, column.lower), column.upper))


def _on_grid(units: int, grid: Fraction):
    value = units * grid
    return int(value) if grid.denominator == 1 else float(value)


def half_widths(plan: Plan, release: Release, alpha: float) -> dict[str, list[float]]:
    """Per released cell, the half-width of the (1 - alpha) interval of its noise.

    For AVG the interval is derived from released values only: with probability 1 - alpha,
    |noise of S'| <= h_S and |noise of C'| <= h_C (each at alpha/2), and the error of S'/C' is
    (e_S - r e_C) / C' with |r| <= U - L, so it is at most (h_S + (U - L) h_C) / C'. Clamping
    and contribution bounding add bias that this interval does not include.
    """
    widths: dict[str, list[float]] = {}
    rows = len(release.keys)
    for column in plan.outputs:
        if column.kind == "key":
            continue
        first = plan.measure(column.measures[0])
        if column.kind in ("count", "sum"):
            widths[column.name] = [float(_noise_half_width(first, alpha) * first.grid)] * rows
            continue
        count_measure = plan.measure(column.measures[1])
        h_sum = _noise_half_width(first, alpha / 2)
        h_count = _noise_half_width(count_measure, alpha / 2)
        spread = first.upper - first.lower
        full = float(column.upper - column.lower)
        cells = []
        for count in release.noisy[count_measure.name]:
            if count <= 0:
                cells.append(full)
                continue
            centred = Fraction(h_sum + spread * h_count, count)
            cells.append(min(full, float(first.grid * centred / 2)))
        widths[column.name] = cells
    return widths


def _noise_half_width(measure: Measure, alpha: float) -> int:
    if measure.noise == "none":
        return 0
    if measure.noise == "gaussian":
        return noise.discrete_gaussian_halfwidth(measure.scale, alpha)
    return noise.discrete_laplace_halfwidth(measure.scale, alpha)
