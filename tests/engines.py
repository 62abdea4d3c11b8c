"""One fixture, two engines: the same tables and policy on DuckDB and on Spark.

Engine-facing tests take ``engine`` (parametrized "duckdb" and "spark") and open connections with
``engine.connect(data, policy=..., **options)``, where ``data`` is what ``dpsql.connect`` takes on
DuckDB (a dict of DataFrames, an open DuckDB connection or a file path). On Spark the same rows
become temporary views of the shared local session (``tests/spark.py``), each column of the
Spark type of its DuckDB type (``dpsql.backends.spark.types.spark_type``), so both engines read the
same values under the same names. Spark cases are marked ``spark`` (one xdist group).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import duckdb
import pytest

import dpsql


class Engine:
    """How a test opens a connection on one engine (module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self._opened: list = []
        self._views: list[str] = []
        self._tmp: str | None = None

    def connect(self, data, policy, **options):
        options.setdefault("ledger", ":memory:")
        if self.name == "duckdb":
            db = dpsql.connect(data, policy=policy, **options)
        else:
            db = dpsql.connect(self.load(data), policy=policy, **options)
        self._opened.append(db)
        return db

    def load(self, data, *, forget: bool = True):
        """The shared Spark session with ``data``'s tables as temporary views (replacing any of
        the same name) and, unless ``forget`` is false, no bounded copy left from another test."""
        from spark import session

        from dpsql.backends.spark.types import spark_type

        spark = session()
        if forget:
            forget_copies(spark)
        owned = not isinstance(data, duckdb.DuckDBPyConnection)
        con = duckdb.connect() if isinstance(data, dict) else data if not owned else duckdb.connect(str(data),
                                                                                                   read_only=True)
        try:
            if isinstance(data, dict):
                for name, frame in data.items():
                    con.register("dp_frame", frame)
                    con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM dp_frame')
                    con.unregister("dp_frame")
            tables = [row[0] for row in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                "AND database_name = current_database() UNION SELECT view_name FROM duckdb_views() "
                "WHERE schema_name = 'main' AND database_name = current_database() AND NOT internal").fetchall()]
            for table in tables:
                # Through a Parquet file, as real Spark tables arrive: read in the JVM (a frame
                # made from Python rows would start Python workers for every job), each column
                # then cast to the Spark type of its DuckDB type.
                columns = con.execute(f'DESCRIBE "{table}"').fetchall()
                path = os.path.join(self._directory(), f"{table}.parquet")
                con.execute(f"COPY (SELECT * FROM \"{table}\") TO '{path}' (FORMAT PARQUET)")
                listed = ", ".join(f"CAST(`{c[0]}` AS {spark_type(c[1])}) AS `{c[0]}`" for c in columns)
                spark.read.parquet(path).createOrReplaceTempView("dp_test_raw")
                spark.sql(f"SELECT {listed} FROM dp_test_raw").createOrReplaceTempView(table)
                self._views.append(table)
        finally:
            if owned or isinstance(data, dict):
                con.close()
        return spark

    def _directory(self) -> str:
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="dpsql-spark-")
        return self._tmp

    def close(self) -> None:
        for db in self._opened:
            db.close()
        if self.name == "spark" and self._views:
            from spark import session

            spark = session()
            forget_copies(spark)
            for view in self._views:
                spark.catalog.dropTempView(view)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def forget_copies(spark) -> None:
    """Drop every bounded copy and stored relation dpsql left in the session (tests reuse table
    names with other rows, under fixed salts: a copy must never outlive its test)."""
    from dpsql.backends import spark as backend

    for table in spark.catalog.listTables():
        if table.isTemporary and table.name.startswith(backend.OWN_PREFIXES):
            spark.catalog.uncacheTable(f"`{table.name}`")
            spark.catalog.dropTempView(table.name)
    backend.forget_session(spark)


ENGINES = [pytest.param("duckdb", id="duckdb"),
           pytest.param("spark", id="spark", marks=[pytest.mark.spark, pytest.mark.xdist_group("spark")])]


@pytest.fixture(params=ENGINES)
def engine(request):
    """Each engine in turn (Spark cases marked ``spark``)."""
    opened = Engine(request.param)
    yield opened
    opened.close()
