"""Each answer's 95% intervals, as a wire client sees them (issue 23, item 1).

psql shows notices and rows, nothing else: so every answer's notice lists each noisy column's
interval — one ``± half-width`` when every row has the same symmetric one, else ``[low, high]``
for every row, in a table keyed by the row's keys (issue 37, item 7) — and ``OPTIONS (intervals
= true)`` returns them as data instead, ``<column>_low`` and ``<column>_high`` after each noisy
column, for psql, pandas and BI tools alike. Programs read every row's interval from the
``dpsql_cost`` ParameterStatus. Noisy values go out to the digits their ± supports, as the
shell shows them: the digits past them are noise.

Intervals are post-processing of the released answer (``DPResult.intervals``): they read
nothing private and cost nothing.
"""

from __future__ import annotations

import logging
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlglot.errors import SqlglotError

from dpsql.answer.table import supported_decimals
from dpsql.errors import DPError
from dpsql.server.values import Rounded, plain
from dpsql.sql.numbers import finite_decimal
from dpsql.sql.parse import parse

log = logging.getLogger("dpsql.server")
ALPHA = 0.05
"""The level of the intervals sent: 95%."""
NO_INTERVAL = "derived, no ±"
"""A cell whose interval cannot be derived soundly (CASE, a divisor that may be 0...)."""


def asks_for_intervals(sql: str) -> bool:
    """Whether ``sql`` carries ``OPTIONS (intervals = true)`` (read after dpsql answered it, so
    the SQL parses and its options are valid).

    >>> asks_for_intervals("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (intervals = true) COUNT(*) FROM t")
    True
    >>> asks_for_intervals("SELECT COUNT(*) FROM t")
    False
    """
    if "intervals" not in sql.lower():  # no parse for the queries that do not say it
        return False
    try:
        option = parse(sql).options.get("intervals")
    except (SqlglotError, DPError):
        return False
    return option is not None and option.value is True


def cells(result) -> dict[str, list[tuple[float, float, float]]]:
    """Per noisy column, per row: (low, high, half-width) of its 95% interval; NaN where the
    column has no ± ("derived, no ±"). Empty if they cannot be had: the answer was charged, and
    goes out without them rather than not at all (DESIGN.md invariant 19)."""
    if result.exact or not result.columns:
        return {}
    try:
        return _cells(result)
    except Exception:
        log.exception("the intervals of an answer could not be derived; it is sent without them")
        return {}


def _cells(result) -> dict[str, list[tuple[float, float, float]]]:
    found = result.cells(ALPHA)
    return {name: [(float(low), float(high), float(half)) for low, high, half in found[name]]
            for name in dict.fromkeys(result.columns) if name in found}  # in the answer's column order


def with_intervals(result, found: dict, released: tuple) -> tuple[tuple, tuple]:
    """(columns, rows) of ``result`` (its rows as sent: ``released``) with ``<column>_low`` and
    ``<column>_high`` after each noisy column (NULL where it has no ±)."""
    columns: list[str] = []
    for name in result.columns:
        columns += [name, f"{name}_low", f"{name}_high"] if name in found else [name]
    whole = {name for position, name in enumerate(result.columns)  # counts: whole-number ends
             if name in found and all(isinstance(row[position], int) for row in released)}
    rows = []
    for index, row in enumerate(released):
        values: list[Any] = []
        for name, value in zip(result.columns, row):
            values.append(value)
            if name in found:
                low, high, _ = found[name][index]
                values += [_end(low, math.floor, name in whole), _end(high, math.ceil, name in whole)]
        rows.append(tuple(values))
    return tuple(columns), tuple(rows)


