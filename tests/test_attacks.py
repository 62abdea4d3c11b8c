"""Hostile queries (``fixtures/attacks/attacks.sql``), each run on two neighbouring databases.

Issue 6's rule, checked for every block: the analyst reads nothing except through a charged
DP release. Concretely, for each hostile query:

* both neighbours (with and without the target user, ``adversary.TARGET``) end the same way,
  with the same message — so the outcome says nothing about the target;
* a refusal is static: nothing charged, and no statement touching the private table ran;
* an answer is charged (or, over public tables only, exact and free) and never shows a value
  only the target has (its store key, its zip code);
* a run-time failure after the charge is ``QueryFailed`` with its fixed message, and the
  charge stays.

Every attack runs on DuckDB and on Spark (``-spark``; each neighbour a Spark session of its own);
``SPARK_REFUSES`` lists the attacks Spark refuses statically where DuckDB answers.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from adversary import neighbours, run

from dpsql.backends.duckdb import Engine
from dpsql.backends.render import render
from dpsql.backends.spark import SparkEngine

FIXTURE = Path(__file__).parent / "fixtures" / "attacks" / "attacks.sql"
DIRECTIVE = re.compile(r"-- (expect|options|xfail): (.*)")
GENERIC_FAILURE = "the query failed while running; its cost was charged and no answer was released"
TARGET_ONLY = ("zzz-only-42424", "target-zip")
"""Values that exist in the data only when the target is present."""


def load_attacks(path: Path = FIXTURE) -> list:
    """(name, sql, expect, options, xfail reason) of every block of the fixture."""
    attacks = []
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        block = block.strip()
        if not block.startswith("-- attack:"):
            continue
        lines = block.splitlines()
        name = lines[0].removeprefix("-- attack:").strip()
        directives, sql = {}, []
        for line in lines[1:]:
            match = DIRECTIVE.fullmatch(line)
            if match:
                directives[match.group(1)] = match.group(2).strip()
            else:
                sql.append(line)
        options = {}
        for pair in directives.get("options", "").split():
            key, value = pair.split("=")
            options[key] = float(value)
        attacks.append((name, "\n".join(sql), directives["expect"], options, directives.get("xfail")))
    return attacks


ATTACKS = load_attacks()


SPARK_CI = {
    "a table the policy does not declare",
    "read the bounded copy by its bare name",
    "integer division by zero only for the target's rows",
    "division by zero inside a per-unit MAX",
    "a failing cast inside FILTER",
    "NaN and infinity in a summed column",
    "more rows than MAX ROWS PER UNIT",
}
"""Attacks in the CI subset on Spark (``spark_ci``): the static walls Spark adds (its copies are
temporary views), the data-dependent failures after the charge, and what bounding must hide."""
SPARK_TEXT_CASTS = "is not supported on Spark: DuckDB and Spark parse text differently"
SPARK_REFUSES = {
    **{name: SPARK_TEXT_CASTS for name in (
        "a failing cast only for the target's rows", "a failing date parse only for the target's rows",
        "a failing cast in a group key", "a failing cast inside FILTER", "a failing cast in a quantile's argument",
        "a failing cast in COUNT(DISTINCT ...)", "a failing cast in a subquery's select list",
        "a failing cast in a join condition", "a failing cast in a UNION ALL branch",
        "a failing cast inside a per-unit aggregate", "a failing cast in a per-unit GROUP BY key")},
    "HUGEINT overflow in a per-unit SUM (TRY cannot wrap an aggregate)":
        "does not bind on Spark (DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION)",
}
"""Attacks DuckDB answers and Spark refuses statically (before the charge, alike on both
neighbours): a cast of text, which Spark parses otherwise (``dpsql.backends.spark.check``), and a
39-digit literal, past Spark's DECIMAL(38). The refusal is the attack's outcome on Spark
(Spark names only the class of its error: its text quotes the plan, salts included)."""


def _params():
    for name, sql, expect, options, xfail in ATTACKS:
        marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
        yield pytest.param(sql, expect, options, "duckdb", id=name, marks=marks)
        if not xfail:
            spark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]
            spark += [pytest.mark.spark_ci] if name in SPARK_CI else []
            if name in SPARK_REFUSES:
                expect = f"refuse UnsupportedQuery | {SPARK_REFUSES[name]}"
            yield pytest.param(sql, expect, options, "spark", id=f"{name}-spark", marks=spark)


def test_the_fixture_holds_at_least_forty_hostile_queries_with_known_outcomes():
    assert len(ATTACKS) >= 40
    assert len({name for name, *_ in ATTACKS}) == len(ATTACKS), "attack names must be unique"
    for name, sql, expect, _, _ in ATTACKS:
        assert sql.strip(), name
        assert expect.split()[0] in ("refuse", "answer", "fail"), name


class _Reads:
    """Records every statement dpsql runs that reads rows (DESCRIBE binds only)."""

    def __init__(self, monkeypatch):
        self.statements: list[str] = []
        for backend in (Engine, SparkEngine):
            for method in ("fetch", "fetch_df"):
                original = getattr(backend, method)

                def recording(engine, sql, *args, _original=original, **kwargs):
                    # a checked tree: as it runs
                    self.statements.append(sql if isinstance(sql, str) else render(sql, engine.dialect))
                    return _original(engine, sql, *args, **kwargs)

                monkeypatch.setattr(backend, method, recording)
        original_fill = SparkEngine._fill

        def filling(engine, sources, _original=original_fill):
            # Spark caches a bounded copy when a statement first reads it: that reads private rows
            self.statements.extend(f"fill the copy of {source}" for source in sources)
            return _original(engine, sources)

        monkeypatch.setattr(SparkEngine, "_fill", filling)

    def private(self) -> list[str]:
        return [s for s in self.statements if re.search(r'\bvisits\b', s, re.IGNORECASE)]


@pytest.fixture(scope="module")
def opened():
    """Per engine, the two neighbours, shared by every attack: an analyst's session, not a fresh
    start (opened when an attack on that engine first runs)."""
    connections: dict[str, dict] = {}
    yield connections
    for pair in connections.values():
        for connection in pair.values():
            connection.close()


@pytest.mark.parametrize("sql, expect, options, engine", list(_params()))
def test_attack(sql, expect, options, engine, opened, monkeypatch):
    if engine not in opened:
        opened[engine] = neighbours(engine=engine)
    databases = opened[engine]
    reads = _Reads(monkeypatch)
    kind, _, fragment = expect.partition("|")
    kind, fragment = kind.split(), fragment.strip()
    present = run(databases[True], sql, **options)
    private_reads = reads.private()
    absent = run(databases[False], sql, **options)
    # The privacy property first: the two neighbours look the same.
    assert (present.kind, present.message) == (absent.kind, absent.message), \
        f"the outcome depends on the target: {present.kind} {present.message!r} vs {absent.kind} {absent.message!r}"
    assert present.rows == absent.rows or present.kind == "answer"
    if kind[0] == "refuse":
        assert present.kind == kind[1], present.message
        assert fragment in present.message
        assert present.spent == 0 and absent.spent == 0, "a refusal must charge nothing"
        assert private_reads == [], f"a refusal read private data: {private_reads}"
    elif kind[0] == "answer":
        assert present.kind == "answer", present.message
        result = present.result
        if result.exact:
            assert result.cost.epsilon == 0
        else:
            assert present.spent > 0 and absent.spent == present.spent
        shown = {str(value) for row in result.fetchall() for value in row}
        assert not shown & set(TARGET_ONLY), "a value only the target has was released"
        for row in result.fetchall():
            for value in row:
                assert not (isinstance(value, float) and math.isnan(value)), "NaN released"
    else:
        assert present.kind == "QueryFailed" and present.message == GENERIC_FAILURE
        assert present.spent > 0, "a failure after the charge keeps the charge"
