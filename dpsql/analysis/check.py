"""Stage 3, check: accept an allow-listed query shape, or refuse it with its position.

Static: reads the SQL, the policy and the schema only, touches no data and costs nothing.
Accepted are (a) queries over public tables only, which run exactly, and (b) one SELECT over
one private table whose select list, HAVING and ORDER BY combine aggregates (COUNT, SUM, AVG,
VARIANCE, STDDEV, quantiles, COUNT(DISTINCT unit), with FILTER) and GROUP BY keys, filtered
by a deterministic row-level WHERE. Every node is checked against an allow-list (see
``dpsql.sql.allowlist``); anything else is refused with a ``DPError`` that names it, where it
is, and what to write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlglot import exp

from dpsql.analysis.aggregates import output_name, split_aggregates
from dpsql.analysis.bind import (
    Catalog,
    bind_columns,
    bind_table,
    resolve_group_item,
    table_key,
    written_name,
)
from dpsql.analysis.domains import narrow_keys
from dpsql.analysis.from_clause import build_relation, touches_private
from dpsql.analysis.plan import GroupKey, PrivateQuery, PublicQuery
from dpsql.errors import DPError, UnsupportedQuery
from dpsql.policy.model import KeyDomain, Policy, PrivateTable
from dpsql.sql.allowlist import (
    ROW_LEVEL_FUNCTIONS,
    ROW_LEVEL_NODES,
    check_public,
    check_row_level,
    refuse,
)
from dpsql.sql.parse import describe, located
from dpsql.sql.types import implied_domain

if TYPE_CHECKING:  # the protocol only: analysis asks the engine through it, never imports one
    from dpsql.backends.base import Backend

SELECT_PARTS_ALLOWED = {"expressions", "from", "from_", "joins", "where", "group", "having", "order", "limit",
                        "offset", "kind", "distinct"}
"""Parts of a SELECT a private query may have; any other part present is refused by name."""


def check_query(tree: exp.Expression, sql: str, policy: Policy, catalog: Catalog,
                data: Backend | None = None) -> PrivateQuery | PublicQuery:
    """Decide whether ``tree`` can be answered, and describe it for the next stage.

    ``data`` reads public tables and query schemas (joins need a public key's multiplicity);
    it never reads a private row. A refusal carries its node and, once here, its position in
    ``sql`` (the stages below refuse with the node alone).
    """
    try:
        return _check(tree, policy, catalog, data)
    except DPError as error:
        raise located(error, sql)


def _check(tree: exp.Expression, policy: Policy, catalog: Catalog,
           data: Backend | None) -> PrivateQuery | PublicQuery:
    tree = tree.copy()
    name_subqueries(tree)
    ctes = _ctes(tree, policy, catalog)
    tables = [t for t in tree.find_all(exp.Table) if t.db or t.name.lower() not in ctes]
    if not tables:
        refuse_identity(tree)
        refuse(tree, "a query must read a declared table", "add FROM <table>")
    for table in tables:
        bind_table(table, policy, catalog)
    if not touches_private(list(tree.find_all(exp.Table)), policy, catalog, ctes):
        return _check_public(tree)
    refuse_ambiguous_qualifiers(tree)
    tree.set("with_", None)
    tree.set("with", None)
    return _check_private(tree, policy, catalog, data, ctes)


IDENTITY_WORDS = ("user", "current_role")
"""PostgreSQL's words for who is asking that sqlglot reads as columns (``current_user`` and
``session_user`` are its own nodes)."""


def refuse_identity(tree: exp.Expression) -> None:
    """Refuse a query that asks who is asking (``SELECT current_user``): the server answers it
    with the analyst its session authenticated; a local connection has no session, and the
    analyst it charges is the curator's argument, not an identity.

    >>> import sqlglot
    >>> try:
    ...     refuse_identity(sqlglot.parse_one("SELECT user"))
    ... except UnsupportedQuery as refused:
    ...     print(refused.message)
    user names the analyst a server session authenticated, and a local connection has none
    """
    for node in tree.find_all(exp.CurrentUser, exp.SessionUser, exp.Column):
        if isinstance(node, exp.Column):
            if node.table or node.this.quoted or node.name.lower() not in IDENTITY_WORDS:
                continue
            word = node.name.lower()
        else:
            word = "current_user" if isinstance(node, exp.CurrentUser) else "session_user"
        raise UnsupportedQuery(f"{word} names the analyst a server session authenticated, and a local "
                               "connection has none", construct=word, node=node,
                               hint="the analyst this connection charges is db.analyst (None: the curator)",
                               hints={"cli": "the analyst charged is the one --analyst names (none: the curator)",
                                      "shell": "the analyst charged is the one the shell was started with"})


def _ctes(tree: exp.Expression, policy: Policy, catalog: Catalog) -> dict:
    """CTE name -> its query; a CTE may not shadow a table (names resolve as in DuckDB)."""
    with_ = tree.args.get("with_") or tree.args.get("with")
    if not with_:
        return {}
    if with_.args.get("recursive"):
        refuse(with_, "recursive CTEs are not supported", "write the query without RECURSIVE")
    ctes = {}
    for cte in with_.expressions:
        name = cte.alias.lower()
        if policy.table(name) is not None or name in catalog or name in ctes:
            refuse(cte, f"the CTE {cte.alias} would shadow a table of the same name",
                   "give the CTE another name")
        ctes[name] = cte.this
    return ctes


GENERATED_ALIAS = "dp_generated_alias"
"""Meta flag of a subquery whose alias ``name_subqueries`` gave it (DuckDB's name for it)."""


def name_subqueries(tree: exp.Expression) -> None:
    """Give a FROM or JOIN subquery written without an alias the name DuckDB gives it:
    ``unnamed_subquery``, then ``unnamed_subquery2``, ... in each SELECT, in FROM order.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT COUNT(*) FROM (SELECT x FROM t) JOIN (SELECT y FROM u) AS v ON x = y "
    ...                          "JOIN (SELECT z FROM w) ON x = z")
    >>> name_subqueries(tree)
    >>> [s.alias for s in tree.find_all(exp.Subquery)]
    ['unnamed_subquery', 'v', 'unnamed_subquery2']
    """
    for select in list(tree.find_all(exp.Select)):
        from_ = select.args.get("from_") or select.args.get("from")
        sources = ([from_.this] if from_ is not None else []) + [j.this for j in select.args.get("joins") or []]
        count = 0
        for source in sources:
            if isinstance(source, exp.Subquery) and not source.alias:
                count += 1
                name = "unnamed_subquery" if count == 1 else f"unnamed_subquery{count}"
                source.set("alias", exp.TableAlias(this=exp.to_identifier(name)))
                source.meta[GENERATED_ALIAS] = True


def refuse_ambiguous_qualifiers(tree: exp.Expression) -> None:
    """Refuse a column qualified with a name that two items of one FROM clause answer to: an
    alias written twice, or a name DuckDB gives an unaliased subquery (``name_subqueries``)
    that is also an alias, a CTE or a table read in the same FROM. DuckDB refuses such a
    reference as ambiguous when both items have the column; dpsql refuses it whenever it is
    used, so the column never silently comes from the other item. A repeated name that is
    never used to qualify a column is harmless, as in DuckDB. Called directly, as here, the
    refusal has no position yet: ``check_query`` finds it in the SQL text on the way out.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT SUM(unnamed_subquery.x) FROM (SELECT x FROM t) AS unnamed_subquery "
    ...                          "JOIN (SELECT y FROM u) ON x = y")
    >>> name_subqueries(tree)
    >>> refuse_ambiguous_qualifiers(tree)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: the table name unnamed_subquery is ambiguous: it names 2 items of this FROM
    (a subquery written without an alias is named unnamed_subquery, unnamed_subquery2, ... in FROM order, as DuckDB
    names it). Hint: give each table and subquery of the FROM its own alias: (SELECT ...) AS
    my_alias.
    >>> tree = sqlglot.parse_one("SELECT a.x FROM t AS a JOIN u AS a ON a.x = 1")
    >>> refuse_ambiguous_qualifiers(tree)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    dpsql.errors.UnsupportedQuery: the table name a is ambiguous: it names 2 items of this FROM.
    Hint: give each table and subquery of the FROM its own alias: (SELECT ...) AS my_alias.
    """
    for select in tree.find_all(exp.Select):
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None:
            continue
        items = [from_.this] + [j.this for j in select.args.get("joins") or []]
        names: dict[str, int] = {}
        generated = set()
        for item in items:
            name = item.alias_or_name.lower()
            names[name] = names.get(name, 0) + 1
            if item.meta.get(GENERATED_ALIAS):
                generated.add(name)
        repeated = {name for name, count in names.items() if name and count > 1}
        if not repeated:
            continue
        # The columns of this SELECT itself (select list, ON, WHERE, ...), not of its subqueries.
        for node in select.walk(prune=lambda n: n is not select and isinstance(n, (exp.Select, exp.Subquery))):
            if isinstance(node, exp.Column) and node.table and node.table.lower() in repeated:
                name = node.table
                why = (" (a subquery written without an alias is named unnamed_subquery, unnamed_subquery2, ... "
                       "in FROM order, as DuckDB names it)" if name.lower() in generated else "")
                refuse(node, f"the table name {name} is ambiguous: it names {names[name.lower()]} items of "
                       f"this FROM{why}",
                       "give each table and subquery of the FROM its own alias: (SELECT ...) AS my_alias")


def _keys_of_distinct(tree: exp.Select) -> None:
    """``SELECT DISTINCT a, b FROM t`` with no aggregate and no GROUP BY is ``SELECT a, b FROM t
    GROUP BY a, b``: it releases keys, as GROUP BY with no aggregate does."""
    distinct = tree.args.get("distinct")
    if distinct is None or distinct.args.get("on") is not None or tree.args.get("group") is not None:
        return
    items = [e.unalias() for e in tree.expressions]
    if any(i.find(exp.AggFunc) or isinstance(i, (exp.Star, exp.Literal)) for i in items):
        return
    tree.set("distinct", None)
    tree.set("group", exp.Group(expressions=[i.copy() for i in items]))


# ---------------------------------------------------------------------------------------------
# Public tables only: exact, free. Still allow-listed, so no function reaches files or settings.

def _check_public(tree: exp.Expression) -> PublicQuery:
    check_public(tree)
    return PublicQuery(tree)


# ---------------------------------------------------------------------------------------------
# One private table: aggregates only.


def _check_private(tree: exp.Expression, policy: Policy, catalog: Catalog,
                   data: Backend | None, ctes: dict) -> PrivateQuery:
    if not isinstance(tree, exp.Select):
        refuse(tree, f"{describe(tree)} over private data is not supported at the top level",
               "write one SELECT; combine branches with UNION ALL inside a FROM subquery")
    for name, value in tree.args.items():
        if value and name not in SELECT_PARTS_ALLOWED:
            node = value[0] if isinstance(value, list) else value
            node = node if isinstance(node, exp.Expression) else tree
            refuse(node, f"{_part_name(name)} is not supported over a private table",
                   _PART_HINTS.get(name, "aggregate one private table"))
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None:
        refuse(tree, "a private query must read a table", "add FROM <table>")
    _keys_of_distinct(tree)
    relation = build_relation(from_, tree.args.get("joins") or [], policy, catalog, data, ctes)
    clauses = [tree.args.get(name) for name in ("where", "group", "having", "order")]
    parts: list[exp.Expression] = [p for p in [*clauses, *tree.expressions] if p is not None]
    for part in parts:
        for node in part.walk():
            if isinstance(node, (exp.Subquery, exp.Select)):
                refuse(node, "subqueries outside FROM are not supported over private data",
                       "join the public table in FROM instead")
    aliases = frozenset(e.alias.lower() for e in tree.expressions if isinstance(e, exp.Alias))
    names = [output_name(item) for item in tree.expressions]  # as written, before binding renames
    spellings = getattr(catalog, "spellings", None)
    bind_columns(parts[:len(parts) - len(tree.expressions)], relation.scope, aliases, spellings,
                 relation.columns)
    for position, item in enumerate(tree.expressions):  # each may name the aliases before it
        earlier = frozenset(e.alias.lower() for e in tree.expressions[:position] if isinstance(e, exp.Alias))
        bind_columns([item], relation.scope, aliases, spellings, relation.columns, lateral=earlier)
    rule = relation.rule
    where = tree.args.get("where")
    if where is not None:
        check_row_level(where.this, "WHERE")
    refuse_failing_constants(parts, relation.columns, data)
    keys = narrow_keys(_group_keys(tree, rule, relation.columns), where.this if where is not None else None,
                       rule.columns)
    # A hidden unit (a row-level table's per-row id) is never bound, so no column matches it.
    aggregates, post, outputs, direct = split_aggregates(tree, list(keys), relation.unit, names)
    return PrivateQuery(
        table=relation.label,
        rule=rule,
        column_types=tuple(relation.columns.items()),
        where=where.this if where is not None else None,
        keys=tuple(keys),
        aggregates=tuple(aggregates),
        post=post,
        outputs=tuple(outputs),
        direct=tuple(direct),
        source=relation.sql,
        rows_per_unit=relation.rows_per_unit,
        hidden_unit=relation.hidden_unit,
        bounded=tuple(sorted(relation.bounded)),
        joins=relation.joins,
    )


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_TEXT_TYPES = ("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR", "NAME")


def refuse_failing_constants(parts: list, columns: dict, data: Backend | None) -> None:
    """Refuse, before the charge, a string literal compared with a column (=, <, IN, BETWEEN,
    ...) that does not cast to the column's type: DuckDB casts the literal to it at bind and
    raises a Conversion Error, while dpsql's TRY would silently make every row fail the test.
    (An ENUM is compared as text by DuckDB: ``e = 'other'`` matches no row there too.) The cast is tried on
    the constant alone (``Backend.cast_error``): no row is read."""
    if data is None:
        return
    tried: dict = {}
    for part in parts:
        for node in part.walk():
            pairs: list[tuple[Any, Any]]
            if isinstance(node, _COMPARISONS):
                pairs = [(node.left, node.right), (node.right, node.left)]
            elif isinstance(node, exp.In):
                pairs = [(node.this, e) for e in node.expressions]
            elif isinstance(node, exp.Between):
                pairs = [(node.this, node.args.get("low")), (node.this, node.args.get("high"))]
            else:
                continue
            for column, constant in pairs:
                if not (isinstance(column, exp.Column) and isinstance(constant, exp.Literal) and constant.is_string):
                    continue
                type_name = columns.get(column.name) or columns.get(column.name.lower())
                if type_name is None or type_name.upper().startswith(_TEXT_TYPES + ("ENUM",)):
                    continue  # DuckDB compares an ENUM with a string as text: no error, maybe no match
                key = (type_name, constant.this)
                if key not in tried:
                    tried[key] = data.cast_error(constant.this, type_name)
                if tried[key] is not None:
                    shown = type_name if len(type_name) <= 60 else type_name[:57] + "..."
                    refuse(constant, f"the constant '{constant.this}' is not a valid {shown} value, so it "
                           f"cannot be compared with {column.name} (DuckDB: {tried[key]})",
                           f"write a value of type {shown} (as DuckDB prints one), or CAST the "
                           f"column to VARCHAR to compare text")


_PART_HINTS = {
    "qualify": "QUALIFY filters on window functions, which are not supported",
    "windows": "window functions are not supported",
    "laterals": "LATERAL joins are not supported",
    "sample": "USING SAMPLE draws rows with the database's random(); for a sample of units write FROM t TABLESAMPLE "
              "POISSON (10 PERCENT)",
}


def _part_name(part: str) -> str:
    return {"joins": "JOIN", "with": "WITH (a CTE)"}.get(part, part.upper())


def _group_keys(tree: exp.Select, rule: PrivateTable, columns: dict) -> list[GroupKey]:
    """GROUP BY items as keys: a bare column with a KEYS domain, or of a type whose values are
    schema (ENUM, BOOLEAN: ``types.implied_domain``), is public; anything else private."""
    group = tree.args.get("group")
    if group is None:
        return []
    for part in ("rollup", "cube", "grouping_sets"):
        if group.args.get(part):
            refuse(group, f"GROUP BY {part.upper()} is not supported",
                   "GROUP BY the columns themselves; totals are a second query")
    items = group.expressions
    if group.args.get("all"):  # DuckDB's GROUP BY ALL: every select item without an aggregate
        items = [e.unalias() for e in tree.expressions
                 if not e.find(exp.AggFunc) and not isinstance(e.unalias(), (exp.Literal, exp.Star))]
    keys: list[GroupKey] = []
    for item in items:
        expression = resolve_group_item(item, tree)
        check_row_level(expression, "GROUP BY")
        if isinstance(expression, exp.Column) and expression.name == (rule.unit or "").lower():
            refuse(item, f"GROUP BY the privacy unit {written_name(expression)} would release one answer per unit",
                   "group by a public attribute instead, or COUNT(DISTINCT ...) the units")
        if any(k.expression == expression for k in keys):
            continue
        domain = None
        if isinstance(expression, exp.Column):
            declared = rule.column(expression.name)
            domain = declared.key_domain if declared is not None else None
            if domain is None:
                domain = type_domain(columns.get(expression.name, ""))
        keys.append(GroupKey(name=f"g{len(keys)}", expression=expression.copy(), domain=domain))
    return keys


def type_domain(type_name: str) -> KeyDomain | None:
    """The KEYS domain a column's type implies (ENUM values, BOOLEAN), or ``None``."""
    values = implied_domain(type_name)
    return None if values is None else KeyDomain(values=values, implied_by=type_name)



__all__ = ["check_query", "table_key", "ROW_LEVEL_NODES", "ROW_LEVEL_FUNCTIONS"]
