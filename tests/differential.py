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

A case's databases live in memory or in a DuckDB file whose writes are all still in its WAL
(``Case.storage``, issue 21), and its added rows are stored after the base rows or before them
(``Case.extra_first``): where an added unit is stored is the adversary's choice too.

``order_violations(case)`` checks the storage-order metamorphic property (issue 21): the same
rows stored in another order (reversed, a seeded shuffle; one row per INSERT, so the stored
order is the list's) give the same exact measures and the same end-to-end answers under the
same seed. Identity is exact, so nothing may depend on where a row is stored.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import zlib
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

    def create_sql(self, extra_rows: tuple[tuple[str, ...], ...] = (), extra_first: bool = False) -> str:
        rows = extra_rows + self.rows if extra_first else self.rows + extra_rows
        values = ", ".join(f"({', '.join(row)})" for row in rows)
        insert = f'; INSERT INTO "{self.name}" VALUES {values}' if rows else ""
        return self.empty_sql() + insert

    def empty_sql(self) -> str:
        definition = ", ".join(f'"{name}" {type_name}' for name, type_name in self.columns)
        return f'CREATE TABLE "{self.name}" ({definition})'

    def insert_one_by_one(self, rows: tuple[tuple[str, ...], ...]) -> list[str]:
        """The table created empty, then one INSERT per row: DuckDB appends each, so the stored
        order is the list's."""
        return [self.empty_sql(), *(f'INSERT INTO "{self.name}" VALUES ({", ".join(row)})' for row in rows)]


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
    storage: str = "memory"
    """Where both neighbours' databases live: ``memory``, or ``wal`` — a DuckDB file whose writes
    are all still in its write-ahead log (never checkpointed)."""
    extra_first: bool = False
    """True when each neighbour stores its extra rows (the unit) before the base rows."""

    @property
    def neighbours(self) -> tuple[tuple, tuple]:
        """The extra private rows of each side of the pair."""
        if self.replacement is None:
            return (), self.unit
        return self.unit, self.replacement

    def reproduction(self) -> str:
        """The case as text: what to paste into a bug report."""
        lines = [f"family: {self.family}", f"policy: {' '.join(self.policy.split())}", f"sql: {self.sql}"]
        if self.storage != "memory" or self.extra_first:
            lines.append(f"storage: {self.storage}" + (", the unit's rows stored first" if self.extra_first else ""))
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
    """``outcome``, ``sensitivity``, ``quantile``, ``keys`` or ``order`` (storage order)."""
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
    rows: tuple = ()
    """The whole noisy answer, every row's repr, sorted (for the storage-order property)."""


STORAGES = ("memory", "wal")
"""Where a case's databases live (``Case.storage``)."""

ORDERS = ("given", "reversed", "shuffled")
"""How ``fill_database`` may store a side's rows one by one: as listed, reversed, or shuffled with
a seed drawn from the case's text."""

WAL_SETTINGS = {"checkpoint_threshold": "1GB", "wal_autocheckpoint": "1GB"}
"""A file database's settings: DuckDB never checkpoints on its own, so every write of a case
stays in the WAL (they are well below the thresholds)."""
WAL_LIMIT = 64 << 20
"""A file whose WAL has grown past this (tables dropped case after case) is replaced by a new one."""


class Databases:
    """DuckDB databases for the two sides of a pair, emptied and reused from case to case
    (opening one costs about 50 ms, more than a case's queries): per storage, one per side,
    opened when first used. ``wal`` databases are files in a temporary directory that lives
    as long as this object, never checkpointed until closed."""

    def __init__(self):
        self._connections: dict[tuple[str, int], duckdb.DuckDBPyConnection] = {}
        self._directory: str | None = None
        self._files = 0

    def connection(self, storage: str, side: int) -> duckdb.DuckDBPyConnection:
        if storage not in STORAGES:
            raise ValueError(f"unknown storage {storage!r}")
        key = (storage, side)
        if key in self._connections and storage == "wal" and self.wal_size(side) > WAL_LIMIT:
            self._connections.pop(key).close()
        if key not in self._connections:
            self._connections[key] = duckdb.connect() if storage == "memory" else self._open_file()
        return self._connections[key]

    def _open_file(self) -> duckdb.DuckDBPyConnection:
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="dpsql-differential-")
        self._files += 1
        return duckdb.connect(os.path.join(self._directory, f"side{self._files}.duckdb"), config=WAL_SETTINGS)

    def wal_size(self, side: int) -> int:
        """The size of side ``side``'s WAL file (0 if it has none)."""
        connection = self._connections.get(("wal", side))
        if connection is None:
            return 0
        (path,) = connection.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                                     ).fetchone()
        return os.path.getsize(path + ".wal") if os.path.exists(path + ".wal") else 0

    def load(self, side: int, case: Case, extra_rows: tuple, order: str | None = None) -> duckdb.DuckDBPyConnection:
        """Side ``side``'s database, holding nothing but the case's tables (with ``extra_rows``)."""
        connection = self.connection(case.storage, side)
        connection.execute("DETACH DATABASE IF EXISTS dp_bounding")
        for (name,) in connection.execute("SELECT table_name FROM duckdb_tables() "
                                          "WHERE database_name = current_database()").fetchall():
            connection.execute(f'DROP TABLE "{name}"')
        fill_database(connection, case, extra_rows, order)
        return connection

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def stored_rows(case: Case, extra_rows: tuple, order: str | None = None) -> tuple[tuple[str, ...], ...]:
    """The private table's rows of one neighbour in the order they are stored."""
    rows = extra_rows + case.private.rows if case.extra_first else case.private.rows + extra_rows
    if order in (None, "given"):
        return rows
    if order == "reversed":
        return rows[::-1]
    if order == "shuffled":
        shuffled = list(rows)
        random.Random(case.reproduction()).shuffle(shuffled)
        return tuple(shuffled)
    raise ValueError(f"unknown order {order!r}")


