"""Notes on an answer: why partition selection left it thin, and what would lower the bar; and
which way the contribution limits can move each aggregate (the limits line's last part).

A private GROUP BY key is released only when its noisy count of distinct units reaches the
selection threshold (``dpsql.mechanisms.selection``). With the policy's defaults that threshold can be
hundreds or thousands of units, and an answer with no rows says nothing about why. So when an
answer that went through partition selection has fewer than ``FEW_ROWS`` rows, it carries a
note: the threshold a key needed, and that threshold recomputed with one unit counted in one
group only, with twice the epsilon, and with ten times the delta. When post-processing can
remove rows too (HAVING, or DISTINCT merging rows), the note names both steps and does not
claim that the threshold removed them: which step removed a key is not released.

Privacy. Every number in a note is a function of the plan (the policy, the query and the
epsilon and delta asked for: all public) and of the number of rows released (post-processing
of the DP release), and of the query's post-processing clauses (public). Nothing depends on
how many candidate keys there were or were dropped, nor on how many partition selection
dropped rather than HAVING: the note is the same whatever the data, given the released answer.

An output computed from noisy values (``SUM(x) / COUNT(*)``) is NULL where a step had no value:
a division by a noisy 0 (``dpsql.analysis.aggregates.null_on_zero_divisors``), or a step made
total with TRY. ``null_cells_notes`` says how many rows and why, from the released rows and the
query's text only.

The limits line (``dpsql.query.limits.Limits``) says, per aggregate, which way the limits can move it
(``limit_effects``): a count only down, a sum of values ≥ 0 down by the rows dropped, an average
or a quantile either way. That is a fact of the plan alone (the aggregate, its bounds, whether
rows can be dropped): it costs nothing and reads no data.
"""

from __future__ import annotations

import math
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.plan import aggregates_of
from dpsql.mechanisms.selection import SelectionRule, release_probability, selection_rule

__all__ = ["FEW_ROWS", "effects_text", "interval_notes", "limit_effects", "null_cells_notes", "selection_text",
           "thin_answer_notes"]

FEW_ROWS = 5
"""An answer through partition selection with fewer rows than this carries a note."""
LIKELY = 0.95
"""The release probability ``selection_text`` names a count for."""


def selection_text(plan, ahead: bool = False) -> str:
    """What partition selection leaves out, in the unit's own terms: the threshold a key's count
    of distinct units had to reach with its noise, the count at which a key is released with
    probability ``LIKELY``, and the selection's epsilon and delta. Plan values only (the policy,
    the query and its options): never which keys were left out, nor how many. ``""`` when the
    keys are public (no selection). ``ahead``: said before the query runs (EXPLAIN), in the present.

    >>> from types import SimpleNamespace as S
    >>> rule = selection_rule(Fraction(1, 4), Fraction(1, 10**6), groups_per_unit=40, neighbours="unbounded")
    >>> plan = S(selection=S(epsilon=rule.epsilon, delta=rule.delta, threshold=rule.threshold, scale=rule.scale),
    ...          neighbours="unbounded", query=S(rule=S(unit="tailnum", groups_per_unit=40)))
    >>> print(selection_text(plan))  # doctest: +NORMALIZE_WHITESPACE
    The GROUP BY keys are private: a key was released only where its count of distinct tailnum values
    plus noise reached 2,692 (partition selection at epsilon 0.25, delta 1e-06), so keys with fewer
    than about 2,692 tailnum values are left out, and the answer does not say which (a key with 3,060
    or more is released with 95% probability; each tailnum counts in at most 40 groups).
    >>> selection_text(S(selection=None))
    ''
    """
    selection = plan.selection
    if selection is None:
        return ""
    rule = plan.query.rule
    unit = f"{rule.unit} values" if rule.unit else "rows (each row is its own unit)"
    few = f"{rule.unit} values" if rule.unit else "rows"
    likely = _likely_count(SelectionRule(selection.scale, selection.threshold, selection.epsilon, selection.delta,
                                         rule.groups_per_unit, plan.neighbours))
    counted = f"; each {rule.unit} counts in at most {rule.groups_per_unit} group" \
        f"{'' if rule.groups_per_unit == 1 else 's'}" if rule.unit else ""
    was, reached = ("is", "reaches") if ahead else ("was", "reached")
    return (f"The GROUP BY keys are private: a key {was} released only where its count of distinct {unit} plus "
            f"noise {reached} {selection.threshold:,} (partition selection at epsilon {_number(selection.epsilon)}, "
            f"delta {_number(selection.delta)}), so keys with fewer than about {selection.threshold:,} {few} are "
            f"left out, and the answer does not say which (a key with {likely:,} or more is released with "
            f"{LIKELY:.0%} probability{counted}).")


