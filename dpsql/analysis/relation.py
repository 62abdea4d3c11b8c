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
order (``_total_aggregate``): invariant 5 holds for the rows they read.

A column's bounds are only claims the rewrite clamps to, so a too-wide bound costs accuracy,
never privacy; the unit column is never computed, only passed through.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, cast

from sqlglot import exp

from dpsql.analysis.bind import (
    Catalog,
    bind_brackets,
    bind_table,
    column_scope,
    replace_column,
    resolve_column,
    resolve_group_item,
    table_key,
)
from dpsql.analysis.ranges import (
    Interval,
    derive_range,
    is_integral_type,
    is_numeric_type,
)
from dpsql.analysis.stability import (
    PUBLIC_JOIN,
    ROW_SUBQUERY,
    TABLE,
    TRUNCATION,
    UNION_ALL,
    UNIT_JOIN,
    UNIT_SUBQUERY,
    Step,
    check_fan_out,
    product,
)
from dpsql.backends.bounding import ROW_UNIT_TYPE, bounded_reference, copy_name
from dpsql.errors import DPError, InternalError
from dpsql.policy.model import (
    Bounds,
    ColumnRule,
    KeyDomain,
    Policy,
    PrivateTable,
    PublicTable,
)
from dpsql.sql.allowlist import check_public, check_row_level, refuse
from dpsql.sql.names import ROW_UNIT, columns_hint, sql_name
from dpsql.sql.parse import DIALECT, describe

if TYPE_CHECKING:  # the protocol only: the check asks the engine through it, never imports one
    from dpsql.backends.base import Backend


@dataclass(frozen=True)
class Relation:
    """Rows the aggregate reads, with what one unit can contribute to them."""

    sql: exp.Expression
    """A table or a query producing the relation's columns."""
    rule: PrivateTable
    """Synthetic rule: unit column, rows and groups per unit, bounds and key domains."""
    columns: dict
    """Relation column -> DuckDB type."""
    scope: dict = field(default_factory=dict)
    """(qualifier or None, column name) -> relation column, for binding the query over it."""
    label: str = ""
    """What to call it in messages and EXPLAIN."""
    bounded: frozenset = frozenset()
    """Names of the bounded copies the relation reads (built before a query runs)."""
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
        return _unit(self.rule).lower()

    @property
    def hidden_unit(self) -> bool:
        """True when each row of a row-level table is its own unit: the unit column is the
        copy's per-row id, which no name in scope reaches."""
        # Compared lower-cased, as names are in scope: a policy may spell the unit "Customer ID".
        return self.unit not in {name.lower() for name in self.scope.values()}


_JOIN_TAGS = itertools.count(1)


@dataclass(frozen=True)
class _Public:
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


def build_relation(from_: exp.From, joins: list, policy: Policy, catalog: Catalog, sql: str,
                   data: Backend | None, ctes: dict) -> Relation:
    """The relation of a FROM clause and its joins (private: at least one private table)."""
    current = _item(from_.this, policy, catalog, sql, data, ctes)
    for join in joins:
        other = _item(join.this, policy, catalog, sql, data, ctes)
        current = _join(current, other, join, sql, data, policy.max_join_multiplicity, policy.max_rows_after_joins)
    if isinstance(current, _Public):
        refuse(from_, sql, "private data may be read only in FROM: this query's FROM reads public tables only "
               "while another part of it reads a private table", "aggregate the private table in FROM, "
               "joining the public one")
    return current


def _item(node: exp.Expression, policy, catalog, sql, data, ctes):
    """One FROM item: a table, a CTE reference or a subquery."""
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier) and not node.db \
            and node.name.lower() in ctes:
        reference = (node.alias or node.name).lower()
        return _subquery(ctes[node.name.lower()], reference, policy, catalog, sql, data, ctes)
    if isinstance(node, exp.Table):
        bound = bind_table(node, policy, catalog, sql)
        if node.args.get("sample") is not None and isinstance(bound.declaration, PrivateTable):
            refuse(node.args["sample"], sql, "TABLESAMPLE of a private table is not supported",
                   "query the whole table; dpsql bounds each unit's contribution itself")
        columns = dict(bound.columns)
        table_sql = exp.to_table(".".join(f'"{p}"' for p in bound.name.split(".")))
        scope = column_scope(bound.reference, columns, bound.name.split(".")[-1])
        if isinstance(bound.declaration, PublicTable):
            return _Public(table_sql, columns, scope, bound.name, bound.declaration.name)
        rule = bound.declaration
        if rule.row_level:  # a unit-level table whose unit is the hidden per-row id
            rule = replace(rule, unit=ROW_UNIT)
            columns[ROW_UNIT] = ROW_UNIT_TYPE
        # Read through its bounded copy: at most k rows per unit before any analyst expression.
        step = Step(TABLE, bound.name, rule.max_rows_per_unit, rule.max_groups_per_unit, rule.max_rows_per_unit,
                    f"{bound.name}: read through its bounded copy, at most {rule.max_rows_per_unit} rows per unit")
        return Relation(bounded_reference(bound.name, bound.declaration, columns), rule, columns, scope, bound.name,
                        bounded=frozenset({copy_name(bound.name, bound.declaration)}), stability=(step,))
    if isinstance(node, exp.Subquery):
        reference = (node.alias or "").lower()
        if not reference:  # dpsql.analysis.check names each one as DuckDB does: this is a bug
            refuse(node, sql, "a subquery in FROM needs an alias", "write (SELECT ...) AS t")
        return _subquery(node.this, reference, policy, catalog, sql, data, ctes)
    refuse(node, sql, f"{describe(node)} is not supported in FROM", "read declared tables or subqueries")


# ------------------------------------------------------------------------------------------
# Joins


