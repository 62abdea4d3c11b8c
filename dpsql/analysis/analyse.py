"""Stage 4, analyse: a checked query and the privacy options become a plan of bounded measures.

Every aggregate becomes one or two *measures* — bounded integer sums (see
``dpsql.analysis.sensitivity``) — with exact integer per-row bounds on a fixed grid, a sensitivity,
a share of epsilon and delta, and a noise scale:

Which measures an aggregate needs is its family's to say (``dpsql.analysis.aggregates``:
a count of 0/1 row values, a sum on a power-of-two grid, a centred sum and a count for AVG,
three measures for VARIANCE, a histogram for a quantile); this stage derives the argument's
range, chooses the grids and calibrates every measure's noise.

An aggregate whose family has a per-unit form (``unit_shapes``: a bound per unit from the policy's
``BOUNDS PER UNIT`` or the call's ``contribution_bounds_per_group``) is calibrated both ways and
answered by the per-unit form where that lowers its noise (``_per_unit_if_better``): its measures
then clamp each unit's per-group total, and their sensitivity is the smaller of the rows rule and
``unit_total_sensitivity`` (``_per_unit_rule``).

The query's epsilon is split between its aggregates by weight (equal by default), and
each aggregate's share equally between its measures; partition selection, when a GROUP BY
key has no public domain, takes one more share and the delta. Basic composition makes the
query (sum of shares, sum of deltas)-DP, and a self-check refuses a plan that would spend
more than was asked.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from dpsql.analysis.aggregates.family import Ranged, Shape
from dpsql.analysis.aggregates.registry import family_of
from dpsql.analysis.plan import (
    Aggregate,
    AggregateRelease,
    ClampedColumn,
    Factor,
    Measure,
    Plan,
    PrivateQuery,
    Selection,
)
from dpsql.analysis.ranges import Interval, derive_range
from dpsql.analysis.sensitivity import (
    Sensitivity,
    bounded_sum_sensitivity,
    distinct_units_sensitivity,
    unit_total_sensitivity,
)
from dpsql.errors import (
    InternalError,
    InvalidParameter,
    UnsupportedQuery,
    surface_hints,
)
from dpsql.mechanisms.calibrate import gaussian_sigma_squared, laplace_scale
from dpsql.mechanisms.quantile import quantile_rule
from dpsql.mechanisms.selection import selection_rule
from dpsql.policy.model import Policy
from dpsql.sql.types import inward, reads_as_integer

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
    """Total delta of the query (Gaussian noise and partition selection use it)."""
    noise: str = "laplace"
    """'laplace' or 'gaussian' (Gaussian needs delta > 0)."""
    weights: tuple[tuple[str, Fraction], ...] = ()
    """Relative epsilon shares by aggregate (output name or as written); 1 when not named."""


def analyse_query(query: PrivateQuery, policy: Policy, options: PrivacyOptions) -> Plan:
    """Build the plan: measures, sensitivities, epsilon split, noise scales, partition selection.
    A refusal carries its node; the caller that holds the SQL text locates it (``prepare``)."""
    gaussian = options.noise == "gaussian"
    if gaussian and options.delta <= 0:
        raise UnsupportedQuery("Gaussian noise needs delta > 0",
                               **surface_hints("{delta}, or use Laplace noise", delta="1e-7"))
    private_keys = [k for k in query.keys if k.domain is None]
    if private_keys and options.delta <= 0:
        raise UnsupportedQuery(
            f"GROUP BY {private_keys[0].expression.sql(dialect='duckdb')} has no public KEYS domain, and "
            "without delta its keys cannot be released (which keys exist is private)",
            node=private_keys[0].expression,
            **surface_hints("declare the column's domain with KEYS in the policy, or {delta} (any delta > 0) "
                            "so keys can pass partition selection", delta="1e-7"),
        )
    weights = _weights(query, options)
    shares = sum(weights.values()) + (1 if private_keys else 0)
    selection_delta = options.delta if private_keys and not gaussian else options.delta / 2 if private_keys else 0
    measure_delta = options.delta - selection_delta if gaussian else Fraction(0)

    measures: list[Measure] = []
    releases: list[AggregateRelease] = []
    for aggregate in query.aggregates:
        epsilon = options.epsilon * weights[aggregate.name] / shares
        shapes, release = _shapes_of(aggregate, query, start=len(measures))
        _check_double_range(aggregate, shapes)
        gaussian_here = gaussian and measure_delta > 0
        count = len(shapes)
        measure_share = measure_delta * weights[aggregate.name] / sum(weights.values()) if gaussian_here else 0
        if shapes[0].kind == "histogram":  # chosen by the exponential mechanism, not noised
            assert release.quantile is not None
            measure, rule = _histogram(shapes[0], query, policy, epsilon, release.quantile)
            _check_grid_exponent(aggregate, measure)
            measures.append(measure)
            releases.append(replace(release, epsilon=epsilon, rule=rule))
            continue
        finished = _finish_aggregate(shapes, query, policy, epsilon / count, Fraction(measure_share) / count,
                                     gaussian_here)
        finished, release = _per_unit_if_better(aggregate, query, policy, finished, release, start=len(measures),
                                                epsilon=epsilon, delta=Fraction(measure_share), gaussian=gaussian_here)
        _check_grid_fits(aggregate, finished)
        measures.extend(finished)
        releases.append(replace(release, epsilon=epsilon))
    selection = None
    if private_keys:
        selection_scale = laplace_scale(Fraction(2 * query.rule.groups_per_unit), options.epsilon / shares)
        if selection_scale >= SAMPLER_LIMITS["laplace"]:
            _too_small(options.epsilon)  # the selection noise would be beyond the exact sampler
        rule = selection_rule(options.epsilon / shares, Fraction(selection_delta),
                              query.rule.groups_per_unit, policy.neighbours)
        selection = Selection(measure="u", epsilon=rule.epsilon, delta=rule.delta,
                              scale=rule.scale, threshold=rule.threshold)
    epsilon = sum((m.epsilon for m in measures), Fraction(0)) + (selection.epsilon if selection else 0)
    delta = sum((m.delta for m in measures), Fraction(0)) + (selection.delta if selection else 0)
    if epsilon > options.epsilon or delta > options.delta:
        raise InternalError("the plan would spend more than was asked")  # Tumult's self-check
    return Plan(query=query, measures=tuple(measures), aggregates=tuple(releases), selection=selection,
                epsilon=epsilon, delta=delta, neighbours=policy.neighbours)


def _weights(query: PrivateQuery, options: PrivacyOptions) -> dict[str, Fraction]:
    named = {name.lower(): Fraction(weight) for name, weight in options.weights}
    by_output = {aggregate: output.lower() for output, aggregate in query.direct}
    weights = {}
    for aggregate in query.aggregates:
        keys = (aggregate.label.lower(), by_output.get(aggregate.name, ""))
        weight = next((named[k] for k in keys if k in named), Fraction(1))
        if weight <= 0:
            raise InvalidParameter(f"the weight of {aggregate.label} must be positive, got {weight}",
                                   hint="give every aggregate a positive weight")
        weights[aggregate.name] = weight
    unknown = set(named) - {a.label.lower() for a in query.aggregates} - set(by_output.values())
    if unknown:
        raise InvalidParameter(f"weights name no aggregate of the query: {', '.join(sorted(unknown))}",
                               hint="name an aggregate by its output name or as written, e.g. 'count_star()'")
    return weights


QUANTILE_BUCKETS = 1024
"""Candidates of a DP quantile: the edges of this many equal buckets between the bounds."""


def _histogram(shape, query: PrivateQuery, policy: Policy, epsilon: Fraction, q: float):
    """A quantile's bucket-count measure and its exponential-mechanism rule.

    One unit puts at most k values into a group's histogram and, over all groups, at most k
    in total (the rows it is granted), so with Delta_u computed for k the releases of all
    groups together are epsilon-DP (``dpsql.mechanisms.quantile``)."""
    rows = query.rule.max_rows_per_unit
    interval = shape.interval
    rule = quantile_rule(q, epsilon, rows, policy.neighbours, interval.lower, interval.upper, QUANTILE_BUCKETS)
    width = (interval.upper - interval.lower) / QUANTILE_BUCKETS
    measure = Measure(
        name=shape.name, kind="histogram", argument=shape.argument, clamped_columns=shape.clamped,
        grid=width, lower=0, upper=QUANTILE_BUCKETS - 1, centred=False,
        sensitivity=Sensitivity(rule.utility_sensitivity, rule.utility_sensitivity ** 2),
        epsilon=epsilon, delta=Fraction(0), noise="exponential", scale=rule.utility_sensitivity,
        offset=interval.lower,
    )
    return measure, rule


def _shapes_of(aggregate: Aggregate, query: PrivateQuery, start: int) -> tuple[list[Shape], AggregateRelease]:
    """The measures an aggregate needs, and how its value is released from them (its family's
    ``shapes``), after deriving the range of a ranged family's argument."""
    family = family_of(aggregate)
    names = [f"m{start + i}" for i in range(family.measure_count)]
    if not family.ranged:
        return family.shapes(aggregate, names, None, ())
    assert aggregate.argument is not None  # every ranged family refuses F(*)
    if family.arity == 2:
        assert aggregate.other is not None  # a two-argument family's classify names both
        return family.pair_shapes(aggregate, names, _ranged(aggregate, aggregate.argument, query),
                                  _ranged(aggregate, aggregate.other, query))
    first = _ranged(aggregate, aggregate.argument, query)
    return family.shapes(aggregate, names, first.interval, first.clamped)


