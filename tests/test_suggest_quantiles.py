"""``dpsql suggest`` that a curator can use (issue 37, item 8): measure-like columns by default,
a pre-policy run that can be repeated, refusal hints for who sees them, and bounds from DP
quantiles that state the share of units they cover, row bounds and BOUNDS PER UNIT
(``dpsql.curator.suggest_columns``, ``dpsql.curator.suggest_quantiles``)."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

import dpsql
from dpsql import cli
from dpsql.backends.render import render
from dpsql.curator.suggest import _identity, _table, value_candidates
from dpsql.curator.suggest_quantiles import (
    SHARE_SCALE,
    TOTAL_WEIGHT,
    aim,
    draw_bound,
    draw_unit_bound,
    ranks_from,
    shares_select,
    totals_select,
)
from dpsql.errors import BudgetExceeded
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.total_bound import rank_gaps

# -- which columns by default --------------------------------------------------------------------


def flights_like(units: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    uid = np.repeat(np.arange(units), 5)
    n = len(uid)
    return pd.DataFrame({"tailnum": uid.astype(str), "year": 2013, "month": rng.integers(1, 13, n),
                         "day": rng.integers(1, 29, n), "hour": rng.integers(0, 24, n),
                         "sched_dep_minute": rng.integers(0, 60, n), "flight": rng.integers(1, 5000, n),
                         "route_id": rng.integers(1, 50, n), "dest": rng.integers(0, 9, n),
                         "dep_delay": rng.exponential(15, n) - 5, "distance": rng.integers(100, 5000, n),
                         "carrier": "AA"})


def test_default_columns_are_the_measures_and_the_rest_are_named_with_their_reason(tmp_path, capsys):
    policy = ("BUDGET EPSILON 10; PRIVATE TABLE flights (PRIVACY UNIT tailnum, MAX ROWS PER UNIT 5, "
              "dest KEYS (0, 1, 2, 3, 4, 5, 6, 7, 8));")
    with dpsql.connect({"flights": flights_like()}, policy=policy, rng=SeededSource(1)) as db:
        suggestion = db.suggest_bounds("flights", epsilon=2)
    assert list(suggestion["bounds"]) == ["dep_delay", "distance"]
    assert suggestion["skipped"] == {"year": "a calendar part", "month": "a calendar part", "day": "a calendar part",
                                     "hour": "a calendar part", "sched_dep_minute": "a calendar part",
                                     "flight": "an identifier, named after the table", "route_id": "an identifier",
                                     "dest": "a KEYS column"}
    database = tmp_path / "f.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("frame", flights_like())
    connection.execute("CREATE TABLE flights AS SELECT * FROM frame")
    connection.close()
    assert cli.main(["suggest", str(database), "flights", "--unit", "tailnum", "--epsilon", "2"]) == 0
    out = capsys.readouterr().out
    # the stand-in policy of a run before any policy has no KEYS: dest is bounded there
    assert "-- measure-like columns bounded: dest, dep_delay, distance; left out: year (a calendar part)" in out
    assert "route_id (an identifier)" in out and "name columns with --columns to choose" in out
    # named columns are bounded whatever their names
    with dpsql.connect({"flights": flights_like()}, policy=policy, rng=SeededSource(1)) as db:
        named = db.suggest_bounds("flights", epsilon=2, columns=["hour", "flight"])
    assert list(named["bounds"]) == ["hour", "flight"] and named["skipped"] == {}


# -- the pre-policy run, and who a refusal speaks to ---------------------------------------------


def test_a_pre_policy_run_repeats_and_a_stored_policy_is_not_stood_in_for(tmp_path, capsys):
    database = tmp_path / "f.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("frame", flights_like(200))
    connection.execute("CREATE TABLE flights AS SELECT * FROM frame")
    connection.close()
    for epsilon, recorded in (("1", "1"), ("1", "2"), ("0.25", "2.25")):
        assert cli.main(["suggest", str(database), "flights", "--unit", "tailnum", "--epsilon", epsilon,
                         "--columns", "dep_delay"]) == 0
        err = capsys.readouterr().err
        assert f"records ε {recorded} spent on suggestions before any policy" in err, err
    for bad in ("nan", "-1", "inf"):  # refused before anything is read or charged
        assert cli.main(["suggest", str(database), "flights", "--unit", "tailnum", "--epsilon", bad]) == 1
        assert "--epsilon must be a positive number" in capsys.readouterr().err
    policy = tmp_path / "p.policy"
    policy.write_text("BUDGET EPSILON 3; PRIVATE TABLE flights (PRIVACY UNIT tailnum, MAX ROWS PER UNIT 5);")
    assert cli.main(["init", str(database), "--policy", str(policy)]) == 0
    capsys.readouterr()
    assert cli.main(["suggest", str(database), "flights", "--unit", "tailnum", "--epsilon", "1"]) == 1
    assert "a policy is stored with this database: leave out --unit" in capsys.readouterr().err
    # what the pre-policy runs spent counts against the stored budget: 2.25 of 3
    assert cli.main(["suggest", str(database), "flights", "--epsilon", "1", "--columns", "dep_delay"]) == 3
    err = capsys.readouterr().err
    assert "only 0.75 remains" in err and "dpsql init DB --policy P --replace" in err
    assert "ask the data curator" not in err


def test_a_budget_refusal_tells_the_curator_how_to_raise_it_and_the_analyst_whom_to_ask():
    with dpsql.connect({"t": flights_like(50)}, policy="BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT tailnum, "
                       "MAX ROWS PER UNIT 5, distance BOUNDS 0 TO 5000);") as db:
        with pytest.raises(BudgetExceeded) as refused:
            db.sql("SELECT COUNT(*) AS n FROM t", epsilon=2)
    error = refused.value
    for surface in ("python", "cli", "shell"):
        assert "ask the data curator" not in error.hint_for(surface)
        assert "raise the policy's budget" in error.hint_for(surface)
    assert error.hint_for("sql") == "ask for less, or ask the data curator for more budget"


# -- the sensitivity of what the draws read, by brute force ---------------------------------------

PROFILES = [(), (1.0,), (150.0,), (-3.0, 7.0), (7.0,) * 5, (float("nan"), 2.0), (None, 1e12), (-1e9, 40.0, 2.5),
            (0.0,) * 12]
EDGES = value_candidates(False)


def _rank_vectors(profile, kind: str) -> list[tuple[list[int], int]]:
    """(ranks, total) of every draw over background units plus unit 1 with ``profile``, built as
    ``column_bounds`` builds them: the row shares for the lower and the upper draw (units
    without a value below every candidate in the upper one), or the per-unit totals of positive
    parts and of negative parts' magnitudes with the cap candidate ranking every unit."""
    rows = [(100, 5.0), (100, 6.0), (101, -2.0), (102, None), (103, 30.0)] + [(1, v) for v in profile]
    frame = pd.DataFrame(rows, columns=["uid", "x"]).astype({"x": "float64"})
    connection = duckdb.connect()
    connection.register("frame", frame)
    connection.execute("CREATE TABLE t AS SELECT * FROM frame")
    owner = _identity("uid", {"uid": "BIGINT"})
    units = frame["uid"].nunique()
    if kind == "shares":
        fetched = connection.execute(render(shares_select(_table("t"), owner, "x", EDGES))).fetchall()
        *ranks, with_values = ranks_from(fetched, len(EDGES))
        missing = SHARE_SCALE * units - with_values
        return [(ranks, SHARE_SCALE * units), ([r + missing for r in ranks], SHARE_SCALE * units)]
    fetched = connection.execute(render(totals_select(_table("t"), owner, "x", Fraction(-5), Fraction(40),
                                                      EDGES))).fetchall()
    return [(ranks_from([(b, n) for part, b, n in fetched if part == p], len(EDGES))[:-1] + [units], units)
            for p in (0, 1)]


