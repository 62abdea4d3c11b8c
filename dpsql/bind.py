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
from .names import columns_hint, sql_name
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
        declared = {t.name.lower(): t.name for t in (*policy.private_tables, *policy.public_tables)}
        raise UnsupportedQuery(
            f"unknown table {written_name(table)}",
            line=line,
            col=col,
            construct=key,
            hint=columns_hint(key, list(declared), declared, what="tables you can query"),
        )
    reference = (table.alias or table.name).lower()
    return BoundTable(key, declaration, catalog[key], reference)


BOUND = "dp_bound"
"""Meta flag of an identifier resolved to a relation column (anything else is an alias)."""

WRITTEN = "dp_written"
"""Meta of a bound identifier: the name as the query wrote it (``"Customer ID"``), for messages."""


def written_name(node: exp.Expression) -> str:
    """A column or table name as the query wrote it, quoted if it was: for messages and hints,
    which must show names the analyst can paste back (bound names are lower-cased keys).

    >>> import sqlglot
    >>> written_name(sqlglot.parse_one('SELECT "Amount Paid"').find(exp.Column))
    '"Amount Paid"'
    >>> written_name(sqlglot.parse_one('SELECT x FROM Main."My Table"').find(exp.Table))
    'Main."My Table"'
    """
    if isinstance(node, exp.Table):
        return ".".join(part.sql(dialect="duckdb") for part in node.parts)
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier):
        if node.this.meta.get(WRITTEN):
            return node.this.meta[WRITTEN]
        return node.this.sql(dialect="duckdb")
    return sql_name(getattr(node, "name", "") or node.sql(dialect="duckdb"))


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


def bind_columns(nodes: list, scope: dict, sql: str, aliases: frozenset = frozenset(),
                 spellings: dict | None = None) -> None:
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
                _refuse_unbound(column, qualifier, scope, sql, spellings)
            identifier = exp.to_identifier(target, quoted=True)
            identifier.meta.update(column.this.meta)  # keep the position for later refusals
            identifier.meta[BOUND] = True
            identifier.meta.setdefault(WRITTEN, written_name(column))
            column.replace(exp.Column(this=identifier))


def _refuse_unbound(column: exp.Column, qualifier: str | None, scope: dict, sql: str,
                    spellings: dict | None) -> None:
    """Refuse a column the scope does not resolve, saying why: a bare name two joined tables
    both have (ambiguous), a name its qualifier's table lacks (the hint lists that table's
    columns, and the tables that do have it), an unknown qualifier, or an unknown name. A hint
    never offers the very name it refuses as available.

    >>> import sqlglot
    >>> scope = {(None, "uid"): "uid", ("v", "uid"): "uid", ("v", "amount"): "amount",
    ...          ("visits", "amount"): "amount", ("s", "amount"): "s.amount", ("s", "sz"): "sz", (None, "sz"): "sz"}
    >>> _refuse_unbound(sqlglot.parse_one("SELECT v.sz").find(exp.Column), "v", scope, "", None)
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: unknown column v.sz: v has no column sz (line 1, column 8). Hint: sz is a column of s; the columns of v are: amount, uid.
    >>> _refuse_unbound(sqlglot.parse_one("SELECT amount").find(exp.Column), None, scope, "", None)
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: column amount is ambiguous: s and v both have it (line 1, column 8). Hint: qualify it: s.amount or v.amount.
    """
    line, col = node_position(column, sql)
    shown = column.sql(dialect="duckdb")
    name = column.name.lower()
    by_target: dict[str, list[str]] = {}  # a table read as `t AS a` answers to a and t: name it once
    for (q, c), target in scope.items():
        if q is not None and c == name:
            by_target.setdefault(target, []).append(q)
    holders = sorted(min(names, key=lambda q: (len(q), q)) for names in by_target.values())
    qualifiers = {q for (q, _) in scope if q is not None}
    written = written_name(column)
    if qualifier is None and holders:
        tables = " and ".join(sql_name(q) for q in holders) if len(holders) <= 3 else f"{len(holders)} tables"
        raise UnsupportedQuery(f"column {written} is ambiguous: {tables} both have it" if len(holders) == 2 else
                               f"column {written} is ambiguous: {tables} all have it",
                               line=line, col=col, construct=shown,
                               hint="qualify it: " + " or ".join(f"{sql_name(q)}.{written}" for q in holders))
    if qualifier is not None and qualifier in qualifiers:
        own = sorted({c for (q, c) in scope if q == qualifier})
        elsewhere = (f"{written} is a column of {', '.join(sql_name(q) for q in holders)}; " if holders else "")
        hint = columns_hint(column.name, own, spellings, what=f"columns of {sql_name(column.table)}")
        raise UnsupportedQuery(f"unknown column {shown}: {sql_name(column.table)} has no column {written}",
                               line=line, col=col, construct=shown, hint=elsewhere + hint)
    raise UnsupportedQuery(
        f"unknown column {written}" if qualifier is None else
        f"unknown table or alias {sql_name(column.table)} in {shown}",
        line=line, col=col, construct=shown,
        hint=columns_hint(column.name, [c for (q, c) in scope if q is None], spellings))


def _is_alias_reference(column: exp.Column, names: set, aliases: frozenset) -> bool:
    if column.table or column.name.lower() not in aliases:
        return False
    if column.find_ancestor(exp.Order) is not None:
        return True
    in_clause = column.find_ancestor(exp.Group, exp.Having) is not None
    return in_clause and column.name.lower() not in names
