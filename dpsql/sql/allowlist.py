"""Allow-lists: which SQL constructs may touch private rows, and which may post-process.

An allow-list, not a deny-list (DESIGN.md, check): a construct is accepted only if its
sqlglot node class (or, for functions sqlglot leaves anonymous, its name) is listed here.
Row-level constructs are deterministic, cost linear in the row (no ``repeat``, ``range``,
regular expressions or list builders an analyst could blow up for one person's rows —
invariant 12), and total once wrapped in DuckDB's TRY.

Cost bounds (invariant 12). An analyst can make DuckDB evaluate an expression for one
person's rows only (``CASE WHEN user_id = 42 THEN ... END``), so what one row can cost must
not grow faster than the query text does. Each row-level expression is therefore limited to
``MAX_DEPTH`` levels of nesting and ``MAX_OPERATIONS`` operations (literals are free); string
concatenation, the one allow-listed operation whose output grows with its input, to
``MAX_CONCATENATIONS`` per expression (a chain of c concatenations copies its first value c
times: 16 of them over 4 kB values took 2.5 s per 10,000 rows, 4 took 0.1 s); the pattern
of ``LIKE`` / ``ILIKE`` and the needle of ``contains``, ``prefix``, ``suffix``, ``starts_with``,
``ends_with`` and ``trim`` must be string literals of at most ``MAX_PATTERN`` characters
(DuckDB matches them in time up to |value| x |pattern|: a 50,000-character pattern built from
a column took 8 s on one 100 kB value); casts only to scalar types (a fixed-size
``INT[100000]`` array would allocate that much for every row). Post-processing expressions
get the same depth bound, which also keeps the generated SQL within DuckDB's expression
depth limit and Python's recursion limit.

These bounds make a row's cost at most a constant times (query size x row size); they do not
make it constant. dpsql evaluates row-level expressions on every row a unit has, before
contribution bounding, so one unit with very many long rows can still be timed:
``benchmarks/RESULTS.md`` (Adversarial) measures it and ``docs/THREAT_MODEL.md`` says what
remains.
"""

from __future__ import annotations

from typing import NoReturn

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.sql.parse import describe


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
    "StartsWith", "EndsWith", "Left", "Right", "Tuple", "Clamp", "Dayname", "Monthname",
    "TimeToStr", "DateDiff", "DateAdd", "DateSub", "LastDay", "DateFromParts", "StructExtract",
    "Bracket", "ArrayContains", "ArraySize", "ArrayMin", "ArrayMax", "ArrayPosition",
    "Hour", "Minute", "Second", "Contains",
)
"""Row-level constructs: deterministic, total once wrapped in TRY, cost linear in the row."""

ROW_LEVEL_FUNCTIONS = frozenset({
    "date_part", "datepart", "dayname", "monthname", "isodow", "yearweek", "week", "hour",
    "minute", "second", "isnan", "isinf", "isfinite", "strlen", "contains", "prefix", "suffix",
    "clamp", "list_extract", "array_extract", "element_at", "map_extract", "map_contains", "list_position",
    "list_sum", "list_count", "list_avg", "cardinality",
})
"""DuckDB functions sqlglot leaves anonymous that are safe on private rows (``clamp`` is
dpsql's own: ``CLAMP(x, lo, hi)`` states bounds in SQL, see ``dpsql.analysis.ranges``). The LIST and MAP
functions read values the bounded copy has already cut to MAX LIST LENGTH elements
(``dpsql.backends.bounding.shortened``), so each costs at most that many elements' work per row."""

POST_NODES = ROW_LEVEL_NODES + _classes(
    "Alias", "Sqrt", "Ln", "Log", "Exp", "Pow", "Pi", "Div", "Ordered",
)
"""Constructs allowed over released values (post-processing): row-level ones plus math."""

POST_FUNCTIONS = ROW_LEVEL_FUNCTIONS | {"log2", "log10", "cbrt", "trunc", "even"}