def _join(left, right, join: exp.Join, sql: str, data: Backend | None, max_multiplicity: int,
          max_rows: int):
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if kind in ("CROSS", "NATURAL", "SEMI", "ANTI", "ASOF", "POSITIONAL"):
        refuse(join, sql, f"{kind} JOIN is not supported over private tables",
               "join with ON a = b equality conditions")
    condition = join.args.get("on")
    using = join.args.get("using")
    if condition is None and not using:
        refuse(join, sql, "a join without ON would pair every private row with every other row",
               "join with ON a = b equality conditions")
    if isinstance(left, _Public) and isinstance(right, _Public):
        refuse(join, sql, "two public tables joined before the private one are not supported",
               "name the private table first (FROM t JOIN p ON ... JOIN q ON ...), or join the public "
               "tables in a subquery: FROM t JOIN (SELECT ... FROM p JOIN q ON ...) AS pq ON ...")
    if side == "RIGHT":  # a RIGHT JOIN keeps the right side: the same as the mirrored LEFT JOIN
        left, right, side = right, left, "LEFT"
    # Which side keeps all its rows: it must be a private one, so no row lacks a unit.
    if side == "FULL" or (side == "LEFT" and isinstance(left, _Public)):
        refuse(join, sql, f"{side} JOIN here would make rows that belong to no privacy unit",
               "use an inner join, or keep the private table on the preserved side")
    names = _joined_names(left, right)
    scope = {**{k: names[("l", v)] for k, v in left.scope.items() if k[0] is not None},
             **{k: names[("r", v)] for k, v in right.scope.items() if k[0] is not None}}
    unqualified: dict[str, list[str]] = {}
    for side_tag, part in (("l", left), ("r", right)):
        for (q, c), v in part.scope.items():
            if q is None:
                unqualified.setdefault(c, []).append(names[(side_tag, v)])
    scope.update({(None, c): targets[0] for c, targets in unqualified.items() if len(targets) == 1})
    if using:  # JOIN ... USING (a, b): ON left.a = right.a AND ...; the merged column is the left one
        bound_condition = _using_condition(using, left, right, join, sql)
        for identifier in using:
            scope[(None, identifier.name.lower())] = names[("l", left.scope[(None, identifier.name.lower())])]
    else:
        bound_condition = _bind_condition(condition, left, right, names, sql)
    if isinstance(left, Relation) and isinstance(right, Relation):
        rule = _private_join_rule(left, right, _equalities(bound_condition), names, join, sql)
        inputs = (left.rows_per_unit, right.rows_per_unit)
        k1, k2 = left.rule.max_rows_per_unit, right.rule.max_rows_per_unit
        groups = min(left.rule.groups_per_unit, right.rule.groups_per_unit)
        # Each side keeps at most its k rows per unit before the join, so one unit's rows
        # cannot make the join quadratic (a time that would tell whether the unit is there).
        left, right = _truncated(left), _truncated(right)
        # A joined row pairs a row of each side of the same unit (one row if LEFT and unmatched).
        held = product(left.rows_per_unit, right.rows_per_unit)
        check_fan_out(join, sql, held, inputs, max_rows, f"this join of {right.label} on the privacy unit pairs "
                       f"each of one unit's rows on its left ({left.rows_per_unit} at most) with each on its right "
                       f"({right.rows_per_unit})", "join each private table once, or aggregate "
                       "per unit first in a subquery (SELECT unit, SUM(x) AS s FROM t GROUP BY unit), which "
                       "leaves one row per unit to join")
        on = _total_condition(bound_condition, (left.unit, right.unit))
        bounded = left.bounded | right.bounded
        step = Step(UNIT_JOIN, f"{left.label} ⋈ {right.label}", k1 * k2, groups, held,
                    f"{left.label} ⋈ {right.label} on the privacy unit: a joined row pairs a row of each side "
                    f"of the same unit, so a unit has at most k = {k1}·{k2} rows and touches at most "
                    f"{groups} groups")
        rule = step.limits(rule)
        stability = left.stability + right.stability + (step,)
    else:
        private, public = (left, right) if isinstance(left, Relation) else (right, left)
        tag = "l" if private is left else "r"
        if data is None:
            refuse(join, sql, "joins need the database's public tables to bound their multiplicity",
                   "run the query through dpsql.connect")
        keys = _join_keys(bound_condition, private, public, tag, join, sql, data)
        public = _stored(public, keys, "r" if tag == "l" else "l", join, sql, data)
        left, right = (private, public) if tag == "l" else (public, private)
        # The most stored public rows sharing one value of the join keys (NULL keys never match).
        multiplicity = data.key_multiplicity(public.sql.name, [key.stored for key in keys])
        if multiplicity > max_multiplicity:
            refuse(join, sql, f"a row of the private side can match up to {multiplicity} rows of "
                   f"{public.label} on this join's keys, more than the policy's MAX JOIN MULTIPLICITY "
                   f"{max_multiplicity}", "join on columns that identify the public rows (a key), or "
                   "aggregate the public side first in a subquery")
        rule = _public_join_rule(private, public, names, tag)
        # A private row becomes at most `multiplicity` rows (one if LEFT and unmatched): the
        # public rows were stored before the charge and the join compares, in one stated
        # type, exactly the keys the multiplicity was counted on — so the rows a unit holds
        # multiply by at most m, whatever the private data (DESIGN.md invariant 15).
        held = product(private.rows_per_unit, multiplicity)
        check_fan_out(join, sql, held, (private.rows_per_unit,), max_rows, f"each of a unit's rows in {private.label} "
                       f"({private.rows_per_unit} at most) can match up to m = {multiplicity} rows of "
                       f"{public.label} on this join's keys", "join on columns that identify the public rows "
                       "(a key), aggregate the public side first in a subquery, or join fewer public tables")
        on = _keyed_condition(bound_condition, keys)
        bounded = private.bounded
        compared = ", ".join(sorted({k.comparison if k.comparison != "VARCHAR" else "VARCHAR (as bytes)"
                                     for k in keys}))
        # Each private row becomes at most `multiplicity` rows: a unit's k rows become k·m.
        step = Step(PUBLIC_JOIN, f"{private.label} ⋈ {public.label}", private.rule.max_rows_per_unit * multiplicity,
                    private.rule.max_groups_per_unit, held,
                    f"{private.label} ⋈ {public.label}: public rows stored before the charge; keys "
                    f"compared as {compared}; a private row matches at most m = {multiplicity} "
                    f"public rows (MAX JOIN MULTIPLICITY {max_multiplicity})")
        rule = step.limits(rule)
        stability = private.stability + (step,)
    select = exp.Select(expressions=[
        exp.alias_(exp.column(c, table=f"dp_{tag}", quoted=True), names[(tag, c)], quoted=True)
        for tag, part in (("l", left), ("r", right)) for c in part.columns])
    select = select.from_(exp.alias_(_as_source(left.sql), "dp_l"))
    select = select.join(exp.alias_(_as_source(right.sql), "dp_r"), on=on,
                         join_type="LEFT" if side == "LEFT" else "INNER")
    columns = {names[(t, c)]: typ for t, part in (("l", left), ("r", right)) for c, typ in part.columns.items()}
    return Relation(select, rule, columns, scope, f"{left.label} ⋈ {right.label}", bounded=bounded,
                    stability=stability)


