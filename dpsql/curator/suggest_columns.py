"""Which columns ``dpsql suggest`` bounds when none are named: the measure-like ones.

Decided from public facts only (the column's name and type in the catalog, the table's name,
the policy), never from the data, so the choice costs nothing and tells nothing. A numeric
column is skipped, with the reason said, when it is

* the privacy unit, or the column asked for MAX GROUPS PER UNIT (a grouping column);
* declared with KEYS in the policy (a grouping column with a public domain);
* named like an identifier: its last word is ``id``, ``key``, ``code``, ``number``, ``num``,
  ``no``, ``nr``, ``zip``, ``phone``... (``user_id``, ``flight_number``, ``userId``), or one
  lower-case word ending in ``id`` (``userid``), or the table's own name in the singular
  (``flight`` in ``flights``: the row's own label);
* a calendar or clock part: any of its words is ``year``, ``month``, ``day``, ``hour``,
  ``minute``, ``second``, ``week``, ``quarter``, ``weekday``, ``dow``, ``doy``... (``year``,
  ``dep_hour``); a duration such as ``air_time`` or ``days_open`` is kept.

Summing a calendar part or an identifier means nothing, and each column named shares the
suggestion's epsilon: bounding them would only make the measures' bounds noisier. The curator
names any of them with ``--columns`` (``columns=[...]``) to bound it all the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpsql.sql.types import is_numeric_type

IDENTIFIER_WORDS = frozenset({"id", "ids", "uid", "uuid", "guid", "key", "pk", "fk", "code", "number", "num",
                              "no", "nr", "zip", "zipcode", "postcode", "phone", "ssn", "idx", "seq"})
"""A column whose last word is one of these names something rather than measures it."""
CALENDAR_WORDS = frozenset({"year", "yr", "quarter", "month", "week", "weekday", "day", "dow", "doy", "hour",
                            "minute", "second", "yyyy", "mm", "dd", "hh"})
"""A column with one of these words is a part of a date or time: a key, not a measure."""


@dataclass(frozen=True)
class ColumnChoice:
    """The columns a suggestion bounds, and why each other numeric column is left out."""

    chosen: tuple[str, ...]
    """The measure-like numeric columns, in the table's order."""
    skipped: tuple[tuple[str, str], ...]
    """(column, reason) of each numeric column left out."""


def words(name: str) -> list[str]:
    """A column name's words, lower case: split at non-letters and at camelCase humps.

    >>> words("dep_delay"), words("userId"), words("air_time2")
    (['dep', 'delay'], ['user', 'id'], ['air', 'time'])
    """
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)
    return [w.lower() for w in re.split(r"[^A-Za-z]+", spaced) if w]


def _singular(name: str) -> str:
    name = name.lower()
    if name.endswith("ies"):
        return name[:-3] + "y"
    if name.endswith("ses") or name.endswith("xes"):
        return name[:-2]
    return name[:-1] if name.endswith("s") else name


def skip_reason(column: str, table: str) -> str | None:
    """Why ``column`` of ``table`` is not measure-like, by its name alone; ``None`` if it is.

    >>> [skip_reason(c, "flights") for c in ("dep_delay", "air_time", "year", "dep_hour", "flight", "user_id")]
    [None, None, 'a calendar part', 'a calendar part', 'an identifier, named after the table', 'an identifier']
    >>> skip_reason("customerid", "orders"), skip_reason("paid", "orders"), skip_reason("days_open", "shops")
    ('an identifier', None, None)
    """
    parts = words(column)
    if not parts:
        return None
    if any(part in CALENDAR_WORDS for part in parts):
        return "a calendar part"
    if parts[-1] in IDENTIFIER_WORDS:
        return "an identifier"
    if len(parts) == 1 and column.islower() and len(column) >= 5 and column.endswith("id"):
        return "an identifier"
    short_table = table.split(".")[-1]
    if column.lower() in (short_table.lower(), _singular(short_table)):
        return "an identifier, named after the table"
    return None


def measure_columns(table: str, types: dict[str, str], unit: str | None, keys: set[str],
                    group_by: str | None = None) -> ColumnChoice:
    """The numeric columns of ``table`` (``types``: column -> catalog type, lower-case names)
    a suggestion bounds by default, and the others with their reason (module docstring).
    ``keys``: the lower-case columns the policy gives KEYS.

    >>> choice = measure_columns("flights", {"year": "BIGINT", "dep_delay": "DOUBLE", "tailnum": "VARCHAR",
    ...     "flight": "BIGINT", "distance": "BIGINT", "origin": "VARCHAR", "hour": "BIGINT"}, "tailnum", set())
    >>> choice.chosen, choice.skipped  # doctest: +NORMALIZE_WHITESPACE
    (('dep_delay', 'distance'), (('year', 'a calendar part'), ('flight', 'an identifier, named after the table'),
    ('hour', 'a calendar part')))
    """
    chosen, skipped = [], []
    for column, type_name in types.items():
        if column == unit or not is_numeric_type(type_name):
            continue
        if column == group_by:
            reason: str | None = "the MAX GROUPS PER UNIT column"
        elif column in keys:
            reason = "a KEYS column"
        else:
            reason = skip_reason(column, table)
        if reason is None:
            chosen.append(column)
        else:
            skipped.append((column, reason))
    return ColumnChoice(tuple(chosen), tuple(skipped))
