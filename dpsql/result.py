"""What the analyst gets back: released values, their accuracy, and what they cost.

A ``DPResult`` holds only released (noisy) values and public keys — nothing exact — and
offers what a DuckDB user expects: ``.df()``, ``.fetchall()``, ``.fetchone()``, ``.columns``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import pandas as pd

from .errors import InvalidParameter
from .ledger import Spend


@dataclass(frozen=True)
class Budget:
    """The privacy budget of a connection: total, spent and what remains."""

    total: Spend
    """What the policy allows in all."""
    spent: Spend
    """What has been charged so far (by every analyst)."""

    @property
    def remaining(self) -> Spend:
        """What is left to spend."""
        return self.total - self.spent

    def __str__(self) -> str:
        return (
            f"epsilon {_show(self.spent.epsilon)} of {_show(self.total.epsilon)} spent, "
            f"{_show(self.remaining.epsilon)} remaining; delta {_show(self.spent.delta)} of "
            f"{_show(self.total.delta)} spent"
        )


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
        """The (epsilon, delta) this query was charged."""
        self.exact = exact
        """True for queries over public tables only, answered exactly at no cost."""
        self.repeat = repeat
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
        return f"{body}\n({len(self._rows)} rows; {kind})"
