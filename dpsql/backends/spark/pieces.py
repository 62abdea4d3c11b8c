"""Spark's forms of dpsql's pieces (``dpsql.sql.pieces``), for sqlglot's "spark" dialect.

* ``Total``: Spark has ``try_*`` functions per operation and ANSI mode on, so it needs its own
  walk of the expression (``dpsql.backends.spark.render.total``);
* ``ExactInteger``: a cast to ``DECIMAL(38, 0)``;
* ``SaltedHash``: ``xxhash64`` with the salt as its seed (``dpsql.backends.spark.types.keyed_hash``),
  checked for uniformity as DuckDB's is;
* ``Canonical``: Spark's own canonical text (``dpsql.backends.spark.types.canonical_text``),
  checked value by value;
* ``KeyText``: ``encode(CAST(x AS STRING), 'UTF-8')`` with Spark's own canonical texts
  (``dpsql.backends.spark.types.key_text_sql``);
* ``IsNaN``: ``isnan``, NULL for NULL;
* ``CopiedTable``: the copy, a cached temporary view of the session;
* ``InSample``: ``sha2(concat(:dp_sample_key, text), 256)`` of the unit's canonical text;
* ``* EXCLUDE`` / ``* REPLACE``: sqlglot's ``Star(except_=..., replace=...)``, which it renders
  as ``* EXCEPT``; ``* REPLACE`` has no Spark form and must become an explicit list.

Besides the pieces, DuckDB types (``exp.DataType``), ordered float sums and CTEs take their
Spark forms here, and the whole tree is first made to mean on Spark what it means on DuckDB
(``dpsql.backends.spark.render.agree``). Helpers' SQL text is placed verbatim (``exp.Var``),
never re-parsed, so sqlglot's Spark writer cannot re-spell a function whose meaning dpsql fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlglot import exp

from dpsql.backends.bounding import SALT_PARAMETER, piece_copy_name
from dpsql.backends.rendering import DUCKDB, SPARK, Rendering, in_sample
from dpsql.backends.spark.render import agree, total
from dpsql.backends.spark.types import canonical_text, key_text_sql, keyed_hash, spark_type
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


def _raw(sql: str) -> exp.Expr:
    return exp.Var(this=f"({sql})")


def _sql(node: exp.Expr) -> str:
    return node.sql(dialect=SPARK)


def _total(node: Total, types: Mapping[str, str]) -> exp.Expr:
    return total(node.this, types)


def _exact_integer(node: ExactInteger) -> exp.Expr:
    return exp.Cast(this=node.this, to=exp.DataType.build("DECIMAL(38, 0)", dialect=SPARK))


def _salted_hash(node: SaltedHash) -> exp.Expr:
    return _raw(keyed_hash(":" + SALT_PARAMETER, [_sql(value) for value in node.expressions]))


def _canonical(node: Canonical) -> exp.Expr:
    return _raw(canonical_text(_sql(node.this), node.args["type"].name))


def _key_text(node: KeyText) -> exp.Expr:
    """Spark's own text of the key (``spark.types.key_text_sql``; UTC is pinned), which
    ``spark.keys.duckdb_key_text`` reads back as DuckDB's text of the same value."""
    type_name = node.args["type"].name if node.args.get("type") else "VARCHAR"
    return _raw(key_text_sql(_sql(node.this), type_name))


def _is_nan(node: IsNaN) -> exp.Expr:
    """DuckDB's ``isnan``, NULL for NULL: Spark's says false for NULL, so a clamp that sends
    everything that is not NaN to its upper bound (``rewrite._compared_clamp``) sent NULL there."""
    value = node.this
    null = exp.Is(this=value.copy(), expression=exp.Null())
    return exp.Case(ifs=[exp.If(this=null, true=exp.Null())], default=exp.Anonymous(this="isnan", expressions=[value]))


def _data_type(node: exp.DataType) -> exp.Expr:
    """A DuckDB type — a column's catalog type (``pieces.catalog_type``, its name verbatim) or
    one dpsql casts to — as its exact Spark counterpart (``dpsql.backends.spark.types.spark_type``,
    which refuses a type that has none, such as HUGEINT), never sqlglot's approximation."""
    if node.this == exp.DataType.Type.INT128:
        # The type dpsql compares integers of two widths in (``analysis.joins``): DECIMAL(38, 0)
        # holds every Spark integer exactly (an analyst's own casts are the check's to rule on).
        return exp.DataType.build("DECIMAL(38, 0)", dialect=SPARK)
    written = node.args["kind"] if node.this == exp.DataType.Type.USERDEFINED else node.sql(dialect=DUCKDB)
    return exp.DataType.build(spark_type(written), dialect=SPARK)


def _ordered_sum(node: exp.Sum | exp.Avg) -> exp.Expr:
    """``SUM(v ORDER BY v)`` / ``AVG(...)``, a per-unit float sum whose result must not depend on
    the order Spark meets the unit's rows in (``dpsql.analysis.subqueries.total_aggregate``): Spark
    has no ordered aggregate, so the unit's (at most k) values are sorted and folded left to right,
    as DuckDB adds them. NULLs are left out; no value at all gives NULL, as SUM and AVG do."""
    if not isinstance(node.this, exp.Order):
        return node
    value = _sql(node.this.this)
    count = f"COUNT({value})"
    summed = (f"aggregate(array_sort(collect_list({value})), CAST(0 AS DOUBLE), "
              f"(dp_sum, dp_value) -> dp_sum + dp_value)")
    result = summed if isinstance(node, exp.Sum) else f"{summed} / {count}"
    return _raw(f"CASE WHEN {count} = 0 THEN NULL ELSE {result} END")


def _in_sample(node: InSample) -> exp.Expr:
    return in_sample(node, lambda text: _raw(f"sha2(concat(:{SAMPLE_KEY_PARAMETER}, {_sql(text)}), 256)"),
                     _canonical, lambda name: exp.table_(name, quoted=True))


def _bounded_table(node: CopiedTable) -> exp.Expr:
    return exp.table_(piece_copy_name(node), quoted=True)


def _cte(node: exp.CTE) -> exp.Expr:
    """A CTE without DuckDB's [NOT] MATERIALIZED, which Spark does not parse (it plans CTEs itself)."""
    node.set("materialized", None)
    return node


_PIECES: dict[type, Callable] = {
    ExactInteger: _exact_integer,
    SaltedHash: _salted_hash,
    Canonical: _canonical,
    KeyText: _key_text,
    IsNaN: _is_nan,
    InSample: _in_sample,
    CopiedTable: _bounded_table,
    exp.CTE: _cte,
    exp.DataType: _data_type,
    exp.Sum: _ordered_sum,
    exp.Avg: _ordered_sum,
}

_TYPED: dict[type, Callable] = {Total: _total}

RENDERING = Rendering(_PIECES, typed=_TYPED, prepare=agree)
"""Spark's forms of the pieces (``dpsql.backends.render.render``): the tree agreed first
(``agree``), ``Total`` written with the dialect's column types."""
