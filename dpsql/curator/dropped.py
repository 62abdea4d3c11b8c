"""How much of a table its MAX ROWS PER UNIT drops: a DP estimate the curator records once.

Contribution bounding lowers counts and sums, and the ± says nothing of it. The bias report
(``dpsql.query.bias``) measures it per query, out of the query's own epsilon; this is the default,
free-to-the-analyst way: the curator's ``dpsql init`` (or ``Connection.estimate_limits``)
spends a small epsilon once per private table on the share of its rows beyond MAX ROWS PER
UNIT K, records it in the ledger, and every later answer reading the table shows it in its
limits line ("limits drop ≈ 4.4% ± 0.3% of flights' rows (at least)"): post-processing of a
charged release, so it costs nothing more and reveals nothing more.

What is measured, per unit u of the table: its raw row count r_u, read from the table's
row-count table (``dpsql.backends.bounding.raw_rows_sql``: counted when the bounded copy is
built, stored capped at R = K·(1 + 4K); the raw table is not read again). Released with
discrete Laplace noise of scale sensitivity / epsilon_i:

* ``kept = Σ_u min(r_u, K)``: one unit adds 0..K, sensitivity **K**;
* ``dropped = Σ_u min(r_u - min(r_u, K), C)``, C = K: 0..C per unit, sensitivity **K**, and the
  share is **at least** what is shown (rows beyond 2K of one unit are not counted);
* ``no_unit``: the table's rows whose unit is NULL, which no answer ever counts (the copy leaves
  them out). They belong to no unit, so no unit moves this count; each is treated as a unit of
  its own (as a row-level table's rows are, DESIGN.md invariant 16), so one such row added or
  removed moves it by 1: sensitivity **1**, and adding or removing a unit moves ``kept`` and
  ``dropped`` only. It is read from the raw table (one scalar subquery; the curator's statement,
  never an analyst's) and shown as a count with its 95% interval
  ("≈ 2,512 ± 30 of flights' rows have no tailnum: ..."), cut at 0.

The cap R changes neither count: r ≤ R leaves r as it is, and for r > R both min(r, K) and
min(r, R) are K, and both r - K and R - K = 4K² are at least C = K. Replacing one unit moves
each sum by at most its sensitivity too (one term changes within [0, K]), so the same scales
serve BOUNDED and UNBOUNDED neighbours. ``tests/test_bias_estimate.py`` checks both by brute
force. The epsilon is split 3 : 6 : 1 between ``kept``, ``dropped`` and ``no_unit`` (sequential
composition: whichever neighbour, the three losses add up to at most epsilon; ``dpsql.query.bias``:
kept only scales the share, and ``no_unit``'s sensitivity of 1 needs little); the share dropped /
(kept + dropped), its 95% interval and the interval of ``no_unit`` are post-processing
(``dpsql.mechanisms.shares``, ``dpsql.mechanisms.noise.discrete_laplace_halfwidth``).

The estimate is a ledger entry like any charge (analyst: none; its cost counts against the
total budget), found by its key: the table, its unit and K, so a policy that changes K has no
estimate for the new K until the curator records one. It describes the data when it was made.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

from dpsql.backends.bounding import DATABASE, DROP_CAP, copy_name, raw_rows_name
from dpsql.backends.render import DUCKDB, render
from dpsql.backends.rewrite import BoundedStatement
from dpsql.mechanisms.noise import discrete_laplace, discrete_laplace_halfwidth
from dpsql.mechanisms.shares import estimate_share
from dpsql.policy.model import PrivateTable
from dpsql.query.limits import NoUnitRows, RecordedDrop, record_key

__all__ = ["DroppedPlan", "RecordedDrop", "dropped_statement", "plan_dropped", "record_key", "release_dropped"]

CAP = 1
"""C = CAP · K (at most ``DROP_CAP``: the row-count table stores enough for it)."""
KEPT_WEIGHT, DROPPED_WEIGHT, NO_UNIT_WEIGHT = 3, 6, 1
"""The split of the estimate's epsilon between ``kept``, ``dropped`` and ``no_unit``."""
COUNTS = ("kept", "dropped", "no_unit")
"""The estimate's counts, in the order its statement returns them."""
ALPHA = 0.05
"""The share's ± is a 95% interval."""


