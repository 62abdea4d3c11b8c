"""Charge, run, release: the one path from priced statements to a recorded release.

Every mechanism that reads private data reaches it through the connection's ``Spender``
(``dpsql.query.spend``: answer lock, free repeat, then this executor): ``db.sql`` (a query's
bounded statement, its quantiles' histogram statements and its bias report's count), the
curator's estimates (``dpsql.curator.estimates``) and the mechanisms of ``dpsql.calls`` (sparse
vector, MWEM, PMW, fit). Each plans first and renders its statements before the charge, so
nothing that can be refused statically fails after it. Then, in this order:

1. ``charge()`` records the cost in the ledger (or refuses: nothing was read);
2. each statement runs on the engine, its bounded copies filled first, the salt bound where it
   orders by a salted hash, and the query's sample key (drawn once, after the charge) where it
   reads a Poisson sample (``TABLESAMPLE POISSON``, ``dpsql.analysis.sampling``);
3. ``release(rows)`` draws the noise and post-processes, from the exact rows of every statement;
4. ``record(released)`` is kept as the ledger entry's answer (what free repeats give back).

A failure in 2 or 3 is a ``QueryFailed`` saying only that the charged query failed: the
analyst learns nothing from how (an engine's message could quote private values, or the salt).

Time. Each statement runs under the engine's own deadline; a request of many statements is
bounded before its charge by its number of statements times that deadline, against the
curator's ``request_timeout`` (``dpsql.backends.deadline.check_request_time``), and never
stopped by its summed run time, which one unit's rows could tip (invariant 17).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from dpsql.backends.base import Backend
from dpsql.backends.deadline import check_request_time
from dpsql.backends.rewrite import BoundedStatement
from dpsql.budget.ledger import Ledger
from dpsql.errors import InternalError, QueryFailed
from dpsql.sql.pieces import SAMPLE_KEY_PARAMETER

Released = TypeVar("Released")



class Fetch:
    """``fetch(statement, sample_key=None)`` runs one statement after the charge: its bounded copies
    filled, its salt bound, and the given secret key bound where it reads a Poisson sample (a
    mechanism that samples afresh for each of its statements draws one key per statement).
    ``fetch.holding(name, statement)`` keeps a statement's rows on the engine while a mechanism
    reads them many times (a fit's lean projection of its rows, ``dpsql.calls.fit_sql``). Each
    counts as one of the request's priced statements."""

    def __init__(self, executor: Executor, statements: int) -> None:
        self._executor = executor
        self._limit = statements
        self._fetched = 0

    def _count(self) -> None:
        self._fetched += 1
        if self._fetched > self._limit:  # the time bound charged for would not hold
            raise InternalError(f"a request priced at {self._limit} statements ran more")

    def __call__(self, statement: BoundedStatement, sample_key: str | None = None) -> list[tuple]:
        self._count()
        return self._executor._fetch(statement, sample_key)

    @contextmanager
    def holding(self, name: str, statement: BoundedStatement) -> Iterator[bool]:
        """Store ``statement``'s rows (a private relation: never shown, never left behind) as the
        engine's ``name`` while the block runs, then drop them; yields False where the engine keeps
        no such table (``Backend.hold``): the mechanism then reads its rows as it would without."""
        self._count()
        engine = self._executor._engine
        held = engine.hold(name, statement.sql, self._executor.salt_for(statement.needs_salt),
                           bounded=statement.bounded)
        try:
            yield held
        finally:
            if held:
                engine.drop_held(name)

QUERY_FAILED = "the query failed while running; its cost was charged and no answer was released"
"""What the analyst reads when a charged query fails (the same whatever failed)."""


def run_all(statements: Sequence[BoundedStatement], release: Callable[[list[list[tuple]]], Released],
            sample_key: Callable[[], str] | None = None) -> Callable[[Fetch], Released]:
    """``run(fetch)`` of fixed ``statements``: each fetched in order, then ``release`` of their rows;
    ``sample_key`` draws, once, the key of the Poisson sample those that need one read."""
    if any(s.needs_sample_key for s in statements) and sample_key is None:
        raise InternalError("a sampled statement was handed to the executor without a way to draw its key")

    def run(fetch: Fetch) -> Released:
        key = sample_key() if sample_key is not None else None
        return release([fetch(s, key) if s.needs_sample_key else fetch(s) for s in statements])

    return run


class Executor:
    """Runs charged statements on one engine against one ledger (module docstring)."""

    def __init__(self, ledger: Ledger, engine: Backend, request_timeout: float | None = None) -> None:
        self._ledger = ledger
        self._engine = engine
        self.request_timeout = request_timeout
        """Seconds one request's statements may take, counted as their number times the engine's
        per-statement limit (``None``: no limit per request)."""

    def check_time(self, statements: int, what: str = "this request") -> None:
        """Refuse a request of ``statements`` statements whose public time bound passes
        ``request_timeout`` (``check_request_time``); for ``explain`` and for each execution."""
        check_request_time(statements, self._engine.timeout, self.request_timeout, what)

    def execute(self, charge: Callable[[], int], statements: Sequence[BoundedStatement],
                release: Callable[[list[list[tuple]]], Released], record: Callable[[Released], str],
                failure: str = QUERY_FAILED, *, sample_key: Callable[[], str] | None = None) -> Released:
        """``release`` of the rows of ``statements``, run after ``charge()`` (which returns the
        ledger entry, or raises before anything is read) and recorded as that entry's answer by
        ``record``. ``failure``: the message of the ``QueryFailed`` raised if running or
        releasing fails after the charge. ``sample_key``: draws the secret key of the Poisson
        sample the statements read (``BoundedStatement.needs_sample_key``), once, after the
        charge: every statement of the query reads the same sample, no other query does."""
        return self.execute_adaptive(charge, run_all(statements, release, sample_key), record, failure,
                                     statements=len(statements))

    def execute_adaptive(self, charge: Callable[[], int], run: Callable[[Fetch], Released],
                         record: Callable[[Released], str] | None = None, failure: str = QUERY_FAILED, *,
                         statements: int, what: str = "this request") -> Released:
        """As ``execute``, for a mechanism whose later statements depend on its earlier noisy
        results (suggest's histograms; a sparse vector's queries): ``run(fetch)`` runs each
        statement through ``fetch`` and releases. ``record`` None: nothing is kept for repeats.
        ``statements``: the most statements ``run`` may fetch, known from the request alone;
        it bounds the request's time before the charge (``what`` names it in the refusal)."""
        self.check_time(statements, what)
        fetch = Fetch(self, statements)
        entry = charge()
        # The charge is committed: from here on, private data is read.
        try:
            released = run(fetch)
        except Exception:  # whatever failed, the analyst learns nothing from how
            raise QueryFailed(failure) from None
        if record is not None:
            self._ledger.record_answer(entry, record(released))
        return released

    def execute_free(self, statements: Sequence[BoundedStatement], release: Callable[[list[list[tuple]]], Released],
                     failure: str = QUERY_FAILED) -> Released:
        """``release`` of the rows of ``statements`` with no charge and no record: for an answer
        that is post-processing of data private already (``dpsql.query.local``'s free counts of
        randomized-response reports, which repeat identically). A failure is a bare ``QueryFailed``."""
        try:
            return release([self._fetch(s) for s in statements])
        except Exception:
            raise QueryFailed(failure) from None

    def _fetch(self, statement: BoundedStatement, sample_key: str | None = None) -> list[tuple]:
        parameters = self.salt_for(statement.needs_salt)
        if statement.needs_sample_key:
            if sample_key is None:
                raise InternalError("a sampled statement ran without its key")
            parameters = {**(parameters or {}), SAMPLE_KEY_PARAMETER: sample_key}
        return self._engine.fetch(statement.sql, parameters, bounded=statement.bounded)

    def salt_for(self, needed: bool) -> dict[str, Any] | None:
        """The secret salt as a query parameter, for a statement that orders by a salted hash
        (``BoundedStatement.needs_salt``)."""
        return {"salt": self._ledger.salt().hex()} if needed else None
