"""The only module that talks to Spark: the ``Backend`` (``dpsql.backends.base``) on a SparkSession.

``dpsql.connect(spark, policy=...)`` wraps a pyspark ``SparkSession`` (local, a standalone or
YARN cluster, or Spark Connect) whose catalog holds the policy's tables: tables of the current
database or temporary views. Everything above the backend is the same as on DuckDB: the plan
is a sqlglot tree, rendered here in Spark SQL (``dpsql.backends.render``), and only dpsql's own
generated SQL ever reaches ``spark.sql`` — never analyst text, never a file path
(``parquet.`/path```), a ``SET``, a catalog or reflection function: the generated SQL names
only the policy's tables, their bounded copies and the stored public relations.

What runs where. On the cluster: the bounded copies (cached temporary views, built once per
connection and rebuilt by ``refresh()``), and every per-row and per-group computation of a
query. Here, in the Python process: the plan, the key read-back, the noise, the ledger (a
local SQLite file) and post-processing of released rows (in a private, empty DuckDB: released
values are all it sees, exactly as on the DuckDB backend).

Types cross the seam as DuckDB type names (``dpsql.backends.spark.types.duckdb_type``), so the
binding and analysis stages are the ones DuckDB uses; a Spark column of a type with no exact
counterpart is left out of the catalog (an analyst cannot name it). Settings dpsql relies on are
pinned on the session (``dpsql.backends.spark.session.PINNED``: ANSI mode, UTC, the binary
collation, no cache pruning) and checked before every statement.

Deadlines. Every statement runs under a job tag; the shared watchdog (``dpsql.backends.deadline``)
interrupts the tag past the limit, and the statement raises ``QueryFailed`` whatever it was doing.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlglot import exp

from dpsql.analysis.plan import GroupKey
from dpsql.backends import facts
from dpsql.backends.bounding import BoundedTable, raw_rows_columns, raw_rows_name
from dpsql.backends.deadline import DEFAULT_QUERY_TIMEOUT, Deadline, check_timeout
from dpsql.backends.duckdb import released_database
from dpsql.backends.keys import read_keys
from dpsql.backends.render import render as render_tree  # not `render`: the name of this package's module spark.render
from dpsql.backends.spark.bounding import fill_select, name_of, raw_rows_select, table_of
from dpsql.backends.spark.check import check_spark
from dpsql.backends.spark.config import is_spark_config, load_spark_config, open_session
from dpsql.backends.spark.keys import duckdb_key_text, value_key
from dpsql.backends.spark.pieces import SparkSQL
from dpsql.backends.spark.session import check_pinned, copy_partitions, is_spark_session, pin, size_shuffles
from dpsql.backends.spark.types import duckdb_type, spark_type
from dpsql.errors import DPError, InvalidParameter, QueryFailed, UnsupportedQuery
from dpsql.sql.names import Catalog
from dpsql.sql.pieces import binding_parameters

OWN_PREFIXES = ("dp_bounded_", "dp_raw_rows_", "dp_public_")
"""Temporary views dpsql creates in the session: never part of the analyst's catalog."""


