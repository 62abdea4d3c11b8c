"""Subqueries over a private relation: row by row, or aggregated per privacy unit.

A subquery that keeps the unit column and filters or projects row by row leaves each unit its
rows; one grouped by the unit (and maybe more) leaves one row per unit (and group), whose
per-unit aggregates get bounds derived from their inputs and are computed so that their
result depends neither on errors nor on row order (``total_aggregate``). A public subquery
is checked by the public allow-list and joined like a public table.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import cast

from sqlglot import exp

from dpsql.analysis.bind import (
    bind_brackets,
    column_scope,
    replace_column,
    resolve_column,
    resolve_group_item,
)
from dpsql.analysis.ranges import Interval, derive_range
from dpsql.analysis.relation import PublicSide, Relation, as_source, unit_of, visible_columns
from dpsql.analysis.stability import (
    ROW_SUBQUERY,
    UNIT_SUBQUERY,
    Step,
)
from dpsql.policy.model import Bounds, ColumnRule, PrivateTable
from dpsql.sql.allowlist import check_public, check_row_level, refuse
from dpsql.sql.names import ROW_UNIT, columns_hint, sql_name
from dpsql.sql.parse import DIALECT, describe
from dpsql.sql.pieces import total
from dpsql.sql.types import reads_as_integer


def bind_to(body: exp.Select, inner: Relation) -> None:
    """Resolve the subquery's own columns against its FROM relation (not nested subqueries)."""
    for column in list(body.find_all(exp.Column)):
        if column.find_ancestor(exp.Subquery) is not None and column.find_ancestor(exp.Subquery) is not body:
            continue
        resolved = resolve_column(column, inner.scope, inner.columns)  # a STRUCT field too
        if resolved is None:
            refuse(column, f"unknown column {column.sql(dialect=DIALECT)}",
                   columns_hint(column.name, [c for q, c in inner.scope if q is None]))
        replace_column(column, resolved)
    bind_brackets(body, inner.columns)


def _wrap_body(body: exp.Select, inner: Relation, items: list) -> exp.Select:
    select = exp.Select(expressions=items).from_(exp.alias_(as_source(inner.sql), "dp_in"))
    where = body.args.get("where")
    if where is not None:
        select = select.where(exp.func("COALESCE", total(where.this.copy()), exp.false()))
    return select


def project_rows(body: exp.Select, inner: Relation, reference: str, data) -> Relation:
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
                unit = unit or (column if rule.unit and column == unit_of(rule).lower() else None)
            continue
        name = (item.alias if isinstance(item, exp.Alias) else node.name if isinstance(node, exp.Column)
                else node.sql(dialect=DIALECT).replace('"', "")).lower()
        check_row_level(node, "a subquery's select list")
        if isinstance(node, exp.Column):
            items.append(exp.alias_(node.copy(), name, quoted=True))
            kept = rule.column(node.name)
            rules.append(kept and replace(kept, name=name))
            if rule.unit and node.name == unit_of(rule).lower():
                unit = name
            continue
        items.append(exp.alias_(total(node.copy()), name, quoted=True))
        rules.append(_derived_rule(node, name, inner))
    if hidden:  # each row its own unit: its id goes along, under a name no analyst column has
        if any(_output_name(item) == ROW_UNIT for item in body.expressions):
            refuse(body, f"the name {ROW_UNIT} is reserved for dpsql's per-row unit", "choose another alias")
        items.append(exp.alias_(exp.column(unit_of(rule), quoted=True), ROW_UNIT, quoted=True))
        unit = ROW_UNIT
    if rule.unit and unit is None:
        refuse(body, f"the subquery must select the privacy unit column {rule.unit} itself (not an expression "
               "over it, which could make two units one), so that its rows stay attributable to units",
               f"add {rule.unit} to its select list as it is")
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
        interval = derive_range(node, lambda c: _interval(inner, c))
    except Exception:
        return None  # not summable later; COUNT still works
    if interval is None:
        return None
    return ColumnRule(name=name, bounds=Bounds(interval.lower, interval.upper))


