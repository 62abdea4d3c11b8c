"""Stage 4, analyse: a checked query and the privacy options become a plan of bounded measures.

Every aggregate becomes one or two *measures* — bounded integer sums (see
``dpsql.sensitivity``) — with exact integer per-row bounds on a fixed grid, a sensitivity,
a share of epsilon and delta, and a noise scale:

* ``COUNT(*)`` / ``COUNT(expr)``: sum of 1 per row / per non-NULL value, bounds [0, 1].
* ``SUM(expr)``: the expression's range (``dpsql.ranges``) on a power-of-two grid ``g``:
  per-row integer values in [floor(lo/g), ceil(hi/g)]; the release is (noisy integer) * g,
  so released reals always lie on the grid, whatever the data.
* ``AVG(expr)``: a *centred* sum of 2v - (L + U) (range [-(U - L), U - L], half the
  sensitivity of a plain sum when the bounds are one-signed) and a count of the same non-NULL
  values; released as the ratio, clamped into [lo, hi].

The query's epsilon (and delta, for Gaussian noise) is split equally between the measures;
basic composition makes the query (sum of shares)-DP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

from .calibrate import gaussian_sigma_squared, laplace_scale
from .errors import InternalError, UnsupportedQuery
from .model import Policy
from .parse import node_position
from .plan import Aggregate, ClampedColumn, Measure, OutputColumn, Plan, PrivateQuery
from .ranges import Interval, derive_range, is_integral_type
from .sensitivity import bounded_sum_sensitivity

FINE_BITS = 40
"""Grid resolution below the largest bound: per-row rounding error at most 2**-41 of it."""
MAX_SCALE_BITS = 36
"""Noise scales in grid units stay below 2**36: the exact samplers need moderate integers."""


@dataclass(frozen=True)
class PrivacyOptions:
    """What the caller asked a query to spend."""

    epsilon: Fraction
    """Total epsilon of the query."""
    delta: Fraction = Fraction(0)
    """Total delta of the query (used only by Gaussian noise)."""
    noise: str = "laplace"
    """'laplace' or 'gaussian' (Gaussian needs delta > 0)."""


def analyse_query(query: PrivateQuery, policy: Policy, options: PrivacyOptions, sql: str = "") -> Plan:
    """Build the plan: measures, outputs, sensitivities, epsilon split and noise scales."""
    shapes, outputs = _measure_shapes(query, sql)
    gaussian = options.noise == "gaussian"
    if gaussian and options.delta <= 0:
        raise UnsupportedQuery("Gaussian noise needs delta > 0", hint="pass delta=1e-7 or use Laplace noise")
    count = len(shapes)
    epsilon_share = options.epsilon / count
    delta_share = options.delta / count if gaussian else Fraction(0)
    measures = tuple(
        _finish_measure(shape, query, policy, epsilon_share, delta_share, gaussian) for shape in shapes
    )
    return Plan(
        query=query,
        measures=measures,
        outputs=tuple(outputs),
        epsilon=epsilon_share * count,
        delta=delta_share * count,
        neighbours=policy.neighbours,
    )


@dataclass(frozen=True)
class _Shape:
    """A measure before its budget share is known."""

    name: str
    kind: str
    argument: exp.Expression | None
    interval: Interval | None
    clamped: tuple[ClampedColumn, ...]
    centred: bool
    counts_values_of: str | None = None


def _measure_shapes(query: PrivateQuery, sql: str) -> tuple[list[_Shape], list[OutputColumn]]:
    shapes: list[_Shape] = []
    outputs: list[OutputColumn] = []

    def add(**fields) -> str:
        name = f"m{len(shapes)}"
        shapes.append(_Shape(name=name, **fields))
        return name

    for output_name, kind, index in query.outputs:
        if kind == "key":
            outputs.append(OutputColumn(output_name, "key", key_index=index))
            continue
        aggregate: Aggregate = query.aggregates[index]
        if aggregate.function == "count":
            name = add(kind="count", argument=aggregate.argument, interval=None, clamped=(), centred=False)
            outputs.append(OutputColumn(output_name, "count", (name,)))
            continue
        interval = derive_range(aggregate.argument, _column_bounds(query), sql)
        if interval is None:
            line, col = node_position(aggregate.argument, sql)
            raise UnsupportedQuery(f"{aggregate.function.upper()} of an expression that is always NULL",
                                   line=line, col=col, hint="sum a column or an expression over columns")
        clamped = _clamped_columns(aggregate.argument, query)
        centred = aggregate.function == "avg"
        total = add(kind="sum", argument=aggregate.argument, interval=interval, clamped=clamped, centred=centred)
        if aggregate.function == "sum":
            outputs.append(OutputColumn(output_name, "sum", (total,)))
            continue
        count = add(kind="count", argument=aggregate.argument, interval=interval, clamped=clamped,
                    centred=False, counts_values_of=total)
        outputs.append(OutputColumn(output_name, "avg", (total, count), lower=interval.lower, upper=interval.upper))
    return shapes, outputs


def _column_bounds(query: PrivateQuery):
    def lookup(name: str) -> Interval | None:
        rule = query.rule.column(name)
        if rule is None or rule.bounds is None:
            return None
        integral = is_integral_type(query.column_type(name)) and all(
            b.denominator == 1 for b in (rule.bounds.lower, rule.bounds.upper)
        )
        return Interval(rule.bounds.lower, rule.bounds.upper, integral)

    return lookup


def _clamped_columns(argument: exp.Expression, query: PrivateQuery) -> tuple[ClampedColumn, ...]:
    names = sorted({c.name for c in argument.find_all(exp.Column)})
    clamped = []
    for name in names:
        rule = query.rule.column(name)
        if rule is None or rule.bounds is None:
            continue
        type_name = query.column_type(name).upper()
        clamped.append(ClampedColumn(name, rule.bounds.lower, rule.bounds.upper,
                                     floating=type_name in ("FLOAT", "REAL", "DOUBLE", "FLOAT4", "FLOAT8")))
    return tuple(clamped)


def choose_grid(interval: Interval, rows_per_unit: int, epsilon: Fraction) -> Fraction:
    """The power-of-two grid a sum is computed and released on; depends on the policy only.

    Fine enough that rounding each row moves it by at most 2**-41 of the largest bound, and
    coarse enough that the noise scale in grid units stays below 2**36. Integer-valued
    expressions keep a grid of 1 unless the noise would be that large.

    >>> choose_grid(Interval(Fraction(0), Fraction(500), True), 10, Fraction(1, 10))
    Fraction(1, 1)
    >>> choose_grid(Interval(Fraction(0), Fraction(1), False), 1, Fraction(1))
    Fraction(1, 4294967296)
    """
    magnitude = max(abs(interval.lower), abs(interval.upper), Fraction(1, 2**1000))
    exponent = math.floor(math.log2(magnitude)) - FINE_BITS
    if interval.integral:
        exponent = max(exponent, 0)
    noise_magnitude = 16 * rows_per_unit * magnitude / epsilon  # above any scale we calibrate
    exponent = max(exponent, math.ceil(math.log2(noise_magnitude)) - MAX_SCALE_BITS)
    return Fraction(2) ** exponent


def _finish_measure(shape: _Shape, query: PrivateQuery, policy: Policy, epsilon: Fraction,
                    delta: Fraction, gaussian: bool) -> Measure:
    rows_per_unit = query.rule.max_rows_per_unit
    if shape.kind == "count" and shape.interval is None:
        return _calibrated(shape, query, policy, Fraction(1), epsilon, delta, gaussian)
    grid = choose_grid(shape.interval, rows_per_unit, epsilon)
    while True:  # coarsen the grid until the sampler's integers stay moderate
        measure = _calibrated(shape, query, policy, grid, epsilon, delta, gaussian)
        if measure.noise == "none" or measure.scale < SAMPLER_LIMITS[measure.noise]:
            return measure
        grid *= 2


SAMPLER_LIMITS = {"laplace": Fraction(2) ** 38, "gaussian": Fraction(2) ** 52}
"""Largest Laplace scale / Gaussian sigma^2 (grid units) handed to the exact samplers."""


def _calibrated(shape: _Shape, query: PrivateQuery, policy: Policy, grid: Fraction, epsilon: Fraction,
                delta: Fraction, gaussian: bool) -> Measure:
    rows_per_unit = query.rule.max_rows_per_unit
    if shape.interval is None:
        lower, upper = 0, 1
    else:
        lower = math.floor(shape.interval.lower / grid)
        upper = math.ceil(shape.interval.upper / grid)
        if max(abs(lower), abs(upper)) >= 2**62:
            raise InternalError("grid bounds overflow 64-bit integers")
    if shape.kind == "count":
        value_lower, value_upper = 0, 1
    elif shape.centred:
        value_lower, value_upper = -(upper - lower), upper - lower
    else:
        value_lower, value_upper = lower, upper
    sensitivity = bounded_sum_sensitivity(
        value_lower, value_upper, rows_per_unit=rows_per_unit,
        neighbours=policy.neighbours, grouped=bool(query.keys),
    )
    if sensitivity.l1 == 0:
        scale, noise = Fraction(1), "none"  # a measure nobody can move needs no noise
    elif gaussian:
        scale, noise = gaussian_sigma_squared(sensitivity.l2_squared, epsilon, delta), "gaussian"
    else:
        scale, noise = laplace_scale(sensitivity.l1, epsilon), "laplace"
    return Measure(
        name=shape.name,
        kind=shape.kind,
        argument=shape.argument,
        clamped_columns=shape.clamped,
        grid=grid,
        lower=lower,
        upper=upper,
        centred=shape.centred,
        sensitivity=sensitivity,
        epsilon=epsilon,
        delta=delta,
        noise=noise,
        scale=scale,
        counts_values_of=shape.counts_values_of,
    )
