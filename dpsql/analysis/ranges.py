"""Range propagation: the interval every row value of an expression lies in, from policy bounds.

Bounds come only from the policy (``col BOUNDS lo TO hi``) and from constants in the query,
never from data. Interval arithmetic is exact (``Fraction``). The derived interval is then
*enforced* by the rewrite stage (a final clamp), so an interval here can only be too wide,
costing accuracy, never privacy.

Each handler states its rule. ``None`` stands for "always NULL" (contributes nothing).

>>> import sqlglot
>>> bounds = {"amount": Interval(Fraction(0), Fraction(500), False), "age": Interval(Fraction(18), Fraction(90), True)}
>>> derive_range(sqlglot.parse_one("amount * 2 - age"), bounds.get)
Interval(lower=Fraction(-90, 1), upper=Fraction(982, 1), integral=False)
>>> derive_range(sqlglot.parse_one("CASE WHEN age > 30 THEN 1 ELSE 0 END"), bounds.get)
Interval(lower=Fraction(0, 1), upper=Fraction(1, 1), integral=True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, NoReturn

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.sql.names import sql_name
from dpsql.sql.parse import DIALECT, describe
from dpsql.sql.types import reads_as_integer, reads_as_number


@dataclass(frozen=True)
class Interval:
    """A closed interval of possible row values."""

    lower: Fraction
    """Smallest possible value."""
    upper: Fraction
    """Largest possible value."""
    integral: bool
    """True when every value is an integer (so no rounding onto a grid is needed)."""


ColumnBounds = Callable[[str], "Interval | None"]


def derive_range(node: exp.Expression, column_bounds: ColumnBounds) -> Interval | None:
    """The interval of ``node``'s row values; refuses expressions with no derivable bound (the
    refusal carries its node: its position is found where the SQL text is known)."""
    handler = _HANDLERS.get(type(node))
    if handler is None:
        _refuse(node, f"cannot derive bounds for {describe(node)}")
    return handler(node, column_bounds)


def _refuse(node: exp.Expression, message: str) -> NoReturn:
    raise UnsupportedQuery(
        f"{message} inside SUM/AVG",
        node=node,
        construct=describe(node),
        hint="state bounds with CLAMP(expr, lo, hi), combine bounded columns with + - * / by "
        "constants and CASE, or declare BOUNDS for the column in the policy",
    )


def column_type_of(bounds, name: str) -> str | None:
    """The DuckDB type of a column, when the ``bounds`` lookup carries ``column_type``."""
    lookup = getattr(bounds, "column_type", None)
    try:
        return None if lookup is None else lookup(name).upper()
    except (KeyError, AttributeError):
        return None


TEMPORAL_PREFIXES = ("DATE", "TIME", "INTERVAL")
"""Types whose values are not numbers (DATE, TIME, TIMESTAMP*, INTERVAL): no BOUNDS."""


def _column(node: exp.Column, bounds: ColumnBounds) -> Interval:
    found = bounds(node.name)
    if found is None:
        # As the query wrote the name (bind keeps it), so the hint can be pasted back.
        name = node.this.meta.get("dp_written") if isinstance(node.this, exp.Identifier) else None
        name = name or sql_name(node.name)
        type_name = column_type_of(bounds, node.name)
        if type_name == "BOOLEAN":
            raise UnsupportedQuery(
                f"column {name} is BOOLEAN: it has no numeric bounds (BOUNDS are for numeric columns)",
                node=node, construct=node.name,
                hint=f"write SUM({name}::INT) or SUM(CASE WHEN {name} THEN 1 ELSE 0 END) (bounds 0 to 1), "
                     f"or COUNT(*) ... WHERE {name}")
        if type_name is not None and type_name.startswith(TEMPORAL_PREFIXES):
            raise UnsupportedQuery(
                f"column {name} is {type_name}, not a number: SUM, AVG, MIN, MAX and quantiles need numeric "
                "values, and BOUNDS are for numeric columns",
                node=node, construct=node.name,
                hint=f"aggregate a date part: hour({name}) or month({name}) (bounded by the calendar) or "
                     f"CLAMP(year({name}), lo, hi); or count rows per period: COUNT(*) ... GROUP BY month({name})")
        raise UnsupportedQuery(
            f"column {name} has no BOUNDS in the policy, so its values are unbounded",
            node=node,
            construct=node.name,
            hint=f"declare `{name} BOUNDS lo TO hi` in the policy, write CLAMP({name}, lo, hi), "
                 "or COUNT it instead",
        )
    return found


def _literal(node: exp.Literal, bounds: ColumnBounds) -> Interval:
    if node.is_string:
        _refuse(node, "a string literal has no numeric bounds")
    value = Fraction(node.this)
    return Interval(value, value, value.denominator == 1 and "." not in node.this and "e" not in node.this.lower())


def _null(node, bounds) -> None:
    return None


def _boolean(node: exp.Boolean, bounds) -> Interval:
    value = Fraction(1 if node.this else 0)
    return Interval(value, value, True)


def _inner(node, bounds):
    return derive_range(node.this, bounds)


def _neg(node, bounds):
    inner = derive_range(node.this, bounds)
    return None if inner is None else Interval(-inner.upper, -inner.lower, inner.integral)


def _arithmetic(combine):
    def handler(node, bounds):
        left = derive_range(node.this, bounds)
        right = derive_range(node.expression, bounds)
        if left is None or right is None:
            return None  # NULL op anything is NULL
        return combine(node, left, right)

    return handler


def _add(node, a, b):
    return Interval(a.lower + b.lower, a.upper + b.upper, a.integral and b.integral)


def _sub(node, a, b):
    return Interval(a.lower - b.upper, a.upper - b.lower, a.integral and b.integral)


def _mul(node, a, b):
    corners = [x * y for x in (a.lower, a.upper) for y in (b.lower, b.upper)]
    return Interval(min(corners), max(corners), a.integral and b.integral)


def _div(node, a, b):
    # Only division by a constant: a bounded divisor through zero has no bounded quotient.
    if b.lower != b.upper or b.lower == 0:
        _refuse(node, "division by a non-constant or zero divisor")
    corners = [a.lower / b.lower, a.upper / b.lower]
    return Interval(min(corners), max(corners), False)


def _union(parts: list[Interval | None]) -> Interval | None:
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return Interval(
        min(p.lower for p in present),
        max(p.upper for p in present),
        all(p.integral for p in present),
    )


def _case(node: exp.Case, bounds):
    # Conditions may use any column; only the values a branch can produce matter.
    branches = [derive_range(branch.args["true"], bounds) for branch in node.args.get("ifs") or []]
    default = node.args.get("default")
    branches.append(derive_range(default, bounds) if default is not None else None)
    return _union(branches)


def _if(node: exp.If, bounds):
    false = node.args.get("false")
    return _union(
        [
            derive_range(node.args["true"], bounds),
            derive_range(false, bounds) if false is not None else None,
        ]
    )


def _variadic(node, bounds):
    # COALESCE, LEAST and GREATEST each return one of their (non-NULL) arguments.
    args = [node.this, *node.expressions]
    return _union([derive_range(a, bounds) for a in args])


def _abs(node, bounds):
    inner = derive_range(node.this, bounds)
    if inner is None:
        return None
    low = Fraction(0) if inner.lower <= 0 <= inner.upper else min(abs(inner.lower), abs(inner.upper))
    return Interval(low, max(abs(inner.lower), abs(inner.upper)), inner.integral)


def _rounding(node, bounds):
    inner = derive_range(node.this, bounds)
    if inner is None:
        return None
    decimals = node.args.get("decimals")
    if isinstance(node, exp.Round) and decimals is not None:
        return Interval(inner.lower - 1, inner.upper + 1, False)  # loose but safe for any precision
    return Interval(Fraction(math.floor(inner.lower)), Fraction(math.ceil(inner.upper)), True)


def _cast(node: exp.Cast, bounds):
    target = node.to.sql(dialect=DIALECT).upper()
    if not reads_as_number(target):
        _refuse(node, f"a cast to {target} has no numeric bounds")
    value = node.this
    while isinstance(value, exp.Paren):
        value = value.this
    if isinstance(value, exp.Column) and bounds(value.name) is None and \
            column_type_of(bounds, value.name) == "BOOLEAN":
        return Interval(Fraction(0), Fraction(1), reads_as_integer(target))  # false -> 0, true -> 1
    inner = derive_range(node.this, bounds)
    if inner is None or not reads_as_integer(target):
        return inner
    return Interval(Fraction(math.floor(inner.lower)), Fraction(math.ceil(inner.upper)), True)


def clamp_arguments(node: exp.Expression) -> tuple[exp.Expression, Fraction, Fraction] | None:
    """(value, lo, hi) of ``CLAMP(value, lo, hi)`` with constant numeric bounds, else None."""
    if not (isinstance(node, exp.Anonymous) and node.name.lower() == "clamp" and len(node.expressions) == 3):
        return None
    value, low_node, high_node = node.expressions
    low, high = _constant(low_node), _constant(high_node)
    if low is None or high is None or low > high:
        return None
    return value, low, high


def _constant(node: exp.Expression) -> Fraction | None:
    if isinstance(node, exp.Paren):
        return _constant(node.this)
    if isinstance(node, exp.Neg):
        inner = _constant(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        return Fraction(node.this)
    return None


def _function(node: exp.Anonymous, bounds):
    """CLAMP(x, lo, hi): the analyst states bounds; x itself needs none (the rewrite clamps)."""
    parts = clamp_arguments(node)
    if parts is None:
        _refuse(node, f"cannot derive bounds for {describe(node)}; CLAMP needs constant bounds lo <= hi")
    value, low, high = parts
    try:
        inner = derive_range(value, bounds)
    except UnsupportedQuery:
        inner = None
    if inner is not None:  # already narrower bounds: keep the intersection
        low, high = max(low, inner.lower), min(high, inner.upper)
        if low > high:
            low = high = min(max(inner.lower, parts[1]), parts[2])
    whole = inner.integral if inner is not None else integer_valued(value, bounds)
    integral = whole and low.denominator == 1 and high.denominator == 1
    return Interval(low, high, integral)


INTEGER_FUNCTIONS = frozenset({
    "list_count", "cardinality", "length", "len", "strlen", "array_length", "length_grapheme", "list_unique",
    "year", "month", "day", "hour", "minute", "second", "quarter", "dayofweek", "dayofyear", "week", "isodow",
    "date_diff", "datediff", "date_part", "datepart",
})
"""Functions whose DuckDB result type is an integer (for the grid of a CLAMPed sum)."""


def integer_valued(node: exp.Expression, bounds) -> bool:
    """True when ``node``'s DuckDB type is an integer: columns of integer type (``bounds``
    may carry ``integral_column(name)``), integer literals, integer casts, date parts and the
    ``INTEGER_FUNCTIONS``, and + - * ABS CASE COALESCE LEAST GREATEST of those. Only the grid
    of a sum depends on it (an integer grid rounds each value, inside its bounds): not privacy.

    >>> import sqlglot
    >>> integer_valued(sqlglot.parse_one("CLAMP(list_count(x), 0, 3) * 2 + 1"), None)
    True
    >>> integer_valued(sqlglot.parse_one("a / 2"), None)
    False
    """
    if isinstance(node, exp.Paren):
        return integer_valued(node.this, bounds)
    if isinstance(node, exp.Column):
        check = getattr(bounds, "integral_column", None)
        return check is not None and check(node.name)
    if isinstance(node, exp.Literal):
        return not node.is_string and "." not in node.this and "e" not in node.this.lower()
    if isinstance(node, exp.Boolean):
        return True
    if isinstance(node, (exp.Cast, exp.TryCast)):
        return reads_as_integer(node.to.sql(dialect=DIALECT).upper())
    if isinstance(node, (exp.Extract, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfMonth, exp.DayOfYear,
                         exp.WeekOfYear, exp.Year, exp.Length, exp.ArraySize, exp.DateDiff,
                         *(getattr(exp, n) for n in ("Hour", "Minute", "Second", "Quarter") if hasattr(exp, n)))):
        return True
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        return integer_valued(node.this, bounds) and integer_valued(node.expression, bounds)
    if isinstance(node, (exp.Neg, exp.Abs)):
        return integer_valued(node.this, bounds)
    if isinstance(node, exp.Case):
        branches = [b.args["true"] for b in node.args.get("ifs") or []] + \
            ([node.args["default"]] if node.args.get("default") is not None else [])
        return all(integer_valued(b, bounds) or isinstance(b, exp.Null) for b in branches)
    if isinstance(node, (exp.Coalesce, exp.Least, exp.Greatest)):
        return all(integer_valued(a, bounds) for a in [node.this, *node.expressions])
    if isinstance(node, exp.Anonymous):
        parts = clamp_arguments(node)
        if parts is not None:
            return integer_valued(parts[0], bounds) and all(b.denominator == 1 for b in parts[1:])
        return node.name.lower() in INTEGER_FUNCTIONS
    return False


DATE_PARTS = {
    "month": (1, 12), "day": (1, 31), "quarter": (1, 4), "dayofweek": (0, 6), "dow": (0, 6),
    "isodow": (1, 7), "dayofmonth": (1, 31), "dayofyear": (1, 366), "doy": (1, 366), "week": (1, 53),
    "weekofyear": (1, 53), "hour": (0, 23), "minute": (0, 59), "second": (0, 59),
}
"""Date parts whose values a calendar bounds (a year has none: CLAMP it)."""


def _date_part(node: exp.Expression, bounds):
    if isinstance(node, exp.Extract):
        part = node.this.name.lower()
    else:
        parts: dict[type, str] = {exp.Month: "month", exp.Day: "day", exp.DayOfWeek: "dayofweek",
                                  exp.DayOfMonth: "dayofmonth", exp.DayOfYear: "dayofyear",
                                  exp.WeekOfYear: "weekofyear"}
        part = parts.get(type(node), node.key)
        part = getattr(exp, "Quarter", None) is type(node) and "quarter" or part
    if part not in DATE_PARTS:
        _refuse(node, f"the date part {part.upper()} has no calendar bound")
    low, high = DATE_PARTS[part]
    return Interval(Fraction(low), Fraction(high), True)


_HANDLERS: dict[type, Callable] = {
    exp.Anonymous: _function,
    **{cls: _date_part for cls in (exp.Extract, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfMonth,
                                   exp.DayOfYear, exp.WeekOfYear, getattr(exp, "Quarter", exp.Month),
                                   *(getattr(exp, n) for n in ("Hour", "Minute", "Second") if hasattr(exp, n)))},
    exp.Column: _column,
    exp.Literal: _literal,
    exp.Null: _null,
    exp.Boolean: _boolean,
    exp.Paren: _inner,
    exp.Neg: _neg,
    exp.Add: _arithmetic(_add),
    exp.Sub: _arithmetic(_sub),
    exp.Mul: _arithmetic(_mul),
    exp.Div: _arithmetic(_div),
    exp.Case: _case,
    exp.If: _if,
    exp.Coalesce: _variadic,
    exp.Least: _variadic,
    exp.Greatest: _variadic,
    exp.Abs: _abs,
    exp.Round: _rounding,
    exp.Floor: _rounding,
    exp.Ceil: _rounding,
    exp.Cast: _cast,
    exp.TryCast: _cast,
}
