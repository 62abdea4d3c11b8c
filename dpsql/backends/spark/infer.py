"""DuckDB's result type of an analyst expression, found without DuckDB: what the Spark rendering must match.

On Spark, an expression agrees with DuckDB only if every step has the type DuckDB gives it: a
TINYINT sum overflows at 127 on DuckDB (``ti + 1`` stays TINYINT, the literal adapting to the
column) but at 2^31 on Spark (where it is an INT); a cast of a DOUBLE to INTEGER rounds half to
even, of a DECIMAL half away from zero. ``dpsql.backends.spark.render`` therefore casts each
numeric step to DuckDB's type, and ``dpsql.backends.spark.check`` refuses steps whose DuckDB
type is not known here. The rules below are DuckDB 2.0's, written down from ``typeof`` and
checked against it node by node in ``tests/test_spark_semantics.py``; ``None`` means unknown.

>>> import sqlglot
>>> tree = sqlglot.parse_one("ti + 1 > m * 2", dialect="duckdb")
>>> duckdb_type(tree.this, {"ti": "TINYINT"}), duckdb_type(tree.expression, {"m": "DECIMAL(10,2)"})
('TINYINT', 'DECIMAL(18,2)')
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping

from sqlglot import exp

from dpsql.sql.pieces import ExactInteger, IsNaN, Total

INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
"""DuckDB's signed integer types Spark also has, narrowest first."""
_RANGES = {"TINYINT": 2**7, "SMALLINT": 2**15, "INTEGER": 2**31, "BIGINT": 2**63}
_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19}
"""Decimal digits of each integer type, as DuckDB widens it to DECIMAL(d, 0)."""
_EXACT = (*INTEGERS, "HUGEINT")
"""The integer types dpsql's own exact sums combine in, narrowest first: HUGEINT is DuckDB's sum
of integers (``pieces.ExactInteger``), written for Spark as DECIMAL(38, 0). No analyst
expression of type HUGEINT is accepted on Spark (``spark_numbers``); dpsql's generated measures
(``2 * SUM(v) - (L + U) * COUNT(v)``) are typed through it."""
TYPE_META = "dp_duckdb_type"
"""Meta key under which ``annotate`` records a node's DuckDB type."""
EXTRA_ERROR = "dp_spark_extra_error"
"""Meta key under which a rewrite adds a failure of a step it inserted (``dpsql.backends.spark.render``)."""
DONE = "dp_spark"
"""Meta key marking a subtree already written for Spark (``dpsql.backends.spark.render``): its
nodes are Spark's, not DuckDB's, and keep the types recorded when they were written."""

_NAMES = {
    "TINYINT": "TINYINT", "SMALLINT": "SMALLINT", "INT": "INTEGER", "BIGINT": "BIGINT",
    "FLOAT": "FLOAT", "DOUBLE": "DOUBLE", "BOOLEAN": "BOOLEAN", "VARCHAR": "VARCHAR", "TEXT": "VARCHAR",
    "CHAR": "VARCHAR", "NCHAR": "VARCHAR", "NVARCHAR": "VARCHAR", "BPCHAR": "VARCHAR", "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP", "DATETIME": "TIMESTAMP", "TIMESTAMPNTZ": "TIMESTAMP",
    "TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE", "TIMESTAMPLTZ": "TIMESTAMP WITH TIME ZONE",
    "INTERVAL": "INTERVAL", "HUGEINT": "HUGEINT", "INT128": "HUGEINT",
}
"""sqlglot type names -> DuckDB's canonical type names (anything else is kept as sqlglot writes it)."""


def type_name(data_type: exp.DataType | str) -> str:
    """DuckDB's canonical name of a type written in a cast or in the catalog.

    >>> type_name("INT"), type_name("NUMERIC(5)"), type_name("TIMESTAMPTZ"), type_name("DECIMAL")
    ('INTEGER', 'DECIMAL(5,0)', 'TIMESTAMP WITH TIME ZONE', 'DECIMAL(18,3)')
    """
    if isinstance(data_type, str):
        written = data_type
        try:
            data_type = exp.DataType.build(written, dialect="duckdb")
        except Exception:  # a catalog type sqlglot cannot read: kept, and unknown to every rule
            return written.upper()
    kind = data_type.this
    if kind in (exp.DataType.Type.DECIMAL, exp.DataType.Type.BIGDECIMAL):
        params = [int(p.name) for p in data_type.expressions] if data_type.expressions else [18, 3]
        return f"DECIMAL({params[0]},{params[1] if len(params) > 1 else 0})"
    name = kind.value if isinstance(kind, exp.DataType.Type) else str(kind)
    return _NAMES.get(name, data_type.sql(dialect="duckdb").upper())


