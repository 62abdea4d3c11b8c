"""The aggregate registry: every family owns its functions, calls and spellings once, the stages
dispatch through it, and every spelling the shell offers is one dpsql answers."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from dpsql.analysis.aggregates import FAMILIES, classify, family_of, spellings
from dpsql.analysis.aggregates.registry import family_for_call
from dpsql.analysis.plan import AggregateFunction
from dpsql.errors import UnsupportedQuery
from dpsql.shell.complete import complete

ROOT = Path(__file__).resolve().parent.parent / "dpsql"

STAGES = ("analysis/analyse.py", "analysis/aggregates/split.py", "analysis/check.py", "query/release.py",
          "query/accuracy.py", "answer/explain.py", "budget/accounting.py", "shell/complete.py", "connection.py",
          "query/answering.py", "backends/rewrite.py")
"""The modules an aggregate passes through; none may decide by an aggregate's function name."""

WRITTEN = {
    "COUNT": "COUNT(amount)", "SUM": "SUM(amount)", "AVG": "AVG(amount)", "VARIANCE": "VARIANCE(amount)",
    "VAR_SAMP": "VAR_SAMP(amount)", "VAR_POP": "VAR_POP(amount)", "STDDEV": "STDDEV(amount)",
    "STDDEV_SAMP": "STDDEV_SAMP(amount)", "STDDEV_POP": "STDDEV_POP(amount)", "MEDIAN": "MEDIAN(amount)",
    "QUANTILE_CONT": "QUANTILE_CONT(amount, 0.9)", "QUANTILE": "QUANTILE(amount, 0.9)",
    "APPROX_QUANTILE": "APPROX_QUANTILE(amount, 0.9)",
    "PERCENTILE_CONT": "PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY amount)", "MIN": "MIN(amount)",
    "MAX": "MAX(amount)", "COVAR_POP": "COVAR_POP(amount, age)", "COVAR_SAMP": "COVAR_SAMP(amount, age)",
    "CORR": "CORR(amount, age)", "REGR_SLOPE": "REGR_SLOPE(amount, age)",
    "REGR_INTERCEPT": "REGR_INTERCEPT(amount, age)", "REGR_R2": "REGR_R2(amount, age)",
}
"""A call of each spelling, as an analyst writes it."""


def test_every_function_is_owned_by_exactly_one_family():
    owned = [function for family in FAMILIES for function in family.functions]
    assert sorted(owned) == sorted(typing.get_args(AggregateFunction))


def test_every_call_class_is_owned_by_exactly_one_family():
    nodes = [node for family in FAMILIES for node in family.nodes]
    assert len(nodes) == len(set(nodes))


@pytest.mark.parametrize("spelling", spellings())
def test_every_spelling_classifies_to_the_family_offering_it(spelling):
    call = sqlglot.parse_one(f"SELECT {WRITTEN[spelling]} FROM t", read="duckdb").expressions[0]
    aggregate = classify(call, None, "a0")
    assert spelling in family_of(aggregate).spellings
    assert family_for_call(call) is family_of(aggregate)


def test_a_subclass_of_a_call_is_classified_as_its_parent():
    assert issubclass(exp.ApproxQuantile, exp.Quantile)
    call = sqlglot.parse_one("SELECT APPROX_QUANTILE(amount, 0.5) FROM t", read="duckdb").expressions[0]
    assert isinstance(call, exp.ApproxQuantile)
    assert classify(call, None, "a0").quantile == 0.5


def test_count_distinct_of_the_unit_counts_units_and_of_anything_else_values():
    def function(sql: str) -> str:
        call = sqlglot.parse_one(f"SELECT {sql} FROM t", read="duckdb").expressions[0]
        return classify(call, "user_id", "a0").function

    assert function("COUNT(DISTINCT user_id)") == "count_units"
    assert function("COUNT(DISTINCT store)") == "count_distinct"
    assert function("COUNT(DISTINCT user_id) FILTER (WHERE amount > 1)") == "count_distinct"


def test_the_shell_offers_every_family():
    offered = {s.text for s in complete("SELECT ", {"visits": ["amount"]}) if s.detail == "DP aggregate"}
    assert offered == {f"{name}(" for name in spellings()}
    assert {name for family in FAMILIES for name in family.spellings} == set(spellings())


@pytest.mark.parametrize("path", STAGES)
def test_no_stage_switches_on_an_aggregate_function(path):
    tree = ast.parse((ROOT / path).read_text())
    switches = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(isinstance(side, ast.Attribute) and side.attr == "function"
                        for side in (node.left, *node.comparators))]
    assert switches == [], f"{path} decides by aggregate function at lines {switches}: ask its family"


def test_unsupported_aggregates_are_refused_with_the_families_named():
    call = sqlglot.parse_one("SELECT STRING_AGG(store, ',') FROM t", read="duckdb").expressions[0]
    assert not isinstance(call, tuple(node for family in FAMILIES for node in family.nodes))
    with pytest.raises(UnsupportedQuery) as caught:
        classify(call, None, "a0")
    assert "is not supported" in str(caught.value)
    assert isinstance(caught.value.node, exp.Expression)
