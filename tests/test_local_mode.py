"""Local mode is the curator's (DESIGN.md invariant 18; issue 12, item 3).

Each test replays what an attacker with the CLI or the shell did: pass a policy that declares
the private table public, or one with a larger budget; run ``dpsql init`` over the stored
policy; point ``.output`` at the ledger. The stored policy rules, the ledger is written by
nothing the analyst types, and the budget is never shown below zero.
"""

from __future__ import annotations

import os
import re
import sys
from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql import cli
from dpsql.demo import SHOP_POLICY
from dpsql.shell import app as shell_app
from dpsql.shell.session import handle_input
from dpsql.shell.state import new_state

PUBLIC_VISITS = re.sub(r"PRIVATE TABLE visits \([^;]*\);", "PUBLIC TABLE visits;", SHOP_POLICY, flags=re.S)
BIGGER = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 100")
SMALLER = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 0.2")


@pytest.fixture
def shop(built, tmp_path) -> dict[str, str]:
    """A fresh copy of the database with the shop policy stored (``dpsql init``), and policy
    files: the stored one, one declaring visits public, a bigger and a smaller budget."""
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    files = {"db": str(database)}
    for name, text in (("policy", SHOP_POLICY), ("public", PUBLIC_VISITS), ("bigger", BIGGER),
                       ("smaller", SMALLER)):
        path = tmp_path / f"{name}.policy"
        path.write_text(text, encoding="utf-8")
        files[name] = str(path)
    # no estimate of the rows the limits drop (tests/test_bias_estimate.py): budgets stay as written
    assert cli.main(["init", files["db"], "--policy", files["policy"], "--estimate-epsilon", "0"]) == 0
    return files


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def spent(database: str) -> Fraction:
    with dpsql.connect(database) as db:
        return db.budget.spent.epsilon


# -- the stored policy rules ---------------------------------------------------------------------

def test_a_policy_declaring_the_private_table_public_is_refused(shop, capsys):
    code, out, err = run(capsys, "query", shop["db"], "SELECT * FROM visits LIMIT 5", "--policy", shop["public"])
    assert code == 1 and out == ""
    assert "policy error: the policy given is not the one stored with the ledger" in err
    assert "PRIVATE TABLE visits" in err and "--replace" in err
    assert spent(shop["db"]) == 0
    with pytest.raises(dpsql.PolicyError, match="not the one stored"):
        dpsql.connect(shop["db"], policy=PUBLIC_VISITS)


def test_a_bigger_budget_cannot_be_spent_past_the_stored_one(shop, capsys):
    code, out, err = run(capsys, "query", shop["db"], "SELECT COUNT(*) FROM visits", "--policy", shop["bigger"],
                         "--epsilon", "5")
    assert code == 1 and out == ""
    assert "it has `BUDGET EPSILON 100 DELTA 0.000001;` where the stored policy has `BUDGET EPSILON 3" in err
    code, out, _ = run(capsys, "budget", shop["db"])
    assert code == 0 and re.search(r"epsilon +3 +0 +3\n", out)


def test_the_same_policy_as_stored_is_fine_however_it_is_written(shop, capsys):
    respelled = "-- the same rules, written differently\n" + SHOP_POLICY.replace("BUDGET EPSILON 3.0", "budget epsilon 3")
    with dpsql.connect(shop["db"], policy=respelled) as db:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
    code, _, err = run(capsys, "query", shop["db"], "SELECT COUNT(*) FROM visits", "--policy", shop["policy"])
    assert code == 0 and "remaining ε 2.4 of 3" in err


def test_a_database_without_a_stored_policy_takes_the_one_given(built, tmp_path):
    database = tmp_path / "plain.duckdb"
    database.write_bytes(built.read_bytes())
    with dpsql.connect(database, policy=BIGGER) as db:
        assert db.budget.total.epsilon == 100
        assert db.policy_changes() == []


def test_init_refuses_to_replace_a_different_stored_policy(shop, capsys):
    code, _, err = run(capsys, "init", shop["db"], "--policy", shop["bigger"])
    assert code == 1
    assert "a different policy is stored with the ledger" in err and "BUDGET EPSILON 100" in err
    assert "dpsql init DB --policy P --replace" in err
    with dpsql.connect(shop["db"]) as db:
        assert db.budget.total.epsilon == 3
    code, out, _ = run(capsys, "init", shop["db"], "--policy", shop["policy"])  # the same again: fine
    assert code == 0 and "it is the one stored with its ledger" in out


