"""CORR(y, x): Pearson's correlation of the pairs, from noisy Sx, Sy, Sxy, Sxx, Syy and n.

cov / sqrt(var_x var_y) in centred units (``dpsql.analysis.aggregates.moments``; the grids cancel),
clamped into [-1, 1]; NaN where the noisy count of pairs or a noisy variance is not positive (as
DuckDB's CORR is NaN for a constant argument).
"""

from __future__ import annotations

import math
from typing import Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.family import Call, NumberText, Ranged, Shape
from dpsql.analysis.aggregates.intervals import (
    CORRELATION_BOX_SHARE,
    centred_boxes,
    clamped_moments,
    correlation_bounds,
    correlation_interval,
    holding,
    unclamped,
)
from dpsql.analysis.aggregates.moments import (
    PairFamily,
    classify_pair,
    correlation,
    explain_text,
    moments,
    pair_shapes,
    scale_of,
    unit_pair_shapes,
)
from dpsql.analysis.plan import Aggregate, AggregateRelease, Measure, Release

STATISTICS = ("x", "y", "xy", "xx", "yy")


class CorrelationFamily(PairFamily):
    """CORR."""

    functions = ("corr",)
    spellings = ("CORR",)
    nodes = (exp.Corr,)
    measure_count = len(STATISTICS) + 1
    arity = 2

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        return classify_pair(call, context, "corr")

    def pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                    second: Ranged) -> tuple[list[Shape], AggregateRelease]:
        return pair_shapes(aggregate, names, first, second, STATISTICS)

    def unit_pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                         second: Ranged) -> tuple[list[Shape], AggregateRelease] | None:
        return unit_pair_shapes(aggregate, names, first, second, STATISTICS)

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        return [math.nan if row is None else correlation(row)
                for row in moments(aggregate, measures, release, STATISTICS)]

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """CORR's own pivot (``intervals.correlation_interval``) at alpha less
        ``CORRELATION_BOX_SHARE`` of it, its nuisances (the means, the ratio of the spreads) from
        the box of the means and cov, var_x and var_y by their own pivots at that share
        (``intervals.centred_boxes``, for either form of the statistics), within cov / sqrt(var_x
        var_y) over that box as the values clamp it (``intervals.clamped_moments``,
        ``correlation_bounds``), within [-1, 1]: the truth lies in both when the box and the
        pivot hold (probability 1 - alpha). Where the box lets a clamp bind, or a variance be 0,
        the box's range alone."""
        scale = scale_of(measures)
        spreads = {"x": float(scale.spread_x), "y": float(scale.spread_y)}
        share = alpha * CORRELATION_BOX_SHARE
        cells = []
        for i, box in enumerate(centred_boxes(measures, STATISTICS, release.noisy, share)):
            clamped = clamped_moments(box, spreads)
            low, high = correlation_bounds(clamped["cov"], clamped["var_x"], clamped["var_y"])
            pivot = (correlation_interval(measures, release.noisy, i, box, alpha - share)
                     if unclamped(box, spreads) else None)
            if pivot is not None and max(low, pivot[0]) <= min(high, pivot[1]):
                low, high = max(low, pivot[0]), min(high, pivot[1])
            cells.append((low, high))
        return holding(cells, self.values(aggregate, measures, release))

    def predicted_half_width(self, aggregate: AggregateRelease, measures: Sequence[Measure], alpha: float,
                             count: int | None = None) -> float | None:
        """None: its ± depends on the variances of both arguments (a ratio over them), which only
        the release tells, not on the count of pairs alone."""
        return None

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        return -1.0, 1.0

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        return explain_text("correlation cov / sqrt(var_x var_y), clamped to [-1, 1],", aggregate, STATISTICS)
