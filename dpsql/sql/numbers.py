"""Exact decimal text of an exact number, computed once for every place that shows or writes one.

Epsilon, delta, bounds and keys are ``Fraction``s (DESIGN.md: exact privacy arithmetic). When
one has a finite decimal expansion (its denominator has no prime factor but 2 and 5), the
policy text, the budget messages and the SQL literals show it digit for digit; no
``Decimal`` context is involved, so no precision setting can round it.

>>> finite_decimal(Fraction(1, 10**7)), finite_decimal(Fraction(-5, 4)), finite_decimal(Fraction(1, 3))
(Decimal('1E-7'), Decimal('-1.25'), None)
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.errors import InvalidParameter


def finite_decimal(value: Fraction | int) -> Decimal | None:
    """``value`` as the exact ``Decimal`` with the fewest digits (trailing zeros of an integer
    go into the exponent, as ``Decimal.normalize`` writes it), or ``None`` when its decimal
    expansion never ends.

    >>> finite_decimal(Fraction(300)), finite_decimal(0), finite_decimal(Fraction(1, 2**100)).as_tuple().exponent
    (Decimal('3E+2'), Decimal('0'), -100)
    """
    value = Fraction(value)
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return None
    # n / (2^a 5^b) * 10^max(a, b) is an integer with no trailing zero unless the value is one.
    places = max(twos, fives)
    digits = value.numerator * 10**places // value.denominator
    while digits and places <= 0 and digits % 10 == 0:
        digits //= 10
        places -= 1
    if places <= 0:
        return Decimal(f"{digits}E+{-places}") if places < 0 else Decimal(digits)
    return Decimal(f"{digits}E-{places}")


def plain_number(value: Any) -> Any:
    """A NumPy scalar as the Python number it stands for: an integer as int, a float by its own
    shortest decimal text (np.float32(0.1) means 0.1, as the float 0.1 does); else unchanged.

    >>> import numpy as np
    >>> plain_number(np.int64(7)), plain_number(np.float32(0.1)), plain_number(np.float64(0.25))
    (7, 0.1, 0.25)
    """
    if not isinstance(value, np.generic):
        return value
    kind = value.dtype.kind
    if kind in "iu":
        return int(value)
    if kind == "f":
        number = float(value)
        return float(str(value)) if math.isfinite(number) else number
    if kind == "b":
        return bool(value)
    return value


def exact_parameter(value: Any, name: str) -> Fraction:
    """A caller's privacy parameter as an exact Fraction: finite numbers only.

    Floats are read by their shortest decimal form, so 0.1 means exactly 1/10.

    >>> exact_parameter(0.1, "epsilon")
    Fraction(1, 10)
    >>> exact_parameter(float("nan"), "epsilon")
    Traceback (most recent call last):
    dpsql.errors.InvalidParameter: epsilon must be a finite number, got nan. Hint: pass a number such as 0.5.
    """
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal, str)):
        raise InvalidParameter(f"{name} must be a number, got {type(value).__name__}",
                               hint="pass a number such as 0.5")
    try:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError
            return Fraction(repr(value))
        result = Fraction(value)
    except (ValueError, ArithmeticError):
        raise InvalidParameter(f"{name} must be a finite number, got {value!r}",
                               hint="pass a number such as 0.5") from None
    return result