def _interval(relation: Relation, column: str) -> Interval | None:
    rule = relation.rule.column(column)
    if rule is None or rule.bounds is None:
        return None
    integral = reads_as_integer(relation.columns.get(column, "")) and all(
        b.denominator == 1 for b in (rule.bounds.lower, rule.bounds.upper))
    return Interval(rule.bounds.lower, rule.bounds.upper, integral)


UNIT_AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "mean", exp.Min: "mean", exp.Max: "mean",
                   exp.Median: "mean", exp.AnyValue: "mean"}
"""Per-unit aggregates and the bounds of their result: [0, k], k * [min(lo,0), max(hi,0)], [lo, hi].
ANY_VALUE is computed as MIN (any value, but the same whatever the row order)."""


def aggregate_per_unit(body: exp.Select, inner: Relation, reference: str, data) -> Relation:
    rule = inner.rule
    group = body.args.get("group")
    grouped = [] if group is None else [resolve_group_item(g, body) for g in group.expressions]
    unit = unit_of(rule).lower()
    if inner.hidden_unit:  # each row its own unit: a per-unit aggregate would be one row's value
        refuse(group or body, f"an aggregate inside a subquery needs a privacy unit column, and each row of "
               f"{inner.label} is its own unit", "aggregate in the outer query only: it adds the noise")
    if not any(isinstance(g, exp.Column) and g.name == unit for g in grouped):
        refuse(group or body, "an aggregate inside a subquery must be computed per privacy unit",
               f"GROUP BY {sql_name(unit_of(rule))} in the subquery (aggregating across units happens "
               "in the outer query, with noise)")
    for g in grouped:
        check_row_level(g, "GROUP BY")
    if body.args.get("having") is not None:
        refuse(body.args["having"], "HAVING inside a per-unit subquery is not supported (its aggregates "
               "cannot be made error-free)", "filter on the subquery's columns in the outer query's WHERE")
    # Row-level parts that could fail for one unit's rows are made total: keys and aggregate
    # arguments under TRY; SUM and AVG over DOUBLE, which cannot overflow (the outer clamp
    # bounds the result whatever it is).
    safe_keys = [total(g.copy()) for g in grouped]
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
            refuse(node, f"{describe(node)} in a per-unit subquery must be a group key or COUNT, SUM, "
                   "AVG, MIN, MAX or MEDIAN of a row-level expression", "aggregate a column of the table")
        argument = node.this
        if isinstance(argument, exp.Distinct):
            if not isinstance(node, exp.Count):
                refuse(cast(exp.Expression, node), "DISTINCT inside a per-unit aggregate is supported only "
                       "in COUNT", "drop DISTINCT, or count distinct values")
            argument = argument.expressions[0]  # COUNT(DISTINCT x) per unit is in [0, k] too
        if not isinstance(argument, exp.Star):
            check_row_level(argument, describe(node))
        items.append(exp.alias_(total_aggregate(node), name, quoted=True))
        rules.append(_aggregate_rule(UNIT_AGGREGATES[type(node)], argument, name, inner, k))
    if unit_name is None:
        refuse(body, f"the subquery must select the privacy unit column {sql_name(unit_of(rule))}",
               f"add {sql_name(unit_of(rule))} to its select list")
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


def total_aggregate(node: exp.AggFunc) -> exp.Expr:
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
        value = total(exp.cast(inner.copy(), "DOUBLE"))
        order = [exp.Ordered(this=value.copy(), nulls_first=False)]
        return type(node)(this=exp.Order(this=value, expressions=order))
    safe = total(inner.copy())
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
            interval = derive_range(argument, lambda c: _interval(inner, c))
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
    scope = column_scope(reference, visible_columns(columns, unit_of(rule), hidden))
    return Relation(select, step.limits(rule), columns, scope, step.label, bounded=inner.bounded,
                    stability=inner.stability + (step,))


def public_subquery(query: exp.Select, reference: str, data) -> PublicSide:
    if data is None:
        refuse(query, "public subqueries need the database", "run the query through dpsql.connect")
    check_public(query, deterministic=True)
    columns = {name.lower(): typ for name, typ in data.describe(query)}
    return PublicSide(query.copy(), columns, column_scope(reference, columns), f"({reference})")
