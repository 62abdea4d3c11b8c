"""The connection: composes the stages into ``db.sql``, ``db.explain`` and ``db.budget``.

Order matters for privacy (DESIGN.md invariants 1 and 2): every static stage — parse, bind,
check, analyse, rewrite, parameter validation — runs first, touching no private data and
charging nothing; then the ledger is charged in one transaction; only then is private data
read. Any failure after the charge keeps the charge and reaches the analyst as a fixed
message with no data in it.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from .analyse import PrivacyOptions, analyse_query
from .check import check_query
from .engine import Engine
from .errors import InvalidParameter, PolicyError, QueryFailed, UnsupportedQuery
from .explain import explain_plan
from .ledger import Ledger, Spend
from .model import Policy
from .parse import parse_query
from .plan import Plan, PrivateQuery, PublicQuery
from .policy import check_policy, load_policy, policy_to_text
from .release import half_widths, release_measures, released_rows
from .result import Budget, DPResult
from .rewrite import domain_sql, rewrite_plan

NOISE_FAMILIES = ("laplace", "gaussian")


def connect(target: Any = ":memory:", policy: Any = None, *, ledger: Any = None,
            analyst: str | None = None, rng: Any = None) -> "Connection":
    """Open ``target`` under ``policy`` and return a connection that answers with DP.

    ``target``: a DuckDB file path (opened read-only), an open duckdb connection, or a dict of
    table name -> pandas DataFrame. ``policy``: a policy file path, policy text, or a Policy.
    ``ledger``: where the budget ledger lives; by default ``<database file>.ledger`` beside a
    file, in memory otherwise. ``rng``: a noise source for tests; production uses the
    cryptographically secure default.

    >>> import pandas as pd
    >>> frame = pd.DataFrame({"uid": [1, 1, 2], "x": [1.0, 2.0, 3.0]})
    >>> policy = "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, x BOUNDS 0 TO 5);"
    >>> with connect({"t": frame}, policy=policy) as db:
    ...     result = db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
    ...     float(db.budget.remaining.epsilon)
    0.5
    """
    return Connection(target, policy, ledger=ledger, analyst=analyst, rng=rng)


class Connection:
    """A wrapped database under a privacy policy, with a persistent budget."""

    def __init__(self, target: Any, policy: Any, *, ledger: Any = None, analyst: str | None = None,
                 rng: Any = None):
        self._engine = Engine.open(target)
        try:
            if ledger is None and self._engine.path is not None:
                ledger = Path(f"{self._engine.path}.ledger")
            self._ledger = Ledger.open(ledger)
            try:
                self.policy: Policy = self._load_policy(policy)
                self._catalog = self._engine.catalog()
                check_policy(self.policy, self._catalog)
            except BaseException:
                self._ledger.close()
                raise
        except BaseException:
            self._engine.close()
            raise
        self.analyst = analyst
        self._rng = rng

    def _load_policy(self, policy: Any) -> Policy:
        if policy is not None:
            return load_policy(policy)
        stored = self._ledger.stored_policy()
        if stored is None:
            raise PolicyError("no policy was given and none is stored with this database",
                              hint="pass policy='file.policy', or store one with `dpsql init DB --policy P`")
        return load_policy(stored)

    # -- public API ---------------------------------------------------------------------------

    def sql(self, sql: str, epsilon: Any = None, delta: Any = None, *, noise: str | None = None) -> DPResult:
        """Answer ``sql`` with differential privacy, charging its cost to the budget."""
        checked = self._check(sql)
        if isinstance(checked, PublicQuery):
            return self._run_public(checked)
        plan = self._plan(checked, sql, epsilon, delta, noise)
        bounded_sql = rewrite_plan(plan)
        keys = self._domain(checked)
        cost = Spend(plan.epsilon, plan.delta)
        entry = self._ledger.charge(cost, self._total(), sql=parse_query(sql).sql(dialect="duckdb"),
                                    options=self._options(plan), analyst=self.analyst)
        # The charge is committed: from here on, private data is read.
        try:
            salt = {"salt": self._ledger.salt().hex()} if "$salt" in bounded_sql else None
            exact = self._engine.fetch(bounded_sql, salt)
            release = release_measures(plan, keys, exact, self._rng)
            all_rows = released_rows(plan, release)
            kept = _post_process(plan.query, all_rows)
            rows = [all_rows[i] for i in kept]
        except Exception:  # whatever failed, the analyst learns nothing from how
            raise QueryFailed("the query failed while running; its cost was charged and no "
                              "answer was released") from None
        self._ledger.record_answer(entry, json.dumps(rows, default=str))

        def widths(alpha: float) -> dict[str, list[float]]:
            cells = half_widths(plan, release, alpha)
            return {name: [values[i] for i in kept] for name, values in cells.items()}

        return DPResult([c.name for c in plan.outputs], rows, cost, widths=widths)

    def explain(self, sql: str, epsilon: Any = None, delta: Any = None, *, noise: str | None = None) -> str:
        """What ``sql`` would run and cost: bounded SQL, sensitivities, noise; reads no data."""
        checked = self._check(sql)
        if isinstance(checked, PublicQuery):
            return f"public tables only: runs exactly and costs nothing\n\n{checked.sql}"
        plan = self._plan(checked, sql, epsilon, delta, noise)
        return explain_plan(plan, rewrite_plan(plan), self.budget)

    @property
    def budget(self) -> Budget:
        """Total, spent and remaining budget."""
        return Budget(total=self._total(), spent=self._ledger.spent())

    def ledger(self):
        """Past charges as a DataFrame (time, analyst, SQL, options, cost, answer)."""
        return self._ledger.entries()

    def tables(self) -> list[str]:
        """The tables the policy lets an analyst query."""
        return [t.name for t in (*self.policy.private_tables, *self.policy.public_tables)]

    def columns(self, table: str) -> dict[str, str]:
        """Column name -> DuckDB type of a declared table (schema only, never data)."""
        declaration = self.policy.table(table)
        if declaration is None:
            raise UnsupportedQuery(f"unknown table {table}", hint=f"the tables are: {', '.join(self.tables())}")
        return dict(self._catalog[table_key_of(declaration.name)])

    def policy_text(self) -> str:
        """The policy in dpsql's policy language."""
        return policy_to_text(self.policy)

    def store_policy(self) -> None:
        """Keep this connection's policy with its ledger, so later connects need none."""
        self._ledger.store_policy(self.policy_text())

    def close(self) -> None:
        """Close the database and the ledger."""
        self._ledger.close()
        self._engine.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- stages -------------------------------------------------------------------------------

    def _check(self, sql: str) -> PrivateQuery | PublicQuery:
        return check_query(parse_query(sql), sql, self.policy, self._catalog)

    def _plan(self, query: PrivateQuery, sql: str, epsilon: Any, delta: Any, noise: str | None) -> Plan:
        return analyse_query(query, self.policy, self._options_for(epsilon, delta, noise), sql)

    def _options_for(self, epsilon: Any, delta: Any, noise: str | None) -> PrivacyOptions:
        if epsilon is None:
            if self.policy.query_epsilon is None:
                raise InvalidParameter("no epsilon given and the policy sets no QUERY EPSILON",
                                       hint="pass epsilon=0.1, or add `QUERY EPSILON 0.1;` to the policy")
            epsilon = self.policy.query_epsilon
        epsilon = exact_parameter(epsilon, "epsilon")
        if epsilon <= 0:
            raise InvalidParameter(f"epsilon must be greater than 0, got {float(epsilon)}",
                                   hint="pass a positive epsilon such as 0.1")
        delta = self.policy.query_delta if delta is None else exact_parameter(delta, "delta")
        if not 0 <= delta < 1:
            raise InvalidParameter(f"delta must be at least 0 and below 1, got {float(delta)}",
                                   hint="pass a small delta such as 1e-7, or 0")
        if noise is not None and noise not in NOISE_FAMILIES:
            raise InvalidParameter(f"unknown noise {noise!r}", hint="use 'laplace' or 'gaussian'")
        if noise == "gaussian" and delta == 0:
            raise InvalidParameter("Gaussian noise needs delta > 0", hint="pass delta=1e-7 as well")
        family = noise or ("gaussian" if self.policy.noise == "gaussian" and delta > 0 else "laplace")
        return PrivacyOptions(epsilon=epsilon, delta=delta if family == "gaussian" else Fraction(0), noise=family)

    def _total(self) -> Spend:
        return Spend(self.policy.budget_epsilon, self.policy.budget_delta)

    def _options(self, plan: Plan) -> dict:
        return {"epsilon": plan.epsilon, "delta": plan.delta,
                "noise": sorted({m.noise for m in plan.measures}), "neighbours": plan.neighbours}

    def _domain(self, query: PrivateQuery) -> list[tuple]:
        """Every released key: the product of the public key domains (public data only)."""
        if not query.keys:
            return [()]
        domains = []
        for key in query.keys:
            values = [row[0] for row in self._engine.fetch(domain_sql(key, query.column_type(key.column)))]
            domains.append(values)
        return list(itertools.product(*domains))

    def _run_public(self, query: PublicQuery) -> DPResult:
        frame = self._engine.fetch_df(query.sql)
        rows = list(frame.itertuples(index=False, name=None))
        return DPResult(list(frame.columns), rows, Spend.zero(), exact=True)