def _ranged(aggregate: Aggregate, argument: exp.Expression, query: PrivateQuery) -> Ranged:
    """An argument of a ranged family with its range and clamps (and the policy's bound per unit
    of a column aggregated as it is); refuses one that is always NULL."""
    interval = derive_range(argument, _ColumnBounds(query))
    if interval is None:
        raise UnsupportedQuery(f"{aggregate.label} aggregates an expression that is always NULL",
                               node=argument, hint="aggregate a column or an expression over columns")
    return Ranged(argument, interval, _clamped_columns(argument, query), _unit_bounds_of(argument, query))


def _unit_bounds_of(argument: exp.Expression, query: PrivateQuery) -> tuple[Fraction, Fraction] | None:
    """The policy's ``BOUNDS PER UNIT`` of a column aggregated as it is (or under FILTER, which only
    leaves values out): what one unit's total of it in one group is clamped into under the
    per-unit model. Any clamp is private (the sensitivity is the clamp's); the policy's bound
    only keeps its bias small, which an expression over the column could not promise."""
    if isinstance(argument, exp.Case) and len(argument.args.get("ifs") or []) == 1 \
            and argument.args.get("default") is None:
        argument = argument.args["ifs"][0].args["true"]
    if not isinstance(argument, exp.Column):
        return None
    rule = query.rule.column(argument.name)
    if rule is None or rule.unit_bounds is None:
        return None
    return rule.unit_bounds.lower, rule.unit_bounds.upper


