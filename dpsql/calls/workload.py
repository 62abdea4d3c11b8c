"""Workloads of counting queries, answered together by MWEM (``dpsql.mechanisms.mwem``).

``db.workload(queries, epsilon=...)`` takes counting queries over ONE private table, each in
one of these forms (anything else is refused, naming the construct and its position):

* ``SELECT COUNT(*) FROM t [WHERE p]``;
* an integer linear combination of counts, ``SELECT 2 * COUNT(*) FILTER (WHERE p) -
  COUNT(*) FILTER (WHERE q) FROM t [WHERE r]``;
* ``SELECT a, b, <count or combination> FROM t [WHERE p] GROUP BY a, b``: a marginal, one
  scalar query per cell of the product of a's and b's KEYS domains.

Predicates (``p``, ``q``, ``r``) compare columns with public KEYS domains to literals or to
each other (``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``, ``IN (...)``, ``BETWEEN``, ``IS
[NOT] NULL``, ``AND``, ``OR``, ``NOT``).

The joint domain is the product of the KEYS domains of every column the workload reads, plus
one *outside* cell holding every row with a value outside its column's domain (or NULL) in any
of those columns; there every column reads as NULL, so ``COUNT(*)`` counts those rows and a
predicate on a column does not. The exact histogram over the domain is ONE statement prepared
by the ordinary pipeline (``SELECT a, b, COUNT(*) FROM t GROUP BY a, b``): its plan gives the
bounded SQL and the per-unit sensitivity, and the executor charges before running it. Each
query's coefficient vector over the cells is computed by DuckDB on a public in-memory table of
the cells (never on private data), from SQL regenerated from the checked predicate.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.backends.duckdb.scratch import PublicScratch, public_scratch
from dpsql.errors import DPError, UnsupportedQuery
from dpsql.mechanisms.mwem import Workload
from dpsql.policy.model import Policy, PrivateTable
from dpsql.sql.names import table_key
from dpsql.sql.normalise import normalised_sql
from dpsql.sql.parse import DIALECT, located, parse

MAX_CELLS = 2 ** 22
"""The largest joint domain a workload may span (cells, outside cell included)."""
MAX_BYTES = 512 * 2 ** 20
"""The largest memory the coefficient vectors and histograms of a workload may take."""
MAX_COEFFICIENTS = 2 ** 16
"""The most the absolute values of one query's coefficients may add up to: a cell's coefficient,
times a count below 2^63, split into 21-bit limbs over at most 2^22 cells, stays within int64
(``dpsql.mechanisms.mwem.Workload.answers``), and scores stay far from float's limits."""

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_LOGIC = (exp.And, exp.Or, exp.Not, exp.Paren)
_VALUES = (exp.Literal, exp.Null, exp.Boolean)
_FORMS = ("SELECT COUNT(*) FROM t WHERE ..., an integer combination such as "
          "COUNT(*) FILTER (WHERE a = 1) - COUNT(*) FILTER (WHERE b = 2), or "
          "SELECT a, COUNT(*) FROM t GROUP BY a over KEYS columns")


@dataclass(frozen=True)
class Term:
    """One count of a linear combination: coefficient × COUNT(*) [FILTER (WHERE filter)]."""

    coefficient: int
    filter: exp.Expression | None


@dataclass(frozen=True)
class WorkloadQuery:
    """One checked query of the workload."""

    text: str
    """As the analyst wrote it."""
    normal: str
    """Its normalised SQL (recorded in the ledger)."""
    where: exp.Expression | None
    """The WHERE predicate, columns unqualified and lower-cased."""
    terms: tuple[Term, ...]
    """The counts it combines."""
    keys: tuple[str, ...]
    """Its GROUP BY columns (lower-cased), in GROUP BY order."""
    label: str
    """The name of its value column, as written or as the analyst's expression."""


def check_workload(queries: Any, policy: Policy, catalog: dict) -> tuple[str, list[WorkloadQuery]]:
    """(the private table's name as the policy writes it, the checked queries); refuses any
    query outside the forms of the module docstring, naming which query and where."""
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)) or not queries:
        raise UnsupportedQuery("a workload is a non-empty list of SQL query strings",
                               hint="pass ['SELECT COUNT(*) FROM t WHERE a = 1', ...]")
    table: PrivateTable | None = None
    checked = []
    for index, text in enumerate(queries, start=1):
        if not isinstance(text, str):
            raise UnsupportedQuery(f"query {index} of the workload is not an SQL string: {type(text).__name__}",
                                   hint="pass each query as a string")
        try:
            query, rule = _check_one(text, policy, catalog, table)
        except DPError as error:
            located(error, text)
            error.message = f"query {index} of the workload: {error.message}"
            error.args = (error._render(),)
            raise
        table = rule
        checked.append(query)
    assert table is not None
    return table.name, checked


