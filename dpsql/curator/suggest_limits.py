"""What suggested contribution limits do to later answers, as ``dpsql suggest`` states it.

The statements follow the sensitivity rules of ``dpsql.analysis``:

* COUNT, SUM, AVG, VARIANCE/STDDEV and COUNT(DISTINCT x) of a column other than the unit are
  bounded sums of at most k = MAX ROWS PER UNIT rows per unit over all groups together
  (``dpsql.analysis.sensitivity.bounded_sum_sensitivity``: L1 = k·max|bound|, whether grouped
  or not), and a quantile's utility moves by at most k (``dpsql.mechanisms.quantile``): their
  noise grows ∝ k, and MAX GROUPS PER UNIT l does not change it.
* COUNT(DISTINCT unit) counts a unit once in each group it keeps rows in, at most
  min(l, k) of them (``distinct_units_sensitivity``): grouped, its noise grows ∝ min(l, k).
* Partition selection (GROUP BY a column without public KEYS) thresholds noisy distinct-unit
  counts whose noise grows ∝ min(l, k), and its threshold τ ≈ 1 + t·ln(l/δ), t = l/ε (twice
  that under bounded neighbours), grows a little faster than l
  (``dpsql.mechanisms.selection.selection_rule``, computed here, not approximated).

Each number here is a function of the policy, the suggested limits (DP releases) and the
suggestion's DP count of units: post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dpsql.mechanisms.selection import selection_rule

REFERENCE_EPSILON = Fraction(1)
"""A query's epsilon for the threshold when the policy states no QUERY EPSILON."""
REFERENCE_DELTA = Fraction(1, 10**6)
"""A query's delta for the threshold when the policy's QUERY DELTA is 0 (private keys need one)."""


@dataclass(frozen=True)
class SelectionThreshold:
    """Partition selection's threshold under suggested limits, for a typical query."""

    groups_per_unit: int
    """min(l, k): the most groups one unit is counted in."""
    query_epsilon: Fraction
    """The query's epsilon (the policy's QUERY EPSILON, else ``REFERENCE_EPSILON``)."""
    query_delta: Fraction
    """The query's delta (the policy's QUERY DELTA, else ``REFERENCE_DELTA``)."""
    reference: bool
    """True when the policy did not state both, and the reference values stand in."""
    threshold: int
    """A key is released when its distinct-unit count plus noise reaches this."""
    threshold_one_group: int
    """The same with MAX GROUPS PER UNIT 1."""
    current_groups: int | None = None
    """min(l, k) of the policy in force, when given."""
    threshold_current: int | None = None
    """The threshold under the policy in force, when given."""


def selection_threshold(groups_per_unit: int, query_epsilon: Fraction | None, query_delta: Fraction,
                        neighbours: str, gaussian: bool, current_groups: int | None = None) -> SelectionThreshold:
    """The threshold of a query with one aggregate grouped by a key without public KEYS: the
    query's epsilon is split in two equal shares, the aggregate's and the selection's
    (``dpsql.analysis.analyse``), and the selection gets all of the delta under Laplace noise,
    half of it under Gaussian. ``current_groups``: min(l, k) of the policy in force, to compare.

    >>> t = selection_threshold(40, Fraction(3, 10), Fraction(1, 10**6), "unbounded", False)
    >>> t.threshold, t.threshold_one_group, t.reference
    (4485, 89, False)
    """
    reference = query_epsilon is None or query_delta <= 0
    epsilon = REFERENCE_EPSILON if query_epsilon is None else Fraction(query_epsilon)
    delta = REFERENCE_DELTA if query_delta <= 0 else Fraction(query_delta)
    selection_epsilon = epsilon / 2
    selection_delta = delta / 2 if gaussian else delta

    def threshold(groups: int) -> int:
        return selection_rule(selection_epsilon, selection_delta, groups, neighbours).threshold

    return SelectionThreshold(groups_per_unit, epsilon, delta, reference, threshold(groups_per_unit), threshold(1),
                              current_groups, None if current_groups is None else threshold(current_groups))


def rows_limit_note(k: int, unit: str) -> str:
    """What MAX ROWS PER UNIT k does to the noise, per aggregate.

    >>> rows_limit_note(300, "tailnum")  # doctest: +ELLIPSIS
    'noise of COUNT, SUM, AVG, VARIANCE and quantiles grows ∝ k = 300 (COUNT(DISTINCT tailnum)...'
    """
    return (f"noise of COUNT, SUM, AVG, VARIANCE and quantiles grows ∝ k = {k} (COUNT(DISTINCT {unit}) "
            f"ungrouped does not: each unit counts once)")


