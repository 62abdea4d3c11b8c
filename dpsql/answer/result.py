"""What the analyst gets back: released values, their accuracy, and what they cost.

A ``DPResult`` holds only released (noisy) values and public keys — nothing exact — and
offers what a DuckDB user expects: ``.df()``, ``.fetchall()``, ``.fetchone()``, ``.columns``.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Callable, Sequence

import pandas as pd

from dpsql.answer.table import answer_from, asymmetric, bias_lines, cell_texts, interval_ends, noisy_parts, render_table
from dpsql.budget.accounting import Spend, none_below_zero, show
from dpsql.errors import InvalidParameter, MissingDependency


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
    synthetic: bool = False
    """True when the query read the analyst's own synthetic tables only (``dpsql.query.synthetic_answering``)."""

    @classmethod
    def free(cls, *, repeat: bool = False, public: bool = False, synthetic: bool = False) -> QueryCost:
        """Nothing charged: a repeat, a query over public tables, or one over synthetic tables."""
        return cls(Fraction(0), Fraction(0), repeat=repeat, public=public, synthetic=synthetic)

    def __str__(self) -> str:
        if self.repeat:
            return "free: a repeat of an earlier query, answered with its stored release"
        if self.public:
            return "free: public tables only"
        if self.synthetic:
            return "free: your synthetic tables only"
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
        remaining = self.remaining
        assert remaining is not None  # filled in by __post_init__
        text = (f"epsilon {_show(self.spent.epsilon)} of {_show(self.total.epsilon)} spent, "
                f"{_show(remaining.epsilon)} remaining; delta {_show(self.spent.delta)} of "
                f"{_show(self.total.delta)} spent")
        if self.accounting == "zcdp" and self.total.rho is not None:
            text += (f"; rho {_show(self.spent.rho or 0)} of {_show(self.total.rho)} spent, "
                     f"{_show(remaining.rho or 0)} remaining")
        if self.accounting != "basic":
            text += f" ({self.accounting.upper()} accounting)"
        if self.owner is not None:
            text = f"analyst {self.owner}: {text}"
        if self.analyst is not None:
            text += f"\n{self.analyst}"
        return text


def _show(value: Fraction | int) -> str:
    return f"{float(value):.6g}"


def _largest(halves: list[float]) -> float:
    """The largest half-width of a column; NaN when any cell has none, and for no rows (no
    cell, so no interval: as ``accuracy_df``, which has no row to hold one)."""
    if any(math.isnan(h) for h in halves):
        return math.nan
    return max(halves, default=math.nan)