def decimal_shape(name: str | None) -> tuple[int, int] | None:
    """(precision, scale) of a DECIMAL type name, an integer's as DuckDB widens it, else None."""
    if name in _DIGITS:
        return _DIGITS[name], 0
    match = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", name or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def is_integer(name: str | None) -> bool:
    return name in _RANGES


def is_decimal(name: str | None) -> bool:
    return (name or "").startswith("DECIMAL(")


def is_float(name: str | None) -> bool:
    return name in ("FLOAT", "DOUBLE")


def is_number(name: str | None) -> bool:
    return is_integer(name) or is_decimal(name) or is_float(name)


def is_temporal(name: str | None) -> bool:
    return name in ("DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE")


def integer_literal(node: exp.Expr) -> int | None:
    """The value of an integer literal (``-3`` is a negated literal to sqlglot), else None."""
    sign = 1
    while isinstance(node, (exp.Neg, exp.Paren)):
        sign = -sign if isinstance(node, exp.Neg) else sign
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string and re.fullmatch(r"-?\d+", node.this):
        return sign * int(node.this)
    return None


def day_interval(node: exp.Expr | None) -> int | None:
    """The days of ``INTERVAL n DAY`` (n a whole number of at most 7 digits), else None.

    >>> import sqlglot
    >>> day_interval(sqlglot.parse_one("INTERVAL 30 DAY", dialect="duckdb")), day_interval(
    ...     sqlglot.parse_one("INTERVAL 1 MONTH", dialect="duckdb"))
    (30, None)
    """
    if not isinstance(node, exp.Interval) or node.unit is None or node.unit.name.upper() not in ("DAY", "DAYS"):
        return None
    text = node.this.name if isinstance(node.this, exp.Literal) else ""
    return int(text) if re.fullmatch(r"-?\d{1,7}", text) else None


def fits(value: int, name: str) -> bool:
    return name in _RANGES and -_RANGES[name] <= value < _RANGES[name]


def column_type(column: exp.Column, types: Mapping[str, str]) -> str | None:
    """A column's type from ``types`` (lower-cased ``table.column`` or ``column`` -> DuckDB type)."""
    name = column.name.lower()
    found = types.get(f"{column.table.lower()}.{name}") if column.table else None
    found = found if found is not None else types.get(name)
    return None if found is None else type_name(found)


DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
TIMESTAMP_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?")
"""A date, and a timestamp, in ISO form: the one spelling DuckDB and Spark read alike."""

COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Between, exp.In)


def iso_literal(node: exp.Expr, target: str) -> bool:
    """A string literal holding a valid ISO date (for a DATE) or timestamp (for a TIMESTAMP),
    which DuckDB and Spark read alike (Spark reads more spellings, DuckDB refuses them)."""
    if not isinstance(node, exp.Literal) or not node.is_string or target not in ("DATE", "TIMESTAMP"):
        return False
    if not (DATE_TEXT if target == "DATE" else TIMESTAMP_TEXT).fullmatch(node.this):
        return False
    try:
        datetime.datetime.fromisoformat(node.this)
    except ValueError:
        return False
    return True


def read_dates(node: exp.Expr) -> None:
    """A comparison of DATEs with string literals (``day BETWEEN '2025-12-01' AND '2025-12-31'``):
    DuckDB reads each literal as a DATE (an invalid one is an error), Spark compares as text. When
    every operand is a DATE or a valid ISO date literal, each literal becomes CAST('...' AS DATE),
    which both engines read alike; anything else is left to be refused as a DATE against a VARCHAR."""
    if not isinstance(node, COMPARED) or node.args.get("query") is not None:
        return
    operands = [o for o in (node.this, node.args.get("expression"), node.args.get("low"), node.args.get("high"),
                            *node.expressions) if o is not None]
    literals = [o for o in operands if iso_literal(o, "DATE")]
    if not literals or not all(typed(o) == "DATE" or iso_literal(o, "DATE") for o in operands):
        return
    for literal in literals:
        cast = exp.Cast(to=exp.DataType.build("DATE"))
        literal.replace(cast)
        cast.set("this", literal)
        cast.meta[TYPE_META] = "DATE"


