"""VARIANCE / VAR_SAMP / VAR_POP and STDDEV / STDDEV_SAMP / STDDEV_POP.

Three measures: a centred sum S, a sum of squared centred values Q and a count C, on a coarser
grid (12 bits of the range) so squares stay moderate integers. The release is
grid^2/4 * (Q'/C' - (S'/C')^2), clamped into [0, (hi - lo)^2 / 4] (times C'/(C' - 1) for the
sample form); STDDEV is its square root.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.aggregates.exact import exact, integers, magnitude, quotients
from dpsql.analysis.aggregates.family import AggregateFamily, Call, NumberText, Shape, filtered
from dpsql.analysis.aggregates.intervals import centred_boxes, holding, outward, sample_factor_range, spread_of
from dpsql.analysis.plan import Aggregate, AggregateRelease, ClampedColumn, Measure, Release
from dpsql.analysis.ranges import Interval

FORMS: dict[type[exp.Expression], tuple[str, bool]] = {
    exp.Variance: ("variance", True), exp.VariancePop: ("variance", False),
    exp.Stddev: ("stddev", True), exp.StddevSamp: ("stddev", True), exp.StddevPop: ("stddev", False),
}
"""sqlglot call -> (function, sample form)."""


class VarianceFamily(AggregateFamily):
    """VARIANCE and STDDEV, sample and population forms."""

    functions = ("variance", "stddev")
    spellings = ("VARIANCE", "VAR_SAMP", "VAR_POP", "STDDEV", "STDDEV_SAMP", "STDDEV_POP")
    nodes = tuple(FORMS)
    measure_count = 3

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        function, sample = FORMS[type(call)]
        return Aggregate(context.name, function, filtered(argument, context.condition),  # type: ignore[arg-type]
                         context.label, sample=sample)

    def shapes(self, aggregate: Aggregate, names: Sequence[str], interval: Interval | None,
               clamped: tuple[ClampedColumn, ...]) -> tuple[list[Shape], AggregateRelease]:
        assert interval is not None  # a ranged family
        # Centred sum, sum of squares and count on a coarser grid (12 bits of the range), so
        # squares stay moderate integers.
        argument = aggregate.argument
        total = Shape(names[0], "sum", argument, interval, clamped, centred=True, fine_bits=12)
        squares = Shape(names[1], "sum", argument, interval, clamped, centred=True, squared=True, fine_bits=12)
        count = Shape(names[2], "count", argument, interval, clamped, counts_values_of=names[0], fine_bits=12)
        return [total, squares, count], AggregateRelease(aggregate.name, aggregate.function, tuple(names),
                                                         sample=aggregate.sample, lower=interval.lower,
                                                         upper=interval.upper)

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        sums, squares, counts = (integers(release.noisy[m.name]) for m in measures)
        return _variances(sums, squares, counts, measures[0], aggregate).tolist()

    def half_widths(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                    alpha: float) -> list[float]:
        """The larger distance from the value to an end of its interval (``intervals``)."""
        return [spread_of(low, high, value) for value, (low, high)
                in zip(self.values(aggregate, measures, release), self.intervals(aggregate, measures, release, alpha))]

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """The mean m = S/C by test inversion and the centred variance Q/C - m^2 by its own pivot,
        together with probability 1 - alpha (``dpsql.analysis.aggregates.intervals.centred_boxes``),
        within [0, s^2] (s the centred spread); the sample form times the range of C/(C - 1) over
        the count's own interval; STDDEV the square roots."""
        total, squares, count = measures[0], measures[1], measures[-1]
        unit = float(total.grid) ** 2 / (4 if total.centred else 1)  # a centred step is worth grid / 2
        floor, ceiling = self.possible(aggregate, measures)
        cells = []
        for box in centred_boxes([total, squares, count], ("x", "xx"), release.noisy, alpha, aggregate.sample):
            low, high = box["var_x"]
            if aggregate.sample:
                least, most = sample_factor_range(box["n"])
                low, high = low * least, high * most
            low, high = low * unit, high * unit
            if aggregate.function == "stddev":
                low, high = math.sqrt(low), math.sqrt(high)
            cells.append(outward(low, high, floor, ceiling))
        return holding(cells, self.values(aggregate, measures, release))

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        """At most (hi - lo)^2 / 4 (values half at each bound), STDDEV its root; the sample form
        may exceed that by C/(C - 1), so its ceiling is left open."""
        largest = _full(aggregate) ** 2 / 4
        if aggregate.sample:
            return 0.0, math.inf
        return 0.0, math.sqrt(largest) if aggregate.function == "stddev" else float(largest)

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        form = "sample" if aggregate.sample else "population"
        measures = ", ".join(aggregate.measures)
        return f"{form} {aggregate.function} from centred sum, sum of squares and count ({measures})"


def _full(aggregate: AggregateRelease) -> Fraction:
    """hi - lo of the aggregated expression (the release always carries its bounds)."""
    assert aggregate.lower is not None and aggregate.upper is not None
    return aggregate.upper - aggregate.lower


def _variances(centred_sums: np.ndarray, squares: np.ndarray, counts: np.ndarray, measure: Measure,
               aggregate: AggregateRelease) -> np.ndarray:
    """grid^2 (Q/C - (S/C)^2) / 4 = p^2 (Q C - S^2) / (4 q^2 C^2) for grid p/q (times C/(C - 1),
    so C (C - 1) below, for the sample form), clamped into [0, (hi - lo)^2 / 4]; 0 where C <= 0
    (C <= 1 for the sample form). STDDEV is the square root."""
    valid = counts > (1 if aggregate.sample else 0)
    counts = np.where(valid, counts, 2)
    p, q = measure.grid.numerator, measure.grid.denominator
    count_bound = magnitude(counts)
    bound = max(p * p * (magnitude(squares) * count_bound + magnitude(centred_sums) ** 2),
                4 * q * q * count_bound * count_bound)
    sums, squares, counts = (exact(a, bound) for a in (centred_sums, squares, counts))
    pairs = counts * (counts - 1) if aggregate.sample else counts * counts
    variances = quotients((squares * counts - sums * sums) * (p * p), pairs * (4 * q * q))
    largest = _full(aggregate) ** 2 / 4
    variances = np.where(valid, np.minimum(np.maximum(variances, 0.0), float(largest)), 0.0)
    return np.sqrt(variances) if aggregate.function == "stddev" else variances
