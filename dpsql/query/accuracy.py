"""Accuracy of every released column, in that column's own units.

Each aggregate of the noisy core (``a0..``) has a (1 - alpha) interval per released row
(``dpsql.query.release.intervals``: value ± half-width, or a quantile's drawn endpoints). An output
column is an expression of the post-processing query over the core; its interval is derived
from its aggregates' intervals by interval arithmetic, which is sound: if every aggregate's
true (bounded) value lies in its interval, the output's true value lies in the derived one.
An output built from j aggregates takes each at alpha/j (a union bound), so its interval holds
with probability >= 1 - alpha. Everything here reads released values and public constants
only: it is post-processing.

Derived soundly: + - * / (a divisor interval holding 0 gives none), negation, ROUND, FLOOR,
CEIL, ABS, CAST to a number, LEAST, GREATEST, SQRT / LN / LOG10 / LOG2 / EXP on their domain.
Anything else (CASE, string functions, comparisons, a key inside the expression, ...) has no
interval: the column is "derived, no ±" (NaN). Columns that read no aggregate (keys,
constants) are not noisy and have no entry.

>>> import sqlglot
>>> node = sqlglot.parse_one("ROUND(a0 / a1, 1)", read="duckdb")
>>> derive(node, {"a0": (90.0, 110.0), "a1": (9.0, 11.0)})
(8.1, 12.3)
>>> derive(sqlglot.parse_one("a0 / a1", read="duckdb"), {"a0": (1.0, 2.0), "a1": (-1.0, 3.0)}) is None
True
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Sequence

from sqlglot import exp

from dpsql.analysis.plan import Plan, PrivateQuery, aggregates_of
from dpsql.query.release import Release, half_widths, intervals

Interval = tuple[float, float]

__all__ = ["aggregates_of", "cut_half_width", "derive", "output_cells"]


class _NoInterval(Exception):
    """The expression has no sound interval."""


def derive(node: exp.Expression, env: dict[str, Interval]) -> Interval | None:
    """The interval of ``node`` when each aggregate column lies in ``env``'s interval, or None
    when none can be derived soundly."""
    try:
        low, high = _eval(node, env)
    except (_NoInterval, ArithmeticError, ValueError):
        return None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return None
    return low, high


def _down(x: float) -> float:
    return math.nextafter(x, -math.inf)


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


def _out(values: Sequence[float]) -> Interval:
    """The hull of computed endpoints, widened by one ulp each way (each is correctly rounded,
    so the exact endpoint lies within one ulp)."""
    if any(math.isnan(v) for v in values):
        raise _NoInterval
    return _down(min(values)), _up(max(values))


def _loose(values: Sequence[float]) -> Interval:
    """The hull of endpoints computed by library functions (sqrt, log, exp), which are not
    correctly rounded here or in DuckDB: widened by a relative 2**-40, far beyond their error."""
    low, high = _out(values)
    return _down(low - abs(low) * 2**-40), _up(high + abs(high) * 2**-40)


_NUMERIC_CASTS = {"DOUBLE", "FLOAT", "REAL", "DECIMAL", "NUMERIC", "TINYINT", "SMALLINT", "INT", "INTEGER",
                  "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "INT128", "INT64",
                  "INT32", "INT16", "INT8", "FLOAT64", "FLOAT4", "FLOAT8", "DOUBLE PRECISION", "UINT", "UINT128",
                  "UHUGEINT", "UDECIMAL"}


def _eval(node: exp.Expression, env: dict[str, Interval]) -> Interval:
    if isinstance(node, exp.Paren):
        return _eval(node.this, env)
    if isinstance(node, exp.Column):
        if node.name in env:
            low, high = env[node.name]
            if math.isnan(low) or math.isnan(high):
                raise _NoInterval
            return low, high
        raise _NoInterval  # a key, or an output alias: not an interval
    if isinstance(node, exp.Literal):
        if node.is_string:
            raise _NoInterval
        exact = Decimal(node.this)
        value = float(exact)
        return (value, value) if Decimal(value) == exact else _out([value])
    if isinstance(node, exp.Neg):
        low, high = _eval(node.this, env)
        return -high, -low
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)) and type(node) in _ARITHMETIC:
        (a, b), (c, d) = _eval(node.this, env), _eval(node.expression, env)
        return _ARITHMETIC[type(node)](a, b, c, d)
    if isinstance(node, exp.Round):
        digits = _constant_int(node.args.get("decimals"))
        low, high = _eval(node.this, env)
        return _rounded(low, high, digits)
    if isinstance(node, exp.Floor) and node.args.get("decimals") is None:
        low, high = _eval(node.this, env)
        return float(math.floor(low)), float(math.floor(high))
    if isinstance(node, exp.Ceil) and node.args.get("decimals") is None:
        low, high = _eval(node.this, env)
        return float(math.ceil(low)), float(math.ceil(high))
    if isinstance(node, exp.Abs):
        low, high = _eval(node.this, env)
        if low >= 0:
            return low, high
        if high <= 0:
            return -high, -low
        return 0.0, max(-low, high)
    if isinstance(node, exp.Cast):
        return _cast(node, env)
    if isinstance(node, (exp.Least, exp.Greatest)):
        parts = [_eval(arg, env) for arg in [node.this, *node.expressions]]
        pick = min if isinstance(node, exp.Least) else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    if isinstance(node, exp.Sqrt):
        low, high = _eval(node.this, env)
        if low < 0:
            raise _NoInterval
        return _loose([math.sqrt(low), math.sqrt(high)])
    if isinstance(node, exp.Ln) or (isinstance(node, exp.Log) and node.expression is None):
        low, high = _eval(node.this, env)  # one-argument LOG is DuckDB's base-10 logarithm
        if low <= 0:
            raise _NoInterval
        log = math.log if isinstance(node, exp.Ln) else math.log10
        return _loose([log(low), log(high)])
    if isinstance(node, exp.Log) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        base = float(node.this.this)  # LOG(b, x) in DuckDB's reading: base first
        low, high = _eval(node.expression, env)
        if low <= 0 or base <= 1:
            raise _NoInterval
        return _loose([math.log(low, base), math.log(high, base)])
    if isinstance(node, exp.Exp):
        low, high = _eval(node.this, env)
        return _loose([math.exp(low), math.exp(high)])
    raise _NoInterval


def _add(a, b, c, d) -> Interval:
    return _out([a + c])[0], _out([b + d])[1]


def _sub(a, b, c, d) -> Interval:
    return _out([a - d])[0], _out([b - c])[1]


def _mul(a, b, c, d) -> Interval:
    return _out([a * c, a * d, b * c, b * d])


def _div(a, b, c, d) -> Interval:
    if c <= 0 <= d:
        raise _NoInterval  # the divisor may be 0: the quotient is unbounded
    return _out([a / c, a / d, b / c, b / d])


_ARITHMETIC = {exp.Add: _add, exp.Sub: _sub, exp.Mul: _mul, exp.Div: _div}


def _constant_int(node: exp.Expression | None) -> int:
    if node is None:
        return 0
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if isinstance(inner, exp.Literal) and not inner.is_string and inner.this.isdigit():
        return -int(inner.this) if negative else int(inner.this)
    raise _NoInterval


def _rounded(low: float, high: float, digits: int) -> Interval:
    """Any rounding to ``digits`` decimals of a value in [low, high] lies in [floor, ceil] of the
    endpoints at that many decimals (rounding is monotone, whichever way ties go)."""
    if not -300 <= digits <= 300:
        raise _NoInterval
    scale = Decimal(10) ** -digits
    lo = (Decimal(low) / scale).to_integral_value(rounding="ROUND_FLOOR") * scale
    hi = (Decimal(high) / scale).to_integral_value(rounding="ROUND_CEILING") * scale
    return float(lo), float(hi)  # the doubles nearest the decimals, as a rounding gives them


def _cast(node: exp.Cast, env: dict[str, Interval]) -> Interval:
    target = node.to
    name = target.this.name if hasattr(target.this, "name") else str(target.this)
    name = str(name).upper()
    if name not in _NUMERIC_CASTS:
        raise _NoInterval
    low, high = _eval(node.this, env)
    if name in ("DOUBLE", "FLOAT64", "FLOAT8", "DOUBLE PRECISION"):
        return low, high
    if name in ("FLOAT", "REAL", "FLOAT4"):  # to the nearest float32: within 2**-23 relatively
        return _out([low - abs(low) * 2**-23, high + abs(high) * 2**-23])
    if name in ("DECIMAL", "NUMERIC"):
        expressions = target.expressions
        scale = 3 if not expressions else _constant_int(expressions[1].this if len(expressions) > 1 and
                                                          hasattr(expressions[1], "this") else None)
        return _rounded(low, high, scale)
    return float(math.floor(low)), float(math.ceil(high))  # to an integer: rounded, either way


def output_cells(plan: Plan, checked: PrivateQuery, release: Release | None, rows: Sequence[tuple],
                 alpha: float) -> dict[str, list[tuple[float, float, float]]]:
    """Per noisy output column, per released row: (low, high, half-width) of its (1 - alpha)
    interval, NaN where none can be derived ("derived, no ±"). ``release`` holds the measures
    of the rows shown, in their order; ``None`` when rows were merged (DISTINCT), so none is
    known. Columns reading no aggregate (keys, constants) are left out."""
    cache: dict[int, dict[str, list[Interval]]] = {}
    cells: dict[str, list[tuple[float, float, float]]] = {}
    nan = (math.nan, math.nan, math.nan)
    for position, (name, item) in enumerate(zip(checked.outputs, checked.post.expressions)):
        node = item.unalias()
        used = aggregates_of(node)
        if not used:
            continue
        if release is None:
            cells[name] = [nan] * len(rows)
            continue
        if isinstance(node, exp.Column):  # the aggregate itself: its own interval and half-width
            own = intervals(plan, release, alpha)[node.name]
            cells[name] = [(low, high, cut_half_width(half, row[position], low, high)) for (low, high), half, row
                           in zip(own, half_widths(plan, release, alpha)[node.name], rows)]
            continue
        share = len(used)
        if share not in cache:
            cache[share] = intervals(plan, release, alpha / share)
        bases = cache[share]
        column = []
        for r, row in enumerate(rows):
            value = _number(row[position])
            derived = derive(node, {a: bases[a][r] for a in used}) if value is not None else None
            if value is None or derived is None:
                column.append(nan)
                continue
            low, high = min(derived[0], value), max(derived[1], value)
            column.append((low, high, max(value - low, high - value)))
        cells[name] = column
    return cells


def cut_half_width(half: float, released, low: float, high: float) -> float:
    """The half-width of an interval cut to what the policy allows: no wider than the farther
    end from the released value (an AVG of C' <= 0 is its bounds' midpoint, ± half their spread)."""
    value = _number(released)
    if value is None or not (math.isfinite(low) and math.isfinite(high)):
        return half
    return min(half, max(value - low, high - value))


def _number(value) -> float | None:
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
