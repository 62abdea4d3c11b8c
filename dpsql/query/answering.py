"""The dynamic half of ``db.sql``: a prepared query answered, through the one way to spend.

``dpsql.query.prepare`` is the static half (parse to priced, rendered statements; reads no
private data). Here a prepared query is answered: a public one exactly, a grouping by public keys
alone from its domain (nothing private read, nothing charged), a private one through the
connection's ``Spender`` (``dpsql.query.spend``: lock, free repeat, charge, run, release,
record), its bounded statements run, its noise drawn (``dpsql.query.release``), post-processed
on the engine and shown with its intervals, notes, outside cell and limits. ``explain`` is the
same query described instead: what would run and cost, reading no data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

from dpsql.analysis.aggregates import family_of, plain_projection, total_post
from dpsql.analysis.domains import domain_text, reports_outside
from dpsql.analysis.plan import Plan, PrivateQuery, PublicQuery
from dpsql.answer.explain import Explanation, explain_plan, explain_sampling
from dpsql.answer.noise_rows import noise_rows_notes
from dpsql.answer.notes import interval_notes, null_cells_notes, selection_text, thin_answer_notes
from dpsql.answer.result import DPResult, QueryCost, decode_answer, decode_outside, encode_answer
from dpsql.backends.base import Backend
from dpsql.backends.keys import shown_keys
from dpsql.backends.rewrite import BoundedStatement, rewrite_statement, separate_statement
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.noise import secret_key
from dpsql.policy.model import Policy
from dpsql.query.accuracy import output_cells
from dpsql.query.bias import (
    Limits,
    bias_share,
    bias_sql,
    explain_bias,
    limits_of,
    release_bias,
    stored_bounding,
    with_bounding,
)
from dpsql.query.context import MechanismContext
from dpsql.query.domains import KeyDomains
from dpsql.query.executor import Executor
from dpsql.query.known_counts import KnownCount, counted_descriptor, known_counts, with_counted
from dpsql.query.limits import recorded_drop
from dpsql.query.outside import outside_domain
from dpsql.query.prediction import (
    AccuracyGoal,
    accuracy_goal,
    accuracy_refusal,
    check_accuracy,
    predict_outputs,
    prediction_lines,
)
from dpsql.query.prepare import Prepared, Priced, Replanned
from dpsql.query.release import (
    core_columns,
    core_rows,
    from_stored,
    release_measures,
    split_last,
    stored_measures,
    stored_names,
)
from dpsql.query.scaling import scaled_result
from dpsql.query.spend import Price, Spender
from dpsql.query.unit_bounds import chosen_note, draw_bounds, explain_auto, stored_bounds, with_stored_bounds
from dpsql.sql.names import table_key
from dpsql.sql.numbers import exact_parameter
from dpsql.sql.parse import DIALECT
from dpsql.sql.pieces import SAMPLE_KEY_PARAMETER, UNBOUND_SAMPLE_KEY


def _scaled(priced: Priced) -> list[str]:
    """The outputs the ``scale_sample`` option scales to the table (``dpsql.query.scaling``)."""
    return [] if priced.scaling is None else [column.name for column in priced.scaling.columns]


@dataclass(frozen=True)
class Answered:
    """What a charged query released (or its stored release): the rows shown, the noisy measures
    of those rows (for accuracy and repeats), the outside cell's and the bias report."""

    rows: list[tuple]
    noisy: dict[str, list[int]]
    outside: dict | None
    bounding: Any


def _asked(option: Any) -> bool:
    """A written flag option (``OPTIONS (show_outside = true)``) is true."""
    return option is not None and option.value is True


def query_price(plan: Plan, priced: Priced, statements: int) -> Price:
    """What a query costs, as the ledger shows it: its normalised SQL and options (the mechanism's
    own, on the sample if any, and the sampling rate), stored under its repeat key."""
    options = {"epsilon": plan.epsilon, "delta": plan.delta,
               "noise": sorted({m.noise for m in plan.measures}), "neighbours": plan.neighbours}
    if priced.sampling is not None:
        options["sample_rate"] = priced.sampling.rate
    return Price(priced.cost, priced.normal_sql, options, key=priced.repeat_key, statements=statements)