def notice(result, found: dict) -> str | None:
    """Every row's interval, or ``None`` for an answer with no noisy cell: one line for a column
    whose rows share one symmetric ±, else a table with a row per answer row (its keys, then
    each such column's ``[low, high]``), so psql shows every row's interval however many.

    >>> class Answer:
    ...     columns, rows = ["store", "n", "m"], [("a", 10, 3.0), ("b", 20, 4.5)]
    ...     def __iter__(self): return iter(self.rows)
    ...     def __len__(self): return len(self.rows)
    >>> print(notice(Answer(), {"n": [(-11.5, 31.5, 21.5), (-1.5, 41.5, 21.5)],
    ...                         "m": [(1.04, 3.3, 1.13), (4.1, 4.8, math.nan)]}))
    dpsql: 95% intervals (post-processing, free): n ± 22 in every row;
      by row (asymmetric or varying: use these, not a ±):
      store | m
      a     | [1.0, 3.3]
      b     | [4.10, 4.80]
    """
    if not found:
        return None
    rows = list(result)
    lines, by_row = [], []
    for name, column in found.items():
        if not column:
            continue
        halves = {half for _, _, half in column}
        position = result.columns.index(name)
        symmetric = all(_is_symmetric(row[position], low, high, half)
                        for row, (low, high, half) in zip(rows, column))
        whole = _whole(rows, position)
        if len(halves) == 1 and symmetric and not math.isnan(column[0][2]):
            every = " in every row" if len(column) > 1 else ""
            lines.append(f"{name} ± {_shown(column[0][2], 0.0 if whole else column[0][2], math.ceil)}{every}")
        elif len(column) == 1:
            shown = _interval(*column[0][:2], whole=whole)
            lines.append(f"{name}{':' if shown == NO_INTERVAL else ''} {shown}")
        else:
            by_row.append(name)
    if by_row:
        lines.append("by row (asymmetric or varying: use these, not a ±):\n" + _row_table(result, rows, found, by_row))
    return "dpsql: 95% intervals (post-processing, free): " + ";\n  ".join(lines) if lines else None


def _row_table(result, rows: list, found: dict, names: list[str]) -> str:
    """The rows' keys (the answer's columns without a ±; the row's number if it has none) and
    the intervals of ``names``, as an aligned table indented under the notice."""
    keys = [(position, name) for position, name in enumerate(result.columns) if name not in found]
    header = [name for _, name in keys] or ["row"]
    table = [[_key(row[position]) for position, _ in keys] or [str(index + 1)] for index, row in enumerate(rows)]
    for name in names:
        header.append(name)
        whole = _whole(rows, result.columns.index(name))
        for cells, (low, high, _) in zip(table, found[name]):
            cells.append(_interval(low, high, whole=whole))
    widths = [max(len(text) for text in column) for column in zip(header, *table)]
    return "\n".join("  " + " | ".join(f"{text:<{width}}" for text, width in zip(line, widths)).rstrip()
                     for line in (header, *table))


def _key(value: Any) -> str:
    return "NULL" if value is None else str(value)


def rounded_rows(result, found: dict) -> tuple[tuple, ...]:
    """The released rows as sent: each noisy value that is not a whole number to the digits its ±
    supports (``supported_decimals``, as the shell shows it), to 6 significant digits where it has
    no ± ("derived, no ±"); keys, counts and exact answers as released.

    >>> class Answer:
    ...     columns, rows = ["store", "n", "m"], [("a", 10, 31.2873), ("b", 20, 4.5049)]
    ...     def __iter__(self): return iter(self.rows)
    >>> from dpsql.server.values import text_value
    >>> [[text_value(v) for v in row] for row in rounded_rows(Answer(), {"n": [(0, 22, 11.0), (9, 31, 11.0)],
    ...                                                                  "m": [(19, 43, 12.3), (4, 5, math.nan)]})]
    [[b'a', b'10', b'31'], [b'b', b'20', b'4.5049']]
    """
    noisy = {position: found[name] for position, name in enumerate(result.columns) if name in found}
    return tuple(tuple(_rounded_value(value, noisy[position][index][2]) if position in noisy else value
                       for position, value in enumerate(row)) for index, row in enumerate(result))


def rounded_ends(found: dict) -> dict:
    """``found`` with each interval's ends rounded outward to the digits its ± supports: what the
    ``<column>_low``/``_high`` columns and ``dpsql_cost`` send (the interval only widens).

    >>> rounded_ends({"m": [(19.04, 43.61, 12.3), (0.123, 0.9, 0.35), (1.0, 2.0, math.nan)]})
    {'m': [(19.0, 44.0, 12.3), (0.12, 0.9, 0.35), (1.0, 2.0, nan)]}
    """
    return {name: [(_outward(low, half, math.floor), _outward(high, half, math.ceil), half)
                   for low, high, half in column] for name, column in found.items()}


LARGEST_ROUNDED = 1e15
"""Past this a float's whole digits are all it has: sent as released."""


def _rounded_value(value: Any, half: float) -> Any:
    value = plain(value)
    if not isinstance(value, float) or not math.isfinite(value) or abs(value) >= LARGEST_ROUNDED:
        return value  # keys, counts (whole numbers), NULL, NaN
    if math.isnan(half):
        text = f"{value:.6g}"
        return Rounded(float(text), text)
    if not (math.isfinite(half) and half > 0):
        return value
    decimals = supported_decimals(half)
    text = f"{value:.{decimals}f}"
    if float(text) == 0:  # not "-0"
        text = f"{0.0:.{decimals}f}"
    return Rounded(float(text), text)