def _largest_utility_move(kind: str) -> Fraction:
    """The most any draw's utility (``rank_gaps``, exact, at quantiles suggest aims at) moves
    between neighbours: a unit added or removed (the empty profile against each) or replaced."""
    results = [_rank_vectors(p, kind) for p in PROFILES]
    moved = Fraction(0)
    for x, y in product(results, results):
        for (ranks_x, total_x), (ranks_y, total_y) in zip(x, y):
            for q in (Fraction(1, 100), Fraction(1, 2), Fraction(99, 100), Fraction(9, 10)):
                (gaps_x, scale), (gaps_y, _) = rank_gaps(ranks_x, total_x, q), rank_gaps(ranks_y, total_y, q)
                moved = max(moved, max(Fraction(abs(gx - gy), scale) for gx, gy in zip(gaps_x, gaps_y)))
    return moved


@pytest.mark.parametrize("kind, declared", [("shares", SHARE_SCALE), ("totals", TOTAL_WEIGHT)])
def test_the_rank_utility_moves_by_at_most_the_weight_the_draw_is_given(kind, declared):
    """The Δu each draw is given (S for the row shares, 1 for the per-unit totals) bounds how
    far one unit moves its utility under add/remove and replace, and is nearly reached: a
    declared Δu of half (a mutated weight) would not hold."""
    moved = _largest_utility_move(kind)
    assert moved <= declared
    assert moved > declared / 2


