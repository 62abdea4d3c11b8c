"""Stage 7, release: exact bounded measures in, noisy released values out.

The exact values never leave this module: it returns only noisy measures and what is
computed from them (post-processing). Noise comes from ``dpsql.noise`` — exact discrete
Laplace or discrete Gaussian on integers, drawn from a cryptographically secure source — one
batch per measure covering every released cell.

Which keys are released: with public domains, every key of the domain (cells without rows
count as zero); otherwise the keys whose noisy distinct-unit count passes the partition
selection threshold (``dpsql.selection``).

Released values: a COUNT is its noisy integer, floored at 0; a SUM is its noisy integer times
the grid; an AVG is grid * (S'/C' + L + U) / 2 from the noisy centred sum S' and noisy count
C', clamped into the expression's bounds (the midpoint when C' <= 0); a VARIANCE is
grid^2/4 * (Q'/C' - (S'/C')^2) from the noisy sum of squared centred values Q', clamped into
[0, (hi - lo)^2 / 4] (times C'/(C' - 1) for the sample form); STDDEV is its square root; a
quantile (MEDIAN, QUANTILE_CONT, MIN, MAX) is the bucket edge the exponential mechanism chose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Sequence

from . import noise
from .plan import AggregateRelease, Measure, Plan
from .quantile import quantile_accuracy, release_quantile
from .selection import SelectionRule, select_partitions


@dataclass(frozen=True)
class Release:
    """What a private query releases: keys and noisy measures, nothing exact."""

    keys: tuple[tuple, ...]
    """One key tuple per released row (``()`` when ungrouped)."""
    noisy: dict[str, tuple[int, ...]]
    """Measure name -> noisy integer per row, in grid units."""
    chosen: dict[str, tuple[Fraction, ...]] = field(default_factory=dict)
    """Quantile histogram measure -> the edge the exponential mechanism chose, per row."""


def release_measures(plan: Plan, domain: Sequence[tuple] | None, exact_rows: Sequence[tuple],
                     source: Any = None, histograms: dict[str, Sequence[tuple]] | None = None) -> Release:
    """Add noise to every measure of every released key, and choose every quantile.

    ``domain`` lists the keys to release (public domains); ``None`` means the keys are private
    and pass partition selection on the exact rows' distinct-unit counts. ``histograms`` holds,
    per quantile measure, the bounded (keys..., bucket, count) rows of its histogram SQL.
    """
    width = len(plan.query.keys)
    exact_by_key = {tuple(row[:width]): row[width:] for row in exact_rows}
    if plan.selection is None:
        keys = [tuple(k) for k in domain]
    else:
        candidates = sorted(exact_by_key, key=_sort_key)
        units = [int(exact_by_key[k][len(plan.summed)] or 0) for k in candidates]
        selection = plan.selection
        rule = SelectionRule(scale=selection.scale, threshold=selection.threshold, epsilon=selection.epsilon,
                             delta=selection.delta, groups_per_unit=0, neighbours=plan.neighbours)
        mask = select_partitions(units, rule, source)
        keys = [k for k, keep in zip(candidates, mask) if keep]
    noisy: dict[str, tuple[int, ...]] = {}
    for index, measure in enumerate(plan.summed):
        exact = [int(exact_by_key[k][index] or 0) if k in exact_by_key else 0 for k in keys]
        noisy[measure.name] = tuple(e + int(z) for e, z in zip(exact, _draw(measure, len(exact), source)))
    for measure in plan.separate:
        if measure.kind == "distinct":  # its own bounded SQL: (keys..., count) rows
            counts = {tuple(r[:width]): int(r[width] or 0) for r in (histograms or {}).get(measure.name, [])}
            exact = [counts.get(k, 0) for k in keys]
            noisy[measure.name] = tuple(e + int(z) for e, z in zip(exact, _draw(measure, len(exact), source)))
    chosen = {}
    for aggregate in plan.aggregates:
        if aggregate.function == "quantile":
            rows = (histograms or {}).get(aggregate.measures[0], [])
            chosen[aggregate.measures[0]] = _choose_quantiles(aggregate, keys, rows, width, source)
    return Release(keys=tuple(keys), noisy=noisy, chosen=chosen)


def _choose_quantiles(aggregate: AggregateRelease, keys: list[tuple], rows: Sequence[tuple], width: int,
                      source: Any) -> tuple[Fraction, ...]:
    """The exponential mechanism's edge for each released key, from its bounded bucket counts."""
    buckets = aggregate.rule.buckets
    counts = {key: [0] * buckets for key in keys}
    for row in rows:
        key, bucket, count = tuple(row[:width]), int(row[width]), int(row[width + 1] or 0)
        if key in counts:
            counts[key][bucket] += count
    return tuple(release_quantile(counts[key], aggregate.rule, source) for key in keys)


def _sort_key(key: tuple):
    return tuple((value is None, str(type(value)), value if value is not None else 0) for value in key)


def _draw(measure: Measure, size: int, source: Any):
    if measure.noise == "none":
        return [0] * size
    if measure.noise == "gaussian":
        return noise.discrete_gaussian(measure.scale, size, source)
    return noise.discrete_laplace(measure.scale, size, source)


