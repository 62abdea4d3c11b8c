"""Second moments of pairs, shared by COVAR_* (``covariance``), CORR (``correlation``) and REGR_*
(``regression``): their classification, measures, noisy statistics and error bounds.

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
only brings them closer to the truth, which lies there), and

    cov = Sxy'/n' - m_x m_y,   var_x = Sxx'/n' - m_x^2   (clamped into [-s_x s_y, s_x s_y], [0, s_x^2]).

Error bounds (``Errors``): with probability 1 - alpha every measure's noise is within its own
(1 - alpha/m) interval, m the number of measures (a union bound). Then, as for AVG, a ratio
S'/n' with |S/n| <= R is within (h_S + R h_n) / n' of S/n (exactly (e_S - (S/n) e_n) / n'); a
product of clamped means m_x' m_y' within s_y e_x + s_x e_y of m_x m_y; a mean's square within
2 s e. So cov is within e_xy + s_y e_x + s_x e_y and var within e_xx + 2 s_x e_x of the truth
(the truth of the clamped, bounded data: bias from clamping is not part of it). Each family
turns these boxes into an interval of its value by the worst case of its formula over them.

Under the per-unit model (``unit_pair_shapes``: both arguments have ``BOUNDS PER UNIT``) the
statistics are *uncentred* (sums of v, v^2 and v_x v_y), each unit's per-group total clamped: Sx and
Sy into the arguments' bounds per unit [lo, hi], Sxx and Syy into [0, B] with B = max(|lo|, |hi|) *
max(|L|, |U|) (a unit's sum of squares is at most its largest |value| times its sum of |values|),
Sxy into ±sqrt(Bxx Byy) rounded outward (Cauchy-Schwarz). Any clamp is private; these only keep
the clamps' bias small. ``moments`` converts them exactly to the centred statistics above
(c = 2v - M, M = L + U: sum c = 2 Sv - M n, sum c^2 = 4 Svv - 4 M Sv + M^2 n, sum c_x c_y = 4 Sxy -
2 M_x Sy - 2 M_y Sx + M_x M_y n) and ``errors`` their noise bounds by the triangle inequality.
Intervals (``dpsql.analysis.aggregates.intervals``): each mean S/n is found by inverting the
exact test of its pivot S' - r n' (the two noises convolved), the k means a family reads
together by a union bound (each at alpha / k), and the family's value over that box of means by
its exact range (the truth of the clamped, bounded data: bias from clamping is not part of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.exact import noise_half_width
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


def centred_widths(widths: dict[str, int], h_n: int, scale: "Scale") -> dict[str, int]:
    """Noise bounds of ``centred_statistics``' values, when each uncentred statistic's noise is
    within ``widths`` and the count's within ``h_n`` (the triangle inequality)."""
    m_x, m_y = abs(scale.lower_x + scale.upper_x), abs(scale.lower_y + scale.upper_y)
    h_x, h_y = widths["x"], widths["y"]
    converted = {"x": 2 * h_x + m_x * h_n, "y": 2 * h_y + m_y * h_n}
    if "xy" in widths:
        converted["xy"] = 4 * widths["xy"] + 2 * m_x * h_y + 2 * m_y * h_x + m_x * m_y * h_n
    if "xx" in widths:
        converted["xx"] = 4 * widths["xx"] + 4 * m_x * h_x + m_x * m_x * h_n
    if "yy" in widths:
        converted["yy"] = 4 * widths["yy"] + 4 * m_y * h_y + m_y * m_y * h_n
    return converted


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


@dataclass(frozen=True)
class Errors:
    """One row's error bounds, in centred units, holding together with probability 1 - alpha."""

    mean_x: Fraction
    mean_y: Fraction
    cov: Fraction
    var_x: Fraction
    var_y: Fraction
    count: int
    """The count of pairs' noise bound h_n: the true count lies in [n - h_n, n + h_n]."""


def errors(measures: Sequence[Measure], statistics: Sequence[str], n: int, alpha: float) -> Errors:
    """The module docstring's bounds for a row whose noisy count of pairs is ``n`` (> 0), each
    measure at alpha / m."""
    scale = scale_of(measures)
    sx, sy = scale.spread_x, scale.spread_y
    share = alpha / len(measures)
    widths = {statistic: noise_half_width(m, share) for statistic, m in zip(statistics, measures)}
    h_n = noise_half_width(measures[len(statistics)], share)
    if uncentred(measures):
        widths = centred_widths(widths, h_n, scale)
    largest = {"x": sx, "y": sy, "xy": sx * sy, "xx": sx * sx, "yy": sy * sy}

    def ratio(statistic: str) -> Fraction:
        if statistic not in widths:
            return Fraction(0)
        return Fraction(widths[statistic] + largest[statistic] * h_n, n)

    e_x, e_y = ratio("x"), ratio("y")
    return Errors(e_x, e_y, ratio("xy") + sy * e_x + sx * e_y, ratio("xx") + 2 * sx * e_x,
                  ratio("yy") + 2 * sy * e_y, h_n)


def box(value: Fraction | None, error: Fraction, low: Fraction, high: Fraction) -> tuple[Fraction, Fraction]:
    """value ± error, within [low, high] (where the truth lies)."""
    assert value is not None
    return max(value - error, low), min(value + error, high)


def quotient_range(numerator: tuple[Fraction, Fraction],
                   denominator: tuple[Fraction, Fraction]) -> tuple[Fraction, Fraction] | None:
    """The range of a / b over a in ``numerator`` and b in ``denominator`` (b >= 0): the worst
    case at the corners (a / b is monotone in each) when b > 0 throughout; None (unbounded) else."""
    if denominator[0] <= 0:
        return None
    corners = [a / b for a in numerator for b in denominator]
    return min(corners), max(corners)


def correlation_range(row: Moments, error: Errors, scale: Scale) -> tuple[float, float]:
    """Where cov / sqrt(var_x var_y) lies when cov, var_x and var_y lie in their boxes: the corners
    of cov / d with d in [sqrt(low_x low_y), sqrt(high_x high_y)] (square roots rounded outward),
    cut to [-1, 1]; [-1, 1] when a variance may be 0."""
    sx, sy = scale.spread_x, scale.spread_y
    cov = box(row.cov, error.cov, Fraction(-sx * sy), Fraction(sx * sy))
    var_x = box(row.var_x, error.var_x, Fraction(0), Fraction(sx * sx))
    var_y = box(row.var_y, error.var_y, Fraction(0), Fraction(sy * sy))
    low, high = var_x[0] * var_y[0], var_x[1] * var_y[1]
    if low <= 0:
        return -1.0, 1.0
    roots = (Fraction(math.nextafter(math.sqrt(low), 0)), Fraction(math.nextafter(math.sqrt(high), math.inf)))
    ends = quotient_range(cov, roots)
    assert ends is not None
    return max(float(ends[0]) - _ROUNDING, -1.0), min(float(ends[1]) + _ROUNDING, 1.0)


_ROUNDING = 1e-12
"""Slack for the float square roots and conversions of ``correlation_range`` (values in [-1, 1])."""


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
