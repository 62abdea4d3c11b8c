"""Intervals and released values stay within what the policy makes possible (issue 23, item 2).

The bounded truth of a COUNT is at least 0, of an AVG within its BOUNDS, of a SUM of values
>= 0 at least 0, of a population VARIANCE within [0, (hi - lo)^2 / 4]: whatever the noise, no
released value and no end of its interval may leave that range. Cutting is post-processing (it
reads released values and the policy only), and the truth lies in the range, so the cut
interval holds it as often as the uncut one; the shell, notebook and server then show an
interval cut at one end as ``value [low, high]``, not as a symmetric ±.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

import dpsql
from dpsql.mechanisms.noise import SeededSource
from dpsql.shell.render import answer_from, cell_texts

POLICY = ("BUDGET EPSILON 1000; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, x BOUNDS 0 TO 10, "
          "y BOUNDS -5 TO 5, g KEYS ('a', 'b', 'c'));")
FRAME = pd.DataFrame({"uid": [1, 1, 2, 3], "g": ["a", "a", "a", "b"], "x": [1.0, 9.0, 4.0, 10.0],
                      "y": [-5.0, 5.0, 0.0, 1.0]})
QUERY = ("SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a, VAR_POP(x) AS v, STDDEV_POP(x) AS sd, "
         "SUM(y) AS sy, MEDIAN(x) AS m FROM t WHERE {seed} = {seed} GROUP BY g")
"""Each seed's text differs, so no answer is an earlier one repeated for free."""
POSSIBLE = {"n": (0, math.inf), "s": (0, math.inf), "a": (0, 10), "v": (0, 25), "sd": (0, 5),
            "sy": (-math.inf, math.inf), "m": (0, 10)}
"""Per output of QUERY: the range its bounded truth can take under POLICY."""


@pytest.fixture(scope="module")
def answers():
    """QUERY at a small epsilon (so the noise reaches past every bound), under 40 seeds."""
    found = []
    with dpsql.connect({"t": FRAME}, policy=POLICY, ledger=":memory:") as db:
        for seed in range(40):
            db._rng = SeededSource(seed)
            found.append(db.sql(QUERY.format(seed=seed), epsilon=0.05))
    return found


def test_every_value_and_interval_end_lies_in_the_possible_range(answers):
    cut = set()
    for result in answers:
        frame = result.intervals()
        for name, (floor, ceiling) in POSSIBLE.items():
            for value, low, high in zip(frame[name], frame[f"{name}_low"], frame[f"{name}_high"]):
                assert floor <= value <= ceiling, (name, value)
                assert floor <= low <= value <= high <= ceiling, (name, low, value, high)
                cut |= {name} if low == floor or high == ceiling else set()
    assert cut >= {"n", "s", "a", "v", "sd", "m"}  # the noise did reach the bounds: the cut was tested


def test_half_widths_are_no_wider_than_the_cut_interval(answers):
    for result in answers:
        frame, widths = result.intervals(), result.accuracy_df()
        for name in POSSIBLE:
            for value, low, high, half in zip(frame[name], frame[f"{name}_low"], frame[f"{name}_high"], widths[name]):
                assert half <= max(value - low, high - value) + 1e-9 * max(1.0, abs(value))


def test_the_shell_shows_a_cut_interval_as_low_high(answers):
    result = next(r for r in answers if any(low == 0 for low in r.intervals()["n_low"]))
    texts = cell_texts(answer_from(result))
    n_column = result.columns.index("n")
    assert all(" [" in row[n_column] and "±" not in row[n_column] for row in texts)
    low = next(row[n_column] for row, l in zip(texts, result.intervals()["n_low"]) if l == 0)
    assert low.split("[")[1].startswith("0, ")


def test_a_sum_of_values_of_one_sign_keeps_that_sign():
    frame = pd.DataFrame({"uid": range(3), "x": [0.0, 0.0, 0.0], "y": [0.0, 0.0, 0.0], "g": "a"})
    seen = set()
    with dpsql.connect({"t": frame}, policy=POLICY, ledger=":memory:") as db:
        for seed in range(30):
            db._rng = SeededSource(seed)
            row = db.sql(f"SELECT SUM(x) AS s, SUM(-x) AS negative FROM t WHERE {seed} = {seed}",
                         epsilon=0.1).fetchall()[0]
            assert row[0] >= 0 and row[1] <= 0
            seen.add(row[0] == 0)
    assert seen == {True, False}  # some draws were cut at 0, some were not
