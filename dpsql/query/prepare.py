"""The static half of every query, once: parse → check → options → analyse → cost.

``Connection.sql`` and ``Connection.explain`` both start here, so ``explain`` refuses exactly
what ``sql`` refuses (it binds the keys and type-checks the bounded SQL the same way) and
prices exactly what ``sql`` would charge. Nothing here reads a private row or the ledger
(DESIGN.md invariant 1): the result depends only on the query text, the arguments, the
schema, the policy and public data, which is why it may be cached.

This is also the boundary that turns a refusal's node into its line and column
(``dpsql.sql.parse.located``): the checks below raise with the node, once, here.

The cache keeps prepared queries by their exact SQL text and the arguments that change the
plan (epsilon, delta, noise, weights, report_bias, the analyst for the repeat key); the
policy and catalog are fixed for a connection, and ``clear`` (``Connection.refresh``) drops
everything read from public data. Only successes are kept: a refusal is recomputed. Noise,
the budget and free repeats are decided afresh by the caller on every query.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

import numpy as np
from sqlglot import exp

from dpsql.analysis.aggregates import family_of
from dpsql.analysis.analyse import analyse_query
from dpsql.analysis.check import check_query
from dpsql.analysis.plan import Plan, PrivateQuery, PublicQuery
from dpsql.analysis.sampling import Sampling, check_covers_removal, sampling_of, unbounded_policy
from dpsql.backends.base import Backend
from dpsql.backends.keys import typed_keys
from dpsql.backends.render import DUCKDB
from dpsql.backends.rewrite import BoundedStatement, key_types_statement, rewrite_statement, separate_statement
from dpsql.budget.accounting import Spend, check_accountable, query_cost
from dpsql.budget.amplification import amplified_cost
from dpsql.errors import DPError, InternalError, InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.calibrate import rho_of
from dpsql.policy.model import Policy
from dpsql.query.bias import BiasPlan, bias_share, bias_statement, plan_bias
from dpsql.query.options import (
    apply_contribution_options,
    exact_parameter,
    max_keys,
    merge_options,
    privacy_options,
)
from dpsql.query.scaling import Scaling, plan_scaling
from dpsql.query.unit_bounds import AutoBounds, bounds_of, plan_auto_bounds, with_unit_bounds
from dpsql.sql.literals import binding_text
from dpsql.sql.normalise import normalised_sql, repeat_key
from dpsql.sql.parse import located, parse

Describe = Callable[[BoundedStatement], list]
"""(name, type) of each column a generated statement would return: binds it, reads no rows."""


@dataclass(frozen=True)
class Priced:
    """What answering a query that reads private data would run and cost."""

    cost: Spend
    """What answering costs (``dpsql.budget.accounting.query_cost``)."""
    bounded: BoundedStatement
    """The rewritten statement of the noisy core."""
    core_types: tuple[str, ...]
    """DuckDB types of the noisy core's columns (keys as the database types them)."""
    normal_sql: str
    """The normalised SQL recorded in the ledger."""
    repeat_key: str
    """The key an identical query's stored answer is found under (``dpsql.sql.normalise``)."""
    separate: tuple[BoundedStatement, ...] = ()
    """The statements of the plan's separate measures, in order (rendered here, before the
    charge: an engine that cannot write one refuses the query instead of failing after it)."""
    bias_counting: BoundedStatement | None = None
    """The statement counting what the bounds dropped and clamped (``dpsql.query.bias``), if reported."""
    sampling: Sampling | None = None
    """The Poisson sample of units the query runs on (``TABLESAMPLE POISSON``), if any: then
    ``cost`` is the amplified cost of ``base_cost`` (``dpsql.budget.amplification``)."""
    base_cost: Spend | None = None
    """With ``sampling``: what the mechanism costs on the sample, before amplification."""
    scaling: Scaling | None = None
    """The ``scale_sample`` option's scaling of the answer's totals to the table (``dpsql.query.scaling``)."""