def _truncated(relation: Relation) -> Relation:
    """The relation with at most k rows per unit, chosen by a salted hash of each row's own
    values (ties between different rows broken by the values themselves): never by order."""
    unit, k = relation.unit, relation.rule.max_rows_per_unit
    if relation.rows_per_unit is not None and relation.rows_per_unit <= k:
        return relation  # at most k rows per unit already (a bounded copy)
    values = [exp.column(c, quoted=True) for c in relation.columns]
    salted = exp.func("hash", exp.Placeholder(this="salt"), *[v.copy() for v in values])
    rank = exp.Window(this=exp.RowNumber(), partition_by=[exp.column(unit, quoted=True)],
                      order=exp.Order(expressions=[exp.Ordered(this=salted)] +
                                      [exp.Ordered(this=v.copy()) for v in values]))
    ranked = exp.Select(expressions=[exp.Star(), exp.alias_(rank, "dp_n")]).from_(
        exp.alias_(_as_source(relation.sql), "dp_t"))
    kept = exp.Select(expressions=[exp.Star(except_=[exp.column("dp_n")])]).from_(exp.Subquery(this=ranked))
    kept = kept.where(exp.LTE(this=exp.column("dp_n"), expression=exp.Literal.number(k)))
    step = Step(TRUNCATION, relation.label, k, relation.rule.max_groups_per_unit, k,
                f"{relation.label}: at most k = {k} rows of each unit kept before joining on the unit "
                "(chosen by a salted hash of each row's own values)")
    return replace(relation, sql=kept, stability=relation.stability + (step,))


def _joined_names(left, right) -> dict:
    """Unique relation column names for both sides (the bare name where it is unique)."""
    names, used = {}, set()
    for tag, part in (("l", left), ("r", right)):
        label = part.label.split(".")[-1].replace(" ", "")
        for column in part.columns:
            clash = column in (right.columns if tag == "l" else left.columns)
            name = f"{label}.{column}" if clash else column
            while name in used:
                name = f"{tag}.{name}"
            used.add(name)
            names[(tag, column)] = name
    return names


def _bind_condition(condition, left, right, names, sql):
    """The ON condition with each column resolved to dp_l / dp_r and its source column."""
    bound = condition.copy()
    for column in list(bound.find_all(exp.Column)):
        hits = [(tag, resolved) for tag, part in (("l", left), ("r", right))
                for resolved in [resolve_column(column, part.scope, part.columns, sql)] if resolved is not None]
        if len(hits) != 1:
            problem = "is ambiguous" if hits else "is unknown"
            refuse(column, sql, f"column {column.sql(dialect=DIALECT)} in the join condition {problem}",
                   "qualify it with its table's alias")
        tag, resolved = hits[0]
        source = resolved if isinstance(resolved, exp.Column) else next(resolved.find_all(exp.Column))
        qualified = exp.column(source.name, table=f"dp_{tag}", quoted=True)
        if source is resolved:
            resolved = qualified
        else:  # a STRUCT field: struct_extract of the qualified column
            source.replace(qualified)
        replace_column(column, resolved)
    check_row_level(bound, sql, "a join condition")
    return bound


def _using_condition(using: list, left, right, join, sql) -> exp.Expr:
    parts = []
    for identifier in using:
        name = identifier.name.lower()
        if (None, name) not in left.scope or (None, name) not in right.scope:
            refuse(join, sql, f"USING ({identifier.name}) names a column that is not on both sides",
                   "join ON a = b instead")
        parts.append(exp.EQ(this=exp.column(left.scope[(None, name)], table="dp_l", quoted=True),
                            expression=exp.column(right.scope[(None, name)], table="dp_r", quoted=True)))
    return exp.and_(*parts)


def _equalities(condition: exp.Expr) -> list[tuple[exp.Column, exp.Column]]:
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    pairs = []
    for part in parts:
        part = part.unnest()
        if isinstance(part, exp.EQ) and isinstance(part.this, exp.Column) and isinstance(part.expression, exp.Column) \
                and part.this.table != part.expression.table:
            left, right = (part.this, part.expression) if part.this.table == "dp_l" else (part.expression, part.this)
            pairs.append((left, right))
    return pairs


