"""Public key domains that follow the query: narrowed by WHERE, limited in size, and whole.

A GROUP BY key with a KEYS domain releases every key of its domain, whatever the data. Three
rules keep that from flooding or hiding the answer:

* **Narrowing.** A top-level AND-ed WHERE conjunct that mentions one grouped KEYS column and
  constants only (``origin IN ('EWR', 'JFK')``, ``code BETWEEN 1 AND 3``, ``NOT k = 'x'``,
  ``upper(k) LIKE 'A%'``) is evaluated on the public domain itself, in DuckDB, on the domain's
  values cast to the column's type: coercion and comparison are exactly DuckDB's, never
  re-implemented here. The released keys are those for which it holds. Public data only, so
  narrowing is free. A row the query's WHERE keeps has a key for which the conjunct holds, so
  narrowing drops no such row's key (and should DuckDB ever disagree, the row is counted in
  the outside cell below, not lost).
* **Size limit.** A domain of more keys than ``MAX RELEASED KEYS`` (policy; ``max_keys`` in the
  query's OPTIONS) is refused before the charge, naming the domain, its size and the limit.
* **The outside cell.** Rows whose keys are not among the released ones (a key outside its
  declared domain, or NULL: NULL is never a key of a domain) are not dropped: the bounded SQL
  maps their keys to NULL, one more group, and that group is released with the same noise as
  every other cell (``res.outside_domain``). It is a group like any other for contribution
  bounding, so it counts among a unit's MAX GROUPS PER UNIT groups and its k rows: the
  sensitivity of every measure is unchanged (``tests/test_domains.py`` checks by brute force,
  for summed measures, distinct values and quantile histograms alike). Its NULL key joins its
  own (unit, group) grant with IS NOT DISTINCT FROM (``rewrite._same_unit_group``).
  Rows the query's own WHERE excludes are not "outside": they are in no cell at all.

With a private key among the GROUP BY keys (partition selection), none of this applies: the
domain keys filter rows as before, and there is no outside cell.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from sqlglot import exp

from dpsql.analysis.plan import GroupKey
from dpsql.errors import DPError, InternalError
from dpsql.policy.model import DEFAULT_MAX_RELEASED_KEYS, ColumnRule, KeyDomain  # noqa: F401  (re-exported: the limit is this module's rule)
from dpsql.sql.allowlist import check_public
from dpsql.sql.parse import DIALECT


def narrow_keys(keys: Sequence[GroupKey], where: exp.Expression | None,
                columns: Sequence[ColumnRule] = ()) -> tuple[GroupKey, ...]:
    """Each KEYS-domain key with the top-level AND-ed WHERE conjuncts that mention its column
    and constants only (``GroupKey.narrowed_by``). A key that is a column of a public table
    joined into the query is narrowed as well by conjuncts reading only columns of that same
    joined table (``columns``: the query's column rules, whose ``KeyDomain.joined`` tells them):
    they are evaluated on the table's rows, the ones its keys come from. Anything the public
    allow-list refuses (``check_public(..., deterministic=True)``) narrows nothing.

    >>> import sqlglot
    >>> from dpsql.policy.model import KeyDomain
    >>> key = GroupKey("g0", exp.column("origin"), KeyDomain(table="airports", column="faa"))
    >>> query = sqlglot.parse_one("SELECT 1 FROM t WHERE origin IN ('EWR', 'JFK') AND delay > 0 AND origin <> dest")
    >>> where = query.args["where"].this
    >>> [c.sql() for c in narrow_keys([key], where)[0].narrowed_by]
    ["origin IN ('EWR', 'JFK')"]
    >>> joined = [ColumnRule("name", keys=KeyDomain(table="airports", column="name", joined="join1")),
    ...           ColumnRule("a_tz", keys=KeyDomain(table="airports", column="tz", joined="join1"))]
    >>> key = GroupKey("g0", exp.column("name"), joined[0].keys)
    >>> where = sqlglot.parse_one("SELECT 1 FROM t WHERE a_tz = -8 AND delay > 0 AND a_tz < delay").args["where"].this
    >>> narrowed = narrow_keys([key], where, joined)[0]
    >>> [c.sql() for c in narrowed.narrowed_by], narrowed.narrowing_columns
    (['a_tz = -8'], (('a_tz', 'tz'),))
    """
    if where is None:
        return tuple(keys)
    conjuncts = [c for c in where.flatten() if isinstance(c, exp.Expression)] if isinstance(where, exp.And) else [where]
    public = {rule.name.lower(): rule.keys for rule in columns
              if rule.keys is not None and rule.keys.joined is not None and rule.keys.values is None}
    narrowed = []
    for key in keys:
        if key.domain is None or not isinstance(key.expression, exp.Column):
            narrowed.append(key)
            continue
        own = key.expression.name.lower()
        joined = key.domain.joined if key.domain.values is None else None
        readable = {own} if joined is None else {name for name, domain in public.items() if domain.joined == joined}
        mine = tuple(c for c in conjuncts if _only_about(c, readable | {own}))
        read = sorted({c.name.lower() for conjunct in mine for c in conjunct.find_all(exp.Column)} - {own})
        others = tuple((name, public[name].column or "") for name in read)
        narrowed.append(replace(key, narrowed_by=mine, narrowing_columns=others) if mine else key)
    return tuple(narrowed)


def _only_about(conjunct: exp.Expression, readable: set[str]) -> bool:
    """True when ``conjunct`` reads columns among ``readable`` (lower case) and nothing else but
    constants, and is a deterministic expression on the public allow-list."""
    columns = list(conjunct.find_all(exp.Column))
    if not columns or any(c.name.lower() not in readable for c in columns):
        return False
    if any(isinstance(node, (exp.Subquery, exp.Select, exp.AggFunc, exp.Star)) for node in conjunct.walk()):
        return False
    try:
        check_public(conjunct, deterministic=True)
    except DPError:
        return False
    return True


def on_value(conjunct: exp.Expression, column: str | dict[str, str], value: str = "") -> exp.Expression:
    """``conjunct`` with its column replaced by the column ``value`` (a domain's typed value);
    or, given a mapping, each column it names (lower case) by the column it maps to.

    >>> import sqlglot
    >>> on_value(sqlglot.parse_one("t.k BETWEEN 1 AND 3"), "k", "v0").sql()
    'v0 BETWEEN 1 AND 3'
    >>> on_value(sqlglot.parse_one("k < tz"), {"k": "v0", "tz": "dp_c0"}).sql()
    'v0 < dp_c0'
    """
    names = column if isinstance(column, dict) else {column.lower(): value}

    def visit(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name.lower() in names:
            return exp.column(names[node.name.lower()])
        return node

    return conjunct.copy().transform(visit)


def reports_outside(keys: Sequence[GroupKey]) -> bool:
    """True when rows outside the released keys form one more released cell: every key has a
    public domain (no partition selection)."""
    return bool(keys) and all(key.domain is not None for key in keys)


def domain_parts(keys: Sequence[GroupKey]) -> list[list[int]]:
    """Key indices grouped by where their values come from. A policy's KEYS line is a domain of
    one column, so such keys combine freely: the released keys are the product of their domains
    (two columns ``KEYS FROM airports.faa`` take every pair of airports, one column's with
    itself included). Only columns of one public table joined into the query come from one of
    its rows, so they take the combinations that table holds (an airport's name with its time
    zone); rows with another combination cannot occur but for NULL, which is outside anyway.

    >>> from dpsql.policy.model import KeyDomain
    >>> a = GroupKey("g0", exp.column("origin"), KeyDomain(table="airports", column="faa"))
    >>> b = GroupKey("g1", exp.column("dest"), KeyDomain(table="airports", column="faa"))
    >>> c = GroupKey("g2", exp.column("name"), KeyDomain(table="airports", column="name", joined="join1"))
    >>> d = GroupKey("g3", exp.column("tz"), KeyDomain(table="Airports", column="tz", joined="join1"))
    >>> e = GroupKey("g4", exp.column("name2"), KeyDomain(table="airports", column="name", joined="join2"))
    >>> domain_parts([a, b, c, d, e])
    [[0], [1], [2, 3], [4]]
    """
    groups: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        domain = _domain(key)
        joined = domain.values is None and domain.joined is not None
        part = ((domain.table or "").lower(), domain.joined) if joined else (index,)
        groups.setdefault(part, []).append(index)
    return list(groups.values())


def key_text(key: GroupKey) -> str:
    """A key as the analyst wrote it: a column by its name, else its SQL.

    >>> key_text(GroupKey("g0", exp.column("dest", quoted=True), None))
    'dest'
    """
    expression = key.expression
    return expression.name if isinstance(expression, exp.Column) else expression.sql(dialect=DIALECT)


def domain_text(key: GroupKey) -> str:
    """The domain of a key as the analyst reads it in messages and explain().

    >>> import sqlglot
    >>> from dpsql.policy.model import KeyDomain
    >>> key = GroupKey("g0", exp.column("origin"), KeyDomain(table="airports", column="faa"))
    >>> domain_text(key)
    'the KEYS domain of origin (airports.faa)'
    >>> domain_text(replace(key, narrowed_by=(sqlglot.parse_one("origin = 'EWR'"),)))
    "the KEYS domain of origin (airports.faa) where origin = 'EWR'"
    """
    domain = _domain(key)
    source = f"{domain.table}.{domain.column}" if domain.values is None else f"{len(domain.values)} listed keys"
    text = f"the KEYS domain of {key_text(key)} ({source})"
    if key.narrowed_by:
        text += " where " + " AND ".join(c.sql(dialect=DIALECT) for c in key.narrowed_by)
    return text


def product_text(keys: Sequence[GroupKey], parts: Sequence[tuple[list[int], int]]) -> str:
    """What a GROUP BY's released keys are the product of, each factor with the size that was
    counted: a key's own domain, or the combinations one joined public table holds of its keys
    (``domain_parts``: as they occur together in its rows, not the product of their domains).

    >>> from dpsql.policy.model import KeyDomain
    >>> store = GroupKey("g0", exp.column("store"), KeyDomain(table="stores", column="store", joined="join1"))
    >>> size = GroupKey("g1", exp.column("sz"), KeyDomain(table="stores", column="sz", joined="join1"))
    >>> plan = GroupKey("g2", exp.column("plan"), KeyDomain(values=("free", "pro", "plus")))
    >>> print(product_text([store, size, plan], [([0, 1], 4), ([2], 3)]))  # doctest: +NORMALIZE_WHITESPACE
    the 4 combinations of (store, sz) that occur together in the rows of the joined public table stores
    (stores.store, stores.sz) times the 3 keys of the KEYS domain of plan (3 listed keys)
    """
    texts = []
    for indices, size in parts:
        part = [keys[i] for i in indices]
        if len(part) == 1:
            texts.append(f"the {size:,} key{'' if size == 1 else 's'} of {domain_text(part[0])}")
            continue
        table = _domain(part[0]).table
        sources = ", ".join(f"{table}.{_domain(key).column}" for key in part)
        text = (f"the {size:,} combination{'' if size == 1 else 's'} of ({', '.join(key_text(k) for k in part)}) "
                f"that occur together in the rows of the joined public table {table} ({sources})")
        narrowed = [c.sql(dialect=DIALECT) for key in part for c in key.narrowed_by]
        texts.append(text + (" where " + " AND ".join(narrowed) if narrowed else ""))
    return " times ".join(texts)


def _domain(key: GroupKey) -> KeyDomain:
    """The domain of a key these functions are only ever given keys with one for."""
    if key.domain is None:
        raise InternalError(f"the key {key.name} has no KEYS domain here: this is a bug in dpsql")
    return key.domain
