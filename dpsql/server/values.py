"""Result columns as PostgreSQL types, and values in PostgreSQL's text format.

A column's type is read from its released values (the first non-NULL one), so it is a
function of the release alone. Everything is sent in text format: clients that asked for
binary read the format code of each field, which says text.

>>> column_type([3, None, 5]), column_type([2**70]), column_type([]), column_type([1.5])
(20, 1700, 25, 701)
>>> text_value(True), text_value(float("inf")), text_value(None), column_type([numpy.int64(3)])
(b't', b'Infinity', None, 20)
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid

import numpy

BOOL, BYTEA, INT8, TEXT, FLOAT8, NUMERIC = 16, 17, 20, 25, 701, 1700
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, UUID = 1082, 1083, 1114, 1184, 1186, 2950

INT8_RANGE = range(-(2**63), 2**63)


def column_type(values) -> int:
    """The PostgreSQL type OID for a column holding ``values``."""
    kinds = {_oid(v) for v in values if v is not None}
    if not kinds:
        return TEXT
    if kinds <= {INT8, NUMERIC, FLOAT8}:
        if FLOAT8 in kinds:
            return FLOAT8
        return NUMERIC if NUMERIC in kinds else INT8
    return kinds.pop() if len(kinds) == 1 else TEXT


def _oid(value) -> int:
    value = plain(value)
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT8 if value in INT8_RANGE else NUMERIC
    if isinstance(value, float):
        return FLOAT8
    if isinstance(value, decimal.Decimal):
        return NUMERIC
    if isinstance(value, datetime.datetime):
        return TIMESTAMP if value.tzinfo is None else TIMESTAMPTZ
    if isinstance(value, datetime.date):
        return DATE
    if isinstance(value, datetime.time):
        return TIME
    if isinstance(value, datetime.timedelta):
        return INTERVAL
    if isinstance(value, (bytes, bytearray)):
        return BYTEA
    if isinstance(value, uuid.UUID):
        return UUID
    return TEXT


class Rounded(float):
    """A noisy value sent to the digits its ± supports (``dpsql.server.intervals``): a float8 to
    every client, whose text keeps the digits shown, ``4.10`` or ``215``.

    >>> text_value(Rounded(4.1, "4.10")), column_type([Rounded(215.0, "215")])
    (b'4.10', 701)
    """

    text: str

    def __new__(cls, value: float, text: str) -> "Rounded":
        made = super().__new__(cls, value)
        made.text = text
        return made

    def __reduce__(self):  # pickled whole: answers come from the server's worker processes
        return (Rounded, (float(self), self.text))


def text_value(value) -> bytes | None:
    """``value`` in PostgreSQL's text format (``None`` is NULL)."""
    value = plain(value)
    if value is None:
        return None
    if isinstance(value, Rounded):
        return value.text.encode("ascii")
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, float):
        if math.isnan(value):
            return b"NaN"
        if math.isinf(value):
            return b"Infinity" if value > 0 else b"-Infinity"
        return repr(value).encode("ascii")
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ").encode("ascii")
    if isinstance(value, datetime.timedelta):
        return f"{value.days} days {value.seconds} seconds {value.microseconds} microseconds".encode("ascii")
    if isinstance(value, (bytes, bytearray)):
        return b"\\x" + bytes(value).hex().encode("ascii")
    if isinstance(value, (list, tuple)):
        return ("{" + ",".join("NULL" if v is None else _array_item(v) for v in value) + "}").encode("utf-8")
    if isinstance(value, dict):
        return str(value).encode("utf-8")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat().encode("ascii")
    return str(value).encode("utf-8")


def plain(value):
    """A numpy scalar (answers read through pandas may hold them) as the Python value."""
    return value.item() if isinstance(value, numpy.generic) else value


def _array_item(value) -> str:
    """One non-NULL element of an array, quoted as PostgreSQL's array text quotes it."""
    text = (text_value(value) or b"").decode("utf-8")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
