"""Rules of the Spark allow-list for numbers: literals, comparisons, arithmetic, rounding and casts.

Each rule takes a node annotated with DuckDB types (``dpsql.backends.spark.infer.annotate``) and
refuses it when its Spark rendering (``dpsql.backends.spark.render.agree``) cannot give what
DuckDB gives; ``dpsql.backends.spark.check`` dispatches to them. Every refusal names the
difference measured on pyspark 4.3 against DuckDB 2.0 (``tests/test_spark_semantics.py`` pins
each one), so an analyst knows what Spark would have answered and what to write instead.
"""

from __future__ import annotations

import datetime
from typing import NoReturn

from sqlglot import exp

from dpsql.backends.spark import infer as infer
from dpsql.backends.spark.infer import (
    DATE_TEXT,
    TIMESTAMP_TEXT,
    decimal_shape,
    integer_literal,
    is_decimal,
    is_integer,
    is_number,
    iso_literal,
    typed,
)
from dpsql.errors import UnsupportedQuery
from dpsql.sql.parse import describe

INT_MAX = 2**31 - 1


def refuse(node: exp.Expr, reason: str, hint: str) -> NoReturn:
    raise UnsupportedQuery(f"{describe(node)} is not supported on Spark: {reason}", construct=describe(node),
                           hint=hint, node=node)


def not_listed(node: exp.Expr) -> None:
    refuse(node, "dpsql has not checked that Spark evaluates it as DuckDB does",
           "use comparisons, arithmetic, CASE, COALESCE, and the string and date functions dpsql lists for Spark")


def differs(reason: str, hint: str):
    """A rule refusing every use of a construct, for the measured ``reason``."""
    def rule(node: exp.Expr) -> None:
        refuse(node, reason, hint)
    return rule


def known(node: exp.Expr, *operands: exp.Expr | None) -> list[str]:
    names = [typed(o) for o in operands if o is not None]
    if any(name is None for name in names):
        unknown = next(o for o in operands if o is not None and typed(o) is None)
        refuse(node, f"dpsql cannot tell the type of {unknown.sql(dialect='duckdb')}, and Spark's result depends on it",
               "cast it to the type you mean, such as CAST(x AS BIGINT)")
    return names  # type: ignore[return-value]


# -- literals and comparisons ------------------------------------------------------------------

def literal(node: exp.Expr) -> None:
    if node.is_string:
        return
    if typed(node) is None or typed(node) == "HUGEINT":
        refuse(node, "Spark reads this number with another type than DuckDB",
               "write integers within BIGINT's range and decimals of at most 38 digits")


def compared(node: exp.Expr, operands: list[exp.Expr]) -> None:
    """Values compared (=, <, IN, BETWEEN, NULLIF, LEAST, CASE results ...) must have a common type
    both engines compare in: numbers with numbers, strings with strings, dates and timestamps
    together, or a date or timestamp with a string literal in ISO form (DuckDB reads it as a
    date; Spark would accept more spellings, so only ISO ones are taken)."""
    names = known(node, *operands)
    temporal = [n for n in names if infer.is_temporal(n)]
    for operand, name in zip(operands, names):
        if name == "VARCHAR" and temporal and isinstance(operand, exp.Literal):
            pattern = DATE_TEXT if set(temporal) == {"DATE"} else TIMESTAMP_TEXT
            if not pattern.fullmatch(operand.this) or not _valid_date(operand.this[:10]):
                refuse(node, f"DuckDB and Spark read the text {operand.sql()} as a date differently "
                       "(Spark takes '2020' for 2020-01-01, DuckDB refuses it)",
                       "write the date in ISO form, such as DATE '2024-01-31'")
            return _check_others(node, [n for n, o in zip(names, operands) if o is not operand])
    _check_others(node, names)