@dataclass(frozen=True)
class Prepared:
    """A query ready to charge and run (``sql``) or to explain: everything static about it."""

    tree: exp.Expression
    """The parsed query, without comments and without dpsql's OPTIONS clause."""
    checked: PrivateQuery | PublicQuery
    """The checked query, with the contribution options written in the SQL applied."""
    written: dict
    """Options written in the SQL: name -> ``dpsql.sql.dialect.OptionValue``."""
    plan: Plan | None = None
    """The analysed plan, its keys typed as the database types them; ``None`` for public queries."""
    bias: BiasPlan | None = None
    """The bias report's plan, when one is asked for and there is something to report."""
    priced: Priced | None = None
    """What it would run and cost; ``None`` when nothing private is read (public tables, or
    GROUP BY public keys with no aggregate)."""
    auto: AutoBounds | None = None
    """With ``unit_bounds_share``: the draws of bounds per unit run first (``dpsql.query.unit_bounds``);
    ``plan`` and ``priced`` are then the rows model at the remaining epsilon, priced at the whole."""
    replan: Callable[[dict], Replanned] | None = None
    """With ``auto``: the plan and statements at the drawn bounds (column -> B), or ``None``."""


@dataclass(frozen=True)
class Replanned:
    """A query planned again at bounds per unit drawn after the charge (post-processing of them)."""

    plan: Plan
    bounded: BoundedStatement
    separate: tuple[BoundedStatement, ...]
    core_types: tuple[str, ...]


