"""A corpus of realistic analyst queries, each answered or refused as its label says.

The queries live in ``fixtures/corpus/*.sql`` (format: ``fixtures/corpus/README.md``):
``shop.sql`` over the demo shop database, ``census.sql`` over the PUMS sample. Every query
runs through the public API only, on a fresh connection with a generous budget, an
in-memory ledger and a noise source seeded from the query's name, so each test stands alone
and gives the same noise whichever tests run. Queries marked ``-- known gap:`` are strict
expected failures: dpsql does not yet do what their label says.
"""

from __future__ import annotations

import decimal
import math
import re
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pytest
from pums import load_pums
from sqlglot import exp

import dpsql
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.mechanisms.noise import SeededSource
from dpsql.sql.parse import parse_query

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
FILES = ("shop.sql", "census.sql")

LABEL = re.compile(r"^-- (answer|refuse)(?: \[([^\]]*)\])?(?:: *(\w+) *\| *(.+?))?\s*$")
DIRECTIVE = re.compile(r"^-- (name|known gap|at|max rows): *(.*?)\s*$")
OPTION_TYPES = {"epsilon": float, "delta": float, "noise": str}

# The demo policy with a budget no corpus query can exhaust and a default epsilon of 1: with
# 300 users, the demo's 0.1 would drown most answers in noise.
SHOP_BUDGET = ("BUDGET EPSILON 3.0 DELTA 1e-6;", "BUDGET EPSILON 1000 DELTA 1e-3;")
SHOP_EPSILON = ("QUERY EPSILON 0.1;", "QUERY EPSILON 1.0;")

EDUC_LEVELS = [
    (1, "No schooling", "no diploma", 0), (2, "Nursery to grade 4", "no diploma", 2),
    (3, "Grade 5 or 6", "no diploma", 5), (4, "Grade 7 or 8", "no diploma", 7),
    (5, "Grade 9", "no diploma", 9), (6, "Grade 10", "no diploma", 10),
    (7, "Grade 11", "no diploma", 11), (8, "Grade 12, no diploma", "no diploma", 12),
    (9, "High school diploma", "high school", 12), (10, "Some college, under 1 year", "some college", 13),
    (11, "Some college, 1 or more years", "some college", 14), (12, "Associate degree", "associate", 14),
    (13, "Bachelor degree", "bachelor", 16), (14, "Master degree", "graduate", 18),
    (15, "Professional degree", "graduate", 19), (16, "Doctorate", "graduate", 21),
]
"""The public ``educ_levels`` table: the PUMS education codes (ACS SCHL, coarsened)."""
RACES = [(1, "White"), (2, "Black"), (3, "Asian"), (4, "Other"), (5, "American Indian"), (6, "Two or more")]
"""The public ``races`` table: the PUMS race codes."""


@dataclass
class Query:
    file: str
    line: int
    label: str  # "answer" or "refuse"
    sql: str
    name: str = ""
    options: dict = field(default_factory=dict)
    error: str | None = None
    fragment: str | None = None
    at: str | None = None
    max_rows: int | None = None
    gap: str | None = None

    @property
    def id(self) -> str:
        return f"{self.file.removesuffix('.sql')}:{self.label}:{self.name}"


def load_corpus(name: str) -> list[Query]:
    """The queries of one corpus file, in order."""
    queries: list[Query] = []
    body: list[str] = []
    lines = (CORPUS / name).read_text(encoding="utf-8").splitlines()

    def finish():
        if not queries:
            return
        while body and (not body[-1].strip() or body[-1].lstrip().startswith("--")):
            body.pop()  # blank lines and section comments before the next label
        queries[-1].sql = "\n".join(body).strip()
        body.clear()

    in_directives = False
    for number, text in enumerate(lines, 1):
        label = LABEL.match(text)
        if label:
            finish()
            kind, options, error, fragment = label.groups()
            if (kind == "refuse") != (error is not None):
                raise ValueError(f"{name}:{number}: a refusal needs 'Class | fragment', an answer none")
            queries.append(Query(name, number, kind, "", options=_options(options, name, number),
                                 error=error, fragment=fragment))
            in_directives = True
            continue
        if not queries:
            continue  # the file's header
        directive = DIRECTIVE.match(text) if in_directives else None
        if directive:
            key, value = directive.groups()
            query = queries[-1]
            if key == "name":
                query.name = value
            elif key == "known gap":
                query.gap = value
            elif key == "at":
                query.at = value
            else:
                query.max_rows = int(value)
            continue
        in_directives = False
        body.append(text)
    finish()
    for query in queries:
        if not query.name or not query.sql:
            raise ValueError(f"{name}:{query.line}: every query needs a name and SQL")
    return queries


