"""COUNT(*) and COUNT(expr): a noisy count of rows, or of non-NULL values.

Each row adds 1 (or 0 for a NULL value), so one unit moves a count by at most its rows
(``dpsql.analysis.sensitivity.bounded_sum_sensitivity`` on [0, 1]). The released value is the
noisy integer floored at 0, which is no farther from the truth than the noisy one.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.aggregates.exact import integers
from dpsql.analysis.aggregates.family import AggregateFamily, Call, Shape, filtered
from dpsql.analysis.plan import Aggregate, AggregateRelease, ClampedColumn, Measure, MeasureKind, Release
from dpsql.analysis.ranges import Interval


class CountingFamily(AggregateFamily):
    """What every count shares: one measure of 0/1 row values, released as a floored integer."""

    ranged = False
    measure_kind: MeasureKind = "count"
    """The ``Measure.kind`` of its one measure."""

    def shapes(self, aggregate: Aggregate, names: Sequence[str], interval: Interval | None,
               clamped: tuple[ClampedColumn, ...]) -> tuple[list[Shape], AggregateRelease]:
        argument = aggregate.argument if self.measure_kind != "units" else None
        shape = Shape(names[0], self.measure_kind, argument, None, ())
        return [shape], AggregateRelease(aggregate.name, aggregate.function, (names[0],))

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        return np.maximum(integers(release.noisy[measures[0].name]), 0).tolist()

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        return 0.0, math.inf

    def result_type(self, aggregate: AggregateRelease, first: Measure) -> str:
        return "BIGINT"


class CountFamily(CountingFamily):
    """COUNT(*) and COUNT(expr)."""

    functions = ("count",)
    spellings = ("COUNT",)
    nodes = (exp.Count,)

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        return Aggregate(context.name, "count", filtered(argument, context.condition), context.label)


def counts_rows(aggregate: Aggregate) -> bool:
    """True for COUNT(*): its value is the number of rows a group holds."""
    return aggregate.function == "count" and aggregate.argument is None
