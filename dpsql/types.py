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
    "TIMESTAMP WITH TIME ZONE": "timestamp with time zone", "TIME": "time",
    "TIME WITH TIME ZONE": "time with time zone", "INTERVAL": "interval", "BOOLEAN": "boolean",
    "UUID": "uuid", "BLOB": "blob",
}


def base_type(type_name: str) -> str:
    """A DuckDB type name without its parameters.

    >>> base_type("DECIMAL(18,3)"), base_type("ENUM('a', 'b')")
    ('DECIMAL', 'ENUM')
    """
    return type_name.split("(")[0].strip().upper()


def family(type_name: str) -> str:
    """The family of a type: members compare without a lossy or cross-family coercion.

    >>> family("UBIGINT"), family("DECIMAL(9,2)"), family("ENUM('a')"), family("TIMESTAMP_NS")
    ('integer', 'decimal', 'string', 'timestamp')
    """
    return _FAMILIES.get(base_type(type_name), base_type(type_name).lower())


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
