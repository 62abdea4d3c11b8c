"""One dataset, one budget (DESIGN.md invariant 21, issue 35): a second ledger over tables another
ledger accounts for is refused before anything is read or charged, or kept on purpose with
``separate_budget``; the DuckDB side here, Spark's in ``test_spark_engine.py``.

Each test has its own curator home (``conftest.curator_home``), so its registry starts empty.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import dpsql
from dpsql.backends.duckdb import Engine
from dpsql.backends.spark.config import load_spark_config
from dpsql.budget.ledger import Ledger
from dpsql.budget.registry import REGISTRY_FILE, Dataset, registered
from dpsql.demo import SHOP_POLICY
from dpsql.errors import SecondBudgetWarning

COUNT = "SELECT COUNT(*) AS n FROM visits"


@pytest.fixture
def two_copies(built, tmp_path) -> tuple[Path, Path]:
    """The same shop data in two DuckDB files, each with its default ledger beside it (none made yet)."""
    first, second = tmp_path / "a" / "shop.duckdb", tmp_path / "b" / "shop.duckdb"
    for path in (first, second):
        path.parent.mkdir()
        shutil.copy(built, path)
    return first, second


def _spent(database: Path, **options) -> float:
    with dpsql.connect(database, policy=SHOP_POLICY, **options) as db:
        return float(db.budget.spent.epsilon)


def test_a_second_ledger_over_the_same_tables_is_refused_before_anything_is_read(two_copies, monkeypatch):
    first, second = two_copies
    with dpsql.connect(first, policy=SHOP_POLICY) as db:
        db.sql(COUNT, epsilon=0.5)
    reads = []
    monkeypatch.setattr(Engine, "fetch", lambda *args, **kwargs: reads.append(args))
    monkeypatch.setattr(Engine, "catalog", lambda *args, **kwargs: reads.append(args))
    with pytest.raises(dpsql.SecondBudget) as refused:
        dpsql.connect(second, policy=SHOP_POLICY)
    message = str(refused.value)
    assert "users(user_id), visits(user_id)" in message and f"{first}.ledger" in message
    assert f"opened from {first}" in message and "separate_budget=True" in message
    assert f"ledger='{first}.ledger'" in message
    assert reads == [], "refused before the catalog or any data was read"
    assert not Path(f"{second}.ledger").exists(), "a refusal leaves no ledger file behind"
    monkeypatch.undo()
    assert _spent(first) == 0.5, "nothing charged to the first budget"


def test_the_same_data_shares_the_first_ledger_and_its_spending(two_copies):
    first, second = two_copies
    with dpsql.connect(first, policy=SHOP_POLICY) as db:
        db.sql(COUNT, epsilon=0.5)
    with dpsql.connect(second, policy=SHOP_POLICY, ledger=f"{first}.ledger") as db:
        assert db.budget.spent.epsilon == 0.5
        db.sql(COUNT, epsilon=0.25)
    assert _spent(first) == 0.75
    (known,) = registered()
    assert known.ledger == Path(f"{first}.ledger") and known.sources == (str(first), str(second))


def test_a_separate_budget_is_kept_on_purpose_and_said_so(two_copies):
    first, second = two_copies
    _spent(first)
    with pytest.warns(SecondBudgetWarning, match=r"second budget: .*a/shop.duckdb.ledger also accounts for"):
        with dpsql.connect(second, policy=SHOP_POLICY, separate_budget=True) as db:
            assert db.second_budget is not None and f"{first}.ledger" in db.second_budget
            db.sql(COUNT, epsilon=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # decided once: later opens of either ledger pass quietly
        assert _spent(second) == 0.5 and _spent(first) == 0
    assert [known.separate for known in registered()] == [False, True]


def test_a_copied_ledger_is_a_second_budget_too(two_copies, tmp_path):
    first, _ = two_copies
    with dpsql.connect(first, policy=SHOP_POLICY) as db:
        db.sql(COUNT, epsilon=0.5)
    shutil.copy(f"{first}.ledger", tmp_path / "copy.ledger")
    with pytest.raises(dpsql.SecondBudget):
        dpsql.connect(first, policy=SHOP_POLICY, ledger=tmp_path / "copy.ledger")


def test_one_table_in_common_is_enough_whatever_its_unit(two_copies):
    first, second = two_copies
    _spent(first)
    row_level = "BUDGET EPSILON 1; PRIVATE TABLE visits (PRIVACY UNIT ROW);"
    with pytest.raises(dpsql.SecondBudget, match=r"protects \(visits\(ROW\)\) already have a budget"):
        dpsql.connect(second, policy=row_level)
    other_table = "BUDGET EPSILON 1; PRIVATE TABLE stores (PRIVACY UNIT ROW);"  # public in the shop policy
    with dpsql.connect(second, policy=other_table) as db:
        assert db.dataset.description == "stores(ROW)"


def test_a_ledger_whose_file_is_gone_is_forgotten(two_copies):
    first, second = two_copies
    _spent(first)
    Path(f"{first}.ledger").unlink()
    assert _spent(second) == 0
    assert [known.ledger for known in registered()] == [Path(f"{second}.ledger")]


def test_ledgers_in_memory_claim_nothing(two_copies):
    first, second = two_copies
    _spent(first, ledger=":memory:")
    _spent(second)
    _spent(first, ledger=":memory:")
    assert [known.ledger for known in registered()] == [Path(f"{second}.ledger")]


def test_the_ledger_records_what_it_accounts_for_and_an_old_ledger_gets_it_on_open(two_copies, tmp_path):
    first, _ = two_copies
    with Ledger.open(tmp_path / "old.ledger") as old:  # as written before ledgers knew their dataset
        assert old.dataset() is None
    with dpsql.connect(first, policy=SHOP_POLICY, ledger=tmp_path / "old.ledger") as db:
        assert db.dataset.description == "users(user_id), visits(user_id)"
    with Ledger.open(tmp_path / "old.ledger") as old:
        assert Dataset.from_json(old.dataset() or "[]").description == "users(user_id), visits(user_id)"


def test_a_replaced_policy_only_adds_to_what_a_ledger_accounts_for(two_copies):
    first, second = two_copies
    dpsql.init_policy(first, SHOP_POLICY)
    fewer = SHOP_POLICY.split("PRIVATE TABLE users")[0] + "PUBLIC TABLE stores;"
    assert "users" not in fewer and "visits" in fewer
    dpsql.init_policy(first, fewer, replace=True)
    with dpsql.connect(first) as db:
        assert db.dataset.description == "users(user_id), visits(user_id)", "what it spent on users stays"
    with pytest.raises(dpsql.SecondBudget, match=r"\(users\(user_id\)\)"):
        dpsql.connect(second, policy="BUDGET EPSILON 1; PRIVATE TABLE users (PRIVACY UNIT user_id, "
                                     "MAX ROWS PER UNIT 1);")


def test_the_registry_is_owner_only(two_copies, curator_home, monkeypatch):
    _spent(two_copies[0])
    assert stat.S_IMODE(os.stat(curator_home / REGISTRY_FILE).st_mode) == 0o600
    fresh = curator_home / "fresh"
    monkeypatch.setenv("DPSQL_HOME", str(fresh))
    _spent(two_copies[1])
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700


def _dpsql(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *arguments], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_COLOR": "1"})


def test_dpsql_init_refuses_a_second_budget_unless_told_so(two_copies, tmp_path):
    first, second = two_copies
    policy = tmp_path / "shop.policy"
    policy.write_text(SHOP_POLICY)
    assert _dpsql("init", str(first), "--policy", str(policy), "--estimate-epsilon", "0").returncode == 0
    refused = _dpsql("init", str(second), "--policy", str(policy), "--estimate-epsilon", "0")
    assert refused.returncode == 1, refused.stderr
    assert f"already have a budget in {first}.ledger" in refused.stderr and "--separate-budget" in refused.stderr
    assert not Path(f"{second}.ledger").exists()
    kept = _dpsql("init", str(second), "--policy", str(policy), "--estimate-epsilon", "0", "--separate-budget")
    assert kept.returncode == 0, kept.stderr
    assert f"is a second budget: {first}.ledger also accounts for users(user_id), visits(user_id)" in kept.stdout
    assert _dpsql("budget", str(second)).returncode == 0


def test_a_spark_config_names_its_ledger_relative_to_its_folder(tmp_path):
    config = tmp_path / "shop.spark.toml"
    config.write_text('[spark]\nmaster = "local[2]"\nledger = "data/shop.duckdb.ledger"\n')
    assert load_spark_config(config).ledger_path == (tmp_path / "data" / "shop.duckdb.ledger").resolve()
    config.write_text('[spark]\nmaster = "local[2]"\n')
    assert load_spark_config(config).ledger_path == Path(f"{config.resolve()}.ledger")
    config.write_text('[spark]\nledger = 3\n')
    with pytest.raises(dpsql.DPError, match="spark.ledger must be a file path"):
        load_spark_config(config)


def test_each_demo_is_a_budget_of_its_own_new_people_each_run(tmp_path):
    from dpsql.demo import run_demo

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for directory in ("one", "two"):
            run_demo(tmp_path / directory, io.StringIO())
    assert len(registered()) == 2


def test_a_registry_others_can_change_is_refused(two_copies, curator_home):
    _spent(two_copies[0])
    os.chmod(curator_home / REGISTRY_FILE, 0o666)
    with pytest.raises(dpsql.DPError, match="registry of ledgers .* has mode 0666"):
        _spent(two_copies[1])