def _per_unit_if_better(aggregate: Aggregate, query: PrivateQuery, policy: Policy, finished: list[Measure],
                        release: AggregateRelease, *, start: int, epsilon: Fraction, delta: Fraction,
                        gaussian: bool) -> tuple[list[Measure], AggregateRelease]:
    """The aggregate's measures and release under the per-unit contribution model when its family
    has one for the call and it lowers the noise (``_lowers_noise``), or when the call is only
    defined under it; else the rows model's, unchanged."""
    family = family_of(aggregate)
    candidate = _unit_shapes_of(aggregate, query, family, start)
    if candidate is None:
        if family.required_unit_model(aggregate):
            raise InternalError(f"{aggregate.label} needs the per-unit model and has no per-unit measures")
        return finished, release
    shapes, unit_release = candidate
    required = family.required_unit_model(aggregate)
    count = len(shapes)
    try:
        _check_double_range(aggregate, shapes)
        unit = _finish_aggregate(shapes, query, policy, epsilon / count, delta / count, gaussian)
        _check_grid_fits(aggregate, unit)
    except (InvalidParameter, UnsupportedQuery):
        if required:  # the call's own estimand: its refusal is the answer
            raise
        return finished, release  # the per-unit form cannot be computed here: the rows model answers
    if required or _lowers_noise(unit, finished):
        return unit, unit_release
    return finished, release


