"""The bundled shop database, the demo, the CLI skeleton and the census test data.

Everything here but the end-to-end demo runs without the engine: the demo is also run
against a stand-in for ``dpsql.connect`` that answers exactly (test-only, no privacy).
"""

from __future__ import annotations

import io
import re
import sys
from fractions import Fraction
from types import SimpleNamespace

import duckdb
import pytest
from pums import POLICY_PATH, PUMS_DIR, load_pums, pums_policy

from dpsql import cli
from dpsql.demo import DEMO_QUERIES, SHOP_POLICY, build_shop_database, run_demo
from dpsql.errors import BudgetExceeded, DPError, PolicyError, UnsupportedQuery

TABLES = {
    "stores": [("store", "VARCHAR"), ("city", "VARCHAR"), ("size", "INTEGER")],
    "users": [("user_id", "INTEGER"), ("country", "VARCHAR"), ("plan", "VARCHAR"),
              ("signup", "DATE")],
    "visits": [("user_id", "INTEGER"), ("day", "DATE"), ("store", "VARCHAR"),
               ("amount", "DOUBLE"), ("age", "INTEGER"), ("zip", "VARCHAR")],
}


def _engine_ready() -> bool:
    try:
        import dpsql
    except Exception:
        return False
    return hasattr(dpsql, "connect")


def _policy_parser():
    try:
        from dpsql.policy.language import parse_policy
    except Exception:
        return None
    return parse_policy


def _keys(policy_text: str, table: str) -> dict[str, list[str]]:
    """Column -> literal keys (as written) of ``KEYS (...)`` rules in one table's block."""
    block = re.search(rf"TABLE\s+{table}\s*\((.*?)\);", policy_text, re.S | re.I).group(1)
    return {
        column: [key.strip().strip("'") for key in keys.split(",")]
        for column, keys in re.findall(r"(\w+)\s+KEYS\s*\(([^)]*)\)", block, re.I)
    }


def _one(con, sql: str) -> tuple:
    """The single row of a query (DuckDB 2 relations have no ``fetchone``)."""
    (row,) = con.sql(sql).fetchall()
    return row


