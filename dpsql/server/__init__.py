"""``dpsql serve``: the analyst's way in, over the PostgreSQL wire protocol.

psql, psycopg, JDBC tools, SQLAlchemy, pandas and BI tools connect unchanged, authenticate
with SCRAM-SHA-256 against the curator's users file (``dpsql.server.users``) and are charged to
their own budget and the total. One ``Connection`` serves every session.

Modules: ``messages`` (protocol bytes), ``scram`` (authentication), ``statements`` (what a
client sent), ``catalog`` (schema-only look-ups), ``pg_compat`` (PostgreSQL's catalog tables and
functions that clients read, over DuckDB's), ``described`` (the policy's rules as the catalog's
comments), ``intervals`` (each answer's 95% intervals as a
notice, as columns, and in ``dpsql_cost``), ``values`` (types and text format),
``answers`` (running a statement for an analyst), ``session`` (one connection),
``pool`` (analysts served in turn), ``processes`` (the worker processes answering on a DuckDB
file), ``listener`` (the server).
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from dpsql.server.listener import Server, Settings

__all__ = ["Server", "Settings", "open_server", "serve", "start_in_thread"]


def open_server(database: str | Path, *, users: str | Path, policy: Any = None, host: str = "127.0.0.1",
                port: int = 5433, tls_cert: str | None = None, tls_key: str | None = None,
                **options: Any) -> Server:
    """Open ``database`` once (bounded copies built now) and make a server for it. When the
    curator replaces the stored policy, the next query opens it again under the stored one.

    ``options``: ``Settings`` fields (``max_connections``, ``startup_timeout``, ``workers``),
    ``dpsql.connect`` options (``query_timeout``, ``request_timeout``, ``memory_limit``,
    ``ledger``, ``rng``, ``persist_copies``, ``separate_budget``), and ``processes``: answer in
    ``workers`` processes (``dpsql.server.processes``; ``None``, the default: whenever they can
    share the database, which is a DuckDB file with a ledger file and no test ``rng``) or, with
    ``False``, in threads of this process. ``worker_setup``: a function each worker process runs
    first (tests).
    """
    import dpsql
    from dpsql.errors import DPError

    if not Path(users).is_file():  # a server nobody can log in to is a mistake, not a setting
        raise DPError(f"no users file at {users}", hint=f"add an analyst with `dpsql user add {users} NAME`")
    connect_options = {k: options.pop(k) for k in ("query_timeout", "request_timeout", "memory_limit", "ledger", "rng",
                                                      "persist_copies", "separate_budget")
                       if k in options}
    if isinstance(connect_options.get("ledger"), (str, Path)) and str(connect_options["ledger"]) != ":memory:":
        connect_options["ledger"] = Path(connect_options["ledger"]).resolve()  # as refusals are redacted
    processes, setup = options.pop("processes", None), options.pop("worker_setup", None)
    if processes is None:
        processes = in_processes(database, connect_options)
    if processes:
        return _open_in_processes(database, users, policy, host, port, tls_cert, tls_key, connect_options, setup,
                                  options)
    connection = dpsql.connect(str(database), policy, eager_bounding=True, **connect_options)

    def reopen():  # after `dpsql init --replace`: the stored policy and budget rule (invariant 18)
        return dpsql.connect(str(database), None, eager_bounding=True, **connect_options)

    try:
        settings = Settings(database_name(database), Path(users), host, port, tls_cert, tls_key, **options)
        return Server(connection, settings, reopen)
    except BaseException:
        connection.close()
        raise


def in_processes(database: str | Path, connect_options: dict) -> bool:
    """Whether worker processes can serve ``database``: a DuckDB file (Spark has one session, served
    in threads) whose budget is a ledger file every process opens (not one in memory), and
    production noise (a test's seeded ``rng`` would repeat in every process).

    >>> in_processes("shop.duckdb", {}), in_processes("shop.spark.toml", {})
    (True, False)
    >>> in_processes("shop.duckdb", {"ledger": ":memory:"}), in_processes("shop.duckdb", {"rng": 1})
    (False, False)
    """
    from dpsql.backends.spark.config import is_spark_config

    ledger = connect_options.get("ledger")
    return (isinstance(database, (str, Path)) and str(database) != ":memory:" and not is_spark_config(database)
            and connect_options.get("rng") is None and (ledger is None or str(ledger) not in ("", ":memory:")))


def _open_in_processes(database, users, policy, host, port, tls_cert, tls_key, connect_options: dict, setup,
                       options: dict) -> Server:
    """The server with worker processes (``dpsql.server.processes``): the bounded copies are
    built here once and stored (``persist_copies``), then every worker reads them in place. Copies
    the curator did not ask to keep are deleted when the server stops."""
    import shutil

    import dpsql
    from dpsql.backends.duckdb.hardening import default_memory_limit
    from dpsql.backends.opening import copies_directory_for
    from dpsql.server.processes import WorkerProcesses, WorkerSpec, default_processes, hold_database, start_fork_server

    start_fork_server()  # it imports dpsql while the copies are built
    keep = bool(connect_options.pop("persist_copies", False))
    copies = copies_directory_for(str(database), connect_options.get("ledger"))
    made_here = not keep and not copies.exists()
    with dpsql.connect(str(database), policy, eager_bounding=True, persist_copies=True, **connect_options):
        pass  # built and stored; closed, so the workers can attach the stored copies read-only
    held = hold_database(Path(database))  # no writer meanwhile: a copy checked at a worker's start stays current
    options.setdefault("workers", default_processes())
    if connect_options.get("memory_limit") is None:  # the default, half the machine, shared by the workers
        half = int(default_memory_limit().removesuffix("MB"))
        connect_options["memory_limit"] = f"{max(half // options['workers'], 256)}MB"
    name = database_name(database)

    def remove_copies() -> None:
        os.close(held)
        if made_here:
            shutil.rmtree(copies, ignore_errors=True)

    try:
        workers = WorkerProcesses(options["workers"], WorkerSpec(str(database), policy, connect_options, name, setup))
    except BaseException:
        remove_copies()
        raise
    workers.after_close = remove_copies
    try:
        settings = Settings(name, Path(users), host, port, tls_cert, tls_key, **options)
        return Server(None, settings, shared=workers)
    except BaseException:
        workers.close()
        raise


def database_name(database: str | Path) -> str:
    """The name clients give as their database: the file's name without its suffix, and a
    Spark config's without ``.spark.toml``.

    >>> database_name("data/shop.duckdb"), database_name("shop.spark.toml"), database_name("shop.toml")
    ('shop', 'shop', 'shop')
    """
    name = Path(database).name
    for suffix in (".spark.toml", ".toml"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def serve(database: str | Path, **arguments: Any) -> None:
    """Run a server until SIGTERM or SIGINT (``dpsql serve``)."""
    asyncio.run(open_server(database, **arguments).serve())


def start_in_thread(database: str | Path, **arguments: Any) -> Server:
    """A server listening in a background thread (tests, benchmarks, notebooks); ``stop()``
    ends it and ``thread.join()`` waits for the shutdown. It answers in threads of this process
    unless ``processes=True`` (so a test's patches reach its answers)."""
    arguments.setdefault("processes", False)
    server = open_server(database, **arguments)
    server.thread = thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True,
                                              name="dpsql-server")
    thread.start()
    if not server.ready.wait(30) or server.port is None:
        thread.join(10)  # its DuckDB must be closed before the interpreter may exit
        raise RuntimeError(f"the dpsql server did not start on {server.settings.host}:{server.settings.port}")
    return server