def _unit_shapes_of(aggregate: Aggregate, query: PrivateQuery, family,
                    start: int) -> tuple[list[Shape], AggregateRelease] | None:
    if not family.ranged or aggregate.argument is None:
        return None
    names = [f"m{start + i}" for i in range(family.measure_count)]
    if family.arity == 2:
        assert aggregate.other is not None  # a two-argument family's classify names both
        return family.unit_pair_shapes(aggregate, names, _ranged(aggregate, aggregate.argument, query),
                                       _ranged(aggregate, aggregate.other, query))
    return family.unit_shapes(aggregate, names, [_ranged(aggregate, aggregate.argument, query)])


def _noise_in_value_units(measure: Measure) -> Fraction:
    """A measure's noise scale in its values' own units, squared (Laplace: scale^2; Gaussian:
    sigma^2), so that two forms of one statistic compare: one step of a centred sum is worth half
    a grid step."""
    worth = measure.grid / 2 if measure.centred else measure.grid
    worth = worth * worth if measure.squared else worth
    spread = measure.scale ** 2 if measure.noise == "laplace" else measure.scale
    return spread * worth * worth


def _lowers_noise(unit: list[Measure], rows: list[Measure]) -> bool:
    """The per-unit form is used when every measure it clamps per unit kept that clamp (its rule
    was the lower one) and the noise of those measures, in their values' units, is below the rows
    form's measures at the same places (the statistic each estimates is the same)."""
    clamped = [i for i, shape in enumerate(unit) if shape.kind == "sum"]
    if not clamped or any(unit[i].unit_bounds is None for i in clamped):
        return False
    return sum(_noise_in_value_units(unit[i]) for i in clamped) < sum(_noise_in_value_units(rows[i]) for i in clamped)


class _ColumnBounds:
    """The policy bounds of the query's columns, as ``dpsql.analysis.ranges`` reads them."""

    def __init__(self, query: PrivateQuery):
        self._query = query
        self.column_type = query.column_type  # BOOLEAN casts are bounded by [0, 1]; refusals name the type

    def __call__(self, name: str) -> Interval | None:
        rule = self._query.rule.column(name)
        if rule is None or rule.bounds is None:
            return None
        integral = reads_as_integer(self._query.column_type(name)) and all(
            b.denominator == 1 for b in (rule.bounds.lower, rule.bounds.upper)
        )
        return Interval(rule.bounds.lower, rule.bounds.upper, integral)

    def integral_column(self, name: str) -> bool:
        """For a CLAMPed sum's grid."""
        return reads_as_integer(self._query.column_type(name))


def _clamped_columns(argument: exp.Expression, query: PrivateQuery) -> tuple[ClampedColumn, ...]:
    names = sorted({c.name for c in argument.find_all(exp.Column)})
    clamped = []
    for name in names:
        rule = query.rule.column(name)
        if rule is None or rule.bounds is None:
            continue
        type_name = query.column_type(name).upper()
        # Rounded inward onto the column's own values (``dpsql.sql.types.inward``): still within
        # the declared bounds, and a clamp literal of the column's scale cannot overflow it.
        lower, upper = inward(rule.bounds.lower, rule.bounds.upper, type_name)
        clamped.append(ClampedColumn(name, lower, upper,
                                     floating=type_name in ("FLOAT", "REAL", "DOUBLE", "FLOAT4", "FLOAT8"),
                                     double=type_name in ("DOUBLE", "FLOAT8")))
    return tuple(clamped)


