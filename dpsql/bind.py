"""Stage 2, bind: resolve every table and column of a query against the declared catalog.

Names resolve as DuckDB resolves them: case-insensitively, with an optional ``schema.`` (and
``catalog.``) prefix. Only tables declared in the policy exist for the analyst; a table the
database has but the policy does not declare is reported exactly like a missing one, so the
error reveals nothing the analyst could not already know.

Binding rewrites each column reference to its canonical catalog name, qualified by nothing
(one table per query in the core), and records the column's DuckDB type.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from .errors import UnsupportedQuery
from .model import Policy, PrivateTable, PublicTable
from .parse import node_position

Catalog = dict[str, dict[str, str]]
"""Lower-cased table name (``schema.table`` outside ``main``) -> {lower column name: type}."""


@dataclass(frozen=True)
class BoundTable:
    """A table reference resolved to its declaration and its columns."""

    name: str
    """Catalog key of the table (lower-cased)."""
    declaration: PrivateTable | PublicTable
    """What the policy says of the table."""
    columns: dict
    """Lower-cased column name -> DuckDB type name."""
    reference: str
    """The name the query refers to it by (its alias, or its own name), lower-cased."""


def table_key(table: exp.Table) -> str:
    """Catalog key of a table reference: ``schema.table``, with the default schema dropped.

    >>> import sqlglot
    >>> table_key(sqlglot.parse_one("SELECT 1 FROM Main.Visits").find(exp.Table))
    'visits'
    """
    parts = [p.name.lower() for p in table.parts]
    if len(parts) == 2 and parts[0] == "main":
        parts = parts[1:]
    return ".".join(parts)


def bind_table(table: exp.Table, policy: Policy, catalog: Catalog, sql: str) -> BoundTable:
    """Resolve one table reference, or refuse it with its position."""
    line, col = node_position(table, sql)
    if not isinstance(table.this, exp.Identifier):
        raise UnsupportedQuery(
            f"table functions such as {table.this.sql(dialect='duckdb')} are not allowed",
            line=line,
            col=col,
            construct=table.this.sql(dialect="duckdb"),
            hint="query the tables declared in the policy",
        )
    if len(table.parts) > 2:
        # A database part would name another attached database (or dpsql's own), whose tables
        # the policy never declared: refused, whatever the rest of the name says.
        raise UnsupportedQuery(
            f"a table name with a database part ({'.'.join(p.name for p in table.parts)}) is not allowed",
            line=line,
            col=col,
            construct=".".join(p.name for p in table.parts),
            hint="name the table as the policy declares it, such as "
                 f"{'.'.join(p.name for p in table.parts[-2:])} or {table.parts[-1].name}",
        )
    key = table_key(table)
    declaration = policy.table(key)
    if declaration is None or key not in catalog:
        declared = ", ".join(sorted(t.name for t in (*policy.private_tables, *policy.public_tables)))
        raise UnsupportedQuery(
            f"unknown table {'.'.join(p.name for p in table.parts)}",
            line=line,
            col=col,
            construct=key,
            hint=f"the tables you can query are: {declared}",
        )
    reference = (table.alias or table.name).lower()
    return BoundTable(key, declaration, catalog[key], reference)


BOUND = "dp_bound"
"""Meta flag of an identifier resolved to a relation column (anything else is an alias)."""


def is_bound(column: exp.Column) -> bool:
    """True for a column reference bind resolved; False for a select-list alias reference."""
    return bool(column.this.meta.get(BOUND)) if isinstance(column.this, exp.Identifier) else False


def scope_of(bound: BoundTable) -> dict:
    """(qualifier or None, column) -> column, for a query over one table."""
    scope = {}
    for column in bound.columns:
        scope[(None, column)] = column
        for qualifier in {bound.reference, bound.name.split(".")[-1]}:
            scope[(qualifier, column)] = column
    return scope


def bind_columns(nodes: list, scope: dict, sql: str, aliases: frozenset = frozenset()) -> None:
    """Resolve every column of ``nodes`` (in place) through ``scope``.

    As in DuckDB, ORDER BY prefers a select-list alias to a column, GROUP BY and HAVING a
    column to an alias; alias references are left unmarked (see ``is_bound``) for the check
    stage to resolve.
    """
    names = {c for (q, c) in scope}
    for node in nodes:
        for column in list(node.find_all(exp.Column)):
            if isinstance(column.this, exp.Star):
                continue
            if _is_alias_reference(column, names, aliases):
                continue
            qualifier = column.table.lower() if column.table else None
            target = scope.get((qualifier, column.name.lower()))
            if target is None:
                line, col = node_position(column, sql)
                shown = column.sql(dialect="duckdb")
                known_qualifier = qualifier is None or any(q == qualifier for (q, _) in scope)
                raise UnsupportedQuery(
                    f"unknown column {column.name}" if known_qualifier else f"unknown table or alias {column.table} in {shown}",
                    line=line, col=col, construct=shown,
                    hint=f"the columns are: {', '.join(sorted(c for (q, c) in scope if q is None))}")
            identifier = exp.to_identifier(target, quoted=True)
            identifier.meta.update(column.this.meta)  # keep the position for later refusals
            identifier.meta[BOUND] = True
            column.replace(exp.Column(this=identifier))


def _is_alias_reference(column: exp.Column, names: set, aliases: frozenset) -> bool:
    if column.table or column.name.lower() not in aliases:
        return False
    if column.find_ancestor(exp.Order) is not None:
        return True
    in_clause = column.find_ancestor(exp.Group, exp.Having) is not None
    return in_clause and column.name.lower() not in names
