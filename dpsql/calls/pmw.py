"""Online private multiplicative weights (Hardt & Rothblum 2010): ``db.pmw(...)`` answers counting
queries one at a time, from a synthetic histogram that is measured and updated only when the
sparse vector says it is visibly wrong.

``db.pmw(table, columns, epsilon=ε, max_updates=c, threshold=τ)`` plans like a workload
(``dpsql.calls.workload``): the joint domain of the KEYS ``columns`` plus the outside cell, ONE exact
histogram statement prepared by the pipeline, the per-unit reach R. It is charged once, up front,
through the executor: ε in all, split as

* ε_n = ε/10 for the noisy total n̂ (the synthetic histogram starts uniform with mass n̂);
* ε_s = (ε - ε_n)/2 for one AboveThreshold (``dpsql.mechanisms.sparse_vector``, Lyu, Su, Li 2017
  Alg. 1: threshold noise Δ/ε₁, query noise 2cΔ/ε₂, at most c positives) over the stream of
  errors |x_q - a_q|, a_q the synthetic answer (public) and x_q the exact one: one unit moves it by
  at most Δ_q (``dpsql.mechanisms.mwem``'s sensitivity of the query), which ``test`` is given;
* ε_m = (ε - ε_n)/2 for the at most c measurements, each x_q + discrete Laplace(c·Δ_q/ε_m).

By basic composition (the queries may be chosen adaptively: AboveThreshold's analysis allows it,
and each measurement's cost is fixed in advance) the session is ε-DP; its zCDP cost is the sum of
the parts' ε²/2. A query reported above is measured, its measurement is the answer, and the
histogram is updated by multiplicative weights (post-processing); a query below is answered from
the synthetic histogram, with the bound the test gives: reported below means
|x_q - a_q| < τ + Δ_q·(ρ - ν), so with probability 1 - α the error is below
τ + Δ_q·(h_ρ + h_ν), the half-widths of the threshold's and the query's noise at α/2 each.
After c updates the sparse vector refuses every further query (``BudgetExceeded``): a new
session is charged again. Answers are not kept for free repeats (the session is one release).

The exact histogram is held by the session object, in the curator's Python process (this is a
connection; ``dpsql.calls.pmw_call`` gives it a SQL form for the shell and the server).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.analysis.analyse import SAMPLER_LIMITS
from dpsql.answer.result import DPResult, QueryCost
from dpsql.budget.accounting import Spend
from dpsql.calls.workload import check_workload, coefficient_vectors, read_columns
from dpsql.calls.workload_run import WorkloadPlan, exact_histogram, plan_workload
from dpsql.errors import BudgetExceeded, DPError, InvalidParameter, QueryFailed, UnsupportedQuery
from dpsql.mechanisms import noise
from dpsql.mechanisms.mwem import MAX_PASSES, SCORE_GRID, feasible_range, multiplicative_weights, query_sensitivities
from dpsql.mechanisms.sparse_vector import RESOLUTION, AboveThreshold
from dpsql.query.context import MechanismContext
from dpsql.query.options import privacy_options
from dpsql.query.spend import Price

TOTAL_SHARE = Fraction(1, 10)
"""The share of ε spent on the noisy total n̂; the rest is halved between the sparse vector and
the measurements."""

FAILED = "the PMW query failed while running; the session's cost was charged and nothing was released"


@dataclass(frozen=True)
class PmwPlan:
    """The session's split of ε (module docstring), fixed before the charge."""

    epsilon: Fraction
    total_epsilon: Fraction
    sparse_epsilon: Fraction
    measure_epsilon: Fraction
    max_updates: int
    threshold: Fraction

    @property
    def cost(self) -> Spend:
        rho = (self.total_epsilon ** 2 + self.sparse_epsilon ** 2 + self.max_updates
               * (self.measure_epsilon / self.max_updates) ** 2) / 2
        return Spend(self.epsilon, Fraction(0), rho)

    def measure_scale(self, sensitivity: Fraction) -> Fraction:
        return self.max_updates * sensitivity / self.measure_epsilon

    def price(self, table: str, columns: list[str]) -> Price:
        """What a session over ``table`` (``columns``) costs, charged once, up front: its one
        histogram statement. Not kept for repeats (the session is one release)."""
        return Price(self.cost, f"PMW {table} ({', '.join(columns)})",
                     {"epsilon": self.epsilon, "max_updates": self.max_updates, "threshold": self.threshold,
                      "mechanism": "pmw"}, statements=1, failure=FAILED)


MAX_UPDATES = 10_000
"""The most measurements a session may make: each keeps its query's vector over the cells."""