def fill_database(connection: duckdb.DuckDBPyConnection, case: Case, extra_rows: tuple,
                  order: str | None = None) -> None:
    """The case's public tables and its private table plus ``extra_rows``, built from SQL so every
    column has exactly the DuckDB type the case names (HUGEINT, UUID, TIMESTAMP_NS, collated
    VARCHAR...), which DataFrames cannot all carry. With an ``order`` (``ORDERS``) the private
    rows are inserted one per statement in that order, so they are stored in it."""
    for table in case.public:
        connection.execute(table.create_sql())
    if order is None:
        connection.execute(case.private.create_sql(extra_rows, case.extra_first))
        return
    for statement in case.private.insert_one_by_one(stored_rows(case, extra_rows, order)):
        connection.execute(statement)


def observe(case: Case, extra_rows: tuple, seed: int, databases: Databases | None = None, side: int = 0,
            order: str | None = None) -> Side:
    """Run the case's query on one neighbour (the base rows plus ``extra_rows``, stored in
    ``order``): end to end, then with noise off. ``databases`` reuses a database for the side;
    without, one is opened (for a ``wal`` case, a file in a temporary directory)."""
    if databases is not None:
        return _observe_on(databases.load(side, case, extra_rows, order), case, seed)
    databases = Databases()
    try:
        return _observe_on(databases.load(side, case, extra_rows, order), case, seed)
    finally:
        databases.close()


def observe_on_spark(case: Case, extra_rows: tuple, seed: int, databases: Databases, side: int, spark) -> Side:
    """``observe`` on Spark: the neighbour's tables, built in DuckDB by ``databases`` (which must not
    be one dpsql opened: dpsql walls in what it opens), become views of the shared Spark session
    through ``spark`` (a ``tests/engines.Engine("spark")``, which also drops every bounded copy
    an earlier case left), and dpsql runs there under the same fixed salt and seed."""
    session = spark.load(databases.load(side, case, extra_rows))
    return _observe_on(session, case, seed, ledger=":memory:")


def _observe_on(connection, case: Case, seed: int, **options) -> Side:
    try:
        with fixed_salt():
            db = dpsql.connect(connection, policy=case.policy, rng=SeededSource(seed), **options)
    except dpsql.DPError as error:  # a policy the schema refutes: the same on both sides
        return Side(outcome=(type(error).__name__, str(error)), exact_error="not connected")
    with db:
        outcome, rows = _answer(db, case)
        seen = Side(outcome=outcome, rows=rows)
        try:
            seen.exact = exact_run(db, case.sql)
        except dpsql.DPError as error:
            seen.exact_error = f"{type(error).__name__}: {error}"
        except Exception as error:  # what the engine would turn into a QueryFailed
            seen.exact_error = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return seen