class Preparer:
    """Prepares queries for one connection (one policy, one catalog) and keeps them."""

    def __init__(self, policy: Policy, catalog: dict, data: Backend | None, describe: Describe, column_names: frozenset,
                 policy_text: str, *, limit: int = 256):
        self.policy = policy
        self._catalog = catalog
        self._data = data
        self._describe = describe
        self._column_names = column_names
        self._policy_text = policy_text
        self._limit = limit
        self._checked: OrderedDict[str, tuple] = OrderedDict()
        self._prepared: OrderedDict[tuple, Prepared] = OrderedDict()
        self._normal: OrderedDict[str, str] = OrderedDict()
        self._statements: OrderedDict[tuple, tuple[BoundedStatement, tuple[str, ...]]] = OrderedDict()
        self._key_types: OrderedDict[Any, dict] = OrderedDict()
        self._bound: OrderedDict[tuple, dict] = OrderedDict()
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._dialect = getattr(data, "dialect", DUCKDB)
        """The SQL dialect statements are rendered in: the engine's."""

    def prepare(self, sql: str, epsilon: Any = None, delta: Any = None, noise: str | None = None,
                weights: dict | None = None, report_bias: Any = None, *, analyst: str | None = None,
                unit_bounds_share: Any = None) -> Prepared:
        """The prepared query (from the cache when this text was prepared with these
        arguments); a refusal carries its line and column in ``sql``."""
        self._forget_if_refreshed()
        key = _cache_key(sql, epsilon, delta, noise, weights, report_bias, analyst, unit_bounds_share)
        if key is not None:
            found = self._recall(self._prepared, key)
            if found is not None:
                return found
        try:
            prepared = self._prepare(sql, epsilon, delta, noise, weights, report_bias, analyst, unit_bounds_share)
        except DPError as error:
            raise located(error, sql) if isinstance(sql, str) else error
        if key is not None:
            self._keep(self._prepared, key, prepared)
        return prepared

    def _forget_if_refreshed(self) -> None:
        """Everything kept was derived from public facts of one generation of the engine's
        stored public relations (``Backend.public_generation``); another connection on the same
        database may refresh them, and then a kept join multiplicity could be stale."""
        generation = self._data.public_generation() if self._data is not None else 0
        if generation != self._generation:
            self.clear()
            self._generation = generation

    def clear(self) -> None:
        """Forget everything prepared: public data or the schema may have changed."""
        with self._lock:
            self._checked.clear()
            self._prepared.clear()
            self._normal.clear()
            self._statements.clear()
            self._key_types.clear()
            self._bound.clear()

    def _prepare(self, sql: str, epsilon: Any, delta: Any, noise: str | None, weights: dict | None,
                 report_bias: Any, analyst: str | None, unit_bounds_share: Any = None) -> Prepared:
        tree, checked, written = self.check(sql)
        if isinstance(checked, PublicQuery):
            return Prepared(tree, checked, written)
        epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
        share = _unit_bounds_share(written, unit_bounds_share)
        if share is not None:
            return self._with_auto_bounds(sql, tree, checked, written, share, epsilon, delta, noise, weights,
                                          report_bias, analyst)
        plan, bias = self.plan_with_bias(checked, sql, epsilon, delta, noise, weights, report_bias, written)
        sampling = self._sampling(tree, checked, sql)
        if sampling is not None and bias is not None:
            plan, bias = self._without_bias(tree, checked, sql, epsilon, delta, noise, weights, report_bias, written)
        if plan.query.keys and plan.selection is None:
            max_keys(self.policy, written)  # a wrong max_keys option is refused before anything runs
        if not plan.query.aggregates and plan.selection is None:
            return Prepared(tree, checked, written, plan, bias)  # public keys only: nothing private is read
        bounded, core_types = self._statement(sql, plan, tree)
        normal, repeat = self._repeat_key(sql, tree, plan, bias, analyst)
        cost = base_cost = query_cost(plan)
        check_accountable(self.policy.accounting, cost)  # explain refuses it too, as sql() does
        if sampling is not None:
            if plan.neighbours == "bounded":  # the amplification theorem needs removals covered too
                options = privacy_options(self.policy, epsilon, delta, noise, weights)
                check_covers_removal(plan, analyse_query(plan.query, unbounded_policy(self.policy), options))
            cost = amplified_cost(base_cost, sampling.rate)
        separate = tuple(separate_statement(plan, measure, self._dialect) for measure in plan.separate)
        counting = bias_statement(bias, plan.query, self._dialect) if bias is not None else None
        scaling = plan_scaling(plan, checked, sampling, written)
        priced = Priced(cost, bounded, core_types, normal, repeat, separate, counting, sampling,
                        base_cost if sampling is not None else None, scaling)
        return Prepared(tree, checked, written, plan, bias, priced)

    def _with_auto_bounds(self, sql: str, tree: exp.Expression, checked: PrivateQuery, written: dict,
                          share: Fraction, epsilon: Any, delta: Any, noise: str | None, weights: dict | None,
                          report_bias: Any, analyst: str | None) -> Prepared:
        """A query with ``unit_bounds_share`` (``dpsql.query.unit_bounds``): the rows model at the
        remaining epsilon, priced at the whole, with the draws that run first. A bias report,
        a Poisson sample and partition selection are refused with it (each would need its own
        share of the same epsilon, or reads outside what the draw reads); the policy's default
        bias report is left out."""
        where = written.get("unit_bounds_share")

        def refused(message: str, hint: str) -> DPError:
            return UnsupportedQuery(message, hint=hint, line=where.line if where is not None else None,
                                    col=where.col if where is not None else None)

        if bias_share(report_bias, written.get("report_bias"), self.policy.bias_share, exact_parameter)[1]:
            raise refused("unit_bounds_share and a bias report would each take a share of the query's epsilon",
                          "ask for one of them")
        if tree.find(exp.TableSample) is not None:
            raise refused("unit_bounds_share cannot be used with TABLESAMPLE", "query the whole table")
        total = privacy_options(self.policy, epsilon, delta, noise).epsilon
        remaining = total * (1 - share)
        plan = self.plan(checked, sql, remaining, delta, noise, weights)
        if plan.selection is not None:
            raise refused("unit_bounds_share cannot be used with GROUP BY keys released by partition selection",
                          "group by columns with KEYS in the policy")
        try:
            auto = plan_auto_bounds(plan, share, total, self._dialect)
        except DPError as error:
            raise refused(error.message, error.hint or "leave unit_bounds_share out") from None
        priced_plan = replace(plan, epsilon=plan.epsilon + auto.epsilon)
        bounded, core_types = self._statement(sql, plan, tree)
        normal, repeat = self._repeat_key(sql, tree, priced_plan, None, analyst)
        repeat = repeat_key(repeat, options={"unit_bounds_share": str(share)}, policy_text=self._policy_text,
                            analyst=analyst)  # the draws' share changes how the answer is drawn
        cost = query_cost(priced_plan)
        check_accountable(self.policy.accounting, cost)
        separate = tuple(separate_statement(plan, measure, self._dialect) for measure in plan.separate)
        priced = Priced(cost, bounded, core_types, normal, repeat, separate)

        def replan(chosen: dict) -> Replanned:
            query = with_unit_bounds(plan.query, bounds_of(auto, chosen))
            again = self.plan(query, None, remaining, delta, noise, weights)  # type: ignore[arg-type]
            # the keys are typed as before: the bounds change no key
            again = replace(again, query=replace(again.query, keys=plan.query.keys),
                            epsilon=again.epsilon + auto.epsilon)
            again = _within_priced_rho(again, cost)
            statement = rewrite_statement(again, self._dialect)
            return Replanned(again, statement,
                             tuple(separate_statement(again, m, self._dialect) for m in again.separate),
                             self.core_types(again, statement))

        return Prepared(tree, checked, written, priced_plan, None, priced, auto, replan)

    def _sampling(self, tree: exp.Expression, checked: PrivateQuery, sql: str) -> Sampling | None:
        """The query's Poisson sample (``dpsql.analysis.sampling``); a refusal is placed at the
        first TABLESAMPLE of the text."""
        try:
            return sampling_of(checked.source)
        except UnsupportedQuery as error:
            at = tree.find(exp.TableSample)
            raise located(UnsupportedQuery(error.message, hint=error.hint, node=at), sql) from None

    def _without_bias(self, tree: exp.Expression, checked: PrivateQuery, sql: str, epsilon: Any, delta: Any,
                      noise: str | None, weights: dict | None, report_bias: Any, written: dict) -> tuple[Plan, None]:
        """A sampled query has no bias report: the report reads each unit's raw row count, outside
        the sample. One asked for is refused; the policy's default share is left out (the
        aggregates get the whole epsilon; ``explain`` says so)."""
        _, explicit = bias_share(report_bias, written.get("report_bias"), self.policy.bias_share, exact_parameter)
        if explicit:
            raise located(UnsupportedQuery(
                "a bias report reads each unit's rows outside the Poisson sample, so a query with TABLESAMPLE "
                "POISSON cannot carry one", hint="leave report_bias out, or query the whole table",
                node=tree.find(exp.TableSample)), sql)
        return self.plan(checked, sql, epsilon, delta, noise, weights), None

    def check(self, sql: str) -> tuple[exp.Expression, PrivateQuery | PublicQuery, dict]:
        """Parse and check, kept per SQL text: (query tree, checked query, written options)."""
        self._forget_if_refreshed()
        found = self._recall(self._checked, sql) if isinstance(sql, str) else None
        if found is not None:
            return found
        parsed = parse(sql)
        checked = check_query(parsed.tree, sql, self.policy, self._catalog, self._data)
        if self._data is not None:  # what this engine cannot run as DuckDB would is refused here
            self._data.check(parsed.tree, isinstance(checked, PrivateQuery))
        if isinstance(checked, PrivateQuery):
            checked = apply_contribution_options(checked, parsed.options)
        result = (parsed.tree, checked, parsed.options)
        self._keep(self._checked, sql, result)
        return result

    def plan_with_bias(self, checked: PrivateQuery, sql: str, epsilon: Any, delta: Any, noise: str | None,
                        weights: dict | None, report_bias: Any, written: dict) -> tuple[Plan, BiasPlan | None]:
        """The plan and its bias report (``None``: none): the report's share of epsilon is taken
        out of the query's before the aggregates get theirs, so the total cost is unchanged."""
        share, explicit = bias_share(report_bias, written.get("report_bias"), self.policy.bias_share,
                                     exact_parameter)
        if share is None:
            return self.plan(checked, sql, epsilon, delta, noise, weights), None
        total = privacy_options(self.policy, epsilon, delta, noise).epsilon
        try:
            plan = self.plan(checked, sql, total * (1 - share), delta, noise, weights)
        except InvalidParameter:
            self.plan(checked, sql, epsilon, delta, noise, weights)  # fails alike: not the share's doing
            where = written.get("report_bias")
            raise InvalidParameter(
                f"report_bias {float(share)!r} takes that share of epsilon {float(total):.3g} for the bias "
                f"report and leaves the aggregates {float(total * (1 - share)):.3g}: too small for their noise, "
                "beyond what the exact samplers draw", line=where.line if where is not None else None,
                col=where.col if where is not None else None,
                hint="ask a smaller share for the report, such as report_bias=0.05 (the share must be above 0 "
                     "and below 1, and leave the aggregates enough), or a larger epsilon") from None
        bias = plan_bias(plan, share, total, explicit, written.get("report_bias"))
        if bias is None:  # nothing to report here: the aggregates get the whole epsilon
            return self.plan(checked, sql, epsilon, delta, noise, weights), None
        return replace(plan, epsilon=plan.epsilon + bias.epsilon), bias

    def plan(self, query: PrivateQuery, sql: str, epsilon: Any, delta: Any, noise: str | None,
             weights: dict | None = None) -> Plan:
        """The plan of a checked query; a refusal carries its position in ``sql`` (this is a
        boundary too: tests and benchmarks call it without ``prepare``)."""
        try:
            plan = analyse_query(query, self.policy, privacy_options(self.policy, epsilon, delta, noise, weights))
        except DPError as error:
            raise located(error, sql) if isinstance(sql, str) else error
        if not plan.query.keys:
            return plan
        # Each key's DuckDB type, by binding the keys' SQL (schema only, no rows): it decides how
        # the key is read back exactly, and refuses, before the charge, keys that cannot be.
        types = self._recall(self._key_types, sql) if isinstance(sql, str) else None
        if types is None and self._dialect == DUCKDB:
            types = stored_key_types(plan.query)
        if types is None:  # the keys' types follow from the text alone (schema and policy fixed)
            # ... and not from the numbers it compares: a comparison is BOOLEAN whatever its
            # number, so a text alike but for them has keys of the same types (``sql/literals``)
            alike = self._alike(sql)
            types = self._recall(self._key_types, alike) if alike is not None else None
            if types is None:
                types = dict(self._describe(key_types_statement(plan, self._dialect)))
                if alike is not None:
                    self._keep(self._key_types, alike, types)
            if isinstance(sql, str):
                self._keep(self._key_types, sql, types)
        return replace(plan, query=replace(plan.query, keys=typed_keys(plan.query.keys, types)))

    def _alike(self, sql: Any) -> tuple | None:
        """``sql`` with its compared plain numbers abstracted (``sql/literals.binding_text``), from
        its parsed tree as ``check`` keeps it; ``None`` when there is none to abstract."""
        found = self._recall(self._checked, sql) if isinstance(sql, str) else None
        text = binding_text(sql, found[0]) if found is not None else None
        return None if text is None else ("keys", text)

    def _statement(self, sql: str, plan: Plan, tree: exp.Expression | None = None
                   ) -> tuple[BoundedStatement, tuple[str, ...]]:
        """The bounded statement of ``plan`` and its core types, kept per (text, measure shapes):
        the rewrite reads the checked query (fixed by the text) and each measure's grid and
        bounds, never epsilon, delta or a noise scale, so a new epsilon on the same text
        reuses it unless it moves a grid (``dpsql.analysis.analyse.choose_grid``). ``tree``: the
        text's parsed query, whose compared numbers the bind is kept without (``_bind_key``)."""
        shape = _statement_shape(plan)
        key = (sql, shape) if isinstance(sql, str) else None
        found = self._recall(self._statements, key) if key is not None else None
        if found is None:
            bounded = rewrite_statement(plan, self._dialect)
            found = (bounded, self.core_types(plan, bounded, _bind_key(sql, tree, shape, bounded)))
            if key is not None:
                self._keep(self._statements, key, found)
        return found

    def core_types(self, plan: Plan, bounded: BoundedStatement, bind_key: tuple | None = None) -> tuple[str, ...]:
        """DuckDB types of the noisy core's columns (keys as the database types them); binding
        the SQL refuses a query that does not type-check, before anything is charged. A bind that
        succeeded is kept under ``bind_key`` (``_bind_key``): the same text but for the values of
        the numbers it compares, planned to the same shape, binds alike."""
        described = self._recall(self._bound, bind_key) if bind_key is not None else None
        if described is None:
            try:
                described = dict(self._describe(bounded))
            except UnsupportedQuery:
                raise
            except Exception as error:  # binding reads the schema only: its message holds no data
                message = str(error).split("\n")[0]
                raise UnsupportedQuery(f"the query does not type-check: {message}",
                                       hint="compare and combine columns of matching types") from None
            if bind_key is not None:
                self._keep(self._bound, bind_key, described)
        types = [key.type_name or described[key.name] for key in plan.query.keys]
        for aggregate in plan.aggregates:
            types.append(family_of(aggregate).result_type(aggregate, plan.measure(aggregate.measures[0])))
        return tuple(types)

    def _repeat_key(self, sql: str, tree: exp.Expression, plan: Plan, bias: BiasPlan | None,
                    analyst: str | None) -> tuple[str, str]:
        """The normalised SQL and the key its answer is stored under. The options in the key are
        the plan's: its totals and every measure's share and noise, so anything that changes
        how the answer is drawn (epsilon, delta, noise, weights) changes the key."""
        normal = self._recall(self._normal, sql)
        if normal is None:  # the text alone decides it: kept per SQL text, like the check
            normal = normalised_sql(tree, self._column_names)
            self._keep(self._normal, sql, normal)
        measures = [[m.name, m.noise, str(m.epsilon), str(m.delta), str(m.scale)]
                    for m in plan.measures]
        rule = plan.query.rule  # the contribution limits decide which rows count, not only the noise
        options: dict[str, Any] = {
            "epsilon": str(plan.epsilon), "delta": str(plan.delta), "measures": measures,
            "selection": None if plan.selection is None else repr(plan.selection),
            "limits": [rule.unit, rule.max_rows_per_unit, rule.max_groups_per_unit]}
        if bias is not None:  # a report changes how the epsilon was split and what was released
            options["bias"] = str(bias.share)
        return normal, repeat_key(normal, options=options, policy_text=self._policy_text, analyst=analyst)

    def _recall(self, cache: OrderedDict, key: Any) -> Any:
        with self._lock:
            found = cache.get(key)
            if found is not None:
                cache.move_to_end(key)
            return found

    def _keep(self, cache: OrderedDict, key: Any, value: Any) -> None:
        with self._lock:
            cache[key] = value
            while len(cache) > self._limit:
                cache.popitem(last=False)