def _likely_count(rule: SelectionRule) -> int:
    """The smallest count of units released with probability at least ``LIKELY``: a plan value."""
    low, high = rule.threshold, rule.threshold + 1
    while release_probability(high, rule) < LIKELY:
        low, high = high, rule.threshold + 2 * (high - rule.threshold)
    while high - low > 1:  # release_probability(low) < LIKELY <= release_probability(high), or low = threshold
        middle = (low + high) // 2
        low, high = (middle, high) if release_probability(middle, rule) < LIKELY else (low, middle)
    return low if release_probability(low, rule) >= LIKELY else high


def thin_answer_notes(plan, released: int, post: exp.Select | None = None) -> list[str]:
    """Notes for an answer of ``released`` rows under ``plan`` (empty when none is due).

    ``plan`` needs ``selection`` (epsilon, delta, threshold), ``neighbours`` and
    ``query.rule`` (``unit``, ``groups_per_unit``); ``None`` selection means public keys.
    ``post``: the query's post-processing over the noisy core (``PrivateQuery.post``), whose
    HAVING (its WHERE) and DISTINCT can remove rows after partition selection.

    >>> from types import SimpleNamespace as S
    >>> rule = selection_rule(Fraction(1, 2), Fraction(1, 10**6), groups_per_unit=5, neighbours="unbounded")
    >>> plan = S(selection=S(epsilon=rule.epsilon, delta=rule.delta, threshold=rule.threshold),
    ...          epsilon=Fraction(1, 2), delta=Fraction(1, 10**6), neighbours="unbounded",
    ...          query=S(rule=S(unit="user_id", groups_per_unit=5)))
    >>> print(thin_answer_notes(plan, 0)[0])  # doctest: +NORMALIZE_WHITESPACE
    No rows were released: the GROUP BY keys are private, so a key is released only when its count of distinct
    user_id values plus noise reaches 149 (partition selection).
    >>> print(thin_answer_notes(plan, 0)[1])  # doctest: +NORMALIZE_WHITESPACE
    To lower that threshold: count each user_id in 1 group (MAX GROUPS PER UNIT 1 in the policy, or OPTIONS
    (max_groups_contributed = 1)): 28; twice the epsilon (1): 76; ten times the delta (1e-05): 126; or declare
    the keys public (KEYS FROM a public table, or KEYS (...) in the policy): every key is then released, with no
    threshold.
    >>> import sqlglot
    >>> print(thin_answer_notes(plan, 0, sqlglot.parse_one("SELECT g0 FROM dp_core WHERE a0 > 100"))[0])
    ... # doctest: +NORMALIZE_WHITESPACE
    No rows were released: the GROUP BY keys are private, so a key passes partition selection only when its
    count of distinct user_id values plus noise reaches 149, and HAVING then keeps only the rows whose noisy
    values satisfy it. Either step can leave out rows; the answer does not say which did.
    >>> thin_answer_notes(plan, 7), thin_answer_notes(S(selection=None), 0)
    ([], [])
    """
    selection = plan.selection
    if selection is None or released >= FEW_ROWS:
        return []
    rule = plan.query.rule
    unit = f"{rule.unit} values" if rule.unit else "rows (each row is its own unit)"
    groups = rule.groups_per_unit

    def threshold(epsilon: Fraction, delta: Fraction, groups_per_unit: int) -> int:
        return selection_rule(epsilon, delta, groups_per_unit, plan.neighbours).threshold

    shown = "No rows were" if released == 0 else f"Only {released} row{'s were' if released > 1 else ' was'}"
    after = _steps_after_selection(post)
    if after:
        notes = [f"{shown} released: the GROUP BY keys are private, so a key passes partition selection only "
                 f"when its count of distinct {unit} plus noise reaches {selection.threshold}, and "
                 f"{' and '.join(after)}. Either step can leave out rows; the answer does not say which did."]
    else:
        notes = [f"{shown} released: the GROUP BY keys are private, so a key is released only when its count "
                 f"of distinct {unit} plus noise reaches {selection.threshold} (partition selection)."]
    # The selection's share of the query's epsilon and delta is a fixed fraction of them
    # (dpsql.analysis.analyse), so doubling the query's epsilon doubles the selection's.
    ways = []
    if groups > 1:
        unit_name = rule.unit or "unit"
        ways.append(f"count each {unit_name} in 1 group (MAX GROUPS PER UNIT 1 in the policy, or OPTIONS "
                    f"(max_groups_contributed = 1)): {threshold(selection.epsilon, selection.delta, 1)}")
    ways.append(f"twice the epsilon ({_number(2 * plan.epsilon)}): "
                f"{threshold(2 * selection.epsilon, selection.delta, groups)}")
    if 10 * selection.delta < 1 and 10 * plan.delta < 1:
        ways.append(f"ten times the delta ({_number(10 * plan.delta)}): "
                    f"{threshold(selection.epsilon, 10 * selection.delta, groups)}")
    ways.append("or declare the keys public (KEYS FROM a public table, or KEYS (...) in the policy): every "
                "key is then released, with no threshold")
    notes.append("To lower that threshold: " + "; ".join(ways) + ".")
    return notes


