"""Second moments of pairs, shared by COVAR_* (``covariance``), CORR (``correlation``) and REGR_*
(``regression``): their classification, measures and noisy statistics.

DuckDB's ``F(y, x)`` (dependent first) reads the rows where both arguments are non-NULL. Each
argument is clamped into its bounds and computed on a grid of its own (12 bits of its range, as
VARIANCE), then centred: c = 2v - (L + U) in [-s, s], s = U - L grid steps, so one step of c is
worth grid / 2 and c = 0 is the middle of the bounds. The statistics are product measures
(``dpsql.analysis.plan.Measure.factors``) over the pairs, each an exact integer sum of one row
value per pair in a fixed interval, so its sensitivity is the SUM rule's for that interval:

* Sx = sum c_x and Sy = sum c_y, row values in [-s, s];
* Sxx = sum c_x^2 and Syy = sum c_y^2, in [0, s^2];
* Sxy = sum c_x c_y, in [-s_x s_y, s_x s_y] (the least and greatest corner products);
* n, the count of pairs (the non-NULL values of Sx, which are the pairs).

A family asks only for the statistics its function reads; the aggregate's epsilon is split
equally between them (basic composition). Every released value is a function of the noisy
statistics alone (post-processing). In centred units, with noisy values marked ', the means
m_x = Sx'/n', the second moments Sxy'/n', Sxx'/n' are clamped into what the bounds allow (which
only brings them closer to the truth where it lies there, as it does for any data's statistics;
the per-unit model's, each total clamped on its own, need not), and

    cov = Sxy'/n' - m_x m_y,   var_x = Sxx'/n' - m_x^2   (clamped into [-s_x s_y, s_x s_y], [0, s_x^2]).

Under the per-unit model (``unit_pair_shapes``: both arguments have ``BOUNDS PER UNIT``) the
statistics are *uncentred* (sums of v, v^2 and v_x v_y), each unit's per-group total clamped: Sx and
Sy into the arguments' bounds per unit [lo, hi], Sxx and Syy into [0, B] with B = max(|lo|, |hi|) *
max(|L|, |U|) (a unit's sum of squares is at most its largest |value| times its sum of |values|),
Sxy into ±sqrt(Bxx Byy) rounded outward (Cauchy-Schwarz). Any clamp is private; these only keep
the clamps' bias small. ``moments`` converts them exactly to the centred statistics above
(c = 2v - M, M = L + U: sum c = 2 Sv - M n, sum c^2 = 4 Svv - 4 M Sv + M^2 n, sum c_x c_y = 4 Sxy -
2 M_x Sy - 2 M_y Sx + M_x M_y n).

Intervals (``dpsql.analysis.aggregates.intervals``, for both forms): each mean S/n by inverting
the exact test of its pivot S' - r n', each centred moment by its own pivot, together by a union
bound (``centred_boxes``), clamped as ``moments`` clamps the values (``clamped_moments``), and
the family's value over that box by its exact range (the truth of the clamped, bounded data:
bias from clamping is not part of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.family import AggregateFamily, Call, FactorShape, Ranged, Shape, filtered
from dpsql.analysis.aggregates.intervals import spread_of
from dpsql.analysis.plan import Aggregate, AggregateFunction, AggregateRelease, Factor, Measure, Release
from dpsql.sql.allowlist import check_row_level, refuse
from dpsql.sql.parse import describe

FINE_BITS = 12
"""Grid resolution of each argument below its largest bound: products stay moderate integers."""

POWERS = {"x": (0, 1), "y": (1, 0), "xy": (1, 1), "xx": (0, 2), "yy": (2, 0)}
"""Statistic -> powers of the centred (y, x) in its row value."""

KINDS = {"x": "centred sum of x", "y": "centred sum of y", "xy": "cross-product sum",
         "xx": "sum of squares of x", "yy": "sum of squares of y", "n": "count of pairs"}
"""How explain names each statistic."""


def classify_pair(call: exp.Expression, context: Call, function: AggregateFunction, sample: bool = False) -> Aggregate:
    """The aggregate of ``F(y, x)``: y is its ``argument``, x its ``other``, FILTER folded into both."""
    y, x = call.this, call.args.get("expression")
    name = describe(call)[:-5]
    if y is None or x is None or isinstance(y, exp.Star) or isinstance(x, exp.Star):
        refuse(call, f"{name} takes two arguments, the dependent one first", f"write {name}(y, x)")
    if isinstance(y, exp.Distinct) or isinstance(x, exp.Distinct):
        refuse(call, f"{name} with DISTINCT is not supported", f"drop DISTINCT: {name}(y, x)")
    check_row_level(y, describe(call))
    check_row_level(x, describe(call))
    return Aggregate(context.name, function, filtered(y, context.condition), context.label, sample=sample,
                     other=filtered(x, context.condition))


def pair_shapes(aggregate: Aggregate, names: Sequence[str], y: Ranged, x: Ranged,
                statistics: Sequence[str]) -> tuple[list[Shape], AggregateRelease]:
    """The product measures of ``statistics`` (named from ``names``), then the count of pairs, and
    the release reading them in that order."""
    shapes = []
    for name, statistic in zip(names, statistics):
        powers = POWERS[statistic]
        argument = x.argument if powers[1] else y.argument
        factors = (FactorShape(y, powers[0]), FactorShape(x, powers[1]))
        shapes.append(Shape(name, "sum", argument, None, (), fine_bits=FINE_BITS, factors=factors))
    count = names[len(statistics)]
    shapes.append(Shape(count, "count", x.argument, None, (), counts_values_of=names[0], fine_bits=FINE_BITS))
    measures = tuple(names[:len(statistics) + 1])
    return shapes, AggregateRelease(aggregate.name, aggregate.function, measures, sample=aggregate.sample)


def unit_pair_shapes(aggregate: Aggregate, names: Sequence[str], y: Ranged, x: Ranged,
                     statistics: Sequence[str]) -> tuple[list[Shape], AggregateRelease] | None:
    """``pair_shapes`` under the per-unit model (the module docstring's uncentred statistics, each
    with its bound per unit), when both arguments have one; None otherwise."""
    if y.unit_bounds is None or x.unit_bounds is None:
        return None

    def squares(argument: Ranged) -> Fraction:
        assert argument.unit_bounds is not None
        return max(abs(argument.interval.lower), abs(argument.interval.upper)) * max(map(abs, argument.unit_bounds))

    cross = Fraction(math.isqrt(math.ceil(squares(x) * squares(y))) + 1)  # at least the square root
    bounds = {"x": x.unit_bounds, "y": y.unit_bounds, "xx": (Fraction(0), squares(x)),
              "yy": (Fraction(0), squares(y)), "xy": (-cross, cross)}
    shapes = []
    for name, statistic in zip(names, statistics):
        powers = POWERS[statistic]
        argument = x.argument if powers[1] else y.argument
        factors = (FactorShape(y, powers[0], centred=False), FactorShape(x, powers[1], centred=False))
        shapes.append(Shape(name, "sum", argument, None, (), fine_bits=FINE_BITS, factors=factors,
                            unit_bounds=bounds[statistic]))
    count = names[len(statistics)]
    shapes.append(Shape(count, "count", x.argument, None, (), counts_values_of=names[0], fine_bits=FINE_BITS))
    measures = tuple(names[:len(statistics) + 1])
    return shapes, AggregateRelease(aggregate.name, aggregate.function, measures, sample=aggregate.sample,
                                    unit_model="total")


def uncentred(measures: Sequence[Measure]) -> bool:
    """The statistics are the per-unit model's uncentred sums."""
    return not measures[0].factors[0].centred


