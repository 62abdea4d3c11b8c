"""COVAR_POP(y, x) and COVAR_SAMP(y, x): covariance of the pairs, from noisy Sx, Sy, Sxy and n.

In centred units cov = Sxy'/n' - (Sx'/n')(Sy'/n') (``dpsql.analysis.aggregates.moments``), worth
grid_x grid_y / 4 per unit; the sample form multiplies by n'/(n' - 1). Released values are
clamped into what the bounds allow: |population covariance| <= h_x h_y (the half-spreads of the
two arguments' bounds), and the sample form at most twice that (n/(n - 1) <= 2 for n >= 2). NaN
where the noisy count of pairs is at most 0 (1 for the sample form), as DuckDB has no value there.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.family import Call, NumberText, Ranged, Shape
from dpsql.analysis.aggregates.intervals import (
    centred_boxes,
    clamped_moments,
    holding,
    outward,
    sample_factor_range,
)
from dpsql.analysis.aggregates.moments import (
    PairFamily,
    as_float,
    classify_pair,
    explain_text,
    moments,
    pair_shapes,
    scale_of,
    unit_pair_shapes,
)
from dpsql.analysis.plan import Aggregate, AggregateRelease, Measure, Release

STATISTICS = ("x", "y", "xy")
FORMS: dict[type[exp.Expression], bool] = {exp.CovarPop: False, exp.CovarSamp: True}
"""sqlglot call -> sample form."""


class CovarianceFamily(PairFamily):
    """COVAR_POP and COVAR_SAMP."""

    functions = ("covar",)
    spellings = ("COVAR_POP", "COVAR_SAMP")
    nodes = tuple(FORMS)
    measure_count = len(STATISTICS) + 1
    arity = 2

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        return classify_pair(call, context, "covar", sample=FORMS[type(call)])

    def pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                    second: Ranged) -> tuple[list[Shape], AggregateRelease]:
        return pair_shapes(aggregate, names, first, second, STATISTICS)

    def unit_pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                         second: Ranged) -> tuple[list[Shape], AggregateRelease] | None:
        return unit_pair_shapes(aggregate, names, first, second, STATISTICS)

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        scale = scale_of(measures)
        unit = scale.grid_x * scale.grid_y / 4
        floor, ceiling = self.possible(aggregate, measures)
        values = []
        for row in moments(aggregate, measures, release, STATISTICS):
            if row is None or aggregate.sample and row.n <= 1:
                values.append(math.nan)
                continue
            assert row.cov is not None
            value = row.cov * unit * (Fraction(row.n, row.n - 1) if aggregate.sample else 1)
            values.append(min(max(as_float(value), floor), ceiling))
        return values

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """The means of x and y by test inversion and cov by its own pivot, together with
        probability 1 - alpha (``dpsql.analysis.aggregates.intervals.centred_boxes``, for either
        form of the statistics), clamped as the value is (``intervals.clamped_moments``), in the
        columns' units; the sample form times the range of C/(C - 1) over the count's own
        interval (C >= 2), at ``intervals.COUNT_SHARE`` of alpha."""
        scale = scale_of(measures)
        unit = scale.grid_x * scale.grid_y / 4
        floor, ceiling = self.possible(aggregate, measures)
        cells = []
        spreads = {"x": float(scale.spread_x), "y": float(scale.spread_y)}
        for box in centred_boxes(measures, STATISTICS, release.noisy, alpha, aggregate.sample):
            low, high = clamped_moments(box, spreads)["cov"]
            if aggregate.sample:
                corners = [end * factor for end in (low, high) for factor in sample_factor_range(box["n"])]
                low, high = min(corners), max(corners)
            cells.append(outward(as_float(Fraction(low) * unit), as_float(Fraction(high) * unit), floor, ceiling))
        return holding(cells, self.values(aggregate, measures, release))

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        """|population covariance| <= h_x h_y (half-spreads of the bounds, on the grid); the
        sample form at most twice that."""
        scale = scale_of(measures)
        largest = as_float(scale.spread_x * scale.spread_y * scale.grid_x * scale.grid_y / 4)
        largest *= 2 if aggregate.sample else 1
        return -largest, largest

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        form = "sample" if aggregate.sample else "population"
        return explain_text(f"{form} covariance", aggregate, STATISTICS)
