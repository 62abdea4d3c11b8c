"""Stage 5, rewrite: a plan becomes one statement that makes the analysed bounds true.

The statement is built as a sqlglot tree and rendered once, for the backend's dialect
(``dpsql.sql.pieces`` holds the engine-specific pieces: TRY, HUGEINT sums, the salted hash,
keys' read-back text, ISNAN, the bounded copies; ``dpsql.backends.render`` writes each engine's
form); what it reads and whether it needs the salt come from the tree (``BoundedStatement``),
never from its text.

The statement has four layers; each establishes part of the precondition of
``dpsql.analysis.sensitivity`` (a unit's contribution vector lies in k * conv({L e_g, U e_g, 0})):

1. ``dp_rows``: filter (WHERE made total with TRY), keep only rows whose keys are in the public
   domain, and compute each measure's raw per-row value on its integer grid. Every
   expression that can fail is wrapped in TRY, so a failing row becomes NULL — no row can
   raise an error the analyst sees.
2. ``dp_values``: clamp each raw value into its integer bounds [L, U], keeping NULL as NULL
   (DuckDB's LEAST/GREATEST skip NULLs, so a bare clamp would turn NULL into a bound).
   Bounded columns are clamped before the expression is evaluated too (NaN becomes NULL,
   +-inf become the bounds), so the analyst's arithmetic sees policy-bounded inputs. Where it
   is exactly the same value and type (DOUBLE columns, BIGINT grid values) a clamp is written
   with comparisons alone (``_compared_clamp``), at about half the per-row cost.
3. ``dp_units``: one row per (unit, group) with its row
   count ``n`` and per-measure sums and non-NULL counts. Then each (unit, group) is granted
   ``b = clamp(k - rows granted to the unit's earlier groups, 0, n)`` rows, the groups of a
   unit taken in the order of a salted hash of the unit's own (unit, key) values, and at most
   MAX GROUPS PER UNIT groups kept. So sum_g b_g <= k, and which contributions survive
   depends only on the unit's own rows and the secret salt (never on row order or rowid).
   A COUNT contributes b (or min(non-NULL count, b)); a SUM contributes its group sum scaled
   by c / (its non-NULL count), c = min(non-NULL count, b) — the total of c of its values on
   average — clamped into c * [min(L, 0), max(U, 0)].
4. the final GROUP BY adds the contributions up per group: exact integer (HUGEINT) sums
   (DuckDB sums BIGINT into HUGEINT).

A row-level table (PRIVACY UNIT ROW) takes every step of a unit-level one: its unit column is
its copy's hidden per-row id (``dpsql.backends.bounding``), so a join that turns its row into m rows
gives that unit k·m rows, groups and histogram values, and partition selection counts ids.
When the source is a private table's bounded copy (``dpsql.backends.bounding``: at most k rows per
unit whatever the data), layer 3 would grant every row, so it is replaced by what it would
still do: nothing (ungrouped, or MAX GROUPS PER UNIT not below k), or keeping each unit's
first MAX GROUPS PER UNIT groups in salted-hash order (``dp_limited``), which units with few
kept rows in the copy skip (also through a join with public tables, by its multiplicity:
``_with_unit_rows``); tests compare both forms on data (``tests/test_flat.py``), and the
brute-force oracles run through the copies.
The salt is a query parameter (``$salt``), so EXPLAIN shows the SQL without the secret.

Under the per-unit contribution model (``Measure.unit_bounds``) each (unit, group)'s contribution
is then clamped once more, into its bounds per unit — its total, or its own average (total // its
values) — before the final GROUP BY (``_per_unit_clamped``); the paths without layer 3 first sum
each measure per (unit, group) (``_totals_per_unit_first``) to clamp there.

With partition selection the final layer also counts the distinct units of each group (``u``):
one per (unit, group) kept, so a unit moves at most MAX GROUPS PER UNIT of these counts by 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.domains import domain_parts, on_value, reports_outside
from dpsql.analysis.plan import ClampedColumn, Factor, GroupKey, Measure, Plan
from dpsql.analysis.ranges import clamp_arguments
from dpsql.backends.bounding import UNIT_ROWS, with_unit_rows
from dpsql.backends.keys import key_expression
from dpsql.backends.render import DUCKDB, render
from dpsql.policy.model import KeyDomain
from dpsql.sql import pieces
from dpsql.sql.pieces import (
    CopiedTable,
    InSample,
    SaltedHash,
    catalog_type,
    exact_integer,
    is_nan,
    salted_hash,
    star,
    total,
)


@dataclass(frozen=True)
class BoundedStatement:
    """A statement the backend runs, with what it needs besides its text."""

    sql: str
    """The statement, rendered for one engine."""
    needs_salt: bool
    """It orders by a salted hash: the secret salt is bound as its parameter."""
    bounded: tuple[str, ...]
    """The private tables it reads (``PrivateQuery.bounded``): their bounded copies are built before it runs."""
    needs_sample_key: bool = False
    """It reads a Poisson sample (``TABLESAMPLE POISSON``): the query's secret sample key is
    bound as its parameter (``dpsql.sql.pieces.InSample``)."""


def statement(tree: exp.Expr, plan: Plan, dialect: str = DUCKDB, pretty: bool = False) -> BoundedStatement:
    """``tree`` (a statement over ``plan``'s source, built for it alone: rendered in place)
    rendered, with the salt it needs and the copies it reads."""
    # Before rendering, while each is still one node; one walk for both (a walk of a grouped
    # statement's tree costs about 0.3 ms).
    found = [node for node in tree.walk() if isinstance(node, (SaltedHash, InSample))]
    salted = any(isinstance(node, SaltedHash) for node in found)
    sampled = any(isinstance(node, InSample) for node in found)
    return BoundedStatement(render(tree, dialect, copy=False, pretty=pretty), salted, plan.query.bounded, sampled)


def rewrite_statement(plan: Plan, dialect: str = DUCKDB, pretty: bool = False) -> BoundedStatement:
    """The bounded statement of ``plan``: columns ``g0..`` (keys), ``m0..`` (exact summed
    measures), then ``u`` (distinct units per group) with partition selection. ``pretty``: laid
    out on lines, as EXPLAIN shows it."""
    return statement(_bounded(replace(plan, measures=plan.summed)), plan, dialect, pretty)


def separate_statement(plan: Plan, measure: Measure, dialect: str = DUCKDB, pretty: bool = False) -> BoundedStatement:
    """The bounded statement of a measure computed on its own (a quantile histogram, distinct values)."""
    tree = _histogram(plan, measure) if measure.kind == "histogram" else _distinct(plan, measure)
    return statement(tree, plan, dialect, pretty)


def rewrite_plan(plan: Plan, dialect: str = DUCKDB) -> str:
    """The SQL of ``rewrite_statement``."""
    return rewrite_statement(plan, dialect).sql


def rewrite_distinct(plan: Plan, measure: Measure, dialect: str = DUCKDB) -> str:
    return statement(_distinct(plan, measure), plan, dialect).sql


def rewrite_histogram(plan: Plan, measure: Measure, dialect: str = DUCKDB) -> str:
    return statement(_histogram(plan, measure), plan, dialect).sql


def rows_statement(plan: Plan, final: exp.Select, layers: Sequence[tuple[str, exp.Expr]],
                   dialect: str = DUCKDB) -> BoundedStatement:
    """``final`` over the bounded rows of ``plan``: the CTEs ``dp_rows`` and ``dp_values`` (each
    row of the relation with its unit ``dp_unit``, its keys by their names ``g0..`` where the plan
    has keys, and each measure's clamped value ``v_<measure>`` on its grid, NULL where the row has
    none), then ``layers``. For a mechanism that aggregates the bounded rows itself and bounds each
    unit's part by construction (``dpsql.calls.fit_sql``: per-unit clipped gradients;
    ``dpsql.calls.synthesize``: a unit's at most k rows of the bounded copy, counted per cell)."""
    keys = [key.name for key in plan.query.keys]
    tree = _with(final, [("dp_rows", _rows_layer(plan)), ("dp_values", _values_layer(plan, keys)), *layers])
    return statement(tree, plan, dialect)


def unit_totals_statement(plan: Plan, edges: dict[str, Sequence[int]], dialect: str = DUCKDB) -> BoundedStatement:
    """(dp_measure, dp_bucket, dp_count) rows: for each measure named in ``edges`` (a sum of its
    clamped row values ``v_<measure>``, on its grid), how many (unit, group) totals T of it have
    |T| in each bucket: the smallest j with |T| <= edges[j] (len(edges): beyond them all); a
    total of only NULL values counts as 0. Each unit keeps its first MAX GROUPS PER UNIT groups
    in salted-hash order (``_group_limit_layer``), so it has at most that many totals (one
    without GROUP BY): the precondition of ``dpsql.mechanisms.total_bound``'s sensitivity."""
    query = plan.query
    keys = [key.name for key in query.keys]
    measures = [m for m in plan.measures if m.name in edges]
    single = replace(plan, measures=tuple(measures))
    layers: list[tuple[str, exp.Expr]] = [("dp_rows", _rows_layer(single)), ("dp_values", _values_layer(single, keys))]
    source = "dp_values"
    if keys:
        layers.append(("dp_limited", _group_limit_layer(single, keys)))
        source = "dp_limited"
    grouping = [_column(name) for name in ["dp_unit", *keys]]
    sums = [_as(exp.Sum(this=_column(f"v_{m.name}")), f"t_{m.name}") for m in measures]
    layers.append(("dp_unit_totals", _select([*grouping, *sums], source, group=[c.copy() for c in grouping])))
    parts: list[exp.Select] = []
    for measure in measures:
        magnitude = exp.Abs(this=exp.Coalesce(this=_column(f"t_{measure.name}"), expressions=[_number(0)]))
        bucket = pieces.bucket_of(magnitude, [_number(edge) for edge in edges[measure.name]])
        parts.append(_select([_as(exp.Literal.string(measure.name), "dp_measure"), _as(bucket, "dp_bucket"),
                              _as(exp.Count(this=exp.Star()), "dp_count")], "dp_unit_totals",
                             group=[_column("dp_bucket")]))
    final: exp.Expr = parts[0]
    for part in parts[1:]:
        final = exp.Union(this=final, expression=part, distinct=False)
    return statement(_with(final, layers), plan, dialect)  # type: ignore[arg-type]


def key_types_statement(plan: Plan, dialect: str = DUCKDB) -> BoundedStatement:
    """A statement whose columns ``g0..`` are the query's keys as written (no measures): binding
    it gives each key's type, which decides how the key is read back (``dpsql.backends.keys``)."""
    untyped = tuple(replace(key, form="value") for key in plan.query.keys)
    single = replace(plan, measures=(), query=replace(plan.query, keys=untyped))
    return statement(_rows_layer(single), plan, dialect)


# -- building blocks ---------------------------------------------------------------------------

def _column(name: str, table: str | None = None) -> exp.Column:
    """One of dpsql's own columns (``dp_unit``, ``g0``, ``v_m0``, ...): never quoted."""
    return exp.column(name, table=table)


def _stored(name: str) -> exp.Column:
    """A column of the analyst's table, quoted as stored."""
    return exp.column(name, quoted=True)


def _number(value: int | Fraction) -> exp.Expr:
    return pieces.literal(value)


def _call(name: str, *arguments: exp.Expr) -> exp.Expr:
    """A function written as named in every engine (LEAST, GREATEST skip NULLs in both)."""
    return exp.Anonymous(this=name, expressions=list(arguments))


def _paren(node: exp.Expr) -> exp.Expr:
    return exp.Paren(this=node)


def _cast(node: exp.Expr, type_name: str) -> exp.Expr:
    return exp.Cast(this=node, to=exp.DataType.build(type_name, dialect=DUCKDB))


def _clamp(value: exp.Expr, low: exp.Expr, high: exp.Expr) -> exp.Expr:
    return _call("LEAST", _call("GREATEST", value, low), high)


def _null_or_clamped(missing: exp.Expr, value: exp.Expr, low, high) -> exp.Expr:
    """NULL when ``missing`` holds, else ``value`` clamped: NULL never becomes a bound."""
    return exp.Case(ifs=[exp.If(this=missing, true=exp.Null())], default=_clamp(value, low, high))


def _compared_clamp(value: exp.Expr, low: exp.Expr, high: exp.Expr, floating: bool) -> exp.Expr:
    """``value`` clamped into [low, high] by comparisons alone, NULL kept NULL (and NaN made NULL
    when ``floating``): exactly ``_null_or_clamped`` with its NULL (and NaN) test, at about half
    its per-row cost (LEAST and GREATEST are generic functions; benchmarks/RESULTS.md, issue 26).

    A NULL fails every comparison, so it falls through to NULL. NaN sorts above every number in
    DuckDB and Spark, so it passes neither ``< low`` nor ``<= high`` and fails ``NOT ISNAN``:
    NULL; +inf passes that test (``high``), -inf is below ``low``. A value equal to a bound is
    kept as it is, as GREATEST and LEAST keep their first argument on a tie (-0.0 stays -0.0).
    Only for types where it is exactly that, value, sign of zero and type: DOUBLE columns
    (LEAST and GREATEST make a FLOAT's -0.0 0.0) and BIGINT grid values (an unsigned column would
    become HUGEINT); the rest keeps LEAST and GREATEST.

    >>> zero, five = exp.Literal.number(0), exp.Literal.number(5)
    >>> render(_compared_clamp(exp.column("x"), zero, five, floating=True))
    'CASE WHEN x < 0 THEN 0 WHEN x <= 5 THEN x WHEN NOT ISNAN(x) THEN 5 END'
    >>> render(_compared_clamp(exp.column("r"), zero, five, floating=False))
    'CASE WHEN r < 0 THEN 0 WHEN r > 5 THEN 5 ELSE r END'
    """
    below = exp.If(this=exp.LT(this=value.copy(), expression=low), true=low.copy())
    if not floating:  # no NaN: above ``high`` is ``high``, the rest (NULL too) is the value
        above = exp.If(this=exp.GT(this=value.copy(), expression=high), true=high.copy())
        return exp.Case(ifs=[below, above], default=value)
    kept = exp.If(this=exp.LTE(this=value.copy(), expression=high.copy()), true=value.copy())
    return exp.Case(ifs=[below, kept, exp.If(this=exp.Not(this=is_nan(value)), true=high)])


def _is_null(node: exp.Expr) -> exp.Expr:
    return exp.Is(this=node, expression=exp.Null())


def _not_null(node: exp.Expr) -> exp.Expr:
    return exp.Not(this=_is_null(node))


def _true_or_false(condition: exp.Expr) -> exp.Expr:
    """A condition made total; NULL (or an error) counts as false."""
    return exp.Coalesce(this=total(condition), expressions=[exp.false()])


def _window(function: exp.Expr, partition: Sequence[exp.Expr], order: Sequence[exp.Expr] | None = None,
            preceding: bool = False) -> exp.Window:
    """``function OVER (PARTITION BY .. ORDER BY ..)``; ``preceding``: over the earlier rows only."""
    args: dict = {"this": function, "partition_by": partition}
    if order:
        args["order"] = exp.Order(expressions=[exp.Ordered(this=o, nulls_first=False) for o in order])
    if preceding:
        args["spec"] = exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
                                      end=exp.Literal.number(1), end_side="PRECEDING")
    return exp.Window(**args)


