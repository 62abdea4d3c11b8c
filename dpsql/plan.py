"""The frozen hand-offs between stages: what a checked query asks, and the plan that answers it.

``check`` produces a ``PrivateQuery`` (or a ``PublicQuery``); ``analyse`` turns it into a
``Plan`` of ``Measure``s, each a bounded integer sum with its sensitivity, its share of the
budget and its noise; ``rewrite`` turns a plan into SQL; ``release`` adds the noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from .model import KeyDomain, PrivateTable
from .sensitivity import Sensitivity


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY column with a public domain: every key of the domain is released."""

    output: str
    """The output column name."""
    column: str
    """The table column (lower-cased catalog name)."""
    domain: KeyDomain
    """Where the released keys come from."""


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of the select list, as the analyst wrote it (already bound)."""

    output: str
    """The output column name."""
    function: Literal["count", "sum", "avg"]
    """Which aggregate."""
    argument: exp.Expression | None
    """The row-level argument; ``None`` for COUNT(*)."""


@dataclass(frozen=True)
class OrderItem:
    """One ORDER BY item, applied to released values only (post-processing)."""

    output: int
    """Index of the output column sorted on."""
    descending: bool
    """Sort direction."""


@dataclass(frozen=True)
class PrivateQuery:
    """A checked aggregate query over one private table."""

    table: str
    """Catalog key of the private table."""
    rule: PrivateTable
    """What the policy says of it."""
    column_types: tuple[tuple[str, str], ...]
    """(lower column name, DuckDB type) of every column of the table."""
    where: exp.Expression | None
    """The bound WHERE predicate, if any."""
    keys: tuple[GroupKey, ...]
    """GROUP BY keys, in GROUP BY order."""
    aggregates: tuple[Aggregate, ...]
    """Aggregates, in select-list order."""
    outputs: tuple[tuple[str, str, int], ...]
    """Select list: (output name, 'key' or 'aggregate', index into keys or aggregates)."""
    order: tuple[OrderItem, ...] = ()
    """ORDER BY over released values."""
    limit: int | None = None
    """LIMIT over released rows."""
    offset: int = 0
    """OFFSET over released rows."""

    def column_type(self, name: str) -> str:
        """The DuckDB type of a column of the table."""
        return dict(self.column_types)[name.lower()]


@dataclass(frozen=True)
class PublicQuery:
    """A query touching public tables only: it runs exactly and costs nothing."""

    sql: str
    """The SQL to run, regenerated from the checked AST."""


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


@dataclass(frozen=True)
class Measure:
    """One noisy quantity: a bounded sum of integer row values, per group."""

    name: str
    """Column name in the bounded SQL (m0, m1, ...)."""
    kind: Literal["count", "sum"]
    """COUNT of rows / non-NULL values, or SUM of values."""
    argument: exp.Expression | None
    """Row-level expression (bound, unclamped); ``None`` counts rows."""
    clamped_columns: tuple[ClampedColumn, ...]
    """Columns of ``argument`` clamped before it is evaluated."""
    grid: Fraction
    """Value of one integer unit: released values are multiples of it."""
    lower: int
    """Smallest per-row value, in grid units."""
    upper: int
    """Largest per-row value, in grid units."""
    centred: bool
    """For AVG: values are released as 2*v - (lower + upper), centred on zero."""
    sensitivity: Sensitivity
    """How far one unit moves this measure's vector, in (centred) grid units."""
    epsilon: Fraction
    """This measure's share of the query's epsilon."""
    delta: Fraction
    """This measure's share of the query's delta."""
    noise: Literal["laplace", "gaussian", "none"]
    """Discrete Laplace (scale) or discrete Gaussian (sigma squared); none if nothing can move it."""
    scale: Fraction
    """Laplace scale Delta_1/epsilon, or Gaussian sigma^2, in (centred) grid units."""
    counts_values_of: str | None = None
    """For AVG's count: the sum measure whose non-NULL row values it counts."""


@dataclass(frozen=True)
class OutputColumn:
    """A released column and how it is computed from the measures."""

    name: str
    """Output column name."""
    kind: Literal["key", "count", "sum", "avg"]
    """Group key, or an aggregate."""
    measures: tuple[str, ...] = ()
    """Measures it reads: (count,) / (sum,) / (centred sum, count) for AVG."""
    key_index: int = -1
    """For keys: index into the query's keys."""
    lower: Fraction | None = None
    """For AVG: the lower bound the average is clamped to."""
    upper: Fraction | None = None
    """For AVG: the upper bound the average is clamped to."""


@dataclass(frozen=True)
class Plan:
    """Everything needed to answer a private query, decided before any data is read."""

    query: PrivateQuery
    """The checked query."""
    measures: tuple[Measure, ...]
    """Noisy quantities to compute."""
    outputs: tuple[OutputColumn, ...]
    """Released columns, in select-list order."""
    epsilon: Fraction
    """Total epsilon charged (sum of the measures')."""
    delta: Fraction
    """Total delta charged (sum of the measures')."""
    neighbours: str
    """Neighbour relation the sensitivities were derived for."""

    def measure(self, name: str) -> Measure:
        """A measure by name."""
        return next(m for m in self.measures if m.name == name)