def centred_statistics(columns: Mapping[str, Sequence[int]], counts: Sequence[int],
                       scale: "Scale") -> dict[str, list[int]]:
    """Uncentred noisy statistics (grid units) as the centred ones, exactly (module docstring).

    >>> s = Scale(Fraction(1), Fraction(1), 0, 4, 0, 2)  # y in [0, 4], x in [0, 2]: M_y = 4, M_x = 2
    >>> centred_statistics({"x": [3], "y": [5], "xy": [9], "xx": [5], "yy": [17]}, [2], s)  # (x, y) = (1, 1), (2, 4)
    {'x': [2], 'y': [2], 'xy': [8], 'xx': [4], 'yy': [20]}
    """
    m_x, m_y = scale.lower_x + scale.upper_x, scale.lower_y + scale.upper_y
    out: dict[str, list[int]] = {}
    for i, n in enumerate(counts):
        sx, sy = int(columns["x"][i]), int(columns["y"][i])
        value = {"x": 2 * sx - m_x * n, "y": 2 * sy - m_y * n}
        if "xy" in columns:
            value["xy"] = 4 * int(columns["xy"][i]) - 2 * m_x * sy - 2 * m_y * sx + m_x * m_y * n
        if "xx" in columns:
            value["xx"] = 4 * int(columns["xx"][i]) - 4 * m_x * sx + m_x * m_x * n
        if "yy" in columns:
            value["yy"] = 4 * int(columns["yy"][i]) - 4 * m_y * sy + m_y * m_y * n
        for statistic in columns:
            out.setdefault(statistic, []).append(value[statistic])
    return out


@dataclass(frozen=True)
class Scale:
    """The policy side of a pair: each argument's grid and its bounds in grid steps."""

    grid_y: Fraction
    grid_x: Fraction
    lower_y: int
    upper_y: int
    lower_x: int
    upper_x: int

    @property
    def spread_y(self) -> int:
        """s_y: centred y lies in [-s_y, s_y]."""
        return self.upper_y - self.lower_y

    @property
    def spread_x(self) -> int:
        return self.upper_x - self.lower_x

    def mean_y(self, centred: Fraction) -> Fraction:
        """A centred mean of y in y's units: grid (c + L + U) / 2."""
        return self.grid_y * (centred + self.lower_y + self.upper_y) / 2

    def mean_x(self, centred: Fraction) -> Fraction:
        return self.grid_x * (centred + self.lower_x + self.upper_x) / 2


