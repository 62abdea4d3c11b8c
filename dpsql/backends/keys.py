"""GROUP BY keys at the seam between DuckDB and Python: read back losslessly, shown totally.

Exact per-group rows come back from DuckDB to Python, where they are matched with a public
domain or pass partition selection. Nothing there may fail, merge or drop depending on the data
(DESIGN.md invariant 19), so every key travels in a form whose DuckDB -> Python conversion is
total (it never raises) and injective (two different DuckDB groups never become one Python key),
and whose DuckDB grouping is a function of each row alone (no group whose representative
depends on which of its rows DuckDB saw first). A key's DuckDB type decides its form, before
the charge (``key_form``):

* ``"value"``: the typed key. Integers of every width (Python ints), BOOLEAN, DECIMAL (one scale
  per type, so ``Decimal`` equality is DuckDB's), UUID, BLOB and ENUM convert totally and
  one-to-one, and DuckDB groups them by plain equality.
* ``"text"``: the key's canonical DuckDB text, as UTF-8 bytes (``encode(CAST(key AS VARCHAR))``),
  computed row by row. For DATE, TIME, TIMESTAMP*, INTERVAL, FLOAT, DOUBLE, BIT, ... the Python
  conversion fails (an INTERVAL of 10^9 months, a date past 9999, TIME '24:00:00') or merges
  (nanoseconds, 'infinity', INTERVAL '1 month' = '30 days', -0.0 = 0.0, NaN != NaN); DuckDB's
  own grouping merges some of them too ('1 month' = '30 days', -0.0 = 0.0) with a
  representative that depends on the data. Text does neither: equal texts are equal values.
  VARCHAR keys take this form as bytes as well: a BLOB has no collation, so a column declared
  ``COLLATE NOCASE`` (or a connection's ``default_collation``) cannot merge 'A' and 'a' into a
  group named after whichever came first.
* nested types (LIST, STRUCT, MAP, UNION, ARRAY) and anything not listed are refused, by name.

Released keys of the text form are shown by ``display_value``: the exact Python value when the
text round-trips through it exactly (a DATE as ``datetime.date``, a DOUBLE as ``float``), else
the text itself — total, and still one-to-one.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import replace
from typing import Callable, Literal, Sequence

from sqlglot import exp

from dpsql.analysis.plan import GroupKey
from dpsql.errors import UnsupportedQuery
from dpsql.sql.parse import DIALECT
from dpsql.sql.pieces import data_type, key_text
from dpsql.sql.types import base_type

KeyForm = Literal["value", "text"]

_INTEGERS = frozenset("TINYINT SMALLINT INTEGER BIGINT HUGEINT UTINYINT USMALLINT UINTEGER UBIGINT "
                      "UHUGEINT".split())
_VALUE_TYPES = _INTEGERS | {"BOOLEAN", "DECIMAL", "UUID", "BLOB", "ENUM"}
_TEXT_TYPES = frozenset({
    "VARCHAR", "DATE", "TIME", "TIME_NS", "TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS",
    "TIMESTAMP WITH TIME ZONE", "TIME WITH TIME ZONE", "INTERVAL", "FLOAT", "DOUBLE", "BIT",
    "BIGNUM", "VARINT",
})
_NESTED = ("[]", "STRUCT(", "MAP(", "UNION(", "LIST")
WIDE_INTEGERS = frozenset({"HUGEINT", "UHUGEINT", "UBIGINT"})
"""Integer types whose values need not fit int64 (pandas cannot carry them as int64)."""


def is_nested(type_name: str) -> bool:
    """True for LIST, ARRAY, STRUCT, MAP and UNION types (``INTEGER[]``, ``STRUCT(a INTEGER)``).

    >>> is_nested("INTEGER[]"), is_nested("VARCHAR[3]"), is_nested("MAP(VARCHAR, INTEGER)"), is_nested("DATE")
    (True, True, True, False)
    """
    name = type_name.strip().upper()
    return name.endswith("]") or any(name.startswith(prefix) for prefix in _NESTED[1:])


def key_form(type_name: str) -> KeyForm | None:
    """How a key of this DuckDB type is read back (module docstring); ``None``: refused.

    >>> key_form("HUGEINT"), key_form("DECIMAL(38,2)"), key_form("DATE"), key_form("VARCHAR")
    ('value', 'value', 'text', 'text')
    >>> key_form("INTERVAL"), key_form("INTEGER[]"), key_form("STRUCT(a INTEGER)")
    ('text', None, None)
    """
    if is_nested(type_name):
        return None
    base = base_type(type_name)
    if base in _VALUE_TYPES:
        return "value"
    if base in _TEXT_TYPES:
        return "text"
    return None


def key_expression(expression: exp.Expr, type_name: str, form: str) -> exp.Expr:
    """What a key is grouped and read back by: the expression itself, or its text as bytes
    (``dpsql.sql.pieces.key_text``).

    A FLOAT is widened to DOUBLE first (exactly), so its text reads back as the exact value.

    >>> from dpsql.backends.render import render
    >>> render(key_expression(exp.column("day", quoted=True), "DATE", "text"))
    'ENCODE(CAST("day" AS TEXT))'
    >>> render(key_expression(exp.column("x", quoted=True), "FLOAT", "text"))
    'ENCODE(CAST(CAST("x" AS DOUBLE) AS TEXT))'
    """
    if form == "value":
        return expression
    if base_type(type_name) in ("FLOAT", "REAL", "FLOAT4"):
        expression = exp.Cast(this=expression, to=data_type("DOUBLE", DIALECT))
        type_name = "DOUBLE"
    return key_text(expression, type_name)


def typed_keys(keys: Sequence[GroupKey], types: dict[str, str]) -> tuple[GroupKey, ...]:
    """Each key with its DuckDB type (``types``: core column -> type, from binding the query)
    and form; a key of a type that cannot be read back exactly is refused, before the charge
    (at the key's node: ``dpsql.query.prepare`` locates it).

    >>> from sqlglot import exp
    >>> typed_keys([GroupKey("g0", exp.column("day"), None)], {"g0": "DATE"})[0].form
    'text'
    """
    typed = []
    for key in keys:
        type_name = types[key.name]
        form = key_form(type_name)
        if form is None:
            raise UnsupportedQuery(
                f"GROUP BY {key.expression.sql(dialect=DIALECT)}: its keys are of type {type_name}, "
                "which dpsql cannot release as keys", node=key.expression, hint=refusal_hint(type_name))
        typed.append(replace(key, type_name=type_name, form=form))
    return tuple(typed)


def refusal_hint(type_name: str) -> str:
    """What to write instead of grouping by a key of a refused type."""
    if is_nested(type_name):
        return ("group by one field or element (s.field, list[1]) or by its text, "
                "CAST(key AS VARCHAR)")
    return "group by CAST(key AS VARCHAR), or by a column of a plain type"


# --- showing released keys ---------------------------------------------------------------------

def display_value(value, type_name: str):
    """A released value of a text form (DuckDB's text, as str or UTF-8 bytes) as the analyst sees
    it: the exact Python value when the text round-trips through it, else the text. Never raises.

    >>> display_value(b"2024-01-31", "DATE"), display_value("infinity", "DATE")
    (datetime.date(2024, 1, 31), 'infinity')
    >>> display_value("-0.0", "DOUBLE"), display_value("1 month", "INTERVAL")
    (-0.0, '1 month')
    >>> display_value("2024-01-01 10:00:00.123456789", "TIMESTAMP_NS")
    '2024-01-01 10:00:00.123456789'
    >>> display_value("2024-01-01 10:00:00.5", "TIMESTAMP")
    datetime.datetime(2024, 1, 1, 10, 0, 0, 500000)
    """
    if value is None:
        return None
    text = decoded_text(value) if isinstance(value, (bytes, bytearray)) else str(value)
    base = base_type(type_name)
    if base in ("DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8"):
        try:
            return show_float(text)
        except ValueError:
            return text
    reader = _READERS.get(base)
    if reader is None:
        return text
    try:
        parsed = reader[0](text)
    except (ValueError, OverflowError, TypeError):
        return text
    return parsed if parsed is not None and reader[1](parsed) == text else text


_FRACTION = r"(?:\.(\d{1,9}))?"
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})" + _FRACTION)
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})" + _FRACTION + r"([+-]\d{2}(?::\d{2})?)?")


def _micros(fraction: str | None) -> int | None:
    """Microseconds of a fraction of a second, or ``None`` when it is finer than that."""
    if not fraction:
        return 0
    digits = fraction.ljust(9, "0")
    return None if digits[6:] != "000" else int(digits[:6])


def _fraction_text(microseconds: int) -> str:
    return f".{microseconds:06d}".rstrip("0") if microseconds else ""


def _read_date(text: str):
    match = _DATE.fullmatch(text)
    return None if match is None else datetime.date(*map(int, match.groups()))


def _show_date(value: datetime.date) -> str:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def _read_time(text: str):
    match = _TIME.fullmatch(text)
    if match is None:
        return None
    micros = _micros(match.group(4))
    if micros is None:
        return None
    hour, minute, second = (int(part) for part in match.groups()[:3])
    return datetime.time(hour, minute, second, micros)


def _show_time(value: datetime.time) -> str:
    return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}{_fraction_text(value.microsecond)}"


def _read_timestamp(text: str):
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return None
    micros = _micros(match.group(7))
    if micros is None:
        return None
    zone = None
    if match.group(8):
        sign = -1 if match.group(8)[0] == "-" else 1
        hours, _, minutes = match.group(8)[1:].partition(":")
        zone = datetime.timezone(sign * datetime.timedelta(hours=int(hours), minutes=int(minutes or 0)))
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    return datetime.datetime(year, month, day, hour, minute, second, micros, tzinfo=zone)


def _show_timestamp(value: datetime.datetime) -> str:
    text = f"{_show_date(value.date())} {_show_time(value.time())}"
    offset = value.utcoffset()
    if offset is None:
        return text
    minutes = int(offset.total_seconds()) // 60
    sign, minutes = ("-" if minutes < 0 else "+"), abs(minutes)
    return text + f"{sign}{minutes // 60:02d}" + (f":{minutes % 60:02d}" if minutes % 60 else "")


_READERS: dict[str, tuple[Callable, Callable]] = {
    "DATE": (_read_date, _show_date),
    "TIME": (_read_time, _show_time),
    "TIMESTAMP": (_read_timestamp, _show_timestamp),
    "TIMESTAMP_S": (_read_timestamp, _show_timestamp),
    "TIMESTAMP_MS": (_read_timestamp, _show_timestamp),
    "TIMESTAMP_NS": (_read_timestamp, _show_timestamp),
    "TIMESTAMP WITH TIME ZONE": (_read_timestamp, _show_timestamp),
}
"""Per type: (parse DuckDB text, format the parsed value as DuckDB does). INTERVAL stays text:
a DuckDB interval has three fields (months, days, microseconds) and Python's timedelta one, so
distinct intervals ('36:00:00', '1 day 12:00:00') would become equal timedeltas."""


def show_float(text: str) -> float:
    """A DOUBLE (or FLOAT, widened) key's text as a float: DuckDB prints the shortest digits that
    name the double exactly, so ``float`` reads back that very double (NaN, inf, -0.0 included;
    ``tests/test_keys.py`` checks the round trip on random doubles).

    >>> show_float("-0.0"), show_float("1e+20"), str(show_float("nan"))
    (-0.0, 1e+20, 'nan')
    """
    return float(text)


def display(value, type_name: str, form: KeyForm):
    """A released key of ``form`` as the analyst sees it (``display_value`` for text forms).

    >>> display(b"A", "VARCHAR", "text"), display(7, "INTEGER", "value"), display(b"0.5", "DOUBLE", "text")
    ('A', 7, 0.5)
    """
    if form == "value" or value is None:
        return value
    return display_value(value, type_name)


def decoded_text(value) -> str:
    """UTF-8 bytes as str, total and one-to-one (``surrogateescape`` keeps any invalid byte
    as a distinct lone surrogate instead of raising)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


def read_keys(rows: list[tuple], keys: Sequence[GroupKey], *, text: Callable | None = None,
              value: Callable | None = None) -> list[tuple]:
    """Exact rows (keys first) as fetched, with every text-form key's bytes as str: the bytes
    are what DuckDB grouped by, and decoding is one-to-one, so equal strs are one DuckDB group.
    An engine that writes its own texts passes ``text(raw, type_name)``, which reads its text
    as DuckDB's text of the same value (one-to-one, never raising), and ``value(v, type_name)``
    for value-form keys (``dpsql.backends.spark``).

    >>> from sqlglot import exp
    >>> key = GroupKey("g0", exp.column("d"), None, "DATE", "text")
    >>> read_keys([(b"2024-01-31", 3), (None, 1)], [key])
    [('2024-01-31', 3), (None, 1)]
    """
    if text is None and value is None:
        return _map_keys(rows, keys, lambda key: None if key.form == "value" else decoded_text)

    def reader(key: GroupKey) -> Callable:
        if key.form == "value":
            return (lambda v: v) if value is None else (lambda v, t=key.type_name: value(v, t))
        return decoded_text if text is None else (lambda v, t=key.type_name: text(v, t))

    return _map_keys(rows, keys, reader)


def shown_keys(rows: list[tuple], keys: Sequence[GroupKey]) -> list[tuple]:
    """Noisy core rows (keys first) with every text-form key as the analyst sees it (``display``)."""
    return _map_keys(rows, keys, lambda key: None if key.form == "value" else
                     (lambda value, key=key: display(value, key.type_name, key.form)))


def _map_keys(rows: list[tuple], keys: Sequence[GroupKey], converter_of) -> list[tuple]:
    converters = [converter_of(key) for key in keys]
    if all(c is None for c in converters):
        return rows
    width = len(converters)
    return [tuple(value if c is None else c(value) for c, value in zip(converters, row[:width])) + tuple(row[width:])
            for row in rows]


FETCHED_AS_IS = _VALUE_TYPES | {"VARCHAR", "FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8", "NULL", '"NULL"'}
"""Types DuckDB converts to Python totally and exactly: fetched as they are. Any other result
column of post-processing (dates, timestamps, intervals, nested values) is fetched as DuckDB's
text and shown by ``display_value``."""


def fetched_as_text(type_name: str) -> bool:
    """True for a post-processing result type that is fetched as text (``FETCHED_AS_IS``).

    >>> [fetched_as_text(t) for t in ("DATE", "INTEGER[]", "DECIMAL(9,2)", "DOUBLE")]
    [True, True, False, False]
    """
    return is_nested(type_name) or base_type(type_name) not in FETCHED_AS_IS