PUBLIC_NODES = ROW_LEVEL_NODES + _classes(
    "Select", "From", "Where", "Group", "Having", "Order", "Ordered", "Limit", "Offset", "Table",
    "TableAlias", "Alias", "Star", "Join", "Subquery", "Union", "Distinct", "AggFunc", "Window", "Filter",
)
"""Constructs a query over public tables only may use: exact, free, and still walled off from
files, settings and catalogs (functions sqlglot leaves anonymous: ``POST_FUNCTIONS`` only)."""

MAX_DEPTH = 64
"""Most levels of nesting in one expression (DuckDB's own limit on generated SQL is 1000)."""
MAX_OPERATIONS = 500
"""Most operations (nodes other than literals) in one row-level expression."""
MAX_CONCATENATIONS = 4
"""Most string concatenations (``||``, each extra ``CONCAT`` argument) in one row-level expression."""
MAX_PATTERN = 64
"""Longest ``LIKE`` / ``ILIKE`` pattern or string-search needle, in characters."""

NEEDLE_FUNCTIONS = frozenset({"contains", "prefix", "suffix"})
"""Anonymous string-search functions whose second argument is searched for in the first."""

SCALAR_TYPES = frozenset(
    exp.DataType.TEXT_TYPES | exp.DataType.NUMERIC_TYPES | exp.DataType.TEMPORAL_TYPES
    | {exp.DataType.Type.BOOLEAN, exp.DataType.Type.INTERVAL, exp.DataType.Type.UUID}
)
"""Types a row-level cast may produce: one bounded-size value per row."""


def refuse(node: exp.Expr, message: str, hint: str) -> NoReturn:
    """Raise an ``UnsupportedQuery`` at ``node``. Its line and column are found once, where the
    SQL text is known (``dpsql.sql.parse.located``)."""
    raise UnsupportedQuery(message, construct=describe(node), hint=hint, node=node)


def check_row_level(node: exp.Expr, where: str = "a row-level expression") -> None:
    """Refuse anything in a row-level expression that is not on the allow-list, or that could
    cost more per row than the cost bounds allow (module docstring). The refusal carries the
    node; its position is found at the boundary (``dpsql.sql.parse.located``), so called
    directly, as here, it has none (``line`` is ``None``).

    >>> import sqlglot
    >>> check_row_level(sqlglot.parse_one("zip LIKE '9%' AND age > 30"), where="WHERE")
    >>> try:
    ...     check_row_level(sqlglot.parse_one("zip LIKE store"), where="WHERE")
    ... except UnsupportedQuery as refused:
    ...     refused.message, refused.line, refused.node.sql()
    ('the pattern of LIKE must be a string literal, not an expression over the data', None, 'zip LIKE store')
    """
    _check_depth(node, where)
    _check(node, where, ROW_LEVEL_NODES, ROW_LEVEL_FUNCTIONS, "on private rows")
    _check_cost(node, where)


def check_public(node: exp.Expr, *, deterministic: bool = False) -> None:
    """Refuse anything in a query over public tables that is not on the public allow-list.

    ``deterministic``: also refuse window functions, whose rows depend on evaluation order — for
    public subqueries joined to private data, which must mean one thing (DESIGN.md invariant 15).
    """
    for sub in node.walk():
        if isinstance(sub, exp.Anonymous):
            if sub.name.lower() not in POST_FUNCTIONS:
                refuse(sub, f"function {sub.name} is not allowed", "use standard SQL functions")
        elif deterministic and isinstance(sub, exp.Window):
            refuse(sub, "window functions are not supported in a public subquery joined to private data",
                   "join the public table itself, or aggregate it with GROUP BY")
        elif not isinstance(sub, PUBLIC_NODES):
            refuse(sub, f"{describe(sub)} is not allowed here", "query declared tables with SELECT")


def check_post(node: exp.Expr, where: str = "post-processing") -> None:
    """Refuse anything in a post-processing expression that is not on the allow-list."""
    _check_depth(node, where)
    _check(node, where, POST_NODES, POST_FUNCTIONS, "on released values")


