"""The engine-specific pieces of dpsql's generated SQL, as tree nodes rendered once per engine.

Analysis and the rewrite (``dpsql.backends.rewrite``) build one sqlglot tree per statement out
of plain nodes (SELECT, CASE, LEAST, windows, ...), which sqlglot writes in any dialect, and the
few pieces of ``dpsql.sql.pieces``, whose meaning dpsql fixes but whose SQL differs by engine.
``render`` replaces each of them by its engine's form and writes the tree, once, at the end.

The Spark backend (``dpsql.backends.spark``) supplies one more rendering per piece (``_SPARK``,
for sqlglot's "spark" dialect):

* ``Total``: an expression whose errors become NULL (DuckDB's ``TRY``; Spark has ``try_*``
  functions per operation and ANSI mode off, so it needs its own walk of the expression);
* ``ExactInteger``: a value widened so that summing integers stays exact (``HUGEINT``; Spark:
  ``DECIMAL(38, 0)``);
* ``SaltedHash``: a keyed, uniform 64-bit hash of the secret salt and values, the order of
  every salted choice (DuckDB: ``hash()`` of each value folded in by XOR and mixed by ``hash()``
  again, the salt a query parameter, ``dpsql.backends.bounding.keyed_hash``; Spark: ``xxhash64``
  with the salt as its seed, checked for uniformity the same way);
* ``Canonical``: a value's exact canonical encoding as text (DuckDB:
  ``dpsql.backends.bounding.canonical_text``; Spark needs its own, checked value by value);
* ``KeyText``: a key's canonical text as bytes, its lossless read-back form
  (``dpsql.backends.keys``: DuckDB's ``encode(CAST(x AS VARCHAR))``; Spark: ``encode(CAST(x AS
  STRING), 'UTF-8')``, with its own canonical texts to check);
* ``IsNaN``: true for a floating NaN (DuckDB's ``ISNAN``; Spark's ``isnan``);
* ``CopiedTable``: a private table's bounded copy (``dpsql.backends.bounding`` names it; DuckDB
  keeps the copies in the attached in-memory database ``dp_bounding``);
* ``InSample``: a unit in the query's Poisson sample: ``unit IN (SELECT dp_unit FROM <the copy's
  row-count table> WHERE left(hash, 16) < threshold)``, the hash computed once per unit (DuckDB:
  ``sha256($dp_sample_key || text)``; Spark: ``sha2(concat(:dp_sample_key, text), 256)``, both
  lower-case hex, of the unit's canonical text); a row-level copy's rows are its units, hashed as
  they are;
* ``* EXCLUDE`` / ``* REPLACE``: sqlglot's ``Star(except_=..., replace=...)``, which it renders
  as ``* EXCEPT`` for Spark; ``* REPLACE`` has no Spark form and must become an explicit list;
"""

from __future__ import annotations

from collections.abc import Callable

import sqlglot
from sqlglot import exp

from dpsql.backends.bounding import DATABASE, SALT_PARAMETER, binary, canonical_text, piece_copy_name, raw_rows_name
from dpsql.sql.pieces import (
    SAMPLE_KEY_PARAMETER,
    Canonical,
    CopiedTable,
    ExactInteger,
    InSample,
    IsNaN,
    KeyText,
    SaltedHash,
    Total,
)

DUCKDB = "duckdb"
SPARK = "spark"


class SparkSQL(str):
    """The "spark" dialect with the column types its rendering reads: Spark's form of an
    expression depends on its operands' DuckDB types (``dpsql.backends.spark.render``), which the
    Spark engine knows from its catalog. A ``str`` equal to ``SPARK``, so it stands wherever a
    dialect name does; ``SparkEngine.dialect`` is one."""

    types: dict[str, str]

    def __new__(cls, types: dict[str, str] | None = None) -> "SparkSQL":
        made = super().__new__(cls, SPARK)
        made.types = dict(types or {})
        return made


def _duckdb_total(node: Total) -> exp.Expr:
    return exp.Anonymous(this="TRY", expressions=[node.this])


def _duckdb_exact_integer(node: ExactInteger) -> exp.Expr:
    return exp.Cast(this=node.this, to=exp.DataType.build("HUGEINT", dialect=DUCKDB))


def _duckdb_salted_hash(node: SaltedHash) -> exp.Expr:
    """``dpsql.backends.bounding.keyed_hash``: each value's hash folded in by XOR, then mixed."""
    folded: exp.Expr = exp.Anonymous(this="HASH", expressions=[exp.Placeholder(this=SALT_PARAMETER)])
    for value in node.expressions:
        mixed = exp.Anonymous(this="XOR", expressions=[folded, exp.Anonymous(this="HASH", expressions=[value])])
        folded = exp.Anonymous(this="HASH", expressions=[mixed])
    return folded


