"""Stage 2, bind: resolve every table and column of a query against the declared catalog.

Names resolve as DuckDB resolves them: case-insensitively, with an optional ``schema.`` (and
``catalog.``) prefix. Only tables declared in the policy exist for the analyst; a table the
database has but the policy does not declare is reported exactly like a missing one, so the
error reveals nothing the analyst could not already know.

Binding rewrites each column reference to its canonical catalog name, qualified by nothing
(one table per query in the core), and records the column's DuckDB type.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.policy.model import Policy, PrivateTable, PublicTable
from dpsql.sql.names import columns_hint, key_of_parts, sql_name
from dpsql.sql.parse import DIALECT
from dpsql.sql.types import struct_fields

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
    return key_of_parts([p.name for p in table.parts])


def bind_table(table: exp.Table, policy: Policy, catalog: Catalog) -> BoundTable:
    """Resolve one table reference, or refuse it (the refusal carries the table's node)."""
    if not isinstance(table.this, exp.Identifier):
        raise UnsupportedQuery(
            f"table functions such as {table.this.sql(dialect='duckdb')} are not allowed",
            node=table,
            construct=table.this.sql(dialect=DIALECT),
            hint="query the tables declared in the policy",
        )
    if len(table.parts) > 2:
        # A database part would name another attached database (or dpsql's own), whose tables
        # the policy never declared: refused, whatever the rest of the name says.
        raise UnsupportedQuery(
            f"a table name with a database part ({'.'.join(p.name for p in table.parts)}) is not allowed",
            node=table,
            construct=".".join(p.name for p in table.parts),
            hint="name the table as the policy declares it, such as "
                 f"{'.'.join(p.name for p in table.parts[-2:])} or {table.parts[-1].name}",
        )
    key = table_key(table)
    declaration = policy.table(key)
    if declaration is None or key not in catalog:
        tables: list[PrivateTable | PublicTable] = [*policy.private_tables, *policy.public_tables]
        declared = {t.name.lower(): t.name for t in tables}
        raise UnsupportedQuery(
            f"unknown table {written_name(table)}",
            node=table,
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
        return ".".join(part.sql(dialect=DIALECT) for part in node.parts)
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier):
        written = node.this.meta.get(WRITTEN)
        if isinstance(written, exp.Expr):  # kept as written, rendered only when a message needs it
            return written.sql(dialect=DIALECT)
        if written:
            return written
        return node.this.sql(dialect=DIALECT)
    return sql_name(getattr(node, "name", "") or node.sql(dialect=DIALECT))


def is_bound(column: exp.Column) -> bool:
    """True for a column reference bind resolved; False for a select-list alias reference."""
    return bool(column.this.meta.get(BOUND)) if isinstance(column.this, exp.Identifier) else False


def column_scope(reference: str, columns: Iterable[str], *others: str) -> dict[tuple[str | None, str], str]:
    """(qualifier or None, column) -> column, for a query over one relation that answers to
    ``reference`` (and to ``others``, such as a table's own name under its alias).

    >>> sorted(column_scope("v", ["x"], "visits"), key=str)
    [('v', 'x'), ('visits', 'x'), (None, 'x')]
    """
    scope: dict[tuple[str | None, str], str] = {}
    for column in columns:
        scope[(None, column)] = column
        for qualifier in {reference, *others}:
            scope[(qualifier, column)] = column
    return scope


def bind_columns(nodes: list, scope: dict, aliases: frozenset = frozenset(),
                 spellings: dict | None = None, types: dict | None = None,
                 lateral: frozenset = frozenset()) -> None:
    """Resolve every column of ``nodes`` (in place) through ``scope``.

    As in DuckDB, ORDER BY prefers a select-list alias to a column, GROUP BY and HAVING a
    column to an alias; alias references are left unmarked (see ``is_bound``) for the check
    stage to resolve. With ``types`` (relation column -> DuckDB type), a dotted name that is
    not ``table.column`` reads a STRUCT field (``s.f``, ``t.s.f``, ``s.f.g``) and ``s['f']``
    becomes ``struct_extract(s, 'f')``, as DuckDB resolves them (see ``resolve_column``).
    ``lateral``: aliases of earlier select-list items a select item may name outside any
    aggregate (DuckDB's lateral column aliases, ``COUNT(*) AS n, n * 2``); a column wins.
    """
    names = {c for (q, c) in scope}
    for node in nodes:
        for column in list(node.find_all(exp.Column)):
            if isinstance(column.this, exp.Star):
                continue
            if _is_alias_reference(column, names, aliases):
                continue
            if (not column.table and column.name.lower() in lateral and column.name.lower() not in names
                    and column.find_ancestor(exp.AggFunc, exp.Window) is None):
                continue
            resolved = resolve_column(column, scope, types or {})
            if resolved is None:
                qualifier = column.table.lower() if column.table else None
                _refuse_unbound(column, qualifier, scope, spellings)
            replace_column(column, resolved)
        if types:
            bind_brackets(node, types)


def resolve_column(column: exp.Column, scope: dict, types: dict) -> exp.Expression | None:
    """The bound expression a column reference names, or ``None`` when nothing matches.

    Resolved as DuckDB resolves dotted names: ``a.b`` is table ``a``'s column ``b`` when there
    is one (a table alias wins over a column of that name), else column ``a``'s STRUCT field
    ``b``; ``a.b.c`` is ``schema.table.column``, then ``table.column.field``, then
    ``column.field.field``. A field is read with ``struct_extract``, so no later stage can take
    the column's name for a table's; an unknown field is refused by name.

    >>> import sqlglot
    >>> scope = {(None, "meta"): "meta", ("t", "meta"): "meta"}
    >>> types = {"meta": "STRUCT(src VARCHAR, n INTEGER)"}
    >>> print(resolve_column(sqlglot.parse_one("t.meta.SRC"), scope, types).sql(dialect=DIALECT))
    STRUCT_EXTRACT("meta", 'src')
    """
    parts = [p.name for p in column.parts]
    dots = _dotted_fields(column)
    lowered = [p.lower() for p in parts]
    # (relation column, the part naming it, fields), in DuckDB's order of preference
    candidates: list[tuple[str | None, int, list[str]]] = []
    if len(parts) == 1:
        candidates.append((scope.get((None, lowered[0])), 0, []))
    else:
        candidates.append((scope.get((lowered[0], lowered[1])), 1, parts[2:]))
        if len(parts) == 3:
            candidates.insert(0, (scope.get((lowered[1], lowered[2])), 2, []))
        candidates.append((scope.get((None, lowered[0])), 0, parts[1:]))
    for target, part, fields in candidates:
        if target is None:
            continue
        fields = fields + dots
        if fields and not _is_struct(types.get(target)):
            continue
        node = _bound_identifier_column(target, column, part)
        type_name = types.get(target)
        written = target
        for field in fields:
            node, type_name = _extract(node, type_name, field, column, written)
            written += f".{field}"
        return node
    return None


def _dotted_fields(column: exp.Column) -> list[str]:
    """Fields after a column's four name parts (``a.b.c.d.e``: sqlglot's ``Dot`` above it)."""
    fields: list[str] = []
    node: exp.Expression = column
    while isinstance(node.parent, exp.Dot) and node.parent.this is node:
        node = node.parent
        fields.append(node.expression.name)
    return fields


def replace_column(column: exp.Column, resolved: exp.Expression) -> None:
    top: exp.Expression = column
    while isinstance(top.parent, exp.Dot) and top.parent.this is top:
        top = top.parent
    top.replace(resolved)


def _bound_identifier_column(target: str, column: exp.Column, part: int) -> exp.Column:
    identifier = exp.to_identifier(target, quoted=True)
    identifier.meta.update(column.this.meta)  # keep the position for later refusals
    identifier.meta[BOUND] = True
    if WRITTEN not in identifier.meta:  # as the analyst wrote the column: a detached copy of its part
        identifier.meta[WRITTEN] = column.parts[part].copy()
    return exp.Column(this=identifier)


def _is_struct(type_name: str | None) -> bool:
    return type_name is not None and type_name.upper().startswith("STRUCT(")


def _extract(node: exp.Expression, type_name: str | None, field: str, column: exp.Expression, written: str):
    fields = struct_fields(type_name)
    shown = column.sql(dialect=DIALECT)
    if fields is None:
        raise UnsupportedQuery(f"{written} is of type {type_name}, not a STRUCT, so it has no field {field}",
                               node=column, construct=shown, hint="read fields of STRUCT columns only")
    matches = [f for f in fields if f.lower() == field.lower()]  # DuckDB matches fields case-insensitively
    if not matches:
        raise UnsupportedQuery(f"the STRUCT {written} has no field {field}", node=column,
                               construct=shown, hint=f"its fields are: {', '.join(fields)}")
    extracted = exp.StructExtract(this=node, expression=exp.Literal.string(matches[0]))
    return extracted, fields[matches[0]]


def expression_type(node: exp.Expression, types: dict) -> str | None:
    """The DuckDB type of a bound column or of a field read from one (``None``: unknown)."""
    if isinstance(node, exp.Column) and is_bound(node):
        return types.get(node.name)
    if isinstance(node, exp.StructExtract) and isinstance(node.expression, exp.Literal):
        fields = struct_fields(expression_type(node.this, types)) or {}
        return fields.get(node.expression.this)
    return None


def _written(node: exp.Expression) -> str:
    """A bound column or field read as the analyst would write it: ``meta.inner``."""
    if isinstance(node, exp.StructExtract):
        return f"{_written(node.this)}.{node.expression.this}"
    return node.name if isinstance(node, exp.Column) else node.sql(dialect=DIALECT)


def bind_brackets(node: exp.Expression, types: dict) -> None:
    """``s['f']``, ``s['f'].g`` and ``struct_extract(s, 'F')`` on a STRUCT: the field, checked by name."""
    for sub in reversed(list(node.find_all(exp.Bracket, exp.StructExtract, exp.Dot))):  # innermost first
        base = sub.this
        type_name = expression_type(base, types)
        if not _is_struct(type_name):
            if isinstance(sub, exp.StructExtract) and type_name is not None:
                raise UnsupportedQuery(f"struct_extract reads a STRUCT, but {_written(base)} is of type "
                                       f"{type_name}", node=sub,
                                       construct=sub.sql(dialect=DIALECT),
                                       hint="read fields of STRUCT columns, such as struct_extract(s, 'field') "
                                            "or s.field")
            continue
        index = sub.expressions[0] if isinstance(sub, exp.Bracket) and len(sub.expressions) == 1 else sub.expression
        if isinstance(sub, exp.Dot) and isinstance(index, exp.Identifier):  # s['f'].g
            index = exp.Literal.string(index.name)
        if not (isinstance(index, exp.Literal) and index.is_string):
            raise UnsupportedQuery(f"a field of the STRUCT {base.sql(dialect='duckdb')} must be named by a string "
                                   "literal", node=sub, construct=sub.sql(dialect=DIALECT),
                                   hint=f"write {base.sql(dialect='duckdb')}['field']")
        extracted, _ = _extract(base.copy(), type_name, index.this, sub, _written(base))
        sub.replace(extracted)


def _refuse_unbound(column: exp.Column, qualifier: str | None, scope: dict, spellings: dict | None) -> NoReturn:
    """Refuse a column the scope does not resolve, saying why: a bare name two joined tables
    both have (ambiguous), a name its qualifier's table lacks (the hint lists that table's
    columns, and the tables that do have it), an unknown qualifier, or an unknown name. A hint
    never offers the very name it refuses as available. The refusal carries the column's node;
    called directly, as here, it has no position yet (the boundary that holds the SQL finds it).

    >>> import sqlglot
    >>> scope = {(None, "uid"): "uid", ("v", "uid"): "uid", ("v", "amount"): "amount",
    ...          ("visits", "amount"): "amount", ("s", "amount"): "s.amount", ("s", "sz"): "sz", (None, "sz"): "sz"}
    >>> _refuse_unbound(sqlglot.parse_one("SELECT v.sz").find(exp.Column), "v", scope, None)
    ... # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: unknown column v.sz: v has no column sz.
    Hint: sz is a column of s; the columns of v are: amount, uid.
    >>> _refuse_unbound(sqlglot.parse_one("SELECT amount").find(exp.Column), None, scope, None)
    ... # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: column amount is ambiguous: s and v both have it.
    Hint: qualify it: s.amount or v.amount.
    """
    shown = column.sql(dialect=DIALECT)
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
                               node=column, construct=shown,
                               hint="qualify it: " + " or ".join(f"{sql_name(q)}.{written}" for q in holders))
    if qualifier is not None and qualifier in qualifiers:
        own = sorted({c for (q, c) in scope if q == qualifier})
        elsewhere = (f"{written} is a column of {', '.join(sql_name(q) for q in holders)}; " if holders else "")
        hint = columns_hint(column.name, own, spellings, what=f"columns of {sql_name(column.table)}")
        raise UnsupportedQuery(f"unknown column {shown}: {sql_name(column.table)} has no column {written}",
                               node=column, construct=shown, hint=elsewhere + hint)
    raise UnsupportedQuery(
        f"unknown column {written}" if qualifier is None else
        f"unknown table or alias {sql_name(column.table)} in {shown}",
        node=column, construct=shown,
        hint=columns_hint(column.name, [c for (q, c) in scope if q is None], spellings))


def _is_alias_reference(column: exp.Column, names: set, aliases: frozenset) -> bool:
    if column.table or column.name.lower() not in aliases:
        return False
    if column.find_ancestor(exp.Order) is not None:
        return True
    in_clause = column.find_ancestor(exp.Group, exp.Having) is not None
    return in_clause and column.name.lower() not in names


def resolve_group_item(item: exp.Expression, query: exp.Select) -> exp.Expression:
    """A GROUP BY item with ``GROUP BY 1`` and ``GROUP BY alias`` naming select-list items, as
    in DuckDB (for a query and for a per-unit subquery alike)."""
    selects = query.expressions
    if isinstance(item, exp.Literal) and not item.is_string and item.this.isdigit():
        index = int(item.this) - 1
        if 0 <= index < len(selects):
            return selects[index].unalias()
    if isinstance(item, exp.Column) and not is_bound(item):
        for select in selects:
            if isinstance(select, exp.Alias) and select.alias.lower() == item.name.lower():
                return select.this
    return item
