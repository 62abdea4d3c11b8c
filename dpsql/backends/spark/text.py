"""Rules of the Spark allow-list for strings, dates and named functions.

Like ``dpsql.backends.spark.numbers``: each rule refuses the uses whose Spark rendering
(``dpsql.backends.spark.render.agree``) cannot give DuckDB's answer, with the measured
difference as its reason. Most string and date functions agree once ``agree`` has rewritten
them (DuckDB's day of week counts from Sunday = 0, Spark's from 1; DuckDB trims every Unicode
space, Spark only U+0020; DuckDB's LIKE has no escape character, Spark's has ``\\``); the
rules here make sure their arguments are what those rewrites expect.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.backends.spark import infer as infer
from dpsql.backends.spark.infer import integer_literal, is_decimal, is_integer
from dpsql.backends.spark.numbers import INT_MAX, known, refuse

DATE_PARTS = {
    "year": "year", "month": "month", "day": "day", "dayofmonth": "day", "quarter": "quarter",
    "dow": "dow", "dayofweek": "dow", "isodow": "isodow", "doy": "doy", "dayofyear": "doy", "week": "week",
    "weekofyear": "week", "yearweek": "yearweek", "hour": "hour", "minute": "minute", "second": "second",
}
"""Parts of EXTRACT / date_part both engines can give alike, by DuckDB name -> dpsql's name."""

TRUNCATED_UNITS = frozenset({"YEAR", "QUARTER", "MONTH", "WEEK", "DAY", "HOUR", "MINUTE", "SECOND"})
"""Units of date_trunc Spark truncates to as DuckDB does (a week starts on Monday on both)."""

DIFFERENCE_UNITS = frozenset({"DAY", "MONTH", "QUARTER", "YEAR"})
"""Units of date_diff ``agree`` counts as DuckDB does: part boundaries crossed, not whole units."""


def text(node: exp.Expr, *operands: exp.Expr | None) -> None:
    """Every operand is a string (or NULL)."""
    for operand, name in zip([o for o in operands if o is not None], known(node, *operands)):
        if name not in ("VARCHAR", '"NULL"'):
            refuse(node, f"it takes strings, and {operand.sql(dialect='duckdb')} is a {name}",
                   f"cast it: CAST({operand.sql(dialect='duckdb')} AS VARCHAR)")


def like(node: exp.Expr) -> None:
    text(node, node.this, node.expression)


def length(node: exp.Expr) -> None:
    text(node, node.this)


def substring(node: exp.Expr) -> None:
    text(node, node.this)
    for part in ("start", "length"):
        _small_literal(node, node.args.get(part), part)


def left_right(node: exp.Expr) -> None:
    text(node, node.this)
    _small_literal(node, node.expression, "length")


def _small_literal(node: exp.Expr, value: exp.Expr | None, what: str) -> None:
    if value is None:
        return
    number = integer_literal(value)
    if number is None or abs(number) >= INT_MAX:
        refuse(node, f"its {what} must be an integer literal on Spark: DuckDB counts a start of 0 or a negative "
               "length backwards, Spark does not (substring('hello', 0, 2) is 'h' on DuckDB, 'he' on Spark), and "
               "dpsql rewrites only literal positions", "write the positions as integer literals")


def trim(node: exp.Expr) -> None:
    text(node, node.this, node.expression)


def concatenated(node: exp.Expr) -> None:
    """``||`` and CONCAT: each operand a string, or a value both engines write alike as text."""
    operands = [node.this, node.expression] if isinstance(node, exp.DPipe) else node.expressions
    for operand, name in zip(operands, known(node, *operands)):
        if not (name in ("VARCHAR", '"NULL"', "BOOLEAN") or is_integer(name) or is_decimal(name)):
            refuse(node, f"{operand.sql(dialect='duckdb')} is a {name}, which DuckDB and Spark write differently "
                   "as text (1e20 is '1e+20' on DuckDB, '1.0E20' on Spark)",
                   "concatenate strings, integers or DECIMALs")


def temporal(node: exp.Expr) -> None:
    """A date part, truncation or name of a DATE, TIMESTAMP or TIMESTAMP WITH TIME ZONE (read in
    UTC on both engines: the Spark session's zone is pinned)."""
    operand = node.expression if isinstance(node, exp.Extract) else node.this
    if isinstance(node, exp.Anonymous):
        operand = node.expressions[-1]
    (name,) = known(node, operand)
    if not infer.is_temporal(name):
        refuse(node, f"it takes a date or timestamp, and {operand.sql(dialect='duckdb')} is a {name}",
               f"cast it: CAST({operand.sql(dialect='duckdb')} AS DATE)")