def test_init_replace_keeps_what_was_spent_the_salt_and_the_history_and_records_the_change(shop, capsys):
    with dpsql.connect(shop["db"]) as db:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
        salt, entries = db._ledger.salt(), len(db.ledger())
    code, out, _ = run(capsys, "init", shop["db"], "--policy", shop["bigger"], "--replace", "--estimate-epsilon", "0")
    assert code == 0 and "is replaced (recorded in the ledger at" in out
    assert "what was spent, the salt and the ledger's history are kept" in out
    with dpsql.connect(shop["db"]) as db:
        assert db.budget.total.epsilon == 100 and db.budget.spent.epsilon == Fraction(1, 2)
        assert db._ledger.salt() == salt and len(db.ledger()) == entries
        changes = db.policy_changes()
    assert [change.old is None for change in changes] == [True, False]
    assert "BUDGET EPSILON 3 " in changes[1].old and "BUDGET EPSILON 100 " in changes[1].new
    assert re.match(r"\d{4}-\d\d-\d\dT", changes[1].time)
    with pytest.raises(dpsql.PolicyError, match="not the one stored"):  # now the old one is refused
        dpsql.connect(shop["db"], policy=SHOP_POLICY)


def test_the_policy_change_history_cannot_be_rewritten(shop, capsys):
    import sqlite3

    run(capsys, "init", shop["db"], "--policy", shop["bigger"], "--replace")
    with sqlite3.connect(f"{shop['db']}.ledger") as raw:
        for statement in ("DELETE FROM policy_changes", "UPDATE policy_changes SET new = 'x'"):
            with pytest.raises(sqlite3.DatabaseError, match="policy changes are"):
                raw.execute(statement)


def test_a_connection_opened_before_a_replace_cannot_charge_under_the_old_policy(shop):
    with dpsql.connect(shop["db"]) as before:
        dpsql.init_policy(shop["db"], SMALLER, replace=True)
        with pytest.raises(dpsql.PolicyError, match="was replaced after this connection opened"):
            before.sql("SELECT COUNT(*) FROM visits", epsilon=0.1)
    assert spent(shop["db"]) == 0


# -- never below zero --------------------------------------------------------------------------

def test_a_budget_lowered_below_what_was_spent_shows_zero_remaining_and_admits_nothing(shop, capsys):
    with dpsql.connect(shop["db"]) as db:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert run(capsys, "init", shop["db"], "--policy", shop["smaller"], "--replace")[0] == 0
    with dpsql.connect(shop["db"]) as db:
        budget = db.budget
        assert budget.remaining.epsilon == 0 and budget.spent.epsilon == Fraction(1, 2)
        assert "0 remaining" in str(budget) and "-" not in str(budget).split(";")[0]
        with pytest.raises(dpsql.BudgetExceeded):
            db.sql("SELECT COUNT(*) FROM visits WHERE age > 40", epsilon=0.01)
        assert "0 of 0.2 left" in handle_input(new_state(db), ".budget")
    code, out, _ = run(capsys, "budget", shop["db"])
    assert code == 0 and re.search(r"epsilon +0\.2 +0\.5 +0\n", out)
    code, _, err = run(capsys, "query", shop["db"], "SELECT COUNT(*) FROM visits WHERE age > 50", "--epsilon", "0.01")
    assert code == 3 and "only 0 remains" in err
    assert spent(shop["db"]) == Fraction(1, 2)


def test_spending_from_before_the_first_init_counts_and_never_shows_negative(built, tmp_path, capsys):
    """The reported `-11.8 of 10`: a ledger spent under a larger policy, then ruled by a
    smaller one. What was spent stays spent; what remains reads 0."""
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    with dpsql.connect(database, policy=BIGGER) as db:  # no policy stored yet: the one given
        db.sql("SELECT COUNT(*) FROM visits", epsilon=5)
    assert cli.main(["init", str(database), "--policy", str(_write(tmp_path / "p.policy", SHOP_POLICY))]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "budget", str(database))
    assert code == 0 and re.search(r"epsilon +3 +5 +0\n", out) and "0 of 3 left" in out
    with dpsql.connect(database) as db:
        assert db.budget.remaining.epsilon == 0 and str(db.budget).startswith("epsilon 5 of 3 spent, 0 remaining")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("accounting", ["ADVANCED", "ZCDP"])
