"""Fixtures several test modules share."""

from pathlib import Path

import pytest

import dpsql
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.shell.state import new_state


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """A small shop database file (300 users), built once; tests copy it before writing beside it."""
    path = tmp_path_factory.mktemp("shop") / "shop.duckdb"
    build_shop_database(path, users=300)
    return path


@pytest.fixture
def shop(built, tmp_path) -> tuple[str, str]:
    """(database, policy) paths of a fresh copy of the small shop database, no ledger yet (a
    module's own ``shop`` fixture takes precedence)."""
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    policy = tmp_path / "shop.policy"
    policy.write_text(SHOP_POLICY, encoding="utf-8")
    return str(database), str(policy)


@pytest.fixture
def db(built):
    """A connection to the shared shop database with an in-memory ledger (a module's own
    ``db`` fixture takes precedence)."""
    with dpsql.connect(str(built), policy=SHOP_POLICY, ledger=":memory:") as connection:
        yield connection


@pytest.fixture
def state(db):
    """A shell state on ``db``, 100 columns wide, no colour."""
    return new_state(db, width=100, color=False)
