"""The limits line of every answer: the contribution limits it applied, public facts of its plan.

``Limits`` names them (rows and groups per unit, clamped columns), the share of rows a table's
MAX ROWS PER UNIT drops where the curator recorded one (``RecordedDrop``: the curator's
``dpsql.curator.dropped`` makes and records it; every answer reading the table shows it), the
rows with no unit (NULL), which no answer counts (with the recorded noisy count of them where
there is one, ``NoUnitRows``; else the fact alone, the same whatever the data), and which way
the limits can move each aggregate (``dpsql.answer.notes.limit_effects``). All of it is free:
plan facts, and post-processing of a release charged once.
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

__all__ = ["Limits", "NoUnitRows", "RecordedDrop", "fraction_text", "limits_of", "possessive"]


@dataclass(frozen=True)
class NoUnitRows:
    """A recorded noisy count of a table's rows whose unit is NULL, with its 95% half-width;
    shown cut at 0 (a count is never below it).

    >>> str(NoUnitRows(2512, 30)), str(NoUnitRows(12, 30)), str(NoUnitRows(-7, 30))
    ('≈ 2,512 ± 30', '≈ 12 [0, 42]', '≈ 0 [0, 23]')
    """

    value: int
    """The noisy count (discrete Laplace noise: it may be below 0)."""
    halfwidth: int
    """Half-width of its 95% noise interval."""

    def __str__(self) -> str:
        shown = max(self.value, 0)
        if self.value - self.halfwidth < 0:
            return f"≈ {shown:,} [0, {max(self.value + self.halfwidth, 0):,}]"
        return f"≈ {shown:,} ± {self.halfwidth:,}"


@dataclass(frozen=True)
class RecordedDrop:
    """A recorded estimate: the share of a table's rows beyond its MAX ROWS PER UNIT.

    >>> print(RecordedDrop("flights", "tailnum", 250, Share(0.044, 0.003), Fraction(1)))
    ≈ 4.4% ± 0.3% of flights' rows beyond 250 per tailnum (at least)
    >>> print(RecordedDrop("flights", "tailnum", 250, Share(0.044, 0.003), Fraction(1), None, NoUnitRows(2512, 30)))
    ≈ 4.4% ± 0.3% of flights' rows beyond 250 per tailnum (at least); ≈ 2,512 ± 30 rows with no tailnum
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
    no_unit: NoUnitRows | None = None
    """The noisy count of the table's rows with no unit (``None``: an estimate made before it was counted)."""

    def __str__(self) -> str:
        text = f"{self.share} of {possessive(self.table)} rows beyond {self.rows_per_unit} per {self.unit} (at least)"
        return text if self.no_unit is None else f"{text}; {self.no_unit} rows with no {self.unit}"

    def to_json(self) -> str:
        return json.dumps({"table": self.table, "unit": self.unit, "rows_per_unit": self.rows_per_unit,
                           "share": [self.share.value, self.share.halfwidth], "epsilon": str(self.epsilon),
                           "estimated": self.estimated,
                           **({} if self.no_unit is None else
                              {"no_unit": [self.no_unit.value, self.no_unit.halfwidth]})},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> RecordedDrop | None:
        """The estimate a ledger entry recorded, or ``None`` if it holds none."""
        try:
            record = json.loads(text)  # type: ignore[arg-type]  # None: TypeError
            counted = record.get("no_unit")
            return cls(str(record["table"]), str(record["unit"]), int(record["rows_per_unit"]),
                       Share(float(record["share"][0]), float(record["share"][1])), Fraction(record["epsilon"]),
                       None if record.get("estimated") is None else str(record["estimated"]),
                       None if counted is None else NoUnitRows(int(counted[0]), int(counted[1])))
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
    >>> print(Limits("tailnum", 300, None, (), (), (), no_unit=True))
    at most 300 rows per tailnum; rows with no tailnum belong to nobody and are never counted
    >>> drop = RecordedDrop("flights", "tailnum", 300, Share(0.016, 0.004), Fraction(1), None, NoUnitRows(2512, 30))
    >>> print(Limits("tailnum", 300, None, (), (drop,), (), no_unit=True))  # doctest: +NORMALIZE_WHITESPACE
    at most 300 rows per tailnum; limits drop ≈ 1.6% ± 0.4% of flights' rows (at least); rows with no
    tailnum (≈ 2,512 ± 30 of flights' rows) belong to nobody and are never counted
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
    no_unit: bool = False
    """Rows with no unit (NULL) are left out: say so, with the recorded count where every table
    read has one (``RecordedDrop.no_unit``), else as a fact alone."""
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
        if self._counted_no_unit():
            parts += [f"rows with no {drop.unit} ({drop.no_unit} of {possessive(drop.table)} rows) belong to nobody "
                      f"and are never counted" for drop in self.dropped]
        elif self.no_unit:  # no released count: the fact alone, the same whatever the data
            parts.append(f"rows with no {self.unit} belong to nobody and are never counted")
        effects = effects_text(self.effects)
        return "; ".join(parts + ([effects] if effects else []))

    def _counted_no_unit(self) -> bool:
        """Every table read has a recorded count of its rows with no unit."""
        return self.no_unit and bool(self.dropped) and all(drop.no_unit is not None for drop in self.dropped)

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
                  limit_effects(plan, drops), no_unit=unit is not None, unit_clamped=_unit_clamped(plan))


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
