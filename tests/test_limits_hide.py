"""What the limits hide, said (issue 37, item 6): keys left out by partition selection, rows with
no unit, and the cell of rows outside a KEYS domain, on every surface, from released values and
plan constants only."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from fractions import Fraction

import duckdb
import pandas as pd
import pytest
from cli_run import run

import dpsql
from dpsql.curator.dropped import plan_dropped, release_dropped
from dpsql.mechanisms.noise import SeededSource, discrete_laplace
from dpsql.mechanisms.selection import release_probability, selection_rule
from dpsql.query.limits import RecordedDrop
from dpsql.query.outside import told_from_noise
from dpsql.shell.session import handle_input
from dpsql.shell.state import new_state

POLICY = ("BUDGET EPSILON 1000 DELTA 0.01; QUERY EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, "
          "MAX GROUPS PER UNIT 2, x BOUNDS 0 TO 10, k KEYS ('a', 'b', 'c'));")
GROUPED = "SELECT g, COUNT(*) AS n FROM t GROUP BY g"
KEYED = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
SELECTED = "The GROUP BY keys are private: a key was released only where its count of distinct uid values"


def table(units: int = 400, groups: int = 6, nameless: int = 0, outside: int = 0) -> pd.DataFrame:
    """``units`` units of two rows each in groups g0..g5 and keys a..c, ``nameless`` rows with
    no unit, and ``outside`` more units whose key is outside the KEYS domain."""
    rows = [(u, f"g{u % groups}", "abc"[u % 3], 1.0) for u in range(units) for _ in range(2)]
    rows += [(None, "g0", "a", 1.0)] * nameless
    rows += [(units + u, "g0", "zz", 1.0) for u in range(outside)]
    return pd.DataFrame(rows, columns=["uid", "g", "k", "x"]).astype({"uid": "Int64"})


# -- 1. partition selection says what it leaves out ------------------------------------------------

def test_an_answer_through_partition_selection_names_its_threshold_in_units():
    """The note's threshold and 95% count are the plan's (recomputed here from the selection
    rule), and the note is the same for another table: nothing in it depends on the data."""
    with dpsql.connect({"t": table()}, policy=POLICY, ledger=":memory:") as db:
        plan = db._prepare(GROUPED, 1, 1e-6).plan
        rule = selection_rule(plan.selection.epsilon, plan.selection.delta, 2, "unbounded")
        likely = next(c for c in range(rule.threshold, rule.threshold + 10**4) if release_probability(c, rule) >= 0.95)
        answer = db.sql(GROUPED, epsilon=1, delta=1e-6)
        assert len(answer) >= 5  # not thin: this note alone says what selection did
        note, = [n for n in answer.notes if n.startswith(SELECTED)]
        assert (f"plus noise reached {rule.threshold:,} (partition selection at epsilon "
                f"{float(plan.selection.epsilon):.6g}, delta {float(plan.selection.delta):.6g})") in note
        assert f"a key with {likely:,} or more is released with 95% probability" in note
        assert "each uid counts in at most 2 groups" in note
        keyed = db.sql(KEYED, epsilon=1)
        assert not any(n.startswith("The GROUP BY keys are private") for n in keyed.notes)  # public keys
    with dpsql.connect({"t": table(units=900, groups=9)}, policy=POLICY, ledger=":memory:") as other:
        assert [n for n in other.sql(GROUPED, epsilon=1, delta=1e-6).notes if n.startswith(SELECTED)] == [note]


def test_explain_says_it_before_anything_is_charged():
    with dpsql.connect({"t": table()}, policy=POLICY, ledger=":memory:") as db:
        text = db.explain(GROUPED, epsilon=1, delta=1e-6)
        assert "The GROUP BY keys are private: a key is released only where its count of distinct uid values " \
               "plus noise reaches" in text
        assert db.budget.spent.epsilon == 0


def test_a_thin_answer_keeps_its_own_note_and_no_second_one():
    with dpsql.connect({"t": table(units=30)}, policy=POLICY, ledger=":memory:") as db:
        notes = db.sql(GROUPED, epsilon=0.1, delta=1e-9).notes
    assert notes[0].startswith(("No rows were released", "Only ")) and not any(n.startswith(SELECTED) for n in notes)


@pytest.fixture
def files(tmp_path):
    database = tmp_path / "shop.duckdb"  # psql_lines connects to a database named shop
    connection = duckdb.connect(str(database))
    connection.register("frame", table(nameless=40))
    connection.execute("CREATE TABLE t AS SELECT * FROM frame")
    connection.close()
    (tmp_path / "t.policy").write_text(POLICY, encoding="utf-8")
    return tmp_path, str(database), str(tmp_path / "t.policy")


def test_the_cli_and_the_shell_show_the_note(files, capsys):
    _, database, policy = files
    code, _, err = run(capsys, "query", database, GROUPED, "--policy", policy, "--epsilon", "1", "--delta", "1e-6")
    assert code == 0 and f"note: {SELECTED}" in err
    with dpsql.connect(database, policy=policy) as db:
        state = new_state(db, width=100, color=False)
        handle_input(state, ".delta 1e-6")
        assert f"note: {SELECTED}" in handle_input(state, GROUPED + ";")


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_the_server_sends_the_note_and_the_limits_line(files):
    from served import psql_lines, serve_shop

    directory, database, _ = files
    server = serve_shop(database, directory, POLICY, "ann", "ann-secret")
    try:
        grouped = GROUPED.replace("SELECT ", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (delta = 1e-6) ", 1)
        _, text = psql_lines(server, "ann", "ann-secret", grouped, KEYED)
    finally:
        server.stop()
        server.thread.join(10)
    assert f"NOTICE:  dpsql: {SELECTED}" in text, text
    assert "rows with no uid belong to nobody and are never counted" in text


# -- 2. rows with no unit --------------------------------------------------------------------------

def test_without_an_estimate_the_limits_line_says_the_fact_and_nothing_of_the_data():
    """The same line whether the table has no row without a unit or 300 of them."""
    lines = []
    for nameless in (0, 300):
        with dpsql.connect({"t": table(nameless=nameless)}, policy=POLICY, ledger=":memory:") as db:
            lines.append(str(db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).limits))
    assert lines[0] == lines[1]
    assert "rows with no uid belong to nobody and are never counted" in lines[0]


def test_the_recorded_count_is_noisy_and_charged_once():
    """Seeded alike, two tables that differ by 300 rows with no unit give counts 300 apart: the
    same noise on each exact count, which the estimate's release draws (``release_dropped``);
    the ledger keeps the noisy count and its width only, and every answer shows them."""
    recorded = []
    for nameless in (0, 300):
        with dpsql.connect({"t": table(nameless=nameless)}, policy=POLICY, ledger=":memory:",
                           rng=SeededSource(11)) as db:
            drop = db.estimate_limits(1)["t"]
            assert db.budget.spent.epsilon == 1
            plan = plan_dropped(db.policy.table("t"), "t", Fraction(1))
            assert drop.no_unit == release_dropped(plan, (800, 0, nameless), SeededSource(11)).no_unit
            assert drop.no_unit.value != nameless  # noised (the seed's draw is not 0)
            assert RecordedDrop.from_json(drop.to_json()) == drop
            line = str(db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).limits)
            assert f"rows with no uid ({drop.no_unit} of t's rows) belong to nobody and are never counted" in line
            assert db.budget.spent.epsilon == 2
            recorded.append(drop.no_unit)
    assert recorded[1].value - recorded[0].value == 300 and recorded[0].halfwidth == recorded[1].halfwidth


def test_an_estimate_recorded_before_the_count_shows_the_fact_alone():
    old = ('{"table":"t","unit":"uid","rows_per_unit":3,"share":[0.1,0.02],"epsilon":"1",'
           '"estimated":"2026-01-01"}')
    drop = RecordedDrop.from_json(old)
    assert drop is not None and drop.no_unit is None
    from dpsql.query.limits import Limits

    line = str(Limits("uid", 3, None, (), (drop,), no_unit=True))
    assert "rows with no uid belong to nobody and are never counted" in line


# -- 3. the outside cell: shown when asked, or when told from noise ------------------------------

def test_an_empty_outside_cell_is_told_from_noise_at_most_5_percent_of_the_time():
    """The decision on the plan's own measures, over 20,000 empty cells (every measure exactly 0
    plus its noise): shown in at most 6% (Chernoff: a correct rule fails this with probability
    < 1e-9), and in at least 3% (a rule that never shows is not what we want either). Half-widths
    computed at half the noise scale would show about 15% (> 6%: fails every time)."""
    with dpsql.connect({"t": table()}, policy=POLICY, ledger=":memory:") as db:
        plan = db._prepare("SELECT k, COUNT(*) AS n, AVG(x) AS a, SUM(x) AS s FROM t GROUP BY k", 1).plan
    measures = [m for m in plan.measures if m.kind in ("count", "sum")]
    assert len(measures) >= 3 and all(m.noise == "laplace" for m in measures)
    source, runs = SeededSource(5), 20_000
    draws = {m.name: discrete_laplace(m.scale, runs, source) for m in measures}
    shown = sum(told_from_noise(plan, {name: int(values[i]) for name, values in draws.items()}) for i in range(runs))
    assert 0.03 * runs <= shown <= 0.06 * runs
    narrow = replace(plan, measures=tuple(replace(m, scale=m.scale / 2) for m in plan.measures))  # mutated
    wrongly = sum(told_from_noise(narrow, {name: int(values[i]) for name, values in draws.items()})
                  for i in range(2000))
    assert wrongly > 0.06 * 2000


def test_outside_rows_that_stand_out_are_shown_and_an_empty_cell_is_shown_only_when_asked():
    with dpsql.connect({"t": table(outside=300)}, policy=POLICY, ledger=":memory:", rng=SeededSource(2)) as db:
        crowded = db.sql(KEYED, epsilon=1)
        assert crowded.outside_domain.shown and "rows with k outside its KEYS domain" in repr(crowded)
    hidden = 0
    for seed in range(5):
        with dpsql.connect({"t": table()}, policy=POLICY, ledger=":memory:", rng=SeededSource(seed)) as db:
            empty = db.sql(KEYED, epsilon=1)
            assert empty.outside_domain is not None  # always there to read
            assert ("outside its KEYS domain" in repr(empty)) == empty.outside_domain.shown
            hidden += not empty.outside_domain.shown
            asked = db.sql(KEYED.replace("SELECT ", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (show_outside = true) "),
                           epsilon=1)
            assert asked.repeat and db.budget.spent.epsilon == 1  # presentation only: the same answer, free
            assert asked.outside_domain.shown and "rows with k outside its KEYS domain" in repr(asked)
    assert hidden >= 3  # each is hidden with probability >= 95%; these five seeds are fixed


def test_the_cli_hides_an_empty_outside_cell_unless_asked(files, capsys):
    _, database, policy = files
    shown = []
    for _ in range(5):
        code, _, err = run(capsys, "query", database, KEYED, "--policy", policy, "--epsilon", "0.5")
        assert code == 0
        shown.append("outside its KEYS domain" in err)
    assert shown.count(False) >= 1  # five fresh draws, each shown with probability <= 5%: all shown < 1e-6
    asked = KEYED.replace("SELECT ", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (show_outside = true) ")
    code, _, err = run(capsys, "query", database, asked, "--policy", policy, "--epsilon", "0.5")
    assert code == 0 and re.search(r"≈ [\d,]+ (± [\d,]+|\[0, [\d,]+\]) rows with k outside its KEYS domain", err), err


def test_the_rule_reads_only_the_values_and_the_plan_it_is_given():
    """``told_from_noise`` reads the noisy values it is given and the plan: a value just inside
    the half-width is hidden, just beyond it shown."""
    from types import SimpleNamespace as S

    from dpsql.analysis.aggregates.exact import noise_half_width

    count = S(name="m0", kind="count", noise="laplace", scale=Fraction(4))
    plan = S(measures=(count,))
    width = noise_half_width(count, 0.05)
    assert [told_from_noise(plan, {"m0": v}) for v in (width, width + 1, -width - 1)] == [False, True, True]
    assert not told_from_noise(S(measures=(S(name="m0", kind="histogram", noise="exponential"),)), {"m0": 10**9})