class SparkEngine:
    """A Spark session dpsql runs its generated SQL on (module docstring)."""

    dialect: str = SparkSQL()
    """Spark SQL with the catalog's column types (``render.SparkSQL``), set when the catalog is read."""

    def __init__(self, session: Any, *, query_timeout: float | None = DEFAULT_QUERY_TIMEOUT,
                 path: Path | None = None):
        self.path = path
        """The Spark config file it was opened from (``dpsql.backends.spark.config``), if any: the
        default ledger sits beside it."""
        self._spark = session
        self._timeout = check_timeout(query_timeout)
        pin(session)
        size_shuffles(session)
        self._lock = threading.RLock()
        self._bounded: dict[str, BoundedTable] = {}
        self._salt: str | None = None
        self._shared = _shared_state(session)
        self._described: dict[str, list[tuple[str, str]]] = {}
        self._own_types: dict[str, str] = {}
        """Column types of the tables dpsql makes itself and its statements compute on (the
        row-count tables), beside the catalog's in ``dialect``."""
        self.progress: Callable[[str], contextlib.AbstractContextManager] = _no_progress
        """Part of the ``Backend`` protocol; Spark caches its copies within the statements that
        read them, so no build of its own is shown."""
        self.post_processing = released_database(self._timeout)
        """Where released values are post-processed: a private, empty DuckDB that sees nothing
        else (``dpsql.backends.duckdb.released``), exactly as on the DuckDB backend."""
        self._closed = False

    @property
    def timeout(self) -> float | None:
        """Seconds one statement may run (``None``: no limit)."""
        return self._timeout

    # ---- schema and public facts ----------------------------------------------------------

    def catalog(self) -> Catalog:
        """Tables of the session's current database and its temporary views (which shadow tables
        of the same name, as Spark resolves names): {table: {column: DuckDB type}}. A column whose
        Spark type has no exact DuckDB counterpart is left out. Reads schemas only."""
        from dpsql.backends.spark.render import column_types

        catalog = Catalog()
        listed = sorted(self._spark.catalog.listTables(), key=lambda table: not table.isTemporary)
        for table in listed:
            key = table.name.lower()
            if key.startswith(OWN_PREFIXES) or key in catalog:
                continue
            fields = self._spark.table(name_of(table.name)).schema.fields
            catalog[key] = {}
            catalog.spellings[key] = table.name
            for field in fields:
                type_name = duckdb_type(field.dataType)
                if type_name is not None:
                    catalog[key][field.name.lower()] = type_name
                    catalog.spellings.setdefault(field.name.lower(), field.name)
        self.dialect = SparkSQL({**column_types(catalog), **self._own_types})
        return catalog

    def check(self, tree: exp.Expr, private: bool) -> None:
        """Refuse, before anything is charged, a checked analyst query whose Spark rendering
        would not mean what it means on DuckDB (``dpsql.backends.spark.check.check_spark``).
        ``private``: it reads a private table, so its aggregates are dpsql's own rewrite (exact
        integer sums; per-unit float sums a sorted fold, ``spark.pieces._ordered_sum``) and what
        combines released values runs in DuckDB: only what Spark evaluates on rows is checked."""
        self._check_settings()
        check_spark(tree, getattr(self.dialect, "types", {}), private=private)

    def _check_settings(self) -> None:
        """Refuse when the session's pinned settings changed (checked before the charge, in
        ``check``, and again before every statement)."""
        wrong = check_pinned(self._spark)
        if wrong is not None:
            raise DPError(f"the Spark session's settings changed: {wrong}",
                          hint="leave the session dpsql wraps to dpsql (give it spark.newSession())")

    def describe(self, statement: exp.Expression | str, parameters: Any = None) -> list[tuple[str, str]]:
        """(name, DuckDB type) of each column: Spark analyses the statement (schema only, no job)."""
        sql = _rendered(statement, self.dialect)
        known = self._described.get(sql)
        if known is not None:
            return known
        parameters = binding_parameters(statement, parameters)
        try:
            fields = self._spark.sql(sql, args=parameters or None).schema.fields
        except Exception as error:  # analysis reads the schema and the text only
            # Spark's class of error only: its text quotes the analysed plan, which holds the
            # salt wherever a salted hash is part of the failing expression.
            raise UnsupportedQuery(f"the query does not bind on Spark ({_condition(error)})",
                                   hint="check the types of the values the query compares and combines") from None
        described = []
        for field in fields:
            type_name = duckdb_type(field.dataType)
            if type_name is None:
                raise UnsupportedQuery(f"column {field.name} would be of Spark type "
                                       f"{field.dataType.simpleString()}, which dpsql does not read back exactly",
                                       hint="cast it to a number, a string or a date")
            described.append((field.name, type_name))
        with self._lock:
            if len(self._described) >= 512:
                self._described.pop(next(iter(self._described)))
            self._described[sql] = described
        return described

    def materialise(self, statement: exp.Expression | str) -> str:
        """Store the rows of a public statement once, cached, before the charge (invariant 15)."""
        sql = _rendered(statement, self.dialect)
        name = "dp_public_" + hashlib.sha256(sql.encode()).hexdigest()[:20]
        with self._shared.lock:
            if name not in self._shared.materialised:
                self._run(lambda: self._spark.sql(f"CACHE TABLE {name_of(name)} AS {sql}").collect())
                self._shared.materialised.add(name)
        return name

    def stored_reference(self, name: str) -> exp.Table:
        return exp.table_(name, quoted=True)

    def key_multiplicity(self, stored: str, keys: Sequence[str]) -> int:
        return facts.multiplicity(self.fetch(facts.multiplicity_sql(name_of(stored), keys, name_of)))

    def column_ranges(self, stored: str, columns: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        if not columns:
            return {}
        return facts.ranges(self.fetch(facts.ranges_sql(name_of(stored), columns, name_of))[0], columns)

    def cast_error(self, value: str, type_name: str) -> str | None:
        """Spark's first line when the constant does not cast (ANSI: a bad cast raises)."""
        try:
            self._spark.sql(f"SELECT CAST(:v AS {spark_type(type_name)})", args={"v": value}).collect()
        except Exception as error:  # the constant and the type only: no data
            return _first_line(error)
        return None

    def public_generation(self) -> int:
        return self._shared.generation

    def time_zone(self) -> str:
        return "UTC"  # pinned (spark_session.PINNED)

    # ---- bounded copies -------------------------------------------------------------------

    def prepare_bounding(self, tables: list[BoundedTable], salt: str) -> None:
        """Define each copy as a lazy temporary view (Spark analyses it, reads no rows), so
        queries over it bind; the first query that reads it caches it (``_fill``)."""
        with self._lock:
            self._salt = salt
            for table in tables:
                self._bounded[table.name] = table
            self._own_types.update(_row_count_types(tables))
            self.dialect = SparkSQL({**getattr(self.dialect, "types", {}), **self._own_types})
            with self._shared.lock:
                for table in tables:
                    if table.name not in self._shared.defined:
                        self._define(table)

    def build_bounding(self) -> None:
        """Nothing now: on Spark each copy is built when a query first reads it (``_fill``), so a
        connection or ``dpsql serve`` opened with ``eager_bounding`` is ready without reading a
        row (a cluster's copy build takes minutes at scale; the server should answer its
        clients' logins meanwhile). A query's time then includes the build once, as it would
        have in a connection opened lazily."""

    def refresh_bounding(self) -> None:
        """Drop every cached copy and stored public relation of this session; Spark re-reads the
        source tables (``refreshTable``: new files of a Parquet table are seen) when each is next built."""
        with self._lock:
            self._described.clear()
            with self._shared.lock:
                for name in [*self._shared.filled, *self._shared.materialised]:
                    self._spark.catalog.uncacheTable(name_of(name))
                for name in self._shared.materialised:
                    self._spark.catalog.dropTempView(name)
                for table in self._bounded.values():
                    try:
                        self._spark.catalog.refreshTable(table_of(table.source))
                    except Exception:  # a temporary view over a DataFrame has nothing to refresh
                        pass
                self._shared.filled.clear()
                self._shared.materialised.clear()
                self._shared.defined.clear()
                self._shared.generation += 1
                for table in self._bounded.values():
                    self._define(table)

    def _define(self, table: BoundedTable) -> None:
        """(Re)define ``table``'s copy (and row-count table) as views over its source with this
        engine's salt (the caller holds the shared lock)."""
        partitions = copy_partitions(self._spark, self._spark.table(table_of(table.source)))
        self._spark.sql(fill_select(table, partitions), args={"salt": self._salt}).createOrReplaceTempView(table.name)
        if not table.row_level:
            self._spark.sql(raw_rows_select(table)).createOrReplaceTempView(raw_rows_name(table.name))
        self._shared.defined[table.name] = self._salt

    def _fill(self, sources: Iterable[str]) -> None:
        """Cache the copy of every private table in ``sources`` not yet built with this engine's
        salt (an engine of another ledger on the same session redefines it with its own: either
        copy is a stable transformation by a secret salt). No deadline: the SQL is dpsql's own."""
        wanted = frozenset(sources)
        with self._shared.lock:
            for name, table in self._bounded.items():
                if table.source not in wanted or self._shared.filled.get(name) == self._salt:
                    continue
                if self._shared.defined.get(name) != self._salt:
                    self._spark.catalog.uncacheTable(name_of(name))
                    self._define(table)
                self._spark.sql(f"CACHE TABLE {name_of(name)}").collect()
                if not table.row_level:
                    self._spark.sql(f"CACHE TABLE {name_of(raw_rows_name(name))}").collect()
                self._shared.filled[name] = self._salt

    # ---- running generated SQL ------------------------------------------------------------

    def fetch(self, sql: str, parameters: Any = None, *, bounded: Iterable[str] = ()) -> list[tuple]:
        """Run generated Spark SQL and return every row as Python values (``value_key``)."""
        self._fill(bounded)
        rows = self._run(lambda: self._spark.sql(sql, args=parameters or None).collect())
        return [tuple(_python(value) for value in row) for row in rows]

    def hold(self, name: str, sql: str, parameters: Any = None, *, bounded: Iterable[str] = ()) -> bool:
        """Spark keeps no held table (its copies are cached already): False, nothing stored."""
        return False

    def drop_held(self, name: str) -> None:
        """Nothing to drop (``hold`` stores nothing)."""

    def fetch_df(self, statement: exp.Expression | str) -> Any:
        sql = _rendered(statement, self.dialect)
        return self._run(lambda: self._spark.sql(sql).toPandas())

    def _run(self, action):
        """``action`` under this engine's deadline, its jobs tagged so the watchdog can stop them."""
        self._check_settings()
        tags = _JobTags(self._spark)
        with tags:
            with Deadline(tags, self._timeout):
                try:
                    return action()
                except Exception as error:
                    raise QueryFailed(f"the query failed on Spark: {type(error).__name__}") from None

    def key_text(self, raw: Any, type_name: str) -> str | None:
        """A text-form key as fetched (Spark's text, UTF-8) as DuckDB's text of the same value."""
        return duckdb_key_text(raw, type_name)

    def key_value(self, value: Any, type_name: str) -> Any:
        """A value-form key as fetched, as DuckDB's client gives it."""
        return value_key(value, type_name)

    def read_keys(self, rows: list[tuple], keys: Sequence[GroupKey]) -> list[tuple]:
        """Fetched rows with their keys as DuckDB reads them back: Spark's key texts and values
        translated (``key_text``, ``key_value``)."""
        return read_keys(rows, keys, text=self.key_text, value=self.key_value)

    def close(self) -> None:
        """Close the post-processing DuckDB; the session is the caller's and stays open (its
        copies stay cached for other connections on it until they refresh or the session stops)."""
        self._closed = True
        self.post_processing.close()


def recognise(target: Any) -> bool:
    """A SparkSession, or a Spark config file (``*.spark.toml``, ``dpsql.backends.spark.config``)."""
    return is_spark_session(target) or is_spark_config(target)


def open_spark(target: Any, *, query_timeout: float | None, memory_limit: str | None,
               copies: Path | None = None) -> SparkEngine:
    """The engine on a SparkSession, or on the session a Spark config file describes
    (``dpsql.backends.registry``). DuckDB's options are refused: Spark sizes and stores itself."""
    if copies is not None:
        raise InvalidParameter("persist_copies is DuckDB's: a Spark session keeps its copies in its own storage",
                               hint="leave persist_copies off")
    if memory_limit is not None:
        raise InvalidParameter("memory_limit is DuckDB's; a Spark session is sized by its own settings",
                               hint="leave memory_limit out, and set spark.driver.memory / spark.executor.memory")
    if is_spark_session(target):
        return SparkEngine(target, query_timeout=query_timeout)
    config = load_spark_config(target)
    return SparkEngine(open_session(config), query_timeout=query_timeout, path=config.path)


class _JobTags:
    """The jobs of one statement, under a fresh tag, and what ``Deadline`` interrupts: every job
    of that tag, its running tasks included.

    On classic Spark the tag and ``interruptOnCancel`` are thread-local properties of the
    SparkContext (pyspark pins each Python thread to a JVM thread), and ``cancelJobsWithTag``
    from the watchdog's thread stops them: the session-level ``interruptTag`` of classic Spark
    4 found no operation to stop in a local session (measured: it returned [] and the job ran
    on). A Spark Connect session has no SparkContext here; its server runs each operation
    under the session's tags, and ``interruptTag`` stops them.
    """

    def __init__(self, session: Any):
        self._session = session
        self._tag = f"dpsql-{uuid.uuid4().hex}"
        try:
            self._context = session.sparkContext
        except Exception:  # Spark Connect
            self._context = None

    def __enter__(self) -> "_JobTags":
        if self._context is not None:
            self._context.addJobTag(self._tag)
            self._context.setInterruptOnCancel(True)
        else:
            self._session.addTag(self._tag)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._context is not None:
            self._context.removeJobTag(self._tag)
        else:
            self._session.removeTag(self._tag)

    def interrupt(self) -> None:
        if self._context is not None:
            self._context.cancelJobsWithTag(self._tag)
        else:
            self._session.interruptTag(self._tag)


class _Shared:
    """What every engine on one Spark session shares: its temporary views are the session's."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.defined: dict[str, str | None] = {}
        """Copy name -> the salt its view was last defined with."""
        self.filled: dict[str, str | None] = {}
        """Copy name -> the salt it was last cached with."""
        self.materialised: set[str] = set()
        self.generation = 0


_SHARED: "weakref.WeakKeyDictionary[Any, _Shared]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def forget_session(session: Any) -> None:
    """Forget what engines recorded of ``session``'s copies (after its views were dropped)."""
    with _SHARED_LOCK:
        _SHARED.pop(session, None)


def _shared_state(session: Any) -> _Shared:
    with _SHARED_LOCK:
        state = _SHARED.get(session)
        if state is None:
            state = _SHARED[session] = _Shared()
        return state


def _row_count_types(tables: Iterable[BoundedTable]) -> dict[str, str]:
    """``table.column`` -> DuckDB type of each unit table's row-count table (``bounding.raw_rows_columns``):
    the estimates of rows beyond the limits compute on its ``r`` (``dpsql.curator.dropped``, ``dpsql.query.bias``)."""
    return {f"{raw_rows_name(table.name).lower()}.{column}": type_name
            for table in tables if not table.row_level for column, type_name in raw_rows_columns(table).items()}


def _rendered(statement: exp.Expression | str, dialect: str) -> str:
    return statement if isinstance(statement, str) else render_tree(statement, dialect)


@contextlib.contextmanager
def _no_progress(label: str):
    yield


def _first_line(error: BaseException) -> str:
    return str(error).strip().split("\n")[0]


def _condition(error: BaseException) -> str:
    """Spark's error class (``DATATYPE_MISMATCH.HASH_MAP_TYPE``), never its message.

    >>> _condition(ValueError("[DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION] Decimal precision 39 ..."))
    'DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION'
    >>> _condition(ValueError("no class here: 'secret'"))
    'an analysis error'
    """
    for method in ("getCondition", "getErrorClass"):
        try:
            condition = getattr(error, method)()
        except Exception:
            continue
        if isinstance(condition, str) and re.fullmatch(r"[A-Z0-9_.]+", condition):
            return condition
    found = re.match(r"\[([A-Z0-9_.]+)\]", _first_line(error))
    return found.group(1) if found else "an analysis error"



def _python(value: Any) -> Any:
    """A fetched value as DuckDB's client gives the same value: bytes, not bytearray; a
    ``DECIMAL(38, 0)`` exact sum as an int (DuckDB's HUGEINT)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, decimal.Decimal) and value == value.to_integral_value() and value.as_tuple().exponent == 0:
        return int(value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value
    return value