def stored_key_types(query: PrivateQuery) -> dict[str, str] | None:
    """Each key's type when every key is a column of the query's relation as stored: the
    relation's own column type, which is what binding ``SELECT column AS g0`` over it gives
    (tests/test_prepare_speed.py checks that for a column of every DuckDB type, read from a
    table, a join and a subquery). ``None`` when a key is an expression: that one is bound.
    Saves a render and a bind (about 2 ms at 1,000 rows) on most grouped queries.

    >>> from dpsql.analysis.plan import GroupKey
    >>> from types import SimpleNamespace
    >>> q = SimpleNamespace(keys=(GroupKey("g0", exp.column("day", quoted=True), None),),
    ...                     column_types=(("day", "DATE"),), source=None)
    >>> stored_key_types(q)
    {'g0': 'DATE'}
    """
    if query.source is not None and query.source.find(exp.SetOperation) is not None:
        return None  # a UNION's column has its branches' common type, not its first branch's (an attacker's review)
    stored = dict(query.column_types)
    types = {}
    for key in query.keys:
        column = key.expression
        if not isinstance(column, exp.Column) or column.table or column.name.lower() not in stored:
            return None
        types[key.name] = stored[column.name.lower()]
    return types


_PLAIN = (type(None), bool, int, float, str, Fraction, Decimal, np.generic)