class Answerer:
    """Answers and explains one connection's prepared queries (module docstring)."""

    def __init__(self, policy: Policy, catalog: dict, engine: Backend, executor: Executor) -> None:
        self.policy = policy
        self._catalog = catalog
        self.engine = engine
        """The engine the answers run and are post-processed on."""
        self._executor = executor
        self.domains = KeyDomains(policy, engine, self.read_keys)
        """The public key domains, read once each."""

    def sql(self, context: MechanismContext, prepared: Prepared, max_error: Any = None,
            expected_rows: Any = None) -> DPResult:
        """``db.sql`` of a prepared query, as written (no randomized-response routing); refused
        before the charge when an output's predicted ± is wider than ``max_error``
        (``dpsql.query.prediction``; also as written in the SQL's OPTIONS)."""
        checked, plan = prepared.checked, prepared.plan
        goal = accuracy_goal(prepared.written, max_error, expected_rows)
        if isinstance(checked, PublicQuery):
            return self.public(checked)
        assert plan is not None
        domain = self.domains.domain(plan.query, prepared.written) if plan.selection is None else None
        priced = prepared.priced
        if priced is None:
            assert domain is not None
            return self.keys_only(plan, checked, domain)  # public keys only: nothing private is read
        if goal.max_error is not None:  # before the charge
            check_accuracy(predict_outputs(plan, goal, self._known(context, plan, goal), _scaled(priced)), goal,
                           plan.epsilon)
        answered = self._answer(context, prepared, priced, domain)
        return answered if priced.scaling is None else scaled_result(answered, priced.scaling)

    def _answer(self, context: MechanismContext, prepared: Prepared, priced: Priced,
                domain: list[tuple] | None) -> DPResult:
        """Charge ``prepared`` (or replay its stored answer), run its bounded statements, release and
        post-process, through the spender: its statements were rendered before."""
        if prepared.auto is not None:
            return self._answer_auto(context, prepared, priced, domain)
        checked, plan, bias = prepared.checked, prepared.plan, prepared.bias
        assert plan is not None and isinstance(checked, PrivateQuery)
        keys, source = plan.query.keys, context.source
        counting = priced.bias_counting if bias is not None else None
        statements = [priced.bounded, *priced.separate, *([counting] if counting is not None else [])]
        types = list(priced.core_types)

        def release(fetched: list[list[tuple]]) -> Answered:
            exact = self.read_keys(fetched[0], keys)
            histograms: dict[str, Sequence[tuple]] = {
                measure.name: self.read_keys(rows, keys) for measure, rows in zip(plan.separate, fetched[1:])}
            bounding = None
            if counting is not None:
                assert bias is not None
                bounding = release_bias(bias, dict(zip([m.name for m in bias.measures], fetched[-1][0])), source)
            return self._released(plan, checked, domain, exact, histograms, types, bounding, source)

        # its plain counts, described for a later ratio's ± (a sample's count other rows); before the charge
        counted = counted_descriptor(plan.query) if priced.sampling is None else None

        def record(answered: Answered) -> str:
            return with_counted(with_bounding(encode_answer(list(checked.outputs), answered.rows, answered.noisy,
                                                            outside=answered.outside), answered.bounding), counted)

        # A sampled query's key: drawn after the charge from the secure source, bound only to its own statements.
        sample_key = (lambda: secret_key(source)) if priced.sampling is not None else None
        spent = context.spender.spend_statements(query_price(plan, priced, len(statements)), statements, release,
                                                 record, lambda text: self._replayed(prepared, text),
                                                 sample_key=sample_key)
        answered = spent.released
        cells = self._intervals(plan, checked, answered.noisy, answered.rows)
        return DPResult(list(checked.outputs), answered.rows, spent.cost, intervals=cells,
                        **self._described(plan, checked, types, answered.rows, cells), budget=spent.budget,
                        outside_domain=outside_domain(self.engine, plan, checked, answered.outside, types,
                                                      asked=_asked(prepared.written.get("show_outside"))),
                        limits=self.limits(plan, context.spender), bounding=answered.bounding)

    def _answer_auto(self, context: MechanismContext, prepared: Prepared, priced: Priced,
                     domain: list[tuple] | None) -> DPResult:
        """``_answer`` of a query with ``unit_bounds_share`` (``dpsql.query.unit_bounds``): one charge
        of the query's epsilon, then the draws' statement, the bounds drawn, the query planned at
        them (post-processing of the draws) and its statements run and released. The drawn bounds
        are stored with the answer: a repeat replans at them and gives the release back for free."""
        checked, rows_plan, auto, replan = prepared.checked, prepared.plan, prepared.auto, prepared.replan
        assert rows_plan is not None and auto is not None and replan is not None and isinstance(checked, PrivateQuery)
        source = context.source

        def at(chosen: dict) -> tuple[Replanned, bool]:
            try:
                return replan(chosen), False
            except Exception:  # a function of the released bounds alone: the rows model answers
                return Replanned(rows_plan, priced.bounded, priced.separate, priced.core_types), True

        def run(fetch) -> tuple:
            chosen = draw_bounds(auto, fetch(auto.statement), source)
            again, fell_back = at(chosen)
            fetched = [fetch(statement) for statement in [again.bounded, *again.separate]]
            keys = again.plan.query.keys
            exact = self.read_keys(fetched[0], keys)
            histograms: dict[str, Sequence[tuple]] = {
                measure.name: self.read_keys(rows, keys) for measure, rows in zip(again.plan.separate, fetched[1:])}
            answered = self._released(again.plan, checked, domain, exact, histograms, list(again.core_types), None,
                                      source)
            return answered, chosen, again, fell_back

        def record(released: tuple) -> str:
            answered = released[0]
            return with_stored_bounds(encode_answer(list(checked.outputs), answered.rows, answered.noisy,
                                                    outside=answered.outside), released[1])

        def replay(text: str) -> tuple | None:
            chosen = stored_bounds(text)
            if chosen is None or {d.column for d in auto.draws} != set(chosen):
                return None
            again, fell_back = at(chosen)
            answered = self._replayed(replace(prepared, plan=again.plan, bias=None), text)
            return None if answered is None else (answered, chosen, again, fell_back)

        price = query_price(rows_plan, priced, 2 + len(priced.separate))  # the draws' statement, then the query's
        price = replace(price, options={**price.options, "unit_bounds_share": auto.share})
        spent = context.spender.spend(price, run, record, replay)
        answered, chosen, again, fell_back = spent.released
        plan = again.plan
        cells = self._intervals(plan, checked, answered.noisy, answered.rows)
        described = self._described(plan, checked, list(again.core_types), answered.rows, cells)
        described["notes"] = (*described["notes"], chosen_note(auto, chosen, plan, fell_back))
        return DPResult(list(checked.outputs), answered.rows, spent.cost, intervals=cells, **described,
                        budget=spent.budget,
                        outside_domain=outside_domain(self.engine, plan, checked, answered.outside,
                                                      list(again.core_types),
                                                      asked=_asked(prepared.written.get("show_outside"))),
                        limits=self.limits(plan, context.spender))

    def _replayed(self, prepared: Prepared, text: str) -> Answered | None:
        """The stored answer of an identical earlier query, exactly as it was released, or
        ``None`` when there is none that can be given back exactly."""
        plan, checked, bias = prepared.plan, prepared.checked, prepared.bias
        assert plan is not None and isinstance(checked, PrivateQuery)
        decoded = decode_answer(text)
        if decoded is None:
            return None
        _, rows, noisy = decoded
        columns = list(checked.outputs)
        if any(len(row) != len(columns) for row in rows) or (noisy and (
                set(noisy) != stored_names(plan)
                or any(len(values) != len(rows) for values in noisy.values()))):
            return None  # (an answer kept before quantiles stored their intervals is charged again)
        bounding = None if bias is None else stored_bounding(text)
        if bias is not None and bounding is None:
            return None
        return Answered(rows, {name: list(values) for name, values in noisy.items()}, decode_outside(text), bounding)

    def _released(self, plan: Plan, checked: PrivateQuery, domain: list[tuple] | None, exact: list[tuple],
                  histograms: dict[str, Sequence[tuple]], types: list[str], bounding: Any, source: Any) -> Answered:
        """The noisy release of ``exact`` (and the quantiles' ``histograms``), post-processed into
        the rows shown, with the noisy measures of those rows in their order: all accuracy()
        needs, for this answer and every repeat of it."""
        keys = plan.query.keys
        outside = reports_outside(keys)
        released = domain
        if outside:  # the outside cell last; there is one only beside a public domain
            assert domain is not None
            released = domain + [(None,) * len(keys)]
        release = release_measures(plan, released, exact, source, histograms)
        stored_outside = None
        if outside:  # the outside cell's released values and noisy measures, kept for repeats
            release, cell = split_last(release)
            stored_outside = {"values": list(core_rows(plan, cell)[0][len(keys):]),
                              "noisy": {name: int(values[0]) for name, values in stored_measures(cell).items()}}
        core = core_rows(plan, release)
        picked = plain_projection(checked.post, core_columns(plan))
        if picked is not None:  # a plain projection: the core's rows in order, no SQL needed
            core = shown_keys(core, keys)
            pick = itemgetter(*picked)
            rows = [pick(row) for row in core] if len(picked) > 1 else [(row[picked[0]],) for row in core]
            order: Sequence[int] = range(len(rows))
            tracked = True
        else:
            indexed = [row + (index,) for index, row in enumerate(core)]
            columns, rows = self.engine.post_processing.post_process(
                core_columns(plan) + ["dp_row"], types + ["BIGINT"], indexed, total_post(checked.post))
            tracked = columns[-1] == "dp_row"
            order = [row[-1] for row in rows] if tracked else []
            rows = [row[:-1] for row in rows] if tracked else rows
        noisy = {name: list(values) if isinstance(order, range) else [values[i] for i in order]
                 for name, values in stored_measures(release).items()} if tracked else {}
        return Answered(rows, noisy, stored_outside, bounding)

    def _described(self, plan: Plan, checked: PrivateQuery, core_types: list[str], rows: list[tuple],
                   cells: Callable[[float], dict[str, list[tuple[float, float, float]]]]) -> dict:
        """``DPResult``'s types (bound lazily, reading no rows) and notes (``dpsql.answer.notes``: from
        the plan and the released row count; ``dpsql.answer.noise_rows``: from the released rows and
        their intervals ``cells``)."""
        def types() -> list[str]:
            core = core_types
            picked = plain_projection(checked.post, core_columns(plan))
            if picked is not None:
                return [core[i] for i in picked]
            described = self.engine.post_processing.released_types(core_columns(plan) + ["dp_row"], core + ["BIGINT"],
                                                    total_post(checked.post))
            return [type_name for name, type_name in described[:len(checked.outputs)]]

        limited = any(checked.post.args.get(part) for part in ("limit", "offset"))
        notes = [] if limited else thin_answer_notes(plan, len(rows), checked.post)
        if not notes and plan.selection is not None:  # a thin answer's note names the threshold already
            notes.append(selection_text(plan))
        notes += null_cells_notes(checked.outputs, checked.post, rows)
        try:
            notes += noise_rows_notes(plan, checked, rows, cells)
            notes += interval_notes(plan, checked, rows, cells)
        except Exception:  # advisory, after the charge: the answer is released without it
            pass
        return {"types": types, "notes": tuple(notes), "converter": self.engine.post_processing.convert}

    def _intervals(self, plan: Plan, checked: PrivateQuery, noisy: dict, rows: list[tuple]):
        """accuracy() of released rows, from their stored measures (``release.stored_measures``):
        per noisy output column and row, (low, high, half-width) (``dpsql.query.accuracy``)."""
        tracked = bool(noisy) or not stored_names(plan)
        release = from_stored(plan, noisy, len(rows)) if tracked else None  # None: rows merged by DISTINCT

        def cells(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
            return output_cells(plan, checked, release, rows, alpha)

        return cells

    def limits(self, plan: Plan, spender: Spender) -> Limits:
        """The answer's limits line: the plan's limits, with the recorded share of rows each
        private table it reads drops (``Connection.estimate_limits``; a released value: free)."""
        recorded = []
        for key in plan.query.bounded:
            rule = next((t for t in self.policy.private_tables if table_key(t.name) == key), None)
            if rule is not None and not rule.row_level and rule.unit is not None:
                found = recorded_drop(spender, key, rule.unit, rule.max_rows_per_unit)
                recorded += [found] if found is not None else []
        return limits_of(plan, tuple(recorded))

    def explain(self, context: MechanismContext, prepared: Prepared, report_bias: Any = None,
                max_error: Any = None, expected_rows: Any = None) -> str:
        """``db.explain`` of a prepared query, as written (no randomized-response routing);
        ``report_bias`` as given to ``explain`` (a sample leaves only the policy's default out);
        ``max_error`` and ``expected_rows`` as given to ``sql``: each output's predicted ± is shown,
        and whether ``max_error`` would refuse the query."""
        checked, plan, bias = prepared.checked, prepared.plan, prepared.bias
        goal = accuracy_goal(prepared.written, max_error, expected_rows)
        if isinstance(checked, PublicQuery):
            return Explanation("public tables only: runs exactly and costs nothing\n\n"
                               + checked.tree.sql(dialect=DIALECT))
        assert plan is not None
        priced = prepared.priced
        if priced is None:
            return ("GROUP BY public KEYS domains with no aggregate: the keys of the domains "
                    f"({'; '.join(domain_text(k) for k in plan.query.keys)}) are released exactly; "
                    "no private data is read, nothing is charged")
        cost, spender = priced.cost, context.spender
        quote = spender.quote(cost, priced.repeat_key)
        refusal = quote.refusal
        shown = rewrite_statement(plan, self.engine.dialect, pretty=True).sql  # the SQL priced above, on lines
        separate = [separate_statement(plan, m, self.engine.dialect, pretty=True).sql for m in plan.separate]
        sampling = priced.sampling
        predictions = predict_outputs(plan, goal, self._known(context, plan, goal), _scaled(priced))
        text = explain_plan(plan, shown, quote.after.remaining, refused=refusal is not None, separate=separate,
                            amplified=None if sampling is None else (cost, sampling.percent),
                            accuracy=prediction_lines(predictions, goal, plan.epsilon))
        text += self._time_zone_note(plan)
        text += f"\n\nlimits: {self.limits(plan, spender)}"
        if sampling is not None:
            assert priced.base_cost is not None
            share, explicit = bias_share(report_bias, prepared.written.get("report_bias"), self.policy.bias_share,
                                         exact_parameter)
            text += "\n\n" + explain_sampling(sampling, plan, priced.base_cost, cost, self.policy.accounting,
                                              bias_left_out=share is not None and not explicit,
                                              scaled=None if priced.scaling is None else
                                              [c.name for c in priced.scaling.columns])
        if bias is not None:
            text += "\n\n" + explain_bias(bias, bias_sql(bias, plan.query))
        if prepared.auto is not None:
            text += "\n\n" + explain_auto(prepared.auto, prepared.auto.statement.sql)
        # max_error refuses before the budget is consulted: that refusal is the one running it meets first
        met = accuracy_refusal(predictions, goal, plan.epsilon) or refusal
        return Explanation(text + "\n\n" + quote.text, refused=met)

    def _known(self, context: MechanismContext, plan: Plan, goal: AccuracyGoal) -> dict[str, KnownCount]:
        """Counts of a ratio's values the analyst was already given (``dpsql.query.known_counts``):
        looked for only when a ratio's ± needs a count and none was stated."""
        if goal.expected_rows is not None or not any(family_of(a).counted for a in plan.aggregates):
            return {}
        return known_counts(plan, context.spender.released())

    def _time_zone_note(self, plan: Plan) -> str:
        """Which zone date parts of a TIMESTAMPTZ column are taken in (a setting, not data)."""
        zoned = [c for c, t in plan.query.column_types
                 if t.upper().startswith(("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"))]
        if not zoned:
            return ""
        zone = self.engine.time_zone()
        return (f"\n\ntime zone: {', '.join(zoned)} (TIMESTAMP WITH TIME ZONE) are read in {zone}: date parts, "
                "date_trunc and casts to DATE or TIMESTAMP are taken there")

    def keys_only(self, plan: Plan, checked: PrivateQuery, domain: list[tuple]) -> DPResult:
        """GROUP BY public keys with no aggregate: the released keys are the public domain
        itself (narrowed by the WHERE), whatever the data, so nothing private is read or
        charged; post-processing (ORDER BY, LIMIT, expressions of the keys) runs on them."""
        types = [key.type_name or "" for key in plan.query.keys]  # every key is typed once prepared
        post = checked.post
        try:
            _, rows = self.engine.post_processing.post_process(core_columns(plan), types,
                                                               [tuple(row) for row in domain], post)
        except Exception as error:  # public keys only: DuckDB's message reveals nothing private
            raise UnsupportedQuery(f"the query over the public key domain failed: {str(error).splitlines()[0]}",
                                   hint="select the GROUP BY keys, or expressions of them") from None

        def released_types() -> list[str]:  # the keys' own types (an ENUM stays ENUM), as with aggregates
            described = self.engine.post_processing.released_types(core_columns(plan), types, post)
            return [type_name for _, type_name in described[:len(checked.outputs)]]

        return DPResult(list(checked.outputs), rows, QueryCost.free(public=True), exact=True,
                        types=released_types, converter=self.engine.post_processing.convert)

    def public(self, query: PublicQuery) -> DPResult:
        """A query of public tables only: run exactly, free."""
        try:
            frame = self.engine.fetch_df(query.tree)
        except Exception as error:  # public tables only: DuckDB's own message reveals nothing private
            message = str(error).split("\n")[0]
            raise UnsupportedQuery(f"the query over public tables failed: {message}",
                                   hint="check the column and table names") from None
        rows = list(frame.itertuples(index=False, name=None))
        return DPResult(list(frame.columns), rows, QueryCost.free(public=True), exact=True,
                        types=lambda: [type_name for _, type_name in self.engine.describe(query.tree)],
                        converter=self.engine.post_processing.convert)

    def read_keys(self, rows: list[tuple], keys) -> list[tuple]:
        """Fetched rows with their keys as DuckDB reads them back (``dpsql.backends.keys``): an
        engine that writes its own key texts (Spark) translates them (``Backend.key_text``)."""
        return self.engine.read_keys(rows, keys)

    def free_rows(self, statement: BoundedStatement, keys, failure: str) -> list[tuple]:
        """The rows of ``statement``, read with no charge and no record: for an answer that is
        post-processing of data private already (``dpsql.query.local``'s free counts of
        randomized-response reports, which repeat identically). A failure is a bare ``QueryFailed``."""
        return self._executor.execute_free([statement], lambda fetched: self.read_keys(fetched[0], keys), failure)

    def curator_rows(self, statement: BoundedStatement, keys) -> list[tuple]:
        """The rows of ``statement``, for the curator's own checks at connect (nothing is released)."""
        salt = self._executor.salt_for(statement.needs_salt)
        return self.read_keys(self.engine.fetch(statement.sql, salt, bounded=statement.bounded), keys)

    def describe(self, statement: BoundedStatement) -> list[tuple[str, str]]:
        """The (name, type) of each column ``statement`` returns: binds it, reads no rows."""
        parameters = self._executor.salt_for(statement.needs_salt)
        if statement.needs_sample_key:  # binding reads no rows: any key types the statement alike
            parameters = {**(parameters or {}), SAMPLE_KEY_PARAMETER: UNBOUND_SAMPLE_KEY}
        return self.engine.describe(statement.sql, parameters)

