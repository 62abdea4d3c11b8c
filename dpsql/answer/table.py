"""An answer as text: the table the shell prints and a ``DPResult`` shows (``repr``, ``show()``,
notebooks), and the cells both write, ``value ± half-width`` or ``value [low, high]``.

Pure functions of released values, so the answer, the shell (``dpsql.shell.render``, which adds
the csv, json, markdown and chart modes and the errors) and the command line all read one text.

>>> answer = Answer(["store", "n"], [("Loop", 1329), ("Ballard", 945)], half_widths={"n": [89.9, 89.9]})
>>> cell_texts(answer)
[['Loop', '1,329 ± 90'], ['Ballard', '  945 ± 90']]
"""

from __future__ import annotations

import datetime
import io
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

ALPHA = 0.05
"""Intervals are 95%: the ± of every noisy value is the half-width of its 95% noise interval."""

NO_INTERVAL = "derived, no ±"
"""Shown instead of a ± where a noisy column's accuracy cannot be derived soundly (NaN)."""

@dataclass(frozen=True)
class Answer:
    """A released result as the shell shows it: values, their ± and what they cost."""

    columns: list[str]
    """Column names, in order."""
    rows: list[tuple]
    """Released rows (noisy values and public keys only)."""
    half_widths: dict[str, list[float]] = field(default_factory=dict)
    """Per noisy column, the 95% half-width of each row's noise (NaN: "derived, no ±"); keys
    and exact columns absent."""
    cost_epsilon: Fraction = Fraction(0)
    """The epsilon this query was charged."""
    cost_delta: Fraction = Fraction(0)
    """The delta this query was charged."""
    exact: bool = False
    """True for a query over public tables only: exact, free."""
    repeat: bool = False
    """True when the engine returned an earlier answer for free."""
    notes: tuple[str, ...] = ()
    """What to know beyond the values (``DPResult.notes``: why an answer is thin)."""
    outside: str | None = None
    """The footer of rows outside the KEYS domains (``DPResult.outside_domain``), where it is shown."""
    limits: str | None = None
    """The contribution limits the answer applied (``DPResult.limits``), as text."""
    bounding: str | None = None
    """The bias report (``DPResult.bounding``), as text, when one was asked for."""
    intervals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Per noisy column, each row's 95% interval (low, high) where known: quantiles' are
    asymmetric. A column absent here is value ± half-width."""
    synthetic: bool = False
    """True for a query over the analyst's own synthetic tables only: exact, free."""


def answer_from(result: Any, alpha: float = ALPHA) -> Answer:
    """The ``Answer`` of a ``DPResult``, with the per-cell half-widths of its noisy columns."""
    rows = [tuple(row) for row in result]  # every row, whatever was fetched before
    noisy = set() if getattr(result, "exact", False) else set(result.accuracy(alpha))
    half_widths: dict[str, list[float]] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    if noisy:
        cells = result.accuracy_df(alpha)
        for position, column in enumerate(result.columns):  # by position: names may repeat
            if column in noisy:
                half_widths[column] = [float(w) for w in cells.iloc[:, position].tolist()]
        if hasattr(result, "intervals"):
            frame = result.intervals(alpha)
            for column in noisy:
                if f"{column}_low" in frame:
                    spans[column] = list(zip(map(float, frame[f"{column}_low"]), map(float, frame[f"{column}_high"])))
    cost = result.cost
    return Answer(list(result.columns), rows, half_widths, Fraction(cost.epsilon),
                  Fraction(cost.delta), bool(getattr(result, "exact", False)),
                  bool(getattr(result, "repeat", False)), tuple(getattr(result, "notes", ())),
                  None if not getattr(getattr(result, "outside_domain", None), "shown", False)
                  else str(result.outside_domain),
                  _text_or_none(getattr(result, "limits", None)), _text_or_none(getattr(result, "bounding", None)),
                  intervals=spans, synthetic=bool(getattr(cost, "synthetic", False)))


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def bias_lines(answer: Answer) -> str:
    """The footer lines naming an answer's contribution limits (with the share of rows they
    drop, where recorded, and which way they move each aggregate: ``dpsql.query.limits.Limits``) and
    its bias report ('' for none).

    >>> bounding = "≈ 3% ± 1% of rows beyond per-unit limits (at least)"
    >>> limits = "at most 5 rows per uid; not in the ±: they can only lower COUNT(*)"
    >>> print(bias_lines(Answer(["n"], [(1,)], limits=limits, bounding=bounding)), end="")
    limits: at most 5 rows per uid; not in the ±: they can only lower COUNT(*)
    bias: ≈ 3% ± 1% of rows beyond per-unit limits (at least)
    """
    text = ""
    if answer.limits:
        text += f"limits: {answer.limits}\n"
    if answer.bounding:
        text += f"bias: {answer.bounding}\n"
    return text