def _total_condition(condition: exp.Expr, units: tuple[str, str]) -> exp.Expr:
    """A private⋈private join condition that cannot fail at run time: the equality of the two
    unit columns stays plain (the hash join's key; their types are the same), every other part
    becomes false where it would raise (an implicit cast of one unit's value, say)."""
    safe = []
    for part in _conjuncts(condition):
        on_units = isinstance(part, exp.EQ) and all(isinstance(x, exp.Column) for x in (part.this, part.expression)) \
            and {(part.this.table, part.this.name), (part.expression.table, part.expression.name)} == \
            {("dp_l", units[0]), ("dp_r", units[1])}
        safe.append(part if on_units else exp.func("COALESCE", exp.func("TRY", part), exp.false()))
    return exp.and_(*safe)


def _same_unit_type(relations: list, node, sql: str, what: str) -> None:
    """Units meet only in one type: an implicit coercion could make two units one."""
    types = [r.columns.get(_unit(r.rule).lower(), "") for r in relations]
    if len(set(types)) > 1:
        listed = " and ".join(f"{r.rule.unit} {t}" for r, t in zip(relations, types))
        refuse(node, sql, f"{what} compares privacy units of different types ({listed}): a conversion "
               "could make different units equal", "the units need one type in every table (e.g. BIGINT): "
               "ask the curator to store or declare them so; dpsql pairs units only of identical types")


def _private_join_rule(left: Relation, right: Relation, equalities, names, join, sql) -> PrivateTable:
    """The joined relation's unit and column rules (its limits are its ``Step``'s); refuses a
    join that is not on the units, or on units of different types."""
    for part in (left, right):
        if part.hidden_unit:
            refuse(join, sql, f"each row of {part.label} is its own privacy unit, so it has no unit column to join "
                   "another private table on", "join row-level private tables only with public tables")
    on_units = any(a.name == left.unit and b.name == right.unit for a, b in equalities)
    if not on_units:
        refuse(join, sql, f"two private tables can only be joined on their privacy units "
               f"({left.rule.unit} = {right.rule.unit}): any other join mixes different units' rows",
               f"add ON ... {left.rule.unit} = ... {right.rule.unit}")
    _same_unit_type([left, right], join, sql, "a join of two private tables")
    rules = [_renamed_rule(part.rule, names, tag) for tag, part in (("l", left), ("r", right))]
    return PrivateTable(
        name=f"{left.rule.name} ⋈ {right.rule.name}",
        unit=names[("l", left.unit)],
        columns=rules[0] + rules[1],
    )


@dataclass(frozen=True)
class _JoinKey:
    """One equality of a private⋈public join: a private expression equal to a public one,
    compared in one type both are cast to explicitly."""

    private: exp.Expression
    """The private side, over ``dp_l`` / ``dp_r`` columns."""
    public: exp.Expression
    """The public side, over the public relation's columns."""
    comparison: str
    """The type both sides are compared in (``VARCHAR`` compares their UTF-8 bytes)."""
    private_type: str
    """The private side's own type."""
    index: int
    """Its position: the stored public relation holds the public side as ``dp_jk<index>``."""

    @property
    def stored(self) -> str:
        return f"dp_jk{self.index}"


INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
                           "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"})
FLOAT_TYPES = frozenset({"FLOAT", "REAL", "DOUBLE"})
SAME_TYPE_ONLY = ("DATE", "TIME", "TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS",
                  "TIMESTAMP WITH TIME ZONE", "BOOLEAN", "UUID", "BLOB", "DECIMAL(")


def join_comparison_type(private_type: str, public_type: str) -> str | None:
    """The type a join compares a private and a public key in, or ``None`` when no type
    compares them without loss: DuckDB's implicit coercion would otherwise decide, and it
    makes many values equal one (ids near 2^53 as DOUBLE, '01' and ' 1' as INTEGER 1).

    >>> join_comparison_type("INTEGER", "BIGINT"), join_comparison_type("FLOAT", "DOUBLE")
    ('HUGEINT', 'DOUBLE')
    >>> join_comparison_type("VARCHAR", "INTEGER"), join_comparison_type("BIGINT", "DOUBLE")
    (None, None)
    >>> join_comparison_type("DECIMAL(9,2)", "DECIMAL(9,2)"), join_comparison_type("DATE", "TIMESTAMP")
    ('DECIMAL(9,2)', None)
    """
    a, b = private_type.upper(), public_type.upper()
    if a in INTEGER_TYPES and b in INTEGER_TYPES:
        return "HUGEINT"  # holds every value of both exactly
    if a in FLOAT_TYPES and b in FLOAT_TYPES:
        return "DOUBLE"
    if _is_string(a) and _is_string(b):
        return "VARCHAR"
    if a == b and a.startswith(SAME_TYPE_ONLY):
        return a
    return None


def _is_string(type_name: str) -> bool:
    return type_name == "VARCHAR" or type_name.startswith("ENUM(")


def _compared(node: exp.Expression, comparison: str, own_type: str) -> exp.Expression:
    """``node`` as the value the join compares: cast to the comparison type; strings as their
    UTF-8 bytes, so no collation (NOCASE, NOACCENT) can make different strings match."""
    if comparison == "VARCHAR":
        text = node if own_type.upper() == "VARCHAR" else exp.cast(node, "VARCHAR")
        return exp.Anonymous(this="encode", expressions=[text])
    if own_type.upper() == comparison:
        return node
    return exp.cast(node, exp.DataType.build(comparison, dialect=DIALECT))