def scale_of(measures: Sequence[Measure]) -> Scale:
    """The grids and bounds of y and x, from the first product measure's factors."""
    y, x = _factors(measures[0])
    return Scale(y.grid, x.grid, y.lower, y.upper, x.lower, x.upper)


def _factors(measure: Measure) -> tuple[Factor, Factor]:
    assert len(measure.factors) == 2, "a second-moment measure has the factors (y, x)"
    return measure.factors[0], measure.factors[1]


@dataclass(frozen=True)
class Moments:
    """One released row's noisy statistics as centred moments (None where not measured), each
    clamped into what the bounds allow; ``n`` is the noisy count of pairs (> 0)."""

    n: int
    mean_x: Fraction
    mean_y: Fraction
    cov: Fraction | None
    var_x: Fraction | None
    var_y: Fraction | None


def moments(aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
            statistics: Sequence[str]) -> list[Moments | None]:
    """Per released row, its ``Moments``; None where the noisy count of pairs is not positive."""
    scale = scale_of(measures)
    sx, sy = scale.spread_x, scale.spread_y
    columns: Mapping[str, Sequence[int]] = {statistic: release.noisy[m.name]
                                            for statistic, m in zip(statistics, measures)}
    counts = release.noisy[measures[len(statistics)].name]
    if uncentred(measures):
        columns = centred_statistics(columns, counts, scale)
    rows: list[Moments | None] = []
    for i, n in enumerate(counts):
        if n <= 0:
            rows.append(None)
            continue
        def ratio(statistic: str, low: int, high: int) -> Fraction | None:
            return _clamp(Fraction(columns[statistic][i], n), low, high) if statistic in columns else None
        mean_x, mean_y = ratio("x", -sx, sx), ratio("y", -sy, sy)
        assert mean_x is not None and mean_y is not None  # every family measures both sums
        cross, xx, yy = ratio("xy", -sx * sy, sx * sy), ratio("xx", 0, sx * sx), ratio("yy", 0, sy * sy)
        cov = None if cross is None else _clamp(cross - mean_x * mean_y, -sx * sy, sx * sy)
        var_x = None if xx is None else _clamp(xx - mean_x * mean_x, 0, sx * sx)
        var_y = None if yy is None else _clamp(yy - mean_y * mean_y, 0, sy * sy)
        rows.append(Moments(n, mean_x, mean_y, cov, var_x, var_y))
    return rows


def correlation(row: Moments) -> float:
    """cov / sqrt(var_x var_y) in [-1, 1], NaN when a noisy variance is 0 (as DuckDB's CORR)."""
    assert row.cov is not None and row.var_x is not None and row.var_y is not None
    if row.var_x <= 0 or row.var_y <= 0:
        return math.nan
    return min(max(float(row.cov) / math.sqrt(float(row.var_x) * float(row.var_y)), -1.0), 1.0)


def as_float(value: Fraction) -> float:
    """``value`` as a float, infinite where it is beyond the largest double (as DuckDB's DOUBLE
    arithmetic overflows): scaling back to the columns' units may leave float range, which must
    never fail after the charge.

    >>> as_float(Fraction(10) ** 400), as_float(-Fraction(10) ** 400), as_float(Fraction(1, 4))
    (inf, -inf, 0.25)
    """
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


class PairFamily(AggregateFamily):
    """A second-moment family: its ``intervals`` come first (not centred on the value), and the
    half-width it reports is read off them. Its ± shrinks with the count of pairs."""

    counted = True

    def half_widths(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                    alpha: float) -> list[float]:
        """The larger distance from the value to an end of its interval (``intervals``)."""
        return [spread_of(low, high, value) for value, (low, high)
                in zip(self.values(aggregate, measures, release), self.intervals(aggregate, measures, release, alpha))]


def _clamp(value: Fraction, low: Fraction | int, high: Fraction | int) -> Fraction:
    return min(max(value, Fraction(low)), Fraction(high))


def explain_text(description: str, aggregate: AggregateRelease, statistics: Sequence[str]) -> str:
    """explain's line: what is released, from which statistics, and the epsilon split."""
    parts = [f"{KINDS[s]} {name}" for s, name in zip([*statistics, "n"], aggregate.measures)]
    return (f"{description} from {', '.join(parts)} over the pairs where both arguments are non-NULL "
            f"(each argument clamped, on its own grid, centred on its bounds' midpoint); its epsilon is "
            f"split equally between these {len(parts)} measures")
