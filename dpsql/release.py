"""Stage 7, release: exact bounded measures in, noisy released values out.

The exact values never leave this module: it returns only noisy measures and what is
computed from them (post-processing). Noise comes from ``dpsql.mechanisms.noise`` — exact discrete
Laplace or discrete Gaussian on integers, drawn from a cryptographically secure source — one
batch per measure covering every released cell.

Which keys are released: with public domains, every key of the domain (cells without rows
count as zero); otherwise the keys whose noisy distinct-unit count passes the partition
selection threshold (``dpsql.mechanisms.selection``).

Released values: a COUNT is its noisy integer, floored at 0; a SUM is its noisy integer times
the grid; an AVG is grid * (S'/C' + L + U) / 2 from the noisy centred sum S' and noisy count
C', clamped into the expression's bounds (the midpoint when C' <= 0); a VARIANCE is
grid^2/4 * (Q'/C' - (S'/C')^2) from the noisy sum of squared centred values Q', clamped into
[0, (hi - lo)^2 / 4] (times C'/(C' - 1) for the sample form); STDDEV is its square root; a
quantile (MEDIAN, QUANTILE_CONT, MIN, MAX) is the bucket edge the exponential mechanism chose.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from operator import itemgetter
from typing import Any, Sequence

import numpy as np

from dpsql.analysis.plan import AggregateRelease, Measure, Plan
from dpsql.mechanisms import noise
from dpsql.mechanisms.quantile import ENDPOINT_ALPHA, edge, release_interval
from dpsql.mechanisms.selection import SelectionRule, select_partitions


@dataclass(frozen=True)
class Release:
    """What a private query releases: keys and noisy measures, nothing exact."""

    keys: tuple[tuple, ...]
    """One key tuple per released row (``()`` when ungrouped)."""
    noisy: dict[str, tuple[int, ...]]
    """Measure name -> noisy integer per row, in grid units."""
    chosen: dict[str, tuple[Fraction, ...]] = field(default_factory=dict)
    """Quantile histogram measure -> the edge the exponential mechanism chose, per row."""
    edges: dict[str, tuple[tuple[int, int, int], ...]] = field(default_factory=dict)
    """Quantile histogram measure -> per row, the edge indices (value, low, high) of the value
    and of its 95% interval's endpoints (``dpsql.mechanisms.quantile.release_interval``)."""


def release_measures(plan: Plan, domain: Sequence[tuple] | None, exact_rows: Sequence[tuple],
                     source: Any = None, histograms: dict[str, Sequence[tuple]] | None = None) -> Release:
    """Add noise to every measure of every released key, and choose every quantile.

    ``domain`` lists the keys to release (public domains); ``None`` means the keys are private
    and pass partition selection on the exact rows' distinct-unit counts. ``histograms`` holds,
    per quantile measure, the bounded (keys..., bucket, count) rows of its histogram SQL.
    """
    width = len(plan.query.keys)
    exact = _ExactRows(exact_rows, width)
    if plan.selection is None:
        keys = list(map(tuple, domain))
    else:
        candidates = _sorted_keys(list(exact.row_of), width)
        units = exact.values(len(plan.summed), exact.positions(candidates)).tolist()
        selection = plan.selection
        rule = SelectionRule(scale=selection.scale, threshold=selection.threshold, epsilon=selection.epsilon,
                             delta=selection.delta, groups_per_unit=0, neighbours=plan.neighbours)
        mask = select_partitions(units, rule, source)
        keys = [k for k, keep in zip(candidates, mask) if keep]
    noisy: dict[str, tuple[int, ...]] = {}
    positions = exact.positions(keys)
    for index, measure in enumerate(plan.summed):
        noisy[measure.name] = _add_noise(exact.values(index, positions), measure, source)
    for measure in plan.separate:
        if measure.kind == "distinct":  # its own bounded SQL: (keys..., count) rows
            counts = _ExactRows((histograms or {}).get(measure.name, []), width)
            noisy[measure.name] = _add_noise(counts.values(0, counts.positions(keys)), measure, source)
    chosen, edges = {}, {}
    for aggregate in plan.aggregates:
        if aggregate.function == "quantile":
            rows = (histograms or {}).get(aggregate.measures[0], [])
            drawn = _choose_quantiles(aggregate, keys, rows, width, source)
            edges[aggregate.measures[0]] = drawn
            chosen[aggregate.measures[0]] = tuple(edge(aggregate.rule, j) for j, _, _ in drawn)
    return Release(keys=tuple(keys), noisy=noisy, chosen=chosen, edges=edges)


