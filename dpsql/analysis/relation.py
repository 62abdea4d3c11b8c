"""The private relation a DP aggregate reads: one table, a join, a subquery, a CTE or a UNION ALL.

The FROM clause of a private query is turned into a *relation*: SQL producing rows, each row
attributable to exactly one privacy unit (its ``unit`` column), with a stability record (one
``dpsql.analysis.stability.Step`` per construct: how many rows ``k`` and groups one unit can
have after it, and why) and a rule carrying the last step's limits and the bounds and public
key domains of its columns. The aggregate stages then treat it exactly like a private table,
and the final rewrite enforces ``k`` and the bounds on it, so the privacy argument needs only
one fact from this module: **every row of the relation depends on the data of the unit in its
unit column and on public data, and of no other unit** (taint follows the data). Each
construct keeps it:

* a private table: each row is its unit's (rows with a NULL unit are dropped later); a
  row-level table (PRIVACY UNIT ROW) is a unit-level one whose unit is its copy's hidden
  per-row id (``dpsql.sql.names.ROW_UNIT``): every rule below applies to it unchanged, and
  the id is carried through projections and unions without the analyst naming it (it is
  never in scope, so nothing can bind to it, select it or join on it);
* private ⋈ public on equality: a private row becomes at most ``m`` rows (``m`` = the public
  join key's largest multiplicity, computed from public data), so ``k' = k·max(m, 1)``; inner
  joins and private LEFT JOIN public only (a join that could fabricate rows without a unit is
  refused);
* private ⋈ private on their unit columns: a joined row pairs two rows of the same unit, so
  ``k' = k1·k2``;
* a subquery that keeps the unit column (bare) and filters or projects row by row: ``k' = k``;
* a subquery grouped by the unit (and maybe more) with aggregates: each output row is one
  unit's, ``k' = 1`` grouped by the unit alone, else ``k``; per-unit aggregates get bounds
  derived from their inputs' (COUNT in [0, k], SUM of values in [lo, hi] in [k·min(lo, 0),
  k·max(hi, 0)], AVG/MIN/MAX/quantiles in [lo, hi]) — bounds the rewrite enforces by clamping;
* UNION ALL of such branches (unit at the same position): ``k' = k1 + k2 + ...``.

Every join and UNION ALL also bounds the *work* one unit causes: the rows per unit it holds
(``Relation.rows_per_unit``, the products and sums above) may not pass the policy's
``MAX ROWS PER UNIT AFTER JOINS`` unless an input already held as many
(``dpsql.analysis.stability.check_fan_out``).

Units meet only in their own type: a join of two private tables on their units, or a UNION
ALL of branches, needs the unit columns to have identical DuckDB types — an implicit coercion
(BIGINT = DOUBLE compares as DOUBLE, VARCHAR = INTEGER casts the string) could make two
units one. Per-unit aggregates are computed so that their result does not depend on row
order (``dpsql.analysis.subqueries.total_aggregate``): invariant 5 holds for the rows they read.

A column's bounds are only claims the rewrite clamps to, so a too-wide bound costs accuracy,
never privacy; the unit column is never computed, only passed through.

This module holds the relation itself; ``dpsql.analysis.from_clause`` walks a FROM clause into
one, ``dpsql.analysis.joins`` and ``dpsql.analysis.subqueries`` state the constructs' rules.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from sqlglot import exp

from dpsql.analysis.stability import (
    PUBLIC_JOIN,
    Step,
)
from dpsql.errors import InternalError
from dpsql.policy.model import PrivateTable


@dataclass(frozen=True)
class Relation:
    """Rows the aggregate reads, with what one unit can contribute to them."""

    sql: exp.Expression
    """A table or a query producing the relation's columns."""
    rule: PrivateTable
    """The relation's rule, read like a private table's: its unit column, the rows and groups
    per unit of its last stability step, its columns' bounds and key domains."""
    columns: dict
    """Relation column -> DuckDB type."""
    scope: dict = field(default_factory=dict)
    """(qualifier or None, column name) -> relation column, for binding the query over it."""
    label: str = ""
    """What to call it in messages and EXPLAIN."""
    bounded: frozenset = frozenset()
    """The private tables (catalog keys) the relation reads, each through its bounded copy
    (``dpsql.sql.pieces.CopiedTable``: the backend names and builds it before a query runs)."""
    stability: tuple[Step, ...] = ()
    """Its stability record: one step per construct it is built of, inputs first, itself last
    (``dpsql.analysis.stability``). ``rule``'s rows and groups per unit are the last step's."""

    @property
    def rows_per_unit(self) -> int | None:
        """Rows per unit the relation holds at most whatever the data: a private table's bounded
        copy holds k (``dpsql.backends.bounding``), joins multiply, ... ``None`` when nothing holds it."""
        return self.stability[-1].held

    @property
    def joins(self) -> tuple[str, ...]:
        """One line per join with public data: what it compares and how far it multiplies rows."""
        return tuple(step.why for step in self.stability if step.construct == PUBLIC_JOIN)

    @property
    def unit(self) -> str:
        """The unit column, lower-cased as names are in scope."""
        return unit_of(self.rule).lower()

    @property
    def hidden_unit(self) -> bool:
        """True when each row of a row-level table is its own unit: the unit column is the
        copy's per-row id, which no name in scope reaches."""
        # Compared lower-cased, as names are in scope: a policy may spell the unit "Customer ID".
        return self.unit not in {name.lower() for name in self.scope.values()}


_JOIN_TAGS = itertools.count(1)


@dataclass(frozen=True)
class PublicSide:
    """A public table or query joined to private data."""

    sql: exp.Expression
    columns: dict
    scope: dict
    label: str
    table: str | None = None
    """The catalog name when it is a declared public table (its columns then have key domains)."""
    ranges: dict = field(default_factory=dict)
    """Column -> Bounds (its min and max) of numeric columns, once the rows are stored."""
    tag: str = field(default_factory=lambda: f"join{next(_JOIN_TAGS)}", compare=False)
    """This joined table's own tag (``KeyDomain.joined``): two joins of one table, or one alias
    reused in a subquery, are different rows."""


def as_source(node: exp.Expression) -> exp.Expression:
    """A relation's SQL as a FROM item: a table as itself, a query as a subquery."""
    return node if isinstance(node, exp.Table) else exp.Subquery(this=node.copy())


def visible_columns(columns: dict, unit: str, hidden: bool) -> dict:
    """The columns the analyst may name: all but a hidden unit."""
    return {c: t for c, t in columns.items() if not (hidden and c == unit)}


def unit_of(rule: PrivateTable) -> str:
    """A relation's unit column: every relation has one (a row-level table's is its hidden
    per-row id, ``ROW_UNIT``)."""
    if rule.unit is None:
        raise InternalError(f"the relation {rule.name} has no unit column: this is a bug in dpsql")
    return rule.unit
