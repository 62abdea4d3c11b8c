"""The frozen hand-offs between stages: what a checked query asks, and the plan that answers it.

``check`` produces a ``PrivateQuery`` (or a ``PublicQuery``); ``analyse`` turns it into a
``Plan`` of ``Measure``s, each a bounded integer sum with its sensitivity, its share of the
budget and its noise; ``rewrite`` turns a plan into SQL; ``release`` adds the noise and hands
back a ``Release``, which each aggregate family (``dpsql.analysis.aggregates``) reads its values from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from sqlglot import exp

from dpsql.analysis.sensitivity import Sensitivity
from dpsql.policy.model import KeyDomain, PrivateTable


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY key: a row-level expression, with a public domain when one is declared."""

    name: str
    """Its column in the noisy core result (g0, g1, ...)."""
    expression: exp.Expression
    """The bound row-level expression grouped on."""
    domain: KeyDomain | None
    """Public key domain (every key released) or None (keys pass partition selection)."""
    type_name: str | None = None
    """The key expression's DuckDB type, from binding the query before the charge."""
    form: str = "value"
    """How the key is grouped and read back (``dpsql.backends.keys.key_form``): "value" or "text"."""
    narrowed_by: tuple[exp.Expression, ...] = ()
    """WHERE conjuncts on this key's column alone (for a column of a joined public table: on that
    table's columns): the released domain keeps the keys for which they hold (``dpsql.analysis.domains``)."""
    narrowing_columns: tuple[tuple[str, str], ...] = ()
    """For a column of a joined public table: (column of the query, column of the public table)
    of the table's other columns ``narrowed_by`` reads, evaluated on the table's own rows."""


MeasureKind = Literal["count", "sum", "units", "histogram", "distinct"]
"""What a measure sums (``Measure.kind``): the rewrite renders measures by kind alone."""

AggregateFunction = Literal["count", "sum", "avg", "count_units", "count_distinct", "variance", "stddev", "quantile",
                            "covar", "corr", "regr_slope", "regr_intercept", "regr_r2"]


@dataclass(frozen=True)
class Aggregate:
    """One aggregate call of the query, as the analyst wrote it (already bound)."""

    name: str
    """Its column in the noisy core result (a0, a1, ...)."""
    function: AggregateFunction
    """What it computes."""
    argument: exp.Expression | None
    """The row-level argument (FILTER folded in as CASE WHEN ... THEN arg END); None for COUNT(*)."""
    label: str
    """How the analyst wrote it, for explain and for output names."""
    sample: bool = False
    """VAR_SAMP / STDDEV_SAMP (n - 1 denominator) rather than the population form."""
    quantile: float | None = None
    """For quantiles: q in [0, 1] (MIN is 0, MAX is 1, MEDIAN is 0.5)."""
    other: exp.Expression | None = None
    """A two-argument aggregate's second argument (CORR(y, x): x; ``argument`` is y), FILTER folded
    in as for ``argument``."""
    weight: Fraction = Fraction(1)
    """Relative share of the query's epsilon."""
    unit_bounds: tuple[Fraction, Fraction] | None = None
    """``contribution_bounds_per_group => (lower, upper)`` as written in the call (SUM: each unit's
    total in a group; AVG: each unit's own average there), in the argument's units."""


def aggregates_of(node: exp.Expression) -> list[str]:
    """The core aggregate columns (a0..) an expression of the post query reads, each once, in order.

    >>> aggregates_of(exp.column("a0") / exp.column("a1") + exp.column("a0") * exp.column("g0"))
    ['a0', 'a1']
    """
    names = []
    for column in node.find_all(exp.Column):
        name = column.name
        if len(name) > 1 and name[0] == "a" and name[1:].isdigit() and name not in names:
            names.append(name)
    return names


@dataclass(frozen=True)
class PrivateQuery:
    """A checked aggregate query over one private table, split into a private core and
    a post-processing query over the core's noisy result."""

    table: str
    """Catalog key of the private table, or a label of the relation."""
    rule: PrivateTable
    """What the policy says of it (for a relation: the derived unit, limits and bounds)."""
    column_types: tuple[tuple[str, str], ...]
    """(lower column name, DuckDB type) of every column of the table."""
    where: exp.Expression | None
    """The bound WHERE predicate, if any."""
    keys: tuple[GroupKey, ...]
    """GROUP BY keys, in GROUP BY order."""
    aggregates: tuple[Aggregate, ...]
    """Every distinct aggregate call (select list, HAVING, ORDER BY)."""
    post: exp.Select
    """Post-processing query over ``dp_core`` (columns g*, a*): select list, HAVING as WHERE,
    ORDER BY, LIMIT; it sees only noisy values and public keys."""
    outputs: tuple[str, ...]
    """Released column names, in select-list order."""
    direct: tuple[tuple[str, str], ...] = ()
    """(output name, aggregate name) for outputs that are exactly one aggregate: their
    accuracy is the aggregate's."""
    source: exp.Expression | None = None
    """The relation's SQL, as an engine-neutral tree (``dpsql.sql.pieces``, rendered by the
    backend): a read of a private table's bounded copy, or a join, subquery, CTE or UNION ALL.
    ``None``: the table named ``table`` itself."""
    rows_per_unit: int | None = None
    """Rows per unit the source holds at most whatever the query, when it is a bounded copy."""
    hidden_unit: bool = False
    """Each row of a row-level table is its own unit: ``rule.unit`` is the copy's per-row id,
    which the analyst cannot name (``dpsql.backends.bounding``); every rule treats it as a unit column."""
    bounded: tuple[str, ...] = ()
    """The private tables (catalog keys) the source reads, each through its bounded copy, which the
    backend names and builds before the source runs (``dpsql.sql.pieces.CopiedTable``)."""
    joins: tuple[str, ...] = ()
    """What each join with public data compares and multiplies (for explain)."""

    def column_type(self, name: str) -> str:
        """The DuckDB type of a column of the table."""
        return dict(self.column_types)[name.lower()]