def split_last(release: Release) -> tuple[Release, Release]:
    """The release without its last cell, and that cell alone (the outside cell of
    ``dpsql.analysis.domains``, drawn in the same batch as every other cell).

    >>> first, last = split_last(Release(keys=(("a",), (None,)), noisy={"m0": (3, 7)}))
    >>> first.keys, first.noisy, last.keys, last.noisy
    ((('a',),), {'m0': (3,)}, ((None,),), {'m0': (7,)})
    """
    def part(cells: slice) -> Release:
        return Release(keys=release.keys[cells], noisy={k: tuple(v[cells]) for k, v in release.noisy.items()},
                       chosen={k: tuple(v[cells]) for k, v in release.chosen.items()},
                       edges={k: tuple(v[cells]) for k, v in release.edges.items()})

    return part(slice(None, -1)), part(slice(-1, None))


class _ExactRows:
    """Exact (keys..., values...) rows, read a whole column at a time."""

    def __init__(self, rows: Sequence[tuple], width: int):
        self._rows, self._width = rows, width

    def _column(self, index: int) -> list:
        return list(map(itemgetter(index), self._rows))

    @cached_property
    def row_of(self) -> dict[tuple, int]:
        """Key tuple -> index of its row; of a repeated key, the last row counts."""
        count = len(self._rows)
        keys = zip(*map(self._column, range(self._width))) if self._width else itertools.repeat((), count)
        return dict(zip(keys, range(count)))

    def positions(self, keys: Sequence[tuple]) -> np.ndarray:
        """Per key, the index of its row (as ``row_of``), or -1 when it has none."""
        if self._width == 1:
            positions = _integer_positions(self._column(0), list(map(itemgetter(0), keys)))
            if positions is not None:
                return positions
        return np.fromiter(map(self.row_of.get, keys, itertools.repeat(-1)), dtype=np.int64, count=len(keys))

    def values(self, index: int, positions: np.ndarray) -> np.ndarray:
        """Value column ``index`` at ``positions``: NULL as 0, and 0 at position -1 (no row)."""
        column = self._column(self._width + index) + [0]  # the appended 0 is what position -1 reads
        try:
            values = _integers(column)
        except TypeError:  # a NULL sum
            values = _integers([value or 0 for value in column])
        return values[positions]


def _integer_positions(row_keys: list, keys: list) -> np.ndarray | None:
    """``_ExactRows.positions`` by sorting, when every key is a plain int that fits int64 and no
    row key repeats (so dict equality is integer equality); None otherwise. Hashing a million
    keys into a dict and looking them up costs seconds; this, a fraction of one."""
    if not set(map(type, row_keys)) | set(map(type, keys)) <= {int}:
        return None
    try:
        rows, wanted = np.array(row_keys, dtype=np.int64), np.array(keys, dtype=np.int64)
    except OverflowError:
        return None
    if rows.size == 0:
        return np.full(wanted.size, -1, dtype=np.int64)
    order = np.argsort(rows)
    ordered = rows[order]
    if np.any(ordered[1:] == ordered[:-1]):  # a repeated key: let the dict decide which row counts
        return None
    at = np.minimum(np.searchsorted(ordered, wanted), rows.size - 1)
    return np.where(ordered[at] == wanted, order[at], -1)


def _add_noise(exact: np.ndarray, measure: Measure, source: Any) -> tuple[int, ...]:
    """Exact integers plus one batch of the measure's noise, as Python ints."""
    draws = _draw(measure, exact.size, source)
    if _magnitude(exact) + _magnitude(draws) >= 2**63:  # the int64 sum could overflow: add Python ints
        exact, draws = exact.astype(object), draws.astype(object)
    return tuple((exact + draws).tolist())


def _choose_quantiles(aggregate: AggregateRelease, keys: list[tuple], rows: Sequence[tuple], width: int,
                      source: Any) -> tuple[tuple[int, int, int], ...]:
    """The exponential mechanism's edge indices (value, low, high) for each released key, from
    its bounded bucket counts."""
    buckets = aggregate.rule.buckets
    counts = {key: [0] * buckets for key in keys}
    for row in rows:
        key, bucket, count = tuple(row[:width]), int(row[width]), int(row[width + 1] or 0)
        if key in counts:
            counts[key][bucket] += count
    return tuple(release_interval(counts[key], aggregate.rule, source) for key in keys)


