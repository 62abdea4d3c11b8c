"""GROUP BY keys read back from Spark as DuckDB would have given them.

dpsql reads keys back losslessly (``dpsql.backends.keys``): a text-form key arrives as the
UTF-8 bytes of DuckDB's ``CAST(key AS VARCHAR)``, and everything downstream (``display_value``,
post-processing in DuckDB) reads that text. On Spark the key's bytes are Spark's own text
(``spark_types.key_text_sql``); ``duckdb_key_text`` turns it into DuckDB's text of the same value,
and ``value_key`` turns a value-form key as ``collect()`` gives it into what DuckDB's fetch gives.

Both run after the privacy charge, so both are TOTAL (they never raise, whatever the bytes) and
``duckdb_key_text`` is INJECTIVE (two different Spark texts never give one result): a text is
translated only when it is exactly Spark's text of the value it spells (it is parsed, written
again as Spark writes it, and compared), and any other text comes back as ``UNTRANSLATED``
followed by the text itself, which no translated text begins with.

Spark's texts and DuckDB's, as found on both engines (``tests/test_spark_types.py``):

* DOUBLE (and FLOAT, widened exactly): Spark writes Java's hexadecimal form (``0x1.8p1``,
  ``-0x0.0p0``, ``NaN``, ``-Infinity``); DuckDB the shortest digits that read back as the same
  double, exactly as Python's ``repr`` (``1e+22``, ``5e-324``, ``-0.0``, ``inf``), except NaN: one
  value on Spark, written ``nan`` (DuckDB writes ``-nan`` for a NaN with its sign bit set).
* DATE and TIMESTAMP: the same digits (fractions of a second without trailing zeros) but for
  years outside 1..9999: Spark writes ISO years, ``0000-12-31`` and ``+10000-01-01``, DuckDB
  ``0001-12-31 (BC)`` and ``10000-01-01``; a TIMESTAMP WITH TIME ZONE ends in ``+00`` on DuckDB.
* DECIMAL(p,s) with p = s: Spark writes ``0.50``, DuckDB ``.50``.
* Integers, BOOLEAN and strings: the same text (a string's bytes as they are; bytes that are not
  UTF-8, which a Spark string can hold, are decoded with ``surrogateescape`` as ``keys`` does).
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Context, Decimal

from dpsql.sql.types import base_type, decimal_shape

UNTRANSLATED = "spark:"
"""The prefix of a key text that is not Spark's text of any value of the key's type (no Spark
statement dpsql renders writes one): no DuckDB text of a non-string type begins with it."""


def duckdb_key_text(raw, type_name: str) -> str | None:
    """DuckDB's ``CAST(v AS VARCHAR)`` (TimeZone UTC) of the value whose Spark key text
    (``spark_types.key_text_sql``) is ``raw``. Never raises; one-to-one (module docstring).

    >>> duckdb_key_text(b"0x1.0f0cf064dd592p73", "DOUBLE"), duckdb_key_text(b"-0x0.0p0", "FLOAT")
    ('1e+22', '-0.0')
    >>> duckdb_key_text(b"0000-12-31 23:59:59.5", "TIMESTAMP WITH TIME ZONE")
    '0001-12-31 (BC) 23:59:59.5+00'
    >>> duckdb_key_text(b"0.50", "DECIMAL(2,2)"), duckdb_key_text(b"2024-1-31", "DATE")
    ('.50', 'spark:2024-1-31')
    """
    if raw is None:
        return None
    text = bytes(raw).decode("utf-8", "surrogateescape") if isinstance(raw, (bytes, bytearray, memoryview)) \
        else str(raw)
    base = base_type(type_name)
    translate = _TRANSLATIONS.get(base)
    if translate is None:
        return text  # strings (and a type no text form uses): the text is the value
    try:
        translated = translate(text, type_name)
    except Exception:  # totality after the charge: any surprise is untranslated text
        translated = None
    return UNTRANSLATED + text if translated is None else translated


_INTEGER = re.compile(r"-?[1-9][0-9]*|0")


def _integer(text: str, type_name: str) -> str | None:
    return text if text.isascii() and _INTEGER.fullmatch(text) else None


def _boolean(text: str, type_name: str) -> str | None:
    return text if text in ("true", "false") else None


_DECIMAL = re.compile(r"(-?)([1-9][0-9]*|0)(?:\.([0-9]+))?")


def _decimal(text: str, type_name: str) -> str | None:
    """Spark writes a DECIMAL(p,s) plainly with s fraction digits, its zero unsigned; DuckDB
    the same, but without the ``0`` before the point when p = s (``.50``, ``-.50``)."""
    width, scale = decimal_shape(type_name)
    match = _DECIMAL.fullmatch(text) if text.isascii() else None
    if match is None:
        return None
    sign, whole, fraction = match.groups()
    if len(fraction or "") != scale or (sign and set(whole + (fraction or "")) == {"0"}):
        return None  # not s fraction digits (none at all when s = 0), or a signed zero
    if width == scale and whole == "0":
        return f"{sign}.{fraction}"
    return text


def _double(text: str, type_name: str) -> str | None:
    """Java's ``%a`` text of a double (``Double.toHexString``), as the shortest decimal digits
    that read back as it (``repr``: DuckDB's own rule, checked on a large grid of doubles)."""
    if not text.isascii():
        return None
    value = float.fromhex(text)
    if _java_hex(value) != text:
        return None
    return "nan" if math.isnan(value) else repr(value)


def _java_hex(value: float) -> str:
    """Java's ``Double.toHexString`` (what ``format_string('%a', d)`` writes): the significand's
    hexadecimal digits without trailing zeros (at least one), a subnormal as ``0x0.…p-1022``."""
    if math.isnan(value):
        return "NaN"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if math.isinf(value):
        return sign + "Infinity"
    bits = struct.unpack("<Q", struct.pack("<d", abs(value)))[0]
    exponent, significand = bits >> 52, bits & ((1 << 52) - 1)
    digits = f"{significand:013x}".rstrip("0") or "0"
    if exponent == 0:
        return f"{sign}0x0.{digits}p{0 if significand == 0 else -1022}"
    return f"{sign}0x1.{digits}p{exponent - 1023}"


_DATE = re.compile(r"([+-]?)([0-9]{4,})-([0-9]{2})-([0-9]{2})")
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")


def _date(text: str, type_name: str) -> str | None:
    """Spark's proleptic Gregorian date (``[+-]yyyy-MM-dd``, ISO years: 0 is 1 BC, ``+`` past
    9999) as DuckDB writes it (``0001-12-31 (BC)``, ``10000-01-01``)."""
    parsed = _read_date(text)
    return None if parsed is None else _show_date(*parsed)


def _read_date(text: str) -> tuple[int, int, int] | None:
    match = _DATE.fullmatch(text) if text.isascii() else None
    if match is None:
        return None
    sign, digits, month, day = match.groups()
    year = -int(digits) if sign == "-" else int(digits)
    if _spark_year(year) != sign + digits or not 1 <= int(month) <= 12:
        return None
    if not 1 <= int(day) <= _days_in_month(year, int(month)):
        return None
    return year, int(month), int(day)


def _spark_year(year: int) -> str:
    """A year as Spark writes it: four digits at least, ``+`` when it has more, ``-`` below zero."""
    if year < 0:
        return f"-{-year:04d}"
    return f"+{year}" if year > 9999 else f"{year:04d}"


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _show_date(year: int, month: int, day: int) -> str:
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} (BC)"
    return f"{year:04d}-{month:02d}-{day:02d}"


