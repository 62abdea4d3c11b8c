"""VARIANCE / VAR_SAMP / VAR_POP and STDDEV / STDDEV_SAMP / STDDEV_POP.

Three measures: a centred sum S, a sum of squared centred values Q and a count C, on a coarser
grid (12 bits of the range) so squares stay moderate integers. The release is
grid^2/4 * (Q'/C' - (S'/C')^2), clamped into [0, (hi - lo)^2 / 4] (times C'/(C' - 1) for the
sample form); STDDEV is its square root.

Under the per-unit model (``unit_shapes``: the column has ``BOUNDS PER UNIT`` [lo, hi]) the sums are
*uncentred* — S = sum v with each unit's per-group total clamped into [lo, hi], Q = sum v^2 with
each unit's clamped into [0, max(|lo|, |hi|) * max(|L|, |U|)] (a unit's sum of squares is at most
its largest |value| times its sum of |values|; the bound only limits the clamp's bias, any clamp
being private) — and the count is the rows model's. The release converts them exactly to the
centred statistics (S_c = 2S - M C, Q_c = 4Q - 4M S + M^2 C, M = L + U on the grid) and goes on as
above: post-processing of the noisy integers.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.aggregates.exact import exact, integers, magnitude, quotients
from dpsql.analysis.aggregates.family import AggregateFamily, Call, NumberText, Ranged, Shape, filtered
from dpsql.analysis.aggregates.intervals import (
    centred_boxes,
    holding,
    outward,
    product_range,
    sample_factor_range,
    spread_of,
)
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
    counted = True

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

    def unit_shapes(self, aggregate: Aggregate, names: Sequence[str],
                    arguments: Sequence[Ranged]) -> tuple[list[Shape], AggregateRelease] | None:
        """The module docstring's per-unit form, when the column has a bound per unit."""
        (argument,) = arguments
        if argument.unit_bounds is None:
            return None
        interval, clamped, value = argument.interval, argument.clamped, aggregate.argument
        lower, upper = argument.unit_bounds
        largest = max(abs(interval.lower), abs(interval.upper)) * max(abs(lower), abs(upper))
        total = Shape(names[0], "sum", value, interval, clamped, fine_bits=12, unit_bounds=(lower, upper))
        squares = Shape(names[1], "sum", value, interval, clamped, squared=True, fine_bits=12,
                        unit_bounds=(Fraction(0), largest))
        count = Shape(names[2], "count", value, interval, clamped, counts_values_of=names[0], fine_bits=12)
        return [total, squares, count], AggregateRelease(aggregate.name, aggregate.function, tuple(names),
                                                         sample=aggregate.sample, lower=interval.lower,
                                                         upper=interval.upper, unit_model="total")

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        sums, squares, counts = (integers(release.noisy[m.name]) for m in measures)
        if not measures[0].centred:
            sums, squares = centred_moments(sums, squares, counts, measures[0])
        return _variances(sums, squares, counts, measures[0], aggregate).tolist()

    def half_widths(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                    alpha: float) -> list[float]:
        """The larger distance from the value to an end of its interval (``intervals``)."""
        return [spread_of(low, high, value) for value, (low, high)
                in zip(self.values(aggregate, measures, release), self.intervals(aggregate, measures, release, alpha))]

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """The mean m = S/C by test inversion and the centred variance k = Q/C - m^2 by its own
        pivot, together with probability 1 - alpha (``dpsql.analysis.aggregates.intervals.centred_boxes``,
        which serves the per-unit model's uncentred S and Q too, in centred units); the sample
        population variance's ends clamped into [0, s^2] (s the centred spread: where it lies whatever
        the data), then the sample form times the range of C/(C - 1) over the count's own interval;
        STDDEV the square roots."""
        total, squares, count = measures[0], measures[1], measures[-1]
        unit = float(total.grid) ** 2 / 4  # a centred step is worth grid / 2
        spread = float(total.upper - total.lower)
        floor, ceiling = self.possible(aggregate, measures)
        cells = []
        for box in centred_boxes([total, squares, count], ("x", "xx"), release.noisy, alpha, aggregate.sample):
            # the population variance k lies in [0, s^2] whatever the data: clamp its ends first,
            # then the sample form's factor n/(n - 1) (up to 2), so a sample variance of two values
            # at the bounds, 2 s^2 in centred units, stays inside (a clamp after the factor cut it)
            low, high = (min(max(end, 0.0), spread * spread) for end in box["var_x"])
            if aggregate.sample:
                low, high = product_range((low, high), sample_factor_range(box["n"]))
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
        if aggregate.unit_model == "total":
            return (f"{form} {aggregate.function} from sum, sum of squares and count ({measures}), each unit's "
                    "totals in a group clamped to its bounds per unit")
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


def centred_moments(sums: np.ndarray, squares: np.ndarray, counts: np.ndarray,
                    measure: Measure) -> tuple[np.ndarray, np.ndarray]:
    """Uncentred noisy S = sum v and Q = sum v^2 (grid units) as the centred statistics of
    c = 2v - M, M = L + U: sum c = 2S - M C and sum c^2 = 4Q - 4M S + M^2 C, exact integers.

    >>> import numpy as np
    >>> from dpsql.analysis.plan import Measure
    >>> m = Measure("m0", "sum", None, (), Fraction(1), 0, 4, False, None, 0, 0, "none", 1)
    >>> centred_moments(np.array([5]), np.array([13]), np.array([2]), m)  # values 2, 3: c = 0, 2
    (array([2]), array([4]))
    """
    middle = measure.lower + measure.upper
    bound = 4 * magnitude(squares) + 4 * abs(middle) * magnitude(sums) + middle * middle * magnitude(counts)
    sums, squares, counts = (exact(a, bound, limit=2**62) for a in (sums, squares, counts))
    return 2 * sums - middle * counts, 4 * squares - 4 * middle * sums + middle * middle * counts