def _sorted_keys(keys: list[tuple], width: int) -> list[tuple]:
    """Keys in ``_sort_key`` order, which fixes which noise draw each candidate gets.

    When every key column holds values of one type, ``_sort_key`` compares exactly as the values
    do, so plain tuple order is the same order, found without a Python call per key.
    """
    if all(len(set(map(type, map(itemgetter(i), keys)))) <= 1 for i in range(width)):
        return sorted(keys)
    return sorted(keys, key=_sort_key)


def _sort_key(key: tuple):
    return tuple((value is None, str(type(value)), value if value is not None else 0) for value in key)


def _draw(measure: Measure, size: int, source: Any) -> np.ndarray:
    if measure.noise == "none":
        return np.zeros(size, dtype=np.int64)
    if measure.noise == "gaussian":
        return noise.discrete_gaussian(measure.scale, size, source)
    return noise.discrete_laplace(measure.scale, size, source)


def core_rows(plan: Plan, release: Release) -> list[tuple]:
    """The noisy core: per released key, the keys then one value per aggregate."""
    keys = [list(map(itemgetter(i), release.keys)) for i in range(len(plan.query.keys))]
    columns = keys + [_aggregate_values(plan, release, aggregate) for aggregate in plan.aggregates]
    return list(zip(*columns)) if columns else [()] * len(release.keys)


def core_columns(plan: Plan) -> list[str]:
    """Column names of the noisy core: g0.. then a0.."""
    return [k.name for k in plan.query.keys] + [a.name for a in plan.aggregates]


# ---------------------------------------------------------------- released values, a column at a time
#
# Each value is the float of an exact rational (or an exact integer), as Fraction arithmetic
# gives it: float(Fraction(n, d)) is n / d correctly rounded. A column is computed on int64
# when every numerator and denominator stays below 2**53 — both are then exact doubles and one
# IEEE division rounds correctly — and otherwise on Python ints in object arrays, whose
# int / int division also rounds correctly. Clamping after the rounding gives the same value as
# clamping before it, since correct rounding is monotone.

_EXACT_DOUBLE = 2**53
"""Integers below this in magnitude are exact doubles (and far from int64 overflow)."""


def _aggregate_values(plan: Plan, release: Release, aggregate: AggregateRelease) -> list:
    measures = [plan.measure(name) for name in aggregate.measures]
    first = measures[0]
    if aggregate.function == "quantile":
        return [float(value) for value in release.chosen[first.name]]
    series = [_integers(release.noisy[m.name]) for m in measures]
    function = aggregate.function
    if function in ("count", "count_units", "count_distinct"):
        return np.maximum(series[0], 0).tolist()
    if function == "sum":
        return _on_grid(series[0], first.grid).tolist()
    if function == "avg":
        return _averages(*series, first, aggregate).tolist()
    return _variances(*series, first, aggregate).tolist()


def _on_grid(units: np.ndarray, grid: Fraction) -> np.ndarray:
    """units * grid: integers on an integer grid, else floats."""
    p, q = grid.numerator, grid.denominator
    if q == 1:
        return _exact(units, _magnitude(units) * p, limit=2**63) * p
    return _quotients(_exact(units, max(_magnitude(units) * p, q)) * p, q)


def _averages(centred_sums: np.ndarray, counts: np.ndarray, measure: Measure,
              aggregate: AggregateRelease) -> np.ndarray:
    """grid * (S/C + L + U) / 2 = p (S + (L + U) C) / (2 q C) for grid p/q, clamped into the
    aggregate's bounds; the midpoint of the bounds where C <= 0."""
    valid = counts > 0
    counts = np.where(valid, counts, 1)
    p, q, middle = measure.grid.numerator, measure.grid.denominator, measure.lower + measure.upper
    bound = max((_magnitude(centred_sums) + abs(middle) * _magnitude(counts)) * p, 2 * q * _magnitude(counts))
    sums, counts = (_exact(a, bound) for a in (centred_sums, counts))
    averages = _quotients((sums + middle * counts) * p, counts * (2 * q))
    averages = np.minimum(np.maximum(averages, float(aggregate.lower)), float(aggregate.upper))
    return np.where(valid, averages, float((aggregate.lower + aggregate.upper) / 2))