def subquery_type(node: exp.Subquery) -> str | None:
    """A scalar subquery compared (``size > (SELECT MAX(size) FROM stores)``) has its one select
    item's type, as on DuckDB. Elsewhere, and as a DATE (which a TIMESTAMP met casts), it is left
    unknown: Spark's rewrites may bind it in a lambda, and Spark refuses subqueries in one."""
    items = node.this.expressions if isinstance(node.this, exp.Select) else []
    found = typed(items[0]) if len(items) == 1 and not isinstance(items[0], exp.Star) else None
    compared = isinstance(node.parent, COMPARED) and not isinstance(node.parent, exp.In)
    return found if compared and found != "DATE" else None


def annotate(tree: exp.Expr, types: Mapping[str, str] | None) -> None:
    """Record each node's DuckDB type in its meta (``TYPE_META``), children first; a subtree
    already written for Spark (``DONE``) keeps the types it has."""
    if tree.meta.get(DONE):
        return
    for child in tree.iter_expressions():
        annotate(child, types)
    read_dates(tree)  # DuckDB reads '2025-12-01' compared with a DATE as a DATE
    tree.meta[TYPE_META] = subquery_type(tree) if isinstance(tree, exp.Subquery) else _infer(tree, types or {})


def duckdb_type(node: exp.Expr, types: Mapping[str, str] | None = None) -> str | None:
    """DuckDB's type of ``node`` (module docstring), or None when it is not known here."""
    annotate(node, types)
    return node.meta[TYPE_META]


def typed(node: exp.Expr | None) -> str | None:
    """The type ``annotate`` recorded for ``node`` (None: unknown, or not annotated)."""
    return None if node is None else node.meta.get(TYPE_META)


def _literal_type(node: exp.Literal) -> str | None:
    if node.is_string:
        return "VARCHAR"
    text = node.this.removeprefix("-")  # dpsql writes -7 as one literal; DuckDB types it as it types 7
    if re.fullmatch(r"\d+", text):
        value = int(text)
        return next((name for name in ("INTEGER", "BIGINT") if fits(value, name)), "HUGEINT")
    match = re.fullmatch(r"(\d*)\.(\d*)", text)
    if match and len(match.group(1) + match.group(2)) <= 38:
        digits = len(match.group(1) + match.group(2))
        return f"DECIMAL({max(digits, 1)},{len(match.group(2))})"
    return "DOUBLE" if re.fullmatch(r"(\d+\.?\d*|\.\d+)[eE][+-]?\d+", text) else None


def combined(operands: list[exp.Expr]) -> str | None:
    """DuckDB's common type of values combined by arithmetic, comparison, CASE, COALESCE, LEAST:
    an integer literal takes the other integers' type when it fits; DECIMALs keep every
    integer digit and the largest scale; a DOUBLE wins, then a FLOAT; a DATE meeting a
    TIMESTAMP becomes a TIMESTAMP; NULL takes any type."""
    typed_operands = [(o, typed(o)) for o in operands if typed(o) != '"NULL"']
    if not typed_operands:
        return '"NULL"'
    if any(t is None for _, t in typed_operands):
        return None
    names: list[str] = [t for _, t in typed_operands if t is not None]
    if all(t in _EXACT for t in names):
        fixed = [t for o, t in typed_operands if integer_literal(o) is None and t is not None]
        if not fixed:
            return _widest(names)
        widest = _widest(fixed)
        literals = [integer_literal(o) for o, _ in typed_operands if integer_literal(o) is not None]
        return widest if all(fits(v, widest) for v in literals if v is not None) else _widest(names)
    if all(is_number(t) for t in names):
        if "DOUBLE" in names:
            return "DOUBLE"
        if "FLOAT" in names:
            return "FLOAT"
        shapes = [decimal_shape(t) for t in names]
        whole = max(p - s for p, s in shapes if True)  # type: ignore[misc]
        scale = max(s for _, s in shapes)  # type: ignore[misc]
        return f"DECIMAL({min(whole + scale, 38)},{scale})"
    if all(is_temporal(t) for t in names):
        if "TIMESTAMP WITH TIME ZONE" in names:
            return "TIMESTAMP WITH TIME ZONE"
        return "TIMESTAMP" if "TIMESTAMP" in names else "DATE"
    return names[0] if len(set(names)) == 1 else None