def test_sublinear_accountants_never_show_a_negative_remainder_either(built, tmp_path, accounting):
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    policy = SHOP_POLICY.replace("NEIGHBOURS", f"ACCOUNTING {accounting};\nNEIGHBOURS")
    with dpsql.connect(database, policy=policy) as db:
        db.store_policy()
        db.sql("SELECT COUNT(*) FROM visits", epsilon=1)
    dpsql.init_policy(database, policy.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 0.1"), replace=True)
    with dpsql.connect(database) as db:
        remaining = db.budget.remaining
        assert remaining.epsilon == 0 and remaining.delta >= 0 and (remaining.rho or 0) >= 0
        with pytest.raises(dpsql.BudgetExceeded):
            db.sql("SELECT COUNT(*) FROM visits WHERE age > 40", epsilon=0.01)


# -- the shell's .output -----------------------------------------------------------------------

@pytest.fixture
def shell(shop):
    with dpsql.connect(shop["db"], policy=shop["policy"]) as db:
        yield new_state(db, width=100, color=False)


def test_output_refuses_the_ledger_and_the_next_session_keeps_its_budget(shop, shell):
    handle_input(shell, "SELECT COUNT(*) FROM visits;")
    ledger = Path(f"{shop['db']}.ledger")
    before = ledger.read_bytes()
    reply = handle_input(shell, f".output {ledger}")
    assert reply.startswith(f"error: {ledger} is one of the curator's files")
    assert "hint: write to a new file elsewhere" in reply
    assert shell.output is None and ledger.read_bytes() == before
    with dpsql.connect(shop["db"]) as db:
        assert db.budget.spent.epsilon == Fraction(1, 10)


@pytest.mark.parametrize("name", ["shop.duckdb", "shop.duckdb.ledger-wal", "shop.duckdb.ledger-journal",
                                  "shop.duckdb.ledger-shm", "shop.duckdb.wal", "policy.policy",
                                  "other.ledger", "OTHER.LEDGER-WAL", "new.policy", "copy.duckdb",
                                  "sub/other.ledger"])
def test_output_refuses_the_curators_files_and_names_like_them_beside_the_ledger(shop, shell, name):
    target = Path(shop["db"]).parent / name
    reply = handle_input(shell, f".output {target}")
    assert reply.startswith(f"error: {target} is "), reply
    assert shell.output is None


def test_output_refuses_a_way_round_through_links_and_dot_dot(shop, shell, tmp_path):
    ledger = Path(f"{shop['db']}.ledger")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "answers.csv").symlink_to(ledger)
    assert "one of the curator's files" in handle_input(shell, f".output {elsewhere / 'answers.csv'}")
    assert "one of the curator's files" in handle_input(shell, f".output {elsewhere}/../{ledger.name}")
    os.link(ledger, elsewhere / "hard.csv")
    assert "already exists and was not created by this session" in \
        handle_input(shell, f".output {elsewhere / 'hard.csv'}")
    assert shell.output is None


def test_output_writes_only_files_it_created_in_this_session(shell, tmp_path):
    existing = tmp_path / "notes.txt"
    existing.write_text("keep me")
    reply = handle_input(shell, f".output {existing}")
    assert reply.startswith(f"error: {existing} already exists and was not created by this session")
    assert existing.read_text() == "keep me"
    mine = tmp_path / "answers.csv"
    handle_input(shell, ".mode csv")
    assert handle_input(shell, f".output {mine}") == f"answers go to {mine}\n"
    assert handle_input(shell, "SELECT COUNT(*) AS n FROM visits;").startswith(f"wrote 1 row to {mine}")
    assert handle_input(shell, ".output") == "answers go to the screen\n"
    assert handle_input(shell, f".output {mine}") == f"answers go to {mine}\n"  # its own file: afresh
    assert mine.read_text() == ""


def test_output_does_not_write_a_file_swapped_in_after_it_was_created(shell, tmp_path):
    mine = tmp_path / "answers.csv"
    handle_input(shell, f".output {mine}")
    other = tmp_path / "other.csv"
    other.write_text("someone else's")
    other.replace(mine)
    reply = handle_input(shell, "SELECT COUNT(*) AS n FROM visits;")
    assert "was replaced by another file after .output created it" in reply
    assert mine.read_text() == "someone else's"


def test_the_pager_runs_less_in_secure_mode(tmp_path, monkeypatch):
    seen = tmp_path / "environment"
    monkeypatch.setenv("LESSSECURE", "0")
    monkeypatch.setenv("PAGER", f"{sys.executable} -c \"import os; open({str(seen)!r}, 'w').write(os.environ['LESSSECURE'])\"")
    shell_app._show("".join(f"row {i}\n" for i in range(50)), sys.stdout, page=True, rows=24)
    assert seen.read_text() == "1"