def _variances(centred_sums: np.ndarray, squares: np.ndarray, counts: np.ndarray, measure: Measure,
               aggregate: AggregateRelease) -> np.ndarray:
    """grid^2 (Q/C - (S/C)^2) / 4 = p^2 (Q C - S^2) / (4 q^2 C^2) for grid p/q (times C/(C - 1),
    so C (C - 1) below, for the sample form), clamped into [0, (hi - lo)^2 / 4]; 0 where C <= 0
    (C <= 1 for the sample form). STDDEV is the square root."""
    valid = counts > (1 if aggregate.sample else 0)
    counts = np.where(valid, counts, 2)
    p, q = measure.grid.numerator, measure.grid.denominator
    count_bound = _magnitude(counts)
    bound = max(p * p * (_magnitude(squares) * count_bound + _magnitude(centred_sums) ** 2),
                4 * q * q * count_bound * count_bound)
    sums, squares, counts = (_exact(a, bound) for a in (centred_sums, squares, counts))
    pairs = counts * (counts - 1) if aggregate.sample else counts * counts
    variances = _quotients((squares * counts - sums * sums) * (p * p), pairs * (4 * q * q))
    largest = (aggregate.upper - aggregate.lower) ** 2 / 4
    variances = np.where(valid, np.minimum(np.maximum(variances, 0.0), float(largest)), 0.0)
    return np.sqrt(variances) if aggregate.function == "stddev" else variances


