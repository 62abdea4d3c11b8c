"""Requests of many statements (streams, fits) stop on public counts, never on their summed clock.

Invariant 17: one unit's work is capped per statement, so no single statement's deadline tells
whether it is present. A limit on a request's *total* run time would add up what the cap leaves:
a review made one unit's rows ~0.14 s slower per statement (20x under the statement limit) and a
1,200-statement stream failed, charged, with it and was released without it, every time. So a
request is bounded before its charge by its number of statements times the statement limit
(``request_timeout``), and nothing after the charge looks at the clock.

The neighbour tests below slow every statement of the dataset that holds the victim to just under
the statement limit (the most invariant 17 lets one unit do) and check that the outcome — released
or failed — is the same with and without the victim.
"""

import time

import duckdb
import pytest

import dpsql
from dpsql.errors import QueryFailed, RequestTooLong
from dpsql.query.executor import Executor
from dpsql.mechanisms.noise import SeededSource

POLICY = ("BUDGET EPSILON 1000 DELTA 1e-3; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, "
          "x BOUNDS -1 TO 2, y BOUNDS 0 TO 5, k KEYS ('a', 'b'));")
ROWS = [(1, 0.5, 1.0, "a"), (2, -1.0, 0.0, "b"), (2, 2.0, 5.0, "a"), (3, 1.0, 2.5, "a"), (3, 1.5, 4.0, "b"),
        (4, 2.0, 0.0, "b")]
STATEMENT_LIMIT = 0.5
"""Seconds per statement in the neighbour tests: the victim's statements take 0.9 of it more
(the statements themselves take milliseconds, so the limit is never met, even on a loaded machine)."""
STATEMENTS = 14
"""Statements per request in the neighbour tests: after 12 of them the victim's extra time, 12 x
0.45 s = 5.4 s, is past the ten statement limits (5 s) the old summed-clock stop allowed."""