def _answer(db, case: Case) -> tuple[tuple, tuple]:
    """('answer', the released key columns, sorted) or (error class, message); and the whole
    answer's rows, sorted."""
    try:
        result = db.sql(case.sql)
    except dpsql.DPError as error:
        return (type(error).__name__, str(error)), ()
    except Exception as error:  # never acceptable: every failure must reach the analyst as a DPError
        return (f"unexpected {type(error).__name__}", str(error).splitlines()[0]), ()
    rows = result.fetchall()
    return ("answer", tuple(sorted(repr(row[:case.keys]) for row in rows))), tuple(sorted(map(repr, rows)))


def violations(case: Case, seed: int = 0, databases: Databases | None = None,
               orders: tuple[str, ...] = ()) -> list[Violation]:
    """Every property the case breaks (empty: it holds on this pair). With ``orders``, the
    storage-order property too: neighbour B, observed with its rows stored one by one as listed,
    is the reference for the same rows stored in each of ``orders``."""
    return observe_pair(case, seed, databases, orders)[1]


def observe_pair(case: Case, seed: int = 0, databases: Databases | None = None,
                 orders: tuple[str, ...] = ()) -> tuple[list[Side], list[Violation]]:
    """What the two neighbours showed, and every property the case breaks (``violations``)."""
    sides = [observe(case, extra, seed, databases, side, order="given" if orders and side else None)
             for side, extra in enumerate(case.neighbours)]
    return sides, judge(sides) + _order_found(case, sides[1], seed, databases, orders)


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
        tag = " vs ".join(sorted({a[0], b[0]})) if a[0] != b[0] else f"{a[0]} with different messages"
        found.append(Violation("outcome", f"neighbour A ends in {a[0]}: {a[1]!r}; neighbour B in {b[0]}: {b[1]!r}",
                               tag))
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


def order_violations(case: Case, seed: int = 0, databases: Databases | None = None,
                     orders: tuple[str, ...] = ORDERS[1:]) -> list[Violation]:
    """The storage-order metamorphic property on neighbour B (the one holding the adversarial
    unit): its rows stored one by one as listed, then in each of ``orders``, must show the same
    outcome, the same noisy answer under one seed, and the same exact measures and histograms."""
    first = observe(case, case.neighbours[1], seed, databases, 1, order="given")
    return _order_found(case, first, seed, databases, orders)


def an_order(case: Case) -> str:
    """One of the orders other than as listed, chosen by the case's text (the suite checks one
    per case, the bench both)."""
    return ORDERS[1 + zlib.crc32(case.reproduction().encode()) % (len(ORDERS) - 1)]


def _order_found(case: Case, first: Side, seed: int, databases: Databases | None,
                 orders: tuple[str, ...]) -> list[Violation]:
    found = []
    for order in orders:
        other = observe(case, case.neighbours[1], seed, databases, 1, order=order)
        found += [Violation("order", f"stored {order}, {what}: {a} vs {b}", f"storage order changes {what}")
                  for what, a, b in _differences(first, other)]
    return found


def _differences(a: Side, b: Side) -> list[tuple[str, object, object]]:
    """What tells two observations of the same rows apart: (what, one, other)."""
    found = []
    if a.outcome != b.outcome:
        found.append(("the outcome", a.outcome, b.outcome))
    elif a.rows != b.rows:
        found.append(("the noisy answer", _cut(a.rows), _cut(b.rows)))
    if a.exact_error != b.exact_error:
        found.append(("whether the exact SQL fails", a.exact_error, b.exact_error))
    if a.exact is not None and b.exact is not None:
        for name in ("vectors", "histograms", "sensitivities", "histogram_bounds", "merged_keys"):
            one, other = getattr(a.exact, name), getattr(b.exact, name)
            if name == "merged_keys":  # listed in the order the rows came: compare as sets
                one, other = (sorted(" = ".join(sorted(m.split(" = "))) for m in v) for v in (one, other))
            if one != other:
                found.append((f"the exact {name.replace('_', ' ')}", _cut(one), _cut(other)))
    return found


def _cut(value: object, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
