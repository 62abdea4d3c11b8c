"""The limits line of every answer: the contribution limits it applied, public facts of its plan.

``Limits`` names them (rows and groups per unit, clamped columns), the share of rows a table's
MAX ROWS PER UNIT drops where the curator recorded one (``RecordedDrop``: the curator's
``dpsql.curator.dropped`` makes and records it; every answer reading the table shows it), and
which way they can move each aggregate (``dpsql.answer.notes.limit_effects``). All of it is
free: plan facts, and post-processing of a release charged once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from dpsql.analysis.plan import Plan
from dpsql.answer.notes import effects_text, limit_effects
from dpsql.mechanisms.shares import Share

if TYPE_CHECKING:
    from dpsql.query.spend import Spender

__all__ = ["Limits", "RecordedDrop", "fraction_text", "limits_of", "possessive"]


@dataclass(frozen=True)
class RecordedDrop:
    """A recorded estimate: the share of a table's rows beyond its MAX ROWS PER UNIT.

    >>> print(RecordedDrop("flights", "tailnum", 250, Share(0.044, 0.003), Fraction(1)))
    ≈ 4.4% ± 0.3% of flights' rows beyond 250 per tailnum (at least)
    """

    table: str
    """The private table as the policy names it."""
    unit: str
    """Its privacy unit column."""
    rows_per_unit: int
    """The K it was made for."""
    share: Share
    """The share of the table's rows (with a unit) beyond K rows of their unit."""
    epsilon: Fraction
    """What it cost (charged once)."""
    estimated: str | None = None
    """The UTC date it was made (ISO): it describes the table's rows as they were then, and is
    not made again when they change (the curator re-runs ``estimate_limits`` for that)."""

    def __str__(self) -> str:
        return f"{self.share} of {possessive(self.table)} rows beyond {self.rows_per_unit} per {self.unit} (at least)"

    def to_json(self) -> str:
        return json.dumps({"table": self.table, "unit": self.unit, "rows_per_unit": self.rows_per_unit,
                           "share": [self.share.value, self.share.halfwidth], "epsilon": str(self.epsilon),
                           "estimated": self.estimated},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> RecordedDrop | None:
        """The estimate a ledger entry recorded, or ``None`` if it holds none."""
        try:
            record = json.loads(text)  # type: ignore[arg-type]  # None: TypeError
            return cls(str(record["table"]), str(record["unit"]), int(record["rows_per_unit"]),
                       Share(float(record["share"][0]), float(record["share"][1])), Fraction(record["epsilon"]),
                       None if record.get("estimated") is None else str(record["estimated"]))
        except (TypeError, ValueError, KeyError, IndexError, ArithmeticError):
            return None


def possessive(name: str) -> str:
    """``name``'s, as English writes it.

    >>> possessive("flights"), possessive("shop")
    ("flights'", "shop's")
    """
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def fraction_text(value: Fraction) -> str:
    """A policy's exact number as its policy would write it.

    >>> fraction_text(Fraction(300)), fraction_text(Fraction(-1, 4))
    ('300', '-0.25')
    """
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


@dataclass(frozen=True)
class Limits:
    """The contribution limits an answer applied (public facts of its plan), the share of rows
    they drop where the curator recorded one (``RecordedDrop``), and which way they can move
    each aggregate (``dpsql.answer.notes.limit_effects``): the limits line of every answer.

    >>> str(Limits("tailnum", 250, 10, (("dep_delay", Fraction(-60), Fraction(300)),)))
    'at most 250 rows and 10 groups per tailnum; dep_delay clamped to [-60, 300]'
    >>> drop = RecordedDrop("flights", "tailnum", 250, Share(0.044, 0.003), Fraction(1))
    >>> print(Limits("tailnum", 250, None, (), (drop,), (("COUNT(*)", "lower"),)))  # doctest: +NORMALIZE_WHITESPACE
    at most 250 rows per tailnum; limits drop ≈ 4.4% ± 0.3% of flights' rows (at least); not in the ±: they can
    only lower COUNT(*)
    >>> print(Limits("tailnum", 100, 10, (), (drop,)))  # doctest: +NORMALIZE_WHITESPACE
    at most 100 rows and 10 groups per tailnum; 250 rows per tailnum drop ≈ 4.4% ± 0.3% of flights' rows (at
    least), and this query's row limit and group limit can drop more
    >>> str(Limits(None, 1, None, ()))
    'each row is its own unit'
    """

    unit: str | None
    """The privacy unit column; ``None`` when each row is its own unit."""
    rows_per_unit: int
    """Most rows of one unit the answer used."""
    groups_per_unit: int | None
    """Most groups one unit contributed to (``None``: the query has no GROUP BY)."""
    clamped: tuple[tuple[str, Fraction, Fraction], ...] = ()
    """(column, lower, upper) of every column clamped into its policy bounds."""
    dropped: tuple[RecordedDrop, ...] = ()
    """The recorded share of rows each private table read drops at its MAX ROWS PER UNIT."""
    effects: tuple[tuple[str, str], ...] = ()
    """(aggregate as written, which way the limits can move it: ``dpsql.answer.notes.EFFECTS``)."""
    unit_clamped: tuple[tuple[str, Fraction, Fraction], ...] = ()
    """(what, lower, upper) of every per-unit clamp (``Measure.unit_bounds``): a unit's total of a
    column in one group, or its own average there, clamped into its bound per unit."""

    def __str__(self) -> str:
        if self.unit is None:
            parts = ["each row is its own unit" if self.rows_per_unit == 1 else
                     f"each row is its own unit, with at most {self.rows_per_unit} rows after joins"]
        else:
            rows = f"{self.rows_per_unit} row{'s' if self.rows_per_unit != 1 else ''}"
            groups = "" if self.groups_per_unit is None else \
                f" and {self.groups_per_unit} group{'s' if self.groups_per_unit != 1 else ''}"
            parts = [f"at most {rows}{groups} per {self.unit}"]
        parts += [f"{name} clamped to [{fraction_text(lower)}, {fraction_text(upper)}]"
                  for name, lower, upper in self.clamped]
        parts += [f"each unit's {what} per group clamped to [{fraction_text(lower)}, {fraction_text(upper)}]"
                  for what, lower, upper in self.unit_clamped]
        parts += [self._dropped_text(drop) for drop in self.dropped]
        effects = effects_text(self.effects)
        return "; ".join(parts + ([effects] if effects else []))

    def _dropped_text(self, drop: RecordedDrop) -> str:
        when = f"; estimated {drop.estimated}, from the rows then" if drop.estimated else ""
        shown = f"{drop.share} of {possessive(drop.table)} rows (at least{when})"
        more = (["row limit"] if self.rows_per_unit < drop.rows_per_unit else []) + \
            (["group limit"] if self.groups_per_unit is not None else [])
        if not more:
            return f"limits drop {shown}"
        return (f"{drop.rows_per_unit} rows per {drop.unit} drop {shown}, and this query's "
                f"{' and '.join(more)} can drop more")


def limits_of(plan: Plan, recorded: tuple[RecordedDrop, ...] = ()) -> Limits:
    """The limits ``plan`` applies: its unit, rows and groups per unit, clamped columns, the
    ``recorded`` shares of rows its tables' limits drop, and which way they move its aggregates."""
    query = plan.query
    rule = query.rule
    clamped: dict[str, tuple[str, Fraction, Fraction]] = {}
    for measure in plan.measures:
        for column in measure.clamped_columns:
            clamped.setdefault(column.name, (column.name, column.lower, column.upper))
    groups = rule.groups_per_unit if query.keys else None
    unit = None if query.hidden_unit or rule.row_level else rule.unit
    drops = unit is not None or rule.max_rows_per_unit > 1
    return Limits(unit, rule.max_rows_per_unit, groups, tuple(sorted(clamped.values())), tuple(recorded),
                  limit_effects(plan, drops), _unit_clamped(plan))


def _unit_clamped(plan: Plan) -> tuple[tuple[str, Fraction, Fraction], ...]:
    """The per-unit clamps of ``plan``'s sums of one column (a sum of squares' or products' is
    derived from the column's and not listed), in the column's units."""
    found: dict[tuple[str, Fraction, Fraction], None] = {}
    for measure in plan.measures:
        if measure.unit_bounds is None or measure.kind != "sum" or measure.squared or len(measure.clamped_columns) != 1:
            continue
        if measure.factors and sum(f.power for f in measure.factors) != 1:
            continue
        column = measure.clamped_columns[0].name if not measure.factors else \
            next(f.clamped_columns[0].name for f in measure.factors if f.power == 1 and f.clamped_columns)
        what = f"average of {column}" if measure.unit_average else f"total of {column}"
        low, high = (bound * measure.grid for bound in measure.unit_bounds)
        found[what, low, high] = None
    return tuple(found)


KEY_PREFIX = "limits-drop/"
"""Ledger keys of recorded estimates (query keys are hex digests: no clash)."""


def record_key(key: str, unit: str, rows_per_unit: int) -> str:
    """The ledger key of a table's estimate: what it depends on besides the data.

    >>> record_key("main.flights", "tailnum", 250)
    'limits-drop/main.flights/tailnum/250'
    """
    return f"{KEY_PREFIX}{key}/{unit.lower()}/{rows_per_unit}"


def recorded_drop(spender: "Spender", key: str, unit: str, rows_per_unit: int) -> RecordedDrop | None:
    """The latest recorded estimate of a table's rows beyond ``rows_per_unit`` (``None``: none)."""
    return RecordedDrop.from_json(spender.stored(record_key(key, unit, rows_per_unit)))
