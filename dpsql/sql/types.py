"""DuckDB column types as the policy and the clamp need them: families, ranges, exact grids.

Pure facts about types (no data): which family a type belongs to (what compares with it
without a lossy or cross-family coercion), which numbers it can hold, and how a policy bound
is rounded inward onto the values it can hold, so a clamp literal never needs a wider type.
"""

from __future__ import annotations

import math
from fractions import Fraction

INTEGER_RANGES = {
    "TINYINT": (-2**7, 2**7 - 1), "SMALLINT": (-2**15, 2**15 - 1), "INTEGER": (-2**31, 2**31 - 1),
    "BIGINT": (-2**63, 2**63 - 1), "HUGEINT": (-2**127, 2**127 - 1),
    "UTINYINT": (0, 2**8 - 1), "USMALLINT": (0, 2**16 - 1), "UINTEGER": (0, 2**32 - 1),
    "UBIGINT": (0, 2**64 - 1), "UHUGEINT": (0, 2**128 - 1),
}
"""The values of each DuckDB integer type."""

_FLOAT_MAX = {"FLOAT": Fraction(3.4028234663852886e38), "REAL": Fraction(3.4028234663852886e38),
              "DOUBLE": Fraction(1.7976931348623157e308)}

_FAMILIES = {
    **{name: "integer" for name in INTEGER_RANGES},
    "DECIMAL": "decimal", "NUMERIC": "decimal", "FLOAT": "float", "REAL": "float", "DOUBLE": "float",
    "VARCHAR": "string", "ENUM": "string", "DATE": "date", "TIMESTAMP": "timestamp",
    "TIMESTAMP_S": "timestamp", "TIMESTAMP_MS": "timestamp", "TIMESTAMP_NS": "timestamp",
    "TIMESTAMP WITH TIME ZONE": "timestamp with time zone",
    "TIME": "time",
    "TIME WITH TIME ZONE": "time with time zone", "INTERVAL": "interval", "BOOLEAN": "boolean",
    "UUID": "uuid", "BLOB": "blob",
}


def base_type(type_name: str) -> str:
    """A DuckDB type name without its parameters.

    >>> base_type("DECIMAL(18,3)"), base_type("ENUM('a', 'b')"), base_type("DECIMAL(9,2)[]")
    ('DECIMAL', 'ENUM', 'DECIMAL(9,2)[]')

    A LIST or ARRAY keeps its whole name: it is no scalar type, whatever its elements' (a BOUNDS
    rule on a ``DECIMAL(9,2)[]`` column took it for a DECIMAL and failed to parse its scale).
    """
    name = type_name.strip()
    if name.endswith("]"):
        return name.upper()
    return name.split("(")[0].strip().upper()


def family(type_name: str) -> str:
    """The family of a type: members compare without a lossy or cross-family coercion.

    >>> family("UBIGINT"), family("DECIMAL(9,2)"), family("ENUM('a')"), family("TIMESTAMP_NS")
    ('integer', 'decimal', 'string', 'timestamp')
    """
    return _FAMILIES.get(base_type(type_name), base_type(type_name).lower())


def is_numeric_type(type_name: str) -> bool:
    """A number type as the database's catalog names it: an integer, DECIMAL or floating point
    type. BOOLEAN is not one: a policy cannot give it BOUNDS, and its keys are written as text.

    >>> is_numeric_type("DECIMAL(10,2)"), is_numeric_type("UBIGINT"), is_numeric_type("BOOLEAN")
    (True, True, False)
    """
    return family(type_name) in ("integer", "decimal", "float")


_READS_AS_INTEGER = frozenset({*INTEGER_RANGES, "INT", "BOOLEAN"})
_READS_AS_FRACTIONAL = ("FLOAT", "REAL", "DOUBLE", "DECIMAL", "NUMERIC")


def reads_as_integer(type_name: str) -> bool:
    """Values the range analysis reads as integers: the integer types, also as sqlglot writes a
    cast (``INT``), and BOOLEAN (false is 0, true is 1).

    >>> reads_as_integer("BIGINT"), reads_as_integer("INT"), reads_as_integer("BOOLEAN"), reads_as_integer("DOUBLE")
    (True, True, True, False)
    """
    return type_name.upper() in _READS_AS_INTEGER


def reads_as_number(type_name: str) -> bool:
    """Values the range analysis reads as numbers: ``reads_as_integer`` types, and every
    floating point and DECIMAL spelling (``FLOAT4``, ``DECIMAL(9,2)``). Wider than
    ``is_numeric_type``, which is about the catalog's types and leaves BOOLEAN out.

    >>> reads_as_number("FLOAT4"), reads_as_number("BOOLEAN"), reads_as_number("VARCHAR")
    (True, True, False)
    """
    return reads_as_integer(type_name) or type_name.upper().startswith(_READS_AS_FRACTIONAL)


