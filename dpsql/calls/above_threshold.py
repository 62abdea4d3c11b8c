"""``db.above_threshold``: which of a stream of COUNT/SUM queries exceed a threshold, charged once.

Each query is planned as ``db.sql`` plans it (checked, its bounded statement rendered, the most
one unit can change it derived under the policy's limits), before anything is charged. Then the
executor (``dpsql.query.executor``, adaptive form) charges the whole stream once, runs the queries one
by one on the engine and tests each exact answer with AboveThreshold
(``dpsql.mechanisms.sparse_vector``): epsilon in all, however many queries are below, and the
stream stops after ``max_above`` queries were reported above (the rest are not run).

With ``values=True``, each query reported above also gets its value, a fresh discrete Laplace
release at ``value_epsilon / max_above`` (sensitivity as in ``db.sql``): ``value_epsilon`` more
(Dwork & Roth 2014, Algorithm 2's NumericSparse; LSL17 Section 3). The cost is then epsilon +
value_epsilon, and rho (for ZCDP accounting) epsilon^2/2 + max_above (value_epsilon/max_above)^2/2.

The ledger keeps the stream (every query, the threshold, max_above) and what it released; the
same call again returns that release for free, like a repeated query.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.analysis.analyse import SAMPLER_LIMITS
from dpsql.analysis.plan import Plan, PrivateQuery, PublicQuery
from dpsql.answer.explain import Explanation
from dpsql.answer.result import Budget, DPResult, QueryCost
from dpsql.backends.rewrite import BoundedStatement
from dpsql.budget.accounting import Spend, check_accountable
from dpsql.calls.mechanism import Mechanism
from dpsql.errors import DPError, InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.noise import discrete_laplace, discrete_laplace_halfwidth
from dpsql.mechanisms.sparse_vector import AboveThreshold, threshold_share
from dpsql.query.context import MechanismContext
from dpsql.query.options import privacy_options
from dpsql.query.spend import Price
from dpsql.sql.parse import located, parse

MAX_QUERIES = 10_000
"""The most queries one stream may hold (each is planned before the charge)."""

OPTIONS = ("threshold", "epsilon", "max_above", "values", "value_epsilon")
"""The options of ``SELECT * FROM above_threshold(...)``, as keyword arguments of the method."""

_STREAM_FUNCTIONS = ("count", "sum", "count_units")


@dataclass(frozen=True)
class StreamQuery:
    """One query of the stream, planned: what runs and how far one unit can move it."""

    text: str
    """The query as the analyst wrote it."""
    normal: str
    """Its normalised SQL (what the ledger records)."""
    statement: BoundedStatement
    """Its bounded statement: one row, one column, the exact answer in grid units."""
    grid: Fraction
    """The value of one grid unit."""
    sensitivity: Fraction
    """The most one unit can change the answer, in grid units (at least one)."""
    repeat_key: str
    """Its answer's key under ``db.sql`` (``dpsql.query.prepare``): its options, the policy, the analyst."""
    value_scale: Fraction | None = None
    """With values: the discrete Laplace scale of its value, as ``db.sql`` at value_epsilon/c draws it."""


@dataclass(frozen=True)
class StreamPlan:
    """A whole stream, planned before the charge."""

    queries: tuple[StreamQuery, ...]
    threshold: Fraction
    epsilon: Fraction
    max_above: int
    value_epsilon: Fraction | None
    """The epsilon of the values of the queries above (None: no values)."""

    @property
    def cost(self) -> Spend:
        """Epsilon (and rho: epsilon^2/2, pure DP) of the stream, plus its values' if asked."""
        if self.value_epsilon is None:
            return Spend(self.epsilon, Fraction(0), self.epsilon ** 2 / 2)
        each = self.value_epsilon / self.max_above
        return Spend(self.epsilon + self.value_epsilon, Fraction(0),
                     self.epsilon ** 2 / 2 + self.max_above * each ** 2 / 2)

    def key(self) -> str:
        """What an identical stream is found by in the ledger: each query's own repeat key (its
        options, the policy and the analyst, as ``db.sql``'s) and the stream's parameters."""
        text = json.dumps(["above_threshold", [q.repeat_key for q in self.queries], str(self.threshold),
                           str(self.epsilon), self.max_above, None if self.value_epsilon is None
                           else str(self.value_epsilon)])
        return "above_threshold:" + hashlib.sha256(text.encode()).hexdigest()

    def ledger_text(self) -> str:
        """The stream as the ledger records it."""
        shown = "; ".join(f"{i}. {q.normal}" for i, q in enumerate(self.queries, 1))
        return f"ABOVE THRESHOLD {_number(self.threshold)} (at most {self.max_above} above) OF {shown}"

    def price(self, neighbours: str) -> Price:
        """What the stream costs, charged once: one statement per query at most."""
        return Price(self.cost, self.ledger_text(),
                     {"mechanism": "above_threshold", "epsilon": self.epsilon, "threshold": self.threshold,
                      "max_above": self.max_above, "value_epsilon": self.value_epsilon, "neighbours": neighbours},
                     key=self.key(), statements=len(self.queries), what=f"a stream of {len(self.queries):,} queries",
                     failure="the stream failed while running; its cost was charged and nothing was released")