def _join_keys(condition: exp.Expr, private: Relation, public: _Public, tag: str, join, sql: str,
               data: Backend) -> list[_JoinKey]:
    """The equalities of a private⋈public join condition between a private and a public
    expression, each with the one type it will be compared in (refused when there is none)."""
    mine, theirs = f"dp_{tag}", f"dp_{'r' if tag == 'l' else 'l'}"
    keys: list[_JoinKey] = []
    for part in _conjuncts(condition):
        if not isinstance(part, exp.EQ):
            continue
        sides = [{c.table for c in s.find_all(exp.Column)} for s in (part.this, part.expression)]
        if {frozenset(sides[0]), frozenset(sides[1])} != {frozenset({mine}), frozenset({theirs})}:
            continue
        private_side, public_side = (part.this, part.expression) if sides[0] == {mine} else \
            (part.expression, part.this)
        private_type = _type_of(private_side, private.sql, mine, data, sql, join)
        public_type = _type_of(public_side, public.sql, theirs, data, sql, join)
        comparison = join_comparison_type(private_type, public_type)
        if comparison is None:
            refuse(join, sql, f"this join compares {private_type} with {public_type}: DuckDB would convert "
                   "one to the other, which can make different values equal or fail on some rows",
                   f"CAST one side so both have the same type, e.g. CAST(... AS {public_type})")
        keys.append(_JoinKey(private_side, public_side, comparison, private_type, len(keys)))
    if not keys:
        refuse(join, sql, "a join with a public table needs an equality between a private and a public column",
               "join ON private.col = public.col")
    return keys


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    return [part.unnest() for part in parts]


def _type_of(node: exp.Expression, source: exp.Expression, alias: str, data: Backend, sql: str, join) -> str:
    """The DuckDB type of an expression over one side of a join (binds the schema, reads nothing)."""
    select = exp.Select(expressions=[node.copy()]).from_(exp.alias_(_as_source(source), alias))
    try:
        return data.describe(select)[0][1]
    except DPError as error:
        refuse(join, sql, f"this join condition does not type-check: {error.message}",
               "compare columns of matching types")


def _stored(public: _Public, keys: list[_JoinKey], tag: str, join, sql: str, data: Backend) -> _Public:
    """The public side of a join stored once, before the charge, with each join key already
    in its comparison type (``dp_jk<i>``): the join and every public fact the analysis reads
    about it (multiplicity, column ranges) then come from the same rows."""
    alias = f"dp_{tag}"
    items = [exp.alias_(exp.column(c, table=alias, quoted=True), c, quoted=True) for c in public.columns]
    for key in keys:
        own = _type_of(key.public, public.sql, alias, data, sql, join)
        items.append(exp.alias_(_compared(key.public.copy(), key.comparison, own), key.stored, quoted=True))
    select = exp.Select(expressions=items).from_(exp.alias_(_as_source(public.sql), alias))
    try:
        name = data.materialise(select)
    except Exception as error:  # public data only: DuckDB's own first line reveals nothing private
        message = error.message if isinstance(error, DPError) else str(error).strip().split("\n")[0]
        refuse(join, sql, f"the public side of this join could not be computed: {message}",
               "check the public subquery or table on its own, as a query over public tables")
    return replace(public, sql=data.stored_reference(name), ranges=_ranges(name, public.columns, data))


def _ranges(stored: str, columns: dict, data: Backend) -> dict:
    """Bounds of the stored public rows' numeric columns: their exact min and max."""
    numeric = [c for c, typ in columns.items() if is_numeric_type(typ)]
    # A float's exact value: the exact extreme.
    return {column: Bounds(Fraction(low), Fraction(high))
            for column, (low, high) in data.column_ranges(stored, numeric).items()}


def _keyed_condition(condition: exp.Expr, keys: list[_JoinKey]) -> exp.Expr:
    """The join condition that runs: each key equality compares the private side, cast
    (total: TRY where it could fail), with the stored public key; every other part is made
    total (an error becomes false)."""
    parts: list[exp.Expr] = []
    for part in _conjuncts(condition):
        key = next((k for k in keys if part is k.private.parent or part is k.public.parent), None)
        if key is None:
            parts.append(exp.func("COALESCE", exp.func("TRY", part.copy()), exp.false()))
    for key in keys:
        public_alias = next(key.public.find_all(exp.Column)).table
        value: exp.Expr = _compared(key.private.copy(), key.comparison, key.private_type)
        if not isinstance(key.private, exp.Column):
            value = exp.func("TRY", value)
        parts.insert(key.index, exp.EQ(this=value, expression=exp.column(key.stored, table=public_alias, quoted=True)))
    return exp.and_(*parts)


def _public_join_rule(private: Relation, public: _Public, names, tag) -> PrivateTable:
    """The joined relation's unit and column rules (its limits are its ``Step``'s)."""
    other = "r" if tag == "l" else "l"
    rule = private.rule
    public_rules = tuple(_public_column_rule(public, column, names[(other, column)]) for column in public.columns)
    return PrivateTable(
        name=f"{rule.name} ⋈ {public.label}",
        unit=names[(tag, private.unit)],  # row-level tables have their hidden unit too
        columns=_renamed_rule(rule, names, tag) + public_rules,
    )


def _renamed_rule(rule: PrivateTable, names: dict, tag: str) -> tuple[ColumnRule, ...]:
    return tuple(replace(c, name=names[(tag, c.name.lower())]) for c in rule.columns
                 if (tag, c.name.lower()) in names)


def _public_column_rule(public: _Public, column: str, name: str) -> ColumnRule:
    """A public column's bounds and key domain: public facts. Bounds are those of the stored
    rows the join reads, computed with the multiplicity (``_public_facts``)."""
    keys = KeyDomain(table=public.table, column=column, joined=public.tag) if public.table else None
    return ColumnRule(name=name, bounds=public.ranges.get(column), keys=keys)


def _as_source(node: exp.Expression) -> exp.Expression:
    return node if isinstance(node, exp.Table) else exp.Subquery(this=node.copy())


# ------------------------------------------------------------------------------------------
# Subqueries


