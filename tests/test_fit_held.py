"""The lean path of a fit by gradient descent: its rows projected once (``projection_statement``,
held by the engine for the fit), every step one scan of them (``held_gradient_statement``).

The privacy of a step rests on the same facts as over the bounded rows (tests/test_fit.py), each
checked here by brute force through the held path's own SQL on tiny tables: every unit's clipped
vector has L2 norm at most D grid steps whatever its rows; the projection gives each unit exactly
one id (a unit split over two ids would be clipped twice and count twice); so adding or removing a
unit moves the summed step by at most D, replacing one by at most 2D. A clip loosened, or ids given
per row instead of per unit, fails these tests.
"""

from __future__ import annotations

import secrets

import duckdb
import numpy as np
import pytest
from test_fit import ADVERSARIES, BASE, TINY, WEIGHTS, squared_norm, summed, tiny, unit_vectors

import dpsql
import dpsql.calls.fit_sql
from dpsql.calls.fit import plan_fit
from dpsql.calls.fit_sql import held_count_statement, held_gradient_statement, held_means_statement
from dpsql.mechanisms.noise import SeededSource

OFFSETS = [[0.0, 0.0], [0.3, -0.6]]


def held(db, fit, projection_sql: str | None = None) -> str:
    """Hold the fit's projection (or a mutated text of it) under a fresh name; return the name."""
    name = "dp_fit_" + secrets.token_hex(8)
    statement = fit.projection
    assert db._engine.hold(name, projection_sql or statement.sql, db._executor.salt_for(statement.needs_salt),
                           bounded=statement.bounded)
    return name


def held_vectors(db, fit, name: str, weights, offsets=None) -> list[np.ndarray]:
    """Each unit's clipped integer vector on the held path (its id is not the unit's: a list)."""
    size = len(fit.features) + 1
    statement = held_gradient_statement(fit.plan, fit.columns, name, fit.model, weights, fit.clip,
                                        fit.noise.norm_steps, offsets,
                                        final=", ".join(f"t{i}" for i in range(size)))
    return [np.array([int(v) for v in row], dtype=object) for row in db._engine.fetch(statement.sql)]


def held_sum(db, fit, name: str, weights, offsets=None) -> np.ndarray:
    statement = held_gradient_statement(fit.plan, fit.columns, name, fit.model, weights, fit.clip,
                                        fit.noise.norm_steps, offsets)
    return np.array([int(v or 0) for v in db._engine.fetch(statement.sql)[0]], dtype=object)


def plan(db, model: str = "linear"):
    target = "y" if model == "linear" else "y > 2"
    return plan_fit(db.mechanism_context(), f"SELECT x, z, {target} AS y FROM t", target="y", model=model, epsilon=1,
                    delta=1e-6, clip=0.5)


