"""AVG(expr): a centred sum over a count of the same non-NULL values.

The sum is of 2v - (L + U) (range [-(U - L), U - L], half the sensitivity of a plain sum when
the bounds are one-signed), and the count counts the values it sums; the release is
grid * (S'/C' + L + U) / 2, clamped into the expression's bounds (the midpoint when C' <= 0).

Two per-unit forms (``unit_shapes``), used where they lower the noise:

* the policy's ``BOUNDS PER UNIT`` of the column: an *uncentred* sum S of the values, each unit's
  per-group total clamped into the bound, and the same count C (rows model). A centred sum cannot
  be bounded per unit: a unit's total of 2v - (L + U) grows with its number of values, whatever
  its total of v. The release is grid * S'/C', clamped into the bounds: the same estimand as the
  centred form (the mean of the values), biased only where a unit's total is clamped;
* the call's ``contribution_bounds_per_group => (lo, hi)`` (BigQuery's AVG): each unit's own
  average in the group, clamped into [lo, hi], summed, over the count of units with a value
  there (each contributes 1). A *mean of the units' means*: another estimand than the mean of
  the values whenever units have different numbers of values; explain says so.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.aggregates.exact import exact, integers, magnitude, quotients
from dpsql.analysis.aggregates.family import AggregateFamily, Call, NumberText, Ranged, Shape, filtered
from dpsql.analysis.aggregates.intervals import holding, law_of, outward, ratio_interval, ratio_range, spread_of
from dpsql.analysis.plan import Aggregate, AggregateRelease, ClampedColumn, Measure, Release
from dpsql.analysis.ranges import Interval
from dpsql.sql.allowlist import refuse
from dpsql.sql.dialect import contribution_bounds


class AvgFamily(AggregateFamily):
    """AVG(expr)."""

    functions = ("avg",)
    spellings = ("AVG",)
    nodes = (exp.Avg,)
    measure_count = 2
    counted = True

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        if argument is None:
            refuse(call, "AVG(*) is not valid", "name a column")
        return Aggregate(context.name, "avg", filtered(argument, context.condition), context.label,
                         unit_bounds=contribution_bounds(call))

    def shapes(self, aggregate: Aggregate, names: Sequence[str], interval: Interval | None,
               clamped: tuple[ClampedColumn, ...]) -> tuple[list[Shape], AggregateRelease]:
        assert interval is not None  # a ranged family
        total = Shape(names[0], "sum", aggregate.argument, interval, clamped, centred=True)
        count = Shape(names[1], "count", aggregate.argument, interval, clamped, counts_values_of=names[0])
        return [total, count], AggregateRelease(aggregate.name, "avg", (names[0], names[1]),
                                                lower=interval.lower, upper=interval.upper)

    def required_unit_model(self, aggregate: Aggregate) -> bool:
        return aggregate.unit_bounds is not None

    def unit_shapes(self, aggregate: Aggregate, names: Sequence[str],
                    arguments: Sequence[Ranged]) -> tuple[list[Shape], AggregateRelease] | None:
        """The module docstring's two per-unit forms: the call's bounds (a mean of unit means),
        else the policy's per-unit bound (an uncentred sum with its per-unit clamp, and the count)."""
        (argument,) = arguments
        interval = argument.interval
        if aggregate.unit_bounds is not None:
            lower, upper = aggregate.unit_bounds
            total = Shape(names[0], "sum", aggregate.argument, interval, argument.clamped,
                          unit_bounds=(lower, upper), unit_average=True)
            units = Shape(names[1], "count", aggregate.argument, interval, argument.clamped,
                          counts_values_of=names[0], unit_bounds=(Fraction(0), Fraction(1)))
            return [total, units], AggregateRelease(aggregate.name, "avg", (names[0], names[1]),
                                                    lower=lower, upper=upper, unit_model="average")
        if argument.unit_bounds is None:
            return None
        total = Shape(names[0], "sum", aggregate.argument, interval, argument.clamped, unit_bounds=argument.unit_bounds)
        count = Shape(names[1], "count", aggregate.argument, interval, argument.clamped, counts_values_of=names[0])
        return [total, count], AggregateRelease(aggregate.name, "avg", (names[0], names[1]),
                                                lower=interval.lower, upper=interval.upper, unit_model="total")

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        sums, counts = (integers(release.noisy[m.name]) for m in measures)
        if not measures[0].centred:
            return _ratios(sums, counts, measures[0], aggregate).tolist()
        return _averages(sums, counts, measures[0], aggregate).tolist()

    def half_widths(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                    alpha: float) -> list[float]:
        """The larger distance from the value to an end of its interval (``intervals``)."""
        return [spread_of(low, high, value) for value, (low, high)
                in zip(self.values(aggregate, measures, release), self.intervals(aggregate, measures, release, alpha))]

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """The ratio S/C of the centred sum over the count by test inversion
        (``dpsql.analysis.aggregates.intervals``: the two noises convolved, exact coverage at
        least 1 - alpha), in the aggregate's units, cut to its bounds."""
        total, count = measures[0], measures[-1]
        low, high = ratio_range(total)
        floor, ceiling = self.possible(aggregate, measures)
        grid = float(total.grid)
        # a centred sum's mean r is worth grid (r + L + U) / 2, a plain one's grid r
        scale, shift = (grid / 2, total.lower + total.upper) if total.centred else (grid, 0)
        cells = []
        for s, c in zip(release.noisy[total.name], release.noisy[count.name]):
            r_low, r_high = ratio_interval(s, c, law_of(total), law_of(count), low, high, alpha)
            cells.append(outward(scale * (r_low + shift), scale * (r_high + shift), floor, ceiling))
        return holding(cells, self.values(aggregate, measures, release))

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        return float(_bound(aggregate.lower)), float(_bound(aggregate.upper))

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        bounds = f"[{number(_bound(aggregate.lower))}, {number(_bound(aggregate.upper))}]"
        if aggregate.unit_model == "average":
            return (f"mean of the units' own means: sum of each unit's average in the group, clamped to {bounds}, "
                    f"/ count of units ({', '.join(aggregate.measures)}) — BigQuery's AVG with "
                    "contribution_bounds_per_group, another estimand than the mean of the values when units "
                    "have different numbers of values")
        if aggregate.unit_model == "total":
            return (f"sum / count ({', '.join(aggregate.measures)}), each unit's total in a group clamped to its "
                    f"bound per unit, the ratio clamped to {bounds}")
        return (f"centred sum / count ({', '.join(aggregate.measures)}), clamped to "
                f"[{number(_bound(aggregate.lower))}, {number(_bound(aggregate.upper))}]")