def _symmetric(value, half: float) -> tuple[float, float, float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan, math.nan, half
    return number - half, number + half, half


SHOWN_ROWS = 40
"""How many rows ``show()``, ``repr`` and notebooks draw (like DuckDB's ``show()``)."""


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
        intervals: Callable[[float], dict[str, list[tuple[float, float, float]]]] | None = None,
        types: list[str] | Callable[[], list[str]] | None = None,
        notes: Sequence[str] = (),
        budget: Budget | None = None,
        converter: Callable | None = None,
        outside_domain: "OutsideDomain | None" = None,
        limits=None,
        bounding=None,
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
        self._intervals = intervals
        self._types = types
        self._cursor = 0
        self.notes = list(notes)
        """What the analyst should know about this answer beyond its values: why partition
        selection left it with few or no rows, and what would lower the bar (``dpsql.answer.notes``)."""
        self.budget = budget
        """The budget just after this answer was charged, when the connection knows it."""
        self._converter = converter
        self.outside_domain = outside_domain
        """Rows whose GROUP BY keys are outside their public KEYS domains, released as one more
        noisy cell (``OutsideDomain``); ``None`` when the query groups by no KEYS column. The
        footers show it only where ``outside_domain.shown``."""
        self.limits = limits
        """The contribution limits the answer applied (``dpsql.query.limits.Limits``; ``str()`` reads
        "at most 250 rows and 10 groups per tailnum; dep_delay clamped to [-60, 300]"); ``None``
        for public queries. Public facts: they lower answers, and that bias is not in the ±."""
        self.bounding = bounding
        """The bias report (``dpsql.query.bias.Bounding``) when asked for (``report_bias``), else None."""


    def accuracy(self, alpha: float = 0.05) -> dict[str, float]:
        """Per noisy column (every column but keys and constants), the half-width of its
        (1 - alpha) interval, in the column's own units.

        COUNT, SUM, AVG, VARIANCE, STDDEV: the noise's interval. Quantiles (MEDIAN,
        QUANTILE_CONT, MIN, MAX): a value interval drawn with the answer at 95%, so for
        alpha >= 0.05 the 95% figure is given (conservative) and for alpha < 0.05 NaN.
        Post-processed columns (``ROUND(AVG(x), 1)``, ``SUM(x) / COUNT(*)``): derived from
        their aggregates' intervals by interval arithmetic (``dpsql.query.accuracy``); NaN, meaning
        "derived, no ±", where that is not sound (CASE, a divisor interval holding 0, ...).
        Where a column's half-width differs by row, the largest is given (NaN if any row has
        none, or if there is no row); use ``accuracy_df`` for each cell and ``intervals`` for asymmetric intervals.
        Bias from clamping and contribution bounds is not included: bounds are the curator's
        choice and bias the answer toward them.
        """
        return {name: _largest([half for _, _, half in cells]) for name, cells in self._cells(alpha).items()}

    def accuracy_df(self, alpha: float = 0.05) -> pd.DataFrame:
        """Per released cell, the half-width of its (1 - alpha) interval: NaN for keys and for
        cells with no ± ("derived, no ±"); see ``accuracy``."""
        cells = self._cells(alpha)
        frame = self._records_frame()
        for position, column in enumerate(self.columns):  # by position: names may repeat
            column_cells = cells.get(column)
            frame.isetitem(position, [math.nan] * len(frame) if column_cells is None
                           else [half for _, _, half in column_cells])
        return frame

    def intervals(self, alpha: float = 0.05) -> pd.DataFrame:
        """Per released row, the (1 - alpha) interval of each noisy column as ``<name>_low`` and
        ``<name>_high`` beside its value (keys as released). Quantile intervals are asymmetric;
        the others are value ± half-width, rounded outward. NaN where there is no ±."""
        cells = self._cells(alpha)
        frame = self._records_frame()
        parts = {}
        for position, column in enumerate(self.columns):
            parts[column] = frame.iloc[:, position].tolist()
            column_cells = cells.get(column)
            if column_cells is not None:
                parts[f"{column}_low"] = [low for low, _, _ in column_cells]
                parts[f"{column}_high"] = [high for _, high, _ in column_cells]
        return pd.DataFrame(parts, columns=list(parts))

    def cells(self, alpha: float = 0.05) -> dict[str, list[tuple[float, float, float]]]:
        """Per noisy column, per row: (low, high, half-width) of its (1 - alpha) interval, NaN
        where there is none: what ``intervals`` and ``accuracy_df`` show, without a DataFrame
        (the server sends them with every answer)."""
        return self._cells(alpha)

    def _cells(self, alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        """Per noisy column, per row: (low, high, half-width)."""
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise InvalidParameter(f"alpha must be between 0 and 1, got {alpha!r}")
        if self._intervals is not None:
            return self._intervals(float(alpha))
        if self._widths is None:
            return {}
        values = self._records_frame()
        cells = {}
        for name, halves in self._widths(float(alpha)).items():
            column = values[name].tolist() if name in values else [math.nan] * len(halves)
            cells[name] = [_symmetric(value, half) for value, half in zip(column, halves)]
        return cells

    # --- as DuckDB's results: a cursor, conversions, show(), notebooks ------------------------
    # The fetch* methods move a cursor as a DuckDB relation's do (duckdb.sql(...) in DuckDB
    # 1.x): fetchone and fetchmany step through the rows; fetchall, fetchdf and fetchnumpy
    # return the rows not yet fetched and rewind, so the next fetch starts again from the first
    # row (a relation runs its query again once a fetch has completed it). The conversions of
    # the whole answer (df, arrow, to_arrow_table, pl, show, iteration, len) ignore the cursor.
    # Conversions go through DuckDB itself (the engine's ``post_processing.convert``, else
    # ``dpsql.backends.duckdb.released.convert_released``), so dtypes are the ones a DuckDB user gets.

    @property
    def types(self) -> list[str]:
        """DuckDB type name of each column: keys as the database types them, aggregates as
        released (BIGINT counts, HUGEINT integer sums, DOUBLE averages)."""
        if callable(self._types):
            try:
                self._types = list(self._types())
            except Exception:  # the connection was closed since: read the types off the values
                self._types = None
        if self._types is None or len(self._types) != len(self.columns):
            self._types = [_value_type([row[i] for row in self._rows]) for i in range(len(self.columns))]
        return list(self._types)

    @property
    def description(self) -> list[tuple]:
        """The DB-API description, as DuckDB's: (name, type, None, None, None, None, None)."""
        return [(name, type_name, None, None, None, None, None)
                for name, type_name in zip(self.columns, self.types)]

    def fetchone(self) -> tuple | None:
        """The next row not yet fetched, or None once every row has been."""
        if self._cursor >= len(self._rows):
            return None
        self._cursor += 1
        return self._rows[self._cursor - 1]

    def fetchmany(self, size: int = 1) -> list[tuple]:
        """The next ``size`` rows not yet fetched (fewer at the end, [] after it)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidParameter(f"fetchmany needs a whole number of rows >= 0, got {size!r}",
                                   hint="write fetchmany(10)")
        rows = self._rows[self._cursor:self._cursor + size]
        self._cursor += len(rows)
        return rows

    def fetchall(self) -> list[tuple]:
        """Every row not yet fetched (all of them, unless fetchone/fetchmany ran first); then
        the cursor rewinds, as a DuckDB relation's does."""
        start, self._cursor = self._cursor, 0
        return self._rows[start:]

    def fetchdf(self, *, accuracy: bool = False, alpha: float = 0.05) -> pd.DataFrame:
        """The rows not yet fetched as a pandas DataFrame; then the cursor rewinds (fetchall)."""
        start, self._cursor = self._cursor, 0
        return self._converted("df", accuracy, alpha, start)

    def fetchnumpy(self, *, accuracy: bool = False, alpha: float = 0.05) -> dict:
        """The rows not yet fetched as {column: numpy array} (masked where NULL), as DuckDB's;
        then the cursor rewinds (fetchall)."""
        start, self._cursor = self._cursor, 0
        return self._converted("numpy", accuracy, alpha, start)

    def df(self, *, accuracy: bool = False, alpha: float = 0.05) -> pd.DataFrame:
        """The answer as a pandas DataFrame. ``accuracy=True`` adds ``<column>_halfwidth95``
        after each noisy column: the half-width of its (1 - alpha) interval (``accuracy_df``)."""
        return self._converted("df", accuracy, alpha)

    def arrow(self, *, accuracy: bool = False, alpha: float = 0.05):
        """The answer as a ``pyarrow.Table`` (needs pyarrow); ``accuracy`` as for ``df``."""
        return self._converted("arrow", accuracy, alpha)

    def to_arrow_table(self, *, accuracy: bool = False, alpha: float = 0.05):
        """The same as ``arrow()``."""
        return self.arrow(accuracy=accuracy, alpha=alpha)

    def pl(self, *, accuracy: bool = False, alpha: float = 0.05):
        """The answer as a ``polars.DataFrame`` (needs polars and pyarrow), from its Arrow form
        as DuckDB's ``.pl()`` is; ``accuracy`` as for ``df``."""
        try:
            import polars
        except ImportError:
            raise _missing("polars", "pl()") from None
        return polars.from_arrow(self.arrow(accuracy=accuracy, alpha=alpha))

    def show(self, *, width: int = 100, max_rows: int = SHOWN_ROWS) -> None:
        """Print the answer in a box, noisy values as ``value ± half-width`` (95%), with its
        cost, budget and notes: the shell's table. Only the first ``max_rows`` rows are drawn."""
        print(self._box(width, max_rows), end="")

    @property
    def dtypes(self) -> list[str]:
        """The same as ``types``, as DuckDB's relations have both."""
        return self.types

    def fetch_arrow_table(self, *, accuracy: bool = False, alpha: float = 0.05):
        """The same as ``arrow()`` (DuckDB's older name)."""
        return self.arrow(accuracy=accuracy, alpha=alpha)

    def __iter__(self):
        return iter(list(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return self._box(100).rstrip("\n")

    def _repr_html_(self) -> str:
        """The answer as Jupyter shows it: values with ±, cost, budget left and notes; every
        value escaped (keys are data: a key may hold markup)."""
        answer = self._shown_answer(answer_from(self), SHOWN_ROWS)
        right = [name in answer.half_widths or _is_numeric(self._rows, i) for i, name in enumerate(self.columns)]
        head = "".join(f"<th>{_html(name)}</th>" for name in self.columns)
        body = "".join("<tr>" + "".join(
            f'<td style="text-align:{"right" if r else "left"};white-space:pre">{_html(cell)}</td>'
            for cell, r in zip(cells, right)) + "</tr>" for cells in cell_texts(answer))
        lines = [f"{self._count_line(len(answer.rows))}; {_html(self._kind())}"]
        if not self.exact and answer.half_widths:
            lines.append("± is the half-width of each value's 95% noise interval; [low, high] a 95% interval "
                         "cut to what the policy allows (a count is at least 0, an AVG within its bounds)")
        if self.budget is not None:
            lines.append(f"budget: {_html(self.budget)}".replace("\n", "; "))
        if self.outside_domain is not None and self.outside_domain.shown:
            lines.append(_html(self.outside_domain))
        if self.limits is not None:
            lines.append(f"limits: {_html(self.limits)}")
        if self.bounding is not None:
            lines.append(f"bias: {_html(self.bounding)}")
        notes = "".join(f"<li>{_html(note)}</li>" for note in self.notes)
        return (f'<div class="dpsql-result"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
                f'<p>{"<br>".join(lines)}</p>' + (f"<ul>{notes}</ul>" if notes else "") + "</div>")

    def _kind(self) -> str:
        if self.exact:
            synthetic = getattr(self.cost, "synthetic", False)
            return f"exact, {self.cost}" if synthetic else "exact, free: public tables only"
        if self.repeat:
            return "repeat, free"
        return f"cost: epsilon {_show(self.cost.epsilon)}, delta {_show(self.cost.delta)}"

    def _box(self, width: int, max_rows: int = SHOWN_ROWS) -> str:
        answer = self._shown_answer(answer_from(self), max_rows)
        table = render_table(answer, width=width)
        text = table[:table.rstrip("\n").rfind("\n") + 1]  # its row count: replaced by ours
        text += f"{self._count_line(len(answer.rows))}\n({self._kind()})\n"
        if self.budget is not None:
            text += f"budget: {self.budget}\n"
        outside = f"{answer.outside}\n" if answer.outside else ""
        return text + outside + bias_lines(answer) + "".join(f"note: {note}\n" for note in self.notes)

    def _shown_answer(self, answer, max_rows: int):
        """``answer`` cut to its first ``max_rows`` rows, for show(), repr and notebooks."""
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise InvalidParameter(f"max_rows must be a whole number >= 1, got {max_rows!r}",
                                   hint="write show(max_rows=100)")
        if len(answer.rows) <= max_rows:
            return answer
        from dataclasses import replace

        return replace(answer, rows=answer.rows[:max_rows],
                       half_widths={name: cells[:max_rows] for name, cells in answer.half_widths.items()},
                       intervals={name: cells[:max_rows] for name, cells in answer.intervals.items()})

    def _count_line(self, shown: int) -> str:
        total = len(self._rows)
        text = f"{total:,} row{'s' if total != 1 else ''}"
        return text if shown == total else f"{text} (the first {shown:,} shown; df() or fetchall() has every row)"

    def _records_frame(self, start: int = 0) -> pd.DataFrame:
        """The rows as pandas makes them from Python values (no DuckDB types)."""
        return pd.DataFrame.from_records(self._rows[start:], columns=self.columns)

    def _converted(self, form: str, accuracy: bool, alpha: float, start: int = 0):
        if form == "arrow":
            try:
                import pyarrow  # noqa: F401  # only to say how to install it before converting
            except ImportError:
                raise _missing("pyarrow", "arrow()") from None
        from dpsql.backends.duckdb.released import convert_released

        rows, types = self._rows[start:], self.types
        try:
            texts = [tuple(_duckdb_text(value, type_name) for value, type_name in zip(row, types)) for row in rows]
        except TypeError:  # a value with no DuckDB text form here (an exact nested value)
            converted = None
        else:
            converted = (self._converter or convert_released)(self.columns, types, texts, form)
        if converted is None:
            converted = self._fallback(form, start)
        return self._with_accuracy(converted, form, alpha, start) if accuracy else converted

    def _fallback(self, form: str, start: int):
        """The conversion from Python values, when DuckDB cannot read a value back."""
        frame = self._records_frame(start)
        if form == "df":
            return frame
        if form == "numpy":
            return {name: frame.iloc[:, i].to_numpy() for i, name in enumerate(self.columns)}
        import pyarrow

        arrays = []
        for i in range(len(self.columns)):
            values = [row[i] for row in self._rows[start:]]
            try:
                arrays.append(pyarrow.array(values))
            except (pyarrow.ArrowException, TypeError, ValueError):
                arrays.append(pyarrow.array([None if v is None else str(v) for v in values]))
        return pyarrow.Table.from_arrays(arrays, names=list(self.columns))

    def _with_accuracy(self, converted, form: str, alpha: float, start: int):
        """``converted`` with a ``<column>_halfwidth95`` column after each noisy one."""
        noisy = set() if self.exact else set(self.accuracy(alpha))
        if not noisy:
            return converted
        cells = self.accuracy_df(alpha)
        label = f"halfwidth{round((1 - alpha) * 100, 6):g}"
        added = [(i, f"{name}_{label}", [float(w) for w in cells.iloc[start:, i].tolist()])
                 for i, name in enumerate(self.columns) if name in noisy]
        if form == "df":
            for i, name, values in reversed(added):
                converted.insert(i + 1, name, pd.Series(values, dtype="float64"), allow_duplicates=True)
            return converted
        if form == "numpy":
            import numpy

            items = list(converted.items())
            for i, name, values in reversed(added):
                items.insert(i + 1, (name, numpy.array(values, dtype=numpy.float64)))
            return dict(items)
        import pyarrow

        for i, name, values in reversed(added):
            converted = converted.add_column(i + 1, name, pyarrow.array(values, pyarrow.float64()))
        return converted


def _missing(module: str, method: str) -> MissingDependency:
    """The error ``method`` raises when the optional package ``module`` is not installed: how to install it.

    >>> print(_missing("polars", "pl()"))
    pl() needs the polars package, which is not installed. Hint: pip install polars pyarrow.
    """
    return MissingDependency(f"{method} needs the {module} package, which is not installed",
                             hint=f"pip install {module}" + (" pyarrow" if module == "polars" else ""))


def _html(value) -> str:
    return html.escape(str(value), quote=True)


def _is_numeric(rows: list[tuple], index: int) -> bool:
    values = [row[index] for row in rows if row[index] is not None]
    return bool(values) and all(isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) for v in values)


_FLOATS = frozenset({"DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8"})


def _duckdb_text(value, type_name: str) -> str | None:
    """A released value as DuckDB's text of it, which casts back to ``type_name`` exactly.

    >>> _duckdb_text(0.1, "DOUBLE"), _duckdb_text(datetime.date(2024, 1, 31), "DATE"), _duckdb_text(None, "DATE")
    ('0.1', '2024-01-31', None)
    """
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, str):
        return value
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        value = value.item()  # a numpy scalar (from an exact answer's frame): its Python value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value) and type_name.upper() not in _FLOATS:
            return None  # pandas' NULL in a column that is not a float column
        return repr(value)
    if isinstance(value, (int, Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return f"{value.days} days {value.seconds} seconds {value.microseconds} microseconds"
    if isinstance(value, (bytes, bytearray)):
        return "".join(f"\\x{b:02x}" for b in value)
    raise TypeError(f"no DuckDB text for a {type(value).__name__}")


def _value_type(values: list) -> str:
    """The DuckDB type of a column read off its Python values (an answer built without types).

    >>> _value_type([1, None, 2**70]), _value_type([1, 2.5]), _value_type([Decimal("1.25"), Decimal("10")])
    ('HUGEINT', 'DOUBLE', 'DECIMAL(4,2)')
    """
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    kinds = {type(v) for v in present}
    if not present:
        return "VARCHAR"
    if kinds == {bool}:
        return "BOOLEAN"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "BIGINT" if all(-2**63 <= v < 2**63 for v in present) else "HUGEINT"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "DOUBLE"
    if all(isinstance(v, Decimal) and v.is_finite() for v in present):
        scale = max(max(0, -v.as_tuple().exponent) for v in present)
        whole = max(len(v.as_tuple().digits) + v.as_tuple().exponent for v in present)
        precision = max(1, whole) + scale
        return f"DECIMAL({precision},{scale})" if precision <= 38 else "DOUBLE"
    for kind, name in ((str, "VARCHAR"), (datetime.datetime, "TIMESTAMP"), (datetime.date, "DATE"),
                       (datetime.time, "TIME"), (datetime.timedelta, "INTERVAL"), (uuid.UUID, "UUID"),
                       (bytes, "BLOB")):
        if all(isinstance(v, kind) for v in present):
            if kind is datetime.datetime and any(v.tzinfo is not None for v in present):
                return "TIMESTAMP WITH TIME ZONE"
            return name
    return "VARCHAR"


class OutsideDomain:
    """Rows whose GROUP BY keys lie outside their KEYS domains (or are NULL), released as one
    more noisy cell of the query's own aggregates, never dropped (``dpsql.analysis.domains``).

    >>> widths = lambda alpha: {"n": 30.2, "avg_delay": 0.4}
    >>> cell = OutsideDomain(("dest",), {"n": 7602, "avg_delay": 12.5}, widths, "n")
    >>> cell.values["n"], cell.accuracy()["n"]
    (7602, 30.2)
    >>> str(cell)
    '≈ 7,602 ± 30 rows with dest outside its KEYS domain (avg_delay ≈ 12.50 ± 0.40)'
    """

    def __init__(self, keys: tuple[str, ...], values: dict, widths: Callable[[float], dict[str, float]],
                 rows: str | None = None, spans: Callable[[float], dict[str, tuple[float, float]]] | None = None,
                 shown: bool = True):
        self.keys = tuple(keys)
        """The GROUP BY keys, as written."""
        self.shown = shown
        """Whether the answer's footers show it (``repr``, the shell, the CLI, the server's NOTICE):
        when the query asked for it (``OPTIONS (show_outside = true)``) or its noisy values can be
        told from noise (``dpsql.query.outside``); it is here either way."""
        self.values = dict(values)
        """Per aggregate of the query (by output name, else as written), its noisy value in this cell."""
        self.rows = rows
        """The output that counts rows (a COUNT(*)), if the query has one."""
        self._widths = widths
        self._spans = spans

    def accuracy(self, alpha: float = 0.05) -> dict[str, float]:
        """Per value, the half-width of its (1 - alpha) noise interval."""
        if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise InvalidParameter(f"alpha must be between 0 and 1, got {alpha!r}")
        return self._widths(float(alpha))

    def intervals(self, alpha: float = 0.05) -> dict[str, tuple[float, float]]:
        """Per value, its (1 - alpha) interval (low, high), cut to what the policy makes possible
        (a count's at 0): value ± half-width where nothing was cut. Empty when not known."""
        self.accuracy(alpha)  # the same check of alpha
        return self._spans(float(alpha)) if self._spans is not None else {}

    def __str__(self) -> str:
        widths, spans = self.accuracy(), self.intervals()
        shown = {name: _about(value, widths.get(name), spans.get(name)) for name, value in self.values.items()}
        keys = self.keys[0] if len(self.keys) == 1 else "(" + ", ".join(self.keys) + ")"
        where = f"with {keys} outside {'its KEYS domain' if len(self.keys) == 1 else 'their KEYS domains'}"
        others = ", ".join(f"{name} ≈ {text}" for name, text in shown.items() if name != self.rows)
        if self.rows is None:
            return f"rows {where}: {others}"
        return f"≈ {shown[self.rows]} rows {where}" + (f" ({others})" if others else "")

    def __repr__(self) -> str:
        return f"OutsideDomain({self})"


def _about(value, width: float | None, span: tuple[float, float] | None = None) -> str:
    """A noisy value with its ± to the precision the noise allows, or with its interval
    ``[low, high]`` where that was cut to what the policy allows (not value ± one width).

    >>> _about(3, 30.2, (0.0, 33.2)), _about(12.5, 0.4, (12.1, 12.9))
    ('3 [0, 34]', '12.50 ± 0.40')
    """
    if value is None:
        return "NULL"
    if width is None or not math.isfinite(width) or width <= 0:
        return f"{value:,}" if isinstance(value, int) else str(value)
    if span is not None and asymmetric(value, span):
        low, high = interval_ends(value, width, span)
        return f"{noisy_parts(value, width)[0]} [{low}, {high}]"
    decimals = min(6, max(0, 1 - math.floor(math.log10(width))))
    if isinstance(value, int):
        return f"{value:,} ± {width:,.{0 if width >= 1 else decimals}f}"
    return f"{float(value):,.{decimals}f} ± {width:,.{decimals}f}"


# --- stored answers: what a free repeat returns ------------------------------------------------

ANSWER_FORMAT = 1
"""Version of the JSON a released answer is kept in."""


def encode_answer(columns: list[str], rows: list[tuple], noisy: dict[str, list[int]], *,
                  outside: dict | None = None) -> str:
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
    if outside is not None:  # the outside cell (OutsideDomain): its values and noisy measures
        try:
            record["outside"] = {"values": [_encode(v) for v in outside["values"]],
                                 "noisy": {k: int(v) for k, v in outside["noisy"].items()}}
        except (TypeError, ValueError):
            record["replay"] = False
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


def decode_outside(text: str | None) -> dict | None:
    """The outside cell stored with an answer (``encode_answer``), or ``None``."""
    if text is None:
        return None
    try:
        outside = json.loads(text)["outside"]
        return {"values": [_decode(v) for v in outside["values"]],
                "noisy": {str(k): int(v) for k, v in outside["noisy"].items()}}
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