def decimal_shape(type_name: str) -> tuple[int, int]:
    """(width, scale) of a DECIMAL type (DuckDB's default DECIMAL is (18, 3)).

    >>> decimal_shape("DECIMAL(10,2)"), decimal_shape("DECIMAL")
    ((10, 2), (18, 3))
    """
    inside = type_name.partition("(")[2].rstrip(") ")
    if not inside:
        return 18, 3
    width, _, scale = inside.partition(",")
    return int(width), int(scale or 0)


def value_range(type_name: str) -> tuple[Fraction, Fraction] | None:
    """The smallest and largest finite number a numeric type holds (``None``: not numeric).

    >>> value_range("TINYINT"), value_range("DECIMAL(4,2)")
    ((Fraction(-128, 1), Fraction(127, 1)), (Fraction(-9999, 100), Fraction(9999, 100)))
    """
    base = base_type(type_name)
    if base in INTEGER_RANGES:
        low, high = INTEGER_RANGES[base]
        return Fraction(low), Fraction(high)
    if base in ("DECIMAL", "NUMERIC"):
        width, scale = decimal_shape(type_name)
        largest = Fraction(10**width - 1, 10**scale)
        return -largest, largest
    if base in _FLOAT_MAX:
        return -_FLOAT_MAX[base], _FLOAT_MAX[base]
    return None


def step(type_name: str) -> Fraction | None:
    """The spacing of an exact numeric type's values: 1 for integers, 10**-scale for DECIMAL;
    ``None`` for floating point (and non-numeric types).

    >>> step("INTEGER"), step("DECIMAL(9,2)"), step("DOUBLE")
    (Fraction(1, 1), Fraction(1, 100), None)
    """
    base = base_type(type_name)
    if base in INTEGER_RANGES:
        return Fraction(1)
    if base in ("DECIMAL", "NUMERIC"):
        return Fraction(1, 10 ** decimal_shape(type_name)[1])
    return None


def inward(lower: Fraction, upper: Fraction, type_name: str) -> tuple[Fraction, Fraction]:
    """Bounds rounded inward onto the values an exact numeric type holds (floating point: as
    they are). Clamping into the rounded bounds keeps every value inside the declared ones, and
    the clamp literals have the column's own scale, so comparing them with the column needs no
    wider type (a BIGINT compared with a 37-decimal literal is cast to DECIMAL(38,37), which
    overflows on one large value).

    >>> inward(Fraction(1, 2), Fraction(21, 2), "INTEGER")
    (Fraction(1, 1), Fraction(10, 1))
    >>> inward(Fraction(1, 1000), Fraction(5), "DECIMAL(9,2)")
    (Fraction(1, 100), Fraction(5, 1))
    """
    spacing = step(type_name)
    if spacing is None:
        return lower, upper
    return math.ceil(lower / spacing) * spacing, math.floor(upper / spacing) * spacing


def enum_values(type_name: str) -> tuple[str, ...] | None:
    """The values of an ENUM type, in its own order (``None``: not an ENUM). Parsed from the
    type's name as DuckDB writes it (quotes doubled inside values), never from data.

    >>> enum_values("ENUM('sad', 'o''k', 'a,b')"), enum_values("VARCHAR"), enum_values("ENUM('x')[]")
    (('sad', "o'k", 'a,b'), None, None)
    """
    if base_type(type_name) != "ENUM" or not type_name.strip().endswith(")"):  # ENUM(...)[] is a list
        return None
    from sqlglot import exp  # local: this module is otherwise free of SQL trees

    from dpsql.sql.dialect import DIALECT

    parsed = exp.DataType.build(type_name, dialect=DIALECT)
    return tuple(value.this for value in parsed.expressions)


def implied_domain(type_name: str) -> tuple[str, ...] | None:
    """The public key domain a column's type implies, as literals its type reads: an ENUM's
    values and BOOLEAN's false and true are schema, not data, so a GROUP BY on such a column
    needs neither a KEYS line nor partition selection (``None``: the type implies none).

    >>> implied_domain("BOOLEAN"), implied_domain("ENUM('a', 'b')"), implied_domain("INTEGER")
    (('false', 'true'), ('a', 'b'), None)
    """
    if base_type(type_name) == "BOOLEAN":
        return ("false", "true")
    return enum_values(type_name)


