"""One way to spend: the spender every release is paid through (STYLE.md 16).

A mechanism prices itself before anything is read, as one ``Price`` (what it spends, what the
ledger shows, its repeat key, how many statements it may run), built next to the mechanism, and
hands the spender a way to run its statements. ``Spender.spend`` then, in this order:

1. takes the answer lock of the repeat key: an identical request sent meanwhile from another
   thread waits, then finds this one's stored answer instead of being charged again;
2. looks for a stored answer of that key (a free repeat), given back through the mechanism's
   own decoder, exactly as it was released: nothing drawn, nothing charged;
3. charges the ledger (the budget check of the total and the analyst's own accountant, the
   policies this connection agreed with, the call's cancellation), or refuses: nothing was read;
4. runs the statements through the executor (``dpsql.query.executor``: the request's time
   bounded by its statement count, a fixed failure text), releases, and records the answer;
5. returns the release with its ``QueryCost`` and the budget after it.

No other module charges the ledger. ``Spender.acting_for`` is the same spender as another
analyst's, with one call's cancellation: every view of a connection shares its locks.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from dpsql.answer.result import Budget, QueryCost
from dpsql.backends.rewrite import BoundedStatement
from dpsql.budget.accounting import Accountant, Spend, accountant_for, show
from dpsql.budget.ledger import Cancellation, Ledger
from dpsql.errors import DPError, InternalError
from dpsql.policy.model import Policy
from dpsql.query.executor import QUERY_FAILED, Executor, Fetch, run_all

Released = TypeVar("Released")



@dataclass(frozen=True)
class Price:
    """What one request of a mechanism costs and how the ledger shows it, fixed before the charge."""

    spend: Spend
    """The privacy cost charged (``Spend``)."""
    text: str
    """The ledger entry's text: the normalised SQL, or the mechanism's own line."""
    options: dict = field(default_factory=dict)
    """The ledger entry's options (epsilon, noise, the mechanism's settings)."""
    key: str | None = None
    """The repeat key its answer is stored under (``None``: the answer is not kept)."""
    statements: int = 1
    """The most statements it may run, known from the request alone: bounds its time before the charge."""
    what: str = "this request"
    """How a refusal of its time names it."""
    failure: str = QUERY_FAILED
    """What the analyst reads when it fails after the charge."""


@dataclass(frozen=True)
class Spent(Generic[Released]):
    """A release paid for (or a free repeat of one)."""

    released: Released
    """What the mechanism released (or its stored release, decoded)."""
    cost: QueryCost
    """What it was charged (free for a repeat)."""
    entry: int | None
    """The ledger entry charged (``None``: a free repeat)."""
    budget: Budget | None
    """The budget after it (``None`` if the ledger cannot say)."""

    @property
    def repeat(self) -> bool:
        """True when it is an earlier release given back for free."""
        return self.entry is None


@dataclass(frozen=True)
class Quote:
    """What a request would meet if it ran now (``Spender.quote``, for ``explain``)."""

    after: Budget
    """The database-wide budget after paying it (unchanged for a free repeat)."""
    refusal: DPError | None
    """Why it would be refused (``BudgetExceeded``), else ``None``."""
    text: str
    """``explain``'s accounting lines: the accountant, the cost, repeat or refusal, the budget now."""