def _subquery(query: exp.Expression, reference: str, policy, catalog, sql, data, ctes):
    if isinstance(query, exp.Union):
        return _union(query, reference, policy, catalog, sql, data, ctes)
    if not isinstance(query, exp.Select):
        refuse(query, sql, f"{describe(query)} is not supported as a subquery", "write a SELECT")
    tables = [t for t in query.find_all(exp.Table)]
    from_ = query.args.get("from_") or query.args.get("from")
    if from_ is None:
        refuse(query, sql, "a subquery must read a table", "add FROM <table>")
    inner = build_relation(from_, query.args.get("joins") or [], policy, catalog, sql, data, ctes) \
        if touches_private(tables, policy, catalog, ctes) else None
    if inner is None:
        return _public_subquery(query, reference, sql, data)
    for part in ("order", "limit", "offset", "qualify", "windows", "laterals", "sample"):
        if query.args.get(part):
            refuse(query.args[part], sql, f"{part.upper()} inside a subquery over private data would pick "
                   "rows across units", "filter with WHERE, or sort the final result instead")
    body = query.copy()
    _bind_to(body, inner, sql)
    where = body.args.get("where")
    if where is not None:
        check_row_level(where.this, sql, "WHERE")
    group = body.args.get("group")
    if group is None and not any(isinstance(e.unalias(), exp.AggFunc) or e.find(exp.AggFunc) for e in body.expressions):
        return _row_projection(body, inner, reference, sql, data)
    return _unit_aggregation(body, inner, reference, sql, data)


def touches_private(tables, policy, catalog, ctes) -> bool:
    """True when any table (following CTEs) is private: anything derived from it is private."""
    for table in tables:
        name = table.name.lower()
        if not table.db and name in ctes:
            if touches_private(list(ctes[name].find_all(exp.Table)), policy, catalog, ctes):
                return True
            continue
        if policy.is_private(table_key(table)):
            return True
    return False


def _bind_to(body: exp.Select, inner: Relation, sql: str) -> None:
    """Resolve the subquery's own columns against its FROM relation (not nested subqueries)."""
    for column in list(body.find_all(exp.Column)):
        if column.find_ancestor(exp.Subquery) is not None and column.find_ancestor(exp.Subquery) is not body:
            continue
        resolved = resolve_column(column, inner.scope, inner.columns, sql)  # a STRUCT field too
        if resolved is None:
            refuse(column, sql, f"unknown column {column.sql(dialect=DIALECT)}",
                   columns_hint(column.name, [c for q, c in inner.scope if q is None]))
        replace_column(column, resolved)
    bind_brackets(body, inner.columns, sql)


def _wrap_body(body: exp.Select, inner: Relation, items: list) -> exp.Select:
    select = exp.Select(expressions=items).from_(exp.alias_(_as_source(inner.sql), "dp_in"))
    where = body.args.get("where")
    if where is not None:
        select = select.where(exp.func("COALESCE", exp.func("TRY", where.this.copy()), exp.false()))
    return select


def _row_projection(body: exp.Select, inner: Relation, reference: str, sql: str, data) -> Relation:
    rule = inner.rule
    items: list[exp.Expr] = []
    rules: list[ColumnRule | None] = []
    unit = None
    hidden = inner.hidden_unit
    for item in body.expressions:
        node = item.unalias()
        if isinstance(node, exp.Star):
            for column in inner.columns:
                if hidden and column == rule.unit:
                    continue
                items.append(exp.column(column, quoted=True))
                kept = rule.column(column)
                rules.append(kept and replace(kept, name=column))
                unit = unit or (column if rule.unit and column == _unit(rule).lower() else None)
            continue
        name = (item.alias if isinstance(item, exp.Alias) else node.name if isinstance(node, exp.Column)
                else node.sql(dialect=DIALECT).replace('"', "")).lower()
        check_row_level(node, sql, "a subquery's select list")
        if isinstance(node, exp.Column):
            items.append(exp.alias_(node.copy(), name, quoted=True))
            kept = rule.column(node.name)
            rules.append(kept and replace(kept, name=name))
            if rule.unit and node.name == _unit(rule).lower():
                unit = name
            continue
        items.append(exp.alias_(exp.func("TRY", node.copy()), name, quoted=True))
        rules.append(_derived_rule(node, name, inner))
    if hidden:  # each row its own unit: its id goes along, under a name no analyst column has
        if any(_output_name(item) == ROW_UNIT for item in body.expressions):
            refuse(body, sql, f"the name {ROW_UNIT} is reserved for dpsql's per-row unit", "choose another alias")
        items.append(exp.alias_(exp.column(_unit(rule), quoted=True), ROW_UNIT, quoted=True))
        unit = ROW_UNIT
    if rule.unit and unit is None:
        refuse(body, sql, f"the subquery must select the privacy unit column {rule.unit}, so that its rows "
               "stay attributable to units", f"add {rule.unit} to its select list")
    select = _wrap_body(body, inner, items)
    label = f"({inner.label})"
    step = Step(ROW_SUBQUERY, label, rule.max_rows_per_unit, rule.max_groups_per_unit, inner.rows_per_unit,
                f"{label}: row by row, so no unit gains rows")
    return _finish(select, replace(rule, unit=unit, columns=tuple(r for r in rules if r)), reference, data, inner,
                   step, hidden)


def _output_name(item: exp.Expression) -> str:
    node = item.unalias()
    return (item.alias if isinstance(item, exp.Alias) else node.name if isinstance(node, exp.Column)
            else "").lower()


def _derived_rule(node, name, inner: Relation) -> ColumnRule | None:
    try:
        interval = derive_range(node, lambda c: _interval(inner, c), "")
    except Exception:
        return None  # not summable later; COUNT still works
    if interval is None:
        return None
    return ColumnRule(name=name, bounds=Bounds(interval.lower, interval.upper))


def _interval(relation: Relation, column: str) -> Interval | None:
    rule = relation.rule.column(column)
    if rule is None or rule.bounds is None:
        return None
    integral = is_integral_type(relation.columns.get(column, "")) and all(
        b.denominator == 1 for b in (rule.bounds.lower, rule.bounds.upper))
    return Interval(rule.bounds.lower, rule.bounds.upper, integral)


