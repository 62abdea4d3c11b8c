"""Which analyst constructs mean on Spark exactly what they mean on DuckDB: an allow-list.

dpsql's semantics are DuckDB's: a query checked by ``dpsql.analysis.check`` means what DuckDB
makes of it. On Spark it runs as re-rendered SQL (``dpsql.backends.spark.render``: sqlglot's
"spark" dialect after the ``agree`` and ``total`` rewrites); a construct is accepted here only
when that rendering gives the same value, the same NULL and the same error-or-not on every
input, as measured over a grid of values in ``tests/test_spark_semantics.py``. Anything else is
refused before anything is charged, naming the construct, where it is and what to write instead.

``RULES`` maps each sqlglot node class to ``None`` (accepted as it is, or made to agree by
``agree``) or to a rule that refuses some of its uses (``dpsql.backends.spark.numbers``,
``dpsql.backends.spark.text``); ``FUNCTIONS`` does the same for functions sqlglot leaves
anonymous. A class in neither is refused. Rules read each node's DuckDB type
(``dpsql.backends.spark.infer``), so a construct whose agreement depends on a type dpsql cannot
tell (an unknown column, a subquery's output) is refused too.

>>> import sqlglot
>>> check_spark(sqlglot.parse_one("SELECT COUNT(*) FROM t WHERE x // 2 > 1", dialect="duckdb"), {"x": "INTEGER"})
>>> query = sqlglot.parse_one("SELECT COUNT(*) FROM t WHERE upper(s) = 'A'", dialect="duckdb")
>>> try:
...     check_spark(query, {"s": "VARCHAR"})
... except UnsupportedQuery as refused:
...     print(refused.message[:61])
UPPER(...) is not supported on Spark: Spark maps some letters
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from sqlglot import exp

from dpsql.analysis.aggregates.registry import family_for_call
from dpsql.backends.spark import numbers as numbers
from dpsql.backends.spark import text as text
from dpsql.backends.spark.infer import annotate, typed
from dpsql.backends.spark.numbers import differs, not_listed
from dpsql.backends.spark.render import total
from dpsql.backends.spark.scopes import scoped_types
from dpsql.errors import UnsupportedQuery
from dpsql.sql.dialect import PerGroupBounded

__all__ = ["FUNCTIONS", "RULES", "UnsupportedQuery", "check_spark"]

_CASE = differs("Spark maps some letters differently (upper('ß') is 'SS' on Spark, 'ẞ' on DuckDB; lower('İ') "
                "is 'i̇' on Spark, 'i' on DuckDB; 'İ' ILIKE 'i' is true on DuckDB, false on Spark)",
                "compare with the spellings you mean: s IN ('Paris', 'PARIS')")
_LOWER_LIKE = frozenset(chr(c) for c in range(32, 127)) - {"i", "_"}
"""Characters of a LIKE pattern under which lower(s) answers alike on both engines (``_lowered``)."""


def _lowered(node: exp.Expr) -> None:
    """lower(s) as the subject of LIKE with a pattern of printable ASCII other than 'i' and '_'.
    The engines' lower differ only where one writes 'i' + U+0307 for 'İ' (DuckDB: 'i'), 'ς' for a
    final 'Σ' (DuckDB: 'σ'), or lowers a letter newer than DuckDB's Unicode tables (56 code points
    on pyspark 4.3 / DuckDB 2.0): each gives 'i' or non-ASCII text on both, which such a pattern's
    literal pieces never match, and without '_' no length is counted. Any other use is refused."""
    like = node.parent
    if (isinstance(like, exp.Like) and like.this is node and not isinstance(like.parent, exp.Escape)
            and isinstance(like.expression, exp.Literal) and like.expression.is_string
            and set(like.expression.this) <= _LOWER_LIKE):
        return text.text(node, node.this)
    _CASE(node)


_CASELESS_LIKE = frozenset(c for c in map(chr, range(32, 127)) if not c.isalpha()) - {"_"}
"""Characters of an ILIKE pattern that matches as LIKE does (``_caseless``)."""


def _caseless(node: exp.Expr) -> None:
    """ILIKE with a pattern of ASCII digits, punctuation and '%': no letter's case can matter
    (no character lowers to one of them), so it is LIKE, written as LIKE on Spark. A pattern
    with a letter or '_' is refused: the engines lower letters differently."""
    pattern = node.expression
    if (isinstance(pattern, exp.Literal) and pattern.is_string and set(pattern.this) <= _CASELESS_LIKE
            and not isinstance(node.parent, exp.Escape)):
        return text.like(node)
    _CASE(node)


_INTERVAL = differs(numbers.INTERVALS, "add days as a number (d + 7), or compare date parts")
_NESTED = differs("dpsql does not read inside lists, maps and structs on Spark (DuckDB lists count from 1 and "
                  "read NULL past the end; Spark arrays in [] count from 0 and fail past the end)",
                  "read scalar columns (a list, map or struct itself may be counted or tested with IS NULL)")
_MATH = differs("Java's and C's math libraries differ (exp(1.7) is 5.4739473917272 on DuckDB and "
                "5.473947391727199 on Spark; ln(0) is -inf on DuckDB and NULL on Spark; log(x) is base 10 on "
                "DuckDB and base e on Spark)", "compute it over the released values in Python")
_TRUNC = differs("sqlglot writes trunc(x) for Spark as CAST(x AS BIGINT), which fails past BIGINT (trunc(1e300) "
                 "is 1e300 on DuckDB and an error on Spark); Spark has no even()", "use floor(x) or ceil(x)")
_NO_TRY = differs("an invalid date (make_date(2020, 2, 30)) makes DuckDB's TRY give NULL, but Spark's make_date "
                  "has no form that does", "compare year(d), month(d) and day(d) instead")
_FORMAT = differs("strftime's format codes have no exact Spark counterpart (Spark's date_format writes "
                  "other texts for some codes and years)", "use year(d), month(d), day(d) and dayname(d)")

RULES: dict[type, Callable[[exp.Expr], None] | None] = {
    # query structure (public queries run on Spark as written; ORDER BY's NULLs are placed by agree)
    **dict.fromkeys([exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
                     exp.Offset, exp.Table, exp.TableAlias, exp.Alias, exp.Star, exp.Join, exp.Subquery,
                     exp.Distinct, exp.Filter, exp.With, exp.CTE, exp.Identifier, exp.Column, exp.Null,
                     exp.Boolean, exp.Paren, exp.Not, exp.And, exp.Or, exp.DataType, exp.DataTypeParam, exp.Var,
                     exp.Pi], None),
    exp.Literal: numbers.literal, exp.Union: text.union,
    **dict.fromkeys([exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ],
                    numbers.binary),
    exp.Is: numbers.is_, exp.Between: numbers.between, exp.In: numbers.in_,
    **dict.fromkeys([exp.Case, exp.If, exp.Coalesce, exp.Least, exp.Greatest, exp.Nullif], numbers.combining),
    **dict.fromkeys([exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod], numbers.arithmetic),
    **dict.fromkeys([exp.Neg, exp.Abs, exp.Sign, exp.Sqrt], numbers.numeric),
    exp.Round: numbers.rounded, exp.Floor: numbers.floored, exp.Ceil: numbers.floored,
    exp.Cast: numbers.cast, exp.TryCast: numbers.cast,
    exp.Like: text.like, exp.ILike: _caseless, exp.Lower: _lowered, exp.Upper: _CASE,
    exp.Length: text.length, exp.Substring: text.substring, exp.Left: text.left_right,
    exp.Right: text.left_right, exp.Trim: text.trim, exp.DPipe: text.concatenated, exp.Concat: text.concatenated,
    **dict.fromkeys([exp.StartsWith, exp.EndsWith, exp.Contains], text.searched),
    **dict.fromkeys([exp.Year, exp.Month, exp.Day, exp.Quarter, exp.DayOfWeek, exp.DayOfWeekIso, exp.DayOfMonth,
                     exp.DayOfYear, exp.WeekOfYear, exp.Week, exp.Hour, exp.Minute, exp.Second, exp.Dayname,
                     exp.Monthname, exp.LastDay], text.temporal),
    exp.Extract: text.extract, exp.TimestampTrunc: text.truncated, exp.DateTrunc: text.truncated,
    exp.DateDiff: text.difference,
    exp.Interval: numbers.interval, exp.DateAdd: _INTERVAL, exp.DateSub: _INTERVAL, exp.DateFromParts: _NO_TRY,
    exp.TimeToStr: _FORMAT,
    **dict.fromkeys([exp.StructExtract, exp.Bracket, exp.ArrayContains, exp.ArraySize, exp.ArrayMin, exp.ArrayMax,
                     exp.ArrayPosition], _NESTED),
    **dict.fromkeys([exp.Ln, exp.Log, exp.Exp, exp.Pow, exp.Cbrt], _MATH),
    **{kind: text.float_test for kind in (getattr(exp, "IsNan", None), getattr(exp, "IsInf", None)) if kind},
    **{kind: _TRUNC for kind in (getattr(exp, "Trunc", None),) if kind},
    exp.AggFunc: text.aggregate,
}
"""sqlglot node class -> ``None`` (accepted) or the rule that checks it; a class's first listed
ancestor counts (every aggregate is an ``AggFunc``). Anything else is refused."""

FUNCTIONS: dict[str, Callable[[exp.Expr], None] | None] = {
    **dict.fromkeys(["isnan", "isinf", "isfinite"], text.float_test),
    "strlen": lambda node: text.text(node, *node.expressions),
    **dict.fromkeys(["contains", "prefix", "suffix"], text.searched),
    **dict.fromkeys(["date_part", "datepart"], text.extract),
    **dict.fromkeys(["dayname", "monthname", "isodow", "yearweek", "week", "hour", "minute", "second"],
                    text.temporal),
    "clamp": lambda node: numbers.compared(node, node.expressions),
    **dict.fromkeys(["list_extract", "array_extract", "element_at", "map_extract", "map_contains", "list_position",
                     "list_sum", "list_count", "list_avg", "cardinality"], _NESTED),
    **dict.fromkeys(["log2", "log10", "cbrt"], _MATH), **dict.fromkeys(["trunc", "even"], _TRUNC),
}
"""Functions sqlglot leaves anonymous (``dpsql.sql.allowlist.ROW_LEVEL_FUNCTIONS`` and
``POST_FUNCTIONS``), by lower-cased name -> rule, as ``RULES``."""


def check_spark(tree: exp.Expr, types: Mapping[str, str] | None = None, *, private: bool = False) -> None:
    """Refuse any construct of the (DuckDB-checked) analyst ``tree`` whose Spark rendering would
    not agree with DuckDB (module docstring); the refusal carries the node, whose position the
    caller finds (``dpsql.sql.parse.located``). ``types``: lower-cased ``column`` or
    ``table.column`` -> DuckDB type (``dpsql.backends.spark.render.column_types``). ``private``:
    ``tree`` reads a private table, so its aggregates are dpsql's to rewrite and what combines
    released values (select items over aggregates, HAVING, ORDER BY) runs on DuckDB, not on
    Spark: only the parts evaluated on rows are checked."""
    tree = tree.copy()  # annotated with types here; the caller's tree is left as it is
    types = scoped_types(tree, types)
    annotate(tree, types)
    for node in spark_nodes(tree, private):
        if isinstance(node, exp.Anonymous):
            rule = FUNCTIONS.get(node.name.lower(), not_listed)
        elif private and isinstance(node, (exp.AggFunc, exp.TableSample)):
            continue  # dpsql's to rewrite (a TABLESAMPLE POISSON is its sample of units: dpsql.sql.pieces.InSample)
        else:
            rule = next((RULES[kind] for kind in type(node).__mro__ if kind in RULES), not_listed)
        if rule is not None:
            try:
                rule(node)
            except UnsupportedQuery:
                _refuse_nested_read(node, types)  # the reason that matters, where it is
                raise
    if private:
        for root in row_level_roots(tree):
            total(root, types)  # refuses what cannot be written for Spark (too long, a type it cannot tell)


def _refuse_nested_read(node: exp.Expr, types: Mapping[str, str]) -> None:
    """Refuse ``node`` as reading inside a list, map or struct if it does: a refused expression
    over one (``s.a > 1``, ``len(l)``) would otherwise be refused for a type dpsql cannot tell."""
    for part in node.walk():
        if _struct_field(part, types):
            field = part.sql(dialect="duckdb")
            raise UnsupportedQuery(f"the struct field {field} is not read on Spark: dpsql does not read inside lists, "
                                   "maps and structs there", construct=field, node=part,
                                   hint="read scalar columns (a struct itself may be tested with IS NULL)")
        if isinstance(part, (exp.Bracket, exp.StructExtract)):
            _NESTED(part)
        if isinstance(part, exp.Column) and _nested(typed(part)) and part is not node:
            _NESTED(part.parent or part)


def _struct_field(node: exp.Expr, types: Mapping[str, str]) -> bool:
    """``s.a`` for a STRUCT column ``s`` (sqlglot reads it as column ``a`` of a table ``s``)."""
    return (isinstance(node, exp.Column) and bool(node.table) and typed(node) is None
            and _nested(types.get(node.table.lower())))


def _nested(type_name: str | None) -> bool:
    name = (type_name or "").upper()
    return name.endswith("]") or name.startswith(("STRUCT", "MAP", "UNION"))


def row_level_roots(tree: exp.Expr) -> Iterator[exp.Expr]:
    """The expressions a private query evaluates on rows, each of which dpsql wraps in ``Total``:
    WHERE and FILTER conditions, join conditions, GROUP BY keys and aggregates' arguments."""
    for node in tree.walk():
        if isinstance(node, exp.Where):
            yield node.this
        elif isinstance(node, exp.Group):
            yield from node.expressions
        elif isinstance(node, exp.Join) and node.args.get("on") is not None:
            yield node.args["on"]
        elif isinstance(node, exp.AggFunc):
            # a two-argument aggregate (CORR(y, x)) holds its second row-level argument as ``expression``
            second = [node.args["expression"]] if _takes_two(node) else []
            for argument in [node.this, *node.expressions, *second]:
                if isinstance(argument, exp.Distinct):
                    yield from argument.expressions
                elif isinstance(argument, exp.Expr) and not isinstance(argument, exp.Star):
                    yield argument


