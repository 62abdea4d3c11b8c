"""Counts already released to this analyst, at which a ratio's ± can be told before the charge.

An AVG's (VARIANCE's, STDDEV's) ± shrinks as the count n of values in a group grows, and n is
private until released (``dpsql.query.prediction``). When the analyst was already given a noisy
count of exactly those values — an earlier answer of theirs, from the ledger, of ``COUNT(x)``
over the same relation, WHERE, GROUP BY keys and contribution limits — the prediction can be
stated there for free: reading one's own released values is post-processing. The smallest count
that answer released is used (its group's ± is the widest), noise and all: it estimates n, it
does not bound it, and EXPLAIN says which answer it came from.

An answer whose rows were filtered or cut (HAVING, LIMIT, OFFSET) may lack the smallest group,
and is not used. Two-argument ratios (COVAR_*) count pairs, which no COUNT(x) states: they need
``expected_rows``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpsql.analysis.aggregates.registry import family_of
from dpsql.analysis.plan import Plan, PrivateQuery
from dpsql.answer.result import decode_answer

RECENT = 200
"""How many of the analyst's latest answers are searched (newest first)."""


@dataclass(frozen=True)
class KnownCount:
    """The smallest count of a ratio's values that an earlier answer released."""

    count: int
    """The released (noisy) count."""
    key: tuple
    """The group it was released for (``()`` ungrouped)."""
    entry: int
    """Which of the analyst's own answers it is, numbered from 1 among theirs as ``SHOW ledger``
    numbers them (the ledger's global ids would tell how often others asked)."""
    sql: str
    """That answer's normalised SQL."""


def known_counts(plan: Plan, released: Sequence[tuple[int, str, str | None]],
                 check: Callable[[str], PrivateQuery | None]) -> dict[str, KnownCount]:
    """Per one-argument ratio aggregate of ``plan`` (a0, ...), the ``KnownCount`` of the newest of
    ``released`` — the analyst's own (entry id, normalised SQL, stored answer), oldest first — that
    released a count of its values; ``check`` gives an entry's checked query (None: not a private
    query)."""
    query = plan.query
    wanted = {a.name: a.argument.sql(dialect="duckdb") for a, release in zip(query.aggregates, plan.aggregates)
              if a.argument is not None and family_of(release).counted and family_of(release).arity == 1}
    found: dict[str, KnownCount] = {}
    numbered = [(number, sql, answer) for number, (_, sql, answer) in enumerate(released, start=1)]
    for entry, sql, answer in reversed(numbered[-RECENT:]):
        if len(found) == len(wanted):
            break
        if answer is None or "count(" not in sql.lower():
            continue
        checked = check(sql)
        if checked is None or not _same_groups(checked, query):
            continue
        decoded = decode_answer(answer)
        if decoded is None:
            continue
        _, rows, _ = decoded
        for name, argument in wanted.items():
            if name in found:
                continue
            column = _count_column(checked, argument)
            keys = _key_columns(checked)
            if column is None or keys is None:
                continue
            counts = [(int(row[column]), tuple(row[k] for k in keys)) for row in rows
                      if isinstance(row[column], int) and not isinstance(row[column], bool)]
            if counts:
                count, key = min(counts, key=lambda pair: pair[0])
                found[name] = KnownCount(count, key, entry, sql)
    return found


def _same_groups(checked: PrivateQuery, query: PrivateQuery) -> bool:
    """Both read the same relation under the same limits, WHERE and keys, and every group the
    earlier answer released is shown (no HAVING, LIMIT or OFFSET)."""
    def text(node: exp.Expression | None) -> str | None:
        return None if node is None else node.sql(dialect="duckdb")

    post = checked.post
    return (checked.table == query.table and checked.rule == query.rule
            and text(checked.source) == text(query.source) and text(checked.where) == text(query.where)
            and [text(k.expression) for k in checked.keys] == [text(k.expression) for k in query.keys]
            and not any(post.args.get(part) for part in ("where", "limit", "offset")))


def _key_columns(checked: PrivateQuery) -> list[int] | None:
    """The output positions of the keys (g0, ...), in key order; None when one is not shown."""
    shown = {item.unalias().name: i for i, item in enumerate(checked.post.expressions)
             if isinstance(item.unalias(), exp.Column)}
    positions = [shown.get(key.name) for key in checked.keys]
    return None if any(p is None for p in positions) else [p for p in positions if p is not None]


def _count_column(checked: PrivateQuery, argument: str) -> int | None:
    """The output position of a COUNT of ``argument``'s values (no expression around it), or None."""
    counts = {a.name for a in checked.aggregates
              if a.function == "count" and a.argument is not None and a.argument.sql(dialect="duckdb") == argument}
    return next((i for i, item in enumerate(checked.post.expressions)
                 if isinstance(item.unalias(), exp.Column) and item.unalias().name in counts), None)