def _check_one(text: str, policy: Policy, catalog: dict,
               table: PrivateTable | None) -> tuple[WorkloadQuery, PrivateTable]:
    parsed = parse(text)
    if parsed.options:
        raise UnsupportedQuery("a workload query may not carry its own OPTIONS",
                               hint="give epsilon (and delta) once, for the whole workload")
    tree = parsed.tree
    if not isinstance(tree, exp.Select):
        raise UnsupportedQuery(f"a workload answers SELECT queries only, found {tree.key.upper()}", node=tree,
                               hint=f"write {_FORMS}")
    for part in ("with", "joins", "having", "order", "limit", "offset", "qualify", "distinct", "windows"):
        found = tree.args.get(part)
        if found:
            node = found[0] if isinstance(found, list) else found
            raise UnsupportedQuery(f"a workload query may not use {part.upper()}", node=node,
                                   hint=f"write {_FORMS}")
    source = tree.args.get("from_") or tree.args.get("from")
    sample = source.this.args.get("sample") if source is not None else None
    if sample is not None or source is not None and source.this.args.get("pivots"):
        raise UnsupportedQuery("a workload query reads its table whole: no TABLESAMPLE or PIVOT",
                               node=sample or source, hint="leave the sample out: MWEM's charge is not amplified")
    if source is None or not isinstance(source.this, exp.Table) or source.this.args.get("db"):
        raise UnsupportedQuery("a workload query reads one private table by name", node=source or tree,
                               hint="write FROM t, t a private table of the policy")
    name = source.this.name
    rule = policy.table(name)
    if not isinstance(rule, PrivateTable):
        raise UnsupportedQuery(f"{name} is not a private table of the policy", node=source.this,
                               hint="a workload reads one private table")
    if table is not None and rule.name != table.name:
        raise UnsupportedQuery(f"the workload reads {table.name}, and this query reads {rule.name}",
                               node=source.this, hint="answer each table's queries in a workload of their own")
    alias = source.this.alias_or_name.lower()
    columns = catalog[table_key(rule.name)]
    keyed = {c.name.lower() for c in rule.columns if c.keys is not None}
    keys = []
    for key in (tree.args.get("group") or exp.Group()).expressions:
        if not isinstance(key, exp.Column):
            raise UnsupportedQuery("a workload groups by plain columns only", node=key,
                                   hint="GROUP BY a, b with a and b columns that have KEYS")
        keys.append(_column(key, alias, columns, keyed))
    outputs = list(tree.expressions)
    values = [e for e in outputs if not isinstance(e.unalias(), exp.Column)]
    shown = [_column(e.unalias(), alias, columns, keyed) for e in outputs if isinstance(e.unalias(), exp.Column)]
    if len(values) != 1:
        raise UnsupportedQuery(f"a workload query selects one count (or combination of counts), found {len(values)}",
                               node=values[1] if len(values) > 1 else tree,
                               hint=f"write {_FORMS}")
    if sorted(shown) != sorted(keys):
        raise UnsupportedQuery("a workload query selects its GROUP BY columns and one count, nothing else",
                               node=tree, hint="select exactly the GROUP BY columns, and the count")
    terms = tuple(_terms(values[0].unalias(), 1, alias, columns, keyed))
    if sum(abs(term.coefficient) for term in terms) > MAX_COEFFICIENTS:
        raise UnsupportedQuery(f"a workload query's coefficients add up (in absolute value) to more than "
                               f"{MAX_COEFFICIENTS}", node=values[0],
                               hint="scale the query down: its answers are multiplied back afterwards for free")
    where = tree.args.get("where")
    predicate = _predicate(where.this, alias, columns, keyed) if where is not None else None
    label = values[0].alias if isinstance(values[0], exp.Alias) else values[0].sql(dialect=DIALECT)
    normal = normalised_sql(tree, columns)
    return WorkloadQuery(text, normal, predicate, terms, tuple(keys), label), rule


def _column(node: exp.Column, alias: str, columns: dict, keyed: set[str]) -> str:
    if node.table and node.table.lower() != alias:
        raise UnsupportedQuery(f"{node.sql(dialect=DIALECT)} names another table", node=node,
                               hint="a workload reads one table")
    name = node.name.lower()
    if name not in columns:
        raise UnsupportedQuery(f"unknown column {node.name}", node=node,
                               hint=f"use one of: {', '.join(sorted(columns))}")
    if name not in keyed:
        raise UnsupportedQuery(f"column {node.name} has no KEYS domain in the policy; a workload reads only "
                               "columns with public KEYS (their product is its synthetic data's domain)",
                               node=node, hint=f"use columns with KEYS ({', '.join(sorted(keyed)) or 'none'}), "
                                               "or answer this query with db.sql")
    return name


