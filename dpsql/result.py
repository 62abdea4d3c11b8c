"""What the analyst gets back: released values, their accuracy, and what they cost.

A ``DPResult`` holds only released (noisy) values and public keys — nothing exact — and
offers what a DuckDB user expects: ``.df()``, ``.fetchall()``, ``.fetchone()``, ``.columns``.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Callable

import pandas as pd

from .accounting import Spend, none_below_zero, show
from .errors import InvalidParameter


@dataclass(frozen=True, eq=False, repr=False)
class QueryCost(Spend):
    """What one query was charged: (epsilon, delta), its rho, and how it was accounted.

    >>> str(QueryCost(Fraction(1, 10), rho=Fraction(1, 200), accounting="zcdp"))
    'epsilon 0.1, delta 0 (rho 0.005 under zero-concentrated DP)'
    >>> cost = QueryCost.free(repeat=True)
    >>> cost == Spend.ZERO, cost.repeat, str(cost)
    (True, True, 'free: a repeat of an earlier query, answered with its stored release')
    """

    accounting: str = "basic"
    """The accountant that charged it: 'basic', 'advanced' or 'zcdp'."""
    repeat: bool = False
    """True when nothing was charged because an identical query's answer was returned."""
    public: bool = False
    """True when the query read public tables only."""

    @classmethod
    def free(cls, *, repeat: bool = False, public: bool = False) -> QueryCost:
        """Nothing charged: a repeat, or a query over public tables."""
        return cls(Fraction(0), Fraction(0), repeat=repeat, public=public)

    def __str__(self) -> str:
        if self.repeat:
            return "free: a repeat of an earlier query, answered with its stored release"
        if self.public:
            return "free: public tables only"
        text = f"epsilon {show(self.epsilon)}, delta {show(self.delta)}"
        if self.accounting == "zcdp" and self.rho is not None:
            text += f" (rho {show(self.rho)} under zero-concentrated DP)"
        elif self.accounting == "advanced":
            text += " (under advanced composition)"
        return text

    def __repr__(self) -> str:
        return f"QueryCost({self})"


@dataclass(frozen=True)
class Budget:
    """A privacy budget as its accountant reads it: total, spent, and what remains.

    Under BASIC, remaining = total - spent. Under ADVANCED and ZCDP composition is sublinear:
    ``spent`` is the (epsilon, delta) guarantee of everything released so far and
    ``remaining.epsilon`` the largest epsilon one more single-measure query may spend; rho
    (ZCDP) is exact and adds up. ``analyst`` is the connected analyst's own budget, when the
    policy gives analysts one.
    """

    total: Spend
    """What the policy allows in all (with its rho under ZCDP)."""
    spent: Spend
    """What has been charged so far (by every analyst, for the database-wide budget)."""
    remaining: Spend | None = None
    """What one more query may spend; defaults to total - spent."""
    accounting: str = "basic"
    """The policy's accountant: 'basic', 'advanced' or 'zcdp'."""
    analyst: Budget | None = None
    """The connected analyst's own budget (``BUDGET PER ANALYST``), if any."""
    owner: str | None = field(default=None, compare=False)
    """``None`` for the database-wide budget, else the analyst's name."""

    def __post_init__(self) -> None:
        # Never below zero: spent exceeds the total only after the curator lowered it, and
        # then nothing remains (a negative remainder would read as a debt to pay back).
        remaining = self.total - self.spent if self.remaining is None else self.remaining
        object.__setattr__(self, "remaining", none_below_zero(remaining))

    def __str__(self) -> str:
        text = (f"epsilon {_show(self.spent.epsilon)} of {_show(self.total.epsilon)} spent, "
                f"{_show(self.remaining.epsilon)} remaining; delta {_show(self.spent.delta)} of "
                f"{_show(self.total.delta)} spent")
        if self.accounting == "zcdp" and self.total.rho is not None:
            text += (f"; rho {_show(self.spent.rho or 0)} of {_show(self.total.rho)} spent, "
                     f"{_show(self.remaining.rho or 0)} remaining")
        if self.accounting != "basic":
            text += f" ({self.accounting.upper()} accounting)"
        if self.owner is not None:
            text = f"analyst {self.owner}: {text}"
        if self.analyst is not None:
            text += f"\n{self.analyst}"
        return text


def _show(value: Fraction) -> str:
    return f"{float(value):.6g}"


