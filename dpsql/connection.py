"""The connection: composes the stages into ``db.sql``, ``db.explain`` and ``db.budget``.

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
import itertools
import math
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlglot import exp

from dpsql.analysis.aggregates import counts_rows, null_on_zero_divisors, plain_projection, total_post
from dpsql.analysis.domains import (
    domain_parts,
    domain_text,
    key_text,
    product_text,
    reports_outside,
)
from dpsql.analysis.plan import Plan, PrivateQuery, PublicQuery
from dpsql.answer.explain import Explanation, explain_plan, explain_sampling
from dpsql.answer.noise_rows import noise_rows_notes
from dpsql.answer.notes import null_cells_notes, thin_answer_notes
from dpsql.answer.result import (
    Budget,
    DPResult,
    OutsideDomain,
    QueryCost,
    decode_answer,
    decode_outside,
    encode_answer,
)
from dpsql.backends.base import Backend
from dpsql.backends.bounding import bounded_tables
from dpsql.backends.deadline import DEFAULT_REQUEST_TIMEOUT, check_timeout
from dpsql.backends.duckdb.persisted import copies_directory
from dpsql.backends.keys import shown_keys
from dpsql.backends.registry import engine_for
from dpsql.backends.rewrite import (
    BoundedStatement,
    domain_sql,
    rewrite_statement,
    separate_statement,
)
from dpsql.backends.spark.config import is_spark_config, load_spark_config
from dpsql.backends.spark.session import is_spark_session
from dpsql.budget.accounting import Spend, accountant_for, check_accountable, show
from dpsql.budget.ledger import LEDGER_SIDE_FILES, Cancellation, Ledger, PolicyChange
from dpsql.budget.registry import Dataset, check_second_budget, claim, dataset_identity, release, second_budget_note
from dpsql.calls.above_threshold import plan_stream, run_stream
from dpsql.calls.registry import Call, mechanism, recognise
from dpsql.curator.dropped import (
    DroppedPlan,
    RecordedDrop,
    dropped_statement,
    plan_dropped,
    record_key,
    release_dropped,
)
from dpsql.curator.progress import elapsed_progress, show_progress
from dpsql.curator.suggest import plan_suggestion, run_suggestion
from dpsql.errors import (
    DPError,
    InternalFailure,
    InvalidParameter,
    PolicyError,
    SecondBudgetWarning,
    UnsupportedQuery,
)
from dpsql.mechanisms.noise import secret_key
from dpsql.policy.diff import policy_difference
from dpsql.policy.language import check_policy, load_policy, policy_to_text
from dpsql.policy.model import KeyDomain, Policy, PrivateTable
from dpsql.query.accuracy import aggregates_of, cut_half_width, output_cells
from dpsql.query.bias import (
    BiasPlan,
    Limits,
    bias_share,
    bias_sql,
    explain_bias,
    limits_of,
    release_bias,
    stored_bounding,
    with_bounding,
)
from dpsql.query.executor import Executor
from dpsql.query.local import (
    LocalCount,
    check_reports,
    debias,
    debiased_columns,
    explain_local,
    interval_cells,
    local_notes,
    noise_variance,
    reads_local,
    reports_note,
    reports_sql,
    route_local,
)
from dpsql.query.options import max_keys, merge_options, privacy_options
from dpsql.query.prepare import Prepared, Preparer, Priced
from dpsql.query.release import (
    core_columns,
    core_rows,
    from_stored,
    half_widths,
    intervals,
    release_measures,
    split_last,
    stored_measures,
    stored_names,
)
from dpsql.query.scaling import scaled_result
from dpsql.sql.names import columns_hint, sql_name, table_key
from dpsql.sql.numbers import exact_parameter, plain_number
from dpsql.sql.parse import DIALECT, located
from dpsql.sql.pieces import SAMPLE_KEY_PARAMETER, UNBOUND_SAMPLE_KEY
from dpsql.sql.types import is_numeric_type


def connect(target: Any = ":memory:", policy: Any = None, *, ledger: Any = None,
            analyst: str | None = None, rng: Any = None, query_timeout: float | None = 30.0,
            memory_limit: str | None = None, eager_bounding: bool = False, persist_copies: bool = False,
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
    includes a scan of a raw private table (otherwise each is built by the first query reading it).
    ``persist_copies``: keep the bounded copies in a directory beside the ledger
    (``<ledger>.copies``, owner-only), so later connections (CLI calls, server restarts) reuse
    them instead of rebuilding; a copy is rebuilt when its table's data, the policy or the salt
    changed (``dpsql.backends.duckdb.persisted``). A database file with a ledger file only.
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


def open_engine(target: Any, *, query_timeout: float | None, memory_limit: str | None,
                copies: Path | None = None) -> Backend:
    """The backend for ``target``, opened by the first engine of ``dpsql.backends.registry.ENGINES``
    that recognises it: a SparkSession, or a Spark config file (``*.spark.toml``,
    ``dpsql.backends.spark.config``), runs on Spark (``dpsql.backends.spark``); anything else on DuckDB."""
    return engine_for(target).open(target, query_timeout=query_timeout, memory_limit=memory_limit, copies=copies)


def default_ledger(target: Any) -> Path | None:
    """The ledger file ``target`` is accounted in when no ``ledger=`` is given: ``<database>.ledger``
    beside a DuckDB file, a Spark config's ``[spark] ledger`` or ``<config>.ledger``; ``None`` for
    anything else (in memory; a SparkSession needs ``ledger=``)."""
    if is_spark_config(target):
        return load_spark_config(target).ledger_path
    if isinstance(target, (str, os.PathLike)) and str(target) != ":memory:":
        return Path(f"{Path(target).resolve()}.ledger")
    return None


def ledger_file(ledger: Any) -> Path | None:
    """The resolved ledger file ``ledger`` names, or ``None`` for one in memory."""
    if ledger is None or str(ledger) in ("", ":memory:"):
        return None
    return Path(ledger).resolve()


def source_of(target: Any, engine: Backend) -> str:
    """Where a connection's data came from, as the registry of ledgers tells the curator."""
    if is_spark_session(target):
        return "a Python Spark session"
    if is_spark_config(target):
        return f"the Spark config {engine.path}"
    if engine.path is not None:
        return str(engine.path)
    return "pandas DataFrames" if isinstance(target, dict) else "a DuckDB connection in Python"


def copies_directory_for(target: Any, ledger: Any) -> Path:
    """Where ``persist_copies`` keeps the copies: beside the ledger file (``<ledger>.copies``), the
    default ledger of a database file being ``<database>.ledger``."""
    if ledger is None and isinstance(target, (str, os.PathLike)) and str(target) != ":memory:":
        return copies_directory(f"{Path(target).resolve()}.ledger")
    if isinstance(ledger, (str, os.PathLike)) and str(ledger) not in ("", ":memory:"):
        return copies_directory(Path(ledger).resolve())
    raise InvalidParameter("persist_copies needs a ledger file: the copies are kept beside it",
                           hint="open a DuckDB file (its ledger sits beside it), or pass ledger='/path/to/x.ledger'")


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


@dataclass(frozen=True)
class _Answered:
    """What a charged query released (``Connection._answer``): the rows shown, the noisy
    measures of those rows (for accuracy and repeats), the outside cell's and the bias report."""

    rows: list[tuple]
    noisy: dict[str, list[int]]
    outside: dict | None
    bounding: Any