def choose_grid(interval: Interval, rows_per_unit: int, epsilon: Fraction, fine_bits: int = FINE_BITS) -> Fraction:
    """The power-of-two grid a sum is computed and released on; depends on the policy only.

    Fine enough that rounding each row moves it by at most 2**-(fine_bits+1) of the largest
    bound, and coarse enough that the noise scale in grid units stays below 2**36.
    Integer-valued expressions keep a grid of 1 unless the noise would be that large.

    >>> choose_grid(Interval(Fraction(0), Fraction(500), True), 10, Fraction(1, 10))
    Fraction(1, 1)
    >>> choose_grid(Interval(Fraction(0), Fraction(1), False), 1, Fraction(1))
    Fraction(1, 4294967296)
    """
    magnitude = max(abs(interval.lower), abs(interval.upper), Fraction(1, 2**1000))
    exponent = floor_log2(magnitude) - fine_bits
    if interval.integral:
        exponent = max(exponent, 0)
    noise_magnitude = 16 * rows_per_unit * magnitude / epsilon  # above any scale we calibrate
    above = floor_log2(noise_magnitude)
    above += Fraction(2) ** above != noise_magnitude  # ceil(log2(noise_magnitude)), exactly
    exponent = max(exponent, above - MAX_SCALE_BITS)
    return Fraction(2) ** exponent


def floor_log2(value: Fraction) -> int:
    """floor(log2(value)) of a positive Fraction, exactly: no float, so no overflow for the
    largest bounds a policy or a public column can state.

    >>> floor_log2(Fraction(1, 3)), floor_log2(Fraction(4)), floor_log2(Fraction(10) ** 400)
    (-2, 2, 1328)
    """
    numerator, denominator = value.numerator, value.denominator
    exponent = numerator.bit_length() - denominator.bit_length()
    if (numerator << max(-exponent, 0)) < (denominator << max(exponent, 0)):
        exponent -= 1
    return exponent


SAMPLER_LIMITS = {"laplace": Fraction(2) ** 38, "gaussian": Fraction(2) ** 52, "none": Fraction(2) ** 1000}
"""Largest Laplace scale / Gaussian sigma^2 (grid units) handed to the exact samplers."""


def _finish_aggregate(shapes: list[Shape], query: PrivateQuery, policy: Policy, epsilon: Fraction,
                      delta: Fraction, gaussian: bool) -> list[Measure]:
    """Calibrate an aggregate's measures on one shared grid, coarsened until all fit the samplers."""
    if any(s.factors for s in shapes):
        return _finish_products(shapes, query, policy, epsilon, delta, gaussian)
    valued = next((s for s in shapes if s.interval is not None), None)
    if valued is None or valued.interval is None:
        measures = [_calibrated(s, query, policy, Fraction(1), epsilon, delta, gaussian) for s in shapes]
        if any(m.scale >= SAMPLER_LIMITS[m.noise] for m in measures):
            _too_small(epsilon)
        return measures
    interval = valued.interval
    grid = choose_grid(interval, query.rule.max_rows_per_unit, epsilon, valued.fine_bits)
    widest = max(abs(interval.lower), abs(interval.upper), Fraction(1))
    while True:
        measures = [_calibrated(s, query, policy, grid, epsilon, delta, gaussian) for s in shapes]
        if all(m.scale < SAMPLER_LIMITS[m.noise] for m in measures):
            return measures
        if grid > 4 * widest:  # the grid is coarser than the values: only a larger epsilon helps
            _too_small(epsilon)
        grid *= 2