def _check_others(node: exp.Expr, names: list[str]) -> None:
    kinds = {_family(n) for n in names if n != '"NULL"'}
    binary = isinstance(node, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between))
    if not binary and "DATE" in names and {"TIMESTAMP", "TIMESTAMP WITH TIME ZONE"} & set(names):
        refuse(node, "it mixes DATEs with TIMESTAMPs, and a DATE past the TIMESTAMP range makes DuckDB's TRY give "
               "NULL where Spark's implicit cast raises", "cast the DATE: CAST(d AS TIMESTAMP)")
    if len(kinds) > 1:
        refuse(node, f"it compares or combines values of types {', '.join(sorted(set(names)))}, which Spark "
               "converts differently ('1e3' is 1000 on DuckDB and an error on Spark)",
               "cast both sides to one type, such as CAST(x AS BIGINT) = 1000")
    shapes = [decimal_shape(n) for n in names if is_decimal(n) or is_integer(n)]
    if any(is_decimal(n) for n in names) and shapes:
        if max(p - s for p, s in shapes) + max(s for _, s in shapes) > 38:  # type: ignore[misc]
            refuse(node, "the values' common DECIMAL type needs more than 38 digits: DuckDB casts both values to "
                   "DECIMAL(38, s) and fails where one does not fit (its TRY gives NULL), Spark compares them exactly",
                   "cast the values to DOUBLE or to one DECIMAL type")
    if kinds & {"list", "other"}:
        refuse(node, f"values of type {names[0]} are not compared on Spark", "compare numbers, strings or dates")


def _family(name: str) -> str:
    if is_number(name):
        return "number"
    if infer.is_temporal(name):
        return "date"
    if name in ("VARCHAR", "BOOLEAN"):
        return name
    return "list" if name.endswith("]") else "other"


def _valid_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def binary(node: exp.Expr) -> None:
    compared(node, [node.this, node.expression])


def is_(node: exp.Expr) -> None:
    if not isinstance(node.expression, (exp.Null, exp.Boolean)):
        binary(node)


def between(node: exp.Expr) -> None:
    compared(node, [node.this, node.args["low"], node.args["high"]])


def in_(node: exp.Expr) -> None:
    if node.args.get("query") is not None or node.args.get("unnest") is not None:
        refuse(node, "dpsql cannot tell the type of a subquery's values, and Spark coerces them its own way",
               "join the public table instead")
    compared(node, [node.this, *node.expressions])


def combining(node: exp.Expr) -> None:
    """CASE, IF, COALESCE, LEAST, GREATEST, NULLIF: one result type for every branch."""
    if isinstance(node, exp.Case):
        values = [i.args["true"] for i in node.args.get("ifs") or []] + [node.args.get("default")]
        if node.this is not None:
            compared(node, [node.this, *[i.this for i in node.args.get("ifs") or []]])
    elif isinstance(node, exp.If):
        if isinstance(node.parent, exp.Case):
            return  # a WHEN branch: checked with its CASE
        values = [node.args.get("true"), node.args.get("false")]
    else:
        values = [node.this, *node.expressions]
    compared(node, [v for v in values if v is not None])


# -- arithmetic ---------------------------------------------------------------------------------

_SPARK_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 20}
"""Digits Spark gives an integer type when it meets a DECIMAL (BIGINT: 20, DuckDB's 19)."""


def _spark_shape(operand: exp.Expr) -> tuple[int, int]:
    value = integer_literal(operand)
    if value is not None:
        return max(len(str(abs(value))), 1), 0
    name = str(typed(operand))
    return (_SPARK_DIGITS[name], 0) if is_integer(name) else decimal_shape(name)  # type: ignore[return-value]


INTERVALS = ("DuckDB and Spark add intervals differently (DATE '2024-01-31' + INTERVAL 1 MONTH is the TIMESTAMP "
             "2024-02-29 00:00 on DuckDB and the DATE 2024-02-29 on Spark)")


