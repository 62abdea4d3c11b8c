"""The types of the columns a query's own parts name: what ``spark_infer`` reads a column's type from.

dpsql's statements read their CTEs' and subqueries' columns (``dp_units.n``, ``dp_granted.b``),
and an analyst's query its aliases' (``v.amount``): each is typed from its select list, rows or
UNION ALL branches, in the order the parts read each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sqlglot import exp

from dpsql.backends.spark.infer import annotate, combined
from dpsql.sql.pieces import CopiedTable


def scoped_types(tree: exp.Expr, types: Mapping[str, str] | None) -> dict[str, str]:
    """``types`` extended to the names a query's own parts give columns: a table alias
    (``v.amount`` for ``visits AS v``), and the outputs of subqueries, CTEs and VALUES lists,
    typed from their select lists or rows (each after the scopes it reads). A bare name two
    sources type differently is left out.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("SELECT n FROM (SELECT v.x + 1 AS n FROM t AS v)", dialect="duckdb")
    >>> scoped_types(tree, {"t.x": "BIGINT", "x": "BIGINT"})["n"]
    'BIGINT'

    Only the tables the query reads can clash (the engine's types also name tables of dpsql's own,
    such as the row-count tables' BIGINT ``r``, and other catalog tables):

    >>> known = {"t.x": "DOUBLE", "x": "DOUBLE", "c.r": "BIGINT"}
    >>> own = "WITH d AS (SELECT x AS r FROM t) SELECT r FROM d"
    >>> scoped_types(sqlglot.parse_one(own, dialect="duckdb"), known)["r"]
    'DOUBLE'
    >>> "r" in scoped_types(sqlglot.parse_one(own + ", c", dialect="duckdb"), known)
    False
    """
    found = dict(types or {})
    for table in tree.find_all(exp.Table):
        name, alias = table.name.lower(), table.alias_or_name.lower()
        for key, known in list(found.items()):
            if key.startswith(f"{name}.") and alias != name:
                found[f"{alias}.{key[len(name) + 1:]}"] = known
    # a column of a table the query reads that a query's own part also names: the bare name is
    # unsure unless they agree (a table it does not read cannot be what the name means)
    read = _tables_read(tree)
    tables: dict[str, set[str]] = {}
    for key, known in found.items():
        if "." in key and key.rsplit(".", 1)[0] in read:
            tables.setdefault(key.rsplit(".", 1)[1], set()).add(known)
    clashes: set[str] = set()
    for scope in _scopes_read_first(tree):
        for alias, name, type_name in _outputs(scope, found):
            if alias:
                found[f"{alias}.{name}"] = type_name
            if found.get(name, type_name) != type_name or tables.get(name, {type_name}) != {type_name}:
                clashes.add(name)
            found[name] = type_name
    return {key: value for key, value in found.items() if key not in clashes}


def _tables_read(tree: exp.Expr) -> set[str]:
    """The lower-cased names (and aliases) of the tables ``tree`` reads, a private table's read
    through its bounded copy included (``CopiedTable``, by its catalog key's last part).

    >>> import sqlglot
    >>> sorted(_tables_read(sqlglot.parse_one("SELECT * FROM s.a AS x JOIN b USING (k)", dialect="duckdb")))
    ['a', 'b', 'x']
    """
    read = set()
    for table in tree.find_all(exp.Table, CopiedTable):
        if isinstance(table, CopiedTable):
            read.add(table.table_key.split(".")[-1].lower())
        else:
            read.update({table.name.lower(), table.alias_or_name.lower()})
    return read


def _outputs(scope: exp.Expr, types: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(alias, column, DuckDB type) of each typed output column of a subquery, CTE or VALUES list."""
    if isinstance(scope, exp.Values):
        alias = scope.args.get("alias")
        columns = [c.name.lower() for c in alias.columns] if alias is not None else []
        rows = [row.expressions for row in scope.expressions if isinstance(row, exp.Tuple)]
        for row in rows:
            for value in row:
                annotate(value, types)
        for index, name in enumerate(columns):
            output = combined([row[index] for row in rows if index < len(row)])  # VALUES: the rows' common type
            if output is not None and output != '"NULL"' and all(index < len(row) for row in rows):
                yield scope.alias.lower(), name, output
        return
    branches = list(_branches(scope.this))
    if not branches:
        return
    for branch in branches:
        annotate(branch, types)
    # UNION ALL: DuckDB's column type is the branches' common type (dpsql's grants: BIGINT or HUGEINT)
    for index, item in enumerate(branches[0].expressions):
        items = [branch.expressions[index] for branch in branches if index < len(branch.expressions)]
        output = combined(items) if len(items) == len(branches) else None
        name = item.alias_or_name.lower()
        if name and not isinstance(item, exp.Star) and output not in (None, '"NULL"'):
            yield scope.alias.lower(), name, output


def _branches(query: exp.Expr) -> Iterator[exp.Select]:
    """The SELECTs of a query, a UNION ALL's in order; nothing if any part is not a SELECT.

    >>> import sqlglot
    >>> tree = sqlglot.parse_one("WITH u AS (SELECT n FROM a UNION ALL SELECT SUM(n) OVER () AS n FROM a) "
    ...                          "SELECT n FROM u", dialect="duckdb")
    >>> scoped_types(tree, {"n": "BIGINT"})["u.n"]
    'HUGEINT'
    """
    if isinstance(query, exp.Select):
        yield query
    elif isinstance(query, exp.Union) and not query.args.get("distinct"):
        left, right = list(_branches(query.this)), list(_branches(query.expression))
        if left and right:
            yield from (*left, *right)


def _scopes_read_first(node: exp.Expr) -> Iterator[exp.Expr]:
    """The subqueries and CTEs of ``node``, each after the ones it reads: nested ones before
    their outer query, and a WITH's CTEs in order (a CTE reads only those before it)."""
    for child in node.iter_expressions():
        yield from _scopes_read_first(child)
    if isinstance(node, (exp.Subquery, exp.CTE, exp.Values)):
        yield node
