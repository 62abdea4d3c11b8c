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
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from adversary import neighbours, run

from dpsql.backends.duckdb import Engine
from dpsql.backends.render import render

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


def _params():
    for name, sql, expect, options, xfail in ATTACKS:
        marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
        yield pytest.param(sql, expect, options, id=name, marks=marks)


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
        for method in ("fetch", "fetch_df"):
            original = getattr(Engine, method)

            def recording(engine, sql, *args, _original=original, **kwargs):
                self.statements.append(sql if isinstance(sql, str) else render(sql))  # a checked tree: as it runs
                return _original(engine, sql, *args, **kwargs)

            monkeypatch.setattr(Engine, method, recording)

    def private(self) -> list[str]:
        return [s for s in self.statements if re.search(r'\bvisits\b', s, re.IGNORECASE)]


@pytest.fixture(scope="module")
def databases():
    """The two neighbours, shared by every attack: an analyst's session, not a fresh start."""
    connections = neighbours()
    yield connections
    for connection in connections.values():
        connection.close()


@pytest.mark.parametrize("sql, expect, options", list(_params()))
def test_attack(sql, expect, options, databases, monkeypatch):
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
