"""How long a bounded copy's build has run, shown to the curator once it passes a second.

Only the copy build is shown, never an analyst query's progress. The build's time is a function
of the raw table (its size and its units' rows), which the curator who runs the build may know
anyway; a query's progress *over time* would show more than its total time (how fast each
stage went, e.g. a scan against a join over one person's rows), which DESIGN.md treats as a
channel, so queries show nothing. A build shows its elapsed seconds, not a percentage: DuckDB's
own progress (``query_progress``) needs settings a hardened, locked connection cannot change.

Written to standard error, and only to a terminal or a notebook (``show_progress``): a CLI's
standard output stays parseable, and a server's clients never see it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

DELAY = 1.0
"""Seconds a build runs before anything is shown: short builds stay silent."""
INTERVAL = 0.5
"""Seconds between updates of the shown line."""


def show_progress(wanted: bool | None, stream: TextIO | None = None) -> bool:
    """Whether to show builds: as ``wanted``, or (``None``) when ``stream`` (standard error) is a
    terminal or a Jupyter kernel's.

    >>> import io
    >>> show_progress(None, io.StringIO()), show_progress(True, io.StringIO())
    (False, True)
    """
    if wanted is not None:
        return bool(wanted)
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) or "ipykernel" in sys.modules


@contextlib.contextmanager
def elapsed_progress(label: str, stream: TextIO | None = None, delay: float = DELAY,
                     interval: float = INTERVAL) -> Iterator[None]:
    """Around a build: after ``delay`` seconds, a line ``<label>: 3.5 s`` on ``stream``
    (standard error) rewritten every ``interval``, ended with the total when the build ends.

    >>> import io
    >>> out = io.StringIO()
    >>> with elapsed_progress("bounding visits", out, delay=0.0, interval=0.01):
    ...     time.sleep(0.05)
    >>> out.getvalue().rstrip().rsplit("\\r", 1)[-1].startswith("bounding visits: done in ")
    True
    """
    stream = sys.stderr if stream is None else stream
    start = time.monotonic()
    finished = threading.Event()
    shown = threading.Event()

    def show() -> None:
        if finished.wait(delay):
            return
        while not finished.is_set():
            stream.write(f"\r{label}: {time.monotonic() - start:.1f} s")
            stream.flush()
            shown.set()
            finished.wait(interval)

    painter = threading.Thread(target=show, daemon=True, name="dpsql-progress")
    painter.start()
    try:
        yield
    finally:
        finished.set()
        painter.join()
        if shown.is_set() or time.monotonic() - start >= delay:  # however the painter was scheduled
            stream.write(f"\r{label}: done in {time.monotonic() - start:.1f} s\n")
            stream.flush()