UNIT_AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "mean", exp.Min: "mean", exp.Max: "mean",
                   exp.Median: "mean", exp.AnyValue: "mean"}
"""Per-unit aggregates and the bounds of their result: [0, k], k * [min(lo,0), max(hi,0)], [lo, hi].
ANY_VALUE is computed as MIN (any value, but the same whatever the row order)."""


def _unit_aggregation(body: exp.Select, inner: Relation, reference: str, sql: str, data) -> Relation:
    rule = inner.rule
    group = body.args.get("group")
    grouped = [] if group is None else [resolve_group_item(g, body) for g in group.expressions]
    unit = _unit(rule).lower()
    if inner.hidden_unit:  # each row its own unit: a per-unit aggregate would be one row's value
        refuse(group or body, sql, f"an aggregate inside a subquery needs a privacy unit column, and each row of "
               f"{inner.label} is its own unit", "aggregate in the outer query only: it adds the noise")
    if not any(isinstance(g, exp.Column) and g.name == unit for g in grouped):
        refuse(group or body, sql, "an aggregate inside a subquery must be computed per privacy unit",
               f"GROUP BY {sql_name(_unit(rule))} in the subquery (aggregating across units happens "
               "in the outer query, with noise)")
    for g in grouped:
        check_row_level(g, sql, "GROUP BY")
    if body.args.get("having") is not None:
        refuse(body.args["having"], sql, "HAVING inside a per-unit subquery is not supported (its aggregates "
               "cannot be made error-free)", "filter on the subquery's columns in the outer query's WHERE")
    # Row-level parts that could fail for one unit's rows are made total: keys and aggregate
    # arguments under TRY; SUM and AVG over DOUBLE, which cannot overflow (the outer clamp
    # bounds the result whatever it is).
    safe_keys = [g if isinstance(g, exp.Column) else exp.func("TRY", g.copy()) for g in grouped]
    k = rule.max_rows_per_unit
    items, rules, unit_name = [], [], None
    for item in body.expressions:
        node = item.unalias()
        name = (item.alias if isinstance(item, exp.Alias) else node.name if isinstance(node, exp.Column)
                else node.sql(dialect=DIALECT).replace('"', "")).lower()
        if any(node == g for g in grouped):
            items.append(exp.alias_(safe_keys[grouped.index(node)].copy(), name, quoted=True))
            kept = rule.column(node.name) if isinstance(node, exp.Column) else None
            rules.append(kept and replace(kept, name=name))
            if isinstance(node, exp.Column) and node.name == unit:
                unit_name = name
            continue
        if isinstance(node, (exp.IgnoreNulls, exp.RespectNulls)):
            node = node.this  # ANY_VALUE(x) parses wrapped in IGNORE NULLS
        if not isinstance(node, exp.AggFunc) or type(node) not in UNIT_AGGREGATES:
            refuse(node, sql, f"{describe(node)} in a per-unit subquery must be a group key or COUNT, SUM, "
                   "AVG, MIN, MAX or MEDIAN of a row-level expression", "aggregate a column of the table")
        argument = node.this
        if isinstance(argument, exp.Distinct):
            if not isinstance(node, exp.Count):
                refuse(cast(exp.Expression, node), sql, "DISTINCT inside a per-unit aggregate is supported only "
                       "in COUNT", "drop DISTINCT, or count distinct values")
            argument = argument.expressions[0]  # COUNT(DISTINCT x) per unit is in [0, k] too
        if not isinstance(argument, exp.Star):
            check_row_level(argument, sql, describe(node))
        items.append(exp.alias_(_total_aggregate(node), name, quoted=True))
        rules.append(_aggregate_rule(UNIT_AGGREGATES[type(node)], argument, name, inner, k))
    if unit_name is None:
        refuse(body, sql, f"the subquery must select the privacy unit column {sql_name(_unit(rule))}",
               f"add {sql_name(_unit(rule))} to its select list")
    select = _wrap_body(body, inner, items)
    select.set("group", exp.Group(expressions=[g.copy() for g in safe_keys]))
    only_unit = len(grouped) == 1
    # One output row per (unit, group) of the inner rows: at most one, or at most its rows.
    label = f"({inner.label} per unit)"
    step = Step(UNIT_SUBQUERY, label, 1 if only_unit else k, rule.max_groups_per_unit,
                1 if only_unit else inner.rows_per_unit,
                f"{label}: one row per unit" if only_unit else
                f"{label}: one row per unit and group, so no unit gains rows")
    synthetic = replace(rule, unit=unit_name, columns=tuple(r for r in rules if r))
    return _finish(select, synthetic, reference, data, inner, step, False)


def _total_aggregate(node: exp.AggFunc) -> exp.Expr:
    """A per-unit aggregate that cannot raise and whose result does not depend on row order.

    The argument goes under TRY. SUM and AVG add DOUBLEs (which cannot overflow; the outer
    clamp bounds the result whatever it is), in ascending order of the values: a float sum
    depends on the order of its terms, and DuckDB's order of a unit's rows can follow their
    physical order or its threads, so one unit's result could depend on other units' rows
    (invariant 5). Equal values are interchangeable, so the sorted order fixes the result.
    ANY_VALUE becomes MIN: any one of the values, the same one whatever the order.
    """
    node = node.copy()
    if isinstance(node, exp.AnyValue):
        node = exp.Min(this=node.this)
    argument = node.this
    if isinstance(argument, exp.Star):
        return node
    inner = argument.expressions[0] if isinstance(argument, exp.Distinct) else argument
    if isinstance(node, (exp.Sum, exp.Avg)):
        value = exp.func("TRY", exp.cast(inner.copy(), "DOUBLE"))
        order = [exp.Ordered(this=value.copy(), nulls_first=False)]
        return type(node)(this=exp.Order(this=value, expressions=order))
    safe = exp.func("TRY", inner.copy())
    if isinstance(argument, exp.Distinct):
        argument.set("expressions", [safe])
    else:
        node.set("this", safe)
    return node


