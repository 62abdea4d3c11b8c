"""The policy fragment ``dpsql suggest`` prints, with each trade-off stated.

Only what suggest vouches for is written as policy: its limits, each column's row BOUNDS and
BOUNDS PER UNIT with the share of units each may leave beyond it
(``dpsql.curator.suggest_quantiles``). Everything else is a comment: which numeric columns were
left out and why, what each limit does to each aggregate (``dpsql.curator.suggest_limits``),
partition selection's threshold under the limits, and a WARNING for each estimate that cannot
be trusted. Every number is the suggestion's (a charged DP release) or the policy's:
post-processing.
"""

from __future__ import annotations

from dpsql.curator.suggest import ROWS_QUANTILE, shown
from dpsql.curator.suggest_limits import groups_limit_note, rows_limit_note


def suggestion_text(table: str, unit: str | None, suggestion: dict, epsilon, columns_option: str = "--columns") -> str:
    """The policy fragment for ``suggestion`` (``dpsql.curator.suggest.run_suggestion``'s dict);
    ``columns_option``: how the reader names columns (``--columns`` on the command line).

    >>> print(suggestion_text("t", "uid", {"max_rows_per_unit": 8, "bounds": {"x": None, "y": (0, 10)},
    ...     "unit_bounds": {"x": None, "y": (0, 40)}, "skipped": {"year": "a calendar part"},
    ...     "coverage": {"y": {"lower": {"aimed": 0.01, "at_most": 0.02, "epsilon": 0.1},
    ...                        "upper": {"aimed": 0.03, "at_most": 0.05, "epsilon": 0.1},
    ...                        "unit_lower": {"aimed": 0, "at_most": 0, "epsilon": 0},
    ...                        "unit_upper": {"aimed": 0.01, "at_most": 0.02, "epsilon": 0.2}, "epsilon_for_99": 3}},
    ...     "epsilon_split": {"max_rows_per_unit": 0.15, "each_column": 0.4, "each_bound": 0.1, "units": 0.1}}, 1))
    ... # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    -- suggested by DP from t at epsilon 1 (0.1 for the number of units, 0.15 for MAX ROWS PER UNIT, 0.4 for
    each column's bounds: 0.1 a bound); merge into your policy
    -- measure-like columns bounded: x, y; left out: year (a calendar part); name columns with --columns to choose
    PRIVATE TABLE t (
        PRIVACY UNIT uid,
        MAX ROWS PER UNIT 8,
        y BOUNDS 0 TO 10,
        y BOUNDS PER UNIT 0 TO 40
    );
    -- MAX ROWS PER UNIT 8: about 95% of units have at most 8 rows ...
    -- y BOUNDS 0 TO 10: DP 1st and 97th percentiles of the rows, each unit's rows weighing one unit (at this
    epsilon a draw cannot aim further out: about epsilon 3 on the same request would aim at the 1st and 99th);
    on average at most 2% of a unit's rows lie below and 5% above (95% confidence each; epsilon 0.1 a bound);
    ...
    -- y BOUNDS PER UNIT 0 TO 40: DP 99th percentile of each unit's total of the positive parts of its rows
    clamped into BOUNDS (0 below: every row is ≥ 0); at most 2% of units have a total in some group above it
    (95% confidence); a unit's SUM of y then moves an answer by at most 40 instead of k × max(|lo|, |hi|) = 8 ×
    10 = 80
    <BLANKLINE>
    """
    split = suggestion["epsilon_split"]
    k = suggestion["max_rows_per_unit"]
    lines = [f"-- suggested by DP from {table} at epsilon {shown(epsilon)} "
             f"({_describe_split(split)}); merge into your policy"]
    if suggestion.get("units") is not None:
        counted = "rows (each its own unit)" if unit is None else f"units ({unit} values)"
        lines.append(f"-- {table} has about {suggestion['units']:,} ± {suggestion['units_halfwidth']:,} {counted} "
                     f"(DP estimate, 95%)")
    skipped = suggestion.get("skipped") or {}
    if skipped:
        left_out = ", ".join(f"{column} ({reason})" for column, reason in skipped.items())
        lines.append(f"-- measure-like columns bounded: {', '.join(suggestion['bounds']) or 'none'}; left out: "
                     f"{left_out}; name columns with {columns_option} to choose")
    lines.append(f"PRIVATE TABLE {table} (")
    items = ["    PRIVACY UNIT ROW" if unit is None else f"    PRIVACY UNIT {unit}"]
    if unit is not None:
        items.append(f"    MAX ROWS PER UNIT {k}")
    groups = suggestion.get("max_groups_per_unit")
    if groups is not None:
        items.append(f"    MAX GROUPS PER UNIT {groups}")
    unit_bounds = suggestion.get("unit_bounds") or {}
    for column, pair in suggestion["bounds"].items():
        if pair is None:
            continue
        items.append(f"    {column} BOUNDS {shown(pair[0])} TO {shown(pair[1])}")
        if unit_bounds.get(column) is not None:
            low, high = unit_bounds[column]
            items.append(f"    {column} BOUNDS PER UNIT {shown(low)} TO {shown(high)}")
    lines += [",\n".join(items), ");"]
    if unit is not None:
        lines.append(f"-- MAX ROWS PER UNIT {k}: about {float(ROWS_QUANTILE):.0%} of units have at most {k} rows "
                     f"and keep them all (the rest lose rows: answers are lowered); {rows_limit_note(k, unit)}")
    if groups is not None and unit is not None:
        lines.append(f"-- MAX GROUPS PER UNIT {groups}: about {float(ROWS_QUANTILE):.0%} of units have at most "
                     f"{groups} values of {suggestion.get('group_by')} (the rest lose groups: answers are lowered); "
                     f"{groups_limit_note(groups, k, unit)}")
    lines += [f"-- {note}" for note in suggestion.get("notes", ())]
    for column, pair in suggestion["bounds"].items():
        if pair is None:
            continue
        said = suggestion.get("coverage", {}).get(column, {})
        lines.append(f"-- {_row_line(column, pair, said)}")
        if unit_bounds.get(column) is not None:
            lines.append(f"-- {_unit_line(column, unit_bounds[column], said, pair, k)}")
    lines += [f"-- WARNING {warning}" for warning in suggestion.get("warnings", ())]
    return "\n".join(lines) + "\n"


