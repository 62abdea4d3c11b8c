"""A horizontal bar chart with 95% error bars, drawn in text for the terminal.

One bar per row of a grouped answer: ``█`` from zero to the released value, ``▒`` where the
bar lies inside the value's 95% noise interval, and ``─…┤`` where the interval reaches past
the bar. An analyst sees at a glance which differences between groups are larger than
the noise.

>>> from dpsql.answer.table import Answer
>>> answer = Answer(["plan", "users"], [("free", 1200), ("plus", 600), ("pro", 200)],
...                 half_widths={"users": [100.0, 100.0, 100.0]})
>>> print(render_chart(answer, width=50))
users by plan  (█ value, ▒─┤ 95% interval)
free  █████████████████████████▒▒─┤  1,200 ± 100
plus  ███████████▒▒──┤                 600 ± 100
pro   ██▒▒──┤                          200 ± 100
      0                       1,300
<BLANKLINE>
"""

from __future__ import annotations

import math

from dpsql.answer.table import (
    NO_INTERVAL,
    Answer,
    is_missing,
    is_numeric_column,
    noisy_parts,
    plain_cell,
    to_text,
)

MAX_LABEL_WIDTH = 30
"""Longer group labels are cut, so the bars keep most of the width."""

BAR_STYLE, INTERVAL_STYLE = "cyan", "yellow"


class ChartError(ValueError):
    """Why an answer cannot be drawn as a bar chart (one sentence, with what to do)."""


def chart_columns(answer: Answer, column: str | None = None) -> tuple[list[str], str]:
    """The label columns and the one numeric column a chart of ``answer`` draws.

    >>> chart_columns(Answer(["store", "n", "avg"], [("a", 1, 2.0)], {"n": [1.0], "avg": [1.0]}), "avg")
    (['store'], 'avg')
    """
    if not answer.rows:
        raise ChartError("the result has no rows")
    numeric = [name for name in answer.columns
               if (name in answer.half_widths or answer.exact) and is_numeric_column(answer, name)]
    if column is not None:
        matches = [name for name in answer.columns if name.lower() == column.lower()]
        if not matches or not is_numeric_column(answer, matches[0]):
            raise ChartError(f"{column} is not a numeric column of the result; "
                             f"numeric columns: {', '.join(numeric) or 'none'}")
        value = matches[0]
    elif len(numeric) == 1:
        value = numeric[0]
    elif not numeric:
        raise ChartError("the result has no numeric column to draw")
    else:
        raise ChartError(f"the result has {len(numeric)} numeric columns ({', '.join(numeric)}); "
                         f"name one, e.g. .chart {numeric[0]}")
    labels = [name for name in answer.columns if name != value and name not in numeric]
    return labels, value