def _steps_after_selection(post: exp.Select | None) -> list[str]:
    """What the post-processing does that can leave fewer rows than partition selection kept."""
    if post is None:
        return []
    steps = []
    if post.args.get("where") is not None:
        steps.append("HAVING then keeps only the rows whose noisy values satisfy it")
    if post.args.get("distinct") is not None:
        steps.append("DISTINCT then merges rows that are equal")
    return steps


def _number(value: Fraction) -> str:
    return f"{float(value):.6g}"


# -- which way the limits move each aggregate (the limits line, ``dpsql.query.limits.Limits``) ---------

EFFECTS = {
    "lower": "they can only lower {}",
    "raise": "they can only raise {}",
    "either": "they can move {} either way",
    "lower_clamped": "dropped rows lower {}, clamping can move {} either way",
    "raise_clamped": "dropped rows raise {}, clamping can move {} either way",
}
"""How the limits can move an aggregate, and how the limits line says it."""

_COUNTS = ("count", "count_units", "count_distinct")


def limit_effects(plan, drops: bool) -> tuple[tuple[str, str], ...]:
    """(aggregate as written, effect) for each aggregate of ``plan`` the limits can move, the
    effect a key of ``EFFECTS``; ``drops``: whether the limits can drop rows (not when each
    row is its own unit, read alone). Public facts of the plan only.

    Dropping rows can only lower a count, and a sum whose values are all ≥ 0 (raise one whose
    values are all ≤ 0); clamping a value into its bounds moves it down from above the upper
    bound and up from below the lower one, so a clamped sum can move either way, and a count
    not at all (clamping keeps NULL: COUNT(x) counts the same rows). An average, a variance or
    a quantile of what is left can move either way.

    >>> from types import SimpleNamespace as S
    >>> counted, summed = S(clamped_columns=(), lower=0, upper=1), S(clamped_columns=("x",), lower=0, upper=9)
    >>> plan = S(query=S(aggregates=(S(name="a0", label="COUNT(*)"), S(name="a1", label="SUM(x)"),
    ...                              S(name="a2", label="AVG(x)"))),
    ...          aggregates=(S(name="a0", function="count", measures=("m0",)),
    ...                      S(name="a1", function="sum", measures=("m1",)),
    ...                      S(name="a2", function="avg", measures=("m1", "m0"))),
    ...          measure={"m0": counted, "m1": summed}.get)
    >>> limit_effects(plan, True)
    (('COUNT(*)', 'lower'), ('SUM(x)', 'lower_clamped'), ('AVG(x)', 'either'))
    >>> limit_effects(plan, False)
    (('SUM(x)', 'either'), ('AVG(x)', 'either'))
    """
    labels = {aggregate.name: aggregate.label for aggregate in plan.query.aggregates}
    effects = []
    for release in plan.aggregates:
        measures = [plan.measure(name) for name in release.measures]
        clamped = any(measure.clamped_columns for measure in measures)
        if release.function in _COUNTS:
            effect = "lower" if drops or clamped else None
        elif release.function == "sum" and measures[0].lower >= 0:
            effect = ("lower_clamped" if drops else "either") if clamped else ("lower" if drops else None)
        elif release.function == "sum" and measures[0].upper <= 0:
            effect = ("raise_clamped" if drops else "either") if clamped else ("raise" if drops else None)
        else:
            effect = "either" if drops or clamped else None
        if effect is not None:
            effects.append((labels.get(release.name, release.name), effect))
    return tuple(effects)