class DPResult:
    """The released answer to one query.

    >>> r = DPResult(["store", "n"], [("a", 3), ("b", 5)], Spend(Fraction(1, 2)))
    >>> r.fetchall()
    [('a', 3), ('b', 5)]
    >>> r.df()["n"].tolist()
    [3, 5]
    """

    def __init__(
        self,
        columns: list[str],
        rows: list[tuple],
        cost: Spend,
        *,
        widths: Callable[[float], dict[str, list[float]]] | None = None,
        exact: bool = False,
        repeat: bool = False,
    ):
        self.columns = list(columns)
        self._rows = [tuple(r) for r in rows]
        self.cost = cost
        """What this query was charged: (epsilon, delta) and rho; a ``QueryCost`` from a
        connection, which also says how it was accounted and whether it was a free repeat."""
        self.exact = exact
        """True for queries over public tables only, answered exactly at no cost."""
        self.repeat = repeat or bool(getattr(cost, "repeat", False))
        """True when this is a stored earlier answer returned for free."""
        self._widths = widths

    def fetchall(self) -> list[tuple]:
        """All released rows, as a list of tuples."""
        return list(self._rows)

    def fetchone(self) -> tuple | None:
        """The first released row, or None."""
        return self._rows[0] if self._rows else None

    def df(self) -> pd.DataFrame:
        """The released rows as a pandas DataFrame."""
        return pd.DataFrame.from_records(self._rows, columns=self.columns)

    def accuracy(self, alpha: float = 0.05) -> dict[str, float]:
        """Per noisy column, the half-width of the (1 - alpha) interval of its noise.

        Where a column's half-width differs by row (AVG), the largest is given; use
        ``accuracy_df`` for each cell. Bias from clamping and contribution bounds is not
        included: bounds are the curator's choice and bias the answer toward them.
        """
        return {name: max(cells) if cells else 0.0 for name, cells in self._cell_widths(alpha).items()}

    def accuracy_df(self, alpha: float = 0.05) -> pd.DataFrame:
        """Per released cell, the half-width of its (1 - alpha) noise interval (NaN for keys)."""
        widths = self._cell_widths(alpha)
        frame = self.df()
        for column in frame.columns:
            frame[column] = widths.get(column, [float("nan")] * len(frame))
        return frame

    def _cell_widths(self, alpha: float) -> dict[str, list[float]]:
        if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise InvalidParameter(f"alpha must be between 0 and 1, got {alpha!r}")
        if self._widths is None:
            return {}
        return self._widths(float(alpha))

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        body = self.df().to_string(index=False) if self._rows else "(no rows)"
        kind = "exact, free" if self.exact else (
            "repeat, free" if self.repeat else
            f"epsilon {_show(self.cost.epsilon)}, delta {_show(self.cost.delta)}"
        )
        count = len(self._rows)
        return f"{body}\n({count} row{'s' if count != 1 else ''}; {kind})"


# --- stored answers: what a free repeat returns ------------------------------------------------

ANSWER_FORMAT = 1
"""Version of the JSON a released answer is kept in."""


def encode_answer(columns: list[str], rows: list[tuple], noisy: dict[str, list[int]]) -> str:
    """JSON text that gives back exactly these rows (types included) and noisy measures.

    Values JSON cannot hold exactly are tagged (``{"$date": "2024-01-31"}``). If a value has
    no exact form, the answer is kept for the record but marked not to be replayed, so a
    repeat of the query is charged again rather than answered approximately.

    >>> text = encode_answer(["d", "n"], [(datetime.date(2024, 1, 31), 0.1)], {"m0": [3]})
    >>> decode_answer(text)
    (['d', 'n'], [(datetime.date(2024, 1, 31), 0.1)], {'m0': (3,)})
    """
    record = {"format": ANSWER_FORMAT, "columns": list(columns),
              "noisy": {name: [int(v) for v in values] for name, values in noisy.items()}}
    try:  # fast: JSON writes plain values itself and asks _encode only for the others
        return json.dumps({**record, "rows": rows}, default=_encode, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        pass
    try:  # a non-finite float: tagged by _encode, which the fast path cannot ask for it
        record["rows"] = [[_encode(value) for value in row] for row in rows]
        return json.dumps(record, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        record["rows"] = [[str(value) for value in row] for row in rows]
        record["replay"] = False
        return json.dumps(record, separators=(",", ":"))


def decode_answer(text: str) -> tuple[list[str], list[tuple], dict[str, tuple[int, ...]]] | None:
    """Columns, rows and noisy measures of a stored answer, or ``None`` if it cannot be replayed
    exactly (marked so, another format, or not dpsql's JSON)."""
    try:
        record = json.loads(text)
        if (not isinstance(record, dict) or record.get("format") != ANSWER_FORMAT
                or record.get("replay", True) is not True):
            return None
        rows = [tuple(_decode(value) for value in row) for row in record["rows"]]
        noisy = {name: tuple(int(v) for v in values) for name, values in record["noisy"].items()}
        return [str(c) for c in record["columns"]], rows, noisy
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError):
        return None


_TAGS = {
    "$float": (float, repr),
    "$decimal": (Decimal, str),
    "$datetime": (datetime.datetime.fromisoformat, datetime.datetime.isoformat),
    "$date": (datetime.date.fromisoformat, datetime.date.isoformat),
    "$time": (datetime.time.fromisoformat, datetime.time.isoformat),
    "$timedelta": (lambda v: datetime.timedelta(*v), lambda d: [d.days, d.seconds, d.microseconds]),
    "$uuid": (uuid.UUID, str),
    "$bytes": (bytes.fromhex, bytes.hex),
    "$fraction": (Fraction, str),
}
_TYPES = ((float, "$float"), (Decimal, "$decimal"), (datetime.datetime, "$datetime"),
          (datetime.date, "$date"), (datetime.time, "$time"), (datetime.timedelta, "$timedelta"),
          (uuid.UUID, "$uuid"), (bytes, "$bytes"), (Fraction, "$fraction"))


_PLAIN = frozenset({type(None), bool, int, str})


def _encode(value):
    kind = type(value)
    if kind in _PLAIN:  # the common case first: a million-row answer calls this millions of times
        return value
    if kind is float and math.isfinite(value):
        return value
    if hasattr(value, "item") and kind.__module__ == "numpy":
        value = value.item()  # numpy scalar: the equal Python value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value  # JSON keeps a float's shortest repr, which reads back exactly
    for kind, tag in _TYPES:  # datetime before date: it is a subclass
        if isinstance(value, kind):
            return {tag: _TAGS[tag][1](value)}
    raise TypeError(f"cannot store a {type(value).__name__} exactly")


def _decode(value):
    if isinstance(value, dict):
        (tag, text), = value.items()
        return _TAGS[tag][0](text)
    if isinstance(value, list):
        raise TypeError("a released value is never a list")
    return value
