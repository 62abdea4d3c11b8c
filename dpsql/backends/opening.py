"""Opening a target: the engine it runs on, where its ledger and copies live, where its data
came from, the policy that rules it and what the engine makes of the policy's listed keys
(``dpsql.connect``).

A SparkSession, or a Spark config file (``*.toml``, ``dpsql.backends.spark.config``), runs on
Spark (``dpsql.backends.spark``); anything else on DuckDB (``dpsql.backends.duckdb``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsql.backends.base import Backend
from dpsql.backends.bounding import bounded_tables
from dpsql.backends.duckdb.persisted import copies_directory
from dpsql.backends.registry import engine_for
from dpsql.backends.spark.config import is_spark_config, load_spark_config
from dpsql.backends.spark.session import is_spark_session
from dpsql.budget.ledger import LEDGER_SIDE_FILES, Ledger
from dpsql.budget.registry import check_second_budget, dataset_identity, release
from dpsql.budget.ruling import Claim, claim_dataset, ruling_policy
from dpsql.errors import InvalidParameter, PolicyError
from dpsql.policy.language import check_policy, load_policy
from dpsql.policy.model import Policy
from dpsql.sql.names import table_key
from dpsql.sql.types import is_numeric_type


@dataclass(frozen=True)
class Opened:
    """A target opened under its ruling policy, with its ledger (``open_target``)."""

    engine: Backend
    ledger: Ledger
    policy: Policy
    """The policy that rules: the one stored with the ledger, if any (``dpsql.budget.ruling``)."""
    stored: str | None
    """The policy text stored with the ledger when it was opened (``None``: none)."""
    claim: Claim
    """What the ledger accounts for (``dpsql.budget.ruling.claim_dataset``)."""
    catalog: dict[str, dict[str, str]]
    """Table key -> column name -> type, of every table (schema only)."""


def open_target(target: Any, policy: Any, ledger: Any, *, query_timeout: float | None, memory_limit: str | None,
                persist_copies: bool | str, separate_budget: bool, replacing: bool, eager_bounding: bool,
                progress: Callable | None) -> Opened:
    """Open ``target``'s engine and ledger, settle the policy that rules them, claim the dataset and
    prepare the bounded copies (``dpsql.connect``): before anything private is read or charged.
    What failed to open is closed again (and a registration it made forgotten)."""
    copies = copies_directory_for(target, ledger) if persist_copies else None
    # "read": the stored copies read in place, never written (the server's worker processes share them)
    shared = {"read_only_copies": True} if persist_copies == "read" else {}
    engine = open_engine(target, query_timeout=query_timeout, memory_limit=memory_limit, copies=copies, **shared)
    if progress is not None:
        engine.progress = progress
    try:
        if ledger is None and engine.path is None and engine.dialect != "duckdb":
            raise InvalidParameter(
                "a Spark-backed connection needs a ledger file: the budget must outlive this process",
                hint="pass ledger='/path/to/budget.ledger' (a local SQLite file; ':memory:' for a throwaway one)",
                hints={"cli": "give --ledger PATH"})
        if ledger is None and engine.path is not None:
            ledger = default_ledger(target if is_spark_config(target) else engine.path)
        file = ledger_file(ledger)
        if file is not None and not file.exists() and policy is not None:  # refused before the file is made
            check_second_budget(file, dataset_identity(load_policy(policy)), separate=separate_budget)
        opened = Ledger.open(ledger)
        claimed: Claim | None = None
        try:
            stored = opened.stored_policy()
            ruling = ruling_policy(opened, stored, policy, replacing)
            claimed = claim_dataset(opened, ruling, file, source_of(target, engine), separate_budget)
            catalog = engine.catalog()
            check_policy(ruling, catalog)
            check_listed_keys(ruling, catalog, engine)
            engine.prepare_bounding(bounded_tables(list(ruling.private_tables), catalog, table_key),
                                    opened.salt().hex())
            if eager_bounding:
                engine.build_bounding()
        except BaseException:
            if claimed is not None and claimed.registered is not None:  # by this open, which failed: forget it
                release(claimed.registered)
            opened.close()
            raise
    except BaseException:
        engine.close()
        raise
    return Opened(engine, opened, ruling, stored, claimed, catalog)


def open_engine(target: Any, *, query_timeout: float | None, memory_limit: str | None,
                copies: Path | None = None, **options: Any) -> Backend:
    """The backend for ``target``, opened by the first engine of ``dpsql.backends.registry.ENGINES``
    that recognises it: a SparkSession, or a Spark config file (``*.spark.toml``,
    ``dpsql.backends.spark.config``), runs on Spark (``dpsql.backends.spark``); anything else on DuckDB."""
    return engine_for(target).open(target, query_timeout=query_timeout, memory_limit=memory_limit, copies=copies,
                                   **options)


def default_ledger(target: Any) -> Path | None:
    """The ledger file ``target`` is accounted in when no ``ledger=`` is given: ``<database>.ledger``
    beside a DuckDB file, a Spark config's ``[spark] ledger`` or ``<config>.ledger``; ``None`` for
    anything else (in memory; a SparkSession needs ``ledger=``)."""
    if is_spark_config(target):
        return load_spark_config(target).ledger_path
    if isinstance(target, (str, os.PathLike)) and str(target) != ":memory:":
        return Path(f"{Path(target).resolve()}.ledger")
    return None


def ledger_file(ledger: Any) -> Path | None:
    """The resolved ledger file ``ledger`` names, or ``None`` for one in memory."""
    if ledger is None or str(ledger) in ("", ":memory:"):
        return None
    return Path(ledger).resolve()


def source_of(target: Any, engine: Backend) -> str:
    """Where a connection's data came from, as the registry of ledgers tells the curator."""
    if is_spark_session(target):
        return "a Python Spark session"
    if is_spark_config(target):
        return f"the Spark config {engine.path}"
    if engine.path is not None:
        return str(engine.path)
    return "pandas DataFrames" if isinstance(target, dict) else "a DuckDB connection in Python"


