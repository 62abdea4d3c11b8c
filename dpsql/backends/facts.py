"""Public facts measured on a stored public relation (``Backend.materialise``): one SQL for every
engine, each quoting names its own way. What the analysis measures here is measured on the very
rows the query reads (DESIGN.md invariant 15).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Quote = Callable[[str], str]


def multiplicity_sql(table: str, keys: Sequence[str], quote: Quote) -> str:
    """The most rows of ``table`` sharing one value of ``keys`` (rows with a NULL key never match
    a join, so they are not counted).

    >>> print(multiplicity_sql("p", ["k"], lambda n: f'"{n}"'))
    SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM p WHERE "k" IS NOT NULL GROUP BY "k") AS dp_counts
    """
    listed = ", ".join(quote(k) for k in keys)
    present = " AND ".join(f"{quote(k)} IS NOT NULL" for k in keys)
    return (f"SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM {table} WHERE {present} "
            f"GROUP BY {listed}) AS dp_counts")


def multiplicity(rows: list[tuple]) -> int:
    """``multiplicity_sql``'s answer, at least 1."""
    return max(int(rows[0][0] or 0), 1)


def ranges_sql(table: str, columns: Sequence[str], quote: Quote) -> str:
    """The exact MIN and MAX of each of ``columns`` (``columns`` is not empty)."""
    return f"SELECT {', '.join(f'MIN({quote(c)}), MAX({quote(c)})' for c in columns)} FROM {table}"


def ranges(row: tuple, columns: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """Column -> (min, max) from ``ranges_sql``'s row; a column with no finite extremes (no rows,
    all NULL, NaN or infinite) is left out.

    >>> ranges((1, 5, None, None, float("-inf"), 2.0), ["a", "b", "c"])
    {'a': (1, 5)}
    """
    found = {}
    for index, column in enumerate(columns):
        low, high = row[2 * index], row[2 * index + 1]
        if low is not None and _finite(low) and _finite(high):
            found[column] = (low, high)
    return found


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)
