"""The check stage: every class of refusal, with its position, and the accepted shapes.

Refusals live in ``fixtures/check/refusals__invalid.sql`` (query, expected error code,
message fragment, line:column), accepted queries in ``fixtures/check/accepted.sql``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
from shop import SHOP, SHOP_CATALOG

from dpsql.analysis.analyse import PrivacyOptions, analyse_query
from dpsql.analysis.check import check_query
from dpsql.analysis.plan import PrivateQuery, PublicQuery
from dpsql.backends.render import render
from dpsql.errors import DPError
from dpsql.sql.parse import located, parse_query

FIXTURES = Path(__file__).parent / "fixtures" / "check"
HEADER = re.compile(r"-- expect: (\w+) \| (.+?) \| (\d+|None):(\d+|None)")
OPTION = re.compile(r"-- (weights|noise): (\S+)")


def _blocks(path: Path) -> list[str]:
    text = path.read_text()
    blocks = [b.strip() for b in text.split("\n\n")]
    return [b for b in blocks if b and not all(line.startswith("--") for line in b.splitlines())
            or HEADER.search(b)]


def _refusals():
    for block in _blocks(FIXTURES / "refusals__invalid.sql"):
        header = HEADER.search(block)
        if header is None:
            continue
        sql = "\n".join(line for line in block.splitlines() if not line.startswith("-- expect"))
        line, col = (None if v == "None" else int(v) for v in header.group(3, 4))
        yield pytest.param(sql, header.group(1), header.group(2), line, col, id=header.group(2)[:50])


def _accepted():
    for block in _blocks(FIXTURES / "accepted.sql"):
        sql = "\n".join(line for line in block.splitlines() if not line.startswith("--")).strip()
        if sql:
            yield pytest.param(sql, id=sql[:60])


def run_static(sql: str, delta: Fraction = Fraction(0)):
    """Every static stage, with refusals located as the connection's boundary locates them;
    options may ride in a trailing comment (``-- noise: gaussian``)."""
    try:
        return _stages(sql, delta)
    except DPError as error:
        raise located(error, sql) from None


def _stages(sql: str, delta: Fraction):
    query = check_query(parse_query(sql), sql, SHOP, SHOP_CATALOG)
    if not isinstance(query, PrivateQuery):
        return query
    options = PrivacyOptions(epsilon=Fraction(1), delta=delta)
    for name, value in OPTION.findall(sql):
        if name == "noise":
            options = PrivacyOptions(epsilon=Fraction(1), delta=delta, noise=value)
        else:
            key, weight = value.split("=")
            options = PrivacyOptions(epsilon=Fraction(1), delta=delta, weights=((key, Fraction(weight)),))
    return analyse_query(query, SHOP, options)


@pytest.mark.parametrize("sql, code, fragment, line, col", list(_refusals()))
def test_refusal_names_the_construct_and_its_position(sql, code, fragment, line, col):
    with pytest.raises(DPError) as caught:
        run_static(sql)
    error = caught.value
    assert error.code == code
    assert fragment in str(error), str(error)
    assert (error.line, error.col) == (line, col), str(error)
    assert error.hint, "every refusal says what to write instead"


@pytest.mark.parametrize("sql", list(_accepted()))
def test_accepted_queries_plan_without_touching_data(sql):
    result = run_static(sql, delta=Fraction(1, 10**6))
    assert result is not None


def test_fixtures_cover_every_refusal_class():
    assert len(list(_refusals())) >= 30
    assert len(list(_accepted())) >= 12


def test_public_only_query_is_regenerated_from_the_ast_without_comments():
    query = run_static("SELECT city /* secret */, COUNT(*) FROM stores -- trailing\nGROUP BY city")
    assert isinstance(query, PublicQuery)
    runs = render(query.tree)  # what the backend runs
    assert "secret" not in runs and "trailing" not in runs


def test_names_resolve_case_insensitively_as_in_duckdb():
    plan = run_static('SELECT Store, COUNT(*) FROM MAIN.VISITS GROUP BY STORE')
    assert plan.query.table == "visits" and plan.query.keys[0].expression.name == "store"


def test_group_by_alias_and_ordinal():
    by_alias = run_static("SELECT store AS s, COUNT(*) FROM visits GROUP BY s")
    by_ordinal = run_static("SELECT store, COUNT(*) FROM visits GROUP BY 1")
    assert by_alias.query.keys[0].expression == by_ordinal.query.keys[0].expression
    assert by_alias.query.keys[0].domain is not None


def test_output_names_follow_duckdb():
    plan = run_static("SELECT COUNT(*), SUM(amount), AVG(age) AS a FROM visits")
    assert list(plan.query.outputs) == ["count_star()", "sum(amount)", "a"]
