"""Differential properties over one neighbouring pair of databases (issue 11 item 6, issue 16 item 6).

A ``Case`` is a policy, a base dataset, one adversarial privacy unit (and, for bounded
neighbours, its replacement) and a query. ``violations(case)`` runs the query on both
neighbours and returns what an analyst could learn beyond a DP release:

(a) ``outcome``: end to end through ``dpsql.connect(...).sql``, both sides must end the same way —
    an answer on both (with the same released keys when every key has a public domain), or
    the same ``DPError`` class and message on both;
(b) ``sensitivity``: with noise off (``tests/exact.py``), every exact measure moves by at most
    its analysed L1 and squared L2, and the analysis itself is the same on both sides;
(c) ``quantile``: every quantile histogram moves by at most the count change its exponential
    mechanism was calibrated for;
(d) ``keys``: keys are identified by DuckDB's text of them; none may be merged by the engine's
    conversion to Python, and keys with a public domain are released identically.

No property involves noise: both sides draw the same seeded noise, and noise never decides
an outcome kind; the exact measures are read with noise off.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
from exact import ExactRun, distance, exact_run, fixed_salt

import dpsql
from dpsql.mechanisms.noise import SeededSource


@dataclass(frozen=True)
class Table:
    """A table of a case: columns with DuckDB types, rows as SQL literals."""

    name: str
    columns: tuple[tuple[str, str], ...]
    rows: tuple[tuple[str, ...], ...] = ()

    def create_sql(self, extra_rows: tuple[tuple[str, ...], ...] = ()) -> str:
        definition = ", ".join(f'"{name}" {type_name}' for name, type_name in self.columns)
        rows = self.rows + extra_rows
        values = ", ".join(f"({', '.join(row)})" for row in rows)
        insert = f'; INSERT INTO "{self.name}" VALUES {values}' if rows else ""
        return f'CREATE TABLE "{self.name}" ({definition}){insert}'


@dataclass(frozen=True)
class Case:
    """A neighbouring pair of databases and the query an analyst sends to both."""

    family: str
    policy: str
    sql: str
    private: Table
    """The private table with its base rows."""
    unit: tuple[tuple[str, ...], ...]
    """The adversarial unit's rows: added (unbounded), or replaced by ``replacement`` (bounded)."""
    public: tuple[Table, ...] = ()
    replacement: tuple[tuple[str, ...], ...] | None = None
    """For bounded neighbours: the rows that replace ``unit``."""
    keys: int = 0
    """How many leading output columns are GROUP BY keys."""

    @property
    def neighbours(self) -> tuple[tuple, tuple]:
        """The extra private rows of each side of the pair."""
        if self.replacement is None:
            return (), self.unit
        return self.unit, self.replacement

    def reproduction(self) -> str:
        """The case as text: what to paste into a bug report."""
        lines = [f"family: {self.family}", f"policy: {' '.join(self.policy.split())}", f"sql: {self.sql}"]
        for table in (self.private, *self.public):
            lines.append(f"{table.create_sql()};")
        sides = self.neighbours
        lines.append(f"neighbour A adds to {self.private.name}: {list(sides[0])}")
        lines.append(f"neighbour B adds to {self.private.name}: {list(sides[1])}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Violation:
    """One property a case breaks."""

    prop: str
    """``outcome``, ``sensitivity``, ``quantile`` or ``keys``."""
    detail: str
    tag: str = ""
    """A short label of the mechanism, the same for every case it shows in (for counting)."""

    def __str__(self) -> str:
        return f"({self.prop}) {self.detail}"


@dataclass
class Side:
    """What one neighbour shows: the end-to-end outcome and the exact run (or why it failed)."""

    outcome: tuple
    """('answer', the released key columns, sorted) or (error class, message)."""
    exact: ExactRun | None = None
    """The exact measures with noise off, unless computing them failed."""
    exact_error: str | None = None
    """Why computing the exact measures failed."""


class Databases:
    """DuckDB databases for the two sides of a pair, emptied and reused from case to case
    (opening one costs about 50 ms, more than a case's queries)."""

    def __init__(self):
        self._connections = [duckdb.connect(), duckdb.connect()]

    def load(self, side: int, case: Case, extra_rows: tuple) -> duckdb.DuckDBPyConnection:
        """Side ``side``'s database, holding nothing but the case's tables (with ``extra_rows``)."""
        connection = self._connections[side]
        connection.execute("DETACH DATABASE IF EXISTS dp_bounding")
        for (name,) in connection.execute("SELECT table_name FROM duckdb_tables() "
                                          "WHERE database_name = current_database()").fetchall():
            connection.execute(f'DROP TABLE "{name}"')
        fill_database(connection, case, extra_rows)
        return connection

    def close(self) -> None:
        for connection in self._connections:
            connection.close()


def fill_database(connection: duckdb.DuckDBPyConnection, case: Case, extra_rows: tuple) -> None:
    """The case's public tables and its private table plus ``extra_rows``, built from SQL so every
    column has exactly the DuckDB type the case names (HUGEINT, UUID, TIMESTAMP_NS, collated
    VARCHAR...), which DataFrames cannot all carry."""
    for table in case.public:
        connection.execute(table.create_sql())
    connection.execute(case.private.create_sql(extra_rows))


def observe(case: Case, extra_rows: tuple, seed: int, databases: Databases | None = None, side: int = 0) -> Side:
    """Run the case's query on one neighbour (the base rows plus ``extra_rows``): end to end, then
    with noise off. ``databases`` reuses a database for the side; without, one is opened."""
    if databases is not None:
        return _observe_on(databases.load(side, case, extra_rows), case, seed)
    connection = duckdb.connect()
    try:
        fill_database(connection, case, extra_rows)
        return _observe_on(connection, case, seed)
    finally:
        connection.close()


def _observe_on(connection: duckdb.DuckDBPyConnection, case: Case, seed: int) -> Side:
    try:
        with fixed_salt():
            db = dpsql.connect(connection, policy=case.policy, rng=SeededSource(seed))
    except dpsql.DPError as error:  # a policy the schema refutes: the same on both sides
        return Side(outcome=(type(error).__name__, str(error)), exact_error="not connected")
    with db:
        seen = Side(outcome=_answer(db, case))
        try:
            seen.exact = exact_run(db, case.sql)
        except dpsql.DPError as error:
            seen.exact_error = f"{type(error).__name__}: {error}"
        except Exception as error:  # what the engine would turn into a QueryFailed
            seen.exact_error = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return seen


def _answer(db, case: Case) -> tuple:
    """('answer', the released key columns, sorted) or (error class, message)."""
    try:
        result = db.sql(case.sql)
    except dpsql.DPError as error:
        return type(error).__name__, str(error)
    except Exception as error:  # never acceptable: every failure must reach the analyst as a DPError
        return f"unexpected {type(error).__name__}", str(error).splitlines()[0]
    return "answer", tuple(sorted(repr(row[:case.keys]) for row in result.fetchall()))


def violations(case: Case, seed: int = 0, databases: Databases | None = None) -> list[Violation]:
    """Every property the case breaks (empty: it holds on this pair)."""
    return judge([observe(case, extra, seed, databases, side) for side, extra in enumerate(case.neighbours)])


def judge(sides: list[Side]) -> list[Violation]:
    """The properties over what the two neighbours showed."""
    found = _outcome_violations(sides)
    runs = [side.exact for side in sides]
    if all(run is not None for run in runs):
        found += exact_violations(*runs)
    for label, run in zip("AB", runs):
        if run is not None and run.merged_keys:
            found.append(Violation("keys", f"on neighbour {label} the engine's Python conversion merged keys "
                                           f"DuckDB tells apart: {', '.join(run.merged_keys)}",
                                   "keys DuckDB tells apart merged in Python"))
    return found


def _outcome_violations(sides: list[Side]) -> list[Violation]:
    a, b = (side.outcome for side in sides)
    found = []
    if a[0] != b[0] or (a[0] != "answer" and a != b):
        found.append(Violation("outcome", f"neighbour A ends in {a[0]}: {a[1]!r}; neighbour B in {b[0]}: {b[1]!r}",
                               " vs ".join(sorted({a[0], b[0]})) if a[0] != b[0] else f"{a[0]} with different messages"))
    elif a[0].startswith("unexpected"):
        found.append(Violation("outcome", f"both neighbours end in a non-DPError exception: {a[0]}: {a[1]!r}", a[0]))
    elif a[0] == "answer" and _public_keys(sides) and a != b:
        found.append(Violation("keys", f"keys with a public domain released differently: {a[1]!r} vs {b[1]!r}",
                               "public keys released differently"))
    errors = [side.exact_error for side in sides]
    if (errors[0] is None) != (errors[1] is None):
        failure = next(e for e in errors if e is not None).split(":")[0]
        found.append(Violation("outcome", f"the exact bounded SQL fails on one neighbour only: {errors}",
                               f"bounded SQL raises {failure} on one side"))
    return found


def _public_keys(sides: list[Side]) -> bool:
    return all(side.exact is not None and side.exact.public_keys for side in sides)


def exact_violations(a: ExactRun, b: ExactRun) -> list[Violation]:
    """Properties (b) and (c) over the exact runs of the two neighbours."""
    return _analysis_violations(a, b) + _measure_violations(a, b) + _histogram_violations(a, b)


def _analysis_violations(a: ExactRun, b: ExactRun) -> list[Violation]:
    """The analysis reads no private data, so it must be identical on both neighbours."""
    if a.sensitivities != b.sensitivities or a.histogram_bounds != b.histogram_bounds:
        return [Violation("sensitivity", f"the analysed sensitivities depend on the data: "
                                         f"{a.sensitivities} vs {b.sensitivities}", "analysis depends on the data")]
    return []


def _measure_violations(a: ExactRun, b: ExactRun) -> list[Violation]:
    found = []
    for name, claimed in a.sensitivities.items():
        l1, l2_squared = distance(a.vectors.get(name, {}), b.vectors.get(name, {}))
        if l1 > claimed.l1 or l2_squared > claimed.l2_squared:
            found.append(Violation("sensitivity", f"measure {name} moved by L1 {l1}, L2^2 {l2_squared}; analysed "
                                                  f"L1 {claimed.l1}, L2^2 {claimed.l2_squared} "
                                                  f"({_shown(a.vectors.get(name))} vs {_shown(b.vectors.get(name))})",
                                   f"{_kind(a, name)} moves beyond its sensitivity"))
    return found


def _histogram_violations(a: ExactRun, b: ExactRun) -> list[Violation]:
    found = []
    for name, bound in a.histogram_bounds.items():
        l1, _ = distance(a.histograms.get(name, {}), b.histograms.get(name, {}))
        if l1 > bound:
            found.append(Violation("quantile", f"histogram {name} moved by {l1} counts; the exponential mechanism "
                                               f"was calibrated for {bound}", "quantile histogram moves beyond k"))
    return found


def _kind(run: ExactRun, name: str) -> str:
    """What a measure counts, for tags: 'count', 'sum', 'distinct', 'units' or 'selection units'."""
    if name == "u":
        return "selection unit count"
    measure = run.plan.measure(name)
    return f"{measure.kind}{' (AVG/VARIANCE part)' if measure.centred or measure.counts_values_of else ''}"


def _shown(vector: dict | None, limit: int = 6) -> str:
    items = sorted((vector or {}).items(), key=repr)
    text = ", ".join(f"{key}: {value}" for key, value in items[:limit])
    return "{" + text + (", ..." if len(items) > limit else "") + "}"