def _within_priced_rho(plan: Plan, priced: Spend) -> Plan:
    """``plan`` (re-planned at drawn per-unit bounds) with its Gaussian noise widened, where needed,
    so that its rho is at most the rho charged before the draw. Both plans calibrate each measure
    to the same (epsilon, delta) shares, but sigma^2 rounds differently for another sensitivity, so
    the re-planned rho could exceed the charge by about 1e-8 of it (an attacker's review, under
    ACCOUNTING ZCDP). More noise keeps every measure's (epsilon, delta). Where widening cannot fit
    (the non-Gaussian parts alone exceed the charge) this raises, and the priced rows-model plan
    answers instead."""
    spent = query_cost(plan)
    if priced.rho is None or spent.rho is None or spent.rho <= priced.rho:
        return plan
    gaussian = sum((rho_of(m.sensitivity.l2_squared, m.scale) for m in plan.measures if m.noise == "gaussian"),
                   Fraction(0))
    room = priced.rho - (spent.rho - gaussian)
    if gaussian == 0 or room <= 0:
        raise InternalError("the re-planned query's rho exceeds its charge")
    widen = gaussian / room
    return replace(plan, measures=tuple(replace(m, scale=m.scale * widen) if m.noise == "gaussian" else m
                                        for m in plan.measures))