@dataclass(frozen=True)
class PublicQuery:
    """A query touching public tables only: it runs exactly and costs nothing."""

    tree: exp.Expression
    """The checked query, which the backend renders and runs as it is."""


@dataclass(frozen=True)
class ClampedColumn:
    """A bounded column read inside a measure, clamped into its policy bounds per row."""

    name: str
    """Lower-cased column name."""
    lower: Fraction
    """Policy lower bound."""
    upper: Fraction
    """Policy upper bound."""
    floating: bool
    """True for FLOAT/DOUBLE columns, whose NaN must become NULL."""
    double: bool = False
    """True for a DOUBLE column: its clamp may be written with comparisons (``dpsql.backends.rewrite``;
    DuckDB's LEAST and GREATEST turn a FLOAT's -0.0 into 0.0, which comparisons would keep)."""


@dataclass(frozen=True)
class Factor:
    """One argument of a product measure (``Measure.factors``), computed on its own grid."""

    argument: exp.Expression
    """Row-level expression (bound, unclamped)."""
    clamped_columns: tuple[ClampedColumn, ...]
    """Columns of ``argument`` clamped before it is evaluated."""
    grid: Fraction
    """Value of one integer unit of the argument."""
    lower: int
    """Smallest value of the argument, in grid units (its value is clamped into [lower, upper])."""
    upper: int
    """Largest value of the argument, in grid units."""
    power: int
    """The centred value 2v - (lower + upper) enters the row value to this power (0, 1 or 2);
    at 0 only its NULL-ness does: the row counts only where every factor is non-NULL (pairs)."""
    centred: bool = True
    """False under the per-unit model: the value v itself enters (a unit's total of a centred
    value grows with its number of rows, whatever its total of v)."""


@dataclass(frozen=True)
class Measure:
    """One noisy quantity: a bounded sum of integer row values, per group."""

    name: str
    """Column name in the bounded SQL (m0, m1, ...)."""
    kind: MeasureKind
    """COUNT of rows / non-NULL values, SUM of values, count of distinct units per group, or
    (for quantiles) per-bucket counts fed to the exponential mechanism instead of noised."""
    argument: exp.Expression | None
    """Row-level expression (bound, unclamped); ``None`` counts rows."""
    clamped_columns: tuple[ClampedColumn, ...]
    """Columns of ``argument`` clamped before it is evaluated (of a product measure: of its
    factors, each of which clamps its own)."""
    grid: Fraction
    """Value of one integer unit: released values are multiples of it."""
    lower: int
    """Smallest per-row value, in grid units."""
    upper: int
    """Largest per-row value, in grid units."""
    centred: bool
    """For AVG and VARIANCE: values are summed as 2*v - (lower + upper), centred on zero."""
    sensitivity: Sensitivity
    """How far one unit moves this measure's vector, in (centred) grid units."""
    epsilon: Fraction
    """This measure's share of the query's epsilon."""
    delta: Fraction
    """This measure's share of the query's delta."""
    noise: Literal["laplace", "gaussian", "none", "exponential"]
    """Discrete Laplace (scale) or discrete Gaussian (sigma squared); none if nothing can move it."""
    scale: Fraction
    """Laplace scale Delta_1/epsilon, or Gaussian sigma^2, in (centred) grid units."""
    counts_values_of: str | None = None
    """For AVG's count: the sum measure whose non-NULL row values it counts."""
    squared: bool = False
    """For VARIANCE: the centred values are squared before summing."""
    offset: Fraction = Fraction(0)
    """For histograms: the value of bucket 0's lower edge (bucket i covers offset + i * grid)."""
    factors: tuple[Factor, ...] = ()
    """For a product measure (the second-moment aggregates): each row value is the product of the
    factors' centred values raised to their powers, NULL when any factor is NULL; ``lower`` and
    ``upper`` are that product's interval (the least and greatest of its corner products) and
    ``grid`` one step of it in the columns' units (the product of the factors' half-grids)."""
    unit_bounds: tuple[int, int] | None = None
    """The per-unit contribution model (None: the rows model): each (unit, group)'s total of this
    measure's row values — or, with ``unit_average``, their average rounded toward zero on the
    grid — is clamped into these grid-unit bounds before the totals are summed per group
    (``dpsql.backends.rewrite``). A total's bounds always hold 0 (a unit absent from a group adds
    0, and its rows' own bounds then still hold: ``sensitivity`` may take the smaller rule)."""
    unit_average: bool = False
    """With ``unit_bounds``: a unit contributes its own average of its values in the group
    (BigQuery's AVG with ``contribution_bounds_per_group``), not their total."""