def effects_text(effects: tuple[tuple[str, str], ...]) -> str:
    """The limits line's last part: which way the limits can move each aggregate ('' for none).

    >>> print(effects_text((("COUNT(*)", "lower"), ("SUM(x)", "lower_clamped"), ("AVG(x)", "either"),
    ...                     ("MEDIAN(x)", "either"))))  # doctest: +NORMALIZE_WHITESPACE
    not in the ±: they can only lower COUNT(*); dropped rows lower SUM(x), clamping can move it either way;
    they can move AVG(x) and MEDIAN(x) either way
    """
    grouped: dict[str, list[str]] = {}
    for label, effect in effects:
        if label not in grouped.setdefault(effect, []):
            grouped[effect].append(label)
    if not grouped:
        return ""
    parts = []
    for effect, labels in grouped.items():
        named = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + f" and {labels[-1]}"
        if effect.endswith("_clamped"):
            parts.append(EFFECTS[effect].format(named, "it" if len(labels) == 1 else "them"))
        else:
            parts.append(EFFECTS[effect].format(named))
    return "not in the ±: " + "; ".join(parts)


def null_cells_notes(outputs: tuple[str, ...] | list[str], post: exp.Select, rows: list[tuple]) -> list[str]:
    """A note per output computed from noisy values that is NULL in some released ``rows``.

    >>> import sqlglot
    >>> post = sqlglot.parse_one("SELECT g0 AS store, a0 / a1 AS r, a1 AS n FROM dp_core", read="duckdb")
    >>> print(null_cells_notes(["store", "r", "n"], post, [(None, None, 0), ("b", 2.5, 4)])[0])
    ... # doctest: +NORMALIZE_WHITESPACE
    r is NULL in 1 of 2 rows: its divisor, computed from noisy values, came out 0 there (a
    division by zero gives NULL, never ±inf), or another step could not be computed (as under TRY).
    """
    notes = []
    for position, (name, item) in enumerate(zip(outputs, post.expressions)):
        node = item.unalias()
        if isinstance(node, exp.Column) or not aggregates_of(node):
            continue  # a released aggregate as it is, or keys only: never NULL for this reason
        empty = sum(row[position] is None for row in rows)
        if not empty:
            continue
        where = f"in {empty:,} of {len(rows):,} rows" if len(rows) > 1 else "in the row shown"
        if node.find(exp.Div, exp.Mod) is not None:
            why = ("its divisor, computed from noisy values, came out 0 there (a division by zero gives NULL, "
                   "never ±inf), or another step could not be computed (as under TRY)")
        else:
            why = "a step on noisy values could not be computed there (such as a cast out of range), as under TRY"
        notes.append(f"{name} is NULL {where}: {why}.")
    return notes


# -- values the noise left undefined, clamped or uninformative (issue 37) ----------------------

UNDEFINED = {
    "corr": "its noisy count of pairs or one of its noisy variances came out ≤ 0, so the correlation is "
            "undefined at this ε",
    "regr_slope": "its noisy count of pairs or the noisy variance of x came out ≤ 0, so the slope is undefined "
                  "at this ε",
    "regr_intercept": "its noisy count of pairs or the noisy variance of x came out ≤ 0, so the line is "
                      "undefined at this ε",
    "regr_r2": "its noisy count of pairs or the noisy variance of x came out ≤ 0, so R² is undefined at this ε",
    "covar": "its noisy count of pairs came out ≤ 0 (≤ 1 for COVAR_SAMP), so the covariance is undefined at "
             "this ε",
}
"""Per function, why its value is NaN (what its family releases as NaN)."""
EDGES = {
    "corr": ((-1.0, 1.0), "exactly ±1", "the noisy covariance came out larger than the noisy variances allow, "
             "so the value was clamped to [-1, 1]"),
    "regr_r2": ((1.0,), "exactly 1", "the noisy variance of y came out ≤ 0, or the noisy covariance larger "
                "than the noisy variances allow, so the value was clamped to 1"),
    "variance": ((0.0,), "exactly 0", "the noisy variance came out ≤ 0 and was clamped to 0"),
    "stddev": ((0.0,), "exactly 0", "the noisy variance came out ≤ 0 and was clamped to 0"),
    "avg": ((), "", ""),
}
"""Per function: the values its release clamps to, how to say them, and why it happens."""
UNINFORMATIVE = "uninformative: raise ε or narrow the bounds"