def _aggregate_rule(kind: str, argument, name: str, inner: Relation, k: int) -> ColumnRule | None:
    if kind == "count":
        return ColumnRule(name=name, bounds=Bounds(Fraction(0), Fraction(k)))
    interval = None
    if not isinstance(argument, exp.Star):
        try:
            interval = derive_range(argument, lambda c: _interval(inner, c), "")
        except Exception:
            interval = None
    if interval is None:
        return None
    if kind == "sum":
        zero = Fraction(0)
        return ColumnRule(name=name, bounds=Bounds(k * min(interval.lower, zero), k * max(interval.upper, zero)))
    return ColumnRule(name=name, bounds=Bounds(interval.lower, interval.upper))


def _finish(select: exp.Select, rule: PrivateTable, reference: str, data, inner: Relation, step: Step,
            hidden: bool) -> Relation:
    """The relation of a subquery, its limits those of ``step``; a ``hidden`` unit column stays
    out of its scope."""
    columns = dict(data.describe(select)) if data is not None else {}
    columns = {name.lower(): typ for name, typ in columns.items()}
    scope = column_scope(reference, _visible(columns, _unit(rule), hidden))
    return Relation(select, step.limits(rule), columns, scope, step.label, bounded=inner.bounded,
                    stability=inner.stability + (step,))


def _visible(columns: dict, unit: str, hidden: bool) -> dict:
    """The columns the analyst may name: all but a hidden unit."""
    return {c: t for c, t in columns.items() if not (hidden and c == unit)}


def _union(query: exp.Union, reference, policy, catalog, sql, data, ctes) -> Relation:
    if not isinstance(query, exp.Union) or query.args.get("distinct"):
        refuse(query, sql, f"{describe(query)} is not supported over private data",
               "combine branches with UNION ALL")
    branches = [b for b in (query.this, query.expression)]
    relations = [_subquery(b.this if isinstance(b, exp.Subquery) else b, reference, policy, catalog, sql, data, ctes)
                 for b in branches]
    if not all(isinstance(r, Relation) for r in relations):
        refuse(query, sql, "every branch of a UNION ALL over private data must keep the privacy unit",
               "select the unit column in each branch")
    if len({r.hidden_unit for r in relations}) > 1:
        refuse(query, sql, "a UNION ALL cannot combine a table whose rows are each their own privacy unit with "
               "a table whose unit is a column: their units cannot be matched",
               "combine row-level tables only with row-level tables")
    first = relations[0]
    hidden = first.hidden_unit
    columns = list(first.columns)
    positions = [list(r.columns).index(_unit(r.rule).lower()) if _unit(r.rule).lower() in r.columns else -1
                 for r in relations]
    if len(set(positions)) != 1 or positions[0] < 0 or any(len(r.columns) != len(columns) for r in relations):
        refuse(query, sql, "the branches of a UNION ALL must have the same columns, with the privacy unit "
               "in the same position", "select the same columns in each branch")
    _same_unit_type(relations, query, sql, "a UNION ALL")
    rules = []
    for index, name in enumerate(columns):
        parts = [r.rule.column(list(r.columns)[index]) for r in relations]
        if all(p is not None and p.bounds is not None for p in parts):
            bounds = Bounds(min(p.bounds.lower for p in parts), max(p.bounds.upper for p in parts))
            rules.append(ColumnRule(name=name, bounds=bounds))
    union = exp.union(*[exp.Select(expressions=[exp.column(c, quoted=True) for c in r.columns]).from_(
        exp.alias_(_as_source(r.sql), "dp_b")) for r in relations], distinct=False)
    name = " ∪ ".join(r.rule.name for r in relations)
    held_by = [r.rows_per_unit for r in relations]
    held = None if any(h is None for h in held_by) else sum(h for h in held_by if h is not None)
    check_fan_out(query, sql, held, tuple(held_by), policy.max_rows_after_joins, "this UNION ALL adds up its "
                  "branches' rows per unit (" + " + ".join(str(h) for h in held_by) + ")",
                  "combine fewer branches, or aggregate per unit in each branch (GROUP BY the unit), "
                  "which leaves one row per unit and branch")
    # A unit's rows in the union are its rows in every branch: the limits add up.
    step = Step(UNION_ALL, name, sum(r.rule.max_rows_per_unit for r in relations),
                sum(r.rule.groups_per_unit for r in relations), held,
                f"{name}: the branches' rows of one unit add up")
    rule = step.limits(PrivateTable(name=name, unit=columns[positions[0]], columns=tuple(rules)))
    scope = column_scope(reference, _visible(first.columns, _unit(rule), hidden))
    return Relation(union, rule, dict(first.columns), scope, rule.name,
                    bounded=frozenset().union(*(r.bounded for r in relations)),
                    stability=tuple(s for r in relations for s in r.stability) + (step,))


def _public_subquery(query: exp.Select, reference: str, sql: str, data) -> _Public:
    if data is None:
        refuse(query, sql, "public subqueries need the database", "run the query through dpsql.connect")
    check_public(query, sql, deterministic=True)
    columns = {name.lower(): typ for name, typ in data.describe(query)}
    return _Public(query.copy(), columns, column_scope(reference, columns), f"({reference})")


def _unit(rule: PrivateTable) -> str:
    """A relation's unit column: every relation has one (a row-level table's is its hidden
    per-row id, ``ROW_UNIT``)."""
    if rule.unit is None:
        raise InternalError(f"the relation {rule.name} has no unit column: this is a bug in dpsql")
    return rule.unit