def _terms(node: exp.Expression, sign: int, alias: str, columns: dict, keyed: set[str]):
    """The counts of an integer linear combination, with their coefficients."""
    if isinstance(node, exp.Paren):
        yield from _terms(node.this, sign, alias, columns, keyed)
    elif isinstance(node, (exp.Add, exp.Sub)):
        yield from _terms(node.this, sign, alias, columns, keyed)
        yield from _terms(node.expression, sign if isinstance(node, exp.Add) else -sign, alias, columns, keyed)
    elif isinstance(node, exp.Neg):
        yield from _terms(node.this, -sign, alias, columns, keyed)
    elif isinstance(node, exp.Mul):
        factor, term = (node.this, node.expression) if _integer(node.this) is not None else \
            (node.expression, node.this)
        value = _integer(factor)
        if value is None:
            raise UnsupportedQuery("a workload multiplies counts by integer literals only", node=node,
                                   hint="write 2 * COUNT(*) FILTER (WHERE ...)")
        yield from _terms(term, sign * value, alias, columns, keyed)
    elif isinstance(node, exp.Count) and isinstance(node.this, exp.Star) and not node.args.get("distinct"):
        yield Term(sign, None)
    elif isinstance(node, exp.Filter) and isinstance(node.this, exp.Count) and isinstance(node.this.this, exp.Star):
        yield Term(sign, _predicate(node.expression.this, alias, columns, keyed))
    else:
        raise UnsupportedQuery(f"a workload counts rows only: {node.sql(dialect=DIALECT)} is not COUNT(*), "
                               "COUNT(*) FILTER (WHERE ...) or an integer combination of them",
                               node=node, hint=f"write {_FORMS}; answer other aggregates with db.sql")


