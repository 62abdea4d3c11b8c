"""The FROM clause of a private query, walked into its relation (``dpsql.analysis.relation``).

Tables, CTE references, subqueries, joins and UNION ALL are each turned into a relation by
the module that states their rule (``joins``, ``subqueries``); this module dispatches and
decides what is private (anything derived from a private table: taint follows the data).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.analysis.bind import (
    Catalog,
    bind_table,
    column_scope,
    table_key,
)
from dpsql.analysis.joins import join_relations, same_unit_type
from dpsql.analysis.relation import PublicSide, Relation, as_source, unit_of, visible_columns
from dpsql.analysis.sampling import poisson_rate
from dpsql.analysis.stability import (
    TABLE,
    UNION_ALL,
    Step,
    check_fan_out,
)
from dpsql.analysis.subqueries import aggregate_per_unit, bind_to, project_rows, public_subquery
from dpsql.policy.model import Bounds, ColumnRule, Policy, PrivateTable, PublicTable
from dpsql.sql.allowlist import check_row_level, refuse
from dpsql.sql.names import ROW_UNIT, ROW_UNIT_TYPE
from dpsql.sql.parse import describe
from dpsql.sql.pieces import bounded_read

if TYPE_CHECKING:  # the protocol only: the check asks the engine through it, never imports one
    from dpsql.backends.base import Backend


def build_relation(from_: exp.From, joins: list, policy: Policy, catalog: Catalog, data: Backend | None,
                   ctes: dict) -> Relation:
    """The relation of a FROM clause and its joins (private: at least one private table)."""
    current = _item(from_.this, policy, catalog, data, ctes)
    for join in joins:
        other = _item(join.this, policy, catalog, data, ctes)
        current = join_relations(current, other, join, data, policy.max_join_multiplicity,
                                 policy.max_rows_after_joins)
    if isinstance(current, PublicSide):
        refuse(from_, "private data may be read only in FROM: this query's FROM reads public tables only "
               "while another part of it reads a private table", "aggregate the private table in FROM, "
               "joining the public one")
    return current


def _item(node: exp.Expression, policy, catalog, data, ctes):
    """One FROM item: a table, a CTE reference or a subquery."""
    alias = node.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns:  # DuckDB renames by position: not carried
        refuse(alias, f"a column list in the alias {alias.name}({', '.join(c.name for c in alias.columns)}) is not "
               "supported in a query over private data", "rename in a subquery instead: "
               "(SELECT k AS m, ... FROM p) AS q")
    sample = node.args.get("sample")
    if sample is not None and (not isinstance(node, exp.Table) or (node.name.lower() in ctes and not node.db)):
        refuse(sample, "TABLESAMPLE applies to a private table itself, not to a subquery or a CTE",
               "write TABLESAMPLE POISSON (10 PERCENT) after the private table inside the subquery or CTE")
    pivots = node.args.get("pivots")
    if pivots:  # reshapes rows, so it would have to be carried into the bounded read: refused
        refuse(pivots[0], "PIVOT and UNPIVOT are not supported in a query over private data",
               "aggregate with GROUP BY, or write one aggregate per column: SUM(a), SUM(b)")
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier) and not node.db \
            and node.name.lower() in ctes:
        reference = (node.alias or node.name).lower()
        return _subquery(ctes[node.name.lower()], reference, policy, catalog, data, ctes)
    if isinstance(node, exp.Table):
        bound = bind_table(node, policy, catalog)
        sample = node.args.get("sample")
        if sample is not None and isinstance(bound.declaration, PublicTable):
            refuse(sample, f"TABLESAMPLE of public table {bound.declaration.name}: sampling buys privacy only "
                   "for a private table's units", "read the public table whole")
        rate = None if sample is None else poisson_rate(sample, bound.declaration.name)
        columns = dict(bound.columns)
        table_sql = exp.to_table(".".join(f'"{p}"' for p in bound.name.split(".")))
        scope = column_scope(bound.reference, columns, bound.name.split(".")[-1])
        if isinstance(bound.declaration, PublicTable):
            return PublicSide(table_sql, columns, scope, bound.name, bound.declaration.name)
        rule = bound.declaration
        if rule.row_level:  # a unit-level table whose unit is the hidden per-row id
            rule = replace(rule, unit=ROW_UNIT)
            columns[ROW_UNIT] = ROW_UNIT_TYPE
        # Read through its bounded copy: at most k rows per unit before any analyst expression.
        step = Step(TABLE, bound.name, rule.max_rows_per_unit, rule.max_groups_per_unit, rule.max_rows_per_unit,
                    f"{bound.name}: read through its bounded copy, at most {rule.max_rows_per_unit} rows per unit")
        declared = bound.declaration
        unit = unit_of(rule).lower()
        sampled = None if rate is None else (rate, unit, columns[unit])
        source = bounded_read(bound.name, declared.unit, declared.max_rows_per_unit, declared.max_list_length,
                              declared.max_string_length, columns, sample=sampled)
        return Relation(source, rule, columns, scope, bound.name, bounded=frozenset({bound.name}), stability=(step,))
    if isinstance(node, exp.Subquery):
        reference = (node.alias or "").lower()
        if not reference:  # dpsql.analysis.check names each one as DuckDB does: this is a bug
            refuse(node, "a subquery in FROM needs an alias", "write (SELECT ...) AS t")
        return _subquery(node.this, reference, policy, catalog, data, ctes)
    refuse(node, f"{describe(node)} is not supported in FROM", "read declared tables or subqueries")


def _subquery(query: exp.Expression, reference: str, policy, catalog, data, ctes):
    if isinstance(query, exp.Union):
        return _union(query, reference, policy, catalog, data, ctes)
    if not isinstance(query, exp.Select):
        refuse(query, f"{describe(query)} is not supported as a subquery", "write a SELECT")
    tables = [t for t in query.find_all(exp.Table)]
    from_ = query.args.get("from_") or query.args.get("from")
    if from_ is None:
        refuse(query, "a subquery must read a table", "add FROM <table>")
    inner = build_relation(from_, query.args.get("joins") or [], policy, catalog, data, ctes) \
        if touches_private(tables, policy, catalog, ctes) else None
    if inner is None:
        return public_subquery(query, reference, data)
    for part in ("order", "limit", "offset", "qualify", "windows", "laterals", "sample"):
        if query.args.get(part):
            refuse(query.args[part], f"{part.upper()} inside a subquery over private data would pick "
                   "rows across units", "filter with WHERE, or sort the final result instead")
    body = query.copy()
    bind_to(body, inner)
    where = body.args.get("where")
    if where is not None:
        check_row_level(where.this, "WHERE")
    group = body.args.get("group")
    if group is None and not any(isinstance(e.unalias(), exp.AggFunc) or e.find(exp.AggFunc) for e in body.expressions):
        return project_rows(body, inner, reference, data)
    return aggregate_per_unit(body, inner, reference, data)


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


def _union(query: exp.Union, reference, policy, catalog, data, ctes) -> Relation:
    if not isinstance(query, exp.Union) or query.args.get("distinct"):
        refuse(query, f"{describe(query)} is not supported over private data",
               "combine branches with UNION ALL")
    branches = [b for b in (query.this, query.expression)]
    relations = [_subquery(b.this if isinstance(b, exp.Subquery) else b, reference, policy, catalog, data, ctes)
                 for b in branches]
    if not all(isinstance(r, Relation) for r in relations):
        refuse(query, "every branch of a UNION ALL over private data must keep the privacy unit",
               "select the unit column in each branch")
    if len({r.hidden_unit for r in relations}) > 1:
        refuse(query, "a UNION ALL cannot combine a table whose rows are each their own privacy unit with "
               "a table whose unit is a column: their units cannot be matched",
               "combine row-level tables only with row-level tables")
    first = relations[0]
    hidden = first.hidden_unit
    columns = list(first.columns)
    positions = [list(r.columns).index(unit_of(r.rule).lower()) if unit_of(r.rule).lower() in r.columns else -1
                 for r in relations]
    if len(set(positions)) != 1 or positions[0] < 0 or any(len(r.columns) != len(columns) for r in relations):
        refuse(query, "the branches of a UNION ALL must have the same columns, with the privacy unit "
               "in the same position", "select the same columns in each branch")
    same_unit_type(relations, query, "a UNION ALL")
    rules = []
    for index, name in enumerate(columns):
        parts = [r.rule.column(list(r.columns)[index]) for r in relations]
        if all(p is not None and p.bounds is not None for p in parts):
            bounds = Bounds(min(p.bounds.lower for p in parts), max(p.bounds.upper for p in parts))
            rules.append(ColumnRule(name=name, bounds=bounds))
    union = exp.union(*[exp.Select(expressions=[exp.column(c, quoted=True) for c in r.columns]).from_(
        exp.alias_(as_source(r.sql), "dp_b")) for r in relations], distinct=False)
    name = " ∪ ".join(r.rule.name for r in relations)
    held_by = [r.rows_per_unit for r in relations]
    held = None if any(h is None for h in held_by) else sum(h for h in held_by if h is not None)
    check_fan_out(query, held, tuple(held_by), policy.max_rows_after_joins, "this UNION ALL adds up its "
                  "branches' rows per unit (" + " + ".join(str(h) for h in held_by) + ")",
                  "combine fewer branches, or aggregate per unit in each branch (GROUP BY the unit), "
                  "which leaves one row per unit and branch")
    # A unit's rows in the union are its rows in every branch: the limits add up.
    step = Step(UNION_ALL, name, sum(r.rule.max_rows_per_unit for r in relations),
                sum(r.rule.groups_per_unit for r in relations), held,
                f"{name}: the branches' rows of one unit add up")
    rule = step.limits(PrivateTable(name=name, unit=columns[positions[0]], columns=tuple(rules)))
    scope = column_scope(reference, visible_columns(first.columns, unit_of(rule), hidden))
    return Relation(union, rule, dict(first.columns), scope, rule.name,
                    bounded=frozenset().union(*(r.bounded for r in relations)),
                    stability=tuple(s for r in relations for s in r.stability) + (step,))