def _finish_products(shapes: list[Shape], query: PrivateQuery, policy: Policy, epsilon: Fraction,
                     delta: Fraction, gaussian: bool) -> list[Measure]:
    """``_finish_aggregate`` for an aggregate of product measures: each argument on a grid of its
    own (``choose_grid`` of its range), all of them coarsened together until every measure fits
    the samplers. A shape without factors (the count of pairs) is a count on the grid of 1."""
    arguments = next(s for s in shapes if s.factors).factors
    grids = [choose_grid(f.argument.interval, query.rule.max_rows_per_unit, epsilon, shapes[0].fine_bits)
             for f in arguments]
    widest = [max(abs(f.argument.interval.lower), abs(f.argument.interval.upper), Fraction(1)) for f in arguments]
    while True:
        measures = [_calibrated(s, query, policy, Fraction(1), epsilon, delta, gaussian, tuple(grids)) for s in shapes]
        if all(m.scale < SAMPLER_LIMITS[m.noise] for m in measures):
            return measures
        if all(grid > 4 * wide for grid, wide in zip(grids, widest)):
            _too_small(epsilon)  # every grid is coarser than its values: only a larger epsilon helps
        grids = [2 * grid for grid in grids]


def _factors(shape: Shape, grids: tuple[Fraction, ...]) -> tuple[tuple[Factor, ...], int, int, Fraction]:
    """A product shape's factors on their grids, and the product's interval (the least and the
    greatest of its corner products: each factor's centred value 2v - (L + U) lies in [-s, s],
    s = U - L, so its power p lies in [1, 1], [-s, s] or [0, s^2]) and grid (the product of the
    factors' half-grids to their powers: one step of 2v - (L + U) is worth grid / 2)."""
    factors, low, high, grid = [], 1, 1, Fraction(1)
    for factor, step in zip(shape.factors, grids):
        interval = factor.argument.interval
        lower, upper = math.floor(interval.lower / step), math.ceil(interval.upper / step)
        spread = upper - lower
        factors.append(Factor(factor.argument.argument, factor.argument.clamped, step, lower, upper, factor.power,
                              factor.centred))
        if factor.centred:
            ends = {0: (1, 1), 1: (-spread, spread), 2: (0, spread * spread)}[factor.power]
        else:  # v itself (the per-unit forms): v in [L, U], v^2 in [0 or the smaller square, the larger]
            squares = (lower * lower, upper * upper)
            ends = {0: (1, 1), 1: (lower, upper),
                    2: (0 if lower <= 0 <= upper else min(squares), max(squares))}[factor.power]
        corners = [a * b for a in (low, high) for b in ends]
        low, high = min(corners), max(corners)
        grid *= (step / 2 if factor.centred else step) ** factor.power
    return tuple(factors), low, high, grid


def _clamped_by(factors: tuple[Factor, ...]) -> tuple[ClampedColumn, ...]:
    """A product measure's clamped columns: its factors' (each clamps its own), listed once, for
    the limits and bias reports that read ``Measure.clamped_columns``."""
    return tuple(dict.fromkeys(column for factor in factors for column in factor.clamped_columns))


LARGEST_DOUBLE = Fraction(sys.float_info.max)
"""Row values are computed in DOUBLE: a range reaching past it would overflow to infinity."""

GRID_EXPONENTS = range(-1000, 1001)
"""Powers of two a grid may be: the rewrite scales by 1/grid as an exact DOUBLE literal."""