# -- what is stated holds --------------------------------------------------------------------------


def test_the_suggested_per_unit_bound_leaves_at_most_the_stated_share_of_units_above_it():
    """3,000 units with per-unit totals spread over every positive candidate (so the grid adds
    no slack); 400 draws of the upper per-unit bound at epsilon 1/13 (aimed at the 5.5% tail).
    Each stated share holds with probability ≥ 97.5%, so more than 35 misses of 400 has
    probability < 1e-6 (binomial). Stating the aimed share alone (no rank error) misses far
    more often: the test sees a statement that leaves the error out."""
    rng = np.random.default_rng(3)
    totals = rng.choice([float(c) for c in EDGES if c > 0], size=3000)
    ranks = [int((totals <= float(c)).sum()) for c in EDGES]
    source = SeededSource(4)
    misses = aimed_misses = 0
    for _ in range(400):
        bound = draw_unit_bound(EDGES, ranks, len(totals), Fraction(10**10), Fraction(1, 13), len(totals), source)
        assert bound is not None
        above = float((totals > float(bound.value)).mean())
        misses += above > bound.stated
        aimed_misses += above > bound.aimed
    assert binom.sf(35, 400, 0.025) < 1e-6
    assert misses <= 35 and aimed_misses > 35, (misses, aimed_misses)
    assert aim(Fraction(1, 13), len(EDGES), 3000).tail > 0.08  # a row bound aims further in
    # the cap ranks every unit: a draw landing there states nothing beyond it
    capped = draw_unit_bound(EDGES, ranks, len(totals), Fraction(50), Fraction(1, 13), len(totals), SeededSource(5))
    assert capped.value == 50 and capped.stated == 0.0


