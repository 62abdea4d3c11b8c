"""The connection: a thin façade composing the stages into ``db.sql``, ``db.explain`` and ``db.budget``.

It opens its target (``dpsql.backends.opening``), prepares queries (``dpsql.query.prepare``),
answers them (``dpsql.query.answering``) and hands every mechanism its ``MechanismContext``
(``dpsql.query.context``); all of them spend through one ``Spender`` (``dpsql.query.spend``).

Order matters for privacy (DESIGN.md invariants 1 and 2): every static stage — parse, bind,
check, analyse, rewrite, parameter validation — runs first, touching no private data and
charging nothing; then the ledger is charged in one transaction; only then is private data
read. Any failure after the charge keeps the charge and reaches the analyst as a fixed
message with no data in it.

Accounting (``dpsql.budget.accounting``): the policy's accountant decides, inside the ledger's charge
transaction, whether a query's cost fits the database-wide budget and, for a named analyst,
that analyst's own budget. A query identical to an earlier one (``dpsql.sql.normalise``: same
normalised SQL, same plan options, same policy, same analyst) returns the earlier query's
stored noisy answer at no cost, even after a restart; nothing is drawn for it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpsql.analysis.plan import PrivateQuery, PublicQuery
from dpsql.answer.explain import Explanation
from dpsql.answer.result import Budget, DPResult
from dpsql.backends.deadline import DEFAULT_REQUEST_TIMEOUT, check_timeout
from dpsql.backends.opening import curator_files, default_ledger, open_target, policy_file_of
from dpsql.budget.ledger import Cancellation, PolicyChange
from dpsql.budget.ruling import store_policy
from dpsql.calls.above_threshold import plan_stream, run_stream
from dpsql.calls.registry import call_of, mechanism
from dpsql.curator.dropped import RecordedDrop
from dpsql.curator.estimates import estimate_drops, suggest
from dpsql.curator.progress import elapsed_progress, show_progress
from dpsql.errors import DPError, InternalFailure, InvalidParameter, UnsupportedQuery
from dpsql.policy.language import policy_to_text
from dpsql.policy.model import Policy
from dpsql.query.answering import Answerer
from dpsql.query.context import MechanismContext
from dpsql.query.executor import Executor
from dpsql.query.local import LocalCount, check_reports, reads_local, reports_note
from dpsql.query.local_answering import answer_local, explain_local_count, reports_outside, route
from dpsql.query.prepare import Prepared, Preparer
from dpsql.query.spend import Spender
from dpsql.query.synthetic_answering import answer_synthetic, explain_synthetic, listing_frame, synthetic_query
from dpsql.query.synthetic_tables import SyntheticTables
from dpsql.sql.names import columns_hint, sql_name, table_key
from dpsql.sql.parse import located

__all__ = ["Connection", "connect", "init_policy", "default_ledger"]  # default_ledger: the CLI's, from here


def connect(target: Any = ":memory:", policy: Any = None, *, ledger: Any = None,
            analyst: str | None = None, rng: Any = None, query_timeout: float | None = 30.0,
            memory_limit: str | None = None, eager_bounding: bool = False, persist_copies: bool | str = False,
            progress: bool | None = None, request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
            separate_budget: bool = False) -> "Connection":
    """Open ``target`` under ``policy`` and return a connection that answers with DP.

    ``target``: a DuckDB file path (opened read-only), an open duckdb connection, or a dict of
    table name -> pandas DataFrame. ``policy``: a policy file path, policy text, or a Policy.
    ``ledger``: where the budget ledger lives; by default ``<database file>.ledger`` beside a
    file, in memory otherwise. ``analyst``: who is asking; their charges count against the
    policy's ``BUDGET PER ANALYST`` as well as the total, and ``db.ledger()`` shows them only
    their own entries (``None``, the curator, sees all). ``rng``: a noise source for tests;
    production uses the cryptographically secure default. ``query_timeout``: seconds a query
    may run before it fails (charged, like any run-time failure); ``request_timeout``: the most
    seconds one request of many statements (a stream, a fit) may take, counted before its charge
    as its statements times ``query_timeout`` (one longer is refused, nothing charged; it is
    never stopped by the time it actually took, which one person's rows could tip); ``memory_limit``: DuckDB's
    memory limit for databases dpsql opens (default half the machine's memory).
    ``eager_bounding``: build every private table's bounded copy now, so that no query's time
    includes a scan of a raw private table (otherwise each is built by the first query reading it;
    on Spark always so, so that a connection or a server is ready without reading a row: docs/spark.md).
    ``persist_copies``: keep the bounded copies in a directory beside the ledger
    (``<ledger>.copies``, owner-only), so later connections (CLI calls, server restarts) reuse
    them instead of rebuilding; a copy is rebuilt when its table's data, the policy or the salt
    changed (``dpsql.backends.duckdb.persisted``). A database file with a ledger file only.
    ``"read"``: read the stored copies in place without writing them (many processes share them:
    ``dpsql serve``'s workers); a copy not stored current is built in memory.
    ``progress``: show how long a copy build has run, on standard error, once it passes a
    second (``None``: when standard error is a terminal or a notebook's).
    ``separate_budget``: open a ledger file over tables another ledger file already accounts for,
    as a second budget on purpose (a warning says so). Without it that is refused
    (``dpsql.SecondBudget``, ``dpsql.budget.registry``): one dataset, one budget.

    >>> import pandas as pd
    >>> frame = pd.DataFrame({"uid": [1, 1, 2], "x": [1.0, 2.0, 3.0]})
    >>> policy = "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, x BOUNDS 0 TO 5);"
    >>> with connect({"t": frame}, policy=policy) as db:
    ...     result = db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
    ...     float(db.budget.remaining.epsilon)
    0.5
    """
    return Connection(target, policy, ledger=ledger, analyst=analyst, rng=rng,
                      query_timeout=query_timeout, memory_limit=memory_limit, eager_bounding=eager_bounding,
                      persist_copies=persist_copies, progress=progress, request_timeout=request_timeout,
                      separate_budget=separate_budget)


def init_policy(target: Any, policy: Any, *, ledger: Any = None, replace: bool = False,
                memory_limit: str | None = None, estimate_epsilon: Any = None,
                separate_budget: bool = False) -> PolicyChange | None:
    """The curator's ``dpsql init``: check ``policy`` against ``target`` and store it with the
    ledger, so that it rules every later connection; return the recorded change, or ``None``
    when that very policy was stored already.

    A different stored policy is replaced only with ``replace=True``: what was spent, the
    salt and the ledger's entries stay, and the ledger records the change (time, old and new
    text; ``Connection.policy_changes()``).

    ``estimate_epsilon``: also record, for each private table with none yet for its limit, a
    DP estimate of the share of its rows MAX ROWS PER UNIT drops, at this epsilon per table,
    charged to the budget (``Connection.estimate_limits``; ``dpsql init`` does so by default).

    ``separate_budget``: store it in a ledger file over tables another ledger already accounts
    for, as a second budget on purpose (``connect``).

    >>> import pandas as pd
    >>> frame = pd.DataFrame({"uid": [1, 2], "x": [1.0, 3.0]})
    >>> change = init_policy({"t": frame}, "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);")
    >>> change.old is None, change.new.splitlines()[0]
    (True, 'BUDGET EPSILON 1;')
    """
    # Opened as replacing whatever is stored, so a refusal below is init's own, naming --replace.
    with Connection(target, policy, ledger=ledger, memory_limit=memory_limit, separate_budget=separate_budget,
                    _replacing=True) as db:
        change = db.store_policy(replace=replace)
    if estimate_epsilon is not None:
        with Connection(target, None, ledger=ledger, memory_limit=memory_limit) as db:  # the stored policy rules
            db.estimate_limits(estimate_epsilon, only_missing=True)
    return change


def _no_accuracy_goal(what: str, max_error: Any, expected_rows: Any) -> None:
    """``max_error`` and ``expected_rows`` judge one query's outputs: refused with anything else."""
    if max_error is not None or expected_rows is not None:
        raise InvalidParameter(f"max_error and expected_rows apply to a query's outputs, not to {what}",
                               hint="leave max_error and expected_rows out")


def _reported_as_dperror(method):
    """Analyst input meets ``DPError``s only: any other exception escaping ``method`` is a bug
    in dpsql, raised as ``InternalFailure`` naming only its kind (never its message, which
    might hold anything). Private data is read only inside the charged block, whose failures
    are already ``QueryFailed``."""
    @functools.wraps(method)
    def reported(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except DPError as error:  # the boundary holding the SQL text: refusals get their position here
            sql = args[0] if args and isinstance(args[0], str) else kwargs.get("sql")
            raise located(error, sql) if isinstance(sql, str) else error
        except Exception as error:
            raise InternalFailure(f"dpsql failed on this query with an internal error ({type(error).__name__}); "
                                  "nothing was released",
                                  hint="this is a bug in dpsql: please report the query; the budget shows "
                                       "whether anything was charged") from None
    return reported


class Connection:
    """A wrapped database under a privacy policy, with a persistent budget."""

    def __init__(self, target: Any, policy: Any, *, ledger: Any = None, analyst: str | None = None,
                 rng: Any = None, query_timeout: float | None = 30.0, memory_limit: str | None = None,
                 eager_bounding: bool = False, persist_copies: bool | str = False, progress: bool | None = None,
                 request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT, separate_budget: bool = False,
                 _replacing: bool = False):
        if analyst is not None and (not isinstance(analyst, str) or not analyst.strip()):
            raise InvalidParameter(f"analyst must be a non-empty name, got {analyst!r}",
                                   hint="pass analyst='alice', or leave it out",
                                   hints={"cli": "give --analyst alice, or leave it out"})
        request_timeout = check_timeout(request_timeout, "request_timeout")
        opened = open_target(target, policy, ledger, query_timeout=query_timeout, memory_limit=memory_limit,
                             persist_copies=persist_copies, separate_budget=separate_budget, replacing=_replacing,
                             eager_bounding=eager_bounding,
                             progress=elapsed_progress if show_progress(progress) else None)
        self._engine, self._ledger, self._catalog = opened.engine, opened.ledger, opened.catalog
        self.policy: Policy = opened.policy
        self.dataset = opened.claim.dataset
        """What the ledger accounts for: the private tables (and units) of every policy it served."""
        self.second_budget = opened.claim.second_budget
        """Set when the ledger was opened as a second budget on purpose (``separate_budget``): says so."""
        self._executor = Executor(self._ledger, self._engine, request_timeout)
        self.analyst = analyst
        self._rng = rng
        self._pmw_sessions: dict = {}
        """The open PMW sessions of ``SELECT * FROM pmw(...)`` (``dpsql.calls.pmw_call``), one per analyst and
        options: shared by every view of this connection (``acting_for``), as the server's calls are."""
        self._synthetic = SyntheticTables(self._ledger.path, self.tables())
        """Every analyst's synthetic tables (``dpsql.query.synthetic_tables``), kept beside the ledger: shared
        by every view, each view reaching only its own analyst's."""
        rules = self.policy
        self._policy_text = policy_to_text(rules)
        self._has_local = any(rule.local is not None for table in rules.private_tables for rule in table.columns)
        self._spender = Spender.of_policy(self._ledger, self._executor, rules, self._policy_text, opened.stored,
                                          _replacing).acting_for(analyst)
        self._policy_file = policy_file_of(policy)
        self._answerer = Answerer(rules, self._catalog, self._engine, self._executor)
        names = frozenset(c for columns in self._catalog.values() for c in columns)
        self._preparer = Preparer(rules, self._catalog, self._engine, self._answerer.describe, names,
                                  self._policy_text)
        try:
            check_reports(rules, lambda table, rule: reports_outside(self._answerer, self._prepare, table, rule))
        except BaseException:
            self.close()
            raise

    # -- public API ---------------------------------------------------------------------------

    @_reported_as_dperror
    def sql(self, sql: str, epsilon: Any = None, delta: Any = None, *, noise: str | None = None,
            weights: dict | None = None, report_bias: Any = None, max_error: Any = None,
            expected_rows: Any = None, unit_bounds_share: Any = None) -> DPResult:
        """Answer ``sql`` with differential privacy, charging its cost to the budget.

        ``weights`` splits epsilon between the query's aggregates ({output name or aggregate as
        written: relative weight}); equal by default. ``report_bias``: True, or a share of
        epsilon such as 0.05, spends that share on ``res.bounding``, a noisy estimate of what
        the contribution limits dropped and clamped (``dpsql.query.bias``); False turns off the
        policy's ``REPORT BIAS SHARE``. The query's total cost is unchanged.

        ``unit_bounds_share``: a share of epsilon, such as 0.2, spent first on choosing each
        aggregated column's bound per unit privately (``dpsql.query.unit_bounds``); the query
        runs at the rest, and its notes state the bounds drawn. The total cost is unchanged.

        ``max_error``: refuse the query (``TooInaccurate``), before anything is charged, when an
        output's predicted 95% ± (``explain`` shows it) is wider; a ratio such as AVG is judged at
        ``expected_rows``, the fewest values expected in a group (``dpsql.query.prediction``).

        ``SELECT * FROM above_threshold('SELECT ...', ..., threshold = 100)`` (and the other
        mechanisms of ``dpsql.calls.registry``) calls that mechanism, as its method would.
        """
        call = call_of(sql, epsilon, delta, noise, weights, report_bias)
        if unit_bounds_share is not None and call is not None:
            raise UnsupportedQuery(f"unit_bounds_share applies to a query, not to {call.name}()",
                                   hint="leave unit_bounds_share out")
        if call is not None:
            _no_accuracy_goal(call.name, max_error, expected_rows)
            return mechanism(call.name).answer(self, call.queries, call.options)
        synthetic = self._route_synthetic(sql)
        if synthetic is not None:  # the analyst's own synthetic tables: exact and free
            cancel = self._spender.cancel
            cancelled = None if cancel is None else (lambda: cancel.requested)
            return answer_synthetic(synthetic, self._engine.timeout, cancelled)
        local, written = self._route_local(sql)
        if local is not None and unit_bounds_share is not None:
            raise UnsupportedQuery("unit_bounds_share chooses bounds for aggregated bounded columns, and a count of "
                                   "randomized-response reports has none", hint="leave unit_bounds_share out")
        if local is not None:  # a count over a randomized-response column (dpsql.query.local)
            _no_accuracy_goal("a count of randomized-response reports", max_error, expected_rows)
            return answer_local(self._answerer, self.mechanism_context(), local, epsilon, delta, noise, written)
        prepared = self._prepare(sql, epsilon, delta, noise, weights, report_bias, unit_bounds_share)
        result = self._answerer.sql(self.mechanism_context(), prepared, max_error, expected_rows)
        reads = reads_local(prepared.tree, prepared.checked, self.policy)
        if reads:
            result.notes.append(reports_note(reads))
        return result

    @_reported_as_dperror
    def explain(self, sql: str, epsilon: Any = None, delta: Any = None, *, noise: str | None = None,
                weights: dict | None = None, report_bias: Any = None, max_error: Any = None,
                expected_rows: Any = None, unit_bounds_share: Any = None) -> str:
        """What ``sql`` would run and cost: bounded SQL, sensitivities, noise, each output's
        expected ± (and what ``max_error`` would do), the contribution limits and any bias report;
        reads no data. The text's ``refused`` is the refusal running it would meet (over budget,
        or wider than ``max_error``), else ``None``."""
        call = call_of(sql, epsilon, delta, noise, weights, report_bias)
        if unit_bounds_share is not None and call is not None:
            raise UnsupportedQuery(f"unit_bounds_share applies to a query, not to {call.name}()",
                                   hint="leave unit_bounds_share out")
        if call is not None:
            _no_accuracy_goal(call.name, max_error, expected_rows)
            explain = mechanism(call.name).explain
            if explain is None:
                raise UnsupportedQuery(f"{call.name}() has no explanation", hint=f"see help for {call.name}")
            text = explain(self, call.queries, call.options)
            return text if isinstance(text, Explanation) else Explanation(text)
        synthetic = self._route_synthetic(sql)
        if synthetic is not None:
            return explain_synthetic(synthetic)
        local, written = self._route_local(sql)
        if local is not None and unit_bounds_share is not None:
            raise UnsupportedQuery("unit_bounds_share chooses bounds for aggregated bounded columns, and a count of "
                                   "randomized-response reports has none", hint="leave unit_bounds_share out")
        context = self.mechanism_context()
        if local is not None:  # a count over a randomized-response column (dpsql.query.local)
            return explain_local_count(self._answerer, context, local, epsilon, delta, noise, written)
        prepared = self._prepare(sql, epsilon, delta, noise, weights, report_bias, unit_bounds_share)
        text = self._answerer.explain(context, prepared, report_bias, max_error, expected_rows)
        reads = reads_local(prepared.tree, prepared.checked, self.policy)
        if reads:
            return Explanation(f"{text}\n\nnote: {reports_note(reads)}", refused=getattr(text, "refused", None))
        return text

    @_reported_as_dperror
    def above_threshold(self, queries: Sequence[str], threshold: Any, epsilon: Any = None, max_above: int = 1, *,
                        values: bool = False, value_epsilon: Any = None) -> DPResult:
        """Which of ``queries`` (each one COUNT or SUM, no GROUP BY) exceed ``threshold``, by the
        sparse vector technique (``dpsql.calls.above_threshold``): ``epsilon`` (default: the policy's
        QUERY EPSILON) is charged once for the whole stream, which stops after ``max_above``
        queries were reported above. Rows: (n, query, above), ``above`` NULL for the queries not
        run after the stream stopped. ``values=True`` also releases the value of each query
        above, for ``value_epsilon`` more (default: ``epsilon``).

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": range(100), "x": [i % 7 for i in range(100)]})
        >>> policy = "BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     res = db.above_threshold(["SELECT COUNT(*) FROM t WHERE x = 9",
        ...                               "SELECT COUNT(*) FROM t"], threshold=50, epsilon=1)
        ...     res.columns, len(res), float(db.budget.spent.epsilon)
        (['n', 'query', 'above'], 2, 1.0)
        """
        context = self.mechanism_context()
        return run_stream(context, plan_stream(context, queries, threshold, epsilon, max_above, values, value_epsilon))

    @_reported_as_dperror
    def workload(self, queries: Sequence[str], epsilon: Any = None, delta: Any = None, *,
                 rounds: int | None = None) -> DPResult:
        """Answer a list of counting queries over one private table together, by MWEM
        (``dpsql.calls.workload``, ``dpsql.mechanisms.mwem``): cheaper per query than one release each
        once there are many. Charged once, like a query; the same workload again is free.

        Returns one row per scalar answer: ``query`` (its number, from 1), ``cell`` (a GROUP BY
        cell as text, NULL when ungrouped), ``answer`` and ``measured``; ``accuracy()`` bounds
        every answer (a measured one by its noise, the others by a noisy check of their largest
        error, all at once); counts are cut at 0. ``delta`` > 0: discrete Gaussian measurements,
        accounted in zCDP. ``rounds``: MWEM's T (default: ``dpsql.mechanisms.mwem.default_rounds``).

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": range(8), "a": [1, 1, 2, 2, 2, 3, 3, 3]})
        >>> policy = "BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, a KEYS (1, 2, 3));"
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     result = db.workload(["SELECT COUNT(*) FROM t WHERE a >= 2",
        ...                           "SELECT a, COUNT(*) FROM t GROUP BY a"], epsilon=1)
        ...     len(result.fetchall()), float(db.budget.spent.epsilon)
        (4, 1.0)
        """
        from dpsql.calls.workload_run import answer_workload

        return answer_workload(self.mechanism_context(), queries, epsilon, delta, rounds)

    @_reported_as_dperror
    def pmw(self, table: str, columns: Sequence[str], epsilon: Any = None, *, max_updates: int = 10,
            threshold: Any = None, delta: Any = None):
        """An online private multiplicative weights session (``dpsql.calls.pmw``) over ``columns`` (with KEYS)
        of one private table: ``session.answer(sql)`` answers counting queries one at a time, from
        a synthetic histogram measured and updated only when the sparse vector finds its error above
        ``threshold`` rows. ``epsilon`` is charged once, now, for the whole session, which refuses
        further queries after ``max_updates`` measurements.

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": range(8), "a": [1, 1, 2, 2, 2, 3, 3, 3]})
        >>> policy = "BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, a KEYS (1, 2, 3));"
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     session = db.pmw("t", ["a"], epsilon=1, max_updates=2, threshold=3)
        ...     answer = session.answer("SELECT COUNT(*) FROM t WHERE a = 2")
        ...     answer.columns, float(db.budget.spent.epsilon)
        (['answer', 'measured'], 1.0)
        """
        from dpsql.calls.pmw import open_pmw

        return open_pmw(self.mechanism_context(), table, columns, epsilon, delta, max_updates, threshold)

    @_reported_as_dperror
    def synthesize(self, table: str, columns: Sequence[str], epsilon: Any = None, delta: Any = None, *,
                   method: str = "aim", rows: int | None = None, name: str | None = None):
        """A synthetic copy of ``columns`` of private ``table`` (``dpsql.calls.synthesize``): AIM or MST
        over noisy marginals of the bounded copy, charged once, (epsilon, delta) with delta > 0 as zCDP.
        Columns with KEYS are categorical, numeric ones with BOUNDS are binned (the bins come from the
        policy alone). Returns a ``SyntheticRelease``: ``.table`` the rows (a DataFrame), ``.measured``
        what was measured at which rho, ``.bins`` each column's cells. ``rows``: how many rows to draw
        (default: a noisy count of the table's); ``name``: what the table is called (default
        ``<table>_synthetic``), kept for this analyst, who queries it free (``FROM name``). Needs
        ``pip install 'dpsql[synth]'``.
        """
        from dpsql.calls.synthesize import answer_synthesis

        release = answer_synthesis(self.mechanism_context(), table, columns, epsilon, delta, method, rows, name,
                                   lambda chosen: self._synthetic.check_name(self.analyst, chosen))
        return self._synthetic.keep(release)  # its owner's from now on, queried free (dpsql.query.synthetic_tables)

    def fit(self, sql: str, target: str, model: str = "linear", epsilon: Any = None, delta: Any = None, *,
            steps: Any = None, clip: Any = None, learning_rate: Any = None, method: str = "auto"):
        """A ``model`` ('linear' or 'logistic') of ``target`` on the other columns of the rows ``sql``
        selects, charged once, (epsilon, delta) with delta > 0 (default: the policy's QUERY EPSILON
        and QUERY DELTA). A linear model is fitted by least squares on noisy sufficient statistics
        in one pass (``dpsql.calls.fit_sufficient``, ``method='sufficient'``), unless descent is
        asked for; a logistic one (or ``method='gradient'``, or ``steps``, ``clip`` or
        ``learning_rate``) by noisy gradient descent with each unit's gradient clipped to ``clip``
        (``dpsql.calls.fit``, 30 steps and clip 1 by default). ``TABLESAMPLE POISSON (p PERCENT)``
        in ``sql`` makes each step read a fresh sample of units (DP-SGD). Returns a ``FittedModel``: ``coefficients``,
        ``intercept``, ``predict(frame)``, ``cost`` and ``result`` (the release as a table).

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": range(400), "x": [i % 10 for i in range(400)]})
        >>> frame["y"] = 2 * frame["x"] + 1
        >>> policy = ("BUDGET EPSILON 5 DELTA 1e-5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, "
        ...           "x BOUNDS 0 TO 10, y BOUNDS 0 TO 25);")
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     model = db.fit("SELECT x, y FROM t", target="y", epsilon=2, delta=1e-6)
        ...     sorted(model.coefficients), float(db.budget.spent.epsilon)
        (['x'], 2.0)
        """
        from dpsql.calls.fit_model import plan_model, run_model

        context = self.mechanism_context()
        return run_model(context, plan_model(context, sql, target, model, epsilon, delta, steps, clip, learning_rate,
                                             method))

    def suggest_bounds(self, table: str, epsilon: Any = None, columns: Any = None, *,
                       group_by: str | None = None) -> dict:
        """DP suggestions of a private table's contribution bounds, charged like a query.

        Returns ``{"max_rows_per_unit": k, "max_groups_per_unit": None, "bounds": {column:
        (lo, hi) or None}, "unit_bounds": {column: (L, U) or None}, ...}``: k the DP 95th percentile
        of rows per unit; each column's row BOUNDS DP quantiles of its rows (each unit weighing one)
        and its BOUNDS PER UNIT DP quantiles of each unit's totals of its clamped rows, aimed at the
        1st and 99th percentiles as far as the epsilon allows, ``coverage`` stating the share of
        units each may leave beyond it (95% confidence; ``dpsql.curator.suggest_quantiles``; None
        when not even 75% can be vouched for, with a warning). ``columns``: the numeric columns to
        bound (default: the measure-like ones, not identifiers, calendar parts or KEYS columns;
        ``skipped`` says which were left out and why). The whole ``epsilon`` is charged to the
        ledger first (budget checks and refusal as for any query); nothing is stored for a free
        repeat. ``group_by``: a column whose distinct values per unit bound MAX GROUPS PER UNIT the
        same way (its DP 95th percentile). ``units`` is a DP count of units (± ``units_halfwidth``),
        ``selection`` partition selection's threshold under the suggested limits, ``warnings``
        what the epsilon was too small for.

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": [1, 1, 2, 3], "x": [1.0, 2.0, 3.0, 4.0]})
        >>> policy = "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     print(*sorted(db.suggest_bounds("t", epsilon=0.5)))  # doctest: +NORMALIZE_WHITESPACE
        ...     float(db.budget.remaining.epsilon)
        bounds coverage epsilon_split max_groups_per_unit max_rows_per_unit max_rows_per_unit_rank_error
        notes selection skipped unit_bounds units units_halfwidth warnings
        0.5
        """
        return suggest(self.mechanism_context(), table, epsilon, columns, group_by)

    def estimate_limits(self, epsilon: Any = None, tables: Any = None, *,
                        only_missing: bool = False) -> dict[str, RecordedDrop]:
        """The curator's DP estimate of the share of each private table's rows its MAX ROWS PER
        UNIT drops (``dpsql.curator.dropped``), recorded in the ledger: every later answer reading the
        table shows it in its limits line, at no further cost. ``epsilon`` per table (default:
        the policy's QUERY EPSILON), charged before anything is read, like a query (budget
        refusal included); ``tables``: names (default: every unit-level private table);
        ``only_missing``: skip a table that has an estimate for its limit already.

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": [1, 1, 1, 2], "x": [1.0, 2.0, 3.0, 4.0]})
        >>> policy = "BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2);"
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     print(*db.estimate_limits(1), float(db.budget.spent.epsilon))
        t 1.0
        """
        return estimate_drops(self.mechanism_context(), epsilon, tables, only_missing)

    @property
    def budget(self) -> Budget:
        """Total, spent and remaining budget, as the policy's accountant reads them; for a
        connection with an analyst, ``.analyst`` is that analyst's own budget (if the policy
        gives analysts one)."""
        return self._spender.budget

    def ledger(self):
        """Past releases as a DataFrame (time, analyst, normalised SQL, options, cost, answer):
        all of them for the curator, only the analyst's own for a connection with an analyst."""
        return self._ledger.entries(self.analyst)

    def acting_for(self, analyst: str | None, cancel: Cancellation | None = None) -> "Connection":
        """This connection as one analyst's (``None``: the curator's): the same database, ledger,
        policy and caches, its queries charged to ``analyst`` and its budget and ledger theirs.
        The server gives every call its own view, so a query running in one thread is charged to
        its own analyst whatever another thread's call is acting for (``dpsql.server.answers``).
        ``cancel``: the call's cancel (a PostgreSQL cancel request), which stops any charge of the
        call that has not committed yet (``Ledger.charge``). Closing a view closes the connection
        it views.

        >>> db = connect({"t": __import__("pandas").DataFrame({"x": [1]})}, "BUDGET EPSILON 1; PUBLIC TABLE t;")
        >>> db.acting_for("alice").analyst, db.analyst
        ('alice', None)
        """
        if analyst is not None and (not isinstance(analyst, str) or not analyst.strip()):
            raise InvalidParameter(f"analyst must be a non-empty name, got {analyst!r}",
                                   hint="pass analyst='alice', or None for the curator")
        view = copy.copy(self)
        view.analyst, view._spender = analyst, self._spender.acting_for(analyst, cancel)
        return view

    def tables(self) -> list[str]:
        """The tables the policy lets an analyst query."""
        return [t.name for t in self.policy.private_tables] + [t.name for t in self.policy.public_tables]

    def synthetic_tables(self):
        """This view's analyst's synthetic tables (``db.synthesize``), one row each: name, source,
        method, rows, epsilon, delta, rho, marginals (how many were measured) and created. Nobody
        else's: each analyst (and the curator) sees only their own. ``SELECT * FROM
        synthetic_tables()`` reads the same rows on every surface; ``FROM name`` queries one, free."""
        return listing_frame(self._synthetic.of(self.analyst).values())

    def columns(self, table: str) -> dict[str, str]:
        """Column name -> DuckDB type of a declared table (schema only, never data)."""
        declaration = self.policy.table(table)
        if declaration is None:
            names = {name.lower(): name for name in self.tables()}
            raise UnsupportedQuery(f"unknown table {sql_name(table)}",
                                   hint=columns_hint(table, list(names), names, what="tables"))
        return dict(self._catalog[table_key(declaration.name)])

    def policy_text(self) -> str:
        """The policy in dpsql's policy language."""
        return policy_to_text(self.policy)

    def store_policy(self, *, replace: bool = False) -> PolicyChange | None:
        """Keep this connection's policy with its ledger, so later connects need none and are
        ruled by it; return the change recorded in the ledger (``None``: already stored).
        A different stored policy is replaced only with ``replace=True`` (``init_policy``)."""
        return store_policy(self._ledger, self.policy, replace)

    @property
    def policy_replaced(self) -> bool:
        """True once the policy stored with the ledger is none this connection was opened under
        (``dpsql init --replace`` ran since): its charges are refused, and a new connection is
        ruled by the stored policy and budget (the server opens one, ``dpsql.server.answers``)."""
        return self._ledger.stored_policy() not in self._spender.policies

    def policy_changes(self) -> list[PolicyChange]:
        """Every change of the stored policy (time, old and new text), oldest first."""
        return self._ledger.policy_changes()

    def curator_files(self) -> tuple[Path, ...]:
        """The files that only the curator may write: the database, its ledger with SQLite's
        side files, and the policy file this connection was opened with (resolved paths).
        Nothing an analyst drives (the shell's ``.output``) may write any of them."""
        return curator_files(self._engine.path, self._ledger.path, self._policy_file)

    def refresh(self) -> None:
        """Rebuild the bounded copies of the private tables (``dpsql.backends.bounding``) on their next
        use, and re-read the public key domains and prepared queries: call it after the wrapped
        database changed. Nothing is charged or read now."""
        self._engine.refresh_bounding()
        self._answerer.domains.clear()
        self._preparer.clear()

    def close(self) -> None:
        """Close the database and the ledger."""
        self._ledger.close()
        self._engine.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def mechanism_context(self) -> MechanismContext:
        """What a mechanism is given (``dpsql.query.context``): this view's policy, preparation,
        spender and noise source, never the connection's insides."""
        return MechanismContext(self.policy, self._catalog, self._policy_text, self.analyst, self._spender,
                                self._prepare, self._rng, self._engine.dialect, self._answerer.read_keys,
                                self._engine.fetch, self._pmw_sessions)

    def _prepare(self, sql: str, epsilon: Any = None, delta: Any = None, noise: str | None = None,
                 weights: dict | None = None, report_bias: Any = None, unit_bounds_share: Any = None) -> Prepared:
        """The static half of the query (``dpsql.query.prepare``), shared by ``sql`` and ``explain``."""
        return self._preparer.prepare(sql, epsilon, delta, noise, weights, report_bias, analyst=self.analyst,
                                      unit_bounds_share=unit_bounds_share)

    def _route_synthetic(self, sql: str):
        """The query of this view's analyst's own synthetic tables ``sql`` is, if one
        (``dpsql.query.synthetic_answering``); a statement mixing them with anything else is refused."""
        return synthetic_query(sql, self._synthetic, self.analyst, self.tables())

    def _route_local(self, sql: str) -> tuple[LocalCount | None, dict]:
        """The de-biased count ``sql`` is, if one (no LOCAL RR column in the policy: none)."""
        return route(self.policy, self._check, sql) if self._has_local else (None, {})

    # The stages one by one, for tests and benchmarks that look inside a query.

    def _check(self, sql: str) -> tuple[Any, PrivateQuery | PublicQuery, dict]:
        """Parse and check: (query tree, checked query, options written in the SQL)."""
        return self._preparer.check(sql)