def _split_top_level(text: str) -> list[str]:
    """``text`` split at commas outside quotes and parentheses, each part stripped."""
    parts, depth, quote, start = [], 0, None, 0
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None  # a doubled quote closes and reopens: the same for splitting
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _inside(type_name: str) -> str:
    return type_name[type_name.index("(") + 1:type_name.rindex(")")]


def struct_fields(type_name: str | None) -> dict[str, str] | None:
    """Field name -> DuckDB type of a STRUCT type, as DuckDB writes them (``None``: not a STRUCT).

    >>> struct_fields('STRUCT(a INTEGER, "B c" VARCHAR, i STRUCT(k INTEGER[]))')
    {'a': 'INTEGER', 'B c': 'VARCHAR', 'i': 'STRUCT(k INTEGER[])'}
    >>> struct_fields("INTEGER[]") is None
    True
    """
    if not type_name or not type_name.upper().startswith("STRUCT(") or not type_name.endswith(")"):
        return None
    fields = {}
    for part in _split_top_level(_inside(type_name)):
        if part.startswith('"'):
            end = 1
            while True:
                end = part.index('"', end)
                if part[end + 1:end + 2] == '"':
                    end += 2
                    continue
                break
            name, rest = part[1:end].replace('""', '"'), part[end + 1:]
        else:
            name, _, rest = part.partition(" ")
        fields[name] = rest.strip()
    return fields


def list_element(type_name: str | None) -> str | None:
    """The element type of a LIST (``T[]``) or fixed-size ARRAY (``T[n]``) type, else ``None``.

    >>> list_element("INTEGER[]"), list_element("STRUCT(a VARCHAR[])[3]"), list_element("VARCHAR")
    ('INTEGER', 'STRUCT(a VARCHAR[])', None)
    """
    if not type_name or not type_name.endswith("]"):
        return None
    return type_name[:type_name.rindex("[")]


def is_list(type_name: str | None) -> bool:
    """A variable-length LIST (``T[]``), whose length is data (a fixed ``T[n]`` is schema)."""
    return type_name is not None and type_name.endswith("[]")


def map_types(type_name: str | None) -> tuple[str, str] | None:
    """(key type, value type) of a MAP type, else ``None``.

    >>> map_types("MAP(VARCHAR, STRUCT(a INTEGER, b DOUBLE))")
    ('VARCHAR', 'STRUCT(a INTEGER, b DOUBLE)')
    """
    if not type_name or not type_name.upper().startswith("MAP(") or not type_name.endswith(")"):
        return None
    key, value = _split_top_level(_inside(type_name))
    return key, value


def holds_lists(type_name: str) -> bool:
    """A LIST or MAP, or a STRUCT or ARRAY holding one: a value whose size is data.

    >>> holds_lists("STRUCT(a INTEGER, tags VARCHAR[])"), holds_lists("INTEGER[3]")
    (True, False)
    """
    if is_list(type_name) or map_types(type_name) is not None:
        return True
    fields = struct_fields(type_name)
    if fields is not None:
        return any(holds_lists(t) for t in fields.values())
    element = list_element(type_name)
    return element is not None and holds_lists(element)


EXACT_EQUALITY = frozenset((
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
    "UHUGEINT", "DECIMAL", "BOOLEAN", "VARCHAR", "BLOB", "UUID", "DATE", "TIME", "TIME_NS", "TIMESTAMP",
    "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ_NS", "ENUM", "BIT",
    "BIGNUM", "VARINT"))
"""Base types whose DuckDB equality is the identity of their canonical text: two values are equal
exactly when the texts an analyst reads back are the same bytes (a VARCHAR as the copy holds it,
with the binary collation; a TIMESTAMP WITH TIME ZONE is an instant, its text written in the
session's one time zone; a DECIMAL's scale is its type's). Not here, and why: FLOAT and DOUBLE
(-0.0 = 0.0 and -nan = nan, told apart by their text and by 1/x), INTERVAL ('1 month' = '30 days'),
TIME WITH TIME ZONE, JSON, and nested values (they hold floats, intervals, strings)."""


def equality_is_identity(type_name: str) -> bool:
    """True when DuckDB's ``=`` on ``type_name`` is the identity of canonical texts (``EXACT_EQUALITY``).

    >>> [equality_is_identity(t) for t in ("BIGINT", "DECIMAL(9,2)", "DOUBLE", "INTERVAL", "INTEGER[]")]
    [True, True, False, False, False]
    >>> equality_is_identity("ENUM('a')[]"), equality_is_identity("DECIMAL(9,2)[3]")
    (False, False)
    """
    if type_name.strip().endswith("]"):  # a LIST or ARRAY, whatever its element's base type
        return False
    return base_type(type_name).upper() in EXACT_EQUALITY