def plan_stream(context: MechanismContext, queries: Any, threshold: Any, epsilon: Any, max_above: Any = 1,
                values: Any = False, value_epsilon: Any = None) -> StreamPlan:
    """Check the arguments and plan every query (reads no data; refusals name the query)."""
    if isinstance(queries, str) or not isinstance(queries, Sequence) or not queries:
        raise InvalidParameter("above_threshold needs a list of queries",
                               hint="pass queries=['SELECT COUNT(*) FROM t WHERE ...', ...]")
    if len(queries) > MAX_QUERIES:
        raise InvalidParameter(f"above_threshold takes at most {MAX_QUERIES} queries, got {len(queries)}",
                               hint="split the stream; each part is charged on its own")
    if isinstance(max_above, bool) or not isinstance(max_above, int) or not 1 <= max_above <= len(queries):
        raise InvalidParameter(f"max_above must be a whole number from 1 to the number of queries "
                               f"({len(queries)}), got {max_above!r}",
                               hint="max_above = 1 stops at the first query above the threshold")
    threshold = _finite(threshold, "threshold")
    if not isinstance(values, bool):
        raise InvalidParameter(f"values must be true or false, got {values!r}",
                               hint="values = true also releases the value of each query above")
    policy = context.policy
    epsilon = privacy_options(policy, epsilon, Fraction(0), "laplace").epsilon
    value_eps = None
    if values:
        value_eps = epsilon if value_epsilon is None else privacy_options(policy, value_epsilon, Fraction(0),
                                                                          "laplace").epsilon
    elif value_epsilon is not None:
        raise InvalidParameter("value_epsilon is given but values is not",
                               hint="add values = true, or leave value_epsilon out")
    _check_noise_fits(epsilon, max_above)
    for position, text in enumerate(queries, 1):  # every query's shape first: cheap, before any is planned
        _about(position, text, _check_shape, text)
    each = Fraction(1) if value_eps is None else value_eps / max_above  # what a value is released at
    planned = tuple(_about(i, text, _plan_query, context, text, each) for i, text in enumerate(queries, 1))
    stream = StreamPlan(planned, threshold, epsilon, max_above, value_eps)
    check_accountable(policy.accounting, stream.cost)
    return stream


def _check_noise_fits(epsilon: Fraction, max_above: int) -> None:
    """Both noises' scales within the exact sampler's reach (else the draw fails after the charge)."""
    probe = AboveThreshold.scales(epsilon, max_above)
    if max(probe) >= SAMPLER_LIMITS["laplace"]:
        raise InvalidParameter(f"epsilon {float(epsilon):g} is too small for a stream stopping after {max_above} "
                               "above: its noise would be beyond what the exact samplers draw",
                               hint="use a larger epsilon, or a smaller max_above")


