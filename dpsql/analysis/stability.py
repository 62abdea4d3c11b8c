"""How far each construct of a FROM clause moves what one privacy unit contributes.

A private query's aggregates read a relation built from tables, joins, subqueries and UNION
ALL (``dpsql.analysis.relation``). Each construct is one ``Step`` of that relation's stability
record: the rows and groups one unit may have after it (the limits the sensitivity rules and
the rewrite apply), the rows per unit the SQL that runs holds whatever the data, and the rule
that justifies both. The record is built before the charge from the policy, the query and
public facts only; EXPLAIN reads the joins' lines from it.

The rules, one per construct (k: rows per unit, g: groups per unit):

* a private table, read through its bounded copy: k and g as the policy declares, and the copy
  holds at most k rows of each unit;
* a join of two private tables on their units: a joined row pairs a row of each side of the
  same unit, so k = k1·k2 and g = min(g1, g2); each side is truncated to its k rows first;
* a join with public data: a private row matches at most m stored public rows (m: the largest
  multiplicity of the join keys), so k = k·m, g unchanged;
* a row-by-row subquery: k and g unchanged;
* a subquery grouped by the unit: k = 1 grouped by the unit alone (one row per unit), else k;
* UNION ALL: the branches' rows add up, k = k1 + k2 + ..., g = g1 + g2 + ....

Every join and UNION ALL also bounds the *work* one unit causes (``check_fan_out``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from dpsql.policy.model import PrivateTable
from dpsql.sql.allowlist import refuse

TABLE = "private table"
UNIT_JOIN = "join on the privacy unit"
PUBLIC_JOIN = "join with public data"
TRUNCATION = "truncation to k rows per unit"
ROW_SUBQUERY = "row-by-row subquery"
UNIT_SUBQUERY = "per-unit subquery"
UNION_ALL = "UNION ALL"


@dataclass(frozen=True)
class Step:
    """One construct of a relation and how far it moves one unit's contribution."""

    construct: str
    """Which rule applies: ``TABLE``, ``UNIT_JOIN``, ``PUBLIC_JOIN``, ``TRUNCATION``,
    ``ROW_SUBQUERY``, ``UNIT_SUBQUERY`` or ``UNION_ALL``."""
    label: str
    """What it reads, as messages and EXPLAIN name it."""
    rows_per_unit: int
    """Rows of one unit the aggregate may use after it (what the sensitivity rules read)."""
    groups_per_unit: int | None
    """Groups one unit may touch after it (``None``: no more than its rows, as in the policy)."""
    held: int | None
    """Rows per unit the SQL that runs holds at most whatever the data (``None``: nothing holds
    it; the final rewrite then bounds the rows per unit itself)."""
    why: str
    """The rule applied, in words: what it multiplies and why that holds."""

    def limits(self, rule: PrivateTable) -> PrivateTable:
        """``rule`` with this step's rows and groups per unit."""
        return replace(rule, max_rows_per_unit=self.rows_per_unit, max_groups_per_unit=self.groups_per_unit)


def product(a: int | None, b: int | None) -> int | None:
    """Rows per unit a join holds at most, when both factors are known.

    >>> product(3, 4), product(3, 0), product(None, 2)
    (12, 3, None)
    """
    return None if a is None or b is None else a * max(b, 1)


def check_fan_out(node: exp.Expression, held: int | None, inputs: tuple[int | None, ...], limit: int,
                  how: str, instead: str) -> None:
    """Refuse a join or UNION ALL that gives one unit more rows than the policy allows.

    Truncating to k rows per unit bounds what one unit adds to an answer, not the work done
    before: a unit's k^n rows in n self-joins (or m^n in n public joins, or copies stacked by
    UNION ALL) take time, memory and maybe the time limit only when the unit is there, a
    noiseless membership test. So every relation a join or UNION ALL builds — including those
    inside subqueries, per-unit aggregates and CTEs — holds at most ``MAX ROWS PER UNIT AFTER
    JOINS`` rows per unit, or no more than one of its inputs already held (``inputs``: the rows
    per unit each held; a declared MAX ROWS PER UNIT above the limit is the curator's choice).
    Decided from the policy, the query and public multiplicities only: before the charge,
    whatever the data.
    """
    most = max((held_by or 0 for held_by in inputs), default=0)
    if held is not None and (held <= limit or held <= most):
        return
    reached = "more rows than can be bounded" if held is None else f"up to {held:,} rows"
    refuse(node, f"{how}: one privacy unit would have {reached} after it, more than the policy's "
           f"MAX ROWS PER UNIT AFTER JOINS {limit:,} (the work for one unit's rows could tell whether it is "
           "in the data)", f"{instead}; or ask the curator to raise MAX ROWS PER UNIT AFTER JOINS")