def part_name(node: exp.Expr) -> str | None:
    """dpsql's name of the part an EXTRACT or date_part reads (None: not one both engines give alike)."""
    if isinstance(node, exp.Extract):
        return DATE_PARTS.get(node.this.name.lower())
    first = node.expressions[0] if node.expressions else None
    if isinstance(first, exp.Literal) and first.is_string:
        return DATE_PARTS.get(first.this.lower())
    return None


def extract(node: exp.Expr) -> None:
    if isinstance(node, exp.Anonymous) and len(node.expressions) != 2:
        refuse(node, "it takes a part and a date", "write date_part('year', d)")
    if part_name(node) is None:
        refuse(node, "only the parts year, quarter, month, day, dow, isodow, doy, week, yearweek, hour, minute and "
               "second agree on Spark (EXTRACT(second ...) is whole seconds on DuckDB and a DECIMAL with the "
               "fraction on Spark; epoch is refused by Spark)", "use one of those parts")
    temporal(node)


def truncated(node: exp.Expr) -> None:
    unit = node.args.get("unit")
    if unit is None or unit.name.upper() not in TRUNCATED_UNITS:
        refuse(node, "only year, quarter, month, week, day, hour, minute and second truncate alike on Spark",
               "use one of those units")
    temporal(node)


def difference(node: exp.Expr) -> None:
    unit = node.args.get("unit")
    if unit is None or unit.name.upper() not in DIFFERENCE_UNITS:
        refuse(node, "only day, month, quarter and year differences agree on Spark (DuckDB counts the "
               "boundaries crossed: date_diff('hour', 23:59, 00:01) is 1 on DuckDB, 0 on Spark)",
               "use date_diff('day', a, b) or a difference of date parts")
    names = known(node, node.this, node.expression)
    if not all(infer.is_temporal(n) for n in names):
        refuse(node, "it takes dates or timestamps", "cast the values to DATE")


def float_test(node: exp.Expr) -> None:
    """isnan, isinf, isfinite: of numbers (``agree`` keeps a NULL NULL: Spark's isnan(NULL) is false)."""
    (name,) = known(node, node.expressions[0] if isinstance(node, exp.Anonymous) else node.this)
    if not infer.is_number(name):
        refuse(node, "it takes a number", "apply it to a DOUBLE")


def searched(node: exp.Expr) -> None:
    """starts_with, ends_with, contains, prefix, suffix: of strings."""
    operands = node.expressions if isinstance(node, exp.Anonymous) else [node.this, node.expression]
    text(node, *operands)


def aggregate(node: exp.Expr) -> None:
    """An aggregate over public tables: COUNT, MIN and MAX run as written, SUM of integers and
    DECIMALs summed exactly (``agree`` widens them to DECIMAL(38, s), as DuckDB's HUGEINT and
    DECIMAL(38, s) sums are), AVG of integers as that exact sum over the count (Spark's own AVG
    sums in DOUBLE); other aggregates sum floats in an engine-specific order."""
    if isinstance(node, (exp.Count, exp.Min, exp.Max)):
        return
    if isinstance(node, (exp.Sum, exp.Avg)):
        (name,) = known(node, node.this)
        if is_integer(name) or is_decimal(name) and isinstance(node, exp.Sum):
            return
    refuse(node, "DuckDB and Spark add floating-point numbers in different orders and widths, so the last "
           "digits differ", "use COUNT, MIN, MAX, or SUM over integers or DECIMALs (CAST(x AS DECIMAL(18, 4)))")


def union(node: exp.Expr) -> None:
    """UNION: each column of one type in every branch (DuckDB and Spark combine a mixed column
    differently: a DOUBLE unioned with a VARCHAR is the text '1e+20' on DuckDB, an error on Spark)."""
    branches = [b for b in (node.this, node.expression) if isinstance(b, exp.Select)]
    if len(branches) != 2 or len(branches[0].expressions) != len(branches[1].expressions):
        refuse(node, "dpsql compares only the columns of two plain SELECTs in a UNION", "union two SELECTs")
    for left, right in zip(branches[0].expressions, branches[1].expressions):
        names = known(node, left, right)
        if names[0] != names[1] and '"NULL"' not in names:
            refuse(node, f"a column is a {names[0]} in one branch and a {names[1]} in the other, which DuckDB and "
                   "Spark convert differently", "cast both branches' columns to one type")
