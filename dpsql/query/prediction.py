"""Accuracy known before the charge: each output's expected ± from its plan, and ``max_error``.

Every released aggregate's interval follows a law fixed before any data is read: a COUNT's or a
SUM's ± is its noise's own (1 - alpha) half-width times its grid, the same for every group,
whatever the data; a ratio over a noisy count (AVG, VARIANCE, STDDEV, COVAR_*) has a ± that
shrinks as the count n of values in a group grows, known as a function of n. Each family says
it (``AggregateFamily.predicted_half_width``, from ``half_widths``: one law for the prediction and
for the answer's ±). CORR, REGR_* and quantiles have no ± before the release (it depends on the
data's variances, or is drawn with the value), nor does an output that is an expression of
aggregates: EXPLAIN says so and ``max_error`` does not judge them.

``max_error`` (``OPTIONS (max_error = 5)``, ``db.sql(..., max_error=5)``) refuses a query, before
anything is charged, when an output's predicted 95% ± is wider. A ratio is judged at a count n
the analyst states (``expected_rows``: the fewest values they expect in a group), since n itself
is private until released, or else at the smallest count of its values an earlier answer released
to them (``dpsql.query.known_counts``: free); without either it is refused with the count it
would need.
Everything here reads the plan and the analyst's options only: no data, no ledger.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

from sqlglot import exp

from dpsql.analysis.aggregates.registry import family_of
from dpsql.analysis.plan import Plan, aggregates_of
from dpsql.errors import InvalidParameter, TooInaccurate
from dpsql.query.known_counts import KnownCount
from dpsql.sql.numbers import exact_parameter

ALPHA = 0.05
"""Predictions are 95% half-widths, as the intervals answers carry by default."""
LARGEST_COUNT = 10**15
"""Counts beyond this are not searched for (``needed_count``): no table holds that many rows."""
SHOWN_COUNTS = 3
"""How many counts a ratio's ± is shown at."""
VARIANCES = "it depends on the data's variances, which only the release tells"
"""Why CORR and REGR_* have no ± before the charge."""


@dataclass(frozen=True)
class AccuracyGoal:
    """What the analyst asked of a query's accuracy: a widest ± and the count they expect."""

    max_error: Fraction | None = None
    """Refuse before the charge when an output's predicted 95% ± is wider than this."""
    expected_rows: int | None = None
    """The fewest values the analyst expects in a group: ratios are judged at this count."""
    position: tuple[int | None, int | None] = (None, None)
    """(line, column) of the written ``max_error`` option, for the refusal."""


def accuracy_goal(written: dict, max_error: Any = None, expected_rows: Any = None) -> AccuracyGoal:
    """The goal from the SQL's options and the caller's arguments (the same option given both
    ways must agree), checked: ``max_error`` finite and > 0, ``expected_rows`` a whole number >= 1.

    >>> accuracy_goal({}, max_error=5, expected_rows=1000)
    AccuracyGoal(max_error=Fraction(5, 1), expected_rows=1000, position=(None, None))
    >>> accuracy_goal({}, max_error=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpsql.errors.InvalidParameter: max_error must be greater than 0, got 0...
    """
    values: dict[str, Any] = {}
    position: tuple[int | None, int | None] = (None, None)
    for name, given in (("max_error", max_error), ("expected_rows", expected_rows)):
        option = written.get(name)
        value = given
        where = {} if option is None else {"line": option.line, "col": option.col}
        if option is not None:
            if given is not None and exact_parameter(given, name) != option.value:
                raise InvalidParameter(f"{name} is given twice: {float(option.value):g} in the SQL and {given} as an "
                                       "argument", hint=f"give {name} once, in the SQL or as an argument", **where)
            value = option.value
            if name == "max_error":
                position = (option.line, option.col)
        if value is None:
            values[name] = None
            continue
        number = exact_parameter(value, name)
        if name == "max_error" and not number > 0:
            raise InvalidParameter(f"max_error must be greater than 0, got {float(number):g}",
                                   hint="give the widest 95% ± you accept, such as max_error = 5", **where)
        if name == "expected_rows" and (number.denominator != 1 or not 1 <= number <= LARGEST_COUNT):
            raise InvalidParameter(f"expected_rows must be a whole number from 1 to {LARGEST_COUNT:,}, got "
                                   f"{float(number):g}", hint="give the fewest values you expect in a group, "
                                                              "such as expected_rows = 10000", **where)
        values[name] = number if name == "max_error" else int(number)
    return AccuracyGoal(values["max_error"], values["expected_rows"], position)


