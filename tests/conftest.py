"""Fixtures several test modules share."""

from pathlib import Path

import pytest

from dpsql.demo import build_shop_database


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """A small shop database file (300 users), built once; tests copy it before writing beside it."""
    path = tmp_path_factory.mktemp("shop") / "shop.duckdb"
    build_shop_database(path, users=300)
    return path
