"""The ``dpsql`` command line: query, explain, budget, init, shell (demo is in test_demo.py).

Each test runs ``cli.main`` in-process on its own copy of the demo database, so each starts
with the full budget and its own ledger beside the file.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from cli_run import run

import dpsql
from dpsql import cli
from dpsql.demo import SHOP_POLICY, build_shop_database

GROUPED = "SELECT plan, COUNT(*) AS users FROM users GROUP BY plan ORDER BY plan"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("built") / "shop.duckdb"
    build_shop_database(path)
    return path


def spent(database: str) -> float:
    with dpsql.connect(database, policy=SHOP_POLICY) as db:
        return float(db.budget.spent.epsilon)


def test_every_command_is_listed_with_an_example_of_itself(capsys):
    code, overview, _ = run(capsys, "--help")
    assert code == 0
    for name in ("shell", "query", "explain", "budget", "init", "demo"):
        assert re.search(rf"^    {name} ", overview, re.M)
        command = next(c for c in cli.COMMANDS if c.name == name)
        assert f"dpsql {name}" in command.example
        code, out, _ = run(capsys, name, "--help")
        assert code == 0 and "example:" in out and "exit codes:" in out


def test_query_prints_a_table_with_plus_minus_and_its_cost(shop, capsys):
    database, policy = shop
    code, out, err = run(capsys, "query", database, GROUPED, "--policy", policy, "--epsilon", "0.5")
    assert code == 0
    assert re.search(r"│ free +│ +[\d,]+ ± \d+ │", out) and out.endswith("3 rows\n")
    assert "cost ε 0.5, δ 0 · remaining ε 2.5 of 3" in err
    assert spent(database) == 0.5


def test_query_formats(shop, capsys):
    database, policy = shop
    code, out, _ = run(capsys, "query", database, GROUPED, "--policy", policy, "--format", "csv")
    assert code == 0 and out.startswith("plan,users,users_halfwidth95\nfree,")
    code, out, _ = run(capsys, "query", database, GROUPED, "--policy", policy, "--format", "json")
    records = json.loads(out)
    assert [r["plan"] for r in records] == ["free", "plus", "pro"]
    assert all(r["users_halfwidth95"] > 0 for r in records)
    code, out, _ = run(capsys, "query", database, GROUPED, "--policy", policy, "--format", "markdown")
    assert out.startswith("| plan | ")
    assert run(capsys, "query", database, GROUPED, "--policy", policy, "--format", "xml")[0] == 1


def test_public_query_is_exact_and_free(shop, capsys):
    database, policy = shop
    code, out, err = run(capsys, "query", database, "SELECT COUNT(*) AS n FROM stores", "--policy", policy)
    assert code == 0 and "│ 12 │" in out and "exact: public tables only, no cost" in err


def test_refused_query_exits_2_with_a_caret(shop, capsys):
    database, policy = shop
    code, out, err = run(capsys, "query", database, "SELECT user_id\nFROM visits", "--policy", policy)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("refused: ") and "user_id" in lines[0]
    assert lines[1:3] == ["LINE 1: SELECT user_id", "               ^"]
    assert run(capsys, "query", database, "SELEC 1 FROM", "--policy", policy)[0] == 2
    assert spent(database) == 0


def test_over_budget_exits_3_and_bad_parameters_exit_1(shop, capsys):
    database, policy = shop
    code, _, err = run(capsys, "query", database, GROUPED, "--policy", policy, "--epsilon", "10")
    assert code == 3 and err.startswith("over budget: ") and "epsilon 10" in err
    for bad in ("-1", "nan", "abc"):
        code, _, err = run(capsys, "query", database, GROUPED, "--policy", policy, "--epsilon", bad)
        assert code == 1 and err.startswith("invalid parameter: epsilon must be")
    assert run(capsys, "query", database, GROUPED, "--policy", policy, "--delta", "2")[0] == 1
    assert spent(database) == 0


def test_init_stores_the_policy_so_later_commands_need_none(shop, capsys):
    database, policy = shop
    code, _, err = run(capsys, "budget", database)
    assert code == 1 and err.startswith("policy error: ")
    code, out, _ = run(capsys, "init", database, "--policy", policy, "--estimate-epsilon", "0")
    assert code == 0 and "later commands on this database need no --policy" in out
    assert run(capsys, "query", database, GROUPED)[0] == 0
    code, out, _ = run(capsys, "budget", database)
    assert code == 0 and re.search(r"epsilon +3 +0.1 +2.9", out) and "budget ε" in out
    assert run(capsys, "init", database)[0] == 1  # --policy is required


def test_init_refuses_a_policy_that_does_not_fit_with_its_line(shop, tmp_path, capsys):
    database, _ = shop
    bad = tmp_path / "bad.policy"
    bad.write_text("BUDGET EPSILON 1;\nPRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 2,\n"
                   "    nope BOUNDS 0 TO 1);\n")
    code, _, err = run(capsys, "init", database, "--policy", str(bad))
    assert code == 1 and err.startswith("policy error:")
    assert "LINE 3:" in err and "^" in err


def test_explain_reads_no_data_and_spends_nothing(shop, capsys):
    database, policy = shop
    code, out, _ = run(capsys, "explain", database, "SELECT AVG(amount) FROM visits", "--policy", policy,
                       "--epsilon", "0.2")
    assert code == 0 and "SELECT" in out and "epsilon 0.2" in out
    code, _, err = run(capsys, "explain", database, "SELECT amount FROM visits", "--policy", policy)
    assert code == 2 and "LINE 1: SELECT amount FROM visits" in err
    assert spent(database) == 0


def test_analyst_is_recorded_in_the_ledger(shop, capsys):
    database, policy = shop
    assert run(capsys, "query", database, GROUPED, "--policy", policy, "--analyst", "ada")[0] == 0
    with dpsql.connect(database, policy=policy) as db:
        assert db.ledger()["analyst"].tolist() == ["ada"]


def test_shell_runs_a_script_from_standard_input(shop, capsys, monkeypatch):
    database, policy = shop
    script = ".mode csv\nSELECT plan, COUNT(*) AS users\n  FROM users GROUP BY plan ORDER BY plan;\n.budget\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    code, out, _ = run(capsys, "shell", database, "--policy", policy)
    assert code == 0
    assert "plan,users,users_halfwidth95\nfree," in out
    assert re.search(r"epsilon +3 +0.1 +2.9", out)


def test_missing_database_exits_1(tmp_path, capsys):
    code, _, err = run(capsys, "query", str(tmp_path / "none.duckdb"), "SELECT 1", "--policy", "x.policy")
    assert code == 1 and "no database file" in err