def _salted_order(*columns: exp.Expr) -> list[exp.Expr]:
    """The salted-hash order of (unit, key..) values, ties broken by the values after the unit."""
    return [salted_hash(*columns), *(c.copy() for c in columns[1:])]


def _with(final: exp.Select, ctes: Sequence[tuple[str, exp.Expr]]) -> exp.Select:
    for name, query in ctes:
        final = final.with_(name, as_=query, copy=False)
    return final


def _inlined(statement: exp.Select) -> exp.Select:
    """``statement`` with its CTEs NOT MATERIALIZED: DuckDB otherwise stores a CTE read twice (the
    light and heavy units of ``dp_limited``) before either reads it; inlined, each reader's
    filter on ``UNIT_ROWS`` reaches the copy's scan, so every row is still computed once, by the
    one branch that keeps it. 10-20% off the grouped statements at 1M rows (benchmarks/RESULTS.md,
    issue 26). Spark has no such clause (``dpsql.backends.render`` drops it there)."""
    for cte in statement.args["with_"].expressions:
        cte.set("materialized", False)
    return statement


def _select(columns: Sequence[exp.Expr], source: exp.Expr | str, where: Sequence[exp.Expr] | None = None,
            group: Sequence[exp.Expr] | None = None) -> exp.Select:
    """SELECT columns FROM source [WHERE ... AND ...] [GROUP BY ...], built in place: every piece
    is made for this statement alone, so nothing is copied (builders copy by default)."""
    select = exp.Select(expressions=list(columns))
    select.set("from_", exp.From(this=_named(source) if isinstance(source, str) else source))
    if where:
        select.set("where", exp.Where(this=exp.and_(*where, copy=False)))
    if group:
        select.set("group", exp.Group(expressions=list(group)))
    return select