# -- cells -------------------------------------------------------------------------------------

def noisy_parts(value: Any, half_width: float) -> tuple[str, str]:
    """A noisy value and its half-width as text, both to two significant digits of the half-width.

    Digits finer than the noise are noise, so they are not shown.

    >>> noisy_parts(31204.3, 38.1)
    ('31,204', '38')
    >>> noisy_parts(45.1234, 0.35)
    ('45.12', '0.35')
    >>> noisy_parts(1186, 6.0)
    ('1,186', '6')
    >>> noisy_parts(None, 3.0)
    ('NULL', '')
    >>> noisy_parts(4.25, float("nan"))
    ('4.25', 'derived, no ±')
    """
    if is_missing(value):
        return "NULL", ""
    if isinstance(half_width, float) and math.isnan(half_width):
        return plain_cell(value), NO_INTERVAL
    if not isinstance(half_width, (int, float)) or not math.isfinite(half_width) or half_width <= 0:
        return plain_cell(value), ""
    decimals = supported_decimals(half_width)
    if _is_integer(value):  # a count: whole numbers, and a whole ± once the noise is that wide
        return f"{int(value):,}", f"{half_width:,.{0 if half_width >= 1 else decimals}f}"
    return f"{float(value):,.{decimals}f}", f"{half_width:,.{decimals}f}"


def supported_decimals(half_width: float) -> int:
    """The decimals a value with this ± (finite, above 0) is shown to: two significant digits
    of the half-width, at most 6 (the server sends values so too: ``dpsql.server.intervals``).

    >>> supported_decimals(12.3), supported_decimals(0.35), supported_decimals(950.0), supported_decimals(1e-9)
    (0, 2, 0, 6)
    """
    return min(6, max(0, 1 - math.floor(math.log10(half_width))))


def plain_cell(value: Any) -> str:
    """An exact value (a key, or a public table's value) as text."""
    if is_missing(value):
        return "NULL"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return f"{float(value):,.6g}"
    if isinstance(value, int) or type(value).__name__.startswith(("int", "uint")):
        return f"{int(value):,}"
    return str(value)