@dataclass(frozen=True)
class DroppedPlan:
    """What one table's estimate reads and spends, decided before any data is read."""

    table: str
    """The private table as the policy names it."""
    key: str
    """Its catalog key."""
    unit: str
    """Its privacy unit column."""
    rows_per_unit: int
    """K: its MAX ROWS PER UNIT."""
    copy: str
    """Its bounded copy (whose row-count table the estimate reads)."""
    epsilon: Fraction
    """The whole cost."""

    @property
    def cap(self) -> int:
        """C: the most one unit adds to ``dropped``."""
        return CAP * self.rows_per_unit

    @property
    def scales(self) -> dict[str, Fraction]:
        """Discrete Laplace scale of each count: its sensitivity (K, C = K, and 1) over its part
        of epsilon."""
        part = self.epsilon / (KEPT_WEIGHT + DROPPED_WEIGHT + NO_UNIT_WEIGHT)
        return {"kept": Fraction(self.rows_per_unit) / (KEPT_WEIGHT * part),
                "dropped": Fraction(self.cap) / (DROPPED_WEIGHT * part),
                "no_unit": Fraction(1) / (NO_UNIT_WEIGHT * part)}


def plan_dropped(rule: PrivateTable, key: str, epsilon: Fraction) -> DroppedPlan | None:
    """The estimate of one private table (``None`` for a row-level table: it drops no row)."""
    assert CAP <= DROP_CAP, "the row-count table must store enough for C"
    if rule.row_level or rule.unit is None:
        return None
    return DroppedPlan(rule.name, key, rule.unit, rule.max_rows_per_unit, copy_name(key, rule), epsilon)


def dropped_statement(plan: DroppedPlan, dialect: str = DUCKDB) -> BoundedStatement:
    """One row: ``kept`` and ``dropped`` (module docstring) from the row-count table, and
    ``no_unit``, the raw table's rows whose unit is NULL."""
    name = raw_rows_name(plan.copy)
    k = exp.Literal.number(plan.rows_per_unit)
    rows = exp.column("r", table=name, quoted=True)  # typed by its table (``bounding.raw_rows_columns``)
    kept = exp.Anonymous(this="LEAST", expressions=[rows, k])
    beyond = exp.Anonymous(this="GREATEST", expressions=[exp.Sub(this=rows.copy(), expression=k.copy()),
                                                        exp.Literal.number(0)])
    dropped = exp.Anonymous(this="LEAST", expressions=[beyond, exp.Literal.number(plan.cap)])

    def total(value: exp.Expr, name: str) -> exp.Expr:
        return exp.alias_(exp.Coalesce(this=exp.Sum(this=value), expressions=[exp.Literal.number(0)]), name)

    table = exp.table_(name, db="main", catalog=DATABASE, quoted=True) if dialect == DUCKDB else \
        exp.table_(name, quoted=True)
    source = exp.Table(this=exp.to_identifier(plan.key.split(".")[-1], quoted=True),
                       db=exp.to_identifier(plan.key.split(".")[0], quoted=True) if "." in plan.key else None)
    nameless = exp.select(exp.Count(this=exp.Star())).from_(source).where(
        exp.Is(this=exp.column(plan.unit, quoted=True), expression=exp.Null()))
    select = exp.select(total(kept, "kept"), total(dropped, "dropped"),
                        exp.alias_(exp.Subquery(this=nameless), "no_unit")).from_(table)
    return BoundedStatement(render(select, dialect), False, (plan.key,))


def noisy_counts(plan: DroppedPlan, exact: tuple[int, int, int], source=None) -> dict[str, int]:
    """Each exact count (``COUNTS``) plus discrete Laplace noise of its scale (one batch per count)."""
    scales = plan.scales
    return {name: int(value) + int(discrete_laplace(scales[name], 1, source)[0])
            for name, value in zip(COUNTS, exact, strict=True)}


def release_dropped(plan: DroppedPlan, exact: tuple[int, int, int], source=None) -> RecordedDrop:
    """Noise the three counts, then the share and the intervals (post-processing of them only)."""
    noisy = noisy_counts(plan, exact, source)
    scales = plan.scales
    share = estimate_share(noisy["dropped"], float(scales["dropped"]), noisy["kept"], float(scales["kept"]),
                           added=True, alpha=ALPHA)
    no_unit = NoUnitRows(noisy["no_unit"], discrete_laplace_halfwidth(scales["no_unit"], ALPHA))
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return RecordedDrop(plan.table, plan.unit, plan.rows_per_unit, share, plan.epsilon, today, no_unit)