_NOISE_ONLY = frozenset({"sensitivity", "epsilon", "delta", "noise", "scale"})
"""The fields of a ``Measure`` the rewrite never reads: they set the noise, not the SQL."""


def _statement_shape(plan: Plan) -> tuple:
    """Everything of ``plan`` the rewrite may read besides its checked query: every field of each
    measure but the noise-only ones (a denylist, so a field added later keys the cache by default:
    an attacker's review found the per-unit clamp missing from a hand-kept list, and a rows-model
    statement answering a per-unit plan), and the partition-selection column."""
    measures = tuple(tuple((f.name, getattr(m, f.name)) for f in dataclasses.fields(m) if f.name not in _NOISE_ONLY)
                     for m in plan.measures)
    return measures, None if plan.selection is None else plan.selection.measure


def _bind_key(sql: Any, tree: exp.Expression | None, shape: tuple, bounded: BoundedStatement) -> tuple | None:
    """The key a bind of ``bounded`` is kept under: the text with its compared plain numbers
    abstracted to their class (``dpsql.sql.literals.binding_text``), the plan's shape (so a number
    that moves a bound, a grid or a clamp keys apart) and what the statement binds with; ``None``
    when the text compares no such number (the exact-text cache serves it)."""
    if not isinstance(sql, str) or tree is None:
        return None
    text = binding_text(sql, tree)
    if text is None:
        return None
    return text, shape, bounded.needs_salt, bounded.needs_sample_key, bounded.bounded