def table_key_of(name: str) -> str:
    """Catalog key of a declared table name (``main.`` dropped, lower-cased)."""
    parts = name.lower().split(".")
    return ".".join(parts[1:]) if len(parts) == 2 and parts[0] == "main" else ".".join(parts)


def exact_parameter(value: Any, name: str) -> Fraction:
    """A caller's privacy parameter as an exact Fraction: finite numbers only.

    Floats are read by their shortest decimal form, so 0.1 means exactly 1/10.

    >>> exact_parameter(0.1, "epsilon")
    Fraction(1, 10)
    >>> exact_parameter(float("nan"), "epsilon")
    Traceback (most recent call last):
    dpsql.errors.InvalidParameter: epsilon must be a finite number, got nan. Hint: pass a number such as 0.5.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal, str)):
        raise InvalidParameter(f"{name} must be a number, got {type(value).__name__}",
                               hint="pass a number such as 0.5")
    try:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError
            return Fraction(repr(value))
        result = Fraction(value)
    except (ValueError, ArithmeticError):
        raise InvalidParameter(f"{name} must be a finite number, got {value!r}",
                               hint="pass a number such as 0.5") from None
    return result


def _post_process(query: PrivateQuery, rows: list[tuple]) -> list[int]:
    """Indices of the rows ORDER BY / LIMIT / OFFSET keep, in order (post-processing only)."""
    order = list(range(len(rows)))
    for item in reversed(query.order):  # stable sorts, last key first
        order.sort(key=lambda i: _sort_key(rows[i][item.output]), reverse=item.descending)
    end = None if query.limit is None else query.offset + query.limit
    return order[query.offset:end]


def _sort_key(value):
    return (value is None, value)