def interval(node: exp.Expr) -> None:
    """An INTERVAL only as whole days added to or subtracted from a DATE (written as DuckDB
    means it by ``spark_rewrites.arithmetic``); every other interval adds differently."""
    parent = node.parent
    if not (infer.day_interval(node) is not None and isinstance(parent, (exp.Add, exp.Sub))
            and typed(parent) == "TIMESTAMP"):
        refuse(node, INTERVALS, "add whole days to a date (d - INTERVAL 30 DAY, or d - 30 for a DATE), "
               "or compare date parts")


def arithmetic(node: exp.Expr) -> None:
    left, right = known(node, node.this, node.expression)
    if typed(node) == "TIMESTAMP" and "DATE" in (left, right):
        return  # a DATE plus or minus whole days of an INTERVAL (``spark_infer.day_interval``)
    if "INTERVAL" in (left, right):
        refuse(node, INTERVALS, "add days as a number (d + 7), or compare date parts")
    if "DATE" in (left, right):
        if isinstance(node, (exp.Add, exp.Sub)) and typed(node) in ("DATE", "BIGINT"):
            return
        refuse(node, "date arithmetic other than adding days or subtracting dates differs on Spark",
               "add a number of days (d + 7) or subtract two dates (d1 - d2)")
    if infer.is_temporal(left) or infer.is_temporal(right) or "INTERVAL" in (left, right):
        refuse(node, "DuckDB and Spark give timestamp and interval arithmetic different types and values",
               "compare timestamps, or use date_diff('day', a, b) and date_trunc")
    if typed(node) in (None, "HUGEINT"):  # Spark has no HUGEINT (dpsql's own exact sums are typed so)
        refuse(node, f"dpsql does not combine {left} and {right} with {_operator(node)} on Spark",
               "cast the operands to BIGINT, DECIMAL or DOUBLE first")
    if is_decimal(typed(node)):
        _decimal(node)
    if isinstance(node, exp.IntDiv) and not is_integer(typed(node)):
        refuse(node, "// of non-integers is plain division on DuckDB and an error on Spark", "use / instead")


def _decimal(node: exp.Expr) -> None:
    (p1, s1), (p2, s2) = _spark_shape(node.this), _spark_shape(node.expression)
    if isinstance(node, exp.Mul):
        duck = decimal_shape(typed(node.this))[0] + decimal_shape(typed(node.expression))[0]  # type: ignore[index]
        if p1 + p2 + 1 > 38 or duck > 38:
            refuse(node, "the DECIMAL product needs more than 38 digits, where DuckDB and Spark round differently",
                   "cast the operands to smaller DECIMALs or to DOUBLE")
    elif infer.uncapped_sum_precision(node) > 38 or max(p1 - s1, p2 - s2) + max(s1, s2) + 1 > 38:
        refuse(node, "the DECIMAL result needs more than 38 digits, where DuckDB and Spark round differently",
               "cast the operands to smaller DECIMALs or to DOUBLE")


def _operator(node: exp.Expr) -> str:
    operators: dict[type, str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.IntDiv: "//",
                                  exp.Mod: "%"}
    return operators.get(type(node), "")


def numeric(node: exp.Expr) -> None:
    (name,) = known(node, node.this)
    if not is_number(name):
        refuse(node, f"it is not defined for {name} on both engines", "apply it to numbers")
    if isinstance(node, (exp.Neg, exp.Abs)) and is_decimal(name) and decimal_shape(name)[0] > 34:  # type: ignore[index]
        refuse(node, "Spark negates a DECIMAL of more than 34 digits by first rounding it to 34, and then fails "
               "(-x of the DECIMAL(38,10) 9999999999999999999999999999.9999999999 is an error on Spark)",
               "cast it to DECIMAL(34, s) or DOUBLE first")


def rounded(node: exp.Expr) -> None:
    numeric(node)
    digits = node.args.get("decimals")
    if digits is not None and integer_literal(digits) is None:
        refuse(node, "its number of digits must be an integer literal", "write ROUND(x, 2)")
    if infer.is_float(typed(node.this)) and digits is not None and integer_literal(digits) != 0:
        refuse(node, "Spark rounds the decimal text of a DOUBLE, DuckDB its binary value "
               "(ROUND(1.005, 2) on a DOUBLE is 1.01 on Spark and 1.0 on DuckDB)",
               "round a DECIMAL: ROUND(CAST(x AS DECIMAL(18, 6)), 2)")