@dataclass(frozen=True)
class AggregateRelease:
    """How an aggregate's released value is computed from its measures."""

    name: str
    """The aggregate's core column (a0, ...)."""
    function: AggregateFunction
    """What it computes."""
    measures: tuple[str, ...]
    """Measures it reads: (count,), (sum,), (centred sum, count), (centred sum, sum of squares, count)."""
    lower: Fraction | None = None
    """Lower bound of the aggregated expression (AVG, VARIANCE clamp into the bounds)."""
    upper: Fraction | None = None
    """Upper bound of the aggregated expression."""
    sample: bool = False
    """Sample (n - 1) variance."""
    epsilon: Fraction = Fraction(0)
    """This aggregate's share of epsilon (split among its measures)."""
    quantile: float | None = None
    """For quantiles: q in [0, 1]."""
    rule: Any = None
    """For quantiles: the ``dpsql.mechanisms.quantile.QuantileRule`` the exponential mechanism uses."""
    unit_model: Literal["total", "average"] | None = None
    """Released under the per-unit contribution model (``Measure.unit_bounds``): each unit's
    per-group total clamped ("total"), or its own average ("average", BigQuery's AVG); None: the
    rows model."""


@dataclass(frozen=True)
class Selection:
    """Partition selection: which private keys are released, by a noisy distinct-unit count."""

    measure: str
    """The measure counting distinct units per group."""
    epsilon: Fraction
    """Epsilon spent on selection."""
    delta: Fraction
    """Delta spent on selection."""
    scale: Fraction
    """Discrete Laplace scale of the unit counts."""
    threshold: int
    """A group is released when its noisy unit count reaches this."""


@dataclass(frozen=True)
class Plan:
    """Everything needed to answer a private query, decided before any data is read."""

    query: PrivateQuery
    """The checked query."""
    measures: tuple[Measure, ...]
    """Noisy quantities to compute."""
    aggregates: tuple[AggregateRelease, ...]
    """How each aggregate is released from its measures."""
    selection: Selection | None = None
    """Partition selection, when some GROUP BY key has no public domain."""
    epsilon: Fraction = Fraction(0)
    """Total epsilon charged (sum over measures and selection)."""
    delta: Fraction = Fraction(0)
    """Total delta charged (sum over measures and selection)."""
    neighbours: str = "unbounded"
    """Neighbour relation the sensitivities were derived for."""

    @property
    def summed(self) -> tuple[Measure, ...]:
        """The measures the main bounded SQL sums."""
        return tuple(m for m in self.measures if m.kind not in ("histogram", "distinct"))

    @property
    def separate(self) -> tuple[Measure, ...]:
        """Measures with a bounded SQL of their own: quantile histograms, distinct values."""
        return tuple(m for m in self.measures if m.kind in ("histogram", "distinct"))

    @property
    def noised(self) -> tuple[Measure, ...]:
        """The measures released with additive noise (all but quantile histograms)."""
        return tuple(m for m in self.measures if m.kind != "histogram")

    @property
    def histograms(self) -> tuple[Measure, ...]:
        """Quantile histograms, each computed by its own bounded SQL."""
        return tuple(m for m in self.measures if m.kind == "histogram")

    def measure(self, name: str) -> Measure:
        """A measure by name."""
        return next(m for m in self.measures if m.name == name)


@dataclass(frozen=True)
class Release:
    """What a private query releases: keys and noisy measures, nothing exact."""

    keys: tuple[tuple, ...]
    """One key tuple per released row (``()`` when ungrouped)."""
    noisy: dict[str, tuple[int, ...]]
    """Measure name -> noisy integer per row, in grid units."""
    chosen: dict[str, tuple[Fraction, ...]] = field(default_factory=dict)
    """Quantile histogram measure -> the edge the exponential mechanism chose, per row."""
    edges: dict[str, tuple[tuple[int, int, int], ...]] = field(default_factory=dict)
    """Quantile histogram measure -> per row, the edge indices (value, low, high) of the value
    and of its 95% interval's endpoints (``dpsql.mechanisms.quantile.release_interval``)."""