def _duckdb_canonical(node: Canonical) -> exp.Expr:
    value = node.this.sql(dialect=DUCKDB)
    return sqlglot.parse_one(binary(canonical_text(value, node.args["type"].name)), dialect=DUCKDB)


def _duckdb_key_text(node: KeyText) -> exp.Expr:
    text = exp.cast(node.this, exp.DataType.build("VARCHAR", dialect=DUCKDB))
    return exp.Anonymous(this="ENCODE", expressions=[text])


def _duckdb_is_nan(node: IsNaN) -> exp.Expr:
    return exp.Anonymous(this="ISNAN", expressions=[node.this])


def _in_sample(node: InSample, digest: Callable[[exp.Expr], exp.Expr], canonical: Callable[[Canonical], exp.Expr],
               units: Callable[[str], exp.Expr]) -> exp.Expr:
    """The first 16 hex digits of ``digest`` (a lower-case hex SHA-256) of the key and the unit's
    canonical text, below the threshold (fixed-width hex compares as the number it writes). Over a
    unit-level copy, computed once per unit on its row-count table (``units`` of its name) and
    matched by the unit's own equality, which is its identity (the copy admits no other units)."""

    def kept(value: exp.Expr) -> exp.Expr:
        text = canonical(Canonical(this=value, type=node.args["type"].copy()))
        head = exp.Anonymous(this="LEFT", expressions=[digest(text), exp.Literal.number(16)])
        return exp.LT(this=head, expression=node.args["threshold"].copy())

    copied = node.args.get("units")
    if copied is None:
        return exp.Paren(this=kept(node.this))
    # Children are rendered first: the copy is its engine's table by now, named as the copy.
    name = copied.name if isinstance(copied, exp.Table) else piece_copy_name(copied)
    sampled = exp.Select(expressions=[exp.column("dp_unit")]).from_(units(raw_rows_name(name)))
    return exp.In(this=node.this, query=sampled.where(kept(exp.column("dp_unit"))).subquery())


def _duckdb_in_sample(node: InSample) -> exp.Expr:
    return _in_sample(node, lambda text: exp.Anonymous(this="SHA256", expressions=[
        exp.DPipe(this=exp.Placeholder(this=SAMPLE_KEY_PARAMETER), expression=exp.Paren(this=text))]),
        _duckdb_canonical, lambda name: exp.table_(name, db="main", catalog=DATABASE, quoted=True))


def _duckdb_bounded_table(node: CopiedTable) -> exp.Expr:
    return exp.table_(piece_copy_name(node), db="main", catalog=DATABASE, quoted=True)


_DUCKDB: dict[type, Callable] = {
    Total: _duckdb_total,
    ExactInteger: _duckdb_exact_integer,
    SaltedHash: _duckdb_salted_hash,
    Canonical: _duckdb_canonical,
    KeyText: _duckdb_key_text,
    IsNaN: _duckdb_is_nan,
    InSample: _duckdb_in_sample,
    CopiedTable: _duckdb_bounded_table,
}


# -- Spark (``dpsql.backends.spark``): helpers' SQL text is placed verbatim (``exp.Var``), never
# re-parsed, so sqlglot's Spark writer cannot re-spell a function whose meaning dpsql fixed.

def _raw(sql: str) -> exp.Expr:
    return exp.Var(this=f"({sql})")


def _spark_sql(node: exp.Expr) -> str:
    return node.sql(dialect=SPARK)


def _spark_total(node: Total, types: dict[str, str]) -> exp.Expr:
    from dpsql.backends.spark.render import total  # the Spark-only walk: imported when Spark renders

    return total(node.this, types)


def _spark_exact_integer(node: ExactInteger) -> exp.Expr:
    return exp.Cast(this=node.this, to=exp.DataType.build("DECIMAL(38, 0)", dialect=SPARK))


def _spark_salted_hash(node: SaltedHash) -> exp.Expr:
    from dpsql.backends.spark.types import keyed_hash

    return _raw(keyed_hash(":" + SALT_PARAMETER, [_spark_sql(value) for value in node.expressions]))


def _spark_canonical(node: Canonical) -> exp.Expr:
    from dpsql.backends.spark.types import canonical_text

    return _raw(canonical_text(_spark_sql(node.this), node.args["type"].name))


def _spark_key_text(node: KeyText) -> exp.Expr:
    """Spark's own text of the key (``spark_types.key_text_sql``; UTC is pinned), which
    ``spark_keys.duckdb_key_text`` reads back as DuckDB's text of the same value."""
    from dpsql.backends.spark.types import key_text_sql

    type_name = node.args["type"].name if node.args.get("type") else "VARCHAR"
    return _raw(key_text_sql(_spark_sql(node.this), type_name))


def _spark_is_nan(node: IsNaN) -> exp.Expr:
    """DuckDB's ``isnan``, NULL for NULL: Spark's says false for NULL, so a clamp that sends
    everything that is not NaN to its upper bound (``rewrite._compared_clamp``) sent NULL there."""
    value = node.this
    null = exp.Is(this=value.copy(), expression=exp.Null())
    return exp.Case(ifs=[exp.If(this=null, true=exp.Null())], default=exp.Anonymous(this="isnan", expressions=[value]))