def _contents(path) -> dict[str, list[tuple]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {name: con.sql(f"SELECT * FROM {name}").fetchall() for name in TABLES}


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    path = tmp_path_factory.mktemp("shop") / "shop.duckdb"
    build_shop_database(path)
    con = duckdb.connect(str(path), read_only=True)
    yield con
    con.close()


# -- the shop database -------------------------------------------------------------------

def test_same_seed_gives_identical_tables(tmp_path):
    build_shop_database(tmp_path / "a.duckdb")
    build_shop_database(tmp_path / "b.duckdb")
    build_shop_database(tmp_path / "c.duckdb", seed=8)
    a, b, c = (_contents(tmp_path / f"{name}.duckdb") for name in "abc")
    assert a == b
    assert a["visits"] != c["visits"]


def test_build_overwrites_an_existing_database(tmp_path):
    path = tmp_path / "shop.duckdb"
    build_shop_database(path, users=50)
    build_shop_database(path, users=60)
    assert len(_contents(path)["users"]) == 60


def test_tables_have_the_documented_columns_and_types(shop):
    for table, columns in TABLES.items():
        described = [(name, type_) for name, type_, *_ in shop.sql(f"DESCRIBE {table}").fetchall()]
        assert described == columns
    assert 10 <= _one(shop, "SELECT COUNT(*) FROM stores")[0] <= 14
    assert _one(shop, "SELECT COUNT(*) FROM users")[0] == 2000


def test_visits_per_user_are_heavily_skewed(shop):
    low, median, high = _one(
        shop,
        "SELECT MIN(n), MEDIAN(n), MAX(n) FROM (SELECT COUNT(*) AS n FROM visits GROUP BY user_id)"
    )
    assert low >= 1 and median <= 5
    assert high >= 50 * median
    assert _one(shop, "SELECT COUNT(DISTINCT user_id) FROM visits")[0] == 2000


def test_amounts_have_outliers_and_nulls(shop):
    over, nulls, typical = _one(
        shop,
        "SELECT COUNT(*) FILTER (WHERE amount > 500), COUNT(*) FILTER (WHERE amount IS NULL),"
        " AVG(CASE WHEN amount BETWEEN 0 AND 300 THEN 1 ELSE 0 END) FROM visits"
    )
    assert over >= 3 and nulls >= 3
    assert typical > 0.95
    assert _one(shop, "SELECT MIN(amount) >= 0 FROM visits")[0]


def test_visit_columns_stay_in_range(shop):
    row = _one(
        shop,
        "SELECT MIN(age), MAX(age), MIN(day), MAX(day),"
        " BOOL_AND(regexp_full_match(zip, '[0-9]{5}')) FROM visits"
    )
    assert 18 <= row[0] and row[1] <= 90
    assert str(row[2]) >= "2025-01-01" and str(row[3]) <= "2025-12-31"
    assert row[4] is True


def test_age_and_zip_are_constant_per_user(shop):
    assert _one(
        shop,
        "SELECT COUNT(*) FROM (SELECT user_id FROM visits GROUP BY user_id"
        " HAVING COUNT(DISTINCT age) > 1 OR COUNT(DISTINCT zip) > 1)"
    )[0] == 0


def test_values_lie_in_the_policy_key_domains(shop):
    keys = _keys(SHOP_POLICY, "users")
    assert keys["plan"] == ["free", "plus", "pro"]
    assert len(keys["country"]) == 6
    for column in ("plan", "country"):
        values = {v for (v,) in shop.sql(f"SELECT DISTINCT {column} FROM users").fetchall()}
        assert values == set(keys[column])
    assert "store KEYS FROM stores.store" in SHOP_POLICY
    assert _one(
        shop,
        "SELECT COUNT(*) FROM visits WHERE store NOT IN (SELECT store FROM stores)"
    )[0] == 0


def test_policy_declares_every_table():
    for table in TABLES:
        assert re.search(rf"(PRIVATE|PUBLIC) TABLE {table}\b", SHOP_POLICY)


def test_demo_queries_are_well_formed():
    assert 7 <= len(DEMO_QUERIES) <= 9
    titles = [title for title, _, _ in DEMO_QUERIES]
    assert len(set(titles)) == len(titles)
    assert sum(eps for _, _, eps in DEMO_QUERIES if eps) <= 3.0
    sqls = [sql for _, sql, _ in DEMO_QUERIES]
    assert "SELECT COUNT(*) AS visits FROM visits" in sqls
    assert any("FROM stores" in sql for sql in sqls)
    assert "SELECT user_id, amount FROM visits" in sqls


@pytest.mark.skipif(_policy_parser() is None, reason="dpsql.policy.language.parse_policy not written yet")
def test_policies_parse():
    policy = _policy_parser()(SHOP_POLICY)
    assert policy.table("visits").max_rows_per_unit == 10
    assert policy.table("users").column("plan").keys.values == ("free", "plus", "pro")
    assert not policy.is_private("stores")
    pums = _policy_parser()(pums_policy())
    assert pums.table("pums").unit == "pid"
    assert pums.table("pums").max_rows_per_unit == 3


# -- the demo, against a stand-in engine ---------------------------------------------------

class _StandInDatabase:
    """Answers exactly and charges what it is asked: enough to exercise the demo's printing."""

    def __init__(self, database, policy):
        assert "PRIVATE TABLE visits" in open(policy, encoding="utf-8").read()
        self.con = duckdb.connect(database, read_only=True)
        self.total = SimpleNamespace(epsilon=Fraction(3), delta=Fraction(1, 10**6))
        self.spent = Fraction(0)

    @property
    def budget(self):
        spent = SimpleNamespace(epsilon=self.spent, delta=Fraction(0))
        remaining = SimpleNamespace(epsilon=self.total.epsilon - self.spent,
                                    delta=self.total.delta)
        return SimpleNamespace(total=self.total, spent=spent, remaining=remaining)

    def sql(self, sql, epsilon=None):
        if "user_id" in sql:
            raise UnsupportedQuery("a private column is selected without aggregation",
                                   line=1, col=8, hint="wrap it in an aggregate")
        frame = self.con.sql(sql).df()
        public = "FROM stores" in sql
        epsilon = Fraction(0) if public else Fraction(epsilon if epsilon is not None else 0.1)
        self.spent += epsilon
        noisy = {} if public else {c: 12.3 for c in frame.columns if c not in ("store", "plan")}
        cost = SimpleNamespace(epsilon=epsilon, delta=Fraction(0))
        return SimpleNamespace(df=lambda: frame, accuracy=lambda alpha=0.05: noisy, cost=cost)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.con.close()


def _run_stand_in_demo(directory):
    out = io.StringIO()
    run_demo(directory, out, connect=_StandInDatabase)
    return out.getvalue()


def test_demo_prints_every_query_with_rich(tmp_path):
    pytest.importorskip("rich")
    (tmp_path / "shop.duckdb.ledger").write_text("old ledger")
    (tmp_path / "shop.duckdb.ledger-wal").write_text("old ledger")
    text = _run_stand_in_demo(tmp_path)
    for title, sql, _ in DEMO_QUERIES:
        assert title in text and sql in text
    assert "±" in text and "refused: a private column" in text
    assert "remaining budget: epsilon 2.9, delta 1e-06" in text
    assert not (tmp_path / "shop.duckdb.ledger").exists()
    assert not (tmp_path / "shop.duckdb.ledger-wal").exists()
    assert (tmp_path / "shop.policy").read_text() == SHOP_POLICY


def test_demo_prints_plain_text_without_rich(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # makes the import fail
    text = _run_stand_in_demo(tmp_path)
    for title, _, _ in DEMO_QUERIES:
        assert f"== {title}" in text
    assert re.search(r"Loop +\d[\d,]* ± 12", text)
    assert re.search(r"Boston +3\n", text)  # a public table: exact, no ±
    assert "refused:" in text


def test_demo_defaults_to_demo_data_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_stand_in_demo(None)
    assert (tmp_path / "demo-data" / "shop.duckdb").exists()


@pytest.mark.skipif(not _engine_ready(), reason="the engine (dpsql.connect) is not written yet")
def test_demo_runs_end_to_end_and_reruns(tmp_path):
    runs = []
    for _ in range(2):
        out = io.StringIO()
        run_demo(tmp_path, out)
        runs.append(out.getvalue())
    for text in runs:
        for title, _, _ in DEMO_QUERIES:
            assert title in text
        assert "remaining budget" in text
        assert "±" in text
        assert "refused" in text
    # The second run starts again from the full budget, so it spends exactly as the first.
    budgets = [re.findall(r"remaining budget: .*", text) for text in runs]
    assert budgets[0] == budgets[1]


# -- the command line ----------------------------------------------------------------------

def test_every_command_has_help_with_an_example(capsys):
    assert cli.main(["--help"]) == 0
    assert "dpsql demo" in capsys.readouterr().out
    for command in cli.COMMANDS:
        assert cli.main([command.name, "--help"]) == 0
        assert f"example:\n{command.example}" in capsys.readouterr().out


def test_bad_usage_exits_1_not_2(capsys):
    assert cli.main([]) == 1
    assert cli.main(["no-such-command"]) == 1
    assert cli.main(["demo", "--no-such-option"]) == 1


@pytest.mark.parametrize(
    "error, code",
    [
        (UnsupportedQuery("refused"), 2),
        (BudgetExceeded("over budget"), 3),
        (PolicyError("bad policy"), 1),
        (DPError("other"), 1),
        (OSError("disk full"), 1),
    ],
)
def test_errors_map_to_exit_codes(error, code, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("dpsql.demo.run_demo", fail)
    assert cli.main(["demo"]) == code
    assert str(error) in capsys.readouterr().err


def test_demo_command_passes_its_directory(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr("dpsql.demo.run_demo", lambda directory, out: seen.append(directory))
    assert cli.main(["demo", "--dir", str(tmp_path)]) == 0
    assert seen == [str(tmp_path)]


# -- the census test data ------------------------------------------------------------------

def test_load_pums_dup():
    con = duckdb.connect()
    load_pums(con)
    assert _one(con, "SELECT COUNT(*), COUNT(DISTINCT pid) FROM pums") == (1948, 1000)


@pytest.mark.parametrize("variant, rows", [("plain", 1000), ("pid", 1000), ("null", 1948)])
def test_load_pums_variants(variant, rows):
    con = duckdb.connect()
    load_pums(con, table="census", variant=variant)
    assert _one(con, "SELECT COUNT(*) FROM census")[0] == rows


def test_pums_policy_keys_match_the_data():
    assert POLICY_PATH.parent == PUMS_DIR
    text = pums_policy()
    assert "PRIVACY UNIT pid" in text and "MAX ROWS PER UNIT 3" in text
    con = duckdb.connect()
    load_pums(con)
    for column, keys in _keys(text, "pums").items():
        values = {v for (v,) in con.sql(f"SELECT DISTINCT {column} FROM pums").fetchall()}
        assert values <= {int(key) for key in keys}, column
