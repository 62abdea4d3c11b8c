"""Statement deadlines shared by every backend: one watchdog thread interrupts what overruns.

A statement's outcome past its limit must depend only on how long it ran (DESIGN.md invariant
17): ``Deadline`` raises ``QueryFailed`` whenever the limit was reached, however the statement
ended. What "interrupt" means is the engine's: DuckDB's ``connection.interrupt()``, Spark's
``interruptTag`` (``dpsql.backends.spark``) — anything with an ``interrupt()`` method.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from typing import Any

from dpsql.errors import InvalidParameter, QueryFailed, RequestTooLong

DEFAULT_QUERY_TIMEOUT = 30.0
"""Seconds one generated statement may run before it is interrupted."""
DEFAULT_REQUEST_TIMEOUT = 3600.0
"""Seconds one request of many statements (a stream, a fit) may take at most, counted as its
number of statements times ``query_timeout``: 120 statements at the default 30 s."""


def check_timeout(seconds: Any, name: str = "query_timeout") -> float | None:
    """A time limit in seconds (``name`` says which, for the message): a finite number > 0, or
    ``None`` for none.

    >>> check_timeout(2), check_timeout(None)
    (2.0, None)
    """
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds) or seconds <= 0:
        raise InvalidParameter(f"{name} must be a number of seconds > 0, got {seconds!r}",
                               hint=f"pass {name}=30, or None for no limit")
    return float(seconds)


def check_request_time(statements: int, query_timeout: float | None, request_timeout: float | None,
                       what: str = "this request") -> None:
    """Refuse, before anything is charged or read, a request whose *public* time bound — its
    number of ``statements`` times the per-statement limit — passes ``request_timeout``.

    A request of many statements is never stopped by its summed run time: one unit's rows may
    make each statement a little slower (invariant 17 caps that per statement, not in sum), and
    a total over thousands of statements would turn those small differences into a yes/no on
    the unit's presence. So the total is bounded by what is public, up front, and each
    statement by its own deadline alone. No per-statement limit (``None``): no time limits.

    >>> check_request_time(120, 30.0, 3600.0)
    >>> try:
    ...     check_request_time(121, 30.0, 3600.0, "a stream of 121 queries")
    ... except RequestTooLong as refused:
    ...     first, then = refused.message.split(" in all, ")
    >>> print(first)
    a stream of 121 queries runs 121 statements of up to 30 s each, 1 h 0 min 30 s
    >>> print(then)
    past the limit of 1 h per request (request_timeout)
    """
    if query_timeout is None or request_timeout is None or statements * query_timeout <= request_timeout:
        return
    most = max(int(request_timeout // query_timeout), 0)
    fits = f"send at most {most} statements in one request" if most else "a request cannot run here"
    raise RequestTooLong(
        f"{what} runs {statements:,} statements of up to {query_timeout:g} s each, "
        f"{_duration(statements * query_timeout)} in all, past the limit of {_duration(request_timeout)} per "
        "request (request_timeout)",
        hint=f"{fits}, or ask the curator for a longer request_timeout or a shorter query_timeout",
        hints={"sql": f"{fits}, or ask the curator for a longer time limit per request"})


def _duration(seconds: float) -> str:
    """``seconds`` as people read a duration.

    >>> _duration(45), _duration(3600), _duration(36030.5)
    ('45 s', '1 h', '10 h 0 min 30.5 s')
    """
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    parts = [f"{int(hours)} h"] if hours else []
    if minutes or (hours and rest):
        parts.append(f"{int(minutes)} min")
    if rest or not parts:
        parts.append(f"{rest:g} s")
    return " ".join(parts)


class Deadline:
    """Interrupts a DuckDB connection (or cursor) still running ``seconds`` after entry.

    On leaving, a statement that was interrupted — or that reached the limit just as it
    finished — raises ``QueryFailed``: the outcome depends only on how long it ran, never on
    how it ended.
    """

    def __init__(self, connection, seconds: float | None):
        self._connection = connection
        self._seconds = seconds
        self._guard = threading.Lock()
        self.stopped = False
        self._expired = False
        self._due = math.inf

    def __enter__(self) -> "Deadline":
        if self._seconds is not None:
            self._due = time.monotonic() + self._seconds
            _WATCHDOG.arm(self._seconds, self)
        return self

    def expire(self) -> None:
        with self._guard:
            if self.stopped:
                return
            self._expired = True
            try:
                self._connection.interrupt()
            except Exception:  # the connection closed meanwhile: nothing left to stop
                pass

    def __exit__(self, exc_type, exc, traceback) -> None:
        with self._guard:
            self.stopped = True
            self._connection = None  # the watchdog may hold this deadline until it was due: not the cursor
        # The clock decides, not whether the watchdog thread got to run in time (under load it
        # can fire hundreds of milliseconds late: a served attacker's review).
        if self._expired or (self._seconds is not None and time.monotonic() >= self._due):
            raise QueryFailed(f"the query was stopped after its time limit of {self._seconds:g} s",
                              hint="ask for less, or ask the curator for a longer query_timeout") from None


class _Watchdog:
    """One thread that expires every statement's deadline: starting a thread per statement
    cost milliseconds, more than a small query takes."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._due: list = []  # heap of (monotonic due time, sequence number, deadline)
        self._sequence = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, deadline: Deadline) -> None:
        with self._condition:
            entry = (time.monotonic() + seconds, next(self._sequence), deadline)
            heapq.heappush(self._due, entry)
            if self._thread is None or not self._thread.is_alive():  # first use, or after a fork
                self._thread = threading.Thread(target=self._run, name="dpsql-deadlines", daemon=True)
                self._thread.start()
            # Wake the thread only when this deadline is now the first due: otherwise it already
            # sleeps until an earlier one. Waking it for every statement cost a thread switch
            # (about 0.1 ms of a 1 ms query); deadlines that end in time are dropped when it wakes.
            if self._due[0] is entry:
                self._condition.notify()

    def _run(self) -> None:
        with self._condition:
            while True:
                while self._due and self._due[0][2].stopped:  # finished in time
                    heapq.heappop(self._due)
                if not self._due:
                    self._condition.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._condition.wait(wait)
                    continue
                heapq.heappop(self._due)[2].expire()


_WATCHDOG = _Watchdog()