def _integer(node: exp.Expression) -> int | None:
    if isinstance(node, exp.Paren):
        return _integer(node.this)
    if isinstance(node, exp.Neg):
        inner = _integer(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    return None


def _predicate(node: exp.Expression, alias: str, columns: dict, keyed: set[str]) -> exp.Expression:
    """A copy of the predicate with columns unqualified, if every node is allowed."""
    copy = node.copy()
    for part in list(copy.walk()):
        if isinstance(part, exp.Column):
            part.replace(exp.column(_column(part, alias, columns, keyed), quoted=True))
        elif isinstance(part, (*_COMPARISONS, *_LOGIC, *_VALUES, exp.Identifier, exp.Between, exp.Neg)):
            continue
        elif isinstance(part, exp.In) and not part.args.get("query") and not part.args.get("unnest"):
            continue
        elif isinstance(part, exp.Is) and isinstance(part.expression, exp.Null):
            continue
        else:
            raise UnsupportedQuery(f"{part.sql(dialect=DIALECT)} is not allowed in a workload predicate",
                                   node=part, hint="compare KEYS columns with literals or with each other "
                                                   "(=, <>, <, <=, >, >=, IN, BETWEEN, IS NULL, AND, OR, NOT)")
    return copy


def read_columns(queries: list[WorkloadQuery]) -> list[str]:
    """Every column the workload reads, in first-read order."""
    seen: dict[str, None] = {}
    for query in queries:
        nodes = [query.where, *(t.filter for t in query.terms)]
        for name in query.keys:
            seen.setdefault(name, None)
        for node in nodes:
            for column in (node.find_all(exp.Column) if node is not None else ()):
                seen.setdefault(column.name.lower(), None)
    return list(seen)


def check_size(columns: list[str], sizes: list[int], queries: list[WorkloadQuery]) -> int:
    """The number of cells (product of the domains, plus the outside cell); refuses, before
    anything is charged, a domain beyond MAX_CELLS or MAX_BYTES, saying how large it is."""
    cells = math.prod(sizes) + 1 if columns else 1
    memory = 8 * cells * (2 * len(queries) + 8)
    if cells > MAX_CELLS or memory > MAX_BYTES:
        product = " × ".join(f"{c} ({n})" for c, n in zip(columns, sizes))
        raise UnsupportedQuery(f"the workload's joint domain is {cells:,} cells ({product}, plus one for values "
                               f"outside them), needing about {memory / 2 ** 20:,.0f} MB; the limit is "
                               f"{MAX_CELLS:,} cells and {MAX_BYTES // 2 ** 20} MB",
                               hint="split the workload into groups of queries that read fewer columns")
    return cells


def coefficient_vectors(queries: list[WorkloadQuery], columns: list[str], types: list[str],
                        domains: list[list], literals: list[list[exp.Expr]]) -> Workload:
    """Each query's coefficients and groups over the cells, computed by DuckDB on a public
    in-memory table of the cells (cell i: the domains' product in row-major order; the last
    cell the outside one, every column NULL). Public data only; a predicate DuckDB cannot
    evaluate on the cells (a type mismatch) is refused, nothing having been charged."""
    if any(c.lower() == "dp_cell" for c in columns):
        raise UnsupportedQuery("a workload cannot read a column named dp_cell: that name is dpsql's own, for "
                               "the cells' index", hint="rename the column")
    sizes = [len(d) for d in domains]
    cells = math.prod(sizes) + 1 if columns else 1   # no column read: one cell holds every row
    with public_scratch() as con:
        parts = []
        for position, (name, type_name, values) in enumerate(zip(columns, types, literals)):
            rows = exp.values([exp.Tuple(expressions=[exp.Literal.number(i), v]) for i, v in enumerate(values)],
                              alias="d", columns=["i", "v"])
            select = exp.select(exp.column("i"), exp.cast(exp.column("v"), type_name).as_("v")).from_(rows)
            con.execute(f"CREATE TABLE d{position} AS {select.sql(dialect=DIALECT)}")
            parts.append(name)
        stride = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
        index = " + ".join(f"d{p}.i * {stride[p]}" for p in range(len(columns))) or "0"
        named = ", ".join(f'd{p}.v AS {exp.to_identifier(c, quoted=True).sql(dialect=DIALECT)}'
                          for p, c in enumerate(columns))
        joined = " CROSS JOIN ".join(f"d{p}" for p in range(len(columns)))
        if columns:
            nulls = ", ".join(f'CAST(NULL AS {t}) AS {exp.to_identifier(c, quoted=True).sql(dialect=DIALECT)}'
                              for c, t in zip(columns, types))
            con.execute(f"CREATE TABLE cells AS SELECT {index} AS dp_cell, {named} FROM {joined} "
                        f"UNION ALL SELECT {cells - 1} AS dp_cell, {nulls}")
        else:
            con.execute("CREATE TABLE cells AS SELECT 0 AS dp_cell")
        bases, groups, counts = [], [], []
        for number, query in enumerate(queries, start=1):
            base = np.zeros(cells, dtype=np.int64)
            for term in query.terms:
                condition = _and(query.where, term.filter)
                try:
                    base += term.coefficient * _truth(con, condition, cells)
                except DPError as error:
                    error.message = f"query {number} of the workload: {error.message}"
                    error.args = (error._render(),)
                    raise
            group = np.zeros(cells, dtype=np.int64)
            count = 1
            for key in query.keys:
                position = columns.index(key)
                code = (np.arange(cells) // stride[position]) % sizes[position]
                group = group * sizes[position] + code
                count *= sizes[position]
            if query.keys:
                group[cells - 1] = -1  # the outside cell is in no group of a marginal
            bases.append(base)
            groups.append(group)
            counts.append(count)
        return Workload(np.array(bases), np.array(groups), tuple(counts))


def _and(left: exp.Expr | None, right: exp.Expr | None) -> exp.Expr | None:
    if left is None or right is None:
        return left if right is None else right
    return exp.and_(exp.paren(left.copy()), exp.paren(right.copy()))


def _truth(con: PublicScratch, condition: exp.Expr | None, cells: int) -> np.ndarray:
    if condition is None:
        return np.ones(cells, dtype=np.int64)
    select = exp.select(exp.func("COALESCE", exp.paren(condition.copy()), exp.false())).from_("cells") \
        .order_by("dp_cell")  # (a policy column named cell stays the policy's)
    try:
        rows = con.fetch(select.sql(dialect=DIALECT))
    except UnsupportedQuery as error:  # public cells only: the message holds no private data
        raise UnsupportedQuery(f"a predicate cannot be evaluated on the KEYS domains: {error.message}",
                               hint="compare each column with values of its own type") from None
    return np.array([1 if row[0] else 0 for row in rows], dtype=np.int64)


def cell_labels(query: WorkloadQuery, columns: list[str], domains: list[list],
                types: list[str]) -> list[str | None]:
    """Each scalar query's group as text ("a=1, b='x'"), None for an ungrouped query."""
    if not query.keys:
        return [None]
    positions = [columns.index(k) for k in query.keys]
    return [", ".join(f"{k}={_shown(v, types[p])}" for k, v, p in zip(query.keys, combination, positions))
            for combination in itertools.product(*(domains[p] for p in positions))]


def _shown(value: Any, type_name: str) -> str:
    text = str(value)
    return "'" + text.replace("'", "''") + "'" if type_name.upper() in ("VARCHAR", "TEXT", "STRING") else text