def plan_pmw(epsilon: Fraction, max_updates: Any, threshold: Any) -> PmwPlan:
    """The split; refuses parameters it cannot use."""
    if isinstance(max_updates, bool) or not isinstance(max_updates, int) or not 1 <= max_updates <= MAX_UPDATES:
        raise InvalidParameter(f"max_updates must be a whole number from 1 to {MAX_UPDATES}, got {max_updates!r}",
                               hint="pass max_updates=10: the most measurements the session may make")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, Fraction)) or not threshold > 0 \
            or threshold == float("inf"):
        raise InvalidParameter(f"threshold must be a positive number of rows, got {threshold!r}",
                               hint="pass threshold=50: an error above it triggers a measurement")
    total = epsilon * TOTAL_SHARE
    half = (epsilon - total) / 2
    return PmwPlan(epsilon, total, half, half, max_updates, Fraction(threshold))


class OnlinePMW:
    """A charged PMW session: ``answer(sql)`` answers one counting query (module docstring)."""

    def __init__(self, context: MechanismContext, planned: WorkloadPlan, plan: PmwPlan, table: str,
                 columns: list[str]):
        # Only what answering needs: not the opening call's spender or cancel token, which a
        # later call's view must never charge through (a reviewer's note on the spend refactor).
        self._policy, self._catalog = context.policy, context.catalog
        self._source, self._read_keys = context.source, context.read_keys
        self._planned = planned
        self.plan = plan
        self.table = table
        self.columns = list(columns)
        self._measured: list[tuple[np.ndarray, float]] = []
        self._state: dict[str, Any] = {}

    @property
    def updates_left(self) -> int:
        """How many more measurements (queries reported above) the session may make."""
        return self.plan.max_updates - len(self._measured)

    def _start(self, fetch) -> None:
        """After the charge: the exact histogram, n̂ and the sparse vector's threshold noise."""
        rows = self._read_keys(fetch(self._planned.statement), self._planned.histogram.query.keys)
        exact = exact_histogram(self._planned, rows)
        reach = self._planned.mwem.reach
        source = self._source
        total = max(1, int(exact.sum()) + int(noise.discrete_laplace(reach / self.plan.total_epsilon, 1, source)[0]))
        self._state = {"exact": exact, "total": total,
                       "synthetic": np.full(exact.size, total / exact.size),
                       "sparse": AboveThreshold(self.plan.threshold, 1, self.plan.sparse_epsilon,
                                                self.plan.max_updates, source)}

    def answer(self, sql: str) -> DPResult:
        """One counting query over the session's table and columns (a form ``db.workload`` accepts,
        without GROUP BY): the synthetic answer if the sparse vector finds its error below the
        threshold, else a measurement (and an update). Refused statically like a workload query;
        after ``max_updates`` measurements every query is refused (``BudgetExceeded``)."""
        planned = self._planned
        table, checked = check_workload([sql], self._policy, self._catalog)
        query = checked[0]
        if table.lower() != self.table.lower():
            raise UnsupportedQuery(f"this PMW session answers queries over {self.table}, not {table}",
                                   hint="open a session on that table with db.pmw")
        outside = [c for c in read_columns(checked) if c not in planned.columns]
        if outside:
            raise UnsupportedQuery(f"this PMW session's domain has the columns {', '.join(planned.columns)}; "
                                   f"the query reads {', '.join(outside)}",
                                   hint="open a session over every column the queries read")
        if query.keys:
            raise UnsupportedQuery("a PMW session answers one count at a time, not GROUP BY",
                                   hint="ask for each cell with a WHERE, or use db.workload for marginals")
        workload = coefficient_vectors(checked, list(planned.columns), list(planned.types),
                                       [list(d) for d in planned.domains], [list(v) for v in planned.literals])
        sensitivity = query_sensitivities(workload, planned.mwem.reach, planned.histogram.neighbours)[0]
        sparse: AboveThreshold = self._state["sparse"]
        if sparse.done:
            raise BudgetExceeded(f"this PMW session has made its {self.plan.max_updates} updates and answers "
                                 "no more", hint="open a new session (db.pmw), which is charged again")
        if sensitivity == 0:  # no cell has a coefficient: 0 whatever the data, nothing to test
            return self._result(0.0, False, lambda alpha: 0.0)
        if self.plan.measure_scale(sensitivity) >= SAMPLER_LIMITS["laplace"]:
            raise InvalidParameter("this query's coefficients are too large for the session's epsilon: its "
                                   "measurement's noise would be beyond what the exact samplers draw",
                                   hint="ask with smaller coefficients, or open a session with a larger epsilon")
        try:
            return self._answer(workload, sensitivity)
        except DPError:
            raise
        except Exception:  # after the charge: the analyst learns nothing from how it failed
            raise QueryFailed(FAILED) from None

    def _answer(self, workload, sensitivity: Fraction) -> DPResult:
        state, plan = self._state, self.plan
        vector = workload.vector(0)
        low, high = feasible_range(workload)
        feasible = (float(low[0]), float(high[0]))   # public: >= 0 for a count
        estimate = round(float(workload.answers(state["synthetic"])[0]) * SCORE_GRID) / SCORE_GRID  # public
        truth = int(workload.answers(state["exact"])[0])
        sparse: AboveThreshold = state["sparse"]
        if not sparse.test(abs(Fraction(truth) - Fraction(estimate)), plan.threshold, sensitivity):
            scales = (sparse.threshold_scale, sparse.query_scale)

            def below(alpha: float) -> float:
                steps = sum(noise.discrete_laplace_halfwidth(s, alpha / 2) for s in scales)
                return float(plan.threshold + sensitivity * Fraction(steps, sparse.resolution))
            return self._result(estimate, False, below, feasible)
        scale = plan.measure_scale(sensitivity)
        value = truth + int(noise.discrete_laplace(scale, 1, self._source)[0])
        self._measured.append((vector, float(value)))
        state["synthetic"] = multiplicative_weights(state["synthetic"], self._measured, float(state["total"]),
                                                    MAX_PASSES)
        return self._result(float(value), True, lambda alpha: float(noise.discrete_laplace_halfwidth(scale, alpha)),
                            feasible)

    def _result(self, value: float, measured: bool, half: Any,
                feasible: tuple[float, float] = (-np.inf, np.inf)) -> DPResult:
        """The answer ``value`` ± ``half(alpha)``, both cut to the ``feasible`` range the query's public
        coefficients allow (a count is >= 0): post-processing, and the truth is in that range."""
        low, high = feasible

        def cut(x: float) -> float:
            return float(min(max(x, low), high))

        def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
            width = half(alpha)   # around the released value, before the cut
            return {"answer": [(cut(value - width), cut(value + width), width)]}
        note = ("measured (the synthetic answer was off by more than the threshold); "
                f"{self.updates_left} updates left" if measured else
                "from the synthetic data (the sparse vector found its error below the threshold)")
        charged = QueryCost(Fraction(0), Fraction(0), Fraction(0))  # the session was charged up front
        return DPResult(["answer", "measured"], [(cut(value), measured)], charged,
                        intervals=intervals, types=["DOUBLE", "BOOLEAN"], notes=[note])