def groups_limit_note(groups: int, k: int, unit: str) -> str:
    """What MAX GROUPS PER UNIT l does, per aggregate (module docstring).

    >>> print(groups_limit_note(40, 300, "tailnum"))  # doctest: +NORMALIZE_WHITESPACE
    it does not change the noise of COUNT, SUM, AVG, VARIANCE or quantiles (a unit adds at most
    k = 300 rows over all its groups, however many groups they fall in); it scales the noise of
    a grouped COUNT(DISTINCT tailnum) and of partition selection ∝ min(l, k) = 40
    """
    return (f"it does not change the noise of COUNT, SUM, AVG, VARIANCE or quantiles (a unit adds at most "
            f"k = {k} rows over all its groups, however many groups they fall in); it scales the noise of a "
            f"grouped COUNT(DISTINCT {unit}) and of partition selection ∝ min(l, k) = {min(groups, k)}")


def selection_lines(found: SelectionThreshold, groups: int | None, k: int, unit: str, units: int | None,
                    units_halfwidth: int | None, table: str) -> tuple[list[str], list[str]]:
    """The note on partition selection's threshold under the suggested limits, and a warning
    when the threshold exceeds the suggestion's DP estimate of the table's units (no key without
    public KEYS could then be released, but by the noise's rare luck).

    >>> t = selection_threshold(40, Fraction(3, 10), Fraction(1, 10**6), "unbounded", False, current_groups=10)
    >>> notes, warnings = selection_lines(t, 40, 300, "tailnum", 4043, 30, "flights")
    >>> print(notes[0])  # doctest: +NORMALIZE_WHITESPACE
    partition selection: a GROUP BY key without public KEYS is released only when its count of
    distinct tailnum values plus noise reaches 4,485 under MAX GROUPS PER UNIT 40 (the policy's limit now,
    10 groups per unit: 1,030; 1 group per unit: 89), for a query with one aggregate at the policy's
    QUERY EPSILON 0.3 and QUERY DELTA 1e-06
    >>> print(warnings[0])  # doctest: +NORMALIZE_WHITESPACE
    partition selection: the threshold 4,485 is more than the about 4,043 ± 30 units of flights in
    all (DP estimate): GROUP BY a column without public KEYS would release no key; declare its KEYS, lower
    MAX GROUPS PER UNIT (1: 89), or give such queries more epsilon
    """
    limit = f"MAX GROUPS PER UNIT {groups}" if groups is not None else \
        f"no MAX GROUPS PER UNIT (a unit may touch as many groups as rows it keeps: k = {k})"
    source = (f"the policy's QUERY EPSILON {_number(found.query_epsilon)} and QUERY DELTA "
              f"{_number(found.query_delta)}") if not found.reference else \
        (f"epsilon {_number(found.query_epsilon)} and delta {_number(found.query_delta)} (the policy states no "
         "QUERY EPSILON or no QUERY DELTA; `dpsql explain` shows a query's own)")
    others = [f"1 group per unit: {found.threshold_one_group:,}"]
    if found.threshold_current is not None and found.current_groups not in (1, found.groups_per_unit):
        others.insert(0, f"the policy's limit now, {found.current_groups} groups per unit: {found.threshold_current:,}")
    notes = [f"partition selection: a GROUP BY key without public KEYS is released only when its count of "
             f"distinct {unit} values plus noise reaches {found.threshold:,} under {limit} ({'; '.join(others)}), "
             f"for a query with one aggregate at {source}"]
    warnings = []
    if units is not None and found.threshold > units:
        spread = f" ± {units_halfwidth:,}" if units_halfwidth else ""
        warnings.append(f"partition selection: the threshold {found.threshold:,} is more than the about "
                        f"{units:,}{spread} units of {table} in all (DP estimate): GROUP BY a column without "
                        f"public KEYS would release no key; declare its KEYS, lower MAX GROUPS PER UNIT "
                        f"(1: {found.threshold_one_group:,}), or give such queries more epsilon")
    return notes, warnings


def _number(value: Fraction) -> str:
    return f"{float(value):g}"