def interval_notes(plan, checked, rows: list[tuple], cells) -> list[str]:
    """Notes on released aggregates shown as they are (``checked.direct``) whose value is NaN or
    at a clamp (CORR ±1, STDDEV 0) — saying why — and on those whose 95% interval spans the whole
    range the policy allows, or has no finite end ("uninformative: raise ε or narrow the bounds").
    From the plan, the released rows and their intervals (``cells(alpha)``: per output, per row,
    (low, high, half-width)) only: post-processing, free.

    >>> from types import SimpleNamespace as S
    >>> from fractions import Fraction
    >>> plan = S(aggregates=[S(name="a0", function="corr", measures=())], measure=None)
    >>> checked = S(direct=(("c", "a0"),), outputs=("c",))
    >>> cells = lambda alpha: {"c": [(-1.0, 1.0, 1.0), (0.2, 1.0, 0.8)]}
    >>> for note in interval_notes(plan, checked, [(float("nan"),), (1.0,)], cells):
    ...     print(note)  # doctest: +NORMALIZE_WHITESPACE
    c is NaN in 1 of 2 rows: its noisy count of pairs or one of its noisy variances came out ≤ 0, so the
    correlation is undefined at this ε.
    c is exactly ±1 in 1 of 2 rows: the noisy covariance came out larger than the noisy variances allow, so
    the value was clamped to [-1, 1]; its interval says where the truth can be.
    c's 95% interval spans all it can be ([-1, 1]) in 1 of 2 rows: uninformative: raise ε or narrow the bounds.
    """
    from dpsql.analysis.aggregates import family_of  # noqa: PLC0415 - the answer wing reads families lazily

    aggregates = {aggregate.name: aggregate for aggregate in plan.aggregates}
    intervals = None
    notes = []
    for output, name in checked.direct:
        aggregate = aggregates.get(name)
        if aggregate is None or aggregate.function not in UNDEFINED and aggregate.function not in EDGES:
            continue
        position = checked.outputs.index(output)
        values = [_float(row[position]) for row in rows]
        undefined = sum(math.isnan(v) for v in values)
        if undefined and aggregate.function in UNDEFINED:
            notes.append(f"{output} is NaN {_where(undefined, len(rows))}: {UNDEFINED[aggregate.function]}.")
        edges, said, why = EDGES.get(aggregate.function, ((), "", ""))
        clamped = sum(v in edges for v in values)
        if clamped:
            notes.append(f"{output} is {said} {_where(clamped, len(rows))}: {why}; its interval says where the "
                         "truth can be.")
        intervals = intervals if intervals is not None else cells(0.05)
        spans = intervals.get(output)
        if spans is None:
            continue
        measures = [plan.measure(m) for m in aggregate.measures] if plan.measure is not None else []
        floor, ceiling = family_of(aggregate).possible(aggregate, measures) if measures else (-1.0, 1.0)
        whole = sum(_spans_all(low, high, floor, ceiling) for low, high, _ in spans)
        if whole:
            shown = (f" ([{_end(floor)}, {_end(ceiling)}])" if math.isfinite(floor) and math.isfinite(ceiling)
                     else "")
            notes.append(f"{output}'s 95% interval spans all it can be{shown} {_where(whole, len(rows))}: "
                         f"{UNINFORMATIVE}.")
    return notes


def _where(count: int, rows: int) -> str:
    return f"in {count:,} of {rows:,} rows" if rows > 1 else "in the row shown"


def _float(value) -> float:
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def _spans_all(low: float, high: float, floor: float, ceiling: float) -> bool:
    """The interval says nothing: it has no finite end, or it covers the whole possible range."""
    if math.isnan(low) or math.isnan(high):
        return True
    return low <= floor and high >= ceiling and math.isfinite(floor) and math.isfinite(ceiling)


def _end(value: float) -> str:
    return f"{value:g}"