def _outward(end: float, half: float, rounding) -> float:
    if not (math.isfinite(end) and math.isfinite(half) and half > 0) or abs(end) >= LARGEST_ROUNDED:
        return end
    decimals = supported_decimals(half)
    scale = 10**decimals
    moved = rounding(round(end * scale, 6)) / scale  # 4.1 * 100 is 409.99999...
    return Rounded(moved, f"{moved:.{decimals}f}")


def detail(found: dict) -> dict:
    """Every row's interval, for ``dpsql_cost``: {column: [[low, high] or null, ...]}."""
    return {name: [None if math.isnan(low) or math.isnan(high) else [low, high] for low, high, _ in column]
            for name, column in found.items()}


def largest_half_widths(found: dict) -> dict:
    """Each column's largest half-width, null if a row has none or there is no row: what
    ``DPResult.accuracy`` gives, from the cells already derived (``dpsql_cost``'s ``halfwidth95``).

    >>> largest_half_widths({"n": [(0, 2, 1.0), (1, 5, 2.0)], "m": [(0, 1, math.nan)], "k": []})
    {'n': 2.0, 'm': None, 'k': None}
    """
    return {name: None if not column or any(math.isnan(half) for _, _, half in column)
            else max(half for _, _, half in column) for name, column in found.items()}


def half_widths(found: dict) -> dict:
    """Every row's half-width, for ``dpsql_cost``: {column: [half-width or null, ...]}
    (``DPResult.accuracy_df``; a quantile's is its conservative 95% figure)."""
    return {name: [None if math.isnan(half) else half for _, _, half in column] for name, column in found.items()}


def exact_text(value: Fraction) -> str:
    """A privacy amount as an exact decimal when it has one, else as a fraction.

    >>> exact_text(Fraction(3, 5)), exact_text(Fraction(1, 10**7)), exact_text(Fraction(1, 3)), exact_text(Fraction(2))
    ('0.6', '0.0000001', '1/3', '2')
    """
    decimal = finite_decimal(value)
    return f"{value.numerator}/{value.denominator}" if decimal is None else format(decimal, "f")


def _interval(low: float, high: float, *, whole: bool = False) -> str:
    """``[low, high]`` rounded outward: to two significant digits of its half-width, or to whole
    numbers for a column of whole numbers (a COUNT's, however wide: ``[0, 15]`` as ``[0, 31]``)."""
    if math.isnan(low) or math.isnan(high):
        return NO_INTERVAL
    width = 0.0 if whole else (high - low) / 2
    return f"[{_shown(low, width, math.floor)}, {_shown(high, width, math.ceil)}]"


def _whole(rows: list, position: int) -> bool:
    """Whether every released value of the column at ``position`` is a whole number (an int)."""
    return all(isinstance(row[position], int) and not isinstance(row[position], bool) for row in rows)


def _shown(value: float, width: float, rounding) -> str:
    """``value`` to two significant digits of ``width``, rounded outward (``rounding``)."""
    if not math.isfinite(value):
        return str(value)
    decimals = 0 if not width > 0 else min(6, max(0, 1 - math.floor(math.log10(width))))
    scale = 10**decimals
    return f"{rounding(round(value * scale, 6)) / scale:,.{decimals}f}"  # 4.1 * 100 is 409.99999...


def _is_symmetric(value: Any, low: float, high: float, half: float) -> bool:
    if not isinstance(value, (int, float, Decimal)) or isinstance(value, bool) or math.isnan(half):
        return False
    value = float(value)
    return math.isclose(high - value, half, rel_tol=1e-9, abs_tol=1e-9 * max(1.0, abs(value))) \
        and math.isclose(value - low, half, rel_tol=1e-9, abs_tol=1e-9 * max(1.0, abs(value)))


def _end(value: float, rounding, whole: bool) -> float | int | None:
    """An interval's end as sent: NULL for none; for a whole-number column, the whole number
    outward of it (ends rounded outward by a last bit, 557.9999999999999, read as 558).

    >>> _end(557.9999999999999, math.floor, True), _end(1756.0000000000002, math.ceil, True)
    (558, 1756)
    >>> _end(2.5, math.ceil, False), _end(math.nan, math.ceil, False)
    (2.5, None)
    """
    if value is None or math.isnan(value):
        return None
    return int(rounding(round(value, 6))) if whole and math.isfinite(value) else value
