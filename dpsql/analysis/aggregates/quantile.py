"""MEDIAN, QUANTILE_CONT / PERCENTILE_CONT, QUANTILE, MIN and MAX: a quantile of bounded values.

Its measure is a histogram of bucket counts over the expression's range, fed to the
exponential mechanism (``dpsql.mechanisms.quantile``) rather than noised: the released value
is the bucket edge the mechanism chose, and its 95% interval's endpoints are drawn with it.
MIN is the 0 quantile, MAX the 1 quantile, MEDIAN the 0.5 quantile.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.family import AggregateFamily, Call, NumberText, Shape, filtered
from dpsql.analysis.plan import Aggregate, AggregateRelease, ClampedColumn, Measure, Release
from dpsql.analysis.ranges import Interval
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.quantile import (
    ENDPOINT_ALPHA,
    VALUE_SHARE,
    QuantileRule,
    edge,
    endpoint_shift,
    quantile_accuracy,
    release_interval,
    value_rule,
)
from dpsql.sql.allowlist import check_row_level, refuse
from dpsql.sql.parse import describe

FIXED: dict[type[exp.Expression], float] = {exp.Median: 0.5, exp.Min: 0.0, exp.Max: 1.0}
"""Calls whose quantile is implied by their name."""
PARAMETRIC = (exp.PercentileCont, exp.Quantile)
"""Calls that name their quantile: QUANTILE_CONT(x, q), QUANTILE(x, q), APPROX_QUANTILE(x, q)."""


class QuantileFamily(AggregateFamily):
    """Quantiles by the exponential mechanism."""

    functions = ("quantile",)
    spellings = ("MEDIAN", "QUANTILE_CONT", "PERCENTILE_CONT", "QUANTILE", "APPROX_QUANTILE", "MIN", "MAX")
    nodes = (*FIXED, *PARAMETRIC, exp.WithinGroup)
    draws = True

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        if isinstance(call, exp.WithinGroup):
            inner, order = call.this, call.expression
            if not isinstance(inner, exp.PercentileCont) or len(order.expressions) != 1:
                refuse(call, f"{describe(inner)} WITHIN GROUP is not supported", "use QUANTILE_CONT(x, q)")
            return _quantile(call, order.expressions[0].this, inner.this, context)
        if type(call) in FIXED:
            return Aggregate(context.name, "quantile", filtered(argument, context.condition), context.label,
                             quantile=FIXED[type(call)])
        return _quantile(call, call.this, call.args.get("quantile") or call.expression, context)

    def shapes(self, aggregate: Aggregate, names: Sequence[str], interval: Interval | None,
               clamped: tuple[ClampedColumn, ...]) -> tuple[list[Shape], AggregateRelease]:
        assert interval is not None  # a ranged family
        if interval.lower == interval.upper:
            raise UnsupportedQuery(f"{aggregate.label}: the expression's bounds are equal, so it is constant",
                                   node=aggregate.argument, hint="select the constant itself")
        shape = Shape(names[0], "histogram", aggregate.argument, interval, clamped)
        return [shape], AggregateRelease(aggregate.name, "quantile", (names[0],), quantile=aggregate.quantile,
                                         lower=interval.lower, upper=interval.upper)

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        return [float(value) for value in release.chosen[measures[0].name]]

    def half_widths(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                    alpha: float) -> list[float]:
        """max(value - low, high - value) of the value interval drawn at release
        (``dpsql.mechanisms.quantile.release_interval``), a 95% interval, so reported for
        alpha >= 0.05 (a conservative figure above 0.05) and NaN below."""
        return [max(v - low, high - v) for v, (low, high)
                in zip(self.values(aggregate, measures, release),
                       self.intervals(aggregate, measures, release, alpha))]

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """The drawn endpoints (NaN, NaN below alpha 0.05, or for an answer kept before quantiles
        stored their intervals)."""
        drawn = release.edges.get(aggregate.measures[0])
        if drawn is None:  # kept before quantiles stored their intervals: none is known
            return [(math.nan, math.nan)] * len(release.keys)
        if alpha < ENDPOINT_ALPHA:  # the endpoints were drawn for 95%: nothing narrower-risk is known
            return [(math.nan, math.nan)] * len(drawn)
        rule = _rule(aggregate)
        return [(float(edge(rule, low)), float(edge(rule, high))) for _, low, high in drawn]

    def draw(self, aggregate: AggregateRelease, keys: list[tuple], rows: Sequence[tuple], width: int,
             source: Any) -> tuple[tuple[int, int, int], ...]:
        """The exponential mechanism's edge indices (value, low, high) for each released key, from
        its bounded bucket counts."""
        rule = _rule(aggregate)
        counts = {key: [0] * rule.buckets for key in keys}
        for row in rows:
            key, bucket, count = tuple(row[:width]), int(row[width]), int(row[width + 1] or 0)
            if key in counts:
                counts[key][bucket] += count
        return tuple(release_interval(counts[key], rule, source) for key in keys)

    def chosen(self, aggregate: AggregateRelease, drawn: Sequence[tuple[int, int, int]]) -> tuple[Fraction, ...]:
        rule = _rule(aggregate)
        return tuple(edge(rule, j) for j, _, _ in drawn)

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        rule = _rule(aggregate)
        measures = ", ".join(aggregate.measures)
        ends = "upper endpoint" if rule.q == 0.0 else "lower endpoint" if rule.q == 1.0 else "two endpoints"
        shift = endpoint_shift(rule)
        bound = f"at target rank q·n + {shift}; its lower end is the lower bound" if rule.q == 0.0 else \
            f"at target rank q·n - {shift}; its upper end is the upper bound" if rule.q == 1.0 else \
            f"at target ranks q·n ∓ {shift}, with the bounds as fallback"
        return (f"quantile q = {rule.q:g} by the exponential mechanism over {rule.buckets + 1} public edges "
                f"in [{number(rule.lower)}, {number(rule.upper)}] ({measures}); the value with "
                f"{number(VALUE_SHARE)} of its epsilon (rank error at most "
                f"{quantile_accuracy(value_rule(rule), float('inf'), 0.05):.4g} values with 95% probability), "
                f"its 95% value interval's {ends} with the rest ({bound})"
                + ("; MIN/MAX are the 0 and 1 quantiles" if rule.q in (0.0, 1.0) else ""))


def _rule(aggregate: AggregateRelease) -> QuantileRule:
    """The exponential mechanism's rule, which analyse sets on every quantile's release."""
    assert isinstance(aggregate.rule, QuantileRule)
    return aggregate.rule


def _quantile(call: exp.Expression, argument: exp.Expression, q: exp.Expression | None, context: Call) -> Aggregate:
    if not (isinstance(q, exp.Literal) and not q.is_string and 0 <= Fraction(q.this) <= 1):
        refuse(call, "the quantile must be a constant between 0 and 1", "write QUANTILE_CONT(x, 0.9)")
    check_row_level(argument, describe(call))
    return Aggregate(context.name, "quantile", filtered(argument, context.condition), context.label,
                     quantile=float(Fraction(q.this)))