class Connection:
    """A wrapped database under a privacy policy, with a persistent budget."""

    _cancel: Cancellation | None = None
    """The cancel of the one call this view serves (``acting_for``), passed to every charge."""

    def __init__(self, target: Any, policy: Any, *, ledger: Any = None, analyst: str | None = None,
                 rng: Any = None, query_timeout: float | None = 30.0, memory_limit: str | None = None,
                 eager_bounding: bool = False, persist_copies: bool = False, progress: bool | None = None,
                 request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT, separate_budget: bool = False,
                 _replacing: bool = False):
        if analyst is not None and (not isinstance(analyst, str) or not analyst.strip()):
            raise InvalidParameter(f"analyst must be a non-empty name, got {analyst!r}",
                                   hint="pass analyst='alice', or leave it out",
                                   hints={"cli": "give --analyst alice, or leave it out"})
        copies = copies_directory_for(target, ledger) if persist_copies else None
        self._engine = open_engine(target, query_timeout=query_timeout, memory_limit=memory_limit, copies=copies)
        if show_progress(progress):
            self._engine.progress = elapsed_progress
        try:
            if ledger is None and self._engine.path is None and self._engine.dialect != "duckdb":
                raise InvalidParameter(
                    "a Spark-backed connection needs a ledger file: the budget must outlive this process",
                    hint="pass ledger='/path/to/budget.ledger' (a local SQLite file; ':memory:' for a throwaway one)",
                    hints={"cli": "give --ledger PATH"})
            if ledger is None and self._engine.path is not None:
                ledger = default_ledger(target if is_spark_config(target) else self._engine.path)
            file = ledger_file(ledger)
            if file is not None and not file.exists() and policy is not None:  # refused before the file is made
                check_second_budget(file, dataset_identity(load_policy(policy)), separate=separate_budget)
            self._ledger = Ledger.open(ledger)
            self._executor = Executor(self._ledger, self._engine,
                                      check_timeout(request_timeout, "request_timeout"))
            self._claimed: Path | None = None
            try:
                self.policy: Policy = self._load_policy(policy, _replacing)
                self._claim_dataset(file, source_of(target, self._engine), separate_budget)
                self._catalog = self._engine.catalog()
                check_policy(self.policy, self._catalog)
                self._check_listed_keys()
                self._engine.prepare_bounding(
                    bounded_tables(list(self.policy.private_tables), self._catalog, table_key),
                    self._ledger.salt().hex())
                if eager_bounding:
                    self._engine.build_bounding()
            except BaseException:
                if self._claimed is not None:  # registered by this open, which failed: forget it
                    release(self._claimed)
                self._ledger.close()
                raise
        except BaseException:
            self._engine.close()
            raise
        self.analyst = analyst
        self._rng = rng
        self._answer_locks = tuple(threading.Lock() for _ in range(64))
        self._domains: dict[str, list] = {}
        self._domain_texts: dict[tuple, str] = {}
        self._pmw_sessions: dict = {}
        """The open PMW sessions of ``SELECT * FROM pmw(...)`` (``dpsql.calls.pmw_call``), one per analyst and
        options: shared by every view of this connection (``acting_for``), as the server's calls are."""
        self._accountant = accountant_for(self.policy.accounting, self._total())
        self._analyst_accountant = None if self.policy.analyst_budget_epsilon is None else \
            accountant_for(self.policy.accounting, Spend(self.policy.analyst_budget_epsilon,
                                                         self.policy.analyst_budget_delta))
        self._policy_text = policy_to_text(self.policy)
        self._has_local = any(rule.local is not None for table in self.policy.private_tables for rule in table.columns)
        # The stored texts this connection's accountants agree with: a charge is refused once
        # the stored policy is none of them (replaced since), so the stored budget rules.
        agreed = {None, self._policy_text}
        if self._stored_policy is not None and not _replacing:
            agreed.add(self._stored_policy)
        self._agreed_policies = frozenset(agreed)
        self._policy_file = policy_file_of(policy)
        self._column_names = frozenset(c for columns in self._catalog.values() for c in columns)
        self._preparer = Preparer(self.policy, self._catalog, self._engine, self._describe,
                                  self._column_names, self._policy_text)
        try:
            check_reports(self.policy, self._reports_outside)
        except BaseException:
            self.close()
            raise

    def _claim_dataset(self, file: Path | None, source: str, separate: bool) -> None:
        """Record what this connection's ledger accounts for, in the ledger and the curator's
        registry (``dpsql.budget.registry``), refusing a second budget over the same tables
        (``SecondBudget``) unless ``separate``: before any private data is read or anything charged."""
        recorded = self._ledger.dataset()
        dataset = dataset_identity(self.policy)
        if recorded is not None:  # what it accounted for before stays accounted for
            dataset = dataset.union(Dataset.from_json(recorded))
        self.dataset = dataset
        """What the ledger accounts for: the private tables (and units) of every policy it served."""
        self.second_budget: str | None = None
        """Set when the ledger was opened as a second budget on purpose (``separate_budget``): says so."""
        if file is None:  # a ledger in memory is a throwaway budget: it claims nothing
            return
        claimed = claim(file, dataset, source, separate=separate)
        if claimed.new:
            self._claimed = file
        if recorded != dataset.to_json():
            self._ledger.record_dataset(dataset.to_json())
        self.second_budget = second_budget_note(claimed, dataset, file)
        if self.second_budget is not None:
            warnings.warn(self.second_budget, SecondBudgetWarning, stacklevel=4)

    def _reports_outside(self, table: PrivateTable, rule: Any) -> int:
        """Rows of the bounded copy of ``table`` whose LOCAL RR column ``rule`` holds NULL or a
        value outside its DOMAIN (``dpsql.query.local.check_reports``): the curator's connect
        reads it, no analyst's query; nothing is released."""
        prepared = self._prepare(reports_sql(table, rule), 1, 0, "laplace", None, False)
        assert prepared.plan is not None and prepared.priced is not None
        bounded = prepared.priced.bounded
        rows = self._read_keys(self._engine.fetch(bounded.sql, self._salt_for(bounded.needs_salt),
                                                  bounded=bounded.bounded), prepared.plan.query.keys)
        return sum(int(count) for key, count in rows if key is None)

    def _check_listed_keys(self) -> None:
        """Listed KEYS of a column that is neither text nor a number (a DATE, a UUID, an ENUM)
        must each name a value of its type, as DuckDB reads it: one that does not would be
        dropped from the domain without a word. Reads the policy's own literals only."""
        for table in self.policy.private_tables:
            columns = self._catalog[table_key(table.name)]
            for rule in table.columns:
                type_name = columns.get(rule.name.lower(), "")
                domain = rule.key_domain  # KEYS, or a LOCAL RR DOMAIN
                if domain is None or domain.values is None or type_name == "VARCHAR" \
                        or is_numeric_type(type_name):
                    continue
                wrong = [v for v in domain.values if self._engine.cast_error(str(v), type_name) is not None]
                if wrong:
                    position = rule.position
                    raise PolicyError(f"the KEYS of {table.name}.{rule.name} ({type_name}) list '{wrong[0]}', "
                                      f"which is not a value of {type_name}",
                                      line=position.line if position else None,
                                      col=position.col if position else None,
                                      hint=f"list keys DuckDB reads as {type_name}, such as "
                                           "'2024-01-31' for a DATE")

    def _load_policy(self, policy: Any, replacing: bool) -> Policy:
        """The policy that rules this connection: the one stored with the ledger, if any
        (DESIGN.md invariant 18); a different one given is refused, unless the curator is
        replacing the stored one (``init_policy``)."""
        self._stored_policy = stored = self._ledger.stored_policy()
        if policy is None:
            if stored is None:
                raise PolicyError("no policy was given and none is stored with this database",
                                  hint="pass policy='file.policy', or store one with `dpsql init DB --policy P`",
                                  hints={surface: "give --policy FILE, or store one with `dpsql init DB --policy P`"
                                         for surface in ("cli", "shell")})
            return load_policy(stored)
        given = load_policy(policy)
        if stored is None or replacing:
            return given
        difference = policy_difference(load_policy(stored), given)
        if difference is not None:
            raise PolicyError(
                f"the policy given is not the one stored with the ledger at "
                f"{self._ledger.path or ':memory:'}: {difference}",
                hint="leave the policy out to use the stored one; to change it, the curator runs "
                     "`dpsql init DB --policy P --replace`, which keeps what was spent")
        return given

    # -- public API ---------------------------------------------------------------------------

    @_reported_as_dperror
    def sql(self, sql: str, epsilon: Any = None, delta: Any = None, *, noise: str | None = None,
            weights: dict | None = None, report_bias: Any = None) -> DPResult:
        """Answer ``sql`` with differential privacy, charging its cost to the budget.

        ``weights`` splits epsilon between the query's aggregates ({output name or aggregate as
        written: relative weight}); equal by default. ``report_bias``: True, or a share of
        epsilon such as 0.05, spends that share on ``res.bounding``, a noisy estimate of what
        the contribution limits dropped and clamped (``dpsql.query.bias``); False turns off the
        policy's ``REPORT BIAS SHARE``. The query's total cost is unchanged.

        ``SELECT * FROM above_threshold('SELECT ...', ..., threshold = 100)`` (and the other
        mechanisms of ``dpsql.calls.registry``) calls that mechanism, as its method would.
        """
        call = self._call(sql, epsilon, delta, noise, weights, report_bias)
        if call is not None:
            return mechanism(call.name).answer(self, call.queries, call.options)
        local, written = self._route_local(sql)
        if local is not None:  # a count over a randomized-response column (dpsql.query.local)
            return self._answer_local(local, epsilon, delta, noise, written)
        prepared = self._prepare(sql, epsilon, delta, noise, weights, report_bias)
        result = self._sql_prepared(prepared)
        reads = reads_local(prepared.tree, prepared.checked, self.policy)
        if reads:
            result.notes.append(reports_note(reads))
        return result

    def _sql_prepared(self, prepared: Prepared) -> DPResult:
        """``sql`` of a prepared query, as written (no randomized-response routing)."""
        checked, plan = prepared.checked, prepared.plan
        if isinstance(checked, PublicQuery):
            return self._run_public(checked)
        assert plan is not None
        domain = self._domain(plan.query, prepared.written) if plan.selection is None else None
        priced = prepared.priced
        if priced is None:
            assert domain is not None
            return self._run_keys_only(plan, checked, domain)  # public keys only: nothing private is read
        # One answer per repeat key at a time: an identical query sent meanwhile from another
        # thread waits, then finds this one's stored answer instead of being charged again.
        with self._answer_locks[hash(priced.repeat_key) % len(self._answer_locks)]:
            repeat = self._replay(prepared, priced)
            if repeat is not None:  # an earlier release, returned as it was: nothing drawn, nothing charged
                return repeat if priced.scaling is None else scaled_result(repeat, priced.scaling)
            answered = self._answer(prepared, priced, domain)
            return answered if priced.scaling is None else scaled_result(answered, priced.scaling)

    def _answer(self, prepared: Prepared, priced: Priced, domain: list[tuple] | None) -> DPResult:
        """Charge ``prepared``, run its bounded statements, release and post-process (``sql``),
        through the executor (``dpsql.query.executor``): its statements were rendered before."""
        checked, plan, bias = prepared.checked, prepared.plan, prepared.bias
        assert plan is not None and isinstance(checked, PrivateQuery)
        cost, keys = priced.cost, plan.query.keys
        counting = priced.bias_counting if bias is not None else None
        statements = [priced.bounded, *priced.separate, *([counting] if counting is not None else [])]
        types = list(priced.core_types)

        options = self._options(plan)  # the mechanism's own (on the sample, if any), and the sampling rate
        if priced.sampling is not None:
            options["sample_rate"] = priced.sampling.rate

        def charge() -> int:
            return self._ledger.charge(cost, self._accountant, sql=priced.normal_sql, options=options,
                                       analyst=self.analyst, key=priced.repeat_key,
                                       analyst_total=self._analyst_accountant, policies=self._agreed_policies,
                                       cancel=self._cancel)

        def release(fetched: list[list[tuple]]) -> _Answered:
            exact = self._read_keys(fetched[0], keys)
            histograms: dict[str, Sequence[tuple]] = {
                measure.name: self._read_keys(rows, keys) for measure, rows in zip(plan.separate, fetched[1:])}
            bounding = None
            if counting is not None:
                assert bias is not None
                bounding = release_bias(bias, dict(zip([m.name for m in bias.measures], fetched[-1][0])), self._rng)
            return self._released(plan, checked, domain, exact, histograms, types, bounding)

        def record(answered: _Answered) -> str:
            return with_bounding(encode_answer(list(checked.outputs), answered.rows, answered.noisy,
                                               outside=answered.outside), answered.bounding)

        # A sampled query's key: drawn after the charge from the secure source, bound only to its own statements.
        sample_key = (lambda: secret_key(self._rng)) if priced.sampling is not None else None
        answered = self._executor.execute(charge, statements, release, record, sample_key=sample_key)
        rows, noisy, stored_outside, bounding = answered.rows, answered.noisy, answered.outside, answered.bounding
        charged = QueryCost(cost.epsilon, cost.delta, cost.rho, accounting=self.policy.accounting)
        cells = self._intervals(plan, checked, noisy, rows)
        return DPResult(list(checked.outputs), rows, charged, intervals=cells,
                        **self._described(plan, checked, types, rows, cells), budget=self._snapshot(),
                        outside_domain=self._outside(plan, checked, stored_outside, types),
                        limits=self._limits(plan), bounding=bounding)

    def _released(self, plan: Plan, checked: PrivateQuery, domain: list[tuple] | None, exact: list[tuple],
                  histograms: dict[str, Sequence[tuple]], types: list[str], bounding: Any) -> _Answered:
        """The noisy release of ``exact`` (and the quantiles' ``histograms``), post-processed into
        the rows shown, with the noisy measures of those rows in their order: all accuracy()
        needs, for this answer and every repeat of it."""
        keys = plan.query.keys
        outside = reports_outside(keys)
        released = domain
        if outside:  # the outside cell last; there is one only beside a public domain
            assert domain is not None
            released = domain + [(None,) * len(keys)]
        release = release_measures(plan, released, exact, self._rng, histograms)
        stored_outside = None
        if outside:  # the outside cell's released values and noisy measures, kept for repeats
            release, cell = split_last(release)
            stored_outside = {"values": list(core_rows(plan, cell)[0][len(keys):]),
                              "noisy": {name: int(values[0]) for name, values in stored_measures(cell).items()}}
        core = core_rows(plan, release)
        picked = plain_projection(checked.post, core_columns(plan))
        if picked is not None:  # a plain projection: the core's rows in order, no SQL needed
            core = shown_keys(core, keys)
            pick = itemgetter(*picked)
            rows = [pick(row) for row in core] if len(picked) > 1 else [(row[picked[0]],) for row in core]
            order: Sequence[int] = range(len(rows))
            tracked = True
        else:
            indexed = [row + (index,) for index, row in enumerate(core)]
            columns, rows = self._engine.post_processing.post_process(
                core_columns(plan) + ["dp_row"], types + ["BIGINT"], indexed, total_post(checked.post))
            tracked = columns[-1] == "dp_row"
            order = [row[-1] for row in rows] if tracked else []
            rows = [row[:-1] for row in rows] if tracked else rows
        noisy = {name: list(values) if isinstance(order, range) else [values[i] for i in order]
                 for name, values in stored_measures(release).items()} if tracked else {}
        return _Answered(rows, noisy, stored_outside, bounding)

    def _read_keys(self, rows: list[tuple], keys) -> list[tuple]:
        """Fetched rows with their keys as DuckDB reads them back (``dpsql.backends.keys``): an
        engine that writes its own key texts (Spark) translates them (``Backend.key_text``)."""
        return self._engine.read_keys(rows, keys)

    def _describe(self, statement: BoundedStatement) -> list[tuple[str, str]]:
        """The (name, type) of each column ``statement`` returns: binds it, reads no rows."""
        parameters = self._salt_for(statement.needs_salt)
        if statement.needs_sample_key:  # binding reads no rows: any key types the statement alike
            parameters = {**(parameters or {}), SAMPLE_KEY_PARAMETER: UNBOUND_SAMPLE_KEY}
        return self._engine.describe(statement.sql, parameters)

    def _salt_for(self, needed: bool) -> dict | None:
        """The secret salt as a query parameter, for a statement that orders by a salted hash
        (``BoundedStatement.needs_salt``)."""
        return self._executor.salt_for(needed)

    @_reported_as_dperror
    def explain(self, sql: str, epsilon: Any = None, delta: Any = None, *, noise: str | None = None,
                weights: dict | None = None, report_bias: Any = None) -> str:
        """What ``sql`` would run and cost: bounded SQL, sensitivities, noise, the contribution
        limits and any bias report; reads no data. The text's ``refused`` is the
        ``BudgetExceeded`` running it would meet, else ``None``."""
        call = self._call(sql, epsilon, delta, noise, weights, report_bias)
        if call is not None:
            explain = mechanism(call.name).explain
            if explain is None:
                raise UnsupportedQuery(f"{call.name}() has no explanation", hint=f"see help for {call.name}")
            text = explain(self, call.queries, call.options)
            return text if isinstance(text, Explanation) else Explanation(text)
        local, written = self._route_local(sql)
        if local is not None:  # a count over a randomized-response column (dpsql.query.local)
            if local.free:
                self._local_options(epsilon, delta, noise, written)
                return Explanation(explain_local(local))
            epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
            counting = self._explain_prepared(self._prepare(local.counting_sql, epsilon, delta, noise, None, False))
            return Explanation(explain_local(local) + "\n\n" + counting, refused=getattr(counting, "refused", None))
        prepared = self._prepare(sql, epsilon, delta, noise, weights, report_bias)
        text = self._explain_prepared(prepared, report_bias)
        reads = reads_local(prepared.tree, prepared.checked, self.policy)
        if reads:
            return Explanation(f"{text}\n\nnote: {reports_note(reads)}", refused=getattr(text, "refused", None))
        return text

    def _explain_prepared(self, prepared: Prepared, report_bias: Any = None) -> str:
        """``explain`` of a prepared query, as written (no randomized-response routing);
        ``report_bias`` as given to ``explain`` (a sample leaves only the policy's default out)."""
        checked, plan, bias = prepared.checked, prepared.plan, prepared.bias
        if isinstance(checked, PublicQuery):
            return Explanation("public tables only: runs exactly and costs nothing\n\n"
                               + checked.tree.sql(dialect=DIALECT))
        assert plan is not None
        priced = prepared.priced
        if priced is None:
            return ("GROUP BY public KEYS domains with no aggregate: the keys of the domains "
                    f"({'; '.join(domain_text(k) for k in plan.query.keys)}) are released exactly; "
                    "no private data is read, nothing is charged")
        cost = priced.cost
        repeat = self._ledger.find_answer(priced.repeat_key) is not None
        after, refusal = self._after(Spend.ZERO if repeat else cost)
        shown = rewrite_statement(plan, self._engine.dialect, pretty=True).sql  # the SQL priced above, on lines
        separate = [separate_statement(plan, m, self._engine.dialect, pretty=True).sql for m in plan.separate]
        sampling = priced.sampling
        text = explain_plan(plan, shown, after.remaining, refused=refusal is not None, separate=separate,
                            amplified=None if sampling is None else (cost, sampling.percent))
        text += self._time_zone_note(plan)
        text += f"\n\nlimits: {self._limits(plan)}"
        if sampling is not None:
            assert priced.base_cost is not None
            text += "\n\n" + explain_sampling(sampling, plan, priced.base_cost, cost, self.policy.accounting,
                                              bias_left_out=self._default_bias_left_out(report_bias, prepared.written),
                                              scaled=None if priced.scaling is None else
                                              [c.name for c in priced.scaling.columns])
        if bias is not None:
            text += "\n\n" + explain_bias(bias, bias_sql(bias, plan.query))
        return Explanation(text + "\n\n" + self._accounting_text(cost, repeat, refusal),
                           refused=refusal)

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
        stream = plan_stream(self, queries, threshold, epsilon, max_above, values, value_epsilon)
        return run_stream(self, stream)

    def _default_bias_left_out(self, report_bias: Any, written: dict) -> bool:
        """True when the policy's default bias report would apply but a sample leaves it out."""
        share, explicit = bias_share(report_bias, written.get("report_bias"), self.policy.bias_share, exact_parameter)
        return share is not None and not explicit

    @_reported_as_dperror
    def workload(self, queries: Sequence[str], epsilon: Any = None, delta: Any = None, *,
                 rounds: int | None = None) -> DPResult:
        """Answer a list of counting queries over one private table together, by MWEM
        (``dpsql.calls.workload``, ``dpsql.mechanisms.mwem``): cheaper per query than one release each
        once there are many. Charged once, like a query; the same workload again is free.

        Returns one row per scalar answer: ``query`` (its number, from 1), ``cell`` (a GROUP BY
        cell as text, NULL when ungrouped), ``answer`` and ``measured``; ``accuracy()`` bounds
        every answer (a measured one by its noise, the others by MWEM's a-posteriori bound, all
        at once). ``delta`` > 0: discrete Gaussian measurements, accounted in zCDP. ``rounds``:
        MWEM's T (default: ``dpsql.mechanisms.mwem.default_rounds``).

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

        return answer_workload(self, queries, epsilon, delta, rounds)

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

        return open_pmw(self, table, columns, epsilon, delta, max_updates, threshold)

    def fit(self, sql: str, target: str, model: str = "linear", epsilon: Any = None, delta: Any = None, *,
            steps: int = 30, clip: Any = 1.0, learning_rate: Any = None):
        """A ``model`` ('linear' or 'logistic') of ``target`` on the other columns of the rows ``sql``
        selects, trained by noisy gradient descent with each unit's gradient clipped to ``clip``
        (``dpsql.calls.fit``): charged once, (epsilon, delta) with delta > 0 (default: the policy's
        QUERY EPSILON and QUERY DELTA). ``TABLESAMPLE POISSON (p PERCENT)`` in ``sql`` makes each
        step read a fresh sample of units (DP-SGD). Returns a ``FittedModel``: ``coefficients``,
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
        from dpsql.calls.fit import plan_fit, run_fit

        return run_fit(self, plan_fit(self, sql, target, model, epsilon, delta, steps, clip, learning_rate))

    def suggest_bounds(self, table: str, epsilon: Any = None, columns: Any = None, *,
                       group_by: str | None = None) -> dict:
        """DP suggestions of a private table's contribution bounds, charged like a query.

        Returns ``{"max_rows_per_unit": k, "max_groups_per_unit": None, "bounds": {column:
        (lo, hi) or None}, "epsilon_split": {...}}``: k the DP 95th percentile of rows per unit,
        each column's bounds the outer edges of its 1st and 99th percentile bins in a noisy
        log-scale histogram of one value per unit (``dpsql.curator.suggest``; None when too few units
        for any bin to pass the noise threshold). ``columns``: the numeric columns to bound (default: every numeric
        column but the unit). The whole ``epsilon`` is charged to the ledger first (budget
        checks and refusal as for any query); nothing is stored for a free repeat. ``group_by``:
        a column whose distinct values per unit bound MAX GROUPS PER UNIT the same way (its DP
        95th percentile); without it ``max_groups_per_unit`` is None. Also the errors the split
        gives (``max_rows_per_unit_rank_error``, ``bin_threshold``) and ``warnings`` when they
        are too large to trust the answer. ``bounds`` holds only bounds suggest vouches for (at
        most 5% of units' values outside, at 95%; ``dpsql.curator.suggest_coverage``), the raw estimates
        are in ``estimated_bounds``; ``units`` is a DP count of units (± ``units_halfwidth``) and
        ``selection`` partition selection's threshold under the suggested limits.

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"uid": [1, 1, 2, 3], "x": [1.0, 2.0, 3.0, 4.0]})
        >>> policy = "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"
        >>> with connect({"t": frame}, policy=policy) as db:
        ...     print(*sorted(db.suggest_bounds("t", epsilon=0.5)))  # doctest: +NORMALIZE_WHITESPACE
        ...     float(db.budget.remaining.epsilon)
        bin_threshold bounds coverage epsilon_split estimated_bounds max_groups_per_unit max_rows_per_unit
        max_rows_per_unit_rank_error notes selection units units_halfwidth warnings
        0.5
        """
        if self._engine.dialect != DIALECT:  # its statements read raw tables through DuckDB-only pieces
            raise UnsupportedQuery("suggest_bounds runs on DuckDB only: this connection is on Spark",
                                   hint="run it on a DuckDB sample of the table (dpsql.connect(frames, ...)), "
                                        "then write the bounds into the policy")
        epsilon = privacy_options(self.policy, epsilon, None, None).epsilon
        plan = plan_suggestion(self.policy, self._catalog, table_key, table, epsilon, columns, group_by)
        cost = Spend(epsilon, Fraction(0), epsilon ** 2 / 2)
        check_accountable(self.policy.accounting, cost)

        def charge() -> int:
            return self._ledger.charge(cost, self._accountant, sql=f"SUGGEST BOUNDS {plan.table}",
                                       options={"epsilon": epsilon, "columns": [c for c, _ in plan.columns],
                                                "group_by": plan.group_by},
                                       analyst=self.analyst, analyst_total=self._analyst_accountant,
                                       policies=self._agreed_policies, cancel=self._cancel)

        return self._executor.execute_adaptive(
            charge, lambda fetch: run_suggestion(plan, fetch, self._rng, self._engine.dialect),
            failure="the suggestion failed while running; its cost was charged and nothing was released",
            statements=plan.statements, what="this suggestion")

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
        epsilon = privacy_options(self.policy, epsilon, None, None).epsilon
        names = [t.name for t in self.policy.private_tables] if tables is None else \
            [tables] if isinstance(tables, str) else list(tables)
        plans = []
        for name in names:
            rule = self.policy.table(name)
            if not isinstance(rule, PrivateTable):
                private = ", ".join(t.name for t in self.policy.private_tables) or "none"
                raise UnsupportedQuery(f"{name} is not a private table of the policy",
                                       hint=f"name one of the private tables: {private}")
            plan = plan_dropped(rule, table_key(rule.name), epsilon)
            if plan is None or (only_missing and self._recorded(plan.key, plan.unit, plan.rows_per_unit)):
                continue  # a row-level table drops no row
            plans.append(plan)
        cost = Spend(epsilon, Fraction(0), epsilon ** 2 / 2)
        check_accountable(self.policy.accounting, cost)
        recorded = {}
        for plan in plans:
            counting = dropped_statement(plan, self._engine.dialect)  # rendered before the charge

            def charge(plan: DroppedPlan = plan) -> int:
                key = record_key(plan.key, plan.unit, plan.rows_per_unit)
                return self._ledger.charge(cost, self._accountant, sql=f"ESTIMATE LIMITS {plan.table}",
                                           options={"epsilon": epsilon, "rows_per_unit": plan.rows_per_unit},
                                           analyst=self.analyst, key=key, analyst_total=self._analyst_accountant,
                                           policies=self._agreed_policies, cancel=self._cancel)

            def release(fetched: list[list[tuple]], plan: DroppedPlan = plan) -> RecordedDrop:
                kept, dropped = fetched[0][0]
                return release_dropped(plan, (int(kept), int(dropped)), self._rng)

            recorded[plan.table] = self._executor.execute(
                charge, [counting], release, RecordedDrop.to_json,
                failure="the estimate failed while running; its cost was charged and nothing was released")
        return recorded

    def _recorded(self, key: str, unit: str, rows_per_unit: int) -> RecordedDrop | None:
        """The latest recorded estimate of a table's rows beyond ``rows_per_unit`` (``None``: none)."""
        return RecordedDrop.from_json(self._ledger.find_answer(record_key(key, unit, rows_per_unit)))

    def _limits(self, plan: Plan) -> Limits:
        """The answer's limits line: the plan's limits, with the recorded share of rows each
        private table it reads drops (``estimate_limits``; a released value: free)."""
        recorded = []
        for key in plan.query.bounded:
            rule = next((t for t in self.policy.private_tables if table_key(t.name) == key), None)
            if rule is not None and not rule.row_level and rule.unit is not None:
                found = self._recorded(key, rule.unit, rule.max_rows_per_unit)
                recorded += [found] if found is not None else []
        return limits_of(plan, tuple(recorded))

    def _time_zone_note(self, plan: Plan) -> str:
        """Which zone date parts of a TIMESTAMPTZ column are taken in (a setting, not data)."""
        zoned = [c for c, t in plan.query.column_types
                 if t.upper().startswith(("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"))]
        if not zoned:
            return ""
        zone = self._engine.time_zone()
        return (f"\n\ntime zone: {', '.join(zoned)} (TIMESTAMP WITH TIME ZONE) are read in {zone}: date parts, "
                "date_trunc and casts to DATE or TIMESTAMP are taken there")

    @property
    def budget(self) -> Budget:
        """Total, spent and remaining budget, as the policy's accountant reads them; for a
        connection with an analyst, ``.analyst`` is that analyst's own budget (if the policy
        gives analysts one)."""
        budget = self._budget_of(self._accountant, self._ledger.tally())
        if self.analyst is not None and self._analyst_accountant is not None:
            mine = self._budget_of(self._analyst_accountant, self._ledger.tally(self.analyst),
                                   owner=self.analyst)
            budget = replace(budget, analyst=mine)
        return budget

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
        view.analyst, view._cancel = analyst, cancel
        return view

    def tables(self) -> list[str]:
        """The tables the policy lets an analyst query."""
        return [t.name for t in self.policy.private_tables] + [t.name for t in self.policy.public_tables]

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
        stored = self._ledger.stored_policy()
        difference = None if stored is None else policy_difference(load_policy(stored), self.policy)
        if stored is not None and difference is None:
            return None  # the same rules, however they were written: nothing to record
        if difference is not None and not replace:
            raise PolicyError(
                f"a different policy is stored with the ledger at "
                f"{self._ledger.path or ':memory:'}: {difference}",
                hint="to replace it, keeping what was spent, run `dpsql init DB --policy P --replace`")
        return self._ledger.store_policy(self.policy_text(), replacing=stored)

    @property
    def policy_replaced(self) -> bool:
        """True once the policy stored with the ledger is none this connection was opened under
        (``dpsql init --replace`` ran since): its charges are refused, and a new connection is
        ruled by the stored policy and budget (the server opens one, ``dpsql.server.answers``)."""
        return self._ledger.stored_policy() not in self._agreed_policies

    def policy_changes(self) -> list[PolicyChange]:
        """Every change of the stored policy (time, old and new text), oldest first."""
        return self._ledger.policy_changes()

    def curator_files(self) -> tuple[Path, ...]:
        """The files that only the curator may write: the database, its ledger with SQLite's
        side files, and the policy file this connection was opened with (resolved paths).
        Nothing an analyst drives (the shell's ``.output``) may write any of them."""
        files = []
        if self._engine.path is not None:
            files += [self._engine.path, Path(f"{self._engine.path}.wal")]
        if self._ledger.path is not None:
            ledger = Path(self._ledger.path).resolve()
            files += [ledger, *(Path(f"{ledger}{side}") for side in LEDGER_SIDE_FILES)]
        if self._policy_file is not None:
            files.append(self._policy_file)
        return tuple(files)

    def refresh(self) -> None:
        """Rebuild the bounded copies of the private tables (``dpsql.backends.bounding``) on their next
        use, and re-read the public key domains and prepared queries: call it after the wrapped
        database changed. Nothing is charged or read now."""
        self._engine.refresh_bounding()
        self._domains.clear()
        self._domain_texts.clear()
        self._preparer.clear()

    def close(self) -> None:
        """Close the database and the ledger."""
        self._ledger.close()
        self._engine.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- stages -------------------------------------------------------------------------------

    # -- accounting and free repeats -----------------------------------------------------------

    def _replay(self, prepared: Prepared, priced: Priced) -> DPResult | None:
        """The stored answer of an identical earlier query, exactly as it was released, or
        ``None`` when there is none that can be given back exactly."""
        plan, checked, bias = prepared.plan, prepared.checked, prepared.bias
        assert plan is not None and isinstance(checked, PrivateQuery)
        text = self._ledger.find_answer(priced.repeat_key)
        decoded = None if text is None else decode_answer(text)
        if decoded is None:
            return None
        _, rows, noisy = decoded
        columns = list(checked.outputs)
        if any(len(row) != len(columns) for row in rows) or (noisy and (
                set(noisy) != stored_names(plan)
                or any(len(values) != len(rows) for values in noisy.values()))):
            return None  # (an answer kept before quantiles stored their intervals is charged again)
        bounding = None if bias is None else stored_bounding(text)
        if bias is not None and bounding is None:
            return None
        cells = self._intervals(plan, checked, noisy, rows)
        return DPResult(columns, rows, QueryCost.free(repeat=True), intervals=cells,
                        **self._described(plan, checked, list(priced.core_types), rows, cells),
                        budget=self._snapshot(),
                        outside_domain=self._outside(plan, checked, decode_outside(text), list(priced.core_types)),
                        limits=self._limits(plan), bounding=bounding)

    def _described(self, plan: Plan, checked: PrivateQuery, core_types: list[str], rows: list[tuple],
                   cells: Callable[[float], dict[str, list[tuple[float, float, float]]]]) -> dict:
        """``DPResult``'s types (bound lazily, reading no rows) and notes (``dpsql.answer.notes``: from
        the plan and the released row count; ``dpsql.answer.noise_rows``: from the released rows and
        their intervals ``cells``)."""
        def types() -> list[str]:
            core = core_types
            picked = plain_projection(checked.post, core_columns(plan))
            if picked is not None:
                return [core[i] for i in picked]
            described = self._engine.post_processing.released_types(core_columns(plan) + ["dp_row"], core + ["BIGINT"],
                                                    total_post(checked.post))
            return [type_name for name, type_name in described[:len(checked.outputs)]]

        limited = any(checked.post.args.get(part) for part in ("limit", "offset"))
        notes = [] if limited else thin_answer_notes(plan, len(rows), checked.post)
        notes += null_cells_notes(checked.outputs, checked.post, rows)
        try:
            notes += noise_rows_notes(plan, checked, rows, cells)
        except Exception:  # advisory, after the charge: the answer is released without it
            pass
        return {"types": types, "notes": tuple(notes), "converter": self._engine.post_processing.convert}

    def _snapshot(self) -> Budget | None:
        """The budget now, for the answer to show (``None`` if the ledger cannot say)."""
        try:
            return self.budget
        except DPError:
            return None

    def _outside(self, plan: Plan, checked: PrivateQuery, stored: dict | None,
                 core_types: list[str]) -> OutsideDomain | None:
        """The outside cell (``dpsql.analysis.domains``) as the analyst sees it, from its released values
        and noisy measures; ``None`` when the query has none. Its values are the query's outputs
        by their names (``AVG(amount) AS a`` is ``a``; ``ROUND(AVG(amount)) AS a`` is computed by
        post-processing the cell alone, with the interval derived as for any row), and, by their
        SQL, any aggregate no output reads (a COUNT(*) in HAVING still counts the cell's rows)."""
        if stored is None or not reports_outside(plan.query.keys):
            return None
        keys, aggregates = plan.query.keys, plan.query.aggregates
        core = tuple([None] * len(keys) + [plain_number(v) for v in stored["values"]])
        release = from_stored(plan, {k: (int(v),) for k, v in stored["noisy"].items()}, 1)
        outputs = [(position, name, item.unalias()) for position, (name, item)
                   in enumerate(zip(checked.outputs, checked.post.expressions)) if aggregates_of(item.unalias())]
        read = {a for _, _, node in outputs for a in aggregates_of(node)}
        computed = [(p, name, node) for p, name, node in outputs if not isinstance(node, exp.Column)]
        shown = self._outside_outputs(plan, checked, core, core_types) if computed else None
        values, sources = {}, {}
        for position, name, node in outputs:
            if isinstance(node, exp.Column):
                values[name] = core[len(keys) + [a.name for a in aggregates].index(node.name)]
            elif shown is not None and not node.find(exp.Window):
                values[name] = plain_number(shown[position])
            else:
                continue
            sources[name] = position
        labels = {}
        for index, aggregate in enumerate(aggregates):
            if aggregate.name not in read and aggregate.label not in values:
                values[aggregate.label] = core[len(keys) + index]
                labels[aggregate.label] = aggregate.name
        names = {aggregate: output for output, aggregate in reversed(checked.direct)}
        rows = next((names.get(a.name, a.label) for a in aggregates
                     if counts_rows(a) and names.get(a.name, a.label) in values),
                    None)

        def cells(alpha: float) -> dict[str, tuple[float, float, float]]:
            """Per value, (low, high, half-width) of its interval (cut to what the policy allows)."""
            shown_row = shown if shown is not None else (None,) * len(checked.outputs)
            derived = output_cells(plan, checked, release, [shown_row], alpha)
            own, spans = half_widths(plan, release, alpha), intervals(plan, release, alpha)
            found = {}
            for name in sources:
                if name in derived:
                    low, high, half = map(float, derived[name][0])
                    found[name] = (low, high, cut_half_width(half, values[name], low, high))
            for label, name in labels.items():
                if name in own:
                    low, high = map(float, spans[name][0])
                    found[label] = (low, high, cut_half_width(float(own[name][0]), values[label], low, high))
            return found

        return OutsideDomain(tuple(key_text(key) for key in keys), values,
                             lambda alpha: {name: cell[2] for name, cell in cells(alpha).items()}, rows,
                             spans=lambda alpha: {name: cell[:2] for name, cell in cells(alpha).items()})

    def _outside_outputs(self, plan: Plan, checked: PrivateQuery, core: tuple,
                         core_types: list[str]) -> tuple | None:
        """The select list of the query run on the outside cell alone (no WHERE, ORDER BY,
        LIMIT or DISTINCT: it is shown whatever they say); ``None`` if that fails. Released
        values only: nothing private is read."""
        try:
            select = exp.Select(expressions=[null_on_zero_divisors(e.copy()) for e in checked.post.expressions])
            select = select.from_("dp_core")  # a ratio over a noisy 0 is NULL here too, as in the rows
            _, rows = self._engine.post_processing.post_process(core_columns(plan), list(core_types), [core], select)
            return tuple(rows[0])
        except Exception:  # a post-processing error on NULL keys: the outputs are left out
            return None

    def _intervals(self, plan: Plan, checked: PrivateQuery, noisy: dict, rows: list[tuple]):
        """accuracy() of released rows, from their stored measures (``release.stored_measures``):
        per noisy output column and row, (low, high, half-width) (``dpsql.query.accuracy``)."""
        tracked = bool(noisy) or not stored_names(plan)
        release = from_stored(plan, noisy, len(rows)) if tracked else None  # None: rows merged by DISTINCT

        def cells(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
            return output_cells(plan, checked, release, rows, alpha)

        return cells

    def _budget_of(self, accountant, tally, owner: str | None = None) -> Budget:
        account = accountant.account(tally)
        return Budget(account.total, account.spent, account.remaining, accounting=account.accounting,
                      owner=owner)

    def _after(self, cost: Spend) -> tuple[Budget, DPError | None]:
        """The database-wide budget after paying ``cost``, and why it would be refused, if so."""
        tally, refusal = self._ledger.tally(), None
        for accountant, mine, which in self._budgets(tally):
            try:
                accountant.check(mine, cost, which)
            except DPError as refused:
                refusal = refusal or refused
        return self._budget_of(self._accountant, tally.add(cost)), refusal

    def _budgets(self, tally):
        yield self._accountant, tally, "the total budget"
        if self.analyst is not None and self._analyst_accountant is not None:
            yield (self._analyst_accountant, self._ledger.tally(self.analyst),
                   f"analyst {self.analyst}'s budget")

    def _accounting_text(self, cost: Spend, repeat: bool, refusal: DPError | None) -> str:
        accountant = self._accountant
        lines = [f"accounting: {accountant.name.upper()} ({accountant.title}); this query costs "
                 f"epsilon {show(cost.epsilon)}, delta {show(cost.delta)}"
                 + ("" if cost.rho is None or self.policy.accounting != "zcdp" else f", rho {show(cost.rho)}")]
        if repeat:
            lines.append("repeat: this query was answered before; its stored answer would be "
                         "returned at no cost")
        elif refusal is not None:
            lines.append(f"it would be refused: {refusal}")
        lines.append(f"budget now: {self.budget}")
        return "\n".join(lines)

    def _total(self) -> Spend:
        return Spend(self.policy.budget_epsilon, self.policy.budget_delta)

    def _options(self, plan: Plan) -> dict:
        return {"epsilon": plan.epsilon, "delta": plan.delta,
                "noise": sorted({m.noise for m in plan.measures}), "neighbours": plan.neighbours}

    def _call(self, sql: str, epsilon: Any, delta: Any, *others: Any) -> Call | None:
        """The mechanism ``sql`` calls (``dpsql.calls.registry``), or None for a query. An epsilon or delta
        given beside the call (the shell's ``.epsilon``, ``--epsilon``) is the default of the
        call's own option of that name; any other argument does not apply to a call."""
        try:
            call = recognise(sql)
        except DPError as error:
            raise located(error, sql) from None
        if call is None:
            return None
        taken = mechanism(call.name).options
        for name, value in (("epsilon", epsilon), ("delta", delta)):
            if value is None or name not in taken:
                continue  # a delta beside a pure mechanism's call: it spends none, within any delta
            if name not in call.options:
                call.options[name] = value
            elif exact_parameter(value, name) != exact_parameter(call.options[name], name):
                raise InvalidParameter(f"{name} is given twice: {float(call.options[name]):g} in the call and "
                                       f"{float(value):g} as an argument",
                                       hint=f"give {name} once, in the call or as an argument")
        if any(other not in (None, False) for other in others):
            raise InvalidParameter(f"{call.name}() takes its options inside its call",
                                   hint=f"write SELECT * FROM {call.name}(..., option = value)")
        return call

    def _prepare(self, sql: str, epsilon: Any, delta: Any, noise: str | None, weights: dict | None,
                 report_bias: Any) -> Prepared:
        """The static half of the query (``dpsql.query.prepare``), shared by ``sql`` and ``explain``."""
        return self._preparer.prepare(sql, epsilon, delta, noise, weights, report_bias, analyst=self.analyst)

    # The stages one by one, for tests and benchmarks that look inside a query.

    def _check(self, sql: str) -> tuple[Any, PrivateQuery | PublicQuery, dict]:
        """Parse and check: (query tree, checked query, options written in the SQL)."""
        return self._preparer.check(sql)

    def _plan(self, query: PrivateQuery, sql: str, epsilon: Any, delta: Any, noise: str | None,
              weights: dict | None = None) -> Plan:
        return self._preparer.plan(query, sql, epsilon, delta, noise, weights)

    def _plan_with_bias(self, checked: PrivateQuery, sql: str, epsilon: Any, delta: Any, noise: str | None,
                        weights: dict | None, report_bias: Any, written: dict) -> tuple[Plan, BiasPlan | None]:
        return self._preparer.plan_with_bias(checked, sql, epsilon, delta, noise, weights, report_bias, written)

    def _domain(self, query: PrivateQuery, written: dict | None = None) -> list[tuple]:
        """Every released key: the product of the public key domains, each narrowed by the
        query's WHERE (``dpsql.analysis.domains``; public data only). More keys than the limit
        (``dpsql.query.options.max_keys``) are refused before the product is built."""
        if not query.keys:
            return [()]
        # Keys from one public table take the combinations that table holds (a city with its
        # stores), not the product of their separate domains; other keys combine freely.
        parts = []
        for indices in domain_parts(query.keys):
            keys = [query.keys[i] for i in indices]
            domain = self._domain_text(keys, [query.column_type(k.expression.name) for k in keys])
            if domain not in self._domains:  # public data: read once per connection
                self._domains[domain] = [tuple(row) for row in self._read_keys(self._engine.fetch(domain), keys)]
            parts.append((indices, self._domains[domain]))
        self._check_domain_size(query, [(indices, len(values)) for indices, values in parts], written or {})
        if len(parts) == 1 and parts[0][0] == list(range(len(query.keys))):
            return list(parts[0][1])  # one table's keys in query order: its rows are the keys
        released = []
        for combination in itertools.product(*(values for _, values in parts)):
            key = [None] * len(query.keys)
            for (indices, _), values in zip(parts, combination):
                for i, value in zip(indices, values):
                    key[i] = value
            released.append(tuple(key))
        return released

    def _domain_text(self, keys: list, types: list[str]) -> str:
        """``domain_sql`` of these keys, kept by what it is made of when no WHERE narrows them
        (each key's domain, form and type): rendering it costs more, about 1.5 ms, than the rest
        of answering a small grouped query from a domain already read."""
        if any(key.narrowed_by or key.narrowing_columns for key in keys):
            return domain_sql(keys, types, dialect=self._engine.dialect)
        shape = (tuple((exact_domain(key.domain), key.form) for key in keys), tuple(types))
        text = self._domain_texts.get(shape)
        if text is None:
            text = self._domain_texts[shape] = domain_sql(keys, types, dialect=self._engine.dialect)
        return text

    def _check_domain_size(self, query: PrivateQuery, parts: list[tuple[list[int], int]], written: dict) -> None:
        """Refuse, before the charge, a public domain of more keys than the limit allows: the
        domain, its size and the limit, and how to narrow it. ``parts``: each domain part's key
        indices and the number of its keys or combinations (``domain_parts``)."""
        limit, option = max_keys(self.policy, written)
        size = math.prod(count for _, count in parts)
        if size <= limit:
            return
        names = product_text(query.keys, parts)
        narrow = " AND ".join(f"{key_text(k)} IN (...)" for k in query.keys)
        message = f"GROUP BY would release {size:,} keys: {names}, beyond the limit of {limit:,} keys"
        hint = f"narrow the keys with WHERE {narrow}, or "
        if option is not None:  # refused at the option, else at the first key (located at the boundary)
            raise UnsupportedQuery(f"{message} (max_keys in the query's OPTIONS)", line=option.line, col=option.col,
                                   hint=hint + "raise max_keys")
        raise UnsupportedQuery(f"{message} (the policy's MAX RELEASED KEYS)", node=query.keys[0].expression,
                               hint=hint + "ask the curator to raise MAX RELEASED KEYS in the policy")

    def _route_local(self, sql: str) -> tuple[LocalCount | None, dict]:
        """The de-biased count ``sql`` is, if it is one (``dpsql.query.local``), and its written
        options: from the checked query alone, before any epsilon is needed (a free one needs none)."""
        if not self._has_local:  # no LOCAL RR column in the policy: nothing to route
            return None, {}
        tree, checked, written = self._check(sql)
        return route_local(tree, checked, self.policy, written), written

    def _local_options(self, epsilon: Any, delta: Any, noise: str | None, written: dict) -> None:
        """A free randomized-response count spends nothing, but the privacy parameters given
        with it are still validated (DESIGN.md invariant 14)."""
        epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
        if epsilon is not None or delta is not None or noise is not None:
            privacy_options(self.policy, 1 if epsilon is None else epsilon, delta, noise)

    def _answer_local(self, query: LocalCount, epsilon: Any, delta: Any, noise: str | None,
                      written: dict) -> DPResult:
        """A COUNT over a LOCAL RR column, de-biased (``dpsql.query.local``): from the exact
        counts of reports (free), or from the noisy counts of its counting query, charged and
        recorded as that query (central)."""
        if query.free:
            self._local_options(epsilon, delta, noise, written)
            prepared = self._prepare(query.counting_sql, 1, 0, "laplace", None, False)  # planned, never noised
            assert prepared.plan is not None and prepared.priced is not None
            keys = prepared.plan.query.keys
            rows = self._executor.execute_free(
                [prepared.priced.bounded], lambda fetched: self._read_keys(fetched[0], keys),
                failure="the query failed while running; nothing was charged and no answer was released")
            counts, variance = {row[0]: int(row[1]) for row in rows if row[0] is not None}, 0.0
            cost: Spend = QueryCost.free()
        else:
            epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
            prepared = self._prepare(query.counting_sql, epsilon, delta, noise, None, False)
            assert prepared.plan is not None
            counted = self._sql_prepared(prepared)
            counts = {row[0]: row[1] for row in counted.fetchall()}
            measure = next(m for m in prepared.plan.measures if m.kind == "count")
            variance, cost = noise_variance(measure), counted.cost
        debiased = debias(query, counts, variance)
        key_type = self._catalog[table_key(query.table.name)].get(query.rule.name.lower(), "")
        columns = debiased_columns(query)
        types = [key_type if name == "g0" else "DOUBLE" for name in columns]
        indexed = [row + (index,) for index, row in enumerate(debiased.rows)]
        names, rows = self._engine.post_processing.post_process(columns + ["dp_row"], types + ["BIGINT"], indexed,
                                                total_post(query.post))  # released values only: free
        tracked = names[-1] == "dp_row"
        variances = [debiased.variances[row[-1]] for row in rows] if tracked else [math.nan] * len(rows)
        rows = [row[:-1] for row in rows] if tracked else rows

        def released_types() -> list[str]:
            described = self._engine.post_processing.released_types(columns + ["dp_row"], types + ["BIGINT"],
                                                                    total_post(query.post))
            return [type_name for _, type_name in described[:len(query.outputs)]]

        return DPResult(list(query.outputs), rows, cost, intervals=interval_cells(query, rows, variances),
                        types=released_types, notes=local_notes(query, not query.free), budget=self._snapshot(),
                        converter=self._engine.post_processing.convert)

    def _run_keys_only(self, plan: Plan, checked: PrivateQuery, domain: list[tuple]) -> DPResult:
        """GROUP BY public keys with no aggregate: the released keys are the public domain
        itself (narrowed by the WHERE), whatever the data, so nothing private is read or
        charged; post-processing (ORDER BY, LIMIT, expressions of the keys) runs on them."""
        types = [key.type_name or "" for key in plan.query.keys]  # every key is typed once prepared
        post = checked.post
        try:
            _, rows = self._engine.post_processing.post_process(core_columns(plan), types,
                                                                [tuple(row) for row in domain], post)
        except Exception as error:  # public keys only: DuckDB's message reveals nothing private
            raise UnsupportedQuery(f"the query over the public key domain failed: {str(error).splitlines()[0]}",
                                   hint="select the GROUP BY keys, or expressions of them") from None

        def released_types() -> list[str]:  # the keys' own types (an ENUM stays ENUM), as with aggregates
            described = self._engine.post_processing.released_types(core_columns(plan), types, post)
            return [type_name for _, type_name in described[:len(checked.outputs)]]

        return DPResult(list(checked.outputs), rows, QueryCost.free(public=True), exact=True,
                        types=released_types, converter=self._engine.post_processing.convert)

    def _run_public(self, query: PublicQuery) -> DPResult:
        try:
            frame = self._engine.fetch_df(query.tree)
        except Exception as error:  # public tables only: DuckDB's own message reveals nothing private
            message = str(error).split("\n")[0]
            raise UnsupportedQuery(f"the query over public tables failed: {message}",
                                   hint="check the column and table names") from None
        rows = list(frame.itertuples(index=False, name=None))
        return DPResult(list(frame.columns), rows, QueryCost.free(public=True), exact=True,
                        types=lambda: [type_name for _, type_name in self._engine.describe(query.tree)],
                        converter=self._engine.post_processing.convert)


def policy_file_of(policy: Any) -> Path | None:
    """The resolved path of a policy given as a file, else ``None`` (text or a Policy)."""
    if not isinstance(policy, (str, os.PathLike)):
        return None
    try:
        path = Path(policy)
        return path.resolve() if path.is_file() else None
    except (OSError, ValueError):  # policy text: too long for a file name, or holds a NUL
        return None


def exact_domain(domain: KeyDomain) -> tuple:
    """A key domain as a dictionary key that tells apart every domain that reads differently:
    literal keys by type and text, since Python takes ``1``, ``1.0`` and ``True`` for one key
    but ``TRY_CAST`` of each to VARCHAR gives three.

    >>> exact_domain(KeyDomain(values=(1,))) == exact_domain(KeyDomain(values=(True,)))
    False
    """
    values = None if domain.values is None else tuple((type(v).__qualname__, repr(v)) for v in domain.values)
    return domain.table, domain.column, values, domain.implied_by, domain.joined
