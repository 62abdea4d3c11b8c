"""Allow-lists: which SQL constructs may touch private rows, and which may post-process.

An allow-list, not a deny-list (DESIGN.md, check): a construct is accepted only if its
sqlglot node class (or, for functions sqlglot leaves anonymous, its name) is listed here.
Row-level constructs are deterministic, cost linear in the row (no ``repeat``, ``range``,
regular expressions or list builders an analyst could blow up for one person's rows —
invariant 12), and total once wrapped in DuckDB's TRY.
"""

from __future__ import annotations

from sqlglot import exp

from .errors import UnsupportedQuery
from .parse import describe, node_position


def _classes(*names: str) -> tuple[type, ...]:
    return tuple(getattr(exp, name) for name in names if hasattr(exp, name))


ROW_LEVEL_NODES = _classes(
    "Column", "Identifier", "Literal", "Null", "Boolean", "Paren", "Neg", "Not", "And", "Or",
    "EQ", "NEQ", "NullSafeEQ", "NullSafeNEQ", "GT", "GTE", "LT", "LTE", "Is", "In", "Between",
    "Like", "ILike", "Add", "Sub", "Mul", "Div", "IntDiv", "Mod", "Case", "If", "Coalesce",
    "Least", "Greatest", "Abs", "Round", "Floor", "Ceil", "Sign", "Cast", "TryCast", "DataType",
    "DataTypeParam", "Extract", "Var", "Year", "Month", "Day", "Quarter", "DayOfWeek",
    "DayOfWeekIso", "DayOfMonth", "DayOfYear", "WeekOfYear", "TimestampTrunc", "DateTrunc",
    "Lower", "Upper", "Length", "Substring", "Trim", "DPipe", "Concat", "Interval", "Nullif",
    "StartsWith", "EndsWith", "Left", "Right", "Tuple", "Clamp",
)
"""Row-level constructs: deterministic, total once wrapped in TRY, cost linear in the row."""

ROW_LEVEL_FUNCTIONS = frozenset({
    "date_part", "datepart", "dayname", "monthname", "isodow", "yearweek", "week", "hour",
    "minute", "second", "isnan", "isinf", "isfinite", "strlen", "contains", "prefix", "suffix",
    "clamp",
})
"""DuckDB functions sqlglot leaves anonymous that are safe on private rows (``clamp`` is
dpsql's own: ``CLAMP(x, lo, hi)`` states bounds in SQL, see ``dpsql.ranges``)."""

POST_NODES = ROW_LEVEL_NODES + _classes(
    "Alias", "Sqrt", "Ln", "Log", "Exp", "Pow", "Pi", "Div", "Ordered",
)
"""Constructs allowed over released values (post-processing): row-level ones plus math."""

POST_FUNCTIONS = ROW_LEVEL_FUNCTIONS | {"log2", "log10", "cbrt", "trunc", "even"}


def refuse(node: exp.Expression, sql: str, message: str, hint: str) -> None:
    """Raise an ``UnsupportedQuery`` located at ``node``."""
    line, col = node_position(node, sql)
    raise UnsupportedQuery(message, line=line, col=col, construct=describe(node), hint=hint)


def check_row_level(node: exp.Expression, sql: str, where: str) -> None:
    """Refuse anything in a row-level expression that is not on the allow-list."""
    _check(node, sql, where, ROW_LEVEL_NODES, ROW_LEVEL_FUNCTIONS, "on private rows")


def check_post(node: exp.Expression, sql: str, where: str) -> None:
    """Refuse anything in a post-processing expression that is not on the allow-list."""
    _check(node, sql, where, POST_NODES, POST_FUNCTIONS, "on released values")


def _check(node, sql, where, nodes, functions, place) -> None:
    for sub in node.walk():
        if isinstance(sub, exp.AggFunc):
            refuse(sub, sql, f"aggregate {describe(sub)} cannot be used in {where}",
                   "aggregates belong in the select list, HAVING or ORDER BY")
        if isinstance(sub, exp.Window):
            refuse(sub, sql, "window functions are not supported", "aggregate with GROUP BY instead")
        if isinstance(sub, (exp.Subquery, exp.Select)):
            refuse(sub, sql, f"subqueries are not supported in {where}",
                   "write the condition over the table's own columns")
        if isinstance(sub, exp.Anonymous):
            if sub.name.lower() not in functions:
                refuse(sub, sql, f"function {sub.name} is not allowed {place}",
                       "use comparisons, arithmetic, CASE, string and date functions")
            continue
        if not isinstance(sub, nodes):
            refuse(sub, sql, f"{describe(sub)} is not allowed {place}",
                   "use comparisons, arithmetic, CASE, string and date functions")
