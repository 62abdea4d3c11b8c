"""The engine seam (issue 36): one registry of engines, each engine's forms in its own package,
and no import circle between the Spark backend's modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from dpsql.backends import render
from dpsql.backends.base import Backend, PostProcessing
from dpsql.backends.duckdb import Engine
from dpsql.backends.registry import ENGINES, engine_for, rendering_for
from dpsql.errors import InternalError

SPARK = Path(__file__).resolve().parents[1] / "dpsql" / "backends" / "spark"


def _imports(module: str) -> set[str]:
    """Every dpsql module ``spark/<module>.py`` imports, at module or function level."""
    found = set()
    for node in ast.walk(ast.parse((SPARK / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpsql"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("one, other", [("check", "render"), ("infer", "numbers")])
def test_the_spark_modules_import_one_way(one, other):
    both = [_imports(one) & {f"dpsql.backends.spark.{other}"}, _imports(other) & {f"dpsql.backends.spark.{one}"}]
    assert not all(both), f"spark.{one} and spark.{other} import each other"


def test_each_target_opens_on_the_engine_that_recognises_it():
    assert [kind.dialect for kind in ENGINES][-1] == "duckdb"  # the last engine takes the rest
    assert engine_for("shop.spark.toml").dialect == "spark"
    assert engine_for({"t": pd.DataFrame({"a": [1]})}).dialect == "duckdb"
    assert engine_for("shop.duckdb").dialect == "duckdb"


def test_render_finds_each_engine_table_through_the_registry():
    assert rendering_for("duckdb") is render.rendering_of("duckdb")
    tables = [name for name, value in vars(render).items()
              if isinstance(value, dict) and any(isinstance(key, type) for key in value)]
    assert tables == []  # no node class -> form table of any engine in the neutral module
    with pytest.raises(InternalError):
        rendering_for("postgres")


def test_the_duckdb_engine_keeps_the_protocol_and_post_processes_apart():
    engine = Engine.open(":memory:", query_timeout=5)
    try:
        assert isinstance(engine, Backend) and isinstance(engine.post_processing, PostProcessing)
        assert engine.timeout == 5
        engine.check(None, True)  # DuckDB refuses nothing more
        names, rows = engine.post_processing.post_process(["n"], ["BIGINT"], [(3,)], "SELECT n * 2 AS m FROM dp_core")
        assert (names, rows) == (["m"], [(6,)])
        assert engine.key_text(b"caf\xc3\xa9", "VARCHAR") == "café" and engine.key_value(7, "BIGINT") == 7
    finally:
        engine.close()