@pytest.mark.parametrize("model, rows", [("linear", 3), ("logistic", 3), ("linear", 1)])
def test_each_units_held_vector_is_the_copys_and_within_the_clip(model, rows):
    """The held path gives the same per-unit vectors as the step over the bounded rows (to one grid
    step per coordinate: a unit's average summed as c * r instead of AVG), one per unit with a
    complete row, each of norm at most D (adversaries included, some at the clip), and its step
    sums exactly them."""
    db = tiny(units=ADVERSARIES, rows=rows)
    fit = plan(db, model)
    bound = fit.noise.norm_steps
    name = held(db, fit)
    reached = 0
    for weights in WEIGHTS:
        vectors = held_vectors(db, fit, name, weights)
        reference = sorted(unit_vectors(db, fit, weights).values(), key=lambda v: [int(x) for x in v])
        assert len(vectors) == len(reference)  # one id per unit, and only units with a complete row
        matched = sorted(vectors, key=lambda v: [int(x) for x in v])
        assert all(max(abs(int(a) - int(b)) for a, b in zip(u, v)) <= 1 for u, v in zip(matched, reference))
        for vector in vectors:
            assert squared_norm(vector) <= bound * bound, weights
            reached = max(reached, squared_norm(vector))
        assert list(held_sum(db, fit, name, weights)) == list(sum(vectors))
        assert all(abs(int(a) - int(b)) <= len(vectors) for a, b in zip(held_sum(db, fit, name, weights),
                                                                          summed(db, fit, weights)))
    assert reached >= (bound // 2) ** 2
    count = db._engine.fetch(held_count_statement(fit.plan, name).sql)[0][0]
    assert count == len(vectors)
    db._engine.drop_held(name)


def without(neighbours: str, removed: int, units: dict) -> dpsql.Connection:
    """``tiny``'s table less the base unit ``removed``, plus ``units``."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, x DOUBLE, z DOUBLE, y DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [row for row in BASE if row[0] != removed])
    for unit_rows in units.values():
        for uid, x, z, y in unit_rows:
            con.execute(f"INSERT INTO t VALUES ({uid}, {x}, {z}, {y})")
    return dpsql.connect(con, policy=TINY.format(neighbours=neighbours, rows=3), rng=SeededSource(3))


def neighbour_moves(neighbours: str, model: str, projection_mutation=None) -> tuple[int, int]:
    """(the largest squared L2 move of the held step's sum between neighbouring tables, D^2 times
    the relation's factor squared), over every adversary unit added to the base table
    (add/remove) or put in place of a base unit (replace-one), at every weight and offset."""
    factor = 1 if neighbours == "UNBOUNDED" else 2
    worst, bound = 0, 0
    base_db = tiny(neighbours)
    base_fit = plan(base_db, model)
    sums = {}

    def step_sums(db) -> list[np.ndarray]:
        fit = plan(db, model)
        sql = fit.projection.sql if projection_mutation is None else projection_mutation(fit.projection.sql)
        name = held(db, fit, sql)
        out = [held_sum(db, fit, name, w + [0.0], o) for w in [w[:2] for w in WEIGHTS] for o in OFFSETS]
        db._engine.drop_held(name)
        return out

    sums["base"] = step_sums(base_db)
    bound = (factor * base_fit.noise.norm_steps) ** 2
    base_units = sorted({uid for uid, *_ in BASE})
    for uid, rows in ADVERSARIES.items():
        if neighbours == "UNBOUNDED":
            others = [step_sums(tiny(neighbours, units={uid: rows}))]
        else:  # replace base unit b by the adversary: the base table less b, plus the adversary
            others = [step_sums(without(neighbours, removed, {uid: rows})) for removed in base_units]
        for other in others:
            for a, b in zip(sums["base"], other):
                worst = max(worst, squared_norm(a - b))
    return worst, bound


@pytest.mark.parametrize("neighbours, model", [("UNBOUNDED", "linear"), ("BOUNDED", "logistic")])
def test_neighbouring_tables_move_the_held_step_by_at_most_the_clip(neighbours, model):
    """Brute force over tables: the held step's sum moves by at most factor * D, and by more than
    half of it for some adversary (the bound is tight)."""
    worst, bound = neighbour_moves(neighbours, model)
    assert worst <= bound
    assert worst >= bound // 4


def test_ids_per_row_instead_of_per_unit_fail_the_neighbour_test():
    """The mutation the projection's one id per unit guards against: numbered per row, a unit of
    three rows at a corner (adversary 13) is clipped three times and moves the sum by about 3D."""
    def per_row(sql: str) -> str:
        assert "dp_fit_ids.u AS u" in sql
        return sql.replace("dp_fit_ids.u AS u", "CAST(ROW_NUMBER() OVER () AS BIGINT) AS u")

    worst, bound = neighbour_moves("UNBOUNDED", "linear", per_row)
    assert worst > bound


def test_a_loosened_clip_fails_the_bound(monkeypatch):
    """With the clip's margin mutated to 1.5 (a unit kept up to 1.5 D), the per-unit bound fails."""
    monkeypatch.setattr(dpsql.calls.fit_sql, "MARGIN", 1.5)
    db = tiny(units=ADVERSARIES)
    fit = plan(db, "linear")
    name = held(db, fit)
    bound = fit.noise.norm_steps
    assert max(squared_norm(v) for w in WEIGHTS for v in held_vectors(db, fit, name, w)) > bound * bound


def test_the_held_means_are_the_copys():
    """The means over the held projection equal the means statement over the bounded rows, to one
    grid step per unit and coordinate (truncation of a float average computed another way)."""
    db = tiny(units=ADVERSARIES)
    fit = plan(db, "logistic")
    name = held(db, fit)
    assert fit.means is not None
    held_row = db._engine.fetch(held_means_statement(fit.plan, fit.columns, name, fit.noise.mean_steps).sql)[0]
    copy_row = db._engine.fetch(fit.means.sql, db._executor.salt_for(fit.means.needs_salt),
                                bounded=fit.means.bounded)[0]
    units = db._engine.fetch(held_count_statement(fit.plan, name).sql)[0][0]
    assert all(abs(int(a) - int(b)) <= units for a, b in zip(held_row, copy_row))
    assert any(int(a) != 0 for a in held_row)


def test_a_fit_runs_on_the_held_projection_and_drops_it():
    """db.fit holds its projection, reads it for the count, the means and every step (the copy is
    read once), and leaves no table behind."""
    db = tiny(units=ADVERSARIES)
    engine = db._engine
    seen: list[str] = []
    original_fetch, original_hold = engine.fetch, engine.hold

    def fetch(sql, *args, **kwargs):
        seen.append(sql)
        return original_fetch(sql, *args, **kwargs)

    def hold(name, sql, *args, **kwargs):
        seen.append("HOLD " + name)
        return original_hold(name, sql, *args, **kwargs)

    engine.fetch, engine.hold = fetch, hold
    model = db.fit("SELECT x, z, y FROM t", target="y", epsilon=1, delta=1e-6, steps=5, method="gradient")
    engine.fetch, engine.hold = original_fetch, original_hold
    assert seen[0].startswith("HOLD dp_fit_") and len(seen) == 1 + 2 + 5
    name = seen[0].split()[1]
    assert all(name in sql for sql in seen[1:])
    assert not any("dp_bounded" in sql for sql in seen[1:])  # only the projection read the copy
    left = engine.fetch("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'dp_fit_%'")
    assert left == [] and np.isfinite(model.intercept)


def test_an_engine_that_holds_nothing_runs_the_fit_over_the_copy():
    """Where the engine keeps no projection (Spark; a read-only engine), every step reads the
    bounded rows as before, and the fit is released all the same."""
    db = tiny(units=ADVERSARIES)
    db._engine.hold = lambda *args, **kwargs: False
    model = db.fit("SELECT x, z, y FROM t", target="y", epsilon=1, delta=1e-6, steps=3, method="gradient")
    assert np.isfinite(model.intercept) and model.cost.epsilon == 1