def _named(name: str) -> exp.Table:
    """One of the statement's own relations (a CTE) by name."""
    return exp.Table(this=exp.to_identifier(name))


def _subquery(select: exp.Expr, alias: str | None = None) -> exp.Subquery:
    args: dict = {"this": select}
    if alias is not None:
        args["alias"] = exp.TableAlias(this=exp.to_identifier(alias))
    return exp.Subquery(**args)


def _as(node: exp.Expr, name: str) -> exp.Expr:
    return exp.Alias(this=node, alias=exp.to_identifier(name))


def _table(name: str) -> exp.Table:
    """A table by its catalog key (``schema.table`` outside ``main``), every part quoted."""
    parts = name.split(".")
    return exp.table_(parts[-1], db=parts[-2] if len(parts) > 1 else None,
                      catalog=parts[-3] if len(parts) > 2 else None, quoted=True)


# -- separate measures -------------------------------------------------------------------------

def _distinct(plan: Plan, measure: Measure) -> exp.Select:
    """Bounded COUNT(DISTINCT expr) per group: columns ``g0..``, ``n``.

    A unit keeps at most b of its distinct values in a (unit, group) — b its granted rows —
    chosen in the order of a salted hash of (unit, value), so at most k over all groups: one
    unit adds or removes at most k distinct values in all, the precondition of the COUNT rule.
    """
    single = replace(plan, measures=(measure,), selection=None)
    keys = [key.name for key in plan.query.keys]
    layers: list[tuple[str, exp.Expr]] = [("dp_rows", _rows_layer(single)), ("dp_values", _values_layer(single, keys))]
    value = f"v_{measure.name}"
    counted = _as(exp.Count(this=exp.Distinct(expressions=[_column("value")])), "n")
    if _bounded_by_construction(single, keys):  # every unit keeps every value: count them
        values = _subquery(_select([star(), _as(_column(value), "value")], "dp_values"))
        return _with(_select([*map(_column, keys), counted], values, group=[*map(_column, keys)]), layers)
    unit_keys = [_column(name) for name in ["dp_unit", *keys]]
    order = _salted_order(_column("dp_unit", "k"), _column("value"))
    rank = _window(exp.RowNumber(), _qualified(keys), order)
    kept = [*(_column(k, "k") for k in keys), _column("value"), _column("b")]
    kept += [_column("group_rank")] if keys else []
    conditions: list[exp.Expr] = [exp.GT(this=_column("b"), expression=_number(0)),
                  exp.LTE(this=_column("value_rank"), expression=_column("b"))]
    conditions += [_within_groups(plan)] if keys else []
    layers += [("dp_units", _units_layer(single, keys)), *_granted_layer(single, keys),
               ("dp_distinct", _select([*unit_keys, _as(_column(value), "value")], "dp_values",
                                       [_not_null(_column(value))]).distinct(copy=False)),
               ("dp_kept", _joined_to_grant(_select([*kept, _as(rank, "value_rank")], _as_k("dp_distinct")),
                                            keys))]
    return _with(_select([*map(_column, keys), counted], "dp_kept", conditions, [*map(_column, keys)]), layers)


def _histogram(plan: Plan, measure: Measure) -> exp.Select:
    """Bounded bucket counts of one quantile: columns ``g0..``, ``bucket``, ``n``.

    Each unit's granted rows b of a (unit, group) are spread over its buckets in the order of
    a salted hash of (unit, bucket), so a unit puts at most b values into a group and at most
    k over all groups — the precondition of ``dpsql.mechanisms.quantile``.
    """
    single = replace(plan, measures=(measure,), selection=None)
    keys = [key.name for key in plan.query.keys]
    layers: list[tuple[str, exp.Expr]] = [("dp_rows", _rows_layer(single)), ("dp_values", _values_layer(single, keys))]
    value = f"v_{measure.name}"
    grouped = [_column(name) for name in [*keys, "bucket"]]
    if _bounded_by_construction(single, keys):  # every unit keeps every value: count them
        buckets = _subquery(_select([star(), _as(_column(value), "bucket")], "dp_values"))
        final = _select([*grouped, _as(exp.Count(this=exp.Star()), "n")], buckets,
                        [_not_null(_column("bucket"))], [c.copy() for c in grouped])
        return _with(final, layers)
    unit_keys = [_column(name) for name in ["dp_unit", *keys]]
    order = _salted_order(_column("dp_unit", "k"), _column("bucket"))
    earlier = exp.Coalesce(this=_window(exp.Sum(this=_column("n_bucket")), _qualified(keys), order, preceding=True),
                           expressions=[_number(0)])
    spread = _call("GREATEST", _call("LEAST", _column("n_bucket"),
                                     exp.Sub(this=_column("b"), expression=earlier)), _number(0))
    conditions: list[exp.Expr] = [exp.GT(this=_column("b"), expression=_number(0))]
    conditions += [_within_groups(plan)] if keys else []
    layers += [("dp_units", _units_layer(single, keys)), *_granted_layer(single, keys),
               ("dp_buckets", _select([*unit_keys, _as(_column(value), "bucket"),
                                       _as(exp.Count(this=exp.Star()), "n_bucket")], "dp_values",
                                      [_not_null(_column(value))], [*(c.copy() for c in unit_keys), _column(value)])),
               ("dp_spread", _joined_to_grant(
                   _select([*(_column(k, "k") for k in keys), _column("bucket"), _as(spread, "n_spread")],
                           _as_k("dp_buckets")), keys).where(*conditions, copy=False))]
    # n_spread, not n: dp_units has an n of another type, and Spark's typing reads columns by name
    final = _select([*grouped, _as(exp.Sum(this=_column("n_spread")), "n")], "dp_spread",
                    group=[c.copy() for c in grouped])
    return _with(final, layers)


def _qualified(keys: list[str]) -> list[exp.Expr]:
    """The (unit, group) columns of the per-value side ``k`` of a join with ``dp_granted``."""
    return [_column(name, "k") for name in ["dp_unit", *keys]]


def _joined_to_grant(select: exp.Select, keys: list[str]) -> exp.Select:
    """``select`` (reading the per-value side as ``k``) joined to ``dp_granted AS g`` on the same
    (unit, group) (``_same_unit_group``)."""
    joined = exp.Join(this=_aliased("dp_granted", "g"), on=_same_unit_group(keys))
    select.append("joins", joined)
    return select


def _as_k(name: str) -> exp.Expr:
    return _aliased(name, "k")