@dataclass(frozen=True)
class Prediction:
    """One output's accuracy as known before the charge."""

    output: str
    """The output column."""
    label: str
    """The aggregate as written, or the output's expression."""
    half_width: float | None
    """The 95% ± in the output's own units: exact for a COUNT or SUM; for a ratio, at ``count``;
    None where none is known before the charge."""
    counted: bool = False
    """The ± depends on the count of values in a group (``curve`` shows how)."""
    count: int | None = None
    """The count a ratio's ``half_width`` is stated at (``expected_rows``, or a released count)."""
    count_source: str | None = None
    """Where ``count`` comes from, as EXPLAIN and a refusal say it."""
    curve: tuple[tuple[int, float], ...] = ()
    """For a ratio: (count, ±) at a few counts where the ± is informative."""
    needed: int | None = None
    """For a ratio with a ``max_error``: the fewest values a group needs for its ± to be within it
    (None: more than ``LARGEST_COUNT``)."""
    reason: str | None = None
    """Why no ± is known before the charge, where none is."""
    released_below_one: str | None = None
    """For a ratio with no ``count``: the released count below 1 that could not state its ±, said
    as a refusal says it (None when none was released)."""


def predict_outputs(plan: Plan, goal: AccuracyGoal = AccuracyGoal(),
                    known: dict[str, KnownCount] | None = None, scaled: Collection[str] = ()) -> list[Prediction]:
    """Each noisy output's ``Prediction`` (outputs reading no aggregate are not noisy: left out).
    From the plan's measures only: reads no data. A ratio is stated at ``goal.expected_rows``, else
    at the count of its values an earlier answer released to the analyst (``known``, per aggregate:
    ``dpsql.query.known_counts``). ``scaled``: outputs ``scale_sample`` scales from a Poisson
    sample to the table (``dpsql.query.scaling``), whose ± adds a sampling error the data decides."""
    query = plan.query
    labels = {a.name: a.label for a in query.aggregates}
    predictions = []
    for name, item in zip(query.outputs, query.post.expressions):
        node = item.unalias()
        used = aggregates_of(node)
        if not used:
            continue
        if name in scaled:
            predictions.append(Prediction(name, _as_written(node, labels), None, reason=(
                "scaled from the sample to the table (scale_sample): its ± adds the sampling error, which the "
                "data decides")))
            continue
        if not isinstance(node, exp.Column):
            parts = ", ".join(labels[a] for a in used)
            predictions.append(Prediction(name, _as_written(node, labels), None, reason=(
                f"an expression of {parts}: its ± follows from theirs once released")))
            continue
        predictions.append(_predict_aggregate(plan, name, node.name, labels[node.name], goal,
                                              (known or {}).get(node.name)))
    return predictions


def _as_written(node: exp.Expression, labels: dict[str, str]) -> str:
    """An output expression over the core's aggregates (a0, ...) with each written as the analyst did."""
    def label(part: exp.Expression) -> exp.Expression:
        if isinstance(part, exp.Column) and part.name in labels:
            return exp.Var(this=labels[part.name])
        return part
    return node.copy().transform(label).sql(dialect="duckdb")