def _widest(names: list[str]) -> str:
    return max(names, key=_EXACT.index)


def arithmetic(node: exp.Expr) -> str | None:
    """DuckDB's type of ``+``, ``-``, ``*``, ``%`` or ``//`` of two numbers (None: not numbers)."""
    left, right = node.this, node.expression
    common = combined([left, right])
    if common == "HUGEINT":
        return common  # DuckDB keeps exact integer arithmetic in HUGEINT (dpsql's own measures)
    if not is_number(common) or common == '"NULL"':
        return None
    if not is_decimal(common):
        return common
    if isinstance(node, (exp.Mod, exp.IntDiv)):
        return None  # DECIMAL % and // are refused on Spark; no rule written
    (p1, s1), (p2, s2) = decimal_shape(typed(left)), decimal_shape(typed(right))  # type: ignore[misc]
    if isinstance(node, exp.Mul):
        precision = p1 + p2
        if precision > 18 and max(p1, p2) <= 18:
            precision = 18
        return f"DECIMAL({min(precision, 38)},{s1 + s2})"
    return f"DECIMAL({min(max(p1 - s1, p2 - s2) + max(s1, s2) + 1, 38)},{max(s1, s2)})"


def uncapped_sum_precision(node: exp.Expr) -> int:
    """The precision of a DECIMAL ``+`` or ``-`` before DuckDB caps it at 38."""
    (p1, s1), (p2, s2) = decimal_shape(typed(node.this)), decimal_shape(typed(node.expression))  # type: ignore[misc]
    return max(p1 - s1, p2 - s2) + max(s1, s2) + 1


_BOOLEAN = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is,
            exp.In, exp.Between, exp.Like, exp.ILike, exp.Not, exp.And, exp.Or, exp.StartsWith,
            exp.EndsWith, exp.Boolean, exp.Contains)
_BIGINT = (exp.Year, exp.Month, exp.Day, exp.Quarter, exp.DayOfWeek, exp.DayOfWeekIso, exp.DayOfMonth,
           exp.DayOfYear, exp.WeekOfYear, exp.Extract, exp.Length, exp.DateDiff, exp.Hour, exp.Minute,
           exp.Second, exp.Week)
_STRING = (exp.Lower, exp.Upper, exp.Substring, exp.Trim, exp.DPipe, exp.Concat, exp.Left, exp.Right,
           exp.Dayname, exp.Monthname, exp.TimeToStr)
_ANONYMOUS = {
    "isnan": "BOOLEAN", "isinf": "BOOLEAN", "isfinite": "BOOLEAN", "contains": "BOOLEAN", "prefix": "BOOLEAN",
    "suffix": "BOOLEAN", "strlen": "BIGINT", "date_part": "BIGINT", "datepart": "BIGINT", "isodow": "BIGINT",
    "yearweek": "BIGINT", "week": "BIGINT", "hour": "BIGINT", "minute": "BIGINT", "second": "BIGINT",
    "dayname": "VARCHAR", "monthname": "VARCHAR",
}