def _cache_key(sql: Any, *arguments: Any) -> tuple | None:
    """A key telling apart every distinct (text, arguments) — by type and exact text, so 0.1 and
    Fraction(1, 10) are two keys, never one — or ``None`` when an argument has no such form.

    >>> _cache_key("SELECT 1", 0.5, None) == _cache_key("SELECT 1", 0.5, None)
    True
    >>> _cache_key("SELECT 1", 1, None) == _cache_key("SELECT 1", True, None)
    False
    """
    if not isinstance(sql, str):
        return None
    parts: list[Any] = [sql]
    for argument in arguments:
        if isinstance(argument, dict):
            items = [(_plain_key(k), _plain_key(v)) for k, v in argument.items()]
            if any(k is None or v is None for k, v in items):
                return None
            parts.append(("dict", tuple(items)))
            continue
        plain = _plain_key(argument)
        if plain is None:
            return None
        parts.append(plain)
    return tuple(parts)


def _unit_bounds_share(written: dict, given: Any) -> Fraction | None:
    """The ``unit_bounds_share`` asked for (the argument, else the SQL's option), else ``None``;
    it must be above 0 and below 1."""
    option = written.get("unit_bounds_share")
    value = given if given is not None else option.value if option is not None else None
    if value is None:
        return None
    share = exact_parameter(value, "unit_bounds_share")
    if not 0 < share < 1:
        raise InvalidParameter(f"unit_bounds_share must be above 0 and below 1, got {value}",
                               line=option.line if option is not None and given is None else None,
                               col=option.col if option is not None and given is None else None,
                               hint="write a share of the query's epsilon such as unit_bounds_share = 0.2")
    return share


def _plain_key(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, _PLAIN):
        return None
    return type(value).__qualname__, repr(value)