def _options(text: str | None, name: str, number: int) -> dict:
    options = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in OPTION_TYPES:
            raise ValueError(f"{name}:{number}: unknown option {key!r}")
        options[key] = OPTION_TYPES[key](value.strip())
    return options


CORPORA = {name: load_corpus(name) for name in FILES}


def _params(label: str):
    for name in FILES:
        for query in CORPORA[name]:
            if query.label != label:
                continue
            marks = [pytest.mark.xfail(strict=True, reason=f"known gap: {query.gap}")] if query.gap else []
            yield pytest.param(query, id=query.id, marks=marks)


# -- databases --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shop_database(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "shop.duckdb"
    build_shop_database(path, users=300)
    return str(path)


def census_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the census corpus's tables: ``pums`` and the public code tables."""
    con = duckdb.connect()
    load_pums(con)
    con.execute("CREATE TABLE educ_levels (educ INTEGER, label VARCHAR, level VARCHAR, years INTEGER)")
    con.executemany("INSERT INTO educ_levels VALUES (?, ?, ?, ?)", EDUC_LEVELS)
    con.execute("CREATE TABLE races (race INTEGER, name VARCHAR)")
    con.executemany("INSERT INTO races VALUES (?, ?)", RACES)
    return con


@pytest.fixture(scope="module")
def census_database():
    con = census_connection()
    yield con
    con.close()


def shop_policy() -> str:
    policy = SHOP_POLICY
    for old, new in (SHOP_BUDGET, SHOP_EPSILON):
        assert old in policy, f"the demo policy no longer has {old!r}; update test_corpus.py"
        policy = policy.replace(old, new)
    return policy


@pytest.fixture
def connect(request):
    """Open a fresh connection for a query: its own budget, ledger and seeded noise."""
    opened = []

    def open_for(query: Query):
        seed = zlib.crc32(query.id.encode())
        if query.file == "shop.sql":
            target = request.getfixturevalue("shop_database")
            policy = shop_policy()
        else:
            target = request.getfixturevalue("census_database")
            policy = (CORPUS / "census.policy").read_text(encoding="utf-8")
        db = dpsql.connect(target, policy=policy, ledger=":memory:", rng=SeededSource(seed))
        opened.append(db)
        return db

    yield open_for
    for db in opened:
        db.close()


# -- checks -----------------------------------------------------------------------------------


def expected_columns(sql: str) -> list[str | None] | None:
    """The output names the SELECT gives, as DuckDB names them: an alias, or a plain column's
    name; ``None`` where DuckDB derives the name from the expression's text; ``None`` for the
    whole list when it has a ``*``."""
    tree = parse_query(sql)
    while isinstance(tree, (exp.Union, exp.Subquery)):
        tree = tree.this if isinstance(tree, exp.Subquery) else tree.left
    names = []
    for item in tree.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            return None
        if isinstance(item, exp.Alias):
            names.append(item.alias)
        elif isinstance(item, exp.Column):
            names.append(item.name)
        else:
            names.append(None)
    return names


def _is_number(value) -> bool:
    return isinstance(value, (int, float, decimal.Decimal, np.number)) and not isinstance(value, (bool, np.bool_))


def _within_sql(sql: str, line: int | None, col: int | None) -> bool:
    lines = sql.split("\n")
    return line is not None and col is not None and 1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1


