"""The test hook that switches noise off: a query's exact bounded measures, as the release reads them.

``exact_run(db, sql)`` repeats what ``Connection.sql`` does up to the release — the same
``_check`` (parse, ``check_query``, contribution options) and ``_plan`` (``analyse_query``),
``rewrite_statement`` / ``separate_statement``, run on the connection's own engine (which fills the
bounded copies) — and then, instead of adding noise, returns every measure's exact value per
released key together with the sensitivity the analysis claimed for it. Keep it in step with
``dpsql.query.answering.Answerer.sql`` and ``dpsql.query.release.release_measures``: it is the one place
tests see those internals.

Keys are identified by DuckDB's own text of the key (``CAST(key AS VARCHAR)``), never by the
Python value the engine converts it to: two keys DuckDB tells apart must stay apart, and a key
whose text changes is a different key (invariant 19).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from fractions import Fraction
from unittest import mock

from sqlglot import exp

from dpsql.analysis.plan import Plan, PrivateQuery
from dpsql.analysis.sensitivity import Sensitivity, distinct_units_sensitivity
from dpsql.backends.keys import read_keys
from dpsql.backends.render import DUCKDB, render
from dpsql.backends.rewrite import BoundedStatement, rewrite_statement, separate_statement
from dpsql.query.options import merge_options
from dpsql.sql.pieces import key_text

NULL_TEXT = "<NULL>"
"""The text identity of a NULL key (DuckDB's CAST gives NULL, which has no text)."""


@dataclass(frozen=True)
class ExactRun:
    """A query's exact measures and claimed sensitivities, with noise switched off."""

    plan: Plan
    """The plan ``Connection.sql`` would release from."""
    vectors: dict[str, dict[tuple, int]]
    """Measure name (``u`` for partition selection's unit counts) -> {key text: exact value} over
    the keys the release reads; a key it does not read counts 0."""
    sensitivities: dict[str, Sensitivity]
    """Measure name -> the (L1, squared L2) the analysis claims one unit can move its vector."""
    histograms: dict[str, dict[tuple, int]] = field(default_factory=dict)
    """Quantile measure -> {(key text, bucket): count} the exponential mechanism reads."""
    histogram_bounds: dict[str, int] = field(default_factory=dict)
    """Quantile measure -> the most one unit's change moves its bucket counts (L1)."""
    merged_keys: tuple[str, ...] = ()
    """Key texts DuckDB tells apart that the engine's Python conversion merged into one."""
    public_keys: bool = True
    """True when every key has a public domain (no partition selection)."""


FIXED_SALT = bytes(range(32))
"""The salt both neighbours are bounded with: the sensitivity argument holds for each fixed salt."""


@contextlib.contextmanager
def fixed_salt():
    """Connections opened inside get the ledger salt ``FIXED_SALT`` instead of a random one, so
    both neighbours keep the same rows of every unit (dpsql.backends.bounding)."""
    with mock.patch("dpsql.budget.ledger.secrets", types.SimpleNamespace(token_bytes=lambda n: FIXED_SALT[:n])):
        yield


def exact_run(db, sql: str) -> ExactRun | None:
    """The exact measures ``db.sql(sql)`` would add noise to; ``None`` for a public query.

    Raises the ``DPError`` of a static refusal, and whatever running the bounded SQL raises.
    """
    _, checked, written = db._check(sql)
    if not isinstance(checked, PrivateQuery):
        return None
    epsilon, delta, noise = merge_options(written, None, None, None)
    plan = db._preparer.plan(checked, sql, epsilon, delta, noise)
    width = len(plan.query.keys)
    dialect = db._engine.dialect
    rows, merged = _fetch_with_texts(db, plan, rewrite_statement(plan, dialect), width)
    representatives = _representatives(rows, width)
    released = _released_keys(db, plan, representatives)
    vectors, sensitivities = {}, {}
    names = [m.name for m in plan.summed] + (["u"] if plan.selection is not None else [])
    for index, name in enumerate(names):
        vectors[name] = _vector(rows, representatives, released, width, index)
    for measure in plan.summed:
        sensitivities[measure.name] = measure.sensitivity
    if plan.selection is not None:
        sensitivities["u"] = distinct_units_sensitivity(groups_per_unit=plan.query.rule.groups_per_unit,
                                                        neighbours=plan.neighbours, grouped=width > 0)
    histograms, bounds = {}, {}
    for measure in plan.separate:
        separate, more = _fetch_with_texts(db, plan, separate_statement(plan, measure, dialect), width)
        merged += more
        if measure.kind == "distinct":
            vectors[measure.name] = _vector(separate, _representatives(separate, width), released, width, 0)
            sensitivities[measure.name] = measure.sensitivity
        else:
            histograms[measure.name] = _bucket_counts(separate, released, width)
            rule = next(a.rule for a in plan.aggregates if a.measures[0] == measure.name)
            bounds[measure.name] = rule.rows_per_unit * (2 if plan.neighbours == "bounded" else 1)
    return ExactRun(plan, vectors, sensitivities, histograms, bounds, tuple(merged),
                    public_keys=plan.selection is None)


def _fetch_with_texts(db, plan: Plan, bounded: BoundedStatement, width: int) -> tuple[list[tuple], list[str]]:
    """Rows of ``bounded`` as the connection reads them back (``read_keys``), each followed
    by its key's DuckDB text; and the key texts that the read-back merged with another row's key.
    On another engine (Spark) the text is the engine's key text read back as DuckDB's text of the
    same value (``key_text``): a text-form key is read back as that text already."""
    if db._engine.dialect != DUCKDB:
        return _fetch_with_engine_texts(db, plan, bounded, width)
    texts = ", ".join(f"CAST(dp_exact.g{i} AS VARCHAR) AS dp_text{i}" for i in range(width))
    sql = bounded.sql if not width else f"SELECT *, {texts} FROM (\n{bounded.sql}\n) AS dp_exact"
    rows = read_keys(db._engine.fetch(sql, db._executor.salt_for(bounded.needs_salt), bounded=plan.query.bounded),
                     plan.query.keys)
    return rows, _merged(rows, width)


def _fetch_with_engine_texts(db, plan: Plan, bounded: BoundedStatement, width: int) -> tuple[list[tuple], list[str]]:
    keys, engine = plan.query.keys, db._engine
    valued = [i for i, key in enumerate(keys) if key.form == "value"]
    texts = [key_text(exp.column(f"g{i}", "dp_exact"), keys[i].type_name).as_(f"dp_text{i}") for i in valued]
    sql = bounded.sql
    if texts:
        listed = render(exp.select(*texts), engine.dialect).removeprefix("SELECT ")
        sql = f"SELECT *, {listed} FROM (\n{bounded.sql}\n) AS dp_exact"
    fetched = read_keys(engine.fetch(sql, db._executor.salt_for(bounded.needs_salt), bounded=plan.query.bounded), keys,
                        text=engine.key_text, value=engine.key_value)
    rows = []
    for row in fetched:
        extra = iter(row[len(row) - len(texts):] if texts else ())
        values = row[:len(row) - len(texts)] if texts else row
        shown = [engine.key_text(next(extra), keys[i].type_name) if i in valued else row[i] for i in range(width)]
        rows.append(tuple(values) + tuple(shown))
    return rows, _merged(rows, width)


def _merged(rows: list[tuple], width: int) -> list[str]:
    by_value: dict[tuple, list[tuple]] = {}
    for row in rows:
        by_value.setdefault(tuple(row[:width]), []).append(_text_key(row, width))
    return [" = ".join(map(repr, group)) for group in by_value.values() if len(set(group)) > 1]


def _text_key(row: tuple, width: int) -> tuple:
    return tuple(NULL_TEXT if v is None else v for v in row[len(row) - width:]) if width else ()


def _representatives(rows: list[tuple], width: int) -> dict[tuple, int]:
    """Python key -> index of the row the release reads for it (the last, as ``_ExactRows``)."""
    return {tuple(row[:width]): index for index, row in enumerate(rows)}


def _released_keys(db, plan: Plan, representatives: dict[tuple, int]) -> list[tuple]:
    """The Python keys the release reads: the public domain, or every candidate of selection."""
    if plan.selection is None:
        return [tuple(key) for key in db._answerer.domains.domain(plan.query)]
    return list(representatives)


def _vector(rows, representatives, released, width: int, index: int) -> dict[tuple, int]:
    """{key text: value} of value column ``index`` at the released keys (NULL as 0)."""
    vector = {}
    for key in released:
        at = representatives.get(key)
        if at is None:
            continue
        row = rows[at]
        vector[_text_key(row, width)] = int(row[width + index] or 0)
    return vector


def _bucket_counts(rows, released, width: int) -> dict[tuple, int]:
    """{(key text, bucket): count} of a quantile's histogram rows at the released keys."""
    wanted = set(released)
    counts: dict[tuple, int] = {}
    for row in rows:
        if tuple(row[:width]) in wanted:
            cell = (_text_key(row, width), int(row[width]))
            counts[cell] = counts.get(cell, 0) + int(row[width + 1] or 0)
    return counts


def distance(a: dict, b: dict) -> tuple[int, int]:
    """L1 and squared L2 distance of two sparse vectors (a missing entry is 0)."""
    diffs = [a.get(key, 0) - b.get(key, 0) for key in set(a) | set(b)]
    return sum(abs(d) for d in diffs), sum(d * d for d in diffs)


def halved(run: ExactRun) -> ExactRun:
    """``run`` with every claimed sensitivity halved: a deliberately broken analysis, for the
    test that shows the properties catch one."""
    half = {name: Sensitivity(s.l1 / 2, s.l2_squared / 4) for name, s in run.sensitivities.items()}
    bounds = {name: Fraction(bound, 2) for name, bound in run.histogram_bounds.items()}
    return ExactRun(run.plan, run.vectors, half, run.histograms, bounds, run.merged_keys, run.public_keys)