def copies_directory_for(target: Any, ledger: Any) -> Path:
    """Where ``persist_copies`` keeps the copies: beside the ledger file (``<ledger>.copies``), the
    default ledger of a database file being ``<database>.ledger``."""
    if ledger is None and isinstance(target, (str, os.PathLike)) and str(target) != ":memory:":
        return copies_directory(f"{Path(target).resolve()}.ledger")
    if isinstance(ledger, (str, os.PathLike)) and str(ledger) not in ("", ":memory:"):
        return copies_directory(Path(ledger).resolve())
    raise InvalidParameter("persist_copies needs a ledger file: the copies are kept beside it",
                           hint="open a DuckDB file (its ledger sits beside it), or pass ledger='/path/to/x.ledger'")


def check_listed_keys(policy: Policy, catalog: dict[str, dict[str, str]], engine: Backend) -> None:
    """Listed KEYS of a column that is neither text nor a number (a DATE, a UUID, an ENUM)
    must each name a value of its type, as DuckDB reads it: one that does not would be
    dropped from the domain without a word. Reads the policy's own literals only."""
    for table in policy.private_tables:
        columns = catalog[table_key(table.name)]
        for rule in table.columns:
            type_name = columns.get(rule.name.lower(), "")
            domain = rule.key_domain  # KEYS, or a LOCAL RR DOMAIN
            if domain is None or domain.values is None or type_name == "VARCHAR" \
                    or is_numeric_type(type_name):
                continue
            wrong = [v for v in domain.values if engine.cast_error(str(v), type_name) is not None]
            if wrong:
                position = rule.position
                raise PolicyError(f"the KEYS of {table.name}.{rule.name} ({type_name}) list '{wrong[0]}', "
                                  f"which is not a value of {type_name}",
                                  line=position.line if position else None,
                                  col=position.col if position else None,
                                  hint=f"list keys DuckDB reads as {type_name}, such as "
                                       "'2024-01-31' for a DATE")


def policy_file_of(policy: Any) -> Path | None:
    """The resolved path of a policy given as a file, else ``None`` (text or a Policy)."""
    if not isinstance(policy, (str, os.PathLike)):
        return None
    try:
        path = Path(policy)
        return path.resolve() if path.is_file() else None
    except (OSError, ValueError):  # policy text: too long for a file name, or holds a NUL
        return None


def curator_files(database: Path | None, ledger: Any, policy_file: Path | None) -> tuple[Path, ...]:
    """The files only the curator may write (``Connection.curator_files``): the ``database`` with
    its WAL, the ``ledger`` with SQLite's side files, and the policy file (resolved paths)."""
    files = []
    if database is not None:
        files += [database, Path(f"{database}.wal")]
    if ledger is not None:
        resolved = Path(ledger).resolve()
        files += [resolved, *(Path(f"{resolved}{side}") for side in LEDGER_SIDE_FILES)]
    if policy_file is not None:
        files.append(policy_file)
    return tuple(files)