def _check_depth(node: exp.Expr, where: str) -> None:
    depth = {id(node): 1}
    for sub in node.walk():  # breadth first: every parent is seen before its children
        level = depth.get(id(sub.parent), 0) + 1 if sub is not node else 1
        depth[id(sub)] = level
        if level > MAX_DEPTH:
            refuse(sub, f"the expression in {where} is nested more than {MAX_DEPTH} levels deep",
                   "write a flatter expression: IN (...) for long OR chains, CASE for nested IFs")


def _check_cost(node: exp.Expr, where: str) -> None:
    operations = concatenations = 0
    for sub in node.walk():
        if not isinstance(sub, (exp.Literal, exp.Identifier)):
            operations += 1
        if isinstance(sub, exp.DPipe):
            concatenations += 1
        elif isinstance(sub, exp.Concat):
            concatenations += max(len(sub.expressions) - 1, 0)
        if operations > MAX_OPERATIONS:
            refuse(node, f"the expression in {where} has more than {MAX_OPERATIONS} operations",
                   "split the question into simpler queries")
        if concatenations > MAX_CONCATENATIONS:
            refuse(sub, f"the expression in {where} concatenates strings more than "
                   f"{MAX_CONCATENATIONS} times", "concatenate fewer values")
        pattern = _pattern_of(sub)
        if pattern is not None:
            name = describe(sub).replace("(...)", "")
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                refuse(sub, f"the pattern of {name} must be a string literal, not an expression over the "
                       "data", "write a constant pattern such as zip LIKE '9%'")
            if len(pattern.this) > MAX_PATTERN:
                refuse(sub, f"the pattern of {name} is longer than {MAX_PATTERN} characters",
                       "use a shorter pattern")
        if isinstance(sub, exp.DataType) and sub.this not in SCALAR_TYPES:
            refuse(sub, f"a cast to {sub.sql(dialect='duckdb')} is not allowed on private rows",
                   "cast to a number, string, date, time, timestamp, boolean or interval type")


def _check(node, where, nodes, functions, place) -> None:
    for sub in node.walk():
        if isinstance(sub, exp.AggFunc):
            refuse(sub, f"aggregate {describe(sub)} cannot be used in {where}",
                   "aggregates belong in the select list, HAVING or ORDER BY")
        if isinstance(sub, exp.Window):
            refuse(sub, "window functions are not supported", "aggregate with GROUP BY instead")
        if isinstance(sub, (exp.Subquery, exp.Select)):
            refuse(sub, f"subqueries are not supported in {where}",
                   "write the condition over the table's own columns")
        if isinstance(sub, (exp.Explode, exp.Unnest)):
            refuse(sub, f"UNNEST is not supported {place}: it would multiply a unit's rows by the length "
                   "of its lists", "test the list in place: list_contains(l, x), len(l), l[1], or m['key'] for a MAP")
        if isinstance(sub, exp.Anonymous):
            if sub.name.lower() not in functions:
                refuse(sub, f"function {sub.name} is not allowed {place}",
                       "use comparisons, arithmetic, CASE, string and date functions")
            continue
        if not isinstance(sub, nodes):
            refuse(sub, f"{describe(sub)} is not allowed {place}",
                   "use comparisons, arithmetic, CASE, string and date functions")


def _pattern_of(node: exp.Expr) -> exp.Expr | None:
    """The pattern or needle a string-matching construct searches for, or None."""
    if isinstance(node, (exp.Like, exp.ILike, exp.StartsWith, exp.EndsWith, *_classes("Contains"))):
        return node.expression
    if isinstance(node, exp.Trim):
        return node.expression  # the characters to trim; None when trimming spaces
    if isinstance(node, exp.Anonymous) and node.name.lower() in NEEDLE_FUNCTIONS and len(node.expressions) == 2:
        return node.expressions[1]
    return None