def render_chart(answer: Answer, column: str | None = None, *, width: int = 100, color: bool = False) -> str:
    """The answer as a bar chart of ``column`` (or its only numeric column), with error bars."""
    from rich.text import Text

    labels, value_column = chart_columns(answer, column)
    index = answer.columns.index(value_column)
    widths = answer.half_widths.get(value_column, [0.0] * len(answer.rows))
    label_texts = [_label(answer, labels, row, r) for r, row in enumerate(answer.rows)]
    values = [None if is_missing(row[index]) else float(row[index]) for row in answer.rows]
    value_texts = _value_texts(values, widths)
    # Error bars: each row's interval, asymmetric for quantiles; none where there is no ±.
    spans = answer.intervals.get(value_column) or [
        (v - _finite(w), v + _finite(w)) if v is not None else (0.0, 0.0) for v, w in zip(values, widths)]
    spans = [(lo, hi) if math.isfinite(lo) and math.isfinite(hi) and v is not None else (v or 0.0, v or 0.0)
             for v, (lo, hi) in zip(values, spans)]

    label_width = max(len(t) for t in label_texts)
    value_width = max(len(t) for t in value_texts)
    bar_width = max(10, min(60, width - label_width - value_width - 6))
    known = [(v, span) for v, span in zip(values, spans) if v is not None]
    low = min([0.0, *(min(v, lo) for v, (lo, _) in known)])
    high = max([0.0, *(max(v, hi) for v, (_, hi) in known)])
    scale = bar_width / ((high - low) or 1.0)

    def cell(x: float) -> int:
        return max(0, min(bar_width, round((x - low) * scale)))

    text = Text()
    by = f" by {', '.join(labels)}" if labels else ""
    text.append(f"{value_column}{by}  ", style="bold")
    text.append("(")
    text.append("█", style=BAR_STYLE)
    text.append(" value, ")
    text.append("▒─┤", style=INTERVAL_STYLE)
    text.append(f" {'95% interval' if answer.half_widths else 'exact, no noise'})\n")
    for label, value, (span_low, span_high), shown in zip(label_texts, values, spans, value_texts):
        text.append(label.ljust(label_width) + "  ")
        if value is None:
            text.append(" " * bar_width + "  " + shown.rjust(value_width) + "\n")
            continue
        bar = _bar_cells(cell(0.0), cell(value), cell(span_low), cell(span_high), bar_width)
        for char in bar:
            text.append(char, style=BAR_STYLE if char == "█" else INTERVAL_STYLE if char != " " else "")
        text.append("  " + shown.rjust(value_width) + "\n")
    text.append(" " * (label_width + 2) + _axis(low, high, cell(0.0), bar_width) + "\n", style="dim")
    lines = to_text(text, width=10_000, color=color, end="").split("\n")
    # Bars padded for the value column leave no trailing blanks in the plain form.
    return "\n".join(line if color else line.rstrip() for line in lines)


def _bar_cells(zero: int, end: int, low: int, high: int, width: int) -> str:
    """One bar: ``█`` between zero and the value, the interval [low, high) over it.

    >>> _bar_cells(0, 6, 4, 9, 12)
    '████▒▒──┤   '
    """
    if high <= low:  # an interval thinner than a cell still shows its end
        high = min(width, low + 1)
    bar_from, bar_to = min(zero, end), max(zero, end)
    chars = []
    for i in range(width):
        in_bar, in_interval = bar_from <= i < bar_to, low <= i < high
        if in_bar and in_interval:
            chars.append("▒")
        elif in_bar:
            chars.append("█")
        elif in_interval:
            chars.append("┤" if i == high - 1 else "├" if i == low else "─")
        else:
            chars.append(" ")
    return "".join(chars)


def _axis(low: float, high: float, zero: int, width: int) -> str:
    """Tick labels under the bars: the lowest value, 0 and the highest.

    >>> _axis(-50.0, 150.0, 5, 20)
    '-50  0           150'
    """
    decimals = 0 if high - low >= 10 else 2
    chars = [" "] * width
    ticks = [(0, f"{low:,.{decimals}f}")] if low < 0 else []
    ticks += [(zero, "0"), (width - len(f"{high:,.{decimals}f}"), f"{high:,.{decimals}f}")]
    taken = -1
    for start, label in ticks:
        start = max(start, 0)
        if start > taken and start + len(label) <= width:
            chars[start:start + len(label)] = label
            taken = start + len(label)
    return "".join(chars).rstrip()


def _label(answer: Answer, labels: list[str], row: tuple, r: int) -> str:
    if not labels:
        return str(r + 1)
    text = " / ".join(plain_cell(row[answer.columns.index(name)]) for name in labels)
    return text if len(text) <= MAX_LABEL_WIDTH else text[:MAX_LABEL_WIDTH - 1] + "…"


def _value_texts(values: list[float | None], widths: list[float]) -> list[str]:
    parts = [noisy_parts(v, w) for v, w in zip(values, widths)]
    value_width = max(len(v) for v, _ in parts)
    error_width = max((len(e) for _, e in parts if e != NO_INTERVAL), default=0)
    return [f"{v:>{value_width}} ({e})" if e == NO_INTERVAL else
            f"{v:>{value_width}} ± {e:<{error_width}}".rstrip() if e else v for v, e in parts]


def _finite(half_width: float) -> float:
    return half_width if isinstance(half_width, (int, float)) and half_width == half_width \
        and abs(half_width) != float("inf") else 0.0
