"""The Spark session dpsql runs on: the settings it pins, and a local session for tests and the CLI.

dpsql's guarantees on Spark lean on a few session settings (DESIGN.md, "Spark facts"):

* ``spark.sql.ansi.enabled = true``: a cast, an overflow or a division by zero raises instead of
  becoming NULL or wrapping silently; the rendering marks every fallible expression total
  with ``try_*`` functions, as ``TRY`` on DuckDB (``dpsql.backends.render``).
* ``spark.sql.session.timeZone = UTC``: date parts and casts of TIMESTAMP values are taken in UTC,
  as on DuckDB (``dpsql.backends.duckdb.TIME_ZONE``).
* ``spark.sql.inMemoryColumnarStorage.partitionPruning = false``: a cached table keeps each
  batch's min and max, and a filter those prove false skips the batch without reading it, so
  ``WHERE uid = 424242`` would run faster when nobody has that id. Padding rows (as on DuckDB)
  cannot help there: they land in one batch only. The bounded copies are cached, so pruning is off.
* ``spark.sql.parquet.filterPushdown`` / ``spark.sql.orc.filterPushdown = false``: the same for
  row groups of the raw files, read once when a copy is built (no analyst filter reaches them,
  but the setting is pinned so that no later change makes one).
* ``spark.sql.session.collation.default = UTF8_BINARY``: strings compare byte for byte. Under a
  session default such as ``UTF8_LCASE`` the string literals of dpsql's generated SQL, and the
  strings its functions make, would compare 'a' = 'A' (DESIGN.md, "Spark facts"): keys, domains
  and units would merge. Spark 4.0 introduced the setting (then put it behind a flag); pyspark
  4.3, here, does not read it (with it set to UTF8_LCASE, 'a' = 'A' is still false): the pin
  keeps binary any Spark that does. A column of another collation (its own, or its schema's
  default) is left out of the catalog (``dpsql.backends.spark.types``).

``PINNED`` lists them; ``pin(session)`` sets them on the session dpsql is handed (it is dpsql's
from then on: give dpsql ``spark.newSession()`` if other code needs other settings) and
``check_pinned`` verifies them before every statement.
"""

from __future__ import annotations

import os
from typing import Any

PINNED = {
    "spark.sql.ansi.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.inMemoryColumnarStorage.partitionPruning": "false",
    "spark.sql.parquet.filterPushdown": "false",
    "spark.sql.orc.filterPushdown": "false",
    "spark.sql.caseSensitive": "false",
    "spark.sql.session.collation.default": "UTF8_BINARY",
}
"""Session settings dpsql's rendering and guarantees assume (module docstring)."""

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
}
"""Settings of a session ``local_session`` starts (no UI; its shuffles are sized by ``size_shuffles``)."""

COPY_PARTITION_BYTES = 32 * 2**20
"""Source bytes (Spark's estimate: the files' sizes, compressed) per partition of a bounded copy: a
quarter of the 128 MB Spark reads per file split, as the cached rows take about four times their
Parquet bytes."""


def local_session(master: str = "local[2]", app: str = "dpsql", config: dict[str, str] | None = None) -> Any:
    """A Spark session on ``master`` (``local[2]``, ``spark://host:7077``, or a Spark Connect
    address ``sc://host:15002``) with ``LOCAL_DEFAULTS``, ``config`` and ``PINNED``."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", _python())
    builder = SparkSession.builder.appName(app)
    builder = builder.remote(master) if master.startswith("sc://") else builder.master(master)
    for name, value in {**LOCAL_DEFAULTS, **(config or {}), **PINNED}.items():
        if master.startswith("sc://") and name.startswith(("spark.ui", "spark.driver")):
            continue  # a Spark Connect server's own settings
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    if not master.startswith("sc://"):
        session.sparkContext.setLogLevel("FATAL")  # a failed statement is dpsql's to report, not a log's
    return session


def parallelism(session: Any) -> int | None:
    """The cores the session's executors have (``defaultParallelism``); ``None`` on Spark Connect
    (no SparkContext here: its server sizes its own shuffles)."""
    try:
        return max(1, int(session.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect
        return None


def size_shuffles(session: Any) -> None:
    """Size the session's shuffles for interactive answers, where its owner left them unset.

    * ``spark.sql.adaptive.enabled = false``: under adaptive execution each shuffle of a query
      runs as a job of its own, planned when the one before ends, so a COUNT over a cached copy
      is two jobs (measured at 1M rows on local[2]: 0.45 s) instead of one job of two stages (0.19 s).
    * ``spark.sql.shuffle.partitions`` = the executors' cores: with nothing coalescing them, the
      default 200 would run a 50-key GROUP BY as 200 tasks. The copies are laid out by their own
      ``REPARTITION`` (``copy_partitions``), whatever this says.

    A setting the owner made (in the builder, ``spark-defaults.conf`` or ``conf.set``) is kept."""
    cores = parallelism(session)
    if cores is None:
        return
    for name, value in {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": str(cores)}.items():
        if session.conf.get(name, None) is None:
            session.conf.set(name, value)


def copy_partitions(session: Any, source: Any) -> int:
    """Partitions of the bounded copy of ``source`` (a DataFrame of the table): a multiple of the
    cores, one per ``COPY_PARTITION_BYTES`` of Spark's size estimate (the files' sizes: no rows
    are read), so that every core scans a share of the copy and no partition outgrows its task."""
    cores = parallelism(session)
    if cores is None:
        cores = int(session.conf.get("spark.sql.shuffle.partitions", "200"))
    try:
        size = int(source._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception:  # Spark Connect: no plan statistics here
        return cores
    if size >= 2**60:  # no estimate (spark.sql.defaultSizeInBytes: a catalog table without statistics)
        return max(cores, int(session.conf.get("spark.sql.shuffle.partitions", str(cores))))
    wanted = -(-size // COPY_PARTITION_BYTES)
    return cores * max(1, -(-wanted // cores))


def is_spark_session(target: Any) -> bool:
    """True for a pyspark SparkSession (classic or Spark Connect), without importing pyspark.

    >>> is_spark_session(object())
    False
    """
    return type(target).__module__.startswith("pyspark.sql") and type(target).__name__ == "SparkSession"


def pin(session: Any) -> None:
    """Set ``PINNED`` on ``session`` (runtime settings: no restart)."""
    for name, value in PINNED.items():
        session.conf.set(name, value)


def check_pinned(session: Any) -> str | None:
    """``None`` when every ``PINNED`` setting holds on ``session``, else the first that does not."""
    for name, value in PINNED.items():
        if str(session.conf.get(name, None)).lower() != value.lower():
            return f"{name} is {session.conf.get(name, None)!r}, dpsql needs {value!r}"
    return None


def _python() -> str:
    import sys

    return sys.executable