@pytest.mark.parametrize("query", list(_params("answer")))
def test_answered(query: Query, connect):
    db = connect(query)
    result = db.sql(query.sql, **query.options)
    rows = result.fetchall()
    assert rows, "an answer releases at least one row"
    if query.max_rows is not None:
        assert len(rows) <= query.max_rows, f"{len(rows)} rows released: {rows}"

    names = expected_columns(query.sql)
    if names is not None:
        assert len(result.columns) == len(names), result.columns
        for got, want in zip(result.columns, names):
            if want is not None:
                assert got == want, f"column {got!r} should be named {want!r}"
    assert all(len(row) == len(result.columns) for row in rows)

    cost, total = result.cost, db.budget.total
    if result.exact:
        assert cost.epsilon == 0 and cost.delta == 0, "public tables are free"
    else:
        assert not result.repeat and cost.epsilon > 0, "a first query is charged, not repeated"
        assert cost.epsilon <= total.epsilon and cost.delta <= total.delta
        assert db.budget.spent.epsilon == cost.epsilon
        for name in ("epsilon", "delta"):
            if name in query.options:
                assert getattr(cost, name) == Fraction(str(query.options[name])), f"{name} charged as asked"

    for row in rows:
        for value in row:
            if _is_number(value):
                assert math.isfinite(float(value)), f"released a non-finite value: {row}"


@pytest.mark.parametrize("query", list(_params("refuse")))
def test_refused(query: Query, connect):
    db = connect(query)
    before = db.budget.spent
    with pytest.raises(dpsql.DPError) as caught:
        db.sql(query.sql, **query.options)
    error = caught.value
    assert type(error).__name__ == query.error, f"{type(error).__name__}: {error}"
    assert query.fragment in str(error), str(error)
    assert db.budget.spent == before, "a refusal charges nothing"
    assert len(db.ledger()) == 0, "a refusal records nothing"
    if query.at is None:
        assert _within_sql(query.sql, error.line, error.col), \
            f"no position inside the SQL: line {error.line}, column {error.col}: {error}"
    elif query.at != "none":
        assert f"{error.line}:{error.col}" == query.at, str(error)


def _counts(name: str) -> str:
    queries = CORPORA[name]
    answer = sum(q.label == "answer" for q in queries)
    gaps = sum(q.gap is not None for q in queries)
    return f"{name}: {answer} answer, {len(queries) - answer} refuse, {gaps} known gaps"


@pytest.mark.parametrize("name", [pytest.param(n, id=_counts(n)) for n in FILES])
def test_corpus_file_is_well_formed(name: str):
    queries = CORPORA[name]
    names = [q.name for q in queries]
    assert len(names) == len(set(names)), "query names are unique within a file"
    assert {q.label for q in queries} == {"answer", "refuse"}
    for query in queries:
        assert query.label == "refuse" or query.at is None, f"{query.name}: 'at' is for refusals"
        assert query.label == "answer" or query.max_rows is None, f"{query.name}: 'max rows' is for answers"
        if query.error is not None:
            assert isinstance(getattr(dpsql, query.error, None), type), f"{query.name}: no dpsql.{query.error}"
    sqls = [" ".join(q.sql.split()) + repr(sorted(q.options.items())) for q in queries]
    assert len(sqls) == len(set(sqls)), "no query is there twice"


def test_corpus_size_and_labels():
    queries = [q for name in FILES for q in CORPORA[name]]
    answered = sum(q.label == "answer" for q in queries)
    refused = len(queries) - answered
    assert len(queries) >= 100
    assert answered > 0 and refused > 0
    assert 0.5 <= answered / len(queries) <= 0.7, f"{answered} answer / {refused} refuse"


def test_another_contribution_bound_is_not_a_free_repeat(shop_database):
    """Found while building the corpus: the same query under another max_groups_contributed
    bounds the data differently, so its earlier release is not its answer."""
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_groups_contributed = {}) store, COUNT(*) AS n "
           "FROM visits GROUP BY store")
    with dpsql.connect(shop_database, policy=shop_policy(), ledger=":memory:", rng=SeededSource(1)) as db:
        first = db.sql(sql.format(5))
        second = db.sql(sql.format(1))
        assert not first.repeat
        assert not second.repeat, "a query under another contribution bound was answered as a free repeat"