def _about(position: int, text: Any, step: Callable[..., Any], *arguments: Any) -> Any:
    """``step(*arguments)``, a refusal said of query ``position``, at its place in that query's text."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidParameter(f"query {position} of the stream is not SQL text: {text!r}",
                               hint="give each query as a string")
    try:
        return step(*arguments)
    except DPError as error:
        error = located(error, text) if error.line is None else error
        error.message = f"query {position} of the stream: {error.message}"
        error.args = (str(error._render()),)
        raise error


def _check_shape(text: str) -> None:
    """What the text alone says of a stream query: one COUNT or SUM selected as it is, no GROUP BY,
    no post-processing, no options of its own that the stream sets."""
    parsed = parse(text)
    written = sorted(set(parsed.options) & {"epsilon", "delta", "noise", "report_bias"})
    if written:
        raise UnsupportedQuery(f"it sets its own {written[0]}",
                               hint="the stream's epsilon is given once, for all its queries, and it "
                                    "reports no bias")
    tree = parsed.tree
    if not isinstance(tree, exp.Select):
        raise UnsupportedQuery("it is not a single SELECT", node=tree, hint=_SHAPE)
    if tree.args.get("group"):
        raise UnsupportedQuery("it has a GROUP BY", node=tree.args["group"],
                               hint=f"{_SHAPE}: ask one query per group, with the group in its WHERE")
    for clause in ("having", "order", "limit", "offset", "distinct", "qualify"):
        if tree.args.get(clause):
            raise UnsupportedQuery(f"it post-processes its answer ({clause.upper()})", node=tree.args[clause],
                                   hint=f"{_SHAPE}: the stream compares the COUNT or SUM itself")
    selected = [e.unalias() for e in tree.expressions]
    if len(selected) != 1 or not isinstance(selected[0], (exp.Count, exp.Sum)):
        raise UnsupportedQuery("it is not a single COUNT or SUM", node=tree, hint=_SHAPE)


def _plan_query(context: MechanismContext, text: str, each: Fraction) -> StreamQuery:
    """One query of the stream: an ungrouped COUNT or SUM of private data, exactly as selected,
    planned as ``db.sql`` plans it at ``each`` (a value's epsilon: its grid and noise are db.sql's)."""
    prepared = context.prepare(text, each, 0, "laplace", None, False)
    checked, plan, priced = prepared.checked, prepared.plan, prepared.priced
    if isinstance(checked, PublicQuery) or plan is None or priced is None:
        raise UnsupportedQuery("it reads no private data", hint="ask it with db.sql: it is answered exactly, for free")
    measure = _single_measure(plan, checked)
    if priced.bounded.needs_sample_key:
        raise UnsupportedQuery("it samples its table (TABLESAMPLE POISSON)",
                               hint="leave the sample out of a stream's queries: the stream's charge is "
                                    "not amplified by a sample")
    return StreamQuery(text, priced.normal_sql, priced.bounded, measure.grid,
                       max(Fraction(measure.sensitivity.l1), Fraction(1)), priced.repeat_key,
                       measure.scale if measure.noise == "laplace" else None)


_SHAPE = "each query of a stream is one COUNT or SUM over private rows, selected as it is, with no GROUP BY"


def _single_measure(plan: Plan, checked: PrivateQuery):
    """The one noisy measure of a stream query, or a refusal saying what a stream query is."""
    shape = _SHAPE
    if plan.query.keys or plan.selection is not None:
        raise UnsupportedQuery("it has a GROUP BY", node=plan.query.keys[0].expression
                               if plan.query.keys else None,
                               hint=f"{shape}: ask one query per group, with the group in its WHERE")
    if len(plan.aggregates) != 1 or plan.aggregates[0].function not in _STREAM_FUNCTIONS \
            or len(plan.measures) != 1 or plan.measures[0].centred or plan.measures[0].kind == "histogram":
        raise UnsupportedQuery("it is not a single COUNT or SUM",
                               hint=shape)
    if len(checked.outputs) != 1 or not checked.direct:
        raise UnsupportedQuery("it computes with its COUNT or SUM",
                               hint=f"{shape}: compute with the answers afterwards")
    return plan.measures[0]


def run_stream(context: MechanismContext, stream: StreamPlan) -> DPResult:
    """Charge ``stream``, run it and release (or replay a stored release), through the spender."""
    source = context.source

    def run(fetch) -> list[tuple[bool | None, int | None]]:
        svt = AboveThreshold(stream.threshold, 1, stream.epsilon, stream.max_above, source)
        released: list[tuple[bool | None, int | None]] = []
        # No stop on the stream's summed run time (invariant 17): its time was bounded before the
        # charge by its number of statements (Price.statements), each under its own deadline.
        for query in stream.queries:
            if svt.done:
                released.append((None, None))  # the stream stopped: this query is not run
                continue
            exact = fetch(query.statement)[0][0]
            exact = 0 if exact is None else int(exact)  # the SUM of no rows is NULL
            above = svt.test(exact * query.grid, sensitivity=query.sensitivity * query.grid)
            noisy = None
            if above and stream.value_epsilon is not None:
                scale = query.value_scale  # None: nothing one unit does can move it, as in db.sql
                noisy = exact + (0 if scale is None else int(discrete_laplace(scale, 1, source)[0]))
            released.append((above, noisy))
        return released

    # One identical stream at a time (as db.sql does for queries): a second waits, then replays.
    spent = context.spender.spend(stream.price(context.policy.neighbours), run, json.dumps, _decoded)
    return _result(stream, spent.released, spent.cost, spent.budget)


def _decoded(text: str) -> list[tuple[bool | None, int | None]]:
    return [(above, noisy) for above, noisy in json.loads(text)]


def _result(stream: StreamPlan, released: list[tuple[bool | None, int | None]], cost: QueryCost,
            budget: Budget | None) -> DPResult:
    """The release as rows: (position, query, above) and, with values, the value of those above."""
    whole = all(query.grid == 1 for query in stream.queries)  # counts (and sums of integers): whole values
    columns = ["n", "query", "above"] + (["value"] if stream.value_epsilon is not None else [])
    types = ["INTEGER", "VARCHAR", "BOOLEAN"] + ([("BIGINT" if whole else "DOUBLE")]
                                                 if stream.value_epsilon is not None else [])
    rows = []
    for position, (query, (above, noisy)) in enumerate(zip(stream.queries, released), 1):
        row: tuple = (position, query.text, above)
        if stream.value_epsilon is not None:
            value = noisy * query.grid if noisy is not None else None
            row += (None if value is None else int(value) if whole else float(value),)
        rows.append(row)
    intervals = None
    if stream.value_epsilon is not None:
        def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
            cells = []
            for query, row in zip(stream.queries, rows):
                if row[3] is None:
                    cells.append((math.nan, math.nan, math.nan))
                    continue
                scale = query.value_scale
                half = 0.0 if scale is None else float(discrete_laplace_halfwidth(scale, alpha) * query.grid)
                cells.append((row[3] - half, row[3] + half, half))
            return {"value": cells}
    return DPResult(columns, rows, cost, intervals=intervals, types=types, budget=budget,
                    notes=_notes(stream, released))


def _notes(stream: StreamPlan, released: list[tuple[bool | None, int | None]]) -> tuple[str, ...]:
    notes = []
    if stream.value_epsilon is not None:  # the total is more than the epsilon the call gave: say so
        notes.append(f"epsilon {_number(stream.cost.epsilon)} in all{_split(stream)}")
    skipped = sum(above is None for above, _ in released)
    if skipped:
        above = "the first query" if stream.max_above == 1 else f"{stream.max_above} queries"
        rest = "the last query was" if skipped == 1 else f"the last {skipped} queries were"
        notes.append(f"the stream stopped after {above} above the threshold: {rest} not run (above is NULL)")
    return tuple(notes)


def _split(stream: StreamPlan) -> str:
    """How a stream with values spends its total: the sparse vector's epsilon and the values'."""
    if stream.value_epsilon is None:
        return ""
    return (f" ({_number(stream.epsilon)} for the sparse vector + {_number(stream.value_epsilon)} for the values "
            "of the queries above: value_epsilon, by default the same as epsilon)")


def explain_stream(context: MechanismContext, stream: StreamPlan) -> Explanation:
    """What the stream would run and cost; reads no data. A stream too long to run is refused."""
    price = stream.price(context.policy.neighbours)
    context.spender.check_time(price.statements, price.what)
    share = threshold_share(stream.max_above)
    first = stream.epsilon * share
    lines = [
        f"sparse vector (AboveThreshold, Lyu, Su & Li 2017, Algorithm 1) over {_queries(len(stream.queries))}: "
        f"reports which exceed {_number(stream.threshold)}, stopping after {stream.max_above} above",
        f"epsilon {_number(stream.epsilon)}: {_number(first)} for the threshold's noise (drawn once), "
        f"{_number(stream.epsilon - first)} for the queries' (scale 2 x {stream.max_above} x sensitivity / "
        "that epsilon), however many queries are below",
    ]
    if stream.value_epsilon is not None:
        lines.append(f"values of the queries above: epsilon {_number(stream.value_epsilon)} more, "
                     f"{_number(stream.value_epsilon / stream.max_above)} each (discrete Laplace)")
    for i, query in enumerate(stream.queries, 1):
        lines.append(f"{i}. {query.normal}  -- one unit changes it by at most "
                     f"{_number(query.sensitivity * query.grid)}")
    cost = stream.cost
    lines.append(f"cost: epsilon {_number(cost.epsilon)}{_split(stream)}, delta 0, charged once for the whole stream")
    quote = context.spender.quote(cost, price.key)
    refusal = quote.refusal
    lines.append(quote.text)
    return Explanation("\n".join(lines), refused=refusal)


def _queries(count: int) -> str:
    return "1 query" if count == 1 else f"{count} queries"


def _finite(value: Any, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise InvalidParameter(f"{name} must be a finite number, got {value!r}",
                               hint=f"pass {name}=100, in the queries' own units")
    return Fraction(value)


def _number(value: Fraction) -> str:
    return format(float(value), "g") if value.denominator != 1 else str(value.numerator)


def _answer_call(connection: Any, queries: list[str], options: dict[str, Any]) -> DPResult:
    return connection.above_threshold(queries, **_with_required(options))


def _explain_call(connection: Any, queries: list[str], options: dict[str, Any]) -> str:
    context = connection.mechanism_context()
    return explain_stream(context, plan_stream(context, queries, **_with_required(options)))


def _with_required(options: dict[str, Any]) -> dict[str, Any]:
    if "threshold" not in options:
        raise InvalidParameter("above_threshold() needs a threshold",
                               hint="write SELECT * FROM above_threshold('SELECT ...', threshold = 100)")
    return {"epsilon": None, **options}


MECHANISM = Mechanism(_answer_call, _explain_call, OPTIONS)
"""What ``SELECT * FROM above_threshold(...)`` calls (listed in ``dpsql.calls.registry.MECHANISMS``)."""
