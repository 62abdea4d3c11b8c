"""The policy fragment ``dpsql suggest`` prints, with each trade-off stated.

Only what suggest vouches for is written as policy: its limits, and the BOUNDS of the columns
``dpsql.curator.suggest_coverage`` vouches for. Everything else is a comment: what each limit does to
each aggregate (``dpsql.curator.suggest_limits``), partition selection's threshold under the limits,
and a WARNING for each estimate that cannot be trusted, bounds not vouched for among them.
Every number is the suggestion's (a charged DP release) or the policy's: post-processing.
"""

from __future__ import annotations

from dpsql.curator.suggest import DEFAULT_COVERAGE, ROWS_QUANTILE, shown
from dpsql.curator.suggest_coverage import VOUCHED_OUTSIDE
from dpsql.curator.suggest_limits import groups_limit_note, rows_limit_note


def suggestion_text(table: str, unit: str | None, suggestion: dict, epsilon) -> str:
    """The policy fragment for ``suggestion`` (``dpsql.curator.suggest.run_suggestion``'s dict).

    >>> print(suggestion_text("t", "uid", {"max_rows_per_unit": 8, "bounds": {"x": None, "y": (0, 10)},
    ...     "estimated_bounds": {"x": (-4, 4), "y": (0, 10)}, "coverage": {"y": {"outside": 0.031}},
    ...     "epsilon_split": {"max_rows_per_unit": 0.45, "each_column": 0.225, "units": 0.1}}, 1))
    ... # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    -- suggested by DP from t at epsilon 1 (0.1 for the number of units, 0.45 for MAX ROWS PER UNIT, 0.225 for
    each column's bounds); merge into your policy
    PRIVATE TABLE t (
        PRIVACY UNIT uid,
        MAX ROWS PER UNIT 8,
        y BOUNDS 0 TO 10
    );
    -- MAX ROWS PER UNIT 8: about 95% of units have at most 8 rows and keep them all (the rest lose rows:
    answers are lowered); noise of COUNT, SUM, AVG, VARIANCE and quantiles grows ∝ k = 8 ...
    -- y BOUNDS 0 TO 10 (epsilon 0.225): the bins holding the middle 98% of units' values; at most 3.1% of
    units' values lie outside them (95% confidence; suggest vouches for up to 5%); SUM noise grows ∝
    max(|lo|, |hi|), AVG's ∝ hi - lo
    """
    split = suggestion["epsilon_split"]
    k = suggestion["max_rows_per_unit"]
    lines = [f"-- suggested by DP from {table} at epsilon {shown(epsilon)} "
             f"({_describe_split(split)}); merge into your policy"]
    if suggestion.get("units") is not None:
        counted = "rows (each its own unit)" if unit is None else f"units ({unit} values)"
        lines.append(f"-- {table} has about {suggestion['units']:,} ± {suggestion['units_halfwidth']:,} {counted} "
                     f"(DP estimate, 95%)")
    lines.append(f"PRIVATE TABLE {table} (")
    items = ["    PRIVACY UNIT ROW" if unit is None else f"    PRIVACY UNIT {unit}"]
    if unit is not None:
        items.append(f"    MAX ROWS PER UNIT {k}")
    groups = suggestion.get("max_groups_per_unit")
    if groups is not None:
        items.append(f"    MAX GROUPS PER UNIT {groups}")
    vouched = {column: pair for column, pair in suggestion["bounds"].items() if pair is not None}
    items += [f"    {column} BOUNDS {shown(lo)} TO {shown(hi)}" for column, (lo, hi) in vouched.items()]
    lines += [",\n".join(items), ");"]
    if unit is not None:
        lines.append(f"-- MAX ROWS PER UNIT {k}: about {float(ROWS_QUANTILE):.0%} of units have at most {k} rows "
                     f"and keep them all (the rest lose rows: answers are lowered); {rows_limit_note(k, unit)}")
    if groups is not None and unit is not None:
        lines.append(f"-- MAX GROUPS PER UNIT {groups}: about {float(ROWS_QUANTILE):.0%} of units have at most "
                     f"{groups} values of {suggestion.get('group_by')} (the rest lose groups: answers are lowered); "
                     f"{groups_limit_note(groups, k, unit)}")
    lines += [f"-- {note}" for note in suggestion.get("notes", ())]
    each = shown(split["each_column"]) if split.get("each_column") else None
    estimated = suggestion.get("estimated_bounds", suggestion["bounds"])
    coverage = suggestion.get("coverage", {})
    for column, pair in estimated.items():
        if pair is None:
            lines.append(f"-- {column}: no bounds: too few units for any value range to stand out of the noise "
                         f"at epsilon {each} (spend more epsilon, or choose them from public knowledge)")
        elif column in vouched:
            lo, hi = vouched[column]
            judged = coverage.get(column, {})
            outside = judged.get("outside")
            share = "" if outside is None else (
                f"; at most {outside:.1%} of units' values lie outside them (95% confidence; suggest vouches for "
                f"up to {float(VOUCHED_OUTSIDE):.0%})")
            what = (f"widened from its DP estimate {shown(pair[0])} to {shown(pair[1])} (the bins holding the middle "
                    f"{float(DEFAULT_COVERAGE):.0%} of units' values) to the narrowest bounds suggest can vouch for"
                    if judged.get("widened") else
                    f"the bins holding the middle {float(DEFAULT_COVERAGE):.0%} of units' values")
            lines.append(f"-- {column} BOUNDS {shown(lo)} TO {shown(hi)} (epsilon {each}): {what}{share}; SUM noise "
                         f"grows ∝ max(|lo|, |hi|), AVG's ∝ hi - lo")
    lines += [f"-- WARNING {warning}" for warning in suggestion.get("warnings", ())]
    return "\n".join(lines) + "\n"


def _describe_split(split: dict) -> str:
    parts = []
    if split.get("units"):
        parts.append(f"{shown(split['units'])} for the number of units")
    if split.get("max_rows_per_unit"):
        parts.append(f"{shown(split['max_rows_per_unit'])} for MAX ROWS PER UNIT")
    if split.get("max_groups_per_unit"):
        parts.append(f"{shown(split['max_groups_per_unit'])} for MAX GROUPS PER UNIT")
    if split.get("each_column"):
        parts.append(f"{shown(split['each_column'])} for each column's bounds")
    return ", ".join(parts)
