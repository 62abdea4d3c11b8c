"""Fixtures several test modules share, and the hook that keeps Spark tests on one xdist worker."""

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import dpsql
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.shell.state import new_state

# The curator's registry of ledgers (dpsql.budget.registry) lives in $DPSQL_HOME: tests open many
# file ledgers over the same shop tables in different folders, so none may share the developer's
# registry or another module's or test's. This process's own (session fixtures) is set here, at
# import, per xdist worker; each module's fixtures and each test get their own below, which their
# subprocesses inherit.
_WORKER_HOME = tempfile.mkdtemp(prefix="dpsql-home-")
os.environ["DPSQL_HOME"] = _WORKER_HOME
atexit.register(shutil.rmtree, _WORKER_HOME, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def module_curator_home(tmp_path_factory) -> Iterator[Path]:
    """A fresh curator home for each module's module-scoped fixtures (a module's server, its database)."""
    home = tmp_path_factory.mktemp("dpsql-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DPSQL_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def curator_home(module_curator_home, tmp_path_factory, monkeypatch) -> Path:
    """A fresh curator home (registry of ledgers) for each test, seen by its subprocesses too."""
    home = tmp_path_factory.mktemp("dpsql-home")
    monkeypatch.setenv("DPSQL_HOME", str(home))
    return home


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