def _predict_aggregate(plan: Plan, output: str, name: str, label: str, goal: AccuracyGoal,
                       known: KnownCount | None) -> Prediction:
    aggregate = next(a for a in plan.aggregates if a.name == name)
    family = family_of(aggregate)
    measures = [plan.measure(m) for m in aggregate.measures]

    floor, ceiling = family.possible(aggregate, measures)
    widest = (ceiling - floor) / 2  # an answer's interval is cut to the possible range: no ± exceeds this

    def at(count: int | None) -> float | None:
        half = family.predicted_half_width(aggregate, measures, ALPHA, count)
        return None if half is None else min(half, widest)

    if not family.counted:
        half = at(None)
        reason = None if half is not None else (
            "chosen by the exponential mechanism: its interval is drawn with it" if family.draws else
            VARIANCES)
        return Prediction(output, label, half, reason=reason)
    if at(1) is None:
        return Prediction(output, label, None, reason=VARIANCES)
    curve = _curve(at)
    needed = None if goal.max_error is None else needed_count(at, float(goal.max_error))
    count, source, unusable = goal.expected_rows, "expected_rows", None
    if count is None and known is not None:
        group = ", ".join(map(str, known.key))
        if known.count >= 1:
            count, source = known.count, (f"the smallest count of its values your answer #{known.entry} released"
                                          + (f", for {group}" if group else "") + "; noisy")
        else:
            unusable = (f"the smallest count of its values your answer #{known.entry} released {known.count:,}"
                        + (f" for {group}" if group else "") + " (noisy), at which no ± can be told")
    return Prediction(output, label, None if count is None else at(count), counted=True, count=count,
                      count_source=None if count is None else source, curve=curve, needed=needed,
                      released_below_one=unusable)


def _curve(at) -> tuple[tuple[int, float], ...]:
    """The ± at ``SHOWN_COUNTS`` powers of ten, from the first where it is below half its widest
    (where the count makes the answer informative)."""
    widest = at(1)
    counts = [10**k for k in range(1, 16)]
    start = next((i for i, n in enumerate(counts) if at(n) < widest / 2), len(counts) - SHOWN_COUNTS)
    return tuple((n, at(n)) for n in counts[start:start + SHOWN_COUNTS])


def needed_count(at, target: float) -> int | None:
    """The smallest count n with ``at(n) <= target`` (``at`` does not grow with n), or None when
    even ``LARGEST_COUNT`` values are not enough.

    >>> needed_count(lambda n: 700 / n, 7.0), needed_count(lambda n: 1.0, 0.5)
    (100, None)
    """
    if at(LARGEST_COUNT) > target:
        return None
    low, high = 1, 1
    while at(high) > target:
        low, high = high + 1, high * 2
    while low < high:
        middle = (low + high) // 2
        if at(middle) <= target:
            high = middle
        else:
            low = middle + 1
    return low


def amount(value: float) -> str:
    """A ± as a reader takes it in: three significant digits, thousands separated.

    >>> amount(252000.0), amount(16.27), amount(0.70004), amount(4.0), amount(3.2e9)
    ('252,000', '16.3', '0.7', '4', '3.2e+09')
    """
    if not math.isfinite(value):
        return str(value)
    rounded = float(f"{value:.3g}")
    if abs(rounded) >= 1e9:
        return f"{rounded:.3g}"
    if rounded == int(rounded):
        return f"{int(rounded):,}"
    return f"{rounded:,.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}".rstrip("0").rstrip(".")