def is_missing(value: Any) -> bool:
    """True for None, NaN and pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and NA are not equal to themselves
    except (TypeError, ValueError):
        return False


def cell_texts(answer: Answer) -> list[list[str]]:
    """Each row's cells as text, noisy ones as ``value ± half-width`` with the ± aligned, or as
    ``value [low, high]`` in a column where some row's interval is not value ± one half-width
    (a quantile's, or one cut at a bound the policy sets: a count's at 0)."""
    columns = []
    for index, name in enumerate(answer.columns):
        widths = answer.half_widths.get(name)
        if widths is None:
            columns.append([plain_cell(row[index]) for row in answer.rows])
            continue
        spans = answer.intervals.get(name)
        if spans is not None and any(asymmetric(row[index], span) for row, span in zip(answer.rows, spans)):
            columns.append(_interval_texts([row[index] for row in answer.rows], spans, widths))
            continue
        parts = [noisy_parts(row[index], w) for row, w in zip(answer.rows, widths)]
        value_width = max((len(v) for v, _ in parts), default=0)
        error_width = max((len(e) for _, e in parts if e != NO_INTERVAL), default=0)
        columns.append([f"{v:>{value_width}} ({e})" if e == NO_INTERVAL else
                        f"{v:>{value_width}} ± {e:<{error_width}}".rstrip() if e else v
                        for v, e in parts])
    return [list(row) for row in zip(*columns)] if columns else []


def asymmetric(value: Any, span: tuple[float, float]) -> bool:
    """True when ``span`` is not ``value`` ± one half-width (beyond the outward rounding)."""
    number = plain_value(value)
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not all(map(math.isfinite, span)):
        return False
    below, above = float(number) - span[0], span[1] - float(number)
    return abs(below - above) > 1e-9 * max(abs(below), abs(above), 1e-300)


def interval_ends(value: Any, width: float, span: tuple[float, float]) -> tuple[str, str]:
    """The ends of ``value``'s interval ``span`` as text, to the digits its half-width warrants
    (``noisy_parts``); a count's as whole numbers (its outward rounding is below 1e-6).

    >>> interval_ends(3, 30.2, (0.0, 33.2)), interval_ends(12.5, 0.4, (12.1, 12.95))
    (('0', '34'), ('12.10', '12.95'))
    """
    if _is_integer(value):
        return f"{math.floor(span[0] + 1e-6):,}", f"{math.ceil(span[1] - 1e-6):,}"
    low, high = (noisy_parts(end, width)[0] for end in span)
    return low, high


def _interval_texts(values: list[Any], spans: list[tuple[float, float]], widths: list[float]) -> list[str]:
    """``value [low, high]`` per cell, each number to the digits its half-width warrants (the
    value's own ``noisy_parts``); a cell without a finite interval as ``noisy_parts`` shows it."""
    texts = []
    for value, span, width in zip(values, spans, widths):
        shown, error = noisy_parts(value, width)
        if error in ("", NO_INTERVAL) or not all(map(math.isfinite, span)):
            texts.append(f"{shown} ({error})" if error == NO_INTERVAL else shown)
            continue
        low, high = interval_ends(value, width, span)
        texts.append(f"{shown} [{low}, {high}]")
    width_of = max((len(t.split(" [")[0]) for t in texts), default=0)
    return [f"{t.split(' [')[0]:>{width_of}} [{t.split(' [', 1)[1]}" if " [" in t else t for t in texts]


def is_numeric_column(answer: Answer, name: str) -> bool:
    """True when every non-NULL value of a column is a number."""
    index = answer.columns.index(name)
    values = [row[index] for row in answer.rows if not is_missing(row[index])]
    return bool(values) and all(_is_number(v) for v in values)


def _is_integer(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(plain_value(value), int)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(plain_value(value), (int, float))


def plain_value(value: Any) -> Any:
    """A value as a JSON/CSV-ready Python object: numpy scalars unwrapped, NaN as None."""
    if is_missing(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, Fraction):
        return float(value)
    return value



# -- the boxed table ---------------------------------------------------------------------------

def render_table(answer: Answer, *, width: int = 100, color: bool = False, footer: bool = True) -> str:
    """A boxed table; noisy cells read ``value ± half-width``, keys are left-aligned; ``footer``
    adds the count of rows."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.ROUNDED, header_style="bold", show_edge=True, pad_edge=True)
    for name in answer.columns:
        right = name in answer.half_widths or is_numeric_column(answer, name)
        table.add_column(Text(name), justify="right" if right else "left", no_wrap=True)
    for cells in cell_texts(answer):
        table.add_row(*(Text(c, style="dim" if c == "NULL" else "") for c in cells))
    rows = len(answer.rows)
    text = to_text(table, width=width, color=color)
    return text + (f"{rows:,} row{'s' if rows != 1 else ''}\n" if footer else "")


# -- rich to text ------------------------------------------------------------------------------

def to_text(renderable: Any, *, width: int, color: bool, end: str = "\n") -> str:
    """Render a rich object to a string, with ANSI styles only when ``color``."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=max(width, 20), force_terminal=color, no_color=not color,
                      color_system="standard" if color else None, highlight=False, markup=False,
                      emoji=False, soft_wrap=False, legacy_windows=False)
    console.print(renderable, end=end, soft_wrap=end == "")
    if color:
        return buffer.getvalue()
    # Tables pad every line to their width; plain text needs no trailing blanks.
    return "\n".join(line.rstrip() for line in buffer.getvalue().split("\n"))