def _takes_two(node: exp.AggFunc) -> bool:
    """Whether ``node`` is a two-argument aggregate of dpsql's (its family's ``arity`` is 2)."""
    family = family_for_call(node)
    return family is not None and family.arity == 2 and isinstance(node.args.get("expression"), exp.Expr)


def spark_nodes(tree: exp.Expr, private: bool = False) -> Iterator[exp.Expr]:
    """The nodes of ``tree`` Spark evaluates: all of them, or for a private query those outside
    its post-processing (select items combining aggregates, HAVING, ORDER BY, LIMIT), though
    aggregates' arguments are row-level and evaluated on Spark wherever they appear."""
    bounded = any(isinstance(node, PerGroupBounded) for node in tree.walk())
    for node in tree.walk():
        if bounded and _contribution_bound(node):
            continue  # contribution_bounds_per_group: numbers analyse reads, never evaluated on an engine
        if not private or not _post_processing(node):
            yield node


def _contribution_bound(node: exp.Expr) -> bool:
    """``node`` lies in an aggregate's ``contribution_bounds_per_group => (lo, hi)``."""
    while node.parent is not None:
        if node.arg_key == "bounds" and isinstance(node.parent, PerGroupBounded):
            return True
        node = node.parent
    return False


def _post_processing(node: exp.Expr) -> bool:
    scope: exp.Expr | None = node
    while scope is not None:
        if isinstance(scope, (exp.AggFunc, exp.Filter)) and scope is not node:
            return False
        parent = scope.parent
        if isinstance(parent, exp.Select) and scope.arg_key in ("having", "order", "limit", "offset"):
            return True
        if isinstance(parent, exp.Select) and scope.arg_key == "expressions":
            return scope.find(exp.AggFunc) is not None and not isinstance(node, (exp.AggFunc, exp.Filter))
        scope = parent
    return False