def _infer(node: exp.Expr, types: Mapping[str, str]) -> str | None:
    if isinstance(node, Total):
        return typed(node.this)  # DuckDB's TRY keeps its argument's type
    if isinstance(node, ExactInteger):
        return "HUGEINT"
    if isinstance(node, IsNaN):
        return "BOOLEAN"
    if isinstance(node, exp.Column):
        return column_type(node, types)
    if isinstance(node, exp.Literal):
        return _literal_type(node)
    if isinstance(node, exp.Null):
        return '"NULL"'
    if isinstance(node, exp.Interval):
        return "INTERVAL"
    if isinstance(node, _BOOLEAN):
        return "BOOLEAN"
    if isinstance(node, (exp.Paren, exp.Neg, exp.Abs, exp.Ordered, exp.Alias)):
        return typed(node.this)
    if isinstance(node, (exp.Cast, exp.TryCast)):
        return type_name(node.to)
    if isinstance(node, (exp.Add, exp.Sub)):
        left, right = typed(node.this), typed(node.expression)
        if left == "DATE" and is_integer(right) and right != "BIGINT":
            return "DATE"
        if isinstance(node, exp.Add) and right == "DATE" and is_integer(left) and left != "BIGINT":
            return "DATE"
        if isinstance(node, exp.Sub) and left == right == "DATE":
            return "BIGINT"
        if (left, right) == ("DATE", "INTERVAL") or isinstance(node, exp.Add) and (left, right) == ("INTERVAL", "DATE"):
            return "TIMESTAMP"  # DuckDB: a DATE plus an INTERVAL is a TIMESTAMP (Spark: only whole days)
        return arithmetic(node)
    if isinstance(node, (exp.Mul, exp.Mod, exp.IntDiv)):
        return arithmetic(node)
    if isinstance(node, exp.Div):
        common = combined([node.this, node.expression])
        return ("FLOAT" if common == "FLOAT" else "DOUBLE") if is_number(common) else None
    if isinstance(node, (exp.Coalesce, exp.Least, exp.Greatest)):
        return combined([node.this, *node.expressions])
    if isinstance(node, exp.Case):
        return combined([i.args["true"] for i in node.args.get("ifs") or []]
                        + ([node.args["default"]] if node.args.get("default") else []))
    if isinstance(node, exp.If):
        return combined([node.args["true"]] + ([node.args["false"]] if node.args.get("false") else []))
    if isinstance(node, exp.Nullif):
        return typed(node.this)
    if isinstance(node, exp.Sign):
        return "TINYINT" if is_number(typed(node.this)) else None
    if isinstance(node, (exp.Floor, exp.Ceil)):
        return _rounded(node, 0 if node.args.get("decimals") is None else None)
    if isinstance(node, exp.Round):
        digits = integer_literal(node.args["decimals"]) if node.args.get("decimals") is not None else 0
        return _rounded(node, digits)
    if isinstance(node, _BIGINT):
        return "BIGINT"
    if isinstance(node, exp.DPipe) and '"NULL"' in (typed(node.this), typed(node.expression)):
        return '"NULL"'
    if isinstance(node, _STRING):
        return "VARCHAR"
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        source = typed(node.this)
        return source if source == "TIMESTAMP WITH TIME ZONE" else "TIMESTAMP" if is_temporal(source) else None
    if isinstance(node, exp.LastDay):
        return "DATE"
    if isinstance(node, exp.Anonymous) and node.name.lower() in ("least", "greatest"):
        return combined(node.expressions)  # dpsql's own clamps are written as plain calls
    if isinstance(node, exp.Anonymous):
        return _ANONYMOUS.get(node.name.lower())
    if type(node).__name__ in ("IsNan", "IsInf"):
        return "BOOLEAN"
    if isinstance(node, exp.Sqrt):
        return "DOUBLE"
    if isinstance(node, (exp.Count, exp.RowNumber)):
        return "BIGINT"
    if isinstance(node, exp.Window):
        return typed(node.this)  # a window aggregate has its aggregate's type
    if isinstance(node, (exp.Min, exp.Max)):
        return typed(node.this)
    if isinstance(node, exp.Avg) and is_integer(typed(node.this)):
        return "DOUBLE"
    if isinstance(node, exp.Sum):
        # SUM(v ORDER BY v): dpsql's per-unit float sum, in a fixed order (``spark.pieces._ordered_sum``)
        source = typed(node.this.this if isinstance(node.this, exp.Order) else node.this)
        shape = decimal_shape(source)
        if is_integer(source) or source == "HUGEINT":
            return "HUGEINT"
        if is_float(source):
            return "DOUBLE"
        return f"DECIMAL(38,{shape[1]})" if shape and is_decimal(source) else None
    return None


def _rounded(node: exp.Expr, digits: int | None) -> str | None:
    """ROUND, FLOOR and CEIL: an integer stays itself under ROUND and becomes a DOUBLE under
    FLOOR and CEIL; a DECIMAL keeps its precision and at most ``digits`` of its scale."""
    source = typed(node.this)
    if is_integer(source):
        return source if isinstance(node, exp.Round) else "DOUBLE"
    if is_float(source):
        return source
    shape = decimal_shape(source) if is_decimal(source) else None
    if shape is None or digits is None:
        return None
    return f"DECIMAL({shape[0]},{max(min(digits, shape[1]), 0)})"