def floored(node: exp.Expr) -> None:
    numeric(node)
    if node.args.get("decimals") is not None:
        refuse(node, "FLOOR and CEIL with digits differ on Spark", "write FLOOR(x * 100) / 100")


# -- casts --------------------------------------------------------------------------------------

SPARK_SCALARS = frozenset({"BOOLEAN", *infer.INTEGERS, "FLOAT", "DOUBLE", "VARCHAR", "DATE", "TIMESTAMP",
                           "TIMESTAMP WITH TIME ZONE"})
"""DuckDB types a cast may produce on Spark (and any DECIMAL(p, s) with p <= 38)."""

_FROM_TEXT = ("DuckDB and Spark parse text differently: '1e3' and '1.5' cast to INTEGER are 1000 and 2 on DuckDB "
              "and errors on Spark, ' true ' to BOOLEAN is an error on DuckDB and true on Spark, '2020' to DATE "
              "an error on DuckDB and 2020-01-01 on Spark, '1d' to DOUBLE an error on DuckDB and 1.0 on Spark")
_TO_TEXT = {
    "float": "DuckDB and Spark write floating-point numbers differently (1e20 is '1e+20' on DuckDB, '1.0E20' on Spark)",
    "date": "DuckDB and Spark write dates outside years 1-9999 differently (DuckDB '10000-01-01' and "
            "'0001-12-31 (BC)', Spark '+10000-01-01' and '0000-12-31')",
    "zone": "DuckDB writes a TIMESTAMP WITH TIME ZONE with its offset ('2020-01-01 10:00:00+00'), Spark without",
}


def cast(node: exp.Expr) -> None:
    """CAST and TRY_CAST: allowed between the types both engines convert alike (``agree`` rounds
    a DOUBLE cast to an integer half to even and a DECIMAL half away from zero, as DuckDB does)."""
    (source,) = known(node, node.this)
    target = typed(node)
    if target not in SPARK_SCALARS and not (is_decimal(target) and decimal_shape(target)[0] <= 38):  # type: ignore[index]
        refuse(node, f"Spark has no type {target} that holds what DuckDB's does",
               "cast to BIGINT, DECIMAL, DOUBLE, VARCHAR, DATE or TIMESTAMP")
    if source in (target, '"NULL"'):
        return
    if source == "VARCHAR" and iso_literal(node.this, str(target)):
        return  # DATE '2024-01-31': both engines read an ISO date or timestamp alike
    if source == "VARCHAR":
        refuse(node, _FROM_TEXT, "compare the text itself, or cast typed columns instead of text")
    if target == "VARCHAR":
        reason = (_TO_TEXT["float"] if infer.is_float(source) else _TO_TEXT["zone"]
                  if source == "TIMESTAMP WITH TIME ZONE" else _TO_TEXT["date"] if source == "TIMESTAMP" else None)
        if reason is not None:
            refuse(node, reason, "cast a number to DECIMAL first, or compare dates as dates")
        if is_number(source) or source in ("BOOLEAN", "DATE"):  # a DATE in DuckDB's text (``spark_casts``)
            return
    elif is_decimal(target) and infer.is_float(source):
        refuse(node, "Spark rounds the decimal text of a DOUBLE, DuckDB its binary value (1.005 cast to "
               "DECIMAL(4,2) is 1.01 on Spark and 1.00 on DuckDB)", "round the DOUBLE instead: ROUND(x * 100) / 100")
    elif is_number(target) and (is_number(source) or source == "BOOLEAN"):
        return
    elif target == "BOOLEAN" and is_number(source):
        return
    elif infer.is_temporal(target) and infer.is_temporal(source):
        return
    refuse(node, f"dpsql does not cast {source} to {target} on Spark", "cast between numbers, or between dates")