class Spender:
    """A connection's budget as one analyst spends it (module docstring)."""

    def __init__(self, ledger: Ledger, executor: Executor, accounting: str, total: Accountant,
                 analyst_total: Accountant | None, policies: frozenset) -> None:
        self._ledger = ledger
        self._executor = executor
        self.accounting = accounting
        """The policy's accounting (``basic``, ``advanced`` or ``zcdp``)."""
        self._total = total
        self._analyst_total = analyst_total
        self.policies = policies
        """The stored policy texts this spender's accountants agree with (``None``: none stored)."""
        self.analyst: str | None = None
        """Whose charges these are (``None``: the curator's)."""
        self.cancel: Cancellation | None = None
        """The cancel of the one call this spender serves, passed to every charge."""
        self._guard = threading.Lock()
        self._held: dict[str, list] = {}
        """Repeat key -> [its answer lock, the calls using it]: one lock per key in use, shared by
        every view (a fixed set of locks picked by hash made unrelated requests wait on each other
        whenever two keys fell on one lock: one query held another's answer for its whole run)."""

    @classmethod
    def of_policy(cls, ledger: Ledger, executor: Executor, policy: Policy, policy_text: str, stored: str | None,
                  replacing: bool) -> Spender:
        """The curator's spender under ``policy``: its total budget and analysts' budget by its accountant.
        It agrees with the policy ``stored`` with the ledger (unless the curator is ``replacing``
        it) and with ``policy_text``: a charge is refused once the stored policy is none of them
        (replaced since), so the stored budget rules."""
        total = accountant_for(policy.accounting, Spend(policy.budget_epsilon, policy.budget_delta))
        analyst_total = None if policy.analyst_budget_epsilon is None else \
            accountant_for(policy.accounting, Spend(policy.analyst_budget_epsilon, policy.analyst_budget_delta))
        agreed = {None, policy_text} | ({stored} if stored is not None and not replacing else set())
        return cls(ledger, executor, policy.accounting, total, analyst_total, frozenset(agreed))

    def acting_for(self, analyst: str | None, cancel: Cancellation | None = None) -> Spender:
        """This spender as ``analyst``'s, for one call with ``cancel``: the same ledger and locks."""
        view = copy.copy(self)
        view.analyst, view.cancel = analyst, cancel
        return view

    # -- spending -----------------------------------------------------------------------------

    def spend(self, price: Price, run: Callable[[Fetch], Released],
              record: Callable[[Released], str] | None = None,
              replay: Callable[[str], Released | None] | None = None) -> Spent[Released]:
        """``run(fetch)``'s release, paid for by ``price`` (module docstring): ``run`` fetches each
        statement, the later ones possibly chosen from the earlier ones' noisy results.
        ``record``: the release as the text kept for repeats; ``replay``: a stored text back to
        a release (``None`` when it cannot be given back exactly: charged again)."""
        with self._lock(price.key) if replay is not None else nullcontext():
            if replay is not None and price.key is not None:
                stored = self._ledger.find_answer(price.key)
                released = None if stored is None else replay(stored)
                if released is not None:  # an earlier release, as it was: nothing drawn, nothing charged
                    return Spent(released, QueryCost.free(repeat=True), None, self.snapshot())
            entries: list[int] = []

            def charge() -> int:
                entries.append(self._charge(price))
                return entries[-1]

            released = self._executor.execute_adaptive(charge, run, record, price.failure,
                                                       statements=price.statements, what=price.what)
        return Spent(released, self.charged(price.spend), entries[-1], self.snapshot())

    def spend_statements(self, price: Price, statements: Sequence[BoundedStatement],
                         release: Callable[[list[list[tuple]]], Released],
                         record: Callable[[Released], str] | None = None,
                         replay: Callable[[str], Released | None] | None = None, *,
                         sample_key: Callable[[], str] | None = None) -> Spent[Released]:
        """``spend`` of fixed ``statements``, all run, then ``release`` of their rows;
        ``sample_key``: draws the secret key of the Poisson sample they read (``Executor.execute``)."""
        if price.statements != len(statements):
            raise InternalError(f"a request priced at {price.statements} statements hands over {len(statements)}")
        return self.spend(price, run_all(statements, release, sample_key), record, replay)

    def _charge(self, price: Price) -> int:
        return self._ledger.charge(price.spend, self._total, sql=price.text, options=price.options,
                                   analyst=self.analyst, key=price.key, analyst_total=self._analyst_total,
                                   policies=self.policies, cancel=self.cancel)

    @contextmanager
    def _lock(self, key: str | None) -> Iterator[None]:
        if key is None:
            yield
            return
        with self._guard:
            entry = self._held.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if not entry[1]:
                    del self._held[key]

    def charged(self, cost: Spend) -> QueryCost:
        """``cost`` as an answer shows it."""
        return QueryCost(cost.epsilon, cost.delta, cost.rho, accounting=self.accounting)

    def released(self) -> list[tuple[int, str, str | None]]:
        """(entry id, normalised SQL, stored answer) of this analyst's own past charges (the
        curator's: every one), oldest first: released values, free to read again."""
        frame = self._ledger.entries(self.analyst)
        # An entry with no stored answer reads back as None or NaN, as the pandas version decides.
        answers = [answer if isinstance(answer, str) else None for answer in frame["answer"].tolist()]
        return list(zip(frame["id"].tolist(), frame["sql"].tolist(), answers))

    def stored(self, key: str) -> str | None:
        """The answer stored under a repeat key (a released value: free), else ``None``."""
        return self._ledger.find_answer(key)

    def check_time(self, statements: int, what: str = "this request") -> None:
        """Refuse a request whose statements' time bound passes the request timeout (``explain``)."""
        self._executor.check_time(statements, what)

    # -- the budget ---------------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        """Total, spent and remaining, with the analyst's own budget as ``.analyst`` (if any)."""
        budget = self._budget_of(self._total, self._ledger.tally())
        if self.analyst is not None and self._analyst_total is not None:
            mine = self._budget_of(self._analyst_total, self._ledger.tally(self.analyst), owner=self.analyst)
            budget = replace(budget, analyst=mine)
        return budget

    def snapshot(self) -> Budget | None:
        """The budget now, for an answer to show (``None`` if the ledger cannot say)."""
        try:
            return self.budget
        except DPError:
            return None

    def after(self, cost: Spend) -> tuple[Budget, DPError | None]:
        """The database-wide budget after paying ``cost``, and why it would be refused, if so."""
        tally, refusal = self._ledger.tally(), None
        for accountant, mine, which in self._budgets(tally):
            try:
                accountant.check(mine, cost, which)
            except DPError as refused:
                refusal = refusal or refused
        return self._budget_of(self._total, tally.add(cost)), refusal

    def quote(self, cost: Spend, key: str | None) -> Quote:
        """What a request of ``cost``, stored under ``key``, would meet now (``explain``): nothing
        is charged."""
        repeat = key is not None and self.stored(key) is not None
        after, refusal = self.after(Spend.ZERO if repeat else cost)
        return Quote(after, refusal, self.accounting_text(cost, repeat, refusal))

    def accounting_text(self, cost: Spend, repeat: bool, refusal: DPError | None) -> str:
        accountant = self._total
        lines = [f"accounting: {accountant.name.upper()} ({accountant.title}); this query costs "
                 f"epsilon {show(cost.epsilon)}, delta {show(cost.delta)}"
                 + ("" if cost.rho is None or self.accounting != "zcdp" else f", rho {show(cost.rho)}")]
        if repeat:
            lines.append("repeat: this query was answered before; its stored answer would be "
                         "returned at no cost")
        elif refusal is not None:
            lines.append(f"it would be refused: {refusal}")
        lines.append(f"budget now: {self.budget}")
        return "\n".join(lines)

    def _budgets(self, tally) -> Iterator[tuple[Any, Any, str]]:
        yield self._total, tally, "the total budget"
        if self.analyst is not None and self._analyst_total is not None:
            yield self._analyst_total, self._ledger.tally(self.analyst), f"analyst {self.analyst}'s budget"

    @staticmethod
    def _budget_of(accountant: Accountant, tally, owner: str | None = None) -> Budget:
        account = accountant.account(tally)
        return Budget(account.total, account.spent, account.remaining, accounting=account.accounting, owner=owner)