def core_rows(plan: Plan, release: Release) -> list[tuple]:
    """The noisy core: per released key, the keys then one value per aggregate."""
    columns = [_aggregate_values(plan, release, aggregate) for aggregate in plan.aggregates]
    return [tuple(key) + tuple(column[i] for column in columns) for i, key in enumerate(release.keys)]


def core_columns(plan: Plan) -> list[str]:
    """Column names of the noisy core: g0.. then a0.."""
    return [k.name for k in plan.query.keys] + [a.name for a in plan.aggregates]


def _aggregate_values(plan: Plan, release: Release, aggregate: AggregateRelease) -> list:
    measures = [plan.measure(name) for name in aggregate.measures]
    first = measures[0]
    if aggregate.function == "quantile":
        return [float(value) for value in release.chosen[first.name]]
    series = [release.noisy[m.name] for m in measures]
    function = aggregate.function
    if function in ("count", "count_units", "count_distinct"):
        return [max(n, 0) for n in series[0]]
    if function == "sum":
        return [_on_grid(n, first.grid) for n in series[0]]
    if function == "avg":
        return [_average(s, c, first, aggregate) for s, c in zip(*series)]
    return [_variance(s, q, c, first, aggregate) for s, q, c in zip(*series)]


def _on_grid(units: int, grid: Fraction):
    value = units * grid
    return int(value) if grid.denominator == 1 else float(value)


def _average(centred_sum: int, count: int, measure: Measure, aggregate: AggregateRelease) -> float:
    if count <= 0:
        return float((aggregate.lower + aggregate.upper) / 2)
    average = measure.grid * (Fraction(centred_sum, count) + measure.lower + measure.upper) / 2
    return float(min(max(average, aggregate.lower), aggregate.upper))


def _variance(centred_sum: int, squares: int, count: int, measure: Measure, aggregate: AggregateRelease) -> float:
    largest = (aggregate.upper - aggregate.lower) ** 2 / 4
    if count <= 0 or (aggregate.sample and count <= 1):
        value = Fraction(0)
    else:
        mean = Fraction(centred_sum, count)
        value = measure.grid**2 * (Fraction(squares, count) - mean * mean) / 4
        if aggregate.sample:
            value = value * count / (count - 1)
    value = min(max(value, Fraction(0)), largest)
    return math.sqrt(value) if aggregate.function == "stddev" else float(value)


def half_widths(plan: Plan, release: Release, alpha: float) -> dict[str, list[float]]:
    """Per aggregate (core column), per released row, the half-width of its (1 - alpha) interval.

    COUNT and SUM: the noise's own interval. AVG, from released values only: with probability
    1 - alpha, |noise of S'| <= h_S and |noise of C'| <= h_C (each at alpha/2), and the error of
    S'/C' is (e_S - r e_C) / C' with |r| <= U - L, so at most (h_S + (U - L) h_C) / C'.
    VARIANCE: the same argument for Q'/C' (|ratio| <= R^2) and for the squared mean
    (|m^2 - m'^2| <= 2R |m - m'|), each at alpha/3; STDDEV: sqrt of the variance's.
    Clamping and contribution bounding add bias that these intervals do not include.
    """
    widths: dict[str, list[float]] = {}
    for aggregate in plan.aggregates:
        measures = [plan.measure(name) for name in aggregate.measures]
        first = measures[0]
        if aggregate.function == "quantile":  # a bound on the rank, in values (dpsql.quantile)
            widths[aggregate.name] = [quantile_accuracy(aggregate.rule, math.inf, alpha)] * len(release.keys)
            continue
        if aggregate.function in ("count", "count_units", "count_distinct", "sum"):
            widths[aggregate.name] = [float(_noise_half_width(first, alpha) * first.grid)] * len(release.keys)
            continue
        counts = release.noisy[measures[-1].name]
        spread = first.upper - first.lower
        full = aggregate.upper - aggregate.lower
        if aggregate.function == "avg":
            h_sum, h_count = (_noise_half_width(m, alpha / 2) for m in measures)
            widths[aggregate.name] = [
                float(full) if c <= 0 else float(min(full, first.grid * Fraction(h_sum + spread * h_count, c) / 2))
                for c in counts
            ]
            continue
        h_sum, h_squares, h_count = (_noise_half_width(m, alpha / 3) for m in measures)
        cells = []
        for c in counts:
            if c <= 1:
                cells.append(float(full**2 / 4) if aggregate.function == "variance" else float(full / 2))
                continue
            mean_error = Fraction(h_sum + spread * h_count, c)
            centred = Fraction(h_squares + spread * spread * h_count, c) + 2 * spread * mean_error
            variance = min(full**2 / 4, first.grid**2 * centred / 4)
            cells.append(math.sqrt(variance) if aggregate.function == "stddev" else float(variance))
        widths[aggregate.name] = cells
    return widths


def _noise_half_width(measure: Measure, alpha: float) -> int:
    if measure.noise == "none":
        return 0
    if measure.noise == "gaussian":
        return noise.discrete_gaussian_halfwidth(measure.scale, alpha)
    return noise.discrete_laplace_halfwidth(measure.scale, alpha)