def _check_double_range(aggregate: Aggregate, shapes: list) -> None:
    """Refuse, before anything is charged, a VARIANCE or STDDEV whose squared values may leave
    the range of a DOUBLE (``VARIANCE(x * 1e200)``): they could not be computed, and the query
    would fail after its charge. (A plain value beyond it reads as NULL, as any failed row
    expression does; grids no DOUBLE holds are refused by ``_check_grid_exponent``.)"""
    for shape in shapes:
        interval = shape.interval
        if interval is None or not getattr(shape, "squared", False):
            continue
        widest = max(abs(interval.lower), abs(interval.upper))
        if widest == 0:
            continue
        widest = widest * widest  # VARIANCE and STDDEV square the (centred) values
        exponent = floor_log2(widest)
        if widest <= LARGEST_DOUBLE:
            continue
        raise UnsupportedQuery(
            f"{aggregate.label}: its squared values may reach about 2**{exponent}, beyond the largest "
            "DOUBLE (about 1.8e308)", node=aggregate.argument,
            construct=aggregate.label,
            hint="scale the expression into a moderate range (e.g. divide or multiply by a constant "
                 "after aggregating), or CLAMP it to smaller bounds")


def _check_grid_exponent(aggregate: Aggregate, measure: Measure | Factor) -> None:
    """The rewrite scales values by 1/grid written as an exact DOUBLE power of two: refuse a
    grid beyond that (values so large that the noise needs a coarser grid, ``SUM(x * 1e308)``
    at a small epsilon; or so small that no DOUBLE holds their rounding step, ``SUM(x * 1e-320)``)."""
    grid = measure.grid
    if grid <= 0:
        return
    exponent = floor_log2(grid)
    if exponent in GRID_EXPONENTS:
        return
    histogram = isinstance(measure, Measure) and measure.kind == "histogram"
    large = "its values are too large: their buckets would need" if histogram else \
        "its values are too large for this epsilon: the noise would need"
    why = large if exponent > 0 else "its values are too small: rounding them would need"
    raise UnsupportedQuery(
        f"{aggregate.label}: {why} a grid of about 2**{exponent}, beyond what a DOUBLE holds",
        node=aggregate.argument, construct=aggregate.label,
        hint="scale the expression into a moderate range (multiply or divide by a constant after "
             "aggregating), CLAMP it to smaller bounds"
             + (", or use a larger epsilon" if exponent > 0 and not histogram else ""))


def _check_grid_fits(aggregate: Aggregate, measures: list[Measure]) -> None:
    """Per-row values on the grid must fit BIGINT with room to spare: the rewrite scales and
    rounds them in DOUBLE and casts to BIGINT without TRY for bare columns, which is total only
    for |value / grid| < 2**62 (``dpsql.backends.rewrite._cannot_fail``). Refused here, before the charge."""
    for measure in measures:
        # A product's factors are scaled and cast one by one; its own grid only labels its steps.
        parts: tuple[Measure | Factor, ...] = (measure, *measure.factors)
        for part in parts:
            if part is not measure or not measure.factors:
                _check_grid_exponent(aggregate, part)
            if max(abs(part.lower), abs(part.upper)) >= 2**62:
                raise UnsupportedQuery(
                    f"{aggregate.label}: its bounds span {max(abs(part.lower), abs(part.upper))} steps of its "
                    f"grid {part.grid}, more than 2**62 that 64-bit integers hold", node=aggregate.argument,
                    hint="narrow the column's BOUNDS in the policy, or CLAMP the expression to a smaller range")


def _too_small(epsilon: Fraction) -> None:
    raise InvalidParameter(f"epsilon {float(epsilon):.3g} is too small for this query: its noise would be "
                           "beyond what the exact samplers draw", hint="use a larger epsilon, e.g. 0.001 or more")


def _rows_per_unit(shape: Shape, query: PrivateQuery) -> int:
    """How many groups one unit's distinct-unit counts can touch."""
    return min(query.rule.groups_per_unit, query.rule.max_rows_per_unit) if query.keys else 1


