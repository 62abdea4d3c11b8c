"""Notes on an answer: why partition selection left it thin, and what would lower the bar.

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
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from dpsql.mechanisms.selection import selection_rule

__all__ = ["FEW_ROWS", "thin_answer_notes"]

FEW_ROWS = 5
"""An answer through partition selection with fewer rows than this carries a note."""


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
