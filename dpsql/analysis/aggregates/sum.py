"""SUM(expr): a noisy sum of the expression's values on a power-of-two grid.

The expression's range (``dpsql.analysis.ranges``) on grid ``g`` gives per-row integer values
in [floor(lo/g), ceil(hi/g)]; the release is (noisy integer) * g, so released values always lie
on the grid, whatever the data.

Under the per-unit contribution model (``unit_shapes``: a bound per unit from the policy's
``BOUNDS PER UNIT`` or the call's ``contribution_bounds_per_group``) the same measure also clamps
each unit's total in each group into that bound, widened to hold 0; analyse keeps it only where
it lowers the noise.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.aggregates.exact import integers, on_grid
from dpsql.analysis.aggregates.family import AggregateFamily, Call, Ranged, Shape, filtered
from dpsql.analysis.plan import Aggregate, AggregateRelease, ClampedColumn, Measure, Release
from dpsql.analysis.ranges import Interval
from dpsql.sql.allowlist import refuse
from dpsql.sql.dialect import contribution_bounds


class SumFamily(AggregateFamily):
    """SUM(expr)."""

    functions = ("sum",)
    spellings = ("SUM",)
    nodes = (exp.Sum,)

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        if argument is None:
            refuse(call, "SUM(*) is not valid", "name a column")
        return Aggregate(context.name, "sum", filtered(argument, context.condition), context.label,
                         unit_bounds=contribution_bounds(call))

    def shapes(self, aggregate: Aggregate, names: Sequence[str], interval: Interval | None,
               clamped: tuple[ClampedColumn, ...]) -> tuple[list[Shape], AggregateRelease]:
        shape = Shape(names[0], "sum", aggregate.argument, interval, clamped)
        return [shape], AggregateRelease(aggregate.name, "sum", (names[0],))

    def unit_shapes(self, aggregate: Aggregate, names: Sequence[str],
                    arguments: Sequence[Ranged]) -> tuple[list[Shape], AggregateRelease] | None:
        """The sum with each unit's per-group total clamped into the call's bounds, else the policy's."""
        (argument,) = arguments
        bounds = aggregate.unit_bounds or argument.unit_bounds
        if bounds is None:
            return None
        shape = Shape(names[0], "sum", aggregate.argument, argument.interval, argument.clamped, unit_bounds=bounds)
        return [shape], AggregateRelease(aggregate.name, "sum", (names[0],))

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        """The noisy integer times the grid, kept on the side of 0 the bounds allow (a sum of
        values >= 0 is >= 0): no farther from the truth, which lies there."""
        noisy = integers(release.noisy[measures[0].name])
        if measures[0].lower >= 0:
            noisy = np.maximum(noisy, 0)
        elif measures[0].upper <= 0:
            noisy = np.minimum(noisy, 0)
        return on_grid(noisy, measures[0].grid).tolist()

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        lower, upper = measures[0].lower, measures[0].upper
        return (0.0 if lower >= 0 else -math.inf), (0.0 if upper <= 0 else math.inf)

    def result_type(self, aggregate: AggregateRelease, first: Measure) -> str:
        # A noisy integer sum of k values of up to 2**62 grid units per unit can pass int64.
        return "HUGEINT" if first.grid.denominator == 1 else "DOUBLE"