def open_pmw(context: MechanismContext, table: str, columns: Any, epsilon: Any, delta: Any, max_updates: Any,
             threshold: Any) -> OnlinePMW:
    """``Connection.pmw``: plan, charge once, fetch the exact histogram (module docstring)."""
    # Pure epsilon-DP: a policy's QUERY DELTA is not this session's default (it left the SQL form,
    # which has no delta option, refused under such a policy: a served attacker's review).
    options = privacy_options(context.policy, epsilon, Fraction(0) if delta is None else delta, None)
    if options.delta != 0:
        raise InvalidParameter("online PMW is pure epsilon-DP (AboveThreshold and discrete Laplace)",
                               hint="leave delta out, or pass delta=0")
    if isinstance(columns, str):
        columns = [columns]
    if not isinstance(table, str) or not columns or not all(isinstance(c, str) for c in columns):
        raise InvalidParameter("pmw needs a table name and a list of its KEYS columns",
                               hint="db.pmw('visits', ['store', 'plan'], epsilon=1, max_updates=10, threshold=50)")
    plan = plan_pmw(options.epsilon, max_updates, threshold)
    listed = ", ".join(f'"{c}"' for c in columns)
    domain_query = f'SELECT {listed}, COUNT(*) FROM "{table}" GROUP BY {listed}'
    planned = plan_workload(context, [domain_query], options.epsilon, None, 1, mwem_noise=False)
    reach = planned.mwem.reach
    scales = [reach / plan.total_epsilon, 2 * plan.max_updates * RESOLUTION / plan.sparse_epsilon]
    if max(scales) >= SAMPLER_LIMITS["laplace"]:
        raise InvalidParameter(f"epsilon {float(plan.epsilon):g} is too small for a session of {plan.max_updates} "
                               "updates: its noise would be beyond what the exact samplers draw",
                               hint="use a larger epsilon or fewer max_updates")
    session = OnlinePMW(context, planned, plan, planned.histogram.query.rule.name, list(planned.columns))
    context.spender.spend(plan.price(session.table, session.columns), session._start)
    return session