def _percentile(share: float) -> str:
    """A share as an ordinal percentile: 0.01 -> '1st', 0.053 -> '5.3th'."""
    value = round(share * 100, 1)
    text = f"{value:g}"
    suffix = "st" if text.endswith("1") and not text.endswith("11") else \
        "nd" if text.endswith("2") and not text.endswith("12") else \
        "rd" if text.endswith("3") and not text.endswith("13") else "th"
    return text + suffix


def _share(value: float) -> str:
    return f"{value * 100:.2g}%" if value < 0.1 else f"{value:.0%}"


def _row_line(column: str, pair, said: dict) -> str:
    lower, upper = said.get("lower", {}), said.get("upper", {})
    if not lower.get("epsilon") and not upper.get("epsilon"):
        return (f"{column} BOUNDS {shown(pair[0])} TO {shown(pair[1])}: as the policy declares them (kept, not "
                f"drawn; their share went to the BOUNDS PER UNIT)")
    aims = (f"DP {_percentile(lower.get('aimed', 0))} and {_percentile(1 - upper.get('aimed', 0))} percentiles of "
            f"the rows, each unit's rows weighing one unit")
    aimed = max(lower.get("aimed", 0), upper.get("aimed", 0))
    needed = said.get("epsilon_for_99")
    short = "" if aimed <= 0.0100001 or not needed else \
        (f" (at this epsilon a draw cannot aim further out: about epsilon {needed:.2g} on the same request would "
         f"aim at the 1st and 99th)")
    return (f"{column} BOUNDS {shown(pair[0])} TO {shown(pair[1])}: {aims}{short}; on average at most "
            f"{_share(lower.get('at_most', 0))} of a unit's rows lie below and {_share(upper.get('at_most', 0))} "
            f"above (95% confidence each; epsilon {shown(upper.get('epsilon', 0))} a bound); clamping them biases "
            f"SUM and AVG by what lies beyond")


def _unit_line(column: str, pair, said: dict, row_pair, k: int) -> str:
    low, high = said.get("unit_lower", {}), said.get("unit_upper", {})
    parts = []
    capped = " (drawn at k × max(|lo|, |hi|), the most k kept rows can total: no gain on this side)"
    if high.get("epsilon"):
        parts.append(f"DP {_percentile(1 - high['aimed'])} percentile of each unit's total of the positive parts of "
                     f"its rows clamped into BOUNDS" + (capped if high["at_most"] == 0 else ""))
    if low.get("epsilon"):
        parts.append(f"DP {_percentile(low['aimed'])} percentile of its total of their negative parts"
                     + (capped if low["at_most"] == 0 else ""))
    free = " (0 below: every row is ≥ 0)" if not low.get("epsilon") and high.get("epsilon") else \
        " (0 above: every row is ≤ 0)" if not high.get("epsilon") and low.get("epsilon") else ""
    beyond = []
    if high.get("epsilon"):
        beyond.append(f"at most {_share(high['at_most'])} of units have a total in some group above it")
    if low.get("epsilon"):
        beyond.append(f"at most {_share(low['at_most'])} below it")
    row_bound = max(abs(row_pair[0]), abs(row_pair[1]))
    row_sensitivity = k * row_bound
    unit_sensitivity = max(abs(pair[0]), abs(pair[1]))
    return (f"{column} BOUNDS PER UNIT {shown(pair[0])} TO {shown(pair[1])}: {', and '.join(parts)}{free}; "
            f"{' and '.join(beyond)} (95% confidence); a unit's SUM of {column} then moves an answer by at most "
            f"{shown(unit_sensitivity)} instead of k × max(|lo|, |hi|) = {k} × {shown(row_bound)} = "
            f"{shown(row_sensitivity)}")


def _describe_split(split: dict) -> str:
    parts = []
    if split.get("units"):
        parts.append(f"{shown(split['units'])} for the number of units")
    if split.get("max_rows_per_unit"):
        parts.append(f"{shown(split['max_rows_per_unit'])} for MAX ROWS PER UNIT")
    if split.get("max_groups_per_unit"):
        parts.append(f"{shown(split['max_groups_per_unit'])} for MAX GROUPS PER UNIT")
    if split.get("each_column"):
        each = f": {shown(split['each_bound'])} a bound" if split.get("each_bound") else ""
        parts.append(f"{shown(split['each_column'])} for each column's bounds{each}")
    return ", ".join(parts)