def _integers(values: Sequence[int]) -> np.ndarray:
    """Integers as int64, or as Python ints in an object array when one does not fit int64."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array([int(value) for value in values], dtype=object)


def _magnitude(values: np.ndarray) -> int:
    """The largest absolute value, as a Python int (no int64 overflow), and at least 1: a bound
    built from magnitudes then also bounds the constants multiplied in (so NumPy never has to
    fit a too-large Python int into int64, even for an empty column)."""
    return max(-int(values.min()), int(values.max()), 1) if values.size else 1


def _exact(values: np.ndarray, bound: int, limit: int = _EXACT_DOUBLE) -> np.ndarray:
    """``values`` in a dtype that computes exactly when every intermediate is at most ``bound``
    in magnitude: int64 when ``bound`` is below ``limit``, else Python ints."""
    return values if bound < limit and values.dtype != object else values.astype(object)


def _quotients(numerators: np.ndarray, denominators: np.ndarray | int) -> np.ndarray:
    """n / d per cell (d > 0), correctly rounded, as float(Fraction(n, d)) is. Operands come from
    ``_exact``: Python ints (int / int rounds correctly), or int64 below 2**53 (exact doubles,
    so one IEEE division rounds correctly)."""
    quotients = numerators / denominators
    return quotients.astype(float) if quotients.dtype == object else quotients


def half_widths(plan: Plan, release: Release, alpha: float) -> dict[str, list[float]]:
    """Per aggregate (core column), per released row, the half-width of its (1 - alpha) interval.

    COUNT and SUM: the noise's own interval. AVG, from released values only: with probability
    1 - alpha, |noise of S'| <= h_S and |noise of C'| <= h_C (each at alpha/2), and the error of
    S'/C' is (e_S - r e_C) / C' with |r| <= U - L, so at most (h_S + (U - L) h_C) / C'.
    VARIANCE: the same argument for Q'/C' (|ratio| <= R^2) and for the squared mean
    (|m^2 - m'^2| <= 2R |m - m'|), each at alpha/3; STDDEV: sqrt of the variance's.
    Quantiles: max(value - low, high - value) of the value interval drawn at release
    (``dpsql.mechanisms.quantile.release_interval``), a 95% interval, so reported for alpha >= 0.05 (a
    conservative figure above 0.05) and NaN below. The released value of a floored COUNT or a
    clamped AVG or VARIANCE is no farther from the truth than the unclamped one (the truth lies
    in the clamping range), so the same widths hold. Clamping and contribution bounding add
    bias that these intervals do not include.
    """
    widths: dict[str, list[float]] = {}
    for aggregate in plan.aggregates:
        if aggregate.function == "quantile":
            widths[aggregate.name] = [max(v - low, high - v) for v, (low, high)
                                      in zip(_aggregate_values(plan, release, aggregate),
                                             _quantile_intervals(release, aggregate, alpha))]
        else:
            widths[aggregate.name] = _symmetric_widths(plan, release, aggregate, alpha)
    return widths


def intervals(plan: Plan, release: Release, alpha: float) -> dict[str, list[tuple[float, float]]]:
    """Per aggregate, per released row, its (1 - alpha) interval (low, high) in the aggregate's
    units: value ± half-width (``half_widths``), or a quantile's drawn endpoints (NaN, NaN
    below alpha 0.05). Floats are rounded outward, so the interval holds the exact one."""
    result: dict[str, list[tuple[float, float]]] = {}
    for aggregate in plan.aggregates:
        if aggregate.function == "quantile":
            result[aggregate.name] = _quantile_intervals(release, aggregate, alpha)
            continue
        values = _aggregate_values(plan, release, aggregate)
        result[aggregate.name] = [(math.nextafter(v - h, -math.inf), math.nextafter(v + h, math.inf))
                                  for v, h in zip(values, _symmetric_widths(plan, release, aggregate, alpha))]
    return result


def _quantile_intervals(release: Release, aggregate: AggregateRelease, alpha: float) -> list[tuple[float, float]]:
    drawn = release.edges.get(aggregate.measures[0])
    if drawn is None:  # kept before quantiles stored their intervals: none is known
        return [(math.nan, math.nan)] * len(release.keys)
    if alpha < ENDPOINT_ALPHA:  # the endpoints were drawn for 95%: nothing narrower-risk is known
        return [(math.nan, math.nan)] * len(drawn)
    return [(float(edge(aggregate.rule, low)), float(edge(aggregate.rule, high))) for _, low, high in drawn]


def _symmetric_widths(plan: Plan, release: Release, aggregate: AggregateRelease, alpha: float) -> list[float]:
    measures = [plan.measure(name) for name in aggregate.measures]
    first = measures[0]
    if aggregate.function in ("count", "count_units", "count_distinct", "sum"):
        return [float(_noise_half_width(first, alpha) * first.grid)] * len(release.keys)
    counts = release.noisy[measures[-1].name]
    spread = first.upper - first.lower
    full = aggregate.upper - aggregate.lower
    if aggregate.function == "avg":
        h_sum, h_count = (_noise_half_width(m, alpha / 2) for m in measures)
        return [float(full) if c <= 0 else float(min(full, first.grid * Fraction(h_sum + spread * h_count, c) / 2))
                for c in counts]
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
    return cells


# ---------------------------------------------------------------- what a stored answer keeps

_EDGE_PARTS = ("value", "low", "high")


def stored_measures(release: Release) -> dict[str, tuple[int, ...]]:
    """Everything accuracy needs, as integers per released row: the noisy measures, and each
    quantile's edge indices as ``<measure>.value``, ``.low`` and ``.high``."""
    stored = dict(release.noisy)
    for name, drawn in release.edges.items():
        for index, part in enumerate(_EDGE_PARTS):
            stored[f"{name}.{part}"] = tuple(triple[index] for triple in drawn)
    return stored


def stored_names(plan: Plan) -> set[str]:
    """The names ``stored_measures`` gives for a release of ``plan``."""
    return {m.name for m in plan.noised} | {f"{m.name}.{part}" for m in plan.histograms for part in _EDGE_PARTS}


def from_stored(plan: Plan, stored: dict[str, Sequence[int]], count: int) -> Release:
    """The ``Release`` (keys left out) that ``stored_measures`` kept, for ``count`` rows."""
    noisy = {m.name: tuple(stored[m.name]) for m in plan.noised if m.name in stored}
    edges, chosen = {}, {}
    for aggregate in plan.aggregates:
        name = aggregate.measures[0]
        if aggregate.function == "quantile" and f"{name}.value" in stored:
            edges[name] = tuple(zip(*(tuple(stored[f"{name}.{part}"]) for part in _EDGE_PARTS)))
            chosen[name] = tuple(edge(aggregate.rule, j) for j, _, _ in edges[name])
    return Release(keys=((),) * count, noisy=noisy, chosen=chosen, edges=edges)


def _noise_half_width(measure: Measure, alpha: float) -> int:
    if measure.noise == "none":
        return 0
    if measure.noise == "gaussian":
        return noise.discrete_gaussian_halfwidth(measure.scale, alpha)
    return noise.discrete_laplace_halfwidth(measure.scale, alpha)
