"""Rows a public KEYS domain releases that may be noise alone (issue 23, item 4).

With public keys every key of the domain is released, rows or not: ``origin KEYS FROM
airports.faa`` answers 1,440 airports for the 3 that flights leave from. A key without rows
shows only its noise, and an ORDER BY ... LIMIT over noisy values then picks the loudest noise.
The answer says so: a row is "within its ± of 0" when the 95% interval of each of its counts
and sums holds 0 (nothing tells it from a key without rows). Read from released values and
their intervals only: post-processing, free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dpsql.analysis.plan import Plan, PrivateQuery

COUNTED = ("count", "count_distinct", "count_units", "sum")
"""Aggregates whose value is 0 for a key without rows: the ones that tell such keys apart."""

Cells = Callable[[float], dict[str, list[tuple[float, float, float]]]]


def noise_rows_notes(plan: Plan, checked: PrivateQuery, rows: Sequence[tuple], cells: Cells) -> list[str]:
    """The notes on an answer's rows within their ± of 0 (module docstring): [] when its keys
    are not a public domain, it has no count or sum, or no such row.

    >>> import sqlglot
    >>> from types import SimpleNamespace as S
    >>> plan = S(selection=None, query=S(keys=("origin",)), aggregates=[S(name="a0", function="count")])
    >>> checked = S(direct=(("n", "a0"),), post=sqlglot.parse_one("SELECT g0, a0 AS n FROM dp_core"))
    >>> cells = lambda alpha: {"n": [(0.0, 40.0, 20.0)] * 3 + [(980.0, 1020.0, 20.0)]}
    >>> print(noise_rows_notes(plan, checked, [("A", 3)] * 3 + [("JFK", 1000)], cells)[0])
    ... # doctest: +NORMALIZE_WHITESPACE
    3 of 4 rows are within their ± of 0 (n's 95% interval holds 0): a public KEYS domain releases
    every key, rows or not, so these may be noise alone.
    """
    if plan.selection is not None or not plan.query.keys or not rows:
        return []
    functions = {aggregate.name: aggregate.function for aggregate in plan.aggregates}
    counted = [output for output, aggregate in checked.direct if functions.get(aggregate) in COUNTED]
    if not counted:
        return []
    intervals = cells(0.05)
    if any(name not in intervals for name in counted):
        return []
    near = sum(all(_holds_zero(intervals[name][index]) for name in counted) for index in range(len(rows)))
    which = " and ".join(dict.fromkeys(counted))
    holds = f"({which}'s 95% interval holds 0)" if len(counted) == 1 else f"(the 95% intervals of {which} hold 0)"
    ordered = checked.post.args.get("order") is not None and checked.post.args.get("limit") is not None
    if ordered and near:
        shown = (f"{near:,} of the {len(rows):,} rows shown are within their ± of 0" if near > 1 else
                 f"one of the {len(rows):,} rows shown is within its ± of 0" if len(rows) > 1 else
                 "the row shown is within its ± of 0")
        return [f"ORDER BY ... LIMIT chose among noisy values, and {shown} {holds}: noise may have picked "
                f"{'them' if near > 1 else 'it'}. Rank keys known to have rows (filter the domain with WHERE), "
                "or group by private keys, which pass partition selection."]
    if near:
        if near == 1:
            return [f"One row of {len(rows):,} is within its ± of 0 {holds}: a public KEYS domain releases "
                    "every key, rows or not, so it may be noise alone."]
        return [f"{near:,} of {len(rows):,} rows are within their ± of 0 {holds}: a public KEYS domain "
                "releases every key, rows or not, so these may be noise alone."]
    return []


def _holds_zero(cell: tuple[float, float, float]) -> bool:
    low, high, _ = cell
    return not (math.isnan(low) or math.isnan(high)) and low <= 0 <= high


__all__ = ["noise_rows_notes"]