def prediction_lines(predictions: Sequence[Prediction], goal: AccuracyGoal, epsilon: Fraction) -> list[str]:
    """EXPLAIN's accuracy section: each output's 95% ± before the charge, and what ``max_error``
    would do."""
    if not predictions:
        return []
    lines = ["accuracy before the charge (95% ± from the noise alone, in each output's own units; the limits' "
             "clamping can add bias, see limits):"]
    for p in predictions:
        head = f"  {p.output} = {p.label}: "
        if p.counted:
            shown = "; ".join(f"± {amount(h)} at n = {n:,}" for n, h in p.curve)
            text = f"± shrinks as n, the count of values it reads in a group, grows: {shown}"
            if p.count is not None and p.half_width is not None:
                text = f"± {amount(p.half_width)} at n = {p.count:,} ({p.count_source}); " + text
            if goal.max_error is not None:
                text += (f"; within ± {amount(float(goal.max_error))} from n = {p.needed:,}" if p.needed is not None
                         else f"; never within ± {amount(float(goal.max_error))}")
            lines.append(head + text)
        elif p.half_width is not None:
            lines.append(head + f"± {amount(p.half_width)} (the same for every group, whatever the data)")
        else:
            lines.append(head + f"no ± before the charge: {p.reason}")
    if goal.max_error is not None:
        refusal = accuracy_refusal(predictions, goal, epsilon)
        if refusal is None:
            lines.append(f"  max_error {amount(float(goal.max_error))}: every output it can judge is within it")
        else:
            lines.append(f"  max_error {amount(float(goal.max_error))}: the query would be refused: "
                         f"{refusal.message.replace('; nothing was charged', '')}")
    return lines


def check_accuracy(predictions: Sequence[Prediction], goal: AccuracyGoal, epsilon: Fraction) -> None:
    """Refuse (``accuracy_refusal``) before the charge."""
    refusal = accuracy_refusal(predictions, goal, epsilon)
    if refusal is not None:
        raise refusal


def accuracy_refusal(predictions: Sequence[Prediction], goal: AccuracyGoal,
                     epsilon: Fraction) -> TooInaccurate | None:
    """The ``TooInaccurate`` refusal of the first output whose predicted 95% ± is wider than
    ``max_error``, or whose ratio cannot be judged because no count is known; None when none.
    Outputs with no ± before the charge (CORR, REGR_*, quantiles, expressions) are not judged."""
    if goal.max_error is None:
        return None
    limit = float(goal.max_error)
    line, col = goal.position
    for p in predictions:
        if p.counted and p.count is None and p.needed != 1:  # needed 1: within at any count
            need = f"a group needs at least {p.needed:,} values for ± {amount(limit)}" if p.needed is not None \
                else f"no count of values brings it within ± {amount(limit)}"
            unknown = "which is private until released" if p.released_below_one is None else \
                f"and {p.released_below_one}"
            return TooInaccurate(
                f"the ± of {p.output} = {p.label} depends on how many values a group holds, {unknown}, "
                f"so max_error {amount(limit)} cannot judge it ({need}; ± {amount(p.curve[0][1])} at "
                f"n = {p.curve[0][0]:,}); nothing was charged", line=line, col=col,
                hint="pass expected_rows=N, the fewest values you expect in a group, or leave max_error out "
                     "(explain shows the ± at each count)",
                hints={"cli": "give --expected-rows N, the fewest values you expect in a group, or leave --max-error "
                              "out (dpsql explain shows the ± at each count)",
                       "shell": "set .max_error X N, N the fewest values you expect in a group, or .max_error off "
                                "(.explain shows the ± at each count)",
                       "sql": "write OPTIONS (max_error = X, expected_rows = N), N the fewest values you expect in "
                              "a group, or leave max_error out (EXPLAIN shows the ± at each count)"})
        if p.half_width is not None and p.half_width > limit:
            at = f" at n = {p.count:,} values in a group ({p.count_source})" if p.counted else ""
            scale = p.half_width / limit
            return TooInaccurate(
                f"{p.output} = {p.label} would be released with a predicted 95% ± of {amount(p.half_width)}{at}, "
                f"wider than max_error {amount(limit)}; nothing was charged", line=line, col=col,
                hint=f"raise epsilon (the ± shrinks about as 1/epsilon: about epsilon "
                     f"{amount(float(epsilon) * scale)} for ± {amount(limit)}), narrow the bounds of the columns it "
                     "reads, group more coarsely (fewer groups per unit)" + (", expect more values per group"
                                                                             if p.counted else "") +
                     ", or raise max_error")
    return None
