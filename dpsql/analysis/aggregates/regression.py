"""REGR_SLOPE(y, x), REGR_INTERCEPT(y, x) and REGR_R2(y, x): least-squares line of y on x over the pairs.

From noisy Sx, Sy, Sxy, Sxx and n (and Syy for REGR_R2), in centred units
(``dpsql.analysis.aggregates.moments``): slope = (grid_y / grid_x) cov / var_x, intercept = mean_y
- slope mean_x (in the columns' units), R^2 = cov^2 / (var_x var_y) in [0, 1], 1 when var_y is 0
and var_x is not (as DuckDB). The slope and intercept have no bound the policy gives (a tiny
var_x makes the slope as large as it likes), so they are not clamped; NaN where the noisy count
of pairs or the noisy var_x is not positive (DuckDB: NaN or NULL there).
"""

from __future__ import annotations

import math
from fractions import Fraction
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
    outward,
    quotient_range,
    slope_interval,
    square_range,
    unclamped,
)
from dpsql.analysis.aggregates.moments import (
    Moments,
    PairFamily,
    Scale,
    as_float,
    classify_pair,
    correlation,
    explain_text,
    moments,
    pair_shapes,
    scale_of,
    unit_pair_shapes,
)
from dpsql.analysis.plan import Aggregate, AggregateFunction, AggregateRelease, Measure, Release

LINE = ("x", "y", "xy", "xx")
STATISTICS: dict[str, tuple[str, ...]] = {"regr_slope": LINE, "regr_intercept": LINE, "regr_r2": (*LINE, "yy")}
UNKNOWN = (math.nan, math.nan)
"""The interval of a slope or intercept that no finite interval bounds: reported as "derived, no ±"."""
FORMS: dict[type[exp.Expression], AggregateFunction] = {
    exp.RegrSlope: "regr_slope", exp.RegrIntercept: "regr_intercept", exp.RegrR2: "regr_r2"}


class RegressionFamily(PairFamily):
    """REGR_SLOPE, REGR_INTERCEPT and REGR_R2."""

    functions = ("regr_slope", "regr_intercept", "regr_r2")
    spellings = ("REGR_SLOPE", "REGR_INTERCEPT", "REGR_R2")
    nodes = tuple(FORMS)
    measure_count = len(STATISTICS["regr_r2"]) + 1  # the most any of them reads
    arity = 2

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        return classify_pair(call, context, FORMS[type(call)])

    def pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                    second: Ranged) -> tuple[list[Shape], AggregateRelease]:
        return pair_shapes(aggregate, names, first, second, STATISTICS[aggregate.function])

    def unit_pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                         second: Ranged) -> tuple[list[Shape], AggregateRelease] | None:
        return unit_pair_shapes(aggregate, names, first, second, STATISTICS[aggregate.function])

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        statistics = STATISTICS[aggregate.function]
        scale = scale_of(measures)
        return [_value(aggregate.function, row, scale) for row in moments(aggregate, measures, release, statistics)]

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """The means of x and y by test inversion, and cov and var_x (and var_y for R^2) by
        their own pivots, together with probability 1 - alpha·``CORRELATION_BOX_SHARE``
        (``intervals.centred_boxes``, for either form of the statistics), clamped as the values
        are (``intervals.clamped_moments``); the slope cov / var_x over their box, cut to the
        slope's own pivot at the rest of alpha (``intervals.slope_interval``, where the box lets
        no clamp bind: both hold the truth when the box and the pivot do); the intercept mean_y -
        slope mean_x at the corners of slope times mean_x; R^2 the square of CORR's interval (its
        box's range cut to ``intervals.correlation_interval``), within [0, 1]. Where var_x's
        range reaches 0 the slope and the intercept have no finite interval: (NaN, NaN),
        "derived, no ±"."""
        statistics = STATISTICS[aggregate.function]
        scale = scale_of(measures)
        ratio = scale.grid_y / scale.grid_x
        spreads = {"x": float(scale.spread_x), "y": float(scale.spread_y)}
        share = alpha * CORRELATION_BOX_SHARE
        cells = []
        for i, box in enumerate(centred_boxes(measures, statistics, release.noisy, share)):
            free = unclamped(box, spreads)  # the values' clamps never bind: the pivots' truth is theirs
            clamped = clamped_moments(box, spreads)
            cov, var_x = clamped["cov"], clamped["var_x"]
            if aggregate.function == "regr_r2":
                low, high = correlation_bounds(cov, var_x, clamped["var_y"])
                pivot = correlation_interval(measures, release.noisy, i, box, alpha - share) if free else None
                low, high = _within((low, high), pivot)
                cells.append(outward(*square_range(low, high), 0.0, 1.0))
                continue
            slope = quotient_range(cov, var_x)
            pivot = slope_interval(measures, statistics, release.noisy, i, box, alpha - share) if free else None
            slope = pivot if slope is None else _within(slope, pivot)
            if slope is None:
                cells.append(UNKNOWN)
                continue
            slopes = [Fraction(end) * ratio for end in slope]  # exact: the columns' units may leave float range
            if aggregate.function == "regr_slope":
                cells.append(outward(as_float(slopes[0]), as_float(slopes[1])))
                continue
            mean_y = [scale.mean_y(Fraction(c)) for c in clamped["y"]]
            products = [b * scale.mean_x(Fraction(c)) for b in slopes for c in clamped["x"]]
            cells.append(outward(as_float(mean_y[0] - max(products)), as_float(mean_y[1] - min(products))))
        return holding(cells, self.values(aggregate, measures, release))

    def predicted_half_width(self, aggregate: AggregateRelease, measures: Sequence[Measure], alpha: float,
                             count: int | None = None) -> float | None:
        """None: its ± depends on the variances of both arguments (a ratio over them), which only
        the release tells, not on the count of pairs alone."""
        return None

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        """R^2 lies in [0, 1]; the slope and the intercept have no bound."""
        return (0.0, 1.0) if aggregate.function == "regr_r2" else (-math.inf, math.inf)

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        what = {"regr_slope": "slope cov / var_x",
                "regr_intercept": "intercept mean_y - slope * mean_x",
                "regr_r2": "R^2 = cov^2 / (var_x var_y), clamped to [0, 1],"}[aggregate.function]
        return explain_text(what, aggregate, STATISTICS[aggregate.function])


def _value(function: str, row: Moments | None, scale: Scale) -> float:
    if row is None:
        return math.nan
    assert row.var_x is not None and row.cov is not None
    if function == "regr_r2":
        if row.var_x <= 0:
            return math.nan
        assert row.var_y is not None
        return 1.0 if row.var_y <= 0 else correlation(row) ** 2
    if row.var_x <= 0:
        return math.nan
    slope = scale.grid_y / scale.grid_x * row.cov / row.var_x
    if function == "regr_slope":
        return as_float(slope)
    return as_float(scale.mean_y(row.mean_y) - slope * scale.mean_x(row.mean_x))


def _within(bounds: tuple[float, float], pivot: tuple[float, float] | None) -> tuple[float, float]:
    """The box's range cut to the pivot's interval (both hold the truth when the box and the pivot
    do), or the range alone where the pivot tells nothing or they do not meet."""
    if pivot is None or max(bounds[0], pivot[0]) > min(bounds[1], pivot[1]):
        return bounds
    return max(bounds[0], pivot[0]), min(bounds[1], pivot[1])
