"""Text the shell and the command line print: answers with ±, costs, budgets and errors.

Every function here is pure: it takes released values (never exact ones — there are none
on this side of the API) and returns a string. ``color=True`` adds ANSI styles for a
terminal; tests read the plain form. The answer's cells and boxed table, which a ``DPResult``
shows too, live below the shell in ``dpsql.answer.table``; the bar chart in ``chart.py``, costs
and budgets in ``budget.py``.

>>> answer = Answer(["store", "n"], [("Loop", 1329), ("Ballard", 945)],
...                 half_widths={"n": [89.9, 89.9]})
>>> print(render_answer(answer, "csv"))
store,n,n_halfwidth95
Loop,1329,89.9
Ballard,945,89.9
<BLANKLINE>
>>> print(render_answer(answer, "markdown"))
| store   |          n |
|---------|-----------:|
| Loop    | 1,329 ± 90 |
| Ballard |   945 ± 90 |
<BLANKLINE>
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import replace
from typing import Any

from dpsql.answer.table import (
    ALPHA,
    NO_INTERVAL,
    Answer,
    answer_from,
    bias_lines,
    cell_texts,
    is_missing,
    is_numeric_column,
    plain_value,
    render_table,
    to_text,
)
from dpsql.errors import (
    BudgetExceeded,
    DPError,
    InvalidParameter,
    PolicyError,
    QueryFailed,
    UnsupportedQuery,
)

__all__ = ["ALPHA", "MODES", "NO_INTERVAL", "Answer", "answer_from", "bias_lines", "caret_lines", "cell_texts",
           "first_rows", "number", "render_answer", "render_csv", "render_error", "render_json", "render_markdown",
           "render_notes", "render_rows", "render_table", "to_text"]
"""The shell's text, with the answer's own (``dpsql.answer.table``) it builds on."""

MODES = ("table", "csv", "json", "markdown", "chart")
"""Output modes of the shell (``.mode``); the command line offers all but chart."""

ERROR_LABELS: tuple[tuple[type[DPError], str, str], ...] = (
    (UnsupportedQuery, "refused", "nothing was read or charged"),
    (BudgetExceeded, "over budget", "nothing was released or charged"),
    (InvalidParameter, "invalid parameter", "nothing was charged"),
    (PolicyError, "policy error", ""),
    (QueryFailed, "query failed", ""),
    (DPError, "error", ""),
)
"""How each kind of error is introduced, and what it means for the budget; first match wins."""


def render_answer(answer: Answer, mode: str, *, width: int = 100, color: bool = False,
                  max_rows: int = 0, show_all: str = "") -> str:
    """An answer in one of ``MODES`` (chart falls back to a table when it cannot be drawn).

    ``max_rows`` (0: no limit) cuts the table and markdown modes, made for reading, to their
    first rows and a line saying how many more there are (``show_all`` says how to see them,
    e.g. ``--max-rows 0``); csv and json, made for programs, always hold every row.

    >>> answer = Answer(["k"], [(i,) for i in range(5)])
    >>> print(render_answer(answer, "markdown", max_rows=2, show_all=".maxrows 0 shows all"))
    |   k |
    |----:|
    |   0 |
    |   1 |
    … 3 more rows (5 in all; .maxrows 0 shows all)
    <BLANKLINE>
    """
    if mode == "csv":
        return render_csv(answer)
    if mode == "json":
        return render_json(answer)
    shown, more = first_rows(answer, max_rows, show_all)
    if more and mode in ("table", "markdown"):
        text = render_markdown(shown) if mode == "markdown" else \
            render_table(shown, width=width, color=color, footer=False)
        return text + more
    if mode == "markdown":
        return render_markdown(answer)
    if mode == "chart":
        from dpsql.shell.chart import ChartError, render_chart

        try:
            return render_chart(shown, width=width, color=color) + more
        except ChartError as why:
            return render_table(answer, width=width, color=color) + f"(no chart: {why})\n"
    return render_table(answer, width=width, color=color)


def first_rows(answer: Answer, max_rows: int, show_all: str = "") -> tuple[Answer, str]:
    """The answer cut to its first ``max_rows`` rows (0: all), and the line saying how many
    more there are ("" when none are hidden)."""
    hidden = len(answer.rows) - max_rows if max_rows > 0 else 0
    if hidden <= 0:
        return answer, ""
    shown = replace(answer, rows=answer.rows[:max_rows],
                    half_widths={name: widths[:max_rows] for name, widths in answer.half_widths.items()},
                    notes=(), outside=None, limits=None, bounding=None)
    more = f"… {hidden:,} more row{'s' if hidden != 1 else ''} ({len(answer.rows):,} in all"
    return shown, more + (f"; {show_all})" if show_all else ")") + "\n"


# -- modes -------------------------------------------------------------------------------------

def render_rows(columns: list[str], rows: list[tuple], *, width: int = 100, color: bool = False,
                wrap_last: bool = False) -> str:
    """A plain table of text cells, for listings (tables, schema, ledger)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    for i, name in enumerate(columns):
        wraps = wrap_last and i == len(columns) - 1
        table.add_column(Text(name), no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    return to_text(table, width=width, color=color)


def render_csv(answer: Answer) -> str:
    """CSV with full-precision values; each noisy column is followed by ``<name>_halfwidth95``
    (``derived, no ±`` where none can be derived)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_flat_header(answer))
    for record in _flat_rows(answer):
        writer.writerow(["" if v is None else v for v in record])
    return buffer.getvalue()


def render_json(answer: Answer) -> str:
    """A JSON array of row objects; each noisy column also has ``<name>_halfwidth95``
    (``"derived, no ±"`` where none can be derived)."""
    header = _flat_header(answer)
    records = [dict(zip(header, record)) for record in _flat_rows(answer)]
    return json.dumps(records, indent=2, default=str, allow_nan=False) + "\n"


def render_markdown(answer: Answer) -> str:
    """A GitHub-flavoured Markdown table, cells as in the boxed table; a ``|`` in a name or
    value is escaped (``\\|``) so it cannot split its cell.

    >>> print(render_markdown(Answer(["z"], [("p|q",)])), end="")
    | z    |
    |------|
    | p\\|q |
    """
    rows = [[_markdown_cell(c) for c in row] for row in cell_texts(answer)]
    header = [_markdown_cell(name) for name in answer.columns]
    right = [name in answer.half_widths or is_numeric_column(answer, name) for name in answer.columns]
    widths = [max([len(name), 3, *(len(r[i]) for r in rows)]) for i, name in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w)
                                 for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if r else "-" * (w + 2) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)]) + "\n"


def _markdown_cell(text: str) -> str:
    """A cell's text for Markdown: ``|`` escaped, line breaks as ``<br>``."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def _flat_header(answer: Answer) -> list[str]:
    header = []
    for name in answer.columns:
        header.append(name)
        if name in answer.half_widths:
            header.append(f"{name}_halfwidth95")
    return header


def _flat_rows(answer: Answer) -> list[list[Any]]:
    records = []
    for r, row in enumerate(answer.rows):
        record = []
        for name, value in zip(answer.columns, row):
            record.append(plain_value(value))
            if name in answer.half_widths:
                half = answer.half_widths[name][r]
                missing = isinstance(half, float) and math.isnan(half) and not is_missing(value)
                record.append(NO_INTERVAL if missing else plain_value(half))
        records.append(record)
    return records


def render_notes(answer: Answer) -> str:
    """The answer's notes, one ``note:`` line each (empty when it has none).

    >>> render_notes(Answer(["n"], [], notes=("No rows were released.",)))
    'note: No rows were released.\\n'
    """
    return "".join(f"note: {note}\n" for note in answer.notes)


def number(value: Any) -> str:
    """A privacy amount for reading (never for arithmetic): 0.1, 2.9, 1e-06."""
    return f"{float(value):.6g}"


# -- errors ------------------------------------------------------------------------------------

def render_error(error: DPError, sql: str | None = None, *, color: bool = False, surface: str = "shell") -> str:
    """An error with a caret under its position in ``sql``, its hint (in ``surface``'s syntax:
    'shell' or 'cli', see ``DPError.hint_for``) and what it cost.

    >>> err = UnsupportedQuery("column user_id is neither aggregated nor grouped", line=1, col=8)
    >>> print(render_error(err, "SELECT user_id FROM visits"))
    refused: column user_id is neither aggregated nor grouped
    LINE 1: SELECT user_id FROM visits
                   ^
    (nothing was read or charged)
    <BLANKLINE>
    """
    from rich.text import Text

    label, consequence = next((label, note) for kind, label, note in ERROR_LABELS if isinstance(error, kind))
    text = Text()
    text.append(f"{label}: ", style="bold red")
    text.append(f"{error.message}\n")
    position = caret_lines(sql, error.line, error.col) if sql else None
    if position is not None:
        source, caret = position
        text.append(source + "\n")
        text.append(caret + "\n", style="bold red")
    hint = error.hint_for(surface) if hasattr(error, "hint_for") else error.hint
    if hint:
        text.append("hint: ", style="bold")
        text.append(f"{hint}\n")
    if consequence:
        text.append(f"({consequence})\n", style="dim")
    return to_text(text, width=10_000, color=color, end="")


def caret_lines(sql: str, line: int | None, col: int | None, max_width: int = 100) -> tuple[str, str] | None:
    """The line of ``sql`` holding (line, col) and a caret under col, psql style.

    Long lines are cut to a window around the caret.

    >>> print("\\n".join(caret_lines("SELECT a\\nFROM t GROUP BY zip", 2, 17)))
    LINE 2: FROM t GROUP BY zip
                            ^
    """
    lines = sql.split("\n")
    if line is None or col is None or not 1 <= line <= len(lines):
        return None
    source = lines[line - 1].replace("\t", " ")  # a tab is one column in the engine's count
    offset = min(max(col - 1, 0), len(source))
    if len(source) > max_width:
        start = max(0, min(offset - max_width // 2, len(source) - max_width))
        cut = source[start:start + max_width]
        prefix_mark = "…" if start > 0 else ""
        suffix_mark = "…" if start + max_width < len(source) else ""
        source, offset = prefix_mark + cut + suffix_mark, offset - start + len(prefix_mark)
    prefix = f"LINE {line}: "
    return prefix + source, " " * (len(prefix) + offset) + "^"
