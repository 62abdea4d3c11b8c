"""Fixtures several test modules share, and the hook that keeps Spark tests on one xdist worker."""

from pathlib import Path

import pytest

import dpsql
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.shell.state import new_state


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook turns the groups into "@<group>" id suffixes
def pytest_collection_modifyitems(config, items):
    """Put every ``spark`` test in the xdist group "spark": under ``--dist loadgroup`` (``make
    test``) they all run on one worker, which starts the one local Spark session
    (``tests/spark.py``, 10-20 s and a JVM) while the other worker runs everything else."""
    for item in items:
        if item.get_closest_marker("spark") is None:
            continue
        groups = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                  for mark in item.iter_markers("xdist_group")}
        if groups - {"spark"}:  # xdist would join the names into a group of their own
            raise pytest.UsageError(f"{item.nodeid} is marked spark and is also in the xdist group(s) "
                                    f"{sorted(groups - {'spark'})}; a spark test belongs to the group 'spark' only")
        if not groups:
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under ``--dist loadgroup`` a spark test outside the group fails before it starts a second Spark
    session: pytest-xdist 3.8 does not group on pytest 9.2 (pytest-dev/pytest-xdist#1386)."""
    if (getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("spark") is not None
            and not item.nodeid.endswith("@spark")):
        pytest.fail("--dist loadgroup left this spark test out of the xdist group 'spark', so every worker "
                    "would start a Spark session: this pytest-xdist cannot group tests on this pytest "
                    "(the test extra pins pytest<9.2 for that reason)", pytrace=False)


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
