"""The server: accepts connections on a loopback or other address, one asyncio task per
connection, answers in a bounded pool of workers that serves analysts in turn
(``dpsql.server.pool``) — worker processes on a DuckDB file (``dpsql.server.processes``),
threads on Spark — queries of different sessions side by side, and stops cleanly.

Limits keep one client from starving the rest: a connection limit, a time limit on startup
and authentication (half-open and slow clients), a size limit on every message. Stopping
(SIGTERM, SIGINT, ``stop()``) closes the listener and the connections, then waits for every
answer already running: its charge is in the ledger before any data is read, and its
released answer is recorded before the pool lets the process end, so no charge is lost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import signal
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dpsql.server import messages as m
from dpsql.server.answers import SharedDatabase
from dpsql.server.pool import FairPool, default_workers
from dpsql.server.session import Refused, serve_queries, start
from dpsql.server.users import UserNames, decoy_key

log = logging.getLogger("dpsql.server")


@dataclass(frozen=True)
class Settings:
    """How a server listens and what it lets clients do."""

    database: str
    """The name clients connect to: the database file's stem (``shop`` for shop.duckdb)."""
    users_path: Path
    """The users file of SCRAM verifiers, read at each login."""
    host: str = "127.0.0.1"
    port: int = 5433
    tls_cert: str | None = None
    tls_key: str | None = None
    max_connections: int = 64
    startup_timeout: float = 10.0
    """Seconds a client has from connecting to being authenticated."""
    workers: int = field(default_factory=default_workers)
    """Worker processes answering side by side (DuckDB: one per core by default,
    ``dpsql.server.processes``), or threads (Spark, or ``processes=False``: two per core); each
    analyst's statements wait their turn (``dpsql.server.pool``)."""


class Server:
    """A running dpsql server over one shared connection."""

    def __init__(self, connection, settings: Settings, reopen=None, shared=None):
        """Serve ``connection`` in threads, or, with ``shared`` (``WorkerProcesses``), in its processes."""
        self.settings = settings
        self.database = settings.database
        self.users_path = settings.users_path
        self.user_names = UserNames(settings.users_path)
        """The users file's names, re-read when it changes: asked before every query."""
        self.user_names()  # a users file others could read or change is refused now, not at a login
        self.secret = decoy_key(settings.users_path)
        """Keys the decoy verifiers of unknown users (``dpsql.server.users.decoy_verifier``)."""
        self.tls = _tls_context(settings.tls_cert, settings.tls_key)
        self.shared = shared if shared is not None else SharedDatabase(connection, reopen, settings.database)
        """What answers: the one connection, reopened by ``reopen`` when the curator replaces the
        stored policy, or the worker processes (``dpsql.server.processes``)."""
        self._pool = FairPool(settings.workers)
        self._pids = itertools.count(1000)
        self._sessions: dict = {}
        """Backend pid -> session, for cancel requests."""
        self._tasks: set[asyncio.Task] = set()
        self._listener: asyncio.base_events.Server | None = None
        self._stopped: asyncio.Event | None = None
        self.ready = threading.Event()
        """Set once the server listens (for tests and for a caller starting it in a thread)."""
        self.port: int | None = None
        self.thread: threading.Thread | None = None
        """The thread serving, when started by ``dpsql.server.start_in_thread``."""

    def next_pid(self) -> int:
        return next(self._pids)

    def cancel(self, pid: int, key: int) -> None:
        """A CancelRequest: the session's running statement is stopped before its charge commits,
        or its answer withheld after (``dpsql.server.session.run``)."""
        found = self._sessions.get(pid)
        if found is not None and secrets.compare_digest(str(found.key), str(key)):
            found.cancellation.request()

    async def answer(self, statement, analyst, function):
        """``function(statement, analyst, shared)`` in a worker thread, in ``analyst``'s turn."""
        return await asyncio.wrap_future(self._pool.submit(analyst, function, statement, analyst, self.shared))

    async def serve(self) -> None:
        """Listen until ``stop()`` or a signal, then shut down."""
        self._stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        try:
            self._listener = await asyncio.start_server(self._connected, self.settings.host, self.settings.port,
                                                        limit=m.MAX_MESSAGE + 5)
        except OSError:
            self.shared.close()
            self.ready.set()  # a caller waiting for it sees ``port`` still None
            raise
        self.port = self._listener.sockets[0].getsockname()[1]
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(number, self._stopped.set)
        log.info("serving %s on %s:%s%s", self.database, self.settings.host, self.port,
                 " with TLS" if self.tls else "")
        self.ready.set()
        await self._stopped.wait()
        await self._shut_down()

    def stop(self) -> None:
        """Ask a running server to stop (from any thread)."""
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)

    async def _shut_down(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Answers already running finish in their threads: their charge and release are recorded.
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)
        self.shared.close()
        log.info("stopped; every charge is in the ledger")

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection is served in its own task
        self._tasks.add(task)
        try:
            if len(self._tasks) > self.settings.max_connections:
                writer.write(m.error_response("53300", "sorry, too many clients already", severity="FATAL"))
                await writer.drain()
                return
            await self._converse(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, ssl.SSLError):
            pass  # the client went away, or the server is stopping
        except Exception:  # a bug: this connection ends, the server goes on
            log.exception("a connection failed")
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _converse(self, reader, writer) -> None:
        try:
            session = await asyncio.wait_for(start(reader, writer, self), self.settings.startup_timeout)
        except asyncio.TimeoutError:
            return await _fatal(writer, "08006", "startup and authentication took too long")
        except Refused as refused:
            log.info("refused a connection: %s", m.printable(str(refused)))
            return await _fatal(writer, refused.sqlstate, str(refused))
        except m.ProtocolError as error:
            return await _fatal(writer, "08P01", str(error))
        if session is None:
            return
        self._sessions[session.pid] = session
        log.info("analyst=%s connected (session %s)", session.analyst, session.pid)
        try:
            await serve_queries(reader, writer, self, session)
        except m.ProtocolError as error:
            await _fatal(writer, "08P01", str(error))
        finally:
            del self._sessions[session.pid]
            log.info("analyst=%s disconnected (session %s)", session.analyst, session.pid)


async def _fatal(writer, sqlstate: str, text: str) -> None:
    writer.write(m.error_response(sqlstate, text, severity="FATAL"))
    await writer.drain()


def _tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context