def _timestamp(text: str, type_name: str) -> str | None:
    """Spark's ``<date> HH:mm:ss[.ffffff]`` (fraction without trailing zeros) as DuckDB writes
    it: the date as ``_date`` does, ``+00`` after an instant (DuckDB's zone is UTC)."""
    day, _, clock = text.partition(" ")
    parsed = _read_date(day)
    match = _TIME.fullmatch(clock) if clock.isascii() else None
    if parsed is None or match is None:
        return None
    hour, minute, second, fraction = match.groups()
    if int(hour) > 23 or int(minute) > 59 or int(second) > 59 or (fraction or "1").endswith("0"):
        return None
    zone = "+00" if base_type(type_name) in ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ") else ""
    return f"{_show_date(*parsed)} {clock}{zone}"


_TRANSLATIONS = {
    **{name: _integer for name in ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT")},
    "BOOLEAN": _boolean, "DECIMAL": _decimal, "NUMERIC": _decimal,
    **{name: _double for name in ("DOUBLE", "FLOAT8", "FLOAT", "FLOAT4", "REAL")},
    "DATE": _date, **{name: _timestamp for name in ("TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ")},
}
"""Per DuckDB base type: (Spark text, type name) -> DuckDB text, or ``None`` when the text is not
exactly Spark's text of a value. Strings are absent: their text is their value."""


def value_key(value, type_name: str):
    """A value-form key (or any fetched value) as ``collect()`` gives it, as DuckDB's Python
    client gives the same value: a BINARY's ``bytearray`` (older pyspark, Spark Connect) as
    ``bytes``; a DECIMAL at its type's scale, as DuckDB gives it (``Decimal('0.00')`` for a
    DECIMAL(9,2) zero, whatever exponent a ``BigDecimal`` had; pyspark 4.3 already keeps the
    type's scale). Integers, BOOLEAN, strings and floats come as DuckDB's. Never raises.

    >>> value_key(bytearray(b"\\x00\\xff"), "BLOB"), value_key(Decimal("0E-2"), "DECIMAL(9,2)")
    (b'\\x00\\xff', Decimal('0.00'))
    """
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Decimal) and base_type(type_name) in ("DECIMAL", "NUMERIC") and value.is_finite():
        try:
            scale = decimal_shape(type_name)[1]
            return value.quantize(Decimal(1).scaleb(-scale), context=_EXACT)
        except (ArithmeticError, ValueError):
            return value
    return value


_EXACT = Context(prec=200)
"""Enough digits for any DECIMAL(38, s) quantize to be exact (the default context has 28)."""
