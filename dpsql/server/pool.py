"""The server's workers: a bounded pool of threads that serves analysts in turn.

Sessions hand their statements to the pool, tagged with the analyst who sent them. Each
analyst has a queue; a free worker takes the first statement of the analyst whose turn it is,
and that analyst goes to the back of the turn. So an analyst with many sessions (or a tool
that opens many connections) waits its turn like everyone else: ahead of a statement start at
most its analyst's earlier statements and, for each of those and for itself, one statement of
every other analyst waiting. A session sends one statement at a time (the protocol waits for
each answer), so within an analyst's queue statements keep the order they came in.

Turns alone do not stop one analyst from *holding* every worker: a stream or a fit is one call
that keeps its worker for up to the server's time limit per request. So an analyst may have at
most ``workers - 1`` calls running at once (one, with a single worker): another analyst's
statement always finds a worker free, or one that frees within a statement's turn.

On a DuckDB file each worker thread hands its call to a worker process of its own
(``dpsql.server.processes``): planning is Python, which holds the GIL, so threads of one
process overlap planning with DuckDB's work but not planning with planning. With threads only
(Spark, ``--threads``), two per core let one plan while another's statement runs in the engine.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any


def default_workers() -> int:
    """Two threads per core: one can plan in Python while another's statement runs in DuckDB.

    >>> default_workers() >= 2
    True
    """
    return 2 * (os.cpu_count() or 1)


class FairPool:
    """``workers`` threads running submitted calls, one owner's queue after another's.

    >>> pool = FairPool(1)
    >>> pool.submit("alice", lambda x: x + 1, 41).result()
    42
    >>> pool.shutdown()
    """

    def __init__(self, workers: int, name: str = "dpsql-answer"):
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, got {workers}")
        self._condition = threading.Condition()
        self._queues: OrderedDict[Hashable, deque] = OrderedDict()
        """Owner -> its waiting calls; the first owner is the next to be served."""
        self._running: dict[Hashable, int] = {}
        """Owner -> its calls running now (absent: none)."""
        self._most_running = max(1, workers - 1)
        """The most calls one owner may have running at once: one worker is always another's."""
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, owner: Hashable, function: Callable[..., Any], *arguments: Any) -> Future:
        """``function(*arguments)`` on a worker, in ``owner``'s turn; its future."""
        future: Future = Future()
        with self._condition:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._queues.setdefault(owner, deque()).append((future, function, arguments))
            self._condition.notify()
        return future

    def waiting(self) -> int:
        """Calls submitted and not yet started."""
        with self._condition:
            return sum(len(queue) for queue in self._queues.values())

    def shutdown(self, wait: bool = True) -> None:
        """Take no more calls; the workers finish every call already submitted, then end."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _eligible(self) -> Hashable | None:
        """The first owner, in turn, with a call waiting and fewer than the most calls running
        (the caller holds the condition)."""
        return next((owner for owner in self._queues if self._running.get(owner, 0) < self._most_running), None)

    def _next(self, owner: Hashable) -> tuple[Future, Callable[..., Any], tuple]:
        """``owner``'s first call; that owner goes to the back of the turn (the caller holds the
        condition)."""
        queue = self._queues.pop(owner)
        call = queue.popleft()
        if queue:
            self._queues[owner] = queue
        self._running[owner] = self._running.get(owner, 0) + 1
        return call

    def _done(self, owner: Hashable) -> None:
        with self._condition:
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]
            self._condition.notify_all()  # a worker may be waiting for this owner's turn to open

    def _work(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._eligible() is not None or (self._closed and not self._queues))
                owner = self._eligible()
                if owner is None:
                    return  # shut down, and nothing left to run
                future, function, arguments = self._next(owner)
            try:
                if not future.set_running_or_notify_cancel():
                    continue  # its caller went away before it started
                try:
                    result = function(*arguments)
                except BaseException as error:  # handed to the caller, as concurrent.futures does
                    future.set_exception(error)
                else:
                    future.set_result(result)
            finally:
                self._done(owner)