def _spark_data_type(node: exp.DataType) -> exp.Expr:
    """A DuckDB type — a column's catalog type (``pieces.catalog_type``, its name verbatim) or
    one dpsql casts to — as its exact Spark counterpart (``dpsql.backends.spark.types.spark_type``,
    which refuses a type that has none, such as HUGEINT), never sqlglot's approximation."""
    from dpsql.backends.spark.types import spark_type

    if node.this == exp.DataType.Type.INT128:
        # The type dpsql compares integers of two widths in (``analysis.joins``): DECIMAL(38, 0)
        # holds every Spark integer exactly (an analyst's own casts are the check's to rule on).
        return exp.DataType.build("DECIMAL(38, 0)", dialect=SPARK)
    written = node.args["kind"] if node.this == exp.DataType.Type.USERDEFINED else node.sql(dialect=DUCKDB)
    return exp.DataType.build(spark_type(written), dialect=SPARK)


def _spark_ordered_sum(node: exp.Sum | exp.Avg) -> exp.Expr:
    """``SUM(v ORDER BY v)`` / ``AVG(...)``, a per-unit float sum whose result must not depend on
    the order Spark meets the unit's rows in (``dpsql.analysis.subqueries.total_aggregate``): Spark
    has no ordered aggregate, so the unit's (at most k) values are sorted and folded left to right,
    as DuckDB adds them. NULLs are left out; no value at all gives NULL, as SUM and AVG do."""
    if not isinstance(node.this, exp.Order):
        return node
    value = _spark_sql(node.this.this)
    count = f"COUNT({value})"
    total = (f"aggregate(array_sort(collect_list({value})), CAST(0 AS DOUBLE), "
             f"(dp_sum, dp_value) -> dp_sum + dp_value)")
    result = total if isinstance(node, exp.Sum) else f"{total} / {count}"
    return _raw(f"CASE WHEN {count} = 0 THEN NULL ELSE {result} END")


def _spark_in_sample(node: InSample) -> exp.Expr:
    return _in_sample(node, lambda text: _raw(f"sha2(concat(:{SAMPLE_KEY_PARAMETER}, {_spark_sql(text)}), 256)"),
                      _spark_canonical, lambda name: exp.table_(name, quoted=True))


def _spark_bounded_table(node: CopiedTable) -> exp.Expr:
    return exp.table_(piece_copy_name(node), quoted=True)


def _spark_cte(node: exp.CTE) -> exp.Expr:
    """A CTE without DuckDB's [NOT] MATERIALIZED, which Spark does not parse (it plans CTEs itself)."""
    node.set("materialized", None)
    return node


_SPARK: dict[type, Callable] = {
    Total: _spark_total,
    ExactInteger: _spark_exact_integer,
    SaltedHash: _spark_salted_hash,
    Canonical: _spark_canonical,
    KeyText: _spark_key_text,
    IsNaN: _spark_is_nan,
    InSample: _spark_in_sample,
    CopiedTable: _spark_bounded_table,
    exp.CTE: _spark_cte,
    exp.DataType: _spark_data_type,
    exp.Sum: _spark_ordered_sum,
    exp.Avg: _spark_ordered_sum,
}
_RENDERINGS = {DUCKDB: _DUCKDB, SPARK: _SPARK}
_TYPED = {_spark_total}
"""Renderings that read the dialect's column types (``SparkSQL``)."""


def render(tree: exp.Expr, dialect: str = DUCKDB, copy: bool = True, pretty: bool = False) -> str:
    """The SQL of ``tree`` for ``dialect``: each engine-specific node in its engine's form;
    ``pretty`` lays it out on indented lines (for EXPLAIN).

    >>> from dpsql.sql.pieces import salted_hash, total
    >>> render(exp.select(total(exp.column("x").div(2)), salted_hash(exp.column("u"))))
    'SELECT TRY(x / 2), HASH(XOR(HASH($salt), HASH(u)))'
    """
    pieces = _RENDERINGS[dialect]
    tree = tree.copy() if copy else tree  # in place: the caller built ``tree`` for this call alone
    types = getattr(dialect, "types", {})
    if dialect == SPARK:
        from dpsql.backends.spark.render import agree

        tree = agree(tree, types)  # DuckDB's meaning in Spark's terms, before the pieces are written
    for node in reversed(list(tree.dfs())):  # children first: a piece may hold another
        rendering = pieces.get(type(node))
        if rendering is not None:
            replacement = rendering(node, types) if rendering in _TYPED else rendering(node)
            if node is tree:
                tree = replacement
            else:
                node.replace(replacement)
    return tree.sql(dialect=dialect, copy=False, pretty=pretty)  # copied above if asked: no second copy
