"""A Spark database described by a small file: what ``dpsql serve`` (and every CLI command) opens
when the curator's data lives on Spark.

``dpsql.connect("shop.spark.toml", policy=...)`` — and so ``dpsql serve shop.spark.toml``,
``dpsql query``, ``dpsql shell``, ``dpsql init`` — starts (or joins) a Spark session and serves
the tables the file names::

    [spark]
    master = "local[2]"                # or "spark://host:7077", "yarn", "sc://host:15002" (Spark Connect)
    database = "default"               # tables of this catalog database are served (optional)
    ledger = "shop.duckdb.ledger"      # the budget's ledger file (optional; default: beside this file)

    [spark.config]                     # any Spark settings (optional)
    "spark.driver.memory" = "4g"

    [tables]                           # Parquet files or folders, served as tables of these names
    visits = "/data/shop/visits.parquet"
    stores = "/data/shop/stores.parquet"

Relative paths are read from the file's folder. The ledger is a local SQLite file beside the
config (``shop.spark.toml.ledger``) unless ``[spark] ledger`` or ``ledger=`` says otherwise: it, the
noise and the plan stay on this machine; the bounded copies and every per-row computation run on the
cluster. Data also served from a DuckDB file shares that file's ledger (``ledger =
"shop.duckdb.ledger"``): one dataset, one budget (``dpsql.budget.registry``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsql.errors import DPError

SUFFIX = ".toml"
"""A database path with this suffix is a Spark config file."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SparkConfig:
    """What a Spark config file says (module docstring)."""

    path: Path
    """The file itself (resolved): the default ledger sits beside it."""
    master: str = "local[2]"
    """Where Spark runs: ``local[n]``, a cluster manager URL, or a Spark Connect address ``sc://``."""
    database: str | None = None
    """The catalog database whose tables are served (``None``: the session's current one)."""
    settings: dict[str, str] = field(default_factory=dict)
    """Spark settings for the session (dpsql's pinned ones always win)."""
    tables: dict[str, Path] = field(default_factory=dict)
    """Table name -> Parquet file or folder, registered as temporary views."""
    ledger: Path | None = None
    """``[spark] ledger``: the budget's ledger file (``None``: ``<config>.ledger`` beside it)."""

    @property
    def ledger_path(self) -> Path:
        """The ledger this config's data is accounted in."""
        return Path(f"{self.path}.ledger") if self.ledger is None else self.ledger


def is_spark_config(target: Any) -> bool:
    """True for a path (str or Path) naming a Spark config file.

    >>> is_spark_config("shop.spark.toml"), is_spark_config("shop.duckdb"), is_spark_config({})
    (True, False, False)
    """
    return isinstance(target, (str, Path)) and str(target).endswith(SUFFIX)


def load_spark_config(path: str | Path) -> SparkConfig:
    """Read and check a Spark config file (every problem a ``DPError`` naming the key)."""
    source = Path(path)
    if not source.is_file():
        raise DPError(f"no Spark config file at {source}",
                      hint="write one: [spark] master = \"local[2]\" and [tables] name = \"file.parquet\"")
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise DPError(f"{source} is not a valid TOML file: {error}") from None
    unknown = set(data) - {"spark", "tables"}
    if unknown:
        raise DPError(f"{source}: unknown section [{sorted(unknown)[0]}]",
                      hint="use [spark], [spark.config] and [tables]")
    spark = data.get("spark", {})
    wrong = set(spark) - {"master", "database", "ledger", "config"}
    if wrong:
        raise DPError(f"{source}: unknown key spark.{sorted(wrong)[0]}",
                      hint="[spark] takes master, database, ledger and a [spark.config] table")
    settings = {str(k): str(v) for k, v in spark.get("config", {}).items()}
    tables = {}
    for name, location in data.get("tables", {}).items():
        if not _NAME.fullmatch(name) or not isinstance(location, str):
            raise DPError(f"{source}: [tables] {name} must be a plain name with a path in quotes",
                          hint='write visits = "/data/visits.parquet"')
        where = Path(location)
        tables[name] = where if where.is_absolute() else (source.parent / where)
    master = spark.get("master", "local[2]")
    database = spark.get("database")
    if not isinstance(master, str) or (database is not None and not _NAME.fullmatch(str(database))):
        raise DPError(f"{source}: spark.master must be a string and spark.database a plain name")
    ledger = spark.get("ledger")
    if ledger is not None and (not isinstance(ledger, str) or not ledger.strip()):
        raise DPError(f"{source}: spark.ledger must be a file path in quotes",
                      hint='write ledger = "/data/shop.duckdb.ledger"')
    return SparkConfig(source.resolve(), master, database, settings, tables,
                       None if ledger is None else (source.parent / Path(ledger).expanduser()).resolve())


def open_session(config: SparkConfig) -> Any:
    """The Spark session ``config`` describes, its tables registered (reads schemas, no rows)."""
    from dpsql.backends.spark.session import local_session

    session = local_session(config.master, config=config.settings)
    if config.database is not None:
        session.catalog.setCurrentDatabase(config.database)
    for name, location in config.tables.items():
        try:
            frame = session.read.parquet(str(location))
        except Exception as error:  # the curator's own files: the message is theirs to read
            raise DPError(f"cannot read table {name} from {location}: {str(error).splitlines()[0]}") from None
        frame.createOrReplaceTempView(name)
    return session