def test_per_unit_bounds_on_flights_like_data_are_far_below_rows_times_row_bounds():
    """Units with 20-60 rows of skewed delays: the suggested BOUNDS PER UNIT upper bound is a
    share of k × hi (what the row model's SUM moves by), and the printed fragment states both."""
    rng = np.random.default_rng(8)
    sizes = rng.integers(20, 61, size=3000)
    frame = pd.DataFrame({"uid": np.repeat(np.arange(3000), sizes)})
    frame["delay"] = np.where(rng.random(len(frame)) < 0.1, rng.integers(60, 600, len(frame)),
                              rng.integers(-10, 15, len(frame)))
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 5);"
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(2)) as db:
        suggestion = db.suggest_bounds("t", epsilon=4)
    k, (lo, hi), (low, high) = suggestion["max_rows_per_unit"], suggestion["bounds"]["delay"], \
        suggestion["unit_bounds"]["delay"]
    assert low <= 0 <= high < k * max(abs(lo), hi) / 2
    clamped = frame.assign(v=frame["delay"].clip(lo, hi))
    positive = clamped.assign(v=clamped["v"].clip(lower=0)).groupby("uid")["v"].sum()
    negative = clamped.assign(v=clamped["v"].clip(upper=0)).groupby("uid")["v"].sum()
    said = suggestion["coverage"]["delay"]
    assert (positive > high).mean() <= said["unit_upper"]["at_most"]
    assert (negative < low).mean() <= said["unit_lower"]["at_most"]
    from dpsql.curator.suggest_text import suggestion_text
    text = suggestion_text("t", "uid", suggestion, 4)
    assert f"    delay BOUNDS PER UNIT {low} TO {high}\n" in text
    assert f"moves an answer by at most {max(-low, high)} instead of k × max(|lo|, |hi|) = {k} × " in text


def test_units_are_told_apart_by_their_exact_identity():
    """'A' and 'a' in a COLLATE NOCASE unit column are two units in the shares and the totals
    (DESIGN.md invariant 20), as in the bounded copy."""
    connection = duckdb.connect()
    connection.execute("CREATE TABLE t (uid VARCHAR COLLATE NOCASE, x DOUBLE)")
    connection.execute("INSERT INTO t VALUES ('A', 1.0), ('A', 3.0), ('a', 100.0)")
    owner = _identity("uid", {"uid": "VARCHAR"})
    shares = ranks_from(connection.execute(render(shares_select(_table("t"), owner, "x", EDGES))).fetchall(),
                        len(EDGES))
    assert shares[-1] == 2 * SHARE_SCALE
    assert shares[list(EDGES).index(Fraction(2))] == SHARE_SCALE // 2  # half of A's rows, none of a's
    totals = connection.execute(render(totals_select(_table("t"), owner, "x", Fraction(0), Fraction(200),
                                                     EDGES))).fetchall()
    positive = ranks_from([(b, n) for part, b, n in totals if part == 0], len(EDGES))
    assert positive[-1] == 2 and positive[list(EDGES).index(Fraction(4))] == 1  # A totals 4, a 100


def test_a_suggested_row_bound_leaves_at_most_the_stated_share_of_each_units_rows_above_it():
    """The row bounds' statement, as the per-unit one: 3,000 units of 1-5 rows spread over the
    positive candidates, ranks as ``shares_select`` computes them (each unit weighing S); 400
    draws of the upper row bound at epsilon 1/4 (aimed at the 2.7% tail, its run-off margin).
    The average over units of the share of a unit's rows above it exceeds the stated share in at
    most 35 of 400 (failure < 1e-6 for a correct statement); the aimed share alone fails."""
    rng = np.random.default_rng(9)
    positive = [float(c) for c in EDGES if c > 0]
    units = [rng.choice(positive, size=rng.integers(1, 6)) for _ in range(3000)]
    ranks = [sum(SHARE_SCALE * int((rows <= float(c)).sum()) // len(rows) for rows in units) for c in EDGES]
    source = SeededSource(10)
    misses = aimed_misses = 0
    for _ in range(400):
        bound = draw_bound("upper", EDGES, ranks, SHARE_SCALE * len(units), SHARE_SCALE, Fraction(1, 4), len(units),
                           source)
        above = float(np.mean([(rows > float(bound.value)).mean() for rows in units]))
        misses += above > bound.stated
        aimed_misses += above > bound.aimed
    assert misses <= 35 and aimed_misses > 35, (misses, aimed_misses)
