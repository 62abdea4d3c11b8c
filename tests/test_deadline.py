"""The statement watchdog (``dpsql.backends.deadline``): a short deadline armed behind a long one
still fires on time, and a deadline that ended in time lets go of its cursor at once."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from dpsql.backends.deadline import Deadline
from dpsql.errors import QueryFailed


class Interruptible:
    def __init__(self):
        self.interrupted = threading.Event()

    def interrupt(self):
        self.interrupted.set()


def test_a_short_deadline_behind_a_long_one_fires_on_time():
    long, short = Interruptible(), Interruptible()
    with Deadline(long, 60):  # the watchdog now sleeps towards this one
        started = time.monotonic()
        with pytest.raises(QueryFailed):
            with Deadline(short, 0.2):
                assert short.interrupted.wait(5), "the short deadline never fired"
        assert time.monotonic() - started < 4
    assert not long.interrupted.is_set()


def test_deadlines_armed_later_than_the_first_due_do_not_fire_early():
    first, later = Interruptible(), Interruptible()
    with pytest.raises(QueryFailed):
        with Deadline(first, 0.2):
            with Deadline(later, 0.6):
                assert first.interrupted.wait(5)
                assert not later.interrupted.is_set()
                assert later.interrupted.wait(5)
    # both past their limits: the inner one raised, and the outer one raises too


def test_a_deadline_that_ended_in_time_holds_no_cursor():
    cursor = Interruptible()
    held = weakref.ref(cursor)
    with Deadline(Interruptible(), 30):  # due first: the watchdog keeps the later one until it wakes
        with Deadline(cursor, 60):
            pass
        del cursor
        gc.collect()
        assert held() is None


def test_a_statement_that_ran_past_its_limit_fails_even_when_the_watchdog_was_late(monkeypatch):
    """The outcome depends on how long the statement ran, not on when the watchdog thread ran."""
    from dpsql.backends import deadline

    monkeypatch.setattr(deadline._WATCHDOG, "arm", lambda seconds, which: None)  # a watchdog that never wakes
    with pytest.raises(QueryFailed):
        with Deadline(Interruptible(), 0.05):
            time.sleep(0.1)
    with Deadline(Interruptible(), 5):  # in time: no failure
        pass
