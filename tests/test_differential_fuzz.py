"""The differential sensitivity fuzzer (issue 11 item 6, issue 16 item 6).

For neighbouring pairs of databases the properties of ``tests/differential.py`` must hold:
(a) the same outcome on both neighbours end to end, (b) every exact bounded measure (noise off,
``tests/exact.py``) moving by at most its analysed L1 and L2, (c) quantile histograms by at most
the count change they were calibrated for, (d) keys compared by DuckDB's identity, never
merged, and released identically when their domain is public.

Two kinds of pairs: generated ones, by family (``tests/differential_cases.py``), and the known
mechanisms written out as the smallest pairs that show them (``tests/differential_known.py``).
Every known mechanism was fixed in issues 11 and 16 (each had failed on the code before);
``python benchmarks/bench_fuzz.py --family NAME --shrink`` runs a family longer and shrinks
what it finds. Shrinking is off here to keep within the CI budget;
a failure prints its case in full.
"""

from __future__ import annotations

import pytest
from differential import Case, Databases, Table, exact_violations, observe, violations
from differential_cases import FAMILIES
from differential_known import KNOWN
from exact import halved
from hypothesis import HealthCheck, Phase, example, given, settings

EXAMPLES = 25
"""Generated pairs per family in the suite (0.1 to 0.4 s each); the bench script runs more."""

def _family_params():
    return [pytest.param(name, id=name) for name in FAMILIES]


def _known_params():
    return [pytest.param(name, id=name) for name in KNOWN]


@pytest.fixture(scope="module")
def databases():
    opened = Databases()
    yield opened
    opened.close()


def assert_holds(case: Case, databases: Databases) -> None:
    found = violations(case, databases=databases)
    assert not found, "\n".join([*map(str, found), "", case.reproduction()])


@pytest.mark.parametrize("family", list(_family_params()))
def test_generated_neighbours_differ_only_by_what_the_noise_covers(family, databases):
    """The family's known pairs first (so a family always meets its known mechanisms), then
    EXAMPLES generated ones."""
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, report_multiple_bugs=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=FAMILIES[family]())
    def holds(case):
        assert_holds(case, databases)

    for case in KNOWN.values():
        if case.family == family:
            holds = example(case=case)(holds)
    holds()


@pytest.mark.parametrize("name", list(_known_params()))
def test_known_mechanism_is_closed(name, databases):
    assert_holds(KNOWN[name], databases)


# ------------------------------------------------------------------------------------------
# The harness itself: it must read the real data, and it must catch a broken analysis.

TIGHT = Case(
    "unit_level",
    "BUDGET EPSILON 1000 DELTA 0.5; QUERY EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, "
    "x BOUNDS 0 TO 4, g KEYS FROM keys.g); PUBLIC TABLE keys;",
    "SELECT g, COUNT(*), SUM(x), MEDIAN(x) FROM t GROUP BY g",
    Table("t", (("uid", "INTEGER"), ("g", "VARCHAR"), ("x", "INTEGER")), (("1", "'a'", "1"), ("2", "'b'", "3"))),
    (("99", "'a'", "4"), ("99", "'a'", "9"), ("99", "'a'", "4")),
    (Table("keys", (("g", "VARCHAR"),), (("'a'",), ("'b'",))),),
    keys=1,
)
"""A unit with more than k rows at the upper bound, all in one group: it moves COUNT by k, SUM by
k * 4 and the histogram by k — exactly the analysed bounds."""


def _runs(case: Case):
    sides = [observe(case, extra, seed=0, side=side) for side, extra in enumerate(case.neighbours)]
    assert all(side.exact is not None for side in sides), [side.exact_error for side in sides]
    return [side.exact for side in sides]


def test_exact_hook_reads_the_bounded_data():
    base, added = _runs(TIGHT)
    count, total = (m.name for m in base.plan.summed)
    assert base.vectors[count] == {("a",): 1, ("b",): 1} and base.vectors[total] == {("a",): 1, ("b",): 3}
    assert added.vectors[count] == {("a",): 3, ("b",): 1}     # the unit keeps k = 2 of its rows
    assert added.vectors[total] == {("a",): 9, ("b",): 3}     # 1 + 4 + 4: its 9 clamped to 4


def test_the_tight_pair_reaches_its_bounds_and_holds():
    base, added = _runs(TIGHT)
    assert exact_violations(base, added) == []
    for name, claimed in base.sensitivities.items():
        moved = sum(abs(added.vectors[name].get(k, 0) - base.vectors[name].get(k, 0))
                    for k in set(added.vectors[name]) | set(base.vectors[name]))
        assert moved == claimed.l1, name


def test_a_halved_sensitivity_is_caught():
    base, added = _runs(TIGHT)
    broken = exact_violations(halved(base), halved(added))
    assert {v.prop for v in broken} == {"sensitivity", "quantile"}
    assert len([v for v in broken if v.prop == "sensitivity"]) == len(base.sensitivities)
    assert set(halved(base).histogram_bounds.values()) == {1}   # k = 2, halved
