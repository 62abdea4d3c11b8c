"""The per-node rewrite of CAST and TRY_CAST: DuckDB's conversions in Spark's terms.

As ``dpsql.backends.spark.rewrites`` (whose ``Writer`` it uses). What differs, measured on
pyspark 4.3 against DuckDB 2.0: a DOUBLE cast to an integer rounds half to even on DuckDB
(2.5 -> 2, 3.5 -> 4) and is truncated on Spark (2.7 -> 2); a DECIMAL rounds half away from zero
(2.5 -> 3) and is truncated on Spark; Spark's DOUBLE to BIGINT saturates at 2^63 where DuckDB
fails; a finite DOUBLE past FLOAT's range is an error on DuckDB and infinity on Spark; a DATE
past the TIMESTAMP range makes Spark raise an error no TRY_CAST catches (``Writer.cast``); a
DATE's text has a sign past year 9999 on Spark and no ' (BC)'.
Casts ``dpsql.backends.spark.check`` refuses (text to numbers, numbers to text, ...) never get here.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.backends.spark import infer as infer
from dpsql.backends.spark.infer import is_decimal, is_integer, typed
from dpsql.backends.spark.rewrites import Writer, infinity, need, with_type


def cast(w: Writer, node: exp.Expr) -> exp.Expr:
    """A cast to an integer rounds as DuckDB does: a DOUBLE half to even (bround), a DECIMAL half
    away from zero (round); Spark would truncate both. Under ``total`` every cast is a TRY_CAST."""
    source, target = typed(node.this), typed(node)
    if is_integer(target) or target == "FLOAT":
        need(node, node.this)
    value = node.this
    safe = isinstance(node, exp.TryCast) or w.try_
    to = node.args["to"]

    def made(value: exp.Expr) -> exp.Expr:
        return with_type(exp.TryCast(this=value, to=to, safe=True) if safe else exp.Cast(this=value, to=to), target)

    if is_integer(target) and infer.is_float(source):
        value = w.fn("bround", value)
        if target == "BIGINT":  # Spark's cast saturates at 2^63 (the DOUBLE next to BIGINT's maximum)
            return w.let([value], lambda v: exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Paren(this=exp.and_(
                exp.GTE(this=v.use(), expression=_power(-1)), exp.LT(this=v.use(), expression=_power(1))))),
                true=w.fail("BIGINT", "BIGINT out of range") if not isinstance(node, exp.TryCast)
                else exp.cast(exp.Null(), "BIGINT"))], default=made(v.use())))
    elif is_integer(target) and is_decimal(source):
        value = exp.Round(this=value)
    elif source == "DATE" and target == "VARCHAR":
        return with_type(w.let([value], _date_text), "VARCHAR")
    elif source == "DATE" and str(target).startswith("TIMESTAMP") and not isinstance(node, exp.TryCast):
        return w.cast(value, str(target))
    elif target == "FLOAT" and source == "DOUBLE":  # DuckDB refuses a finite DOUBLE beyond FLOAT; Spark gives inf
        return w.let([value], lambda v: exp.Case(ifs=[exp.If(this=exp.and_(
            exp.LT(this=exp.Abs(this=v.use()), expression=infinity()),
            exp.EQ(this=exp.Abs(this=exp.cast(v.use(), "FLOAT")), expression=infinity())),
            true=w.fail("FLOAT", "FLOAT out of range") if not isinstance(node, exp.TryCast)
            else exp.cast(exp.Null(), "FLOAT"))], default=made(v.use())))
    return made(value)


def _date_text(d) -> exp.Expr:
    """DuckDB's text of a DATE: years 1-9999 as four digits, later ones in full ('10000-01-01', where
    Spark writes '+10000-01-01'), earlier ones counted back with ' (BC)' ('0001-12-31 (BC)' is Spark's
    year 0, '0000-12-31'). Built from the parts, which Spark computes over DuckDB's whole DATE range."""
    year = exp.Anonymous(this="year", expressions=[d.use()])
    parts = [exp.Anonymous(this=part, expressions=[d.use()]) for part in ("month", "dayofmonth")]

    def written(pattern: str, shown_year: exp.Expr) -> exp.Expr:  # Java's %04d pads, never cuts
        return exp.Anonymous(this="format_string", expressions=[exp.Literal.string(pattern), shown_year, *parts])
    return exp.Case(ifs=[
        exp.If(this=exp.Is(this=d.use(), expression=exp.Null()), true=exp.cast(exp.Null(), "VARCHAR")),
        exp.If(this=exp.GTE(this=year, expression=exp.Literal.number(1)), true=written("%04d-%02d-%02d", year.copy()))],
        default=written("%04d-%02d-%02d (BC)", exp.Sub(this=exp.Literal.number(1), expression=year.copy())))


def _power(sign: int) -> exp.Expr:
    """±2^63 as a DOUBLE."""
    return exp.cast(exp.Literal.string(f"{'-' if sign < 0 else ''}9223372036854775808"), "DOUBLE")
