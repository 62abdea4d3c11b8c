"""The contract an aggregate family implements, and the hand-offs its stages share.

A family is one module of this package with one ``AggregateFamily`` subclass: it says which
calls it accepts, what measures they need, how their values are released from the noisy
measures, how accurate those values are, how explain describes them and how the shell offers
them. The stages (check, analyse, release, accuracy, explain, completion) find a family through
``dpsql.analysis.aggregates.registry`` and never switch on an aggregate's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, ClassVar, Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.exact import noise_half_width
from dpsql.analysis.plan import Aggregate, AggregateRelease, ClampedColumn, Measure, MeasureKind, Release
from dpsql.analysis.ranges import Interval


@dataclass(frozen=True)
class Call:
    """One aggregate call being classified, with what the query around it says."""

    name: str
    """Its column in the noisy core result (a0, a1, ...)."""
    label: str
    """How the analyst wrote it (FILTER included), for explain and output names."""
    condition: exp.Expression | None
    """The FILTER (WHERE ...) condition, already checked as row-level; None without FILTER."""
    unit: str | None
    """The privacy unit column (lower case), when the relation has one the analyst can name."""


@dataclass(frozen=True)
class Ranged:
    """An argument of a ranged family with what analyse derived of it."""

    argument: exp.Expression
    """The row-level argument (bound, unclamped)."""
    interval: Interval
    """The range of its values."""
    clamped: tuple[ClampedColumn, ...]
    """Columns of it clamped into their bounds before it is evaluated."""
    unit_bounds: tuple[Fraction, Fraction] | None = None
    """The policy's ``BOUNDS PER UNIT`` of the argument (a bounded column, alone or under FILTER):
    what one unit's total of it in one group is clamped into under the per-unit model."""


@dataclass(frozen=True)
class FactorShape:
    """One factor of a product measure before its grid is known (``dpsql.analysis.plan.Factor``)."""

    argument: Ranged
    """The argument, with its range and clamps."""
    power: int
    """0 (only pairs it: the row counts where it is non-NULL), 1 (its centred value) or 2 (squared)."""
    centred: bool = True
    """Its centred value 2v - (L + U) enters; False: v itself (``Factor.centred``)."""


@dataclass(frozen=True)
class Shape:
    """A measure before its budget share is known."""

    name: str
    """Its column in the bounded SQL (m0, m1, ...)."""
    kind: MeasureKind
    """The ``Measure.kind`` it becomes."""
    argument: exp.Expression | None
    """Row-level expression (bound, unclamped); None counts rows."""
    interval: Interval | None
    """The range of the argument's values; None for counts."""
    clamped: tuple[ClampedColumn, ...]
    """Columns of the argument clamped into their bounds before it is evaluated."""
    centred: bool = False
    """Summed as 2v - (L + U)."""
    squared: bool = False
    """The centred values are squared before summing."""
    counts_values_of: str | None = None
    """For a count paired with a sum: the sum measure whose non-NULL row values it counts."""
    fine_bits: int = 40
    """Grid resolution below the largest bound (``dpsql.analysis.analyse.choose_grid``)."""
    factors: tuple[FactorShape, ...] = ()
    """For a product measure: its factors, each on the grid of its own argument (all of one
    aggregate's product measures list the same arguments in the same order); ``interval`` is then None."""
    unit_bounds: tuple[Fraction, Fraction] | None = None
    """The per-unit contribution model: each (unit, group)'s total of the row values (in the
    argument's units; for a count, in rows) is clamped into these (``Measure.unit_bounds``)."""
    unit_average: bool = False
    """With ``unit_bounds``: each unit contributes its own average, not its total."""


NumberText = Callable[[Fraction], str]
"""How explain writes an exact number (``dpsql.answer.explain``)."""


