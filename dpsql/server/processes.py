"""The server's worker processes (DuckDB): each answers one statement at a time on its own engine.

Why processes. A small query spends most of its server time in Python (parsing, checking,
rendering, DuckDB's Python binding), holding the GIL: threads in one process cap near 150
queries a second whatever the cores. So ``dpsql serve`` on a DuckDB file runs ``workers``
processes (one per core by default), and the listener — the process clients connect to — only
speaks the protocol and hands each statement, with the analyst the session authenticated, to a
worker over a pipe (``WorkerProcesses.answer``). Which statement runs next, and how many of one
analyst's run at once, is still decided in the listener by ``dpsql.server.pool.FairPool``
(one dispatching thread per process), so fairness, the ``workers - 1`` per-analyst cap and
cancel requests (which arrive on a new connection, to the listener) work as with threads.

What each process has. Its own read-only engine over the database and its own ledger
connection to the same file; the bounded copies are built once, by the listener before any
worker starts (``persist_copies``), and each worker reads them in place, read-only, after
checking that each is exactly the copy it would build now (recipe, salt, and a keyed
fingerprint of the data: ``dpsql.backends.duckdb.persisted``); a copy that is not is built in
that worker's memory, so no process serves a stale copy.

Why the budget stays exact. Every charge is one ``BEGIN IMMEDIATE`` transaction on the
ledger file (``dpsql.budget.ledger``): SQLite's write lock serialises it across processes as
it does across threads, and the spent totals are re-read under that lock, so no two processes
can both spend the last of a budget. A worker releases an answer only after its charge
committed (fsync'ed); a worker killed at any moment leaves either no charge and nothing
released, or a charge whose answer never reached the listener. The listener then answers
XX000 and starts a new worker.

What is per process. PMW sessions (``SELECT * FROM pmw(...)``) live in the worker that opened
them, so an analyst's ``pmw`` calls always go to one worker (chosen by the analyst's name).
Stored answers (free repeats) are in the ledger, shared. The policy in force is followed by
each worker on its own (``SharedDatabase``): each re-opens under a replaced policy at its next
statement.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dpsql.budget.ledger import Cancellation
from dpsql.errors import DPError
from dpsql.server.answers import Outcome

log = logging.getLogger("dpsql.server")

STARTUP_SECONDS = 300.0
"""How long a worker may take to open the database (it fingerprints each stored copy)."""
STOP_SECONDS = 30.0
"""How long a worker is given to finish its statement and close when the server stops."""
DIED = ("the server process answering this statement stopped; nothing was released "
        "(SHOW ledger says whether it was charged)")

UNREAD = ("the server could not pass on this statement's answer, which was not released "
          "(SHOW ledger says whether it was charged)")


def default_processes() -> int:
    """One worker process per core, and at least two: an analyst runs at most ``workers - 1`` calls
    at once (``dpsql.server.pool``), so only with two can another analyst always find one free.

    >>> default_processes() >= 2
    True
    """
    return max(2, os.cpu_count() or 1)


def hold_database(path: Path) -> int:
    """A shared lock on the database file, held by the listener while the server runs (the returned
    descriptor; closing it releases the lock). The workers each check their stored copies once, at
    start: a curator writing to the file meanwhile would leave them answering from the data as it
    was, beside a restarted worker answering from the new. DuckDB takes the same POSIX lock to
    write, so a writer is refused ("Conflicting lock is held"), as it is when one process serves
    in threads; readers are not. Refused when a writer holds the file now."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        raise DPError(f"{path} is open for writing in another process, so the server cannot keep its data "
                      "fixed while it runs", hint="close that connection, then start dpsql serve again") from None
    return descriptor


def start_fork_server():
    """The processes' context: workers are forked from a fork server that has imported dpsql, so
    each starts in milliseconds and none inherits the listener's threads (DuckDB's, asyncio's).
    Called early, the fork server imports while the listener builds the copies."""
    if os.name != "posix":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dpsql.server.processes"])
    from multiprocessing import forkserver

    forkserver.ensure_running()
    return context


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process opens: ``dpsql.connect(database, policy, **options)``."""

    database: str
    policy: Any
    options: dict
    name: str
    """The database's name for the catalog (``dpsql.server.database_name``)."""
    setup: Callable[[], None] | None = None
    """Run first in each worker (tests: to slow or break a worker on purpose)."""
    environment: dict = field(default_factory=lambda: dict(os.environ))
    """The listener's environment when the server started (``DPSQL_HOME``...): a worker forked from
    the fork server would otherwise have the fork server's, taken when the first server started."""


