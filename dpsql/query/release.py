"""Stage 7, release: exact bounded measures in, noisy released values out.

The exact values never leave this module: it returns only noisy measures and what is
computed from them (post-processing). Noise comes from ``dpsql.mechanisms.noise`` — exact discrete
Laplace or discrete Gaussian on integers, drawn from a cryptographically secure source — one
batch per measure covering every released cell.

Which keys are released: with public domains, every key of the domain (cells without rows
count as zero); otherwise the keys whose noisy distinct-unit count passes the partition
selection threshold (``dpsql.mechanisms.selection``).

Released values are computed from the noisy measures by each aggregate's family
(``dpsql.analysis.aggregates``): a COUNT is its noisy integer floored at 0, a SUM its noisy
integer times the grid, an AVG or VARIANCE a clamped ratio of noisy sums, a quantile the bucket
edge the exponential mechanism chose.
"""

from __future__ import annotations

import itertools
from functools import cached_property
from operator import itemgetter
from typing import Any, Sequence

import numpy as np

from dpsql.analysis.aggregates.exact import integers, magnitude
from dpsql.analysis.aggregates.registry import family_of
from dpsql.analysis.plan import AggregateRelease, Measure, Plan, Release
from dpsql.errors import InternalError
from dpsql.mechanisms import noise
from dpsql.mechanisms.selection import SelectionRule, select_partitions

__all__ = ["Release", "core_columns", "core_rows", "from_stored", "half_widths", "intervals", "release_measures",
           "split_last", "stored_measures", "stored_names"]


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
        if domain is None:
            raise InternalError("a plan without partition selection releases a public domain")
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
        family = family_of(aggregate)
        if family.draws:  # a quantile: chosen from its histogram, not noised
            rows = (histograms or {}).get(aggregate.measures[0], [])
            drawn = family.draw(aggregate, keys, rows, width, source)
            edges[aggregate.measures[0]] = drawn
            chosen[aggregate.measures[0]] = family.chosen(aggregate, drawn)
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
            values = integers(column)
        except TypeError:  # a NULL sum
            values = integers([value or 0 for value in column])
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
    if magnitude(exact) + magnitude(draws) >= 2**63:  # the int64 sum could overflow: add Python ints
        exact, draws = exact.astype(object), draws.astype(object)
    return tuple((exact + draws).tolist())


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


def _aggregate_values(plan: Plan, release: Release, aggregate: AggregateRelease) -> list:
    """The released values of one aggregate, as its family computes them from noisy measures."""
    return family_of(aggregate).values(aggregate, _measures(plan, aggregate), release)


def _measures(plan: Plan, aggregate: AggregateRelease) -> list[Measure]:
    return [plan.measure(name) for name in aggregate.measures]


def half_widths(plan: Plan, release: Release, alpha: float) -> dict[str, list[float]]:
    """Per aggregate (core column), per released row, the half-width of its (1 - alpha) interval,
    from released values only (each family's ``half_widths``: the noise's own interval for
    COUNT and SUM, a union bound over its measures for AVG and VARIANCE, the drawn interval for
    a quantile). The released value of a floored COUNT or a clamped AVG or VARIANCE is no
    farther from the truth than the unclamped one (the truth lies in the clamping range), so the
    same widths hold. Clamping and contribution bounding add bias that these intervals do not
    include.
    """
    return {aggregate.name: family_of(aggregate).half_widths(aggregate, _measures(plan, aggregate), release, alpha)
            for aggregate in plan.aggregates}


def intervals(plan: Plan, release: Release, alpha: float) -> dict[str, list[tuple[float, float]]]:
    """Per aggregate, per released row, its (1 - alpha) interval (low, high) in the aggregate's
    units: value ± half-width (``half_widths``), or a quantile's drawn endpoints (NaN, NaN
    below alpha 0.05). Floats are rounded outward, so the interval holds the exact one."""
    return {aggregate.name: family_of(aggregate).intervals(aggregate, _measures(plan, aggregate), release, alpha)
            for aggregate in plan.aggregates}


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
        name, family = aggregate.measures[0], family_of(aggregate)
        if family.draws and f"{name}.value" in stored:
            edges[name] = tuple(zip(*(tuple(stored[f"{name}.{part}"]) for part in _EDGE_PARTS)))
            chosen[name] = family.chosen(aggregate, edges[name])
    return Release(keys=((),) * count, noisy=noisy, chosen=chosen, edges=edges)