def neighbour(with_victim: bool, **options) -> dpsql.Connection:
    """A connection to the table with or without the victim, whose every statement takes just
    under the statement limit when the victim is there (a stand-in for rows that are costly to
    read: the most one unit's capped work may add to one statement)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, x DOUBLE, y DOUBLE, k VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", ROWS)
    if with_victim:
        con.execute("INSERT INTO t VALUES (99, 2.0, 5.0, 'a')")
    db = dpsql.connect(con, policy=POLICY, rng=SeededSource(5), **{"query_timeout": STATEMENT_LIMIT, **options})
    if with_victim:
        engine, real = db._engine, db._engine.fetch

        def slow(sql, parameters=None, **kwargs):
            time.sleep(0.9 * STATEMENT_LIMIT)
            return real(sql, parameters, **kwargs)

        engine.fetch = slow
    return db


@pytest.mark.parametrize("with_victim", [False, True])
def test_a_stream_is_released_whether_or_not_a_slow_unit_is_in_it(with_victim):
    """Fails on a summed-clock stop: with the victim the stream ran past ten statement limits in
    all and failed, charged; without it, it was released."""
    queries = [f"SELECT COUNT(*) FROM t WHERE x > {i / 10}" for i in range(STATEMENTS)]
    with neighbour(with_victim) as db:
        released = db.above_threshold(queries, threshold=10**6, epsilon=1)
        assert len(released.fetchall()) == STATEMENTS and db.budget.spent.epsilon == 1


@pytest.mark.parametrize("with_victim", [False, True])
def test_a_fit_is_released_whether_or_not_a_slow_unit_is_in_it(with_victim):
    """Fails on a summed-clock stop (a 30-step fit reading one unit's long strings: released 20/20
    without it, a charged failure 20/20 with it, in a review)."""
    with neighbour(with_victim) as db:
        model = db.fit("SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6, steps=STATEMENTS - 1)
        assert len(model.result.fetchall()) == 2 and db.budget.spent.epsilon == 1


OTHER_MECHANISMS = {
    "query": lambda db: db.sql("SELECT k, COUNT(*) AS n, AVG(x) AS x FROM t GROUP BY k", epsilon=1).fetchall(),
    "workload": lambda db: db.workload(["SELECT k, COUNT(*) FROM t GROUP BY k"], epsilon=1).fetchall(),
    "pmw": lambda db: db.pmw("t", ["k"], epsilon=1, max_updates=2, threshold=5).answer(
        "SELECT COUNT(*) FROM t WHERE k = 'a'").fetchall(),
    "suggest": lambda db: db.suggest_bounds("t", epsilon=1, columns=["x"]),
    "synthesize": lambda db: len(db.synthesize("t", ["k", "x"], epsilon=1, delta=1e-6, method="mst").table) > 0,
}


@pytest.mark.parametrize("with_victim", [False, True])
@pytest.mark.parametrize("mechanism", sorted(OTHER_MECHANISMS))
def test_every_other_mechanism_is_released_whether_or_not_a_slow_unit_is_in_it(mechanism, with_victim):
    """A query, a workload, a PMW session and a suggestion run a few statements each: the same
    outcome with the victim's statements slower as without (invariant 17, for every mechanism
    that reads private data; a roomier statement limit, as their statements read more)."""
    with neighbour(with_victim, query_timeout=10) as db:
        assert OTHER_MECHANISMS[mechanism](db)
        assert db.budget.spent.epsilon == 1


def counting_fetches(db) -> list:
    """Record every statement ``db`` runs from now on."""
    calls: list = []
    real = db._engine.fetch

    def fetch(sql, parameters=None, **kwargs):
        calls.append(sql)
        return real(sql, parameters, **kwargs)

    db._engine.fetch = fetch
    return calls


def test_a_stream_longer_than_the_request_limit_is_refused_before_its_charge():
    queries = [f"SELECT COUNT(*) FROM t WHERE x > {i}" for i in range(5)]
    with neighbour(False, query_timeout=10, request_timeout=45) as db:
        calls = counting_fetches(db)
        with pytest.raises(RequestTooLong, match=r"a stream of 5 queries runs 5 statements of up to 10 s each, "
                                                 r"50 s in all, past the limit of 45 s per request") as refused:
            db.above_threshold(queries, threshold=10, epsilon=1)
        assert "send at most 4 statements" in refused.value.hint
        with pytest.raises(RequestTooLong):
            db.explain("SELECT * FROM above_threshold(" + ", ".join(f"'{q}'" for q in queries)
                       + ", threshold = 10, epsilon = 1)")
        assert calls == [] and db.budget.spent.epsilon == 0
        assert len(db.above_threshold(queries[:4], threshold=10, epsilon=1).fetchall()) == 4  # 40 s: fits


def test_a_fit_longer_than_the_request_limit_is_refused_before_its_charge():
    with neighbour(False, query_timeout=10, request_timeout=100) as db:
        calls = counting_fetches(db)
        with pytest.raises(RequestTooLong, match="a fit of 10 steps runs 12 statements"):
            db.fit("SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6, steps=10)
        with pytest.raises(RequestTooLong):
            db.explain("SELECT * FROM fit('SELECT x, y FROM t', target = 'y', epsilon = 1, delta = 1e-6, "
                       "steps = 10)")
        assert calls == [] and db.budget.spent.epsilon == 0
        db.fit("SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6, steps=8)  # 10 statements (count, means, 8 steps): 100 s


def test_no_statement_limit_or_no_request_limit_bounds_nothing():
    queries = [f"SELECT COUNT(*) FROM t WHERE x > {i}" for i in range(3)]
    for options in ({"query_timeout": None}, {"query_timeout": 10, "request_timeout": None}):
        with neighbour(False, **options) as db:
            assert len(db.above_threshold(queries, threshold=10, epsilon=1).fetchall()) == 3


def test_the_default_request_limit_admits_120_statements_of_30_s():
    with neighbour(False, query_timeout=30) as db:
        db._executor.check_time(120)
        with pytest.raises(RequestTooLong, match="121 statements"):
            db._executor.check_time(121)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), "60", True])
def test_a_request_timeout_is_a_positive_number_of_seconds(seconds):
    with pytest.raises(dpsql.InvalidParameter, match="request_timeout must be a number of seconds"):
        neighbour(False, request_timeout=seconds)


def test_a_mechanism_that_runs_more_statements_than_it_was_priced_at_fails_charged():
    """The time bound is the priced count: running past it is a bug, stopped after the charge as a
    charged failure that says nothing of the data."""
    with neighbour(False) as db:
        executor: Executor = db._executor
        ran, entries = [], []
        executor._fetch = lambda statement, sample_key=None: ran.append(statement) or [(1,)]

        def charge() -> int:
            entries.append(1)
            return 0

        with pytest.raises(QueryFailed):
            executor.execute_adaptive(charge, lambda fetch: [fetch("one"), fetch("two")], statements=1)
        assert entries == [1] and ran == ["one"]