class AggregateFamily:
    """One family of aggregate functions, end to end. Subclasses set the class attributes and
    override ``classify``, ``shapes`` and ``values``; the rest has a default that fits an
    aggregate released with additive noise."""

    functions: ClassVar[tuple[str, ...]] = ()
    """The ``Aggregate.function`` values it owns. Plans are rebuilt from stored SQL, but keep
    these names: they are part of every plan and explain text."""
    spellings: ClassVar[tuple[str, ...]] = ()
    """Its SQL function names, as shell completion offers them."""
    nodes: ClassVar[tuple[type[exp.Expression], ...]] = ()
    """The sqlglot call classes ``classify`` accepts (each owned by one family)."""
    measure_count: ClassVar[int] = 1
    """How many measures ``shapes`` names at most (analyse hands it that many fresh names; a family
    whose functions read fewer, as REGR_SLOPE beside REGR_R2, uses the first ones)."""
    ranged: ClassVar[bool] = True
    """Its argument is a bounded value: analyse derives its range before ``shapes``."""
    draws: ClassVar[bool] = False
    """Its value is chosen by the exponential mechanism (``draw``), not noised measures."""
    arity: ClassVar[int] = 1
    """How many arguments its calls take: 2 for CORR(y, x) and the other second-moment
    aggregates (``Aggregate.other`` holds the second), whose measures come from ``pair_shapes``."""
    counted: ClassVar[bool] = False
    """Its ± shrinks as the count of values it reads grows (a ratio over a noisy count: AVG,
    VARIANCE, COVAR_*): ``predicted_half_width`` states it at a given count."""

    def classify(self, call: exp.Expression, argument: exp.Expression | None, context: Call) -> Aggregate:
        """The aggregate ``call`` computes (``argument`` is None for ``*``); refuses what this
        family cannot make private, with ``refuse(node, message, hint)``."""
        raise NotImplementedError

    def classify_distinct(self, call: exp.Expression, values: list[exp.Expression],
                          context: Call) -> Aggregate | None:
        """The aggregate ``call(DISTINCT values...)`` computes, or None when not this family's."""
        return None

    def shapes(self, aggregate: Aggregate, names: Sequence[str], interval: Interval | None,
               clamped: tuple[ClampedColumn, ...]) -> tuple[list[Shape], AggregateRelease]:
        """The measures the aggregate needs (named from ``names``) and how it is released from
        them. ``interval`` and ``clamped`` are the argument's range and clamps (None and () when
        the family is not ``ranged``)."""
        raise NotImplementedError

    def pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                    second: Ranged) -> tuple[list[Shape], AggregateRelease]:
        """For a two-argument (``arity`` 2) ranged family: ``shapes`` given both arguments."""
        raise NotImplementedError

    def unit_shapes(self, aggregate: Aggregate, names: Sequence[str],
                    arguments: Sequence[Ranged]) -> tuple[list[Shape], AggregateRelease] | None:
        """The aggregate's measures under the per-unit contribution model (``Shape.unit_bounds``),
        or None when it has none (no per-unit bound known, or a family without that model).
        analyse uses them when they lower the noise (``required_unit_model``: always)."""
        return None

    def unit_pair_shapes(self, aggregate: Aggregate, names: Sequence[str], first: Ranged,
                         second: Ranged) -> tuple[list[Shape], AggregateRelease] | None:
        """For a two-argument family: ``unit_shapes`` given both arguments."""
        return None

    def required_unit_model(self, aggregate: Aggregate) -> bool:
        """The call's value is only defined under the per-unit model (BigQuery's AVG with
        ``contribution_bounds_per_group``: a mean of the units' own means)."""
        return False

    def values(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release) -> list:
        """The released value per released row, from noisy measures only (post-processing)."""
        raise NotImplementedError

    def half_widths(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                    alpha: float) -> list[float]:
        """Per released row, the half-width of the value's (1 - alpha) interval. The default: the
        noise's own interval of the single measure, in the aggregate's units."""
        first = measures[0]
        return [float(noise_half_width(first, alpha) * first.grid)] * len(release.keys)

    def predicted_half_width(self, aggregate: AggregateRelease, measures: Sequence[Measure], alpha: float,
                             count: int | None = None) -> float | None:
        """The half-width of the value's (1 - alpha) interval, known before the charge from the
        measures' noise laws and grids alone (``Measure.noise``, ``scale``, ``grid``): the one
        ``half_widths`` gives a released row, so a prediction and the answer's ± follow one law.
        Not ``counted``: every row's (the noise does not depend on the data). ``counted``: a row
        whose noisy count of values is ``count``, its other noisy sums at the middle of their
        bounds (0 when centred); ``None`` without a count. ``None`` also where no ± can be told
        before the release (``draws``: the interval is drawn with the value)."""
        if self.draws or (self.counted and (count is None or count < 1)):
            return None
        typical = Release(keys=((),), noisy={m.name: (count or 0,) if m.kind == "count" else (0,) for m in measures})
        return float(self.half_widths(aggregate, measures, typical, alpha)[0])

    def intervals(self, aggregate: AggregateRelease, measures: Sequence[Measure], release: Release,
                  alpha: float) -> list[tuple[float, float]]:
        """Per released row, its (1 - alpha) interval: value ± half-width, rounded outward so the
        interval holds the exact one, and cut to what the policy makes possible (``possible``:
        the bounded truth lies there, so the cut interval holds it as often; post-processing)."""
        values = self.values(aggregate, measures, release)
        floor, ceiling = self.possible(aggregate, measures)
        return [(max(math.nextafter(v - h, -math.inf), floor), min(math.nextafter(v + h, math.inf), ceiling))
                for v, h in zip(values, self.half_widths(aggregate, measures, release, alpha))]

    def possible(self, aggregate: AggregateRelease, measures: Sequence[Measure]) -> tuple[float, float]:
        """The values the bounded truth can take whatever the data, from the policy's bounds alone
        (a count is at least 0, an AVG within its bounds): released values and their intervals
        stay within it. The default: any value."""
        return -math.inf, math.inf

    def draw(self, aggregate: AggregateRelease, keys: list[tuple], rows: Sequence[tuple], width: int,
             source: Any) -> tuple[tuple[int, int, int], ...]:
        """For a ``draws`` family: per released key, the edge indices (value, low, high) chosen
        from the bounded (keys..., bucket, count) rows of its measure's own SQL."""
        raise NotImplementedError

    def chosen(self, aggregate: AggregateRelease, drawn: Sequence[tuple[int, int, int]]) -> tuple[Fraction, ...]:
        """For a ``draws`` family: the released values of the drawn edge indices."""
        raise NotImplementedError

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        """How explain describes the release (after ``a0 = LABEL:``)."""
        return f"{aggregate.function} ({', '.join(aggregate.measures)})"

    def result_type(self, aggregate: AggregateRelease, first: Measure) -> str:
        """The DuckDB type of the released core column."""
        return "DOUBLE"


def filtered(argument: exp.Expression | None, condition: exp.Expression | None) -> exp.Expression | None:
    """``AGG(x) FILTER (WHERE c)`` is ``AGG(CASE WHEN c THEN x END)``; COUNT(*) counts 1s."""
    if condition is None:
        return argument
    value = argument if argument is not None else exp.Literal.number(1)
    return exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])
