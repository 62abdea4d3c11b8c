"""An answer over a public KEYS domain says how many of its rows may be noise alone (issue 23, item 4).

Every key of a public domain is released, rows or not; a key without rows shows only noise. The
answer notes the rows whose counts' 95% intervals hold 0, and an ORDER BY ... LIMIT that ranked
such rows. Notes read released values and intervals only: the same rows give the same notes.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

import dpsql
from dpsql.mechanisms.noise import SeededSource

KEYS = ", ".join(f"'k{i}'" for i in range(40))
POLICY = f"BUDGET EPSILON 100 DELTA 1e-5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, x BOUNDS 0 TO 1, g KEYS ({KEYS}));"
# 2,000 units in k0 and k1; the 38 other keys have no rows at all
FRAME = pd.DataFrame({"uid": range(4000), "g": ["k0"] * 2000 + ["k1"] * 2000, "x": 1.0})


@pytest.fixture()
def db():
    with dpsql.connect({"t": FRAME}, policy=POLICY, ledger=":memory:") as connection:
        connection._rng = SeededSource(11)
        yield connection


def test_rows_within_their_interval_of_zero_are_counted(db):
    result = db.sql("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1)
    frame = result.intervals()
    near = int(((frame["n_low"] <= 0) & (frame["n_high"] >= 0)).sum())
    assert near >= 38 - 2  # the keys without rows (a few may land above their ±)
    note = next(n for n in result.notes if "within their ± of 0" in n)
    assert note.startswith(f"{near:,} of 40 rows are within their ± of 0 (n's 95% interval holds 0)")


def test_a_limit_over_noisy_values_says_noise_may_have_picked_its_rows(db):
    result = db.sql("SELECT g, COUNT(*) AS n FROM t GROUP BY g ORDER BY n DESC LIMIT 5", epsilon=1)
    keys = [row[0] for row in result.fetchall()]
    assert keys[:2] == ["k0", "k1"] or sorted(keys[:2]) == ["k0", "k1"]
    note = next(n for n in result.notes if n.startswith("ORDER BY ... LIMIT chose among noisy values"))
    # the three noise keys ranked below k0 and k1, less any whose noise rose past its ± (LIMIT picks those)
    shown = int(re.search(r"and (\d+) of the 5 rows shown are within their ± of 0", note).group(1))
    assert 1 <= shown <= 3


def test_no_note_where_every_row_is_clearly_filled_or_keys_are_private(db):
    filled = db.sql("SELECT g, COUNT(*) AS n FROM t WHERE g IN ('k0', 'k1') GROUP BY g", epsilon=1)
    assert not any("within their ± of 0" in n for n in filled.notes)
    averages = db.sql("SELECT g, AVG(x) AS a FROM t GROUP BY g", epsilon=1)  # no count or sum to tell by
    assert not any("within their ± of 0" in n for n in averages.notes)
    private = dpsql.connect({"t": FRAME}, policy=POLICY.replace(f", g KEYS ({KEYS})", ""), ledger=":memory:")
    with private:
        answer = private.sql("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1, delta=1e-6)
        assert not any("within their ± of 0" in n for n in answer.notes)


def test_a_repeat_carries_the_same_note(db):
    sql = "SELECT g, COUNT(*) AS n FROM t GROUP BY g"
    first, again = db.sql(sql, epsilon=1), db.sql(sql, epsilon=1)
    assert again.cost.repeat and again.notes == first.notes


def test_one_key_without_rows_is_noted_too():
    frame = pd.DataFrame({"uid": range(4000), "g": ["k0"] * 2000 + ["k1"] * 2000, "x": 1.0})
    policy = POLICY.replace(f"g KEYS ({KEYS})", "g KEYS ('k0', 'k1', 'ghost')")
    with dpsql.connect({"t": frame}, policy=policy, ledger=":memory:") as connection:
        connection._rng = SeededSource(5)
        notes = connection.sql("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1).notes
    assert any(n.startswith("One row of 3 is within its ± of 0") and "so it may be noise alone" in n for n in notes)


def test_a_limit_of_one_row_is_said_in_the_singular(db):
    result = db.sql("SELECT g, COUNT(*) AS n FROM t WHERE g NOT IN ('k0', 'k1') GROUP BY g ORDER BY n LIMIT 1",
                    epsilon=1)
    note = next(n for n in result.notes if n.startswith("ORDER BY ... LIMIT"))
    assert "the row shown is within its ± of 0" in note and "noise may have picked it." in note
    assert "1 rows" not in note