class RelayedCancellation(Cancellation):
    """A session's cancel, relayed to the worker process running its statement (``relay_to``):
    requested before the statement reached a worker, it is relayed as the statement is sent."""

    def __init__(self) -> None:
        super().__init__()
        self._relay: Callable[[], None] | None = None
        self._guard = threading.Lock()

    def request(self) -> None:
        super().request()
        with self._guard:
            relay = self._relay
        if relay is not None:
            relay()

    def relay_to(self, relay: Callable[[], None] | None) -> None:
        with self._guard:
            self._relay = relay
        if relay is not None and self.requested:
            relay()


class _SlotEvent:
    """An event set for one call: the worker's shared cancel slot holds that call's number."""

    def __init__(self, slot, call: int):
        self._slot, self._call = slot, call

    def is_set(self) -> bool:
        return self._slot.value == self._call

    def set(self) -> None:
        self._slot.value = self._call


class SlotCancellation(Cancellation):
    """In a worker: call ``call``'s cancel, requested by the listener through the shared slot."""

    def __init__(self, slot, call: int):
        super().__init__()
        self._requested = _SlotEvent(slot, call)  # type: ignore[assignment]


@dataclass
class _Worker:
    index: int
    process: Any
    channel: Any
    slot: Any
    """Shared memory: the number of the call the listener cancelled (0: none)."""
    busy: bool = False
    calls: int = 0
    generation: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerProcesses:
    """``count`` worker processes over ``spec``, each answering one statement at a time; stands
    in for ``SharedDatabase`` in the listener (``answer``, ``generation``, ``close``)."""

    def __init__(self, count: int, spec: WorkerSpec):
        if count < 1:
            raise ValueError(f"a server needs at least one worker process, got {count}")
        self._spec = spec
        self._context = start_fork_server()
        self._free = threading.Condition()
        self._closed = False
        self._turn = 0
        self._running: dict[str, tuple[int, int]] = {}
        """Query text -> (the worker answering it, how many calls of it are waiting or running there)."""
        self.after_close: Callable[[], None] | None = None
        """Run once every worker has stopped (the listener's clean-up of copies it made)."""
        self._workers: list[_Worker] = []
        starting: list[_Worker] = []
        try:
            for index in range(count):  # all start at once; each then opens the database
                starting.append(self._start(index))
            self._workers = [self._ready(worker) for worker in starting]
        except BaseException:
            for worker in starting:
                _end(worker, 0)
            raise

    @property
    def generation(self) -> int:
        """The policy generation the workers have reached (each follows a replaced policy itself)."""
        return max((worker.generation for worker in self._workers), default=0)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (tests, and the benchmark's CPU count)."""
        return [worker.process.pid for worker in self._workers]

    def answer(self, statement, analyst: str, cancel: Cancellation | None = None) -> Outcome:
        """``statement`` answered for ``analyst`` by a free worker (an analyst's ``pmw`` calls: by
        theirs), ``cancel`` relayed to it; blocks this thread until the worker replies."""
        wanted = None
        if "pmw" in statement.sql.lower():
            wanted = zlib.crc32(analyst.encode()) % len(self._workers)
        worker = self._take(wanted, statement.sql)
        try:
            return self._ask(worker, statement, analyst, cancel)
        finally:
            self._give_back(worker, statement.sql)

    def close(self) -> None:
        """Stop every worker: each finishes its statement (charged and recorded), then closes."""
        with self._free:
            self._closed = True
        for worker in self._workers:
            with worker.lock:  # waits for a statement it is answering
                _end(worker, STOP_SECONDS)
        if self.after_close is not None:
            self.after_close()

    # -- internals ---------------------------------------------------------------------

    def _start(self, index: int) -> _Worker:
        listener_end, worker_end = self._context.Pipe()
        slot = self._context.Value("q", 0, lock=False)
        process = self._context.Process(target=work, args=(worker_end, self._spec, slot), daemon=True,
                                        name=f"dpsql-worker-{index}")
        process.start()
        worker_end.close()
        return _Worker(index, process, listener_end, slot)

    def _ready(self, worker: _Worker) -> _Worker:
        if not worker.channel.poll(STARTUP_SECONDS):
            raise RuntimeError(f"worker process {worker.index} did not open the database in {STARTUP_SECONDS:g} s")
        try:
            message = worker.channel.recv()
        except EOFError:
            raise RuntimeError(f"worker process {worker.index} stopped while opening the database") from None
        if message[0] != "ready":
            raise RuntimeError(f"worker process {worker.index} could not open the database: {message[1]}")
        worker.generation = message[1]
        return worker

    def _take(self, wanted: int | None, sql: str) -> _Worker:
        """A free worker (``wanted``'s, if given). The same text running already waits for the worker
        running it: there its repeat is free (the connection's per-query lock), as with threads; two
        processes would each charge it, for two draws."""
        with self._free:
            while True:
                if self._closed:
                    raise RuntimeError("the server is stopping")
                running = self._running.get(sql) if sql else None
                if running is not None:
                    wanted = running[0]
                free = [w for w in self._workers if not w.busy and (wanted is None or w.index == wanted)]
                if free:  # in turn, so every process (and its caches) is used alike
                    chosen = min(free, key=lambda w: (w.index - self._turn) % len(self._workers))
                    chosen.busy, self._turn = True, chosen.index + 1
                    if sql:
                        index, count = self._running.get(sql, (chosen.index, 0))
                        self._running[sql] = (index, count + 1)
                    return chosen
                self._free.wait()

    def _give_back(self, worker: _Worker, sql: str) -> None:
        with self._free:
            worker.busy = False
            if sql:
                index, count = self._running[sql]
                if count == 1:
                    del self._running[sql]
                else:
                    self._running[sql] = (index, count - 1)
            self._free.notify_all()

    def _ask(self, worker: _Worker, statement, analyst: str, cancel: Cancellation | None) -> Outcome:
        with worker.lock:
            worker.calls += 1
            call = worker.calls
            slot = worker.slot

            def relay() -> None:
                slot.value = call

            if isinstance(cancel, RelayedCancellation):
                cancel.relay_to(relay)
            try:
                worker.channel.send((call, statement, analyst))
                reply = worker.channel.recv()
            except (EOFError, OSError, BrokenPipeError):
                log.error("worker process %s (pid %s) stopped while answering; starting another",
                          worker.index, worker.process.pid)
                self._replace(worker)
                return Outcome(sqlstate="XX000", message=DIED, hint="send the statement again")
            except Exception:  # a bug: an answer that does not cross the pipe is not released
                log.exception("an answer from worker process %s could not be read", worker.index)
                return Outcome(sqlstate="XX000", message=UNREAD, hint="this is a bug in dpsql: please report the query")
            finally:
                if isinstance(cancel, RelayedCancellation):
                    cancel.relay_to(None)
        _, outcome, charged, generation = reply
        worker.generation = generation
        if cancel is not None and charged:
            cancel.charged = True
        return outcome

    def _replace(self, worker: _Worker) -> None:
        """A new process in a dead worker's place (the caller holds its lock)."""
        _end(worker, 0)
        fresh = self._ready(self._start(worker.index))
        worker.process, worker.channel, worker.slot = fresh.process, fresh.channel, fresh.slot
        worker.generation, worker.calls = fresh.generation, 0


def _end(worker: _Worker, seconds: float) -> None:
    try:
        worker.channel.send(None)
    except (OSError, BrokenPipeError, ValueError):
        pass
    worker.process.join(seconds)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
    worker.channel.close()


def work(channel, spec: WorkerSpec, slot) -> None:
    """A worker process: open the database, then answer statements until told to stop."""
    import dpsql
    from dpsql.server.answers import SharedDatabase, answer

    for number in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C or a stop sent to the whole group: the listener
        signal.signal(number, signal.SIG_IGN)        # stops its workers, once their answers are in
    os.environ.clear()
    os.environ.update(spec.environment)
    tempfile.tempdir = None  # the fork server's cached choice gives way to this environment's TMPDIR
    if spec.setup is not None:
        spec.setup()

    def opened(policy: Any):
        return dpsql.connect(spec.database, policy, eager_bounding=True, persist_copies="read", **spec.options)

    try:
        shared = SharedDatabase(opened(spec.policy), lambda: opened(None), spec.name)
    except BaseException as error:  # noqa: BLE001 - told to the listener, which refuses to start
        channel.send(("failed", f"{type(error).__name__}: {error}"))
        return
    channel.send(("ready", shared.generation))
    try:
        while True:
            try:
                message = channel.recv()
            except EOFError:
                break
            if message is None:
                break
            call, statement, analyst = message
            cancel = SlotCancellation(slot, call)
            outcome = answer(statement, analyst, shared, cancel)
            channel.send((call, outcome, cancel.charged, shared.generation))
    finally:
        shared.close()
        # A multiprocessing child ends with os._exit, skipping atexit: run its handlers here, or the
        # DuckDB spill directory made for the database file (removed at exit) outlives every worker.
        atexit._run_exitfuncs()
