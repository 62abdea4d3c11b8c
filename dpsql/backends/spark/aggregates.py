"""Per-node rewrites of aggregates over public tables: DuckDB's exact sums and averages on Spark.

As ``dpsql.backends.spark.rewrites`` (whose ``Writer`` they use): children are rewritten first,
types read with ``typed``. DuckDB sums integers in HUGEINT and DECIMALs in DECIMAL(38, s), and
averages integers as that exact sum over the count; Spark sums a BIGINT column in BIGINT
(overflowing) and averages integers in DOUBLE (rounding once a partial sum passes 2^53, so the
result depends on the order of the rows).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.backends.spark.infer import decimal_shape, is_decimal, is_integer, typed
from dpsql.backends.spark.rewrites import Writer, with_type


def aggregate(w: Writer, node: exp.Expr) -> exp.Expr:
    """SUM of integers and DECIMALs, exact as DuckDB's HUGEINT and DECIMAL(38, s) sums are."""
    source = typed(node.this)
    if isinstance(node, exp.Sum) and (is_integer(source) or is_decimal(source)):
        scale = 0 if is_integer(source) else decimal_shape(source)[1]  # type: ignore[index]
        widened = exp.Sum(this=exp.Cast(this=node.this, to=exp.DataType.build(f"DECIMAL(38,{scale})")))
        if scale != 0 or isinstance(node.parent, exp.Window):  # a cast cannot stand between SUM and OVER
            return widened
        return exp.Cast(this=widened, to=exp.DataType.build(f"DECIMAL(38,{scale})"))
    return node


def average(w: Writer, node: exp.Expr) -> exp.Expr:
    """AVG of integers as DuckDB computes it: the exact sum as a DOUBLE over the count (Spark's
    AVG adds in DOUBLE, which rounds once sums pass 2^53)."""
    if not is_integer(typed(node.this)) or isinstance(node.parent, exp.Window):
        return node
    total = exp.Sum(this=exp.Cast(this=node.this.copy(), to=exp.DataType.build("DECIMAL(38,0)")))
    count = exp.Count(this=node.this.copy())
    return with_type(exp.Div(this=exp.cast(total, "DOUBLE"), expression=exp.cast(count, "DOUBLE")), "DOUBLE")


def filtered(w: Writer, node: exp.Expr) -> exp.Expr:
    """``agg FILTER (WHERE c)`` whose aggregate was written as an expression of aggregates (an
    exact SUM in a cast, AVG as a sum over a count): the filter goes on each of them, as Spark
    reads FILTER only right after an aggregate."""
    if isinstance(node.this, exp.AggFunc):
        return node
    written = node.this
    for inner in list(written.find_all(exp.AggFunc)):
        inner.replace(exp.Filter(this=inner.copy(), expression=node.expression.copy()))
    return written
