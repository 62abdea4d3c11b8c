"""EXPLAIN says what runs and nothing that does not hold (issue 23, item 8): no groups per unit
without GROUP BY, a quantile's histogram statement instead of ``SELECT 1 AS dp_none``, and a
summary without SQL that keeps the measures, sensitivities, noise, cost and limits."""

from __future__ import annotations

import pytest

from dpsql.answer.explain import BOUNDED_SQL, POST_SQL, summary


def test_an_ungrouped_query_says_nothing_of_groups_and_a_grouped_one_does(db):
    ungrouped = db.explain("SELECT COUNT(*) AS n FROM visits")
    assert "at most 10 rows per unit" in ungrouped and "group" not in ungrouped.split("\n\n")[0]
    assert "groups per" not in ungrouped  # neither in the unit line nor in the limits line
    grouped = db.explain("SELECT store, COUNT(*) AS n FROM visits GROUP BY store")
    assert "at most 10 rows and 5 groups per unit" in grouped and "5 groups per user_id" in grouped


@pytest.mark.parametrize("sql", ["SELECT MEDIAN(age) AS m FROM visits",
                                 "SELECT QUANTILE_CONT(amount, 0.9) AS q FROM visits"])
def test_an_ungrouped_quantile_shows_its_histogram_statement_not_select_1(db, sql):
    text = db.explain(sql)
    assert "dp_none" not in text and BOUNDED_SQL not in text  # the core reads nothing: not shown
    section = text.split("bounded SQL of m0, run on its own (the quantile's histogram):\n", 1)[1].split("\n\n")[0]
    assert "dp_bounded_visits" in section and "GROUP BY" in section and "bucket" in section


def test_a_grouped_quantile_shows_the_core_statement_and_the_histogram_statement(db):
    text = db.explain("SELECT store, COUNT(*) AS n, MEDIAN(age) AS m FROM visits GROUP BY store")
    assert BOUNDED_SQL in text and "(the quantile's histogram)" in text
    assert text.index(BOUNDED_SQL) < text.index("bounded SQL of m1") < text.index(POST_SQL)


def test_the_summary_leaves_out_the_sql_and_keeps_the_rest(db):
    full = db.explain("SELECT store, COUNT(*) AS n, AVG(amount) AS a, MEDIAN(age) AS m FROM visits GROUP BY store")
    short = summary(full)
    assert len(short.splitlines()) < 30 < len(full.splitlines())
    for kept in ("privacy unit: user_id", "cost: epsilon", "L1 sensitivity", "discrete Laplace, scale",
                 "exponential mechanism", "limits: at most 10 rows and 5 groups per user_id", "accounting:"):
        assert kept in short
    for dropped in ("SELECT", "dp_bounded", BOUNDED_SQL, POST_SQL, "bounded SQL of"):
        assert dropped not in short
    assert [part for part in full.split("\n\n") if part in short.split("\n\n")] == short.split("\n\n")


def test_the_summary_keeps_a_budget_refusal(db):
    text = db.explain("SELECT COUNT(*) FROM visits", epsilon=100)
    assert text.refused is not None and summary(text).refused is text.refused
    assert "it would be refused" in summary(text)