def _aliased(name: str, alias: str) -> exp.Table:
    return exp.Table(this=exp.to_identifier(name), alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _same_unit_group(keys: list[str]) -> exp.Expr:
    """A per-value row ``k`` joins its (unit, group)'s grant ``g``. A NULL key is a group too
    (the outside cell, ``dpsql.analysis.domains``, or a NULL key under partition selection), so keys
    match with IS NOT DISTINCT FROM: an equi-join (or USING) would drop those rows.

    >>> render(_same_unit_group(["g0"]))
    'k.dp_unit = g.dp_unit AND k.g0 IS NOT DISTINCT FROM g.g0'
    """
    same: list[exp.Expr] = [exp.EQ(this=_column("dp_unit", "k"), expression=_column("dp_unit", "g"))]
    same += [exp.NullSafeEQ(this=_column(name, "k"), expression=_column(name, "g")) for name in keys]
    return exp.and_(*same, copy=False)


def _within_groups(plan: Plan) -> exp.Expr:
    return exp.LTE(this=_column("group_rank"), expression=_number(plan.query.rule.groups_per_unit))


# -- the bounded statement ---------------------------------------------------------------------

def _bounded(plan: Plan) -> exp.Select:
    query = plan.query
    keys = [key.name for key in query.keys]
    if not keys and not plan.measures and plan.selection is None:
        return exp.Select(expressions=[_as(_number(1), "dp_none")])  # every measure has SQL of its own
    if _rows_bounded_by_construction(plan):
        if not _groups_bounded_by_construction(plan, keys):
            unit_rows, light_rows = _with_unit_rows(plan) or (None, 0)
            layers: list[tuple[str, exp.Expr]] = [("dp_rows", _rows_layer(plan, unit_rows)),
                      ("dp_values", _values_layer(plan, keys, unit_rows is not None)),
                      ("dp_limited", _group_limit_layer(plan, keys, light_rows))]
            return _inlined(_with(_direct_totals(plan, keys, source="dp_limited"), layers))
        return _with(_direct_totals(plan, keys), [("dp_rows", _rows_layer(plan)),
                                                  ("dp_values", _values_layer(plan, keys))])
    layers = [("dp_rows", _rows_layer(plan)), ("dp_values", _values_layer(plan, keys))]
    layers += [("dp_units", _units_layer(plan, keys)), *_granted_layer(plan, keys)]
    return _with(_unit_level_totals(plan, keys), layers)


def expand_clamps(node: exp.Expr, copy: bool = True) -> exp.Expr:
    """dpsql's CLAMP(x, lo, hi) as SQL: NULL and NaN stay NULL, the rest is clamped (innermost
    first, so a CLAMP inside another's value is expanded too).

    >>> import sqlglot
    >>> render(expand_clamps(sqlglot.parse_one("SELECT CLAMP(x, 0, 10)")))
    'SELECT CASE WHEN x IS NULL OR ISNAN(CAST(x AS DOUBLE)) THEN NULL ELSE LEAST(GREATEST(x, 0), 10) END'
    """
    tree = node.copy() if copy else node
    for sub in reversed(list(tree.dfs())):
        parts = clamp_arguments(sub) if isinstance(sub, exp.Expression) else None
        if parts is None:
            continue
        value, low, high = parts
        missing = exp.or_(_is_null(value.copy()), is_nan(_cast(value.copy(), "DOUBLE")), copy=False)
        expanded = _null_or_clamped(missing, value.copy(), _number(low), _number(high))
        if sub is tree:
            tree = expanded
        else:
            sub.replace(expanded)
    return tree


def literal(value: Fraction | int | str) -> str:
    """An exact SQL literal for a policy number or key, as text (``dpsql.sql.pieces.literal``).

    >>> literal(Fraction(1, 4)), literal(Fraction(1, 3)), literal("O'Hara")
    ('0.25', '(1 / 3)', "'O''Hara'")
    """
    return render(pieces.literal(value))


def clamp_column(column: ClampedColumn) -> exp.Expr:
    """A column clamped into its policy bounds, NULL and NaN kept NULL.

    >>> render(clamp_column(ClampedColumn("amount", Fraction(0), Fraction(500), True, double=True)))
    'CASE WHEN "amount" < 0 THEN 0 WHEN "amount" <= 500 THEN "amount" WHEN NOT ISNAN("amount") THEN 500 END'
    >>> render(clamp_column(ClampedColumn("amount", Fraction(0), Fraction(500), True)))  # a FLOAT: -0.0 becomes 0.0
    'CASE WHEN "amount" IS NULL OR ISNAN("amount") THEN NULL ELSE LEAST(GREATEST("amount", 0), 500) END'
    """
    if column.double:
        return _compared_clamp(_stored(column.name), _number(column.lower), _number(column.upper), floating=True)
    missing = _is_null(_stored(column.name))
    if column.floating:
        missing = exp.or_(missing, is_nan(_stored(column.name)), copy=False)
    return _null_or_clamped(missing, _stored(column.name), _number(column.lower), _number(column.upper))


def _in_value_position(column: exp.Column, root: exp.Expr) -> bool:
    """False when the column only feeds a condition (a WHEN, a comparison): it is not summed."""
    node = column.parent
    while node is not None and node is not root.parent:
        if isinstance(node, (exp.Predicate, exp.Connector, exp.Not)):
            return False
        node = node.parent
    return True


def clamp_inputs(argument: exp.Expr, clamped: tuple[ClampedColumn, ...]) -> exp.Expr:
    """Replace bounded columns in value positions of ``argument`` with their clamped form."""
    by_name = {c.name: c for c in clamped}
    tree = argument.copy()
    wrapper = exp.Paren(this=tree)  # a parent, so the root column can be replaced too
    for column in list(tree.find_all(exp.Column)):
        rule = by_name.get(column.name)
        if rule is not None and _in_value_position(column, wrapper.this):
            column.replace(_paren(clamp_column(rule)))
    return wrapper.this


def _raw_value(measure: Measure) -> exp.Expr:
    if measure.argument is None:
        return _number(1)
    if measure.kind == "histogram":  # the bucket: floor((value - offset) / width)
        evaluated = _paren(expand_clamps(clamp_inputs(measure.argument, measure.clamped_columns), copy=False))
        offset = exp.Sub(this=evaluated, expression=_number(measure.offset))
        bucket = exp.Floor(this=exp.Mul(this=_paren(offset), expression=_number(1 / measure.grid)))
        return total(_cast(bucket, "BIGINT"))
    if measure.kind in ("count", "distinct") and not measure.clamped_columns and measure.counts_values_of is None:
        return total(expand_clamps(measure.argument))  # COUNT: only NULL-ness matters; DISTINCT: the value itself
    return _on_grid(measure)


def _on_grid(value: Measure | Factor) -> exp.Expr:
    """A measure's (or a product's factor's) argument, its bounded columns clamped, scaled to its
    grid and rounded to a BIGINT; TRY unless it cannot fail (``_cannot_fail``)."""
    assert value.argument is not None
    evaluated = _paren(expand_clamps(clamp_inputs(value.argument, value.clamped_columns), copy=False))
    if value.grid == 1:
        scaled = _cast(evaluated, "BIGINT")
    else:
        product = exp.Mul(this=_cast(evaluated, "DOUBLE"), expression=power_of_two(1 / value.grid))
        scaled = _cast(exp.Round(this=product), "BIGINT")
    return scaled if _cannot_fail(value) else total(scaled)


def _factor_columns(plan: Plan) -> dict[tuple[str, int], str]:
    """(product measure, factor index) -> the ``dp_rows`` column holding that factor's raw value
    on its grid: one column per distinct (argument, grid, bounds), so the second-moment measures of
    one aggregate evaluate each argument once per row."""
    columns: dict[tuple[str, int], str] = {}
    seen: dict[Factor, str] = {}
    for measure in plan.measures:
        for i, factor in enumerate(measure.factors):
            columns[measure.name, i] = seen.setdefault(replace(factor, power=0), f"r_{measure.name}_{i}")
    return columns


def _product_value(measure: Measure, columns: dict[tuple[str, int], str]) -> exp.Expr:
    """A product measure's row value: NULL when any factor is NULL (pairs), else the product of
    the factors' centred values 2v - (L + U) (v clamped into [L, U]) to their powers, exact
    (in BIGINT where no partial product can reach 2**62, ``_needs_hugeint``, else in HUGEINT),
    clamped into the product's interval [lower, upper] as every summed value is."""
    raws = [_column(columns[measure.name, i]) for i in range(len(measure.factors))]
    missing = exp.or_(*(_is_null(raw) for raw in raws), copy=False)
    centre = _centred if _needs_hugeint(measure) else _centred_bigint
    terms: list[exp.Expr] = []
    for factor, raw in zip(measure.factors, raws):
        clamped = _clamp(raw.copy(), _number(factor.lower), _number(factor.upper))
        if not factor.centred:  # the per-unit forms: v itself, widened where HUGEINT is needed
            terms += [exact_integer(clamped.copy()) if centre is _centred else clamped.copy()
                      for _ in range(factor.power)]
            continue
        terms += [centre(factor, clamped) if i == 0 else centre(factor, clamped.copy()) for i in range(factor.power)]
    product: exp.Expr = _number(1) if not terms else terms[0]
    for term in terms[1:]:
        product = exp.Mul(this=product, expression=term)
    return _null_or_clamped(missing, product, _number(measure.lower), _number(measure.upper))


def power_of_two(value: Fraction) -> exp.Expr:
    """A power of two as an exact DOUBLE literal: scaling by it is exact in floating point (the
    product never needs more digits, as a DECIMAL literal's would: 2**-37 written out has 37
    decimals, a DECIMAL(38,37) that overflows when multiplied by 10).

    >>> render(power_of_two(Fraction(1, 2**37))), render(power_of_two(Fraction(2**40)))
    ("CAST('7.275957614183426e-12' AS DOUBLE)", "CAST('1099511627776.0' AS DOUBLE)")
    """
    exponent = value.numerator.bit_length() - 1 if value >= 1 else -(value.denominator.bit_length() - 1)
    if value <= 0 or Fraction(2) ** exponent != value or abs(exponent) > 1000:
        raise ValueError(f"{value} is not a power of two a double holds exactly")
    return _cast(exp.Literal.string(repr(float(value))), "DOUBLE")


def _cannot_fail(measure: Measure | Factor) -> bool:
    """True for a bare bounded column: clamped (into literals within its bounds), it is NULL or
    finite within [lo, hi]; scaled by the exact power of two 1/grid and rounded, it lies within
    [L, U] grid units, up to the double's relative rounding of 2**-53 and one unit of ROUND —
    below 2**63 when max(|L|, |U|) < 2**62 (``dpsql.analysis.analyse`` refuses larger), so the cast to
    BIGINT cannot overflow and TRY (a per-row cost) is not needed. The clamp of ``dp_values``
    then makes the bounds exact."""
    argument = measure.argument
    bounded = {c.name for c in measure.clamped_columns}
    return isinstance(argument, exp.Column) and argument.name in bounded and \
        max(abs(measure.lower), abs(measure.upper)) < 2**62


def domain_filter(column: str, domain: KeyDomain, column_type: str) -> exp.Expr:
    """Keep rows whose key is in the public domain, compared in the column's own type: each domain
    value is TRY_CAST to it, so no implicit coercion of the private column can fail on one unit's
    value ('x' in a VARCHAR column against numeric keys) — the comparison is total."""
    source, value = _domain_source(domain, _column("v") if domain.values is not None else _stored(domain.column or ""))
    listed = _select([exp.TryCast(this=value, to=catalog_type(column_type))], source)
    return exp.In(this=_stored(column), query=_subquery(listed))


def _domain_source(domain: KeyDomain, column: exp.Expr) -> tuple[exp.Expr, exp.Expr]:
    """FROM of a public domain (a listed one as VALUES ... AS d(v)) and the column it reads."""
    if domain.values is None:
        assert domain.table is not None
        return _table(domain.table), column
    numbers = [Fraction(v) for v in domain.values if not isinstance(v, str)]
    # VALUES gives its column one type: a UHUGEINT key beyond HUGEINT's range with a small one
    # is DuckDB's conversion error, so such keys are listed as exact text (TRY_CAST reads it).
    as_text = any(not -2**127 <= n < 2**127 for n in numbers if n.denominator == 1)
    rows = [exp.Tuple(expressions=[pieces.literal(v) if isinstance(v, str) else
                                   pieces.literal(literal(Fraction(v))) if as_text else pieces.literal(Fraction(v))])
            for v in domain.values]
    alias = exp.TableAlias(this=exp.to_identifier("d"), columns=[exp.to_identifier("v")])
    return exp.Values(expressions=rows, alias=alias), _column("v")


def _with_unit_rows(plan: Plan) -> tuple[exp.Select, int] | None:
    """The source with each row's unit's kept row count in its copy (``UNIT_ROWS``), and the most
    kept rows a unit may have to be sure of touching at most MAX GROUPS PER UNIT groups here; or
    ``None`` (the groups window then ranks every unit).

    A read of one bounded copy: a unit's rows here are some of its kept rows, so at most
    ``UNIT_ROWS`` groups; light at MAX GROUPS PER UNIT kept rows. A join of such a read with a
    public relation (``_join_with_unit_rows``): each kept row became at most m rows (the join's
    multiplicity, stored before the charge; ``dpsql.analysis.joins``), so a unit with r kept rows
    has at most r * m rows here; light at floor(MAX GROUPS PER UNIT / m) kept rows."""
    source = plan.query.source
    if source is None or plan.query.rows_per_unit is None:
        return None
    read = with_unit_rows(source)
    copied, carried = (source, read) if read is not None else _join_with_unit_rows(source)
    if copied is None or carried is None:
        return None
    copy_rows = _copied_table(copied).rows_per_unit
    if plan.query.rows_per_unit % copy_rows:  # not k * m: no multiplicity to read off
        return None
    light = plan.query.rule.groups_per_unit // (plan.query.rows_per_unit // copy_rows)
    return (carried, light) if light > 0 else None


def _copied_table(read: exp.Expr) -> CopiedTable:
    table = read.args["from_"].this
    assert isinstance(table, CopiedTable)
    return table


def _join_with_unit_rows(source: exp.Expr) -> tuple[exp.Select | None, exp.Select | None]:
    """(the copy read, the join carrying its ``UNIT_ROWS``) for a join of exactly one read of a
    unit-level copy (``with_unit_rows``) with relations that read no copy (public ones); else
    (None, None). Only the join's row multiplicity decides how many rows a kept row became."""
    if not isinstance(source, exp.Select) or len(source.args.get("joins") or []) != 1 or source.args.get("group"):
        return None, None
    sides = [source.args["from_"].this, source.args["joins"][0].this]
    reads = [side for side in sides if side.find(CopiedTable) is not None]
    if len(reads) != 1 or not isinstance(reads[0], exp.Subquery) or not reads[0].alias:
        return None, None
    copied = reads[0].this
    carried_read = with_unit_rows(copied)
    if carried_read is None:
        return None, None
    joined = source.copy()
    side = next(s for s in [joined.args["from_"].this, joined.args["joins"][0].this] if s.find(CopiedTable))
    side.set("this", carried_read)
    joined.append("expressions", _column(UNIT_ROWS, reads[0].alias))
    return copied, joined


def _rows_layer(plan: Plan, unit_rows: exp.Select | None = None) -> exp.Select:
    """``unit_rows``: the source with its ``UNIT_ROWS`` column (``_with_unit_rows``), carried on."""
    query = plan.query
    assert query.rule.unit is not None, "a private relation always has a unit (a row-level one: its hidden id)"
    unit = _stored(query.rule.unit.lower())
    select = [_as(unit, "dp_unit")]
    if unit_rows is not None:
        select.append(_column(UNIT_ROWS))
    select += [_as(_key(key), key.name) for key in query.keys]
    outside = reports_outside(query.keys)
    factor_columns = _factor_columns(plan)
    for measure in plan.measures:
        if measure.factors:
            select += [_as(_on_grid(factor), column) for i, factor in enumerate(measure.factors)
                       if (column := factor_columns[measure.name, i]) == f"r_{measure.name}_{i}"]
        elif measure.counts_values_of is None and measure.argument is not None:
            select.append(_as(_raw_value(measure), f"r_{measure.name}"))
    # Rows with no unit belong to nobody we can bound: merging them into one pseudo-unit
    # would let one person move it by the full spread of a mixed-sign sum.
    conditions = [_not_null(unit.copy())]
    if query.where is not None:
        conditions.append(_true_or_false(expand_clamps(query.where)))
    if not outside:
        conditions += [domain_filter(key.expression.name, key.domain, query.column_type(key.expression.name))
                       for key in query.keys if key.domain]
    source: exp.Expr
    if unit_rows is not None:
        source = _subquery(expand_clamps(unit_rows, copy=False), "dp_source")
    elif query.source is None:
        source = _table(query.table)
    elif isinstance(query.source, exp.Table):
        source = expand_clamps(query.source)
    else:
        source = _subquery(expand_clamps(query.source), "dp_source")
    rows = _select(select, source, conditions)
    if not outside:
        return rows
    # Keys that are not released keys become NULL: one more group, the outside cell
    # (dpsql.analysis.domains). Each key is computed once, below, and compared in its read-back form.
    inside = exp.and_(*(_membership(query, part) for part in domain_parts(query.keys)), copy=False)
    kept = {key.name: _as(exp.Case(ifs=[exp.If(this=inside.copy(), true=_column(key.name))]), key.name)
            for key in query.keys}
    # Every column listed, the keys replaced in place: ``* REPLACE`` has no Spark form.
    names = [item.alias_or_name for item in select]
    return _select([kept.get(name) or _column(name) for name in names], _subquery(rows, "dp_keyed"))


def _membership(query, part: list[int]) -> exp.Expr:
    """A row's keys of one domain part are among the released ones (``domain_membership``)."""
    keys = [query.keys[i] for i in part]
    return domain_membership(keys, [query.column_type(k.expression.name) for k in keys],
                             [_column(k.name) for k in keys])


def _key(key: GroupKey) -> exp.Expr:
    """A key as grouped and read back: made total, then in its form (``dpsql.backends.keys``)."""
    return key_expression(total(expand_clamps(key.expression)), key.type_name or "", key.form)


def _values_layer(plan: Plan, keys: list[str], unit_rows: bool = False) -> exp.Select:
    select: list[exp.Expr] = [_column(name) for name in ["dp_unit", *keys]]
    select += [_column(UNIT_ROWS)] if unit_rows else []
    factor_columns = _factor_columns(plan)
    for measure in plan.measures:
        if measure.counts_values_of is not None or measure.argument is None:
            continue
        if measure.factors:
            select.append(_as(_product_value(measure, factor_columns), f"v_{measure.name}"))
            continue
        raw = _column(f"r_{measure.name}")
        if measure.kind in ("count", "distinct") and not measure.clamped_columns:
            select.append(_as(raw, f"v_{measure.name}"))
        else:
            # A BIGINT on the grid (``_raw_value``), so the comparisons' CASE keeps its type.
            clamped = _compared_clamp(raw, _number(measure.lower), _number(measure.upper), floating=False)
            select.append(_as(clamped, f"v_{measure.name}"))
    return _select(select, "dp_rows")


def _value_column(measure: Measure) -> exp.Column:
    return _column(f"v_{measure.counts_values_of or measure.name}")


def _needs_hugeint(measure: Measure) -> bool:
    """Whether a product measure's row value needs HUGEINT arithmetic: BIGINT is exact (and cannot
    overflow) when every factor's doubled bound and centring offset, and every partial product of
    centred factors (each |2v - (L + U)| <= U - L), stay below 2**62 in magnitude."""
    partial = 1
    for factor in measure.factors:
        largest = factor.upper - factor.lower if factor.centred else max(abs(factor.lower), abs(factor.upper))
        partial *= max(largest, 1) ** factor.power
        if 2 * max(abs(factor.lower), abs(factor.upper)) + abs(factor.lower + factor.upper) >= 2**62:
            return True
    return max(abs(measure.lower), abs(measure.upper), partial) >= 2**62


def _centred_bigint(factor: Measure | Factor, value: exp.Expr) -> exp.Expr:
    """2v - (L + U) of a BIGINT v in [L, U], in BIGINT (where ``_needs_hugeint`` shows it exact)."""
    doubled = exp.Mul(this=_number(2), expression=value)
    return _paren(exp.Sub(this=doubled, expression=_paren(_number(factor.lower + factor.upper))))


def _centred(measure: Measure | Factor, value: exp.Expr) -> exp.Expr:
    """2v - (L + U), exact: the doubled value is widened first."""
    doubled = exp.Mul(this=_number(2), expression=exact_integer(value))
    return _paren(exp.Sub(this=doubled, expression=_paren(_number(measure.lower + measure.upper))))


def _squared(measure: Measure, value: exp.Expr) -> exp.Expr:
    """(2v - (L + U))^2, or v^2 for an uncentred measure (the per-unit forms), exact."""
    if not measure.centred:
        return exp.Mul(this=exact_integer(value), expression=value.copy())
    return exp.Mul(this=_centred(measure, value), expression=_centred(measure, value.copy()))


def _rows_bounded_by_construction(plan: Plan) -> bool:
    """True when the source holds at most k rows per unit whatever the data (a bounded copy,
    ``dpsql.backends.bounding``): layer 3 would grant every unit all its rows (b = n)."""
    query = plan.query
    held = query.rows_per_unit
    return held is not None and held <= query.rule.max_rows_per_unit


def _groups_bounded_by_construction(plan: Plan, keys: list[str]) -> bool:
    """True when, its rows bounded, a unit cannot touch more groups than allowed either: it
    has at most k rows, so at most k groups. Then summing row values per group gives exactly
    layer 3's result: a unit's rows are at most k values in [L, U] over at most MAX GROUPS
    PER UNIT groups, the precondition of the sensitivity rule."""
    return not keys or plan.query.rule.groups_per_unit >= (plan.query.rows_per_unit or 0)


def _bounded_by_construction(plan: Plan, keys: list[str]) -> bool:
    """True when layer 3 would keep every row of every unit: rows and groups both bounded."""
    return _rows_bounded_by_construction(plan) and _groups_bounded_by_construction(plan, keys)


def _group_limit_layer(plan: Plan, keys: list[str], light_rows: int = 0) -> exp.Expr:
    """``dp_limited``: the rows of each unit's first MAX GROUPS PER UNIT groups, in the order
    of a salted hash of its own (unit, key) values — the groups layer 3 would keep, each with
    all its rows (the unit's rows are at most k already). A window over rows, not over
    per-(unit, group) aggregates: one sort instead of an aggregation and two sorts.

    With ``light_rows`` (``_with_unit_rows``: the rows carry their unit's kept rows in the copy,
    ``UNIT_ROWS``), a unit with at most ``light_rows`` kept rows skips the window: its rows here
    come from those (each into at most m joined rows), so it has at most MAX GROUPS PER UNIT
    groups and the window would keep them all. Every unit gets exactly what the window gives it
    (tests compare both), decided by its own rows alone."""
    order = _salted_order(*(_column(name) for name in ["dp_unit", *keys]))
    rank = _window(exp.DenseRank(), [_column("dp_unit")], order)
    if not light_rows:
        ranked = _subquery(_select([star(), _as(rank, "group_rank")], "dp_values"))
        return _select([star()], ranked, [_within_groups(plan)])
    few = exp.LTE(this=_column(UNIT_ROWS), expression=_number(light_rows))
    light = _select([star(exclude=[UNIT_ROWS])], "dp_values", [few])
    ranked_rows = _select([star(), _as(rank, "group_rank")], "dp_values", [exp.Not(this=_paren(few.copy()))])
    heavy = _select([star(exclude=[UNIT_ROWS, "group_rank"])], _subquery(ranked_rows), [_within_groups(plan)])
    return exp.Union(this=light, expression=heavy, distinct=False)


def _units_counted(plan: Plan) -> exp.Expr:
    """Distinct units of a group, from rows of units light by construction: each unit once —
    or each row, when a unit has at most one row (a row-level table read directly)."""
    if plan.query.rows_per_unit == 1:
        return exp.Count(this=exp.Star())
    return exp.Count(this=exp.Distinct(expressions=[_column("dp_unit")]))


def _row_value_sum(measure: Measure, plan: Plan) -> exp.Expr:
    """Per-group total of a measure from row values of units light by construction."""
    if measure.kind == "units":
        return _units_counted(plan)
    if measure.kind == "count":
        return exp.Count(this=exp.Star() if measure.argument is None else _value_column(measure))
    value = _value_column(measure)
    if measure.squared:
        return exp.Sum(this=_squared(measure, value))
    if measure.centred:  # sum(2v - (L + U)) = 2 sum(v) - (L + U) count(v): no per-row HUGEINT
        doubled = exp.Mul(this=_number(2), expression=exp.Sum(this=value))
        offset = exp.Mul(this=exact_integer(exp.Count(this=value.copy())),
                         expression=_paren(_number(measure.lower + measure.upper)))
        return _paren(exp.Sub(this=doubled, expression=offset))
    return exp.Sum(this=value)  # BIGINT values: DuckDB sums them exactly, as HUGEINT


def _direct_totals(plan: Plan, keys: list[str], source: str = "dp_values") -> exp.Select:
    counts_units = plan.selection is not None or any(m.kind == "units" for m in plan.measures)
    if counts_units and plan.query.rows_per_unit != 1 or any(m.unit_bounds is not None for m in plan.measures):
        return _totals_per_unit_first(plan, keys, source)
    select = [*map(_column, keys)] + [_as(_row_value_sum(m, plan), m.name) for m in plan.measures]
    if plan.selection is not None:  # units per group: what partition selection thresholds
        select.append(_as(_units_counted(plan), plan.selection.measure))
    return _select(select or [_as(_number(1), "dp_none")], source, group=[*map(_column, keys)])


def _totals_per_unit_first(plan: Plan, keys: list[str], source: str) -> exp.Select:
    """``_direct_totals`` when it counts distinct units: each measure's row values are first
    summed per (unit, group), then per group, where one row per (unit, group) makes the
    distinct-unit count a plain COUNT(*). Every measure is a sum of per-row terms, so summing
    in two steps gives exactly the one-step totals (exact integers: HUGEINT); COUNT(DISTINCT)
    over the rows cost about a fifth more at 1M rows (benchmarks/RESULTS.md, issue 14)."""
    summed = [m for m in plan.measures if m.kind != "units"]
    unit_keys = [_column(name) for name in ["dp_unit", *keys]]
    per_unit_sums = [_as(_row_value_sum(m, plan), m.name) for m in summed]
    per_unit_sums += [_as(exp.Count(this=_value_column(m)), f"c_{m.name}") for m in summed if m.unit_average]
    per_unit = _select([*unit_keys, *per_unit_sums], source, group=[_column(name) for name in ["dp_unit", *keys]])
    select: list[exp.Expr] = [*map(_column, keys)]
    for measure in plan.measures:
        total: exp.Expr
        if measure.kind == "units":
            total = exp.Count(this=exp.Star())
        else:
            total = exp.Sum(this=_per_unit_clamped(measure, _column(measure.name), _column(f"c_{measure.name}")))
        select.append(_as(total, measure.name))
    if plan.selection is not None:  # units per group: what partition selection thresholds
        select.append(_as(exp.Count(this=exp.Star()), plan.selection.measure))
    return _select(select, _subquery(per_unit), group=[*map(_column, keys)])


def _units_layer(plan: Plan, keys: list[str]) -> exp.Select:
    unit_keys = [_column(name) for name in ["dp_unit", *keys]]
    select = [*unit_keys, _as(exp.Count(this=exp.Star()), "n")]
    for measure in plan.measures:
        if measure.argument is None or measure.counts_values_of is not None:
            continue
        value = _column(f"v_{measure.name}")
        select.append(_as(exp.Count(this=value), f"c_{measure.name}"))
        if measure.squared:
            select.append(_as(exp.Sum(this=_squared(measure, value.copy())), f"s_{measure.name}"))
        elif measure.kind == "sum":  # exact: BIGINT sums are HUGEINT
            select.append(_as(exp.Sum(this=value.copy()), f"s_{measure.name}"))
    return _select(select, "dp_values", group=[c.copy() for c in unit_keys])


def _granted_layer(plan: Plan, keys: list[str]) -> list[tuple[str, exp.Expression]]:
    """The CTEs granting each (unit, group) its rows ``b`` and rank: ``dp_granted`` (and
    ``dp_sizes`` when grouped).

    Grouped, most units are *light*: at most k rows in at most l groups, so the prefix budget
    grants every row (b = n) and every group survives; only *heavy* units need the window
    over their groups in salted-hash order. Both branches give exactly what the window gives
    for every unit (tests compare them), and each depends only on the unit's own rows.
    """
    rule = plan.query.rule
    k = _number(rule.max_rows_per_unit)
    if not keys:
        granted = _select([star(), _as(_call("LEAST", _column("n"), k), "b")], "dp_units")
        return [("dp_granted", granted)]
    def unit() -> list[exp.Expr]:
        return [_column("dp_unit")]

    def order() -> list[exp.Expr]:
        return _salted_order(*(_column(name) for name in ["dp_unit", *keys]))

    earlier = exp.Coalesce(this=_window(exp.Sum(this=_column("n")), unit(), order(), preceding=True),
                           expressions=[_number(0)])
    light = exp.and_(exp.LTE(this=_column("dp_total"), expression=k.copy()),
                     exp.LTE(this=_column("dp_groups"), expression=_number(rule.groups_per_unit)), copy=False)
    sizes = _select([star(), _as(_window(exp.Sum(this=_column("n")), unit()), "dp_total"),
                     _as(_window(exp.Count(this=exp.Star()), unit()), "dp_groups")], "dp_units")
    sized = ["dp_total", "dp_groups"]
    light_units = _select([star(exclude=sized), _as(_column("n"), "b"), _as(_number(1), "group_rank")],
                          "dp_sizes", [light])
    grant = _call("GREATEST", _call("LEAST", _column("n"), exp.Sub(this=k.copy(), expression=earlier)), _number(0))
    heavy_units = _select([star(exclude=sized), _as(grant, "b"),
                           _as(_window(exp.RowNumber(), unit(), order()), "group_rank")],
                          "dp_sizes", [exp.Not(this=_paren(light.copy()))])
    return [("dp_sizes", sizes), ("dp_granted", exp.Union(this=light_units, expression=heavy_units, distinct=False))]


def _contribution(measure: Measure) -> exp.Expr:
    """One (unit, group)'s bounded contribution to a measure."""
    if measure.kind == "units":
        return _number(1)
    if measure.kind == "count" and measure.argument is None:
        return _column("b")
    values_of = measure.counts_values_of or measure.name
    kept = _call("LEAST", _column(f"c_{values_of}"), _column("b"))
    if measure.kind == "count":
        return kept
    total_sum: exp.Expr = _column(f"s_{measure.name}")
    spread = measure.upper - measure.lower
    if measure.squared:
        low, high = 0, spread * spread if measure.centred else max(measure.lower ** 2, measure.upper ** 2)
    elif measure.centred:
        offset = exp.Mul(this=_paren(_number(measure.lower + measure.upper)), expression=_column(f"c_{measure.name}"))
        total_sum = _paren(exp.Sub(this=exp.Mul(this=_number(2), expression=total_sum), expression=offset))
        low, high = -spread, spread
    else:
        low, high = min(measure.lower, 0), max(measure.upper, 0)
    # A unit with more values than it is granted contributes its total scaled by kept / all
    # (as if `kept` of its values were sampled), not its total clamped: clamping would count a
    # heavy unit as `kept` values at a bound. The scaled total is in kept * [L, U] already; the
    # clamp stays as the guarantee.
    all_values = exp.Nullif(this=_column(f"c_{values_of}"), expression=_number(0))
    scaled = exp.IntDiv(this=exp.Mul(this=total_sum, expression=kept), expression=all_values)
    return _clamp(scaled, exp.Mul(this=exact_integer(kept.copy()), expression=_number(low)),
                  exp.Mul(this=exact_integer(kept.copy()), expression=_number(high)))


def _per_unit_clamped(measure: Measure, total: exp.Expr, values: exp.Expr) -> exp.Expr:
    """One (unit, group)'s contribution under the per-unit model (``Measure.unit_bounds``): its
    ``total`` of the row values clamped into the bounds — or, for a unit's average, ``total``
    divided by its number of ``values`` (toward zero, in both engines), clamped, NULL (nothing)
    without values: a NULL total (a unit whose values in the group are all NULL) stays NULL, as
    LEAST and GREATEST would turn it into a bound. The precondition of
    ``dpsql.analysis.sensitivity.unit_total_sensitivity``. Without per-unit bounds, ``total`` as it
    is (the rows model)."""
    if measure.unit_bounds is None:
        return total
    low, high = (_number(bound) for bound in measure.unit_bounds)
    if measure.unit_average:  # both widened to exact integers: typed for every engine's division
        total = exp.IntDiv(this=exact_integer(total),
                           expression=exp.Nullif(this=exact_integer(values), expression=_number(0)))
    return _null_or_clamped(_is_null(total.copy()), total, low, high)


def _unit_level_totals(plan: Plan, keys: list[str]) -> exp.Select:
    # A unit's average is of all its values in the group (its own data); a total is of those granted.
    contributions = [_per_unit_clamped(m, _column(f"s_{m.name}") if m.unit_average else _contribution(m),
                                       _column(f"c_{m.name}")) for m in plan.measures]
    select = [*map(_column, keys)] + [_as(exp.Sum(this=c), m.name) for m, c in zip(plan.measures, contributions)]
    if plan.selection is not None:  # distinct units per group, for partition selection
        select.append(_as(exp.Count(this=exp.Star()), plan.selection.measure))
    conditions: list[exp.Expr] = [exp.GT(this=_column("b"), expression=_number(0))]
    if keys:
        conditions.append(_within_groups(plan))
    return _select(select or [_as(_number(1), "dp_none")], "dp_granted", conditions, [*map(_column, keys)])


# -- public key domains ------------------------------------------------------------------------

def domain_select(keys: list, column_types: list[str], *, ordered: bool = True) -> exp.Select:
    """The public domain of one key — or the combinations one public table holds of several —
    each value TRY_CAST to its column's type, kept where the key's narrowing WHERE conjuncts
    hold on it (``dpsql.analysis.domains``), and read back in its key's form, as the bounded
    SQL reads that key (reads public data only): columns ``k0..``."""
    domain = keys[0].domain
    columns: list[exp.Expr]
    if domain.values is not None:
        source, column = _domain_source(domain, _column("v"))
        columns = [column]
    else:
        source, columns = _table(domain.table), [_stored(key.domain.column) for key in keys]
    typed: list[exp.Expr] = [
        _as(exp.TryCast(this=c, to=catalog_type(t)), f"v{i}")
        for i, (c, t) in enumerate(zip(columns, column_types))]
    # A joined public table's other columns its keys' narrowing reads: as stored, the values
    # the joined rows carry (``dpsql.analysis.domains.narrow_keys``).
    others = list(dict.fromkeys(pair for key in keys for pair in key.narrowing_columns))
    names = {key.expression.name.lower(): f"v{i}" for i, key in enumerate(keys)}
    for j, (name, public) in enumerate(others):
        names.setdefault(name, f"dp_c{j}")
    typed += [_as(_stored(public), f"dp_c{j}") for j, (_, public) in enumerate(others)]
    select = [_as(key_expression(_column(f"v{i}"), t, key.form), f"k{i}")
              for i, (key, t) in enumerate(zip(keys, column_types))]
    conditions = [_not_null(_column(f"v{i}")) for i in range(len(columns))]
    for i, key in enumerate(keys):
        mapping = {**names, key.expression.name.lower(): f"v{i}"}
        conditions += [_true_or_false(expand_clamps(on_value(c, mapping), copy=False)) for c in key.narrowed_by]
    domain_rows = _subquery(_select(typed, source), "dp_domain")
    listed = _select(select, domain_rows, conditions).distinct(copy=False)
    return listed.order_by(exp.Ordered(this=exp.var("ALL"), nulls_first=False), copy=False) if ordered else listed


def domain_sql(keys: list, column_types: list[str], *, ordered: bool = True, dialect: str = DUCKDB) -> str:
    """``domain_select`` rendered.

    >>> import sqlglot
    >>> from sqlglot import exp
    >>> from dpsql.analysis.plan import GroupKey
    >>> key = GroupKey("g0", exp.column("n"), KeyDomain(values=(1, 2)))
    >>> print(domain_sql([key], ["INTEGER"]))  # doctest: +NORMALIZE_WHITESPACE
    SELECT DISTINCT v0 AS k0 FROM (SELECT TRY_CAST(v AS INTEGER) AS v0 FROM (VALUES (1), (2)) AS d(v)) AS
    dp_domain WHERE NOT v0 IS NULL ORDER BY ALL
    >>> narrowed = (sqlglot.parse_one("plan IN ('free', 'pro')"),)
    >>> plan = GroupKey("g0", exp.column("plan"), KeyDomain(values=("free",)), "VARCHAR", "text", narrowed)
    >>> print(domain_sql([plan], ["VARCHAR"], ordered=False))  # doctest: +NORMALIZE_WHITESPACE
    SELECT DISTINCT ENCODE(CAST(v0 AS TEXT)) AS k0 FROM (SELECT TRY_CAST(v AS VARCHAR) AS v0 FROM (VALUES
    ('free')) AS d(v)) AS dp_domain WHERE NOT v0 IS NULL AND COALESCE(TRY(v0 IN ('free', 'pro')), FALSE)
    """
    return render(domain_select(keys, column_types, ordered=ordered), dialect)


def domain_membership(keys: list, column_types: list[str], rows: Sequence[exp.Expr]) -> exp.Expr:
    """A condition true when a row's keys (``rows``: their expressions, in the keys' forms) are
    one of the released combinations of one domain part (``domain_select``); NULL keys are never in.

    >>> from dpsql.analysis.plan import GroupKey
    >>> key = GroupKey("g0", exp.column("n"), KeyDomain(values=(1,)))
    >>> row = exp.column("n", quoted=True)
    >>> print(render(domain_membership([key], ["INTEGER"], [row])))  # doctest: +NORMALIZE_WHITESPACE
    "n" IN (SELECT k0 FROM (SELECT DISTINCT v0 AS k0 FROM (SELECT TRY_CAST(v AS INTEGER) AS v0 FROM (VALUES
    (1)) AS d(v)) AS dp_domain WHERE NOT v0 IS NULL))
    """
    listed = _subquery(domain_select(keys, column_types, ordered=False))
    if len(keys) == 1:
        return exp.In(this=rows[0], query=_subquery(_select([_column("k0")], listed)))
    listed.set("alias", exp.TableAlias(this=exp.to_identifier("dp_d")))
    matches = [exp.EQ(this=_column(f"k{i}", "dp_d"), expression=row) for i, row in enumerate(rows)]
    return exp.Exists(this=_select([_number(1)], listed, matches))
