"""``SELECT * FROM pmw('SELECT COUNT(*) FROM t WHERE ...', ..., table = 't', columns = 'a, b', ...)``:
online private multiplicative weights (``dpsql.calls.pmw``) in SQL, for the shell, ``dpsql query`` and psql.

The first call with a given table, columns, epsilon, max_updates and threshold opens a session
(``db.pmw``), charged once, up front, as the Python method is; it then answers the call's queries
in order. A later call with the same options, by the same analyst on the same connection (one
server process, or one shell session), continues that session: its queries are answered by the
same sparse vector and the same synthetic histogram, at no further cost. After the session's
``max_updates`` measurements, its remaining queries are answered NULL and a note says so; a
session lives as long as the connection (a server restart, or another shell, opens a new one,
charged again).
"""

from __future__ import annotations

import threading
from fractions import Fraction
from typing import Any

from dpsql.answer.result import DPResult, QueryCost
from dpsql.calls.mechanism import Mechanism
from dpsql.calls.pmw import plan_pmw
from dpsql.calls.workload import check_workload
from dpsql.errors import BudgetExceeded, DPError, InvalidParameter
from dpsql.query.context import MechanismContext
from dpsql.query.options import privacy_options

OPTIONS = ("table", "columns", "epsilon", "max_updates", "threshold")
"""The call's options: the session's, as ``db.pmw`` takes them (``columns`` comma-separated)."""

_LOCK = threading.Lock()


def _session_options(options: dict[str, Any]) -> tuple[str, list[str], dict[str, Any]]:
    table, columns = options.get("table"), options.get("columns")
    if not isinstance(table, str) or not isinstance(columns, str) or not columns.strip():
        raise InvalidParameter("pmw() needs the session's table and its KEYS columns",
                               hint="write SELECT * FROM pmw('SELECT COUNT(*) FROM t WHERE ...', table = 't', "
                                    "columns = 'a, b', epsilon = 1, max_updates = 10, threshold = 20)")
    names = [c.strip() for c in columns.split(",")]
    return table, names, {"epsilon": options.get("epsilon"), "max_updates": options.get("max_updates", 10),
                          "threshold": options.get("threshold")}


def _session_key(context: MechanismContext, table: str, columns: list[str], settings: dict[str, Any]) -> tuple:
    """Which open session a call continues: the analyst's, with the same table, columns and settings."""
    return (context.analyst, table.lower(), tuple(c.lower() for c in columns),
            *(str(Fraction(v)) if isinstance(v, (int, Fraction)) else repr(v) for v in settings.values()))


def _answer(connection: Any, queries: list[str], options: dict[str, Any]) -> DPResult:
    table, columns, settings = _session_options(options)
    context = connection.mechanism_context()
    key = _session_key(context, table, columns, settings)
    for position, text in enumerate(queries, 1):  # every query checked before a session is charged
        try:
            check_workload([text], context.policy, context.catalog)
        except DPError as error:
            error.message = error.message.replace("query 1 of the workload", f"query {position} of the call")
            error.args = (str(error._render()),)
            raise
    with _LOCK:
        sessions = context.pmw_sessions
        session = sessions.get(key)
        opened = session is None
        if opened:
            session = connection.pmw(table, columns, settings["epsilon"], max_updates=settings["max_updates"],
                                     threshold=settings["threshold"])
            sessions[key] = session
        rows: list[tuple] = []
        halves: list[DPResult | None] = []
        notes: list[str] = []
        for position, text in enumerate(queries, 1):
            try:
                answer = session.answer(text)
            except BudgetExceeded:  # the session's updates are spent: it answers no more
                if not notes:
                    notes.append(f"the session has made all its updates ({session.plan.max_updates}): from query "
                                 f"{position} on, nothing is answered (a new session is charged again)")
                rows.append((position, text, None, None))
                halves.append(None)
                continue
            value, measured = answer.fetchall()[0]
            rows.append((position, text, value, measured))
            halves.append(answer)
    cost = session.plan.cost
    charged = context.spender.charged(cost) if opened \
        else QueryCost(Fraction(0), Fraction(0), Fraction(0))
    notes.append("a new PMW session, charged once for all its queries" if opened else
                 f"the open PMW session answered these for free ({_updates(session.updates_left)} left)")

    def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        nan = (float("nan"),) * 3
        return {"answer": [nan if answer is None else answer._cells(alpha)["answer"][0] for answer in halves]}

    return DPResult(["n", "query", "answer", "measured"], rows, charged, intervals=intervals,
                    types=["INTEGER", "VARCHAR", "DOUBLE", "BOOLEAN"], notes=notes, budget=context.spender.snapshot())


def _updates(count: int) -> str:
    return "1 update" if count == 1 else f"{count} updates"


def _explain(connection: Any, queries: list[str], options: dict[str, Any]) -> str:
    table, columns, settings = _session_options(options)
    context = connection.mechanism_context()
    epsilon = privacy_options(context.policy, settings["epsilon"], Fraction(0), "laplace").epsilon
    plan = plan_pmw(epsilon, settings["max_updates"], settings["threshold"])
    open_now = _session_key(context, table, columns, settings) in context.pmw_sessions
    return "\n".join([
        f"online private multiplicative weights (Hardt & Rothblum 2010) over {table} ({', '.join(columns)}): "
        f"{len(queries)} queries answered in order, from a synthetic histogram measured when the sparse vector "
        f"finds its error above {float(plan.threshold):g} rows, at most {plan.max_updates} times",
        f"epsilon {float(plan.epsilon):g}: {float(plan.total_epsilon):g} for the noisy total, "
        f"{float(plan.sparse_epsilon):g} for the sparse vector, {float(plan.measure_epsilon):g} for the measurements",
        "a session is open: these queries cost nothing more" if open_now else
        f"no session is open: this call opens one, charged epsilon {float(plan.epsilon):g} once"])


MECHANISM = Mechanism(_answer, _explain, OPTIONS)
"""What ``SELECT * FROM pmw(...)`` calls (listed in ``dpsql.calls.registry.MECHANISMS``)."""