def _calibrated(shape: Shape, query: PrivateQuery, policy: Policy, grid: Fraction, epsilon: Fraction,
                delta: Fraction, gaussian: bool, grids: tuple[Fraction, ...] = ()) -> Measure:
    factors: tuple[Factor, ...] = ()
    if shape.factors:  # a product measure: a plain sum of row values in the product's interval
        factors, lower, upper, grid = _factors(shape, grids)
    elif shape.interval is None:
        lower, upper = 0, 1
    else:
        lower = math.floor(shape.interval.lower / grid)
        upper = math.ceil(shape.interval.upper / grid)
    spread = upper - lower
    if shape.kind in ("count", "units", "distinct"):
        value_lower, value_upper = 0, 1
    elif factors:
        value_lower, value_upper = lower, upper
    elif shape.squared:  # (2v - (L + U))^2, or v^2 uncentred (the per-unit forms)
        value_lower, value_upper = 0, spread * spread if shape.centred else max(lower * lower, upper * upper)
    elif shape.centred:
        value_lower, value_upper = -spread, spread
    else:
        value_lower, value_upper = lower, upper
    unit_bounds = None
    if shape.kind == "units":
        sensitivity = distinct_units_sensitivity(groups_per_unit=_rows_per_unit(shape, query),
                                                 neighbours=policy.neighbours, grouped=bool(query.keys))
    else:
        sensitivity = bounded_sum_sensitivity(
            value_lower, value_upper, rows_per_unit=query.rule.max_rows_per_unit,
            neighbours=policy.neighbours, grouped=bool(query.keys),
        )
        if shape.unit_bounds is not None:
            sensitivity, unit_bounds = _per_unit_rule(shape, query, policy, grid, sensitivity, gaussian)
    noise: Literal["laplace", "gaussian", "none"]
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
        clamped_columns=_clamped_by(factors) if factors else shape.clamped,
        grid=grid,
        lower=lower,
        upper=upper,
        centred=shape.centred,
        sensitivity=sensitivity,
        epsilon=epsilon,
        delta=delta if noise == "gaussian" else Fraction(0),
        noise=noise,
        scale=scale,
        counts_values_of=shape.counts_values_of,
        squared=shape.squared,
        factors=factors,
        unit_bounds=unit_bounds,
        unit_average=shape.unit_average and unit_bounds is not None,
    )


def _per_unit_rule(shape: Shape, query: PrivateQuery, policy: Policy, grid: Fraction, rows: Sensitivity,
                   gaussian: bool) -> tuple[Sensitivity, tuple[int, int] | None]:
    """A measure's sensitivity and per-(unit, group) clamp under the per-unit model, or the rows
    rule ``rows`` and no clamp where that model would not lower its noise.

    The clamp (``shape.unit_bounds`` on the grid, rounded outward; a total's widened to hold 0) is
    what the rewrite enforces, so the rule follows from it alone: ``unit_total_sensitivity`` with
    l = the groups one unit can touch. A total also keeps its rows' bounds (the clamp moves it
    toward 0, never past it), so the smaller of the two rules holds in each norm. A unit's average
    (BigQuery's AVG) has only the per-unit rule, and a count of units (its denominator: a unit's
    count of values clamped into [0, 1]) must keep its clamp whatever the rules say."""
    assert shape.unit_bounds is not None
    lower, upper = shape.unit_bounds
    step = Fraction(1) if shape.kind == "count" else grid * grid if shape.squared else grid
    low, high = math.floor(lower / step), math.ceil(upper / step)
    if not shape.unit_average:
        low, high = min(low, 0), max(high, 0)
    unit = unit_total_sensitivity(low, high, groups_per_unit=_rows_per_unit(shape, query),
                                  neighbours=policy.neighbours, grouped=bool(query.keys))
    if shape.unit_average:
        return unit, (low, high)
    smaller = Sensitivity(min(unit.l1, rows.l1), min(unit.l2_squared, rows.l2_squared))
    if shape.kind == "count":
        return smaller, (low, high)
    lowers = unit.l2_squared < rows.l2_squared if gaussian else unit.l1 < rows.l1
    return (smaller, (low, high)) if lowers else (rows, None)
