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
``listener`` (the server).
"""

from __future__ import annotations

import asyncio
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

    ``options``: ``Settings`` fields (``max_connections``, ``startup_timeout``, ``workers``)
    and ``dpsql.connect`` options (``query_timeout``, ``request_timeout``, ``memory_limit``,
    ``ledger``, ``rng``, ``persist_copies``, ``separate_budget``).
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
    connection = dpsql.connect(str(database), policy, eager_bounding=True, **connect_options)

    def reopen():  # after `dpsql init --replace`: the stored policy and budget rule (invariant 18)
        return dpsql.connect(str(database), None, eager_bounding=True, **connect_options)

    try:
        settings = Settings(database_name(database), Path(users), host, port, tls_cert, tls_key, **options)
        return Server(connection, settings, reopen)
    except BaseException:
        connection.close()
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
    ends it and ``thread.join()`` waits for the shutdown."""
    server = open_server(database, **arguments)
    server.thread = thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True,
                                              name="dpsql-server")
    thread.start()
    if not server.ready.wait(30) or server.port is None:
        thread.join(10)  # its DuckDB must be closed before the interpreter may exit
        raise RuntimeError(f"the dpsql server did not start on {server.settings.host}:{server.settings.port}")
    return server