def _bound(value: Fraction | None) -> Fraction:
    assert value is not None  # AVG's release always carries its bounds
    return value


def _averages(centred_sums: np.ndarray, counts: np.ndarray, measure: Measure,
              aggregate: AggregateRelease) -> np.ndarray:
    """grid * (S/C + L + U) / 2 = p (S + (L + U) C) / (2 q C) for grid p/q, clamped into the
    aggregate's bounds; the midpoint of the bounds where C <= 0."""
    lower, upper = _bound(aggregate.lower), _bound(aggregate.upper)
    valid = counts > 0
    counts = np.where(valid, counts, 1)
    p, q, middle = measure.grid.numerator, measure.grid.denominator, measure.lower + measure.upper
    bound = max((magnitude(centred_sums) + abs(middle) * magnitude(counts)) * p, 2 * q * magnitude(counts))
    sums, counts = (exact(a, bound) for a in (centred_sums, counts))
    averages = quotients((sums + middle * counts) * p, counts * (2 * q))
    averages = np.minimum(np.maximum(averages, float(lower)), float(upper))
    return np.where(valid, averages, float((lower + upper) / 2))


def _ratios(sums: np.ndarray, counts: np.ndarray, measure: Measure, aggregate: AggregateRelease) -> np.ndarray:
    """grid * S/C = p S / (q C) for grid p/q, clamped into the aggregate's bounds; the midpoint of
    the bounds where C <= 0 (the per-unit forms: S is a plain, uncentred sum)."""
    lower, upper = _bound(aggregate.lower), _bound(aggregate.upper)
    valid = counts > 0
    counts = np.where(valid, counts, 1)
    p, q = measure.grid.numerator, measure.grid.denominator
    bound = max(magnitude(sums) * p, q * magnitude(counts))
    sums, counts = (exact(a, bound) for a in (sums, counts))
    averages = np.minimum(np.maximum(quotients(sums * p, counts * q), float(lower)), float(upper))
    return np.where(valid, averages, float((lower + upper) / 2))
